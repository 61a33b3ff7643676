//! The one Qwen-family decoder, parameterised by an [`Architecture`].
//!
//! Qwen2, Qwen3 and Qwen3-MoE are the same pre-norm decoder: token embedding → layers of
//! (RMSNorm → grouped-query attention with HF rotary embeddings → residual → RMSNorm →
//! feed-forward → residual) → final RMSNorm → an LM head that is its own matrix or the transposed
//! embedding (`tie_word_embeddings`). They differ only in how attention is configured (bias,
//! QK-RMSNorm), in the feed-forward block (a SwiGLU MLP or a mixture of experts) and in how they
//! read and write HF `config.json`. [`Decoder`] holds the shared structure once; an
//! [`Architecture`] — [`Qwen2Config`](super::qwen2::Qwen2Config),
//! [`Qwen3Config`](super::qwen3::Qwen3Config), [`Qwen3MoeConfig`](super::qwen3_moe::Qwen3MoeConfig)
//! — supplies the differences. This is Burn's style (one module, built from a config) rather than
//! one copy of the decoder per architecture.
//!
//! Field names follow the HF checkpoint keys (`model.layers.0.self_attn.q_proj.weight`,
//! `model.norm.weight`, `lm_head.weight`, ...), so burn-store loads and saves HF safetensors
//! without renaming.

use super::attention::{Attention, AttentionSpec, causal_padding_mask};
use super::batch::TokenBatch;
use super::linear::linear_rows;
use super::mlp::Mlp;
use super::norm::{rms_norm, rms_norm_hf};
use super::pipeline_parallel::PipelineStage;
use super::rope::Rope;
use super::tensor_parallel::{ExpertSplit, TensorShard};
use crate::hf::HfConfig;
use crate::{BackendError, Result};
use burn::config::Config;
use burn::module::{Module, ModuleDisplay, ParamId};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm};
use burn::tensor::{Bool, Device, Tensor};

/// What distinguishes one Qwen-family architecture from another: its attention options, its
/// feed-forward block and its HF `config.json` mapping. Everything else is [`Decoder`]'s.
///
/// An implementation is the architecture's config (it is stored in [`Decoder::config`]).
pub trait Architecture: Clone + core::fmt::Debug + Send + Sync + 'static {
    /// Each layer's feed-forward block (HF path `model.layers.N.mlp`).
    type FeedForward: Module + ModuleDisplay + FeedForwardBlock;

    /// Reads the architecture's fields of a HF config.
    ///
    /// # Errors
    /// [`BackendError::UnknownModelType`] if `model_type` is another architecture's,
    /// [`BackendError::InvalidConfig`] for inconsistent sizes.
    fn from_hf(hf: &HfConfig) -> Result<Self>;

    /// The HF `config.json` content of this config.
    fn to_hf(&self) -> HfConfig;

    /// The sizes every architecture has.
    fn decoder(&self) -> &DecoderConfig;

    /// The self-attention of every layer.
    fn attention(&self) -> AttentionSpec;

    /// A freshly initialised feed-forward block for layer `layer`.
    fn init_feed_forward(&self, layer: usize, device: &Device) -> Self::FeedForward;

    /// Builds a randomly initialised model (load weights with [`crate::load_model`] instead to
    /// use a checkpoint).
    fn init(&self, device: &Device) -> Decoder<Self> {
        Decoder::init(self.clone(), device)
    }
}

/// A layer's feed-forward block: `[batch, seq, hidden]` in, the same shape out.
pub trait FeedForwardBlock {
    /// # Shapes
    /// - `x`: `[batch, seq, hidden]`
    /// - output: `[batch, seq, hidden]`
    fn forward(&self, x: Tensor<3>) -> Tensor<3>;

    /// [`FeedForwardBlock::forward`], with a failure an error: an expert-parallel mixture's
    /// failed exchange (its `forward` leaves NaN instead). The default cannot fail.
    ///
    /// # Errors
    /// A failed exchange with the other ranks holding the experts.
    fn try_forward(&self, x: Tensor<3>) -> Result<Tensor<3>> {
        Ok(self.forward(x))
    }

    /// The block as a dense SwiGLU MLP, when it is one (so that a caller can run its pieces with
    /// kernels of its own, as the [`DeviceDecoder`](crate::engine::DeviceDecoder) does on a GPU).
    fn dense(&self) -> Option<&Mlp> {
        None
    }

    /// This rank's part of the block in a tensor-parallel model
    /// ([`CausalLm::shard_tensors`](crate::CausalLm::shard_tensors)): what it then computes is
    /// this rank's partial sum of the block's output, which the layer's all-reduce completes. A
    /// mixture's experts are divided as `experts` says.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a width or an expert count the group's size does not
    /// divide, or a block with no tensor-parallel layout (the default).
    fn shard_tensors(self, shard: &TensorShard, experts: ExpertSplit) -> Result<Self>
    where
        Self: Sized,
    {
        let _ = (shard, experts);
        Err(BackendError::InvalidInput(
            "this feed-forward block has no tensor-parallel layout".into(),
        ))
    }

    /// The ids of the parameters a tensor-parallel rank holds its own part of (a slice, or
    /// whole experts only it holds): what the global gradient norm sums over the group.
    fn own_params(&self) -> Vec<ParamId> {
        Vec::new()
    }

    /// The ids of the parameters every rank of a tensor-parallel group holds alike but whose
    /// gradient each rank makes only its part of (a router, a shared expert's gate), summed over
    /// the group once per step on Burn's autodiff path.
    fn replicated_params(&self) -> Vec<ParamId> {
        Vec::new()
    }
}

/// The hyper-parameters every Qwen-family decoder has (the HF `config.json` fields shared by all
/// architectures).
#[derive(Config, Debug, PartialEq)]
pub struct DecoderConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the dense SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    pub num_key_value_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    #[config(default = 1e-6)]
    pub rms_norm_eps: f64,
    /// RoPE base.
    #[config(default = 10000.0)]
    pub rope_theta: f64,
    /// Share the embedding matrix with the LM head.
    #[config(default = false)]
    pub tie_word_embeddings: bool,
    /// The longest sequence the model was built for; longer inputs are refused
    /// ([`CausalLm::check_lengths`](crate::CausalLm::check_lengths)). `None`: not stated.
    pub max_position_embeddings: Option<usize>,
}

impl DecoderConfig {
    /// Reads the shared fields of a HF config (`head_dim` as [`HfConfig::head_dim`] gives it) and
    /// checks the head arithmetic.
    ///
    /// # Errors
    /// [`BackendError::InvalidConfig`] for a zero size, query heads that are not a multiple of
    /// the key/value heads, an odd `head_dim`, or an unreadable RoPE base.
    pub fn from_hf(hf: &HfConfig) -> Result<Self> {
        let cfg = Self::new(
            hf.vocab_size,
            hf.hidden_size,
            hf.intermediate_size,
            hf.num_hidden_layers,
            hf.num_attention_heads,
            hf.kv_heads(),
            hf.head_dim(),
        )
        .with_rms_norm_eps(hf.rms_norm_eps)
        .with_rope_theta(hf.rope_theta()?)
        .with_tie_word_embeddings(hf.tie_word_embeddings)
        .with_max_position_embeddings(hf.max_position_embeddings);
        cfg.check_heads()?;
        Ok(cfg)
    }

    /// A HF config with the shared fields, for `model_type` and the transformers class
    /// `architecture` (`"Qwen2ForCausalLM"`, ...). `head_dim` is left to the architecture
    /// (Qwen2 derives it, Qwen3 writes it).
    pub fn to_hf(&self, model_type: &str, architecture: &str) -> HfConfig {
        let mut hf = HfConfig::new(
            model_type,
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
        );
        hf.num_key_value_heads = Some(self.num_key_value_heads);
        hf.rms_norm_eps = self.rms_norm_eps;
        hf.rope_theta = Some(self.rope_theta);
        hf.tie_word_embeddings = self.tie_word_embeddings;
        hf.max_position_embeddings = self.max_position_embeddings;
        hf.extra
            .insert("architectures".into(), serde_json::json!([architecture]));
        hf.extra.insert("hidden_act".into(), "silu".into());
        hf
    }

    /// The attention block of these sizes with the architecture's options.
    pub fn attention(&self, qkv_bias: bool, o_bias: bool, qk_norm: bool) -> AttentionSpec {
        AttentionSpec {
            hidden: self.hidden_size,
            heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            qkv_bias,
            o_bias,
            qk_norm_eps: qk_norm.then_some(self.rms_norm_eps),
        }
    }

    /// A dense SwiGLU MLP of width `intermediate_size`.
    pub fn init_mlp(&self, device: &Device) -> Mlp {
        Mlp::init(self.hidden_size, self.intermediate_size, device)
    }

    fn check_heads(&self) -> Result<()> {
        let (hidden, heads, kv_heads, head_dim) = (
            self.hidden_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
        );
        if heads == 0 || kv_heads == 0 || head_dim == 0 || hidden == 0 {
            return Err(BackendError::InvalidConfig(
                "hidden_size, heads, kv heads and head_dim must be positive".into(),
            ));
        }
        if !heads.is_multiple_of(kv_heads) {
            return Err(BackendError::InvalidConfig(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )));
        }
        if !head_dim.is_multiple_of(2) {
            return Err(BackendError::InvalidConfig(format!(
                "head_dim {head_dim} must be even for RoPE"
            )));
        }
        Ok(())
    }
}

/// Fails unless `hf` is of `model_type`.
///
/// # Errors
/// [`BackendError::UnknownModelType`] naming the `model_type` found.
pub(crate) fn expect_model_type(hf: &HfConfig, model_type: &str) -> Result<()> {
    if hf.model_type == model_type {
        Ok(())
    } else {
        Err(BackendError::UnknownModelType {
            model_type: hf.model_type.clone(),
        })
    }
}

/// One pre-norm decoder layer: `h = x + attn(norm(x))`, `out = h + ff(norm(h))`.
#[derive(Module, Debug)]
pub struct DecoderLayer<F: Module> {
    /// Self-attention.
    pub self_attn: Attention,
    /// Dense MLP or mixture of experts.
    pub mlp: F,
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Norm before the feed-forward block.
    pub post_attention_layernorm: RmsNorm,
    /// This rank's slice when the model is tensor parallel
    /// ([`CausalLm::shard_tensors`](crate::CausalLm::shard_tensors)): the attention and
    /// feed-forward outputs are then partial sums, completed by an all-reduce.
    #[module(skip)]
    pub tensor_shard: Option<TensorShard>,
}

impl<F: Module + FeedForwardBlock> DecoderLayer<F> {
    /// # Shapes
    /// - `x`: `[batch, seq, hidden]`, `cos`/`sin`: `[batch, 1, seq, head_dim]`,
    ///   `mask`: `[batch, 1, seq, seq]`
    /// - output: `[batch, seq, hidden]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        cos: &Tensor<4>,
        sin: &Tensor<4>,
        mask: &Tensor<4, Bool>,
    ) -> Tensor<3> {
        let reduced = |partial: Tensor<3>| match &self.tensor_shard {
            Some(shard) => shard.reduce(partial),
            None => partial,
        };
        let h = x.clone() + reduced(self.attention_block(x, cos, sin, mask));
        h.clone() + reduced(self.feed_forward_block(h))
    }

    /// The attention block's output before the residual: `attn(norm(x))` — on a
    /// tensor-parallel rank, this rank's partial sum of it.
    pub(crate) fn attention_block(
        &self,
        x: Tensor<3>,
        cos: &Tensor<4>,
        sin: &Tensor<4>,
        mask: &Tensor<4, Bool>,
    ) -> Tensor<3> {
        self.self_attn
            .forward(rms_norm_hf(&self.input_layernorm, x), cos, sin, mask)
    }

    /// The feed-forward block's output before the residual: `ff(norm(h))` — on a
    /// tensor-parallel rank, this rank's partial sum of it.
    pub(crate) fn feed_forward_block(&self, h: Tensor<3>) -> Tensor<3> {
        self.mlp
            .forward(rms_norm_hf(&self.post_attention_layernorm, h))
    }
}

/// The trunk: embedding, decoder layers, final norm (HF `*Model`).
#[derive(Module, Debug)]
pub struct DecoderModel<F: Module> {
    /// Token embedding `[vocab, hidden]`.
    pub embed_tokens: Embedding,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer<F>>,
    /// Final RMSNorm.
    pub norm: RmsNorm,
}

/// A Qwen-family decoder with its LM head (HF `*ForCausalLM`).
#[derive(Module, Debug)]
pub struct Decoder<A: Architecture> {
    /// The trunk (HF prefix `model.`).
    pub model: DecoderModel<A::FeedForward>,
    /// The LM head; `None` when tied to the embedding.
    pub lm_head: Option<Linear>,
    /// Rotary tables.
    #[module(skip)]
    pub rope: Rope,
    /// The hyper-parameters it was built from.
    #[module(skip)]
    pub config: A,
    /// This process's stage when the model is pipeline parallel
    /// ([`CausalLm::split_stages`](crate::CausalLm::split_stages)): `model.layers` are then that
    /// stage's layers only.
    #[module(skip)]
    pub pipeline_stage: Option<PipelineStage>,
}

impl<A: Architecture> Decoder<A> {
    /// A randomly initialised model of `config`.
    pub fn init(config: A, device: &Device) -> Self {
        let c = config.decoder();
        let attention = config.attention();
        let norm = || rms_norm(c.hidden_size, c.rms_norm_eps, device);
        let layers = (0..c.num_hidden_layers)
            .map(|i| DecoderLayer {
                self_attn: attention.init(device),
                mlp: config.init_feed_forward(i, device),
                input_layernorm: norm(),
                post_attention_layernorm: norm(),
                tensor_shard: None,
            })
            .collect();
        Self {
            model: DecoderModel {
                embed_tokens: EmbeddingConfig::new(c.vocab_size, c.hidden_size).init(device),
                layers,
                norm: norm(),
            },
            lm_head: (!c.tie_word_embeddings).then(|| {
                LinearConfig::new(c.hidden_size, c.vocab_size)
                    .with_bias(false)
                    .init(device)
            }),
            rope: Rope::new(c.head_dim, c.rope_theta),
            config,
            pipeline_stage: None,
        }
    }

    /// This rank's slice of a tensor-parallel model; `None` when the model is whole.
    pub fn tensor_shard(&self) -> Option<&TensorShard> {
        self.model
            .layers
            .first()
            .and_then(|l| l.tensor_shard.as_ref())
    }

    /// The sizes of this rank's layers: the config's, with heads and MLP width divided among
    /// the ranks of a tensor-parallel model.
    pub fn local_config(&self) -> DecoderConfig {
        let config = self.config.decoder();
        match self.tensor_shard() {
            Some(shard) => shard.local_config(config),
            None => config.clone(),
        }
    }

    /// Final-norm hidden states of every position (the trunk without the LM head).
    ///
    /// # Shapes
    /// - `batch.input_ids`: `[batch, seq]`
    /// - output: `[batch, seq, hidden]`
    pub fn forward_hidden(&self, batch: &TokenBatch) -> Tensor<3> {
        if let Some(stage) = &self.pipeline_stage {
            // The forward has no error path; NaN is what scoring refuses by name.
            tracing::error!("{stage:?} holds some of the layers: it cannot run a whole forward");
            let [b, t] = batch.input_ids.dims();
            let hidden = self.config.decoder().hidden_size;
            return Tensor::full([b, t, hidden], f32::NAN, &batch.input_ids.device());
        }
        let (cos, sin) = self.rope.cos_sin(&batch.position_ids);
        let mask = causal_padding_mask(&batch.attention_mask);
        let mut x = self.model.embed_tokens.forward(batch.input_ids.clone());
        for layer in &self.model.layers {
            x = layer.forward(x, &cos, &sin, &mask);
        }
        rms_norm_hf(&self.model.norm, x)
    }

    /// Logits from final hidden states: through `lm_head`, or — for tied embeddings — through
    /// the transposed embedding matrix.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, hidden]`
    /// - output: `[batch, seq, vocab]`
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        let [b, t, h] = hidden.dims();
        let rows = hidden.reshape([b * t, h]);
        // 2-D GEMMs: a batched product against a broadcast `[1, h, vocab]` weight costs ~30% more
        // forward and ~2x more backward (the weight gradient is summed over a `[b, h, vocab]`
        // stack).
        let logits = match &self.lm_head {
            Some(head) => linear_rows(head, rows),
            None => {
                // `embedᵀ` copied contiguous: a transposed view would let small products take
                // gemm's dot-product kernel, whose rounding differs from the big ones', so a row's
                // logits would depend (in the last bits) on how many rows share the batch.
                let embed = &self.model.embed_tokens;
                let [vocab, _] = embed.weight.dims();
                let weight = embed.weight.val().transpose().reshape([h * vocab]);
                rows.matmul(weight.reshape([h, vocab]))
            }
        };
        let vocab = logits.dims()[1];
        logits.reshape([b, t, vocab])
    }

    /// Next-token logits at every position.
    ///
    /// # Shapes
    /// - `batch.input_ids`: `[batch, seq]`
    /// - output: `[batch, seq, vocab]`
    pub fn forward(&self, batch: &TokenBatch) -> Tensor<3> {
        self.logits(self.forward_hidden(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::qwen2::Qwen2Config;
    use crate::models::qwen3::Qwen3Config;
    use crate::models::qwen3_moe::{FeedForward, Qwen3MoeConfig};

    fn hf(model_type: &str, hidden: usize, heads: usize, kv_heads: usize) -> HfConfig {
        let mut c = HfConfig::new(model_type, 50, hidden, 40, 3, heads);
        c.num_key_value_heads = Some(kv_heads);
        c
    }

    fn invalid(result: Result<impl core::fmt::Debug>) -> String {
        match result {
            Err(BackendError::InvalidConfig(message)) => message,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn bad_head_arithmetic_is_an_error_naming_the_sizes() {
        let message = invalid(Qwen3Config::from_hf(&hf("qwen3", 24, 4, 3)));
        assert!(
            message.contains("4 is not a multiple of num_key_value_heads 3"),
            "{message}"
        );
        let mut odd = hf("qwen3", 24, 4, 2);
        odd.head_dim = Some(5);
        let message = invalid(Qwen3Config::from_hf(&odd));
        assert!(message.contains("head_dim 5 must be even"), "{message}");
        let message = invalid(Qwen2Config::from_hf(&hf("qwen2", 30, 4, 2)));
        assert!(message.contains("hidden_size 30 divisible by num_attention_heads 4"));
        let message = invalid(Qwen3MoeConfig::from_hf(&hf("qwen3_moe", 24, 4, 2)));
        assert!(message.contains("num_experts (0)"), "{message}");
        assert!(matches!(
            Qwen2Config::from_hf(&hf("qwen3", 24, 4, 2)),
            Err(BackendError::UnknownModelType { model_type }) if model_type == "qwen3"
        ));
    }

    /// The architectures share every size and differ in their attention options and
    /// feed-forward blocks only.
    #[test]
    fn architectures_set_their_own_attention_and_feed_forward() {
        let device = Device::flex();
        let mut base = hf("qwen2", 24, 4, 2);
        let qwen2 = Qwen2Config::from_hf(&base).expect("valid").init(&device);
        let attn = &qwen2.model.layers[0].self_attn;
        assert!(attn.q_proj.bias.is_some() && attn.v_proj.bias.is_some());
        assert!(attn.o_proj.bias.is_none() && attn.q_norm.is_none());
        assert_eq!(qwen2.config.decoder.head_dim, 6);

        base.model_type = "qwen3".into();
        base.head_dim = Some(8);
        base.rms_norm_eps = 1e-5;
        let qwen3 = Qwen3Config::from_hf(&base).expect("valid");
        let spec = qwen3.attention();
        assert_eq!(spec.head_dim, 8);
        assert_eq!(spec.qk_norm_eps, Some(1e-5));
        assert!(!spec.qkv_bias && !spec.o_bias);
        let biased = qwen3.clone().with_attention_bias(true).attention();
        assert!(biased.qkv_bias && biased.o_bias);
        // Everything but the options is shared: Qwen3 reads the same sizes as Qwen2 would.
        assert_eq!(qwen3.decoder.num_key_value_heads, 2);
        assert_eq!(qwen3.decoder.hidden_size, 24);

        base.model_type = "qwen3_moe".into();
        base.num_experts = Some(4);
        base.num_experts_per_tok = Some(2);
        base.moe_intermediate_size = Some(16);
        base.decoder_sparse_step = Some(2);
        let moe = Qwen3MoeConfig::from_hf(&base).expect("valid").init(&device);
        let kinds: Vec<bool> = moe
            .model
            .layers
            .iter()
            .map(|l| matches!(l.mlp, FeedForward::Sparse(_)))
            .collect();
        assert_eq!(kinds, [false, true, false], "every second layer is sparse");
        assert_eq!(moe.config.attention(), qwen3.attention());
    }
}
