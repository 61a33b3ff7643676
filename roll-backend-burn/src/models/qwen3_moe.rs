//! Qwen3-MoE (`model_type: "qwen3_moe"`, HF `Qwen3MoeForCausalLM`): the [`Decoder`] with
//! Qwen3's attention (QK-RMSNorm, optional `attention_bias`, explicit `head_dim`) and a routed
//! **mixture of experts** as the feed-forward block of every `decoder_sparse_step`-th layer not in
//! `mlp_only_layers` (the others keep a dense MLP).
//!
//! Each token goes to its `num_experts_per_tok` most probable experts (softmax router, weights
//! optionally renormalised, `norm_topk_prob`); Qwen2-MoE's sigmoid-gated shared expert is
//! supported too (`shared_expert_intermediate_size`).

use super::attention::AttentionSpec;
use super::decoder::{Architecture, Decoder, DecoderConfig, FeedForwardBlock, expect_model_type};
use super::expert_parallel::{ExpertShard, RoutedSlots};
use super::mlp::Mlp;
use super::qwen3::{qwen3_attention, qwen3_hf};
use super::tensor_parallel::{ExpertSplit, TensorShard, linear_params};
use crate::hf::HfConfig;
use crate::{BackendError, Result};
use burn::config::Config;
use burn::module::{Module, ParamId};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::activation::{sigmoid, softmax};
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};

/// A Qwen3-MoE model with its LM head.
pub type Qwen3MoeForCausalLM = Decoder<Qwen3MoeConfig>;

/// Hyper-parameters of a Qwen3-MoE model (the subset of HF `config.json` it uses).
#[derive(Config, Debug, PartialEq)]
pub struct Qwen3MoeConfig {
    /// Sizes (`intermediate_size` is the dense layers' MLP width).
    pub decoder: DecoderConfig,
    /// Bias on q/k/v/o.
    #[config(default = false)]
    pub attention_bias: bool,
    /// Routed experts.
    pub num_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Width of each expert's MLP.
    pub moe_intermediate_size: usize,
    /// Renormalise the chosen experts' probabilities to sum to one.
    #[config(default = true)]
    pub norm_topk_prob: bool,
    /// Every `decoder_sparse_step`-th layer is sparse.
    #[config(default = 1)]
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP.
    #[config(default = "Vec::new()")]
    pub mlp_only_layers: Vec<usize>,
    /// Width of the shared expert; 0 = none.
    #[config(default = 0)]
    pub shared_expert_intermediate_size: usize,
}

impl Qwen3MoeConfig {
    /// Whether layer `i` uses the mixture of experts.
    pub fn is_sparse(&self, i: usize) -> bool {
        !self.mlp_only_layers.contains(&i)
            && (i + 1).is_multiple_of(self.decoder_sparse_step.max(1))
    }

    fn init_moe(&self, device: &Device) -> SparseMoeBlock {
        let hidden = self.decoder.hidden_size;
        let shared = self.shared_expert_intermediate_size;
        SparseMoeBlock {
            gate: LinearConfig::new(hidden, self.num_experts)
                .with_bias(false)
                .init(device),
            experts: (0..self.num_experts)
                .map(|_| Mlp::init(hidden, self.moe_intermediate_size, device))
                .collect(),
            shared_expert: (shared > 0).then(|| Mlp::init(hidden, shared, device)),
            shared_expert_gate: (shared > 0)
                .then(|| LinearConfig::new(hidden, 1).with_bias(false).init(device)),
            top_k: self.num_experts_per_tok,
            norm_topk_prob: self.norm_topk_prob,
            shard: None,
            first_expert: 0,
        }
    }
}

impl Architecture for Qwen3MoeConfig {
    type FeedForward = FeedForward;

    /// # Errors
    /// [`BackendError::UnknownModelType`] if `model_type` is not `qwen3_moe`,
    /// [`BackendError::InvalidConfig`] for inconsistent sizes or expert counts.
    fn from_hf(hf: &HfConfig) -> Result<Self> {
        expect_model_type(hf, "qwen3_moe")?;
        let cfg = Self::new(
            DecoderConfig::from_hf(hf)?,
            hf.num_experts.unwrap_or(0),
            hf.num_experts_per_tok.unwrap_or(0),
            hf.moe_intermediate_size.unwrap_or(0),
        )
        .with_attention_bias(hf.attention_bias.unwrap_or(false))
        .with_norm_topk_prob(hf.norm_topk_prob.unwrap_or(true))
        .with_decoder_sparse_step(hf.decoder_sparse_step.unwrap_or(1))
        .with_mlp_only_layers(hf.mlp_only_layers.clone().unwrap_or_default())
        .with_shared_expert_intermediate_size(hf.shared_expert_intermediate_size.unwrap_or(0));
        if cfg.num_experts == 0
            || cfg.moe_intermediate_size == 0
            || cfg.decoder_sparse_step == 0
            || cfg.num_experts_per_tok == 0
            || cfg.num_experts_per_tok > cfg.num_experts
        {
            return Err(BackendError::InvalidConfig(format!(
                "qwen3_moe needs 0 < num_experts_per_tok ({}) <= num_experts ({}), \
                 moe_intermediate_size > 0 and decoder_sparse_step > 0",
                cfg.num_experts_per_tok, cfg.num_experts
            )));
        }
        Ok(cfg)
    }

    fn to_hf(&self) -> HfConfig {
        let mut hf = qwen3_hf(
            &self.decoder,
            self.attention_bias,
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
        );
        hf.num_experts = Some(self.num_experts);
        hf.num_experts_per_tok = Some(self.num_experts_per_tok);
        hf.moe_intermediate_size = Some(self.moe_intermediate_size);
        hf.norm_topk_prob = Some(self.norm_topk_prob);
        hf.decoder_sparse_step = Some(self.decoder_sparse_step);
        hf.mlp_only_layers = Some(self.mlp_only_layers.clone());
        if self.shared_expert_intermediate_size > 0 {
            hf.shared_expert_intermediate_size = Some(self.shared_expert_intermediate_size);
        }
        hf
    }

    fn decoder(&self) -> &DecoderConfig {
        &self.decoder
    }

    fn attention(&self) -> AttentionSpec {
        qwen3_attention(&self.decoder, self.attention_bias)
    }

    fn init_feed_forward(&self, layer: usize, device: &Device) -> FeedForward {
        if self.is_sparse(layer) {
            FeedForward::Sparse(self.init_moe(device))
        } else {
            FeedForward::Dense(self.decoder.init_mlp(device))
        }
    }
}

/// The routed mixture of experts (HF `Qwen3MoeSparseMoeBlock`, plus Qwen2-MoE's shared expert).
#[derive(Module, Debug)]
pub struct SparseMoeBlock {
    /// Router, hidden → num_experts, no bias.
    pub gate: Linear,
    /// The experts (this rank's block of them when `shard` is set).
    pub experts: Vec<Mlp>,
    /// Expert applied to every token, if configured.
    pub shared_expert: Option<Mlp>,
    /// Sigmoid gate of the shared expert, hidden → 1.
    pub shared_expert_gate: Option<Linear>,
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise the top-k probabilities.
    pub norm_topk_prob: bool,
    /// Expert parallelism: which experts this rank holds, and the group holding the others.
    #[module(skip)]
    pub shard: Option<ExpertShard>,
    /// The index among the model's experts of `experts[0]`: 0, unless this is a
    /// tensor-parallel rank holding a block of whole experts ([`ExpertSplit::Whole`]).
    #[module(skip)]
    pub first_expert: usize,
}

impl SparseMoeBlock {
    /// Keeps only `shard`'s experts (see [`ExpertShard`]).
    pub(crate) fn shard(&mut self, shard: ExpertShard) {
        self.keep_experts(shard.mine());
        self.shard = Some(shard);
    }

    /// Keeps only the experts `range` (of the whole mixture's).
    pub(crate) fn keep_experts(&mut self, range: std::ops::Range<usize>) {
        self.first_expert = range.start;
        self.experts = std::mem::take(&mut self.experts)
            .into_iter()
            .enumerate()
            .filter_map(|(e, expert)| range.contains(&e).then_some(expert))
            .collect();
    }

    /// # Shapes
    /// - `x`: `[batch, seq, hidden]`
    /// - output: `[batch, seq, hidden]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [b, t, hidden] = x.dims();
        let device = x.device();
        // The forward has no error path: a failed collective of an expert-parallel mixture
        // (another rank failed, which MPI ends the job for) leaves NaN, which scoring refuses by
        // name. Training reads the error ([`SparseMoeBlock::try_forward`]).
        self.try_forward(x).unwrap_or_else(|e| {
            tracing::error!("expert-parallel mixture: {e}");
            Tensor::<3>::full([b, t, hidden], f32::NAN, &device)
        })
    }

    /// Each token's `top_k` experts: their weights (`[tokens, top_k]`, renormalised with
    /// `norm_topk_prob`) and indices (row-major).
    fn route(&self, x: Tensor<2>) -> (Tensor<2>, Vec<i64>) {
        let probs = softmax(self.gate.forward(x), 1);
        let (mut weights, chosen) = probs.topk_with_indices(self.top_k, 1);
        if self.norm_topk_prob {
            weights = weights.clone() / weights.sum_dim(1);
        }
        // Routing is data-dependent control flow: read the (small) index matrix back to group the
        // tokens by expert. An unreadable index tensor would be a backend bug, not a user error.
        (
            weights,
            chosen.into_data().try_into_vec_as().unwrap_or_default(),
        )
    }

    /// [`SparseMoeBlock::forward`], with an expert-parallel mixture's failed exchange as an
    /// error.
    ///
    /// # Errors
    /// A failed all-to-all of an expert-parallel mixture.
    pub(crate) fn try_forward(&self, x: Tensor<3>) -> Result<Tensor<3>> {
        let [b, t, hidden] = x.dims();
        let x = x.reshape([b * t, hidden]);
        let (weights, chosen) = self.route(x.clone());
        // A tensor-parallel rank holding whole experts runs those and leaves the other slots to
        // the ranks holding theirs (the layer's all-reduce adds them).
        let mut tokens_of: Vec<Vec<(i32, i32)>> = vec![Vec::new(); self.experts.len()];
        for (slot, &e) in chosen.iter().enumerate() {
            let held = usize::try_from(e)
                .ok()
                .and_then(|e| e.checked_sub(self.first_expert));
            if let Some(list) = held.and_then(|e| tokens_of.get_mut(e)) {
                let token = (slot / self.top_k) as i32;
                list.push((token, slot as i32));
            }
        }
        let device = x.device();
        let flat_weights = weights.reshape([b * t * self.top_k, 1]);
        if let Some(shard) = &self.shard {
            let mut out = shard
                .forward(x.clone(), &chosen, self.top_k, flat_weights, &self.experts)
                .map_err(exchange)?;
            if let (Some(shared), Some(gate)) = (&self.shared_expert, &self.shared_expert_gate) {
                out = out + sigmoid(gate.forward(x.clone())) * shared.forward(x);
            }
            return Ok(out.reshape([b, t, hidden]));
        }
        let mut out = Tensor::<2>::zeros([b * t, hidden], &device);
        for (expert, routed) in self.experts.iter().zip(&tokens_of) {
            if routed.is_empty() {
                continue;
            }
            let n = routed.len();
            let tokens: Vec<i32> = routed.iter().map(|&(tok, _)| tok).collect();
            let slots: Vec<i32> = routed.iter().map(|&(_, slot)| slot).collect();
            let tokens = Tensor::<1, Int>::from_data(TensorData::new(tokens, [n]), &device);
            let slots = Tensor::<1, Int>::from_data(TensorData::new(slots, [n]), &device);
            let y = expert.forward(x.clone().select(0, tokens.clone()))
                * flat_weights.clone().select(0, slots);
            out = out.select_assign(0, tokens, y, IndexingUpdateOp::Add);
        }
        if let (Some(shared), Some(gate)) = (&self.shared_expert, &self.shared_expert_gate) {
            out = out + sigmoid(gate.forward(x.clone())) * shared.forward(x);
        }
        Ok(out.reshape([b, t, hidden]))
    }

    /// The backward of an expert-parallel mixture on a rank that routes tokens: `x` is the
    /// mixture's input on the autodiff device (`[tokens, hidden]`, with its graph back to the
    /// block's input), `delta` the gradient of the loss with respect to its output.
    ///
    /// The output is `Σ_slots w·E(x)` plus the shared expert's; the experts run on their ranks
    /// ([`ExpertShard::backward`]), which return each slot's `y = E(x)` and `J_Eᵀ(w·δ)`. Returned:
    /// a scalar whose gradient is the mixture's vector–Jacobian product for everything on this
    /// rank — `Σ w·⟨y, δ⟩` (the router, through `w`) `+ ⟨x, Σ_slots J_Eᵀ(w·δ)⟩` (the experts'
    /// path back to `x`) `+ ⟨shared(x), δ⟩` — with `y` and the `J_Eᵀ` terms as constants, and the
    /// gradients of this rank's experts over every rank's tokens.
    ///
    /// # Errors
    /// A mixture that is not expert-parallel, a failed exchange, or an unreadable tensor.
    pub(crate) fn expert_parallel_backward(
        &self,
        x: Tensor<2>,
        delta: Tensor<2>,
    ) -> Result<(Tensor<1>, GradientsParams)> {
        let shard = self.expert_shard()?;
        let [n, hidden] = x.dims();
        let k = self.top_k;
        let device = x.device();
        let (weights, chosen) = self.route(x.clone());
        let flat_weights = weights.reshape([n * k, 1]);
        let (rows, w, d) = (
            values(x.clone().inner())?,
            values(flat_weights.clone().inner())?,
            values(delta.clone())?,
        );
        let mut g = vec![0f32; n * k * hidden];
        for (slot, out) in g.chunks_exact_mut(hidden).enumerate() {
            let token = &d[slot / k * hidden..(slot / k + 1) * hidden];
            for (o, &dj) in out.iter_mut().zip(token) {
                *o = w[slot] * dj;
            }
        }
        let (y, gx, expert_grads) = shard
            .backward(
                Some(RoutedSlots {
                    x: &rows,
                    chosen: &chosen,
                    top_k: k,
                    g: &g,
                }),
                hidden,
                &self.experts,
                &device,
            )
            .map_err(exchange)?;
        let mut dots = vec![0f32; n * k];
        let mut into_x = vec![0f32; n * hidden];
        for slot in 0..n * k {
            let token = slot / k;
            let (y, gx) = (
                &y[slot * hidden..(slot + 1) * hidden],
                &gx[slot * hidden..(slot + 1) * hidden],
            );
            let dt = &d[token * hidden..(token + 1) * hidden];
            dots[slot] = y.iter().zip(dt).map(|(a, b)| a * b).sum();
            for (acc, &v) in into_x[token * hidden..(token + 1) * hidden]
                .iter_mut()
                .zip(gx)
            {
                *acc += v;
            }
        }
        let dots = Tensor::<2>::from_data(TensorData::new(dots, [n * k, 1]), &device);
        let into_x = Tensor::<2>::from_data(TensorData::new(into_x, [n, hidden]), &device);
        let mut objective = (flat_weights * dots).sum() + (x.clone() * into_x).sum();
        if let (Some(shared), Some(gate)) = (&self.shared_expert, &self.shared_expert_gate) {
            let out = sigmoid(gate.forward(x.clone())) * shared.forward(x);
            objective = objective + (out * delta.autodiff()).sum();
        }
        Ok((objective, expert_grads))
    }

    /// An expert-parallel mixture over several inputs' rows at once (each `[tokens, hidden]`),
    /// in one exchange with the other ranks: each input is routed, and gets the shared expert,
    /// on its own rows, as [`SparseMoeBlock::try_forward`] would give it alone; only the
    /// experts see every input's tokens (and every rank's, as they do anyway). With no inputs,
    /// this rank's experts serve the others' ([`SparseMoeBlock::serve_forward`]).
    ///
    /// # Errors
    /// A mixture that is not expert-parallel, or a failed exchange.
    pub(crate) fn expert_parallel_rows(
        &self,
        xs: Vec<Tensor<2>>,
        hidden: usize,
        device: &Device,
    ) -> Result<Vec<Tensor<2>>> {
        let shard = self.expert_shard()?;
        if xs.is_empty() {
            self.serve_forward(hidden, device)?;
            return Ok(Vec::new());
        }
        let k = self.top_k;
        let (mut chosen, mut weights, mut lens) = (Vec::new(), Vec::new(), Vec::new());
        for x in &xs {
            let n = x.dims()[0];
            let (w, c) = self.route(x.clone());
            chosen.extend(c);
            weights.push(w.reshape([n * k, 1]));
            lens.push(n);
        }
        let all = Tensor::cat(xs.clone(), 0);
        let out = shard
            .forward(all, &chosen, k, Tensor::cat(weights, 0), &self.experts)
            .map_err(exchange)?;
        let mut at = 0;
        Ok(xs
            .into_iter()
            .zip(lens)
            .map(|(x, n)| {
                let mut part = out.clone().narrow(0, at, n);
                at += n;
                if let (Some(shared), Some(gate)) = (&self.shared_expert, &self.shared_expert_gate)
                {
                    part = part + sigmoid(gate.forward(x.clone())) * shared.forward(x);
                }
                part
            })
            .collect())
    }

    /// This rank's part of an expert-parallel mixture's forward when it routes no tokens (a
    /// micro-batch fewer than another rank's): its experts serve the others'.
    ///
    /// # Errors
    /// A mixture that is not expert-parallel, or a failed exchange.
    pub(crate) fn serve_forward(&self, hidden: usize, device: &Device) -> Result<()> {
        self.expert_shard()?
            .serve_forward(hidden, &self.experts, device)
            .map_err(exchange)
    }

    /// [`SparseMoeBlock::expert_parallel_backward`] on a rank that routes no tokens: its experts'
    /// gradients from the others' (`device`: the autodiff device).
    ///
    /// # Errors
    /// A mixture that is not expert-parallel, or a failed exchange.
    pub(crate) fn serve_backward(&self, hidden: usize, device: &Device) -> Result<GradientsParams> {
        let shard = self.expert_shard()?;
        let (_, _, grads) = shard
            .backward(None, hidden, &self.experts, device)
            .map_err(exchange)?;
        Ok(grads)
    }

    fn expert_shard(&self) -> Result<&ExpertShard> {
        self.shard.as_ref().ok_or_else(|| {
            BackendError::InvalidInput(
                "this mixture is not expert-parallel (CausalLm::shard_experts)".into(),
            )
        })
    }
}

/// A failed exchange of an expert-parallel mixture.
fn exchange(e: roll_core::Error) -> BackendError {
    BackendError::Collective(Box::new(e))
}

/// A tensor's values.
fn values(t: Tensor<2>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec()
        .map_err(|e| BackendError::Train(format!("cannot read a mixture's values: {e:?}")))
}

/// A layer's MLP: dense or mixture of experts. (Saved without the variant name: HF keys are
/// `mlp.gate_proj...` or `mlp.experts.N...`.)
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum FeedForward {
    /// A dense SwiGLU MLP (`mlp_only_layers`).
    Dense(Mlp),
    /// The mixture of experts.
    Sparse(SparseMoeBlock),
}

impl SparseMoeBlock {
    /// This rank's part of the mixture in a tensor-parallel model: its experts divided as
    /// `experts` says, its slice of the shared expert; router and shared gate whole.
    fn shard_tensors(mut self, shard: &TensorShard, experts: ExpertSplit) -> Result<Self> {
        let n = self.experts.len();
        self.experts = match experts {
            ExpertSplit::Sliced => self
                .experts
                .into_iter()
                .map(|e| shard.shard_mlp(e, "expert units (moe_intermediate_size)"))
                .collect::<Result<_>>()?,
            ExpertSplit::Whole => {
                shard.divides("experts (num_experts)", n)?;
                let mine = shard.slice(n);
                self.first_expert = mine.start;
                self.experts
                    .into_iter()
                    .enumerate()
                    .filter_map(|(e, expert)| mine.contains(&e).then_some(expert))
                    .collect()
            }
        };
        self.shared_expert = self
            .shared_expert
            .map(|m| shard.shard_mlp(m, "shared expert units (shared_expert_intermediate_size)"))
            .transpose()?;
        Ok(self)
    }
}

impl FeedForwardBlock for FeedForward {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        match self {
            Self::Dense(m) => m.forward(x),
            Self::Sparse(m) => m.forward(x),
        }
    }

    fn try_forward(&self, x: Tensor<3>) -> Result<Tensor<3>> {
        match self {
            Self::Dense(m) => Ok(m.forward(x)),
            Self::Sparse(m) => m.try_forward(x),
        }
    }

    fn shard_tensors(self, shard: &TensorShard, experts: ExpertSplit) -> Result<Self> {
        Ok(match self {
            Self::Dense(m) => Self::Dense(m.shard_tensors(shard, experts)?),
            Self::Sparse(m) => Self::Sparse(m.shard_tensors(shard, experts)?),
        })
    }

    fn own_params(&self) -> Vec<ParamId> {
        match self {
            Self::Dense(m) => m.own_params(),
            Self::Sparse(m) => m
                .experts
                .iter()
                .chain(&m.shared_expert)
                .flat_map(FeedForwardBlock::own_params)
                .collect(),
        }
    }

    fn replicated_params(&self) -> Vec<ParamId> {
        match self {
            Self::Dense(_) => Vec::new(),
            Self::Sparse(m) => std::iter::once(&m.gate)
                .chain(&m.shared_expert_gate)
                .flat_map(linear_params)
                .collect(),
        }
    }

    fn dense(&self) -> Option<&Mlp> {
        match self {
            Self::Dense(m) => Some(m),
            Self::Sparse(_) => None,
        }
    }
}
