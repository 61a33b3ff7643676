//! What the actor and critic trainers share: micro-batch planning, the padded response-token
//! tensors of a micro-batch, the optimiser core (clip → schedule → AdamW) and the step report.

use super::adamw::{FusedAdamW, GradScale};
use super::clip::{clip_coefficient, global_grad_norm, squared_norms};
use super::config::TrainerConfig;
use super::group::{Group, Summed};
use super::lora::TrainerRng;
use super::schedule::lr_at;
use crate::engine::cpu::computed_once;
use crate::models::{PaddingSide, TokenBatch};
use crate::{BackendError, Result};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsParams, ModuleOptimizer, OptimizerRecord};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use roll_algos::loss::Denominators;
use roll_core::strategy::{ReduceOp, Strategy};
use roll_core::{TrainBatch, TrainSequence};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// The result of one train step: the main numbers as fields, everything (these included) in
/// [`TrainStepReport::to_metrics`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrainStepReport {
    /// Optimiser updates applied so far, this one included.
    pub step: u64,
    /// The loss of the whole batch (sum of the micro-batch contributions).
    pub loss: f64,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// Learning rate of this update.
    pub lr: f64,
    /// Trained tokens (loss-mask `true`) of the batch.
    pub trained_tokens: usize,
    /// Sequences that had at least one trained token (the others are not run at all).
    pub sequences: usize,
    /// Forward/backward passes the batch was split into.
    pub micro_batches: usize,
    /// `true` when no update was applied: the batch had no trained token, or the gradient norm was
    /// not finite. The step count does not advance then.
    pub skipped: bool,
    /// The objective's own diagnostics (e.g. `pg_loss`, `kl_loss`, `entropy`, `clip_frac_low`,
    /// `approx_kl` for the actor; `vf_loss`, `vf_clip_frac`, `value_mean` for the critic).
    pub metrics: BTreeMap<String, f64>,
    /// Wall time of the update itself: the global norm, the clip and AdamW. The rest of a step
    /// is its forwards and backwards (and, among replicas, the gradient all-reduce).
    pub optimizer_time: std::time::Duration,
}

impl TrainStepReport {
    /// All numbers of the report as one map: `loss`, `grad_norm`, `lr`, `step`,
    /// `trained_tokens`, `sequences`, `micro_batches`, `skipped` (0/1), `time/optimizer_s` and
    /// [`Self::metrics`].
    pub fn to_metrics(&self) -> BTreeMap<String, f64> {
        let mut m = self.metrics.clone();
        m.insert("time/optimizer_s".into(), self.optimizer_time.as_secs_f64());
        m.insert("loss".into(), self.loss);
        m.insert("grad_norm".into(), self.grad_norm);
        m.insert("lr".into(), self.lr);
        m.insert("step".into(), self.step as f64);
        m.insert("trained_tokens".into(), self.trained_tokens as f64);
        m.insert("sequences".into(), self.sequences as f64);
        m.insert("micro_batches".into(), self.micro_batches as f64);
        m.insert("skipped".into(), f64::from(u8::from(self.skipped)));
        m
    }
}

/// The gradients of one batch, summed over its micro-batches: what a step applies. Split from the
/// update so that callers can inspect them or combine those of several workers first.
pub struct BatchGradients {
    /// Summed gradients of the trained parameters.
    pub grads: GradientsParams,
    /// The batch loss (sum of micro-batch contributions).
    pub loss: f64,
    /// Trained tokens of the batch.
    pub trained_tokens: usize,
    /// Sequences with at least one trained token.
    pub sequences: usize,
    /// Micro-batches run.
    pub micro_batches: usize,
    /// The objective's diagnostics over the whole batch.
    pub metrics: BTreeMap<String, f64>,
}

impl std::fmt::Debug for BatchGradients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchGradients")
            .field("parameters", &self.grads.len())
            .field("loss", &self.loss)
            .field("trained_tokens", &self.trained_tokens)
            .field("micro_batches", &self.micro_batches)
            .finish()
    }
}

/// How a batch is cut into micro-batches, and the global loss denominators.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Indices into the batch, one list per micro-batch.
    pub chunks: Vec<Vec<usize>>,
    /// `N` (trained tokens) and `S` (sequences with a trained token) of the whole batch.
    pub denominators: Denominators,
    /// Longest response among the trained sequences.
    pub max_response: usize,
    /// `N`.
    pub trained_tokens: usize,
    /// `S`.
    pub sequences: usize,
}

/// How a micro-batch's sequences lie in memory, which decides what its token budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Right-padded to the longest (Burn's autodiff path): `rows × longest` tokens.
    Padded,
    /// End to end, a prompt its sequences share computed once (the fused path, `fused::pack`):
    /// the tokens computed.
    Packed,
}

/// Packs the sequences that have a trained token into micro-batches of at most
/// `micro_batch_tokens` tokens as `layout` counts them and `micro_batch_size` rows; a sequence
/// longer than the token budget runs alone. Sequences without a trained token are left out: they
/// contribute neither loss nor gradient.
///
/// Padded, the sequences are cut longest first, so that each micro-batch pads little. Packed,
/// padding costs nothing, and the sequences sharing a prompt (a GRPO group) go together, longest
/// group first, so that their prompt is computed once; a group the budget cannot hold fills one
/// micro-batch after another. Either way a micro-batch lists its sequences longest first (in
/// batch order among equals), so a batch that fits in one is the same micro-batch in both.
///
/// # Errors
/// [`BackendError::InvalidInput`] for a trained sequence with an empty prompt.
pub(crate) fn plan(batch: &TrainBatch, config: &TrainerConfig, layout: Layout) -> Result<Plan> {
    let seqs = batch.sequences();
    let mut order = Vec::new();
    let mut trained_tokens = 0;
    let mut max_response = 0;
    for (i, s) in seqs.iter().enumerate() {
        let n = s.num_trained_tokens();
        if n == 0 {
            continue;
        }
        if s.prompt_ids.is_empty() {
            return Err(BackendError::InvalidInput(format!(
                "{}: empty prompt, so its first response token has no context",
                s.sample
            )));
        }
        trained_tokens += n;
        max_response = max_response.max(s.response_ids.len());
        order.push(i);
    }
    let len = |i: usize| seqs[i].prompt_ids.len() + seqs[i].response_ids.len();
    order.sort_by_key(|&i| std::cmp::Reverse(len(i)));
    let budget = config.micro_batch_tokens.unwrap_or(usize::MAX).max(1);
    let rows = config.micro_batch_size.unwrap_or(usize::MAX).max(1);
    let chunks = match layout {
        Layout::Padded => {
            let mut chunks = Vec::new();
            let mut start = 0;
            while start < order.len() {
                let width = len(order[start]);
                let mut end = start + 1;
                while end < order.len()
                    && end - start < rows
                    && (end - start + 1).saturating_mul(width) <= budget
                {
                    end += 1;
                }
                chunks.push(order[start..end].to_vec());
                start = end;
            }
            chunks
        }
        Layout::Packed => {
            // The groups in the order of their longest sequences, each longest first.
            let mut groups: Vec<Vec<usize>> = Vec::new();
            let mut group_of: HashMap<&[u32], usize> = HashMap::new();
            for &i in &order {
                let g = *group_of
                    .entry(seqs[i].prompt_ids.as_slice())
                    .or_insert(groups.len());
                if g == groups.len() {
                    groups.push(Vec::new());
                }
                groups[g].push(i);
            }
            let mut chunks: Vec<Vec<usize>> = Vec::new();
            let (mut chunk, mut tokens) = (Vec::new(), 0);
            for group in &groups {
                let mut in_chunk = 0;
                for &i in group {
                    // `fused::pack` computes all of a shared prompt but its last token once: each
                    // sequence of the group after the first in a micro-batch adds the rest.
                    let shared = computed_once(&seqs[i].prompt_ids).len();
                    let mut cost = if in_chunk > 0 {
                        len(i) - shared
                    } else {
                        len(i)
                    };
                    if !chunk.is_empty() && (chunk.len() == rows || tokens + cost > budget) {
                        chunks.push(std::mem::take(&mut chunk));
                        (tokens, in_chunk) = (0, 0);
                        cost = len(i);
                    }
                    chunk.push(i);
                    tokens += cost;
                    in_chunk += 1;
                }
            }
            if !chunk.is_empty() {
                chunks.push(chunk);
            }
            for chunk in &mut chunks {
                chunk.sort_by_key(|&i| (std::cmp::Reverse(len(i)), i));
            }
            chunks
        }
    };
    let sequences = order.len();
    Ok(Plan {
        chunks,
        denominators: Denominators::global(trained_tokens, sequences),
        max_response,
        trained_tokens,
        sequences,
    })
}

/// One micro-batch on the device: `prompt ‖ response` right-padded, and `[rows, T]` tensors over
/// the response tokens (`T` = longest response of the micro-batch).
pub(crate) struct Chunk<'a> {
    pub seqs: Vec<&'a TrainSequence>,
    pub tokens: TokenBatch,
    /// Column of the position that predicts each response token (`prompt_len − 1 + t`).
    pub cols: Tensor<2, Int>,
    /// The response tokens (0 in padding).
    pub targets: Tensor<2, Int>,
    /// The loss mask (`false` in padding).
    pub mask: Tensor<2, Bool>,
    pub rows: usize,
    pub width: usize,
    /// Trained tokens of this micro-batch.
    pub trained: usize,
    device: Device,
}

impl<'a> Chunk<'a> {
    pub(crate) fn new(
        seqs: Vec<&'a TrainSequence>,
        vocab_size: usize,
        device: &Device,
    ) -> Result<Self> {
        let full: Vec<Vec<u32>> = seqs
            .iter()
            .map(|s| [s.prompt_ids.as_slice(), s.response_ids.as_slice()].concat())
            .collect();
        // Padding is masked out of attention and loss, so any valid id (0) fills it.
        let tokens = TokenBatch::new(&full, PaddingSide::Right, 0, vocab_size, device)?;
        let rows = seqs.len();
        let width = seqs.iter().map(|s| s.response_ids.len()).max().unwrap_or(0);
        let mut cols = vec![0i32; rows * width];
        let mut targets = vec![0i32; rows * width];
        let mut mask = vec![false; rows * width];
        let mut trained = 0;
        for (r, s) in seqs.iter().enumerate() {
            for (t, (&id, &m)) in s.response_ids.iter().zip(&s.loss_mask).enumerate() {
                let at = r * width + t;
                let col = s.prompt_ids.len() - 1 + t;
                cols[at] = i32::try_from(col).map_err(|_| {
                    BackendError::InvalidInput(format!("{}: sequence too long", s.sample))
                })?;
                // Ids were checked against the vocabulary by `TokenBatch::new`.
                targets[at] = i32::try_from(id).unwrap_or(0);
                mask[at] = m;
                trained += usize::from(m);
            }
        }
        let shape = [rows, width];
        Ok(Self {
            seqs,
            tokens,
            cols: Tensor::from_data(TensorData::new(cols, shape), device),
            targets: Tensor::from_data(TensorData::new(targets, shape), device),
            mask: Tensor::from_data(TensorData::new(mask, shape), device),
            rows,
            width,
            trained,
            device: device.clone(),
        })
    }

    /// A `[rows, T]` tensor of a per-token quantity, 0 in padding.
    pub(crate) fn per_token(&self, field: impl Fn(&TrainSequence) -> &[f32]) -> Tensor<2> {
        let mut v = vec![0f32; self.rows * self.width];
        for (r, s) in self.seqs.iter().enumerate() {
            let src = field(s);
            v[r * self.width..r * self.width + src.len()].copy_from_slice(src);
        }
        Tensor::from_data(TensorData::new(v, [self.rows, self.width]), &self.device)
    }

    /// A `[rows]` tensor of a per-sequence quantity.
    pub(crate) fn per_sequence(&self, field: impl Fn(&TrainSequence) -> f32) -> Tensor<1> {
        let v: Vec<f32> = self.seqs.iter().map(|s| field(s)).collect();
        Tensor::from_data(TensorData::new(v, [self.rows]), &self.device)
    }

    /// The hidden states of the positions that predict the response tokens.
    ///
    /// # Shapes
    /// - `hidden`: `[rows, seq, hidden]`
    /// - output: `[rows, T, hidden]`
    pub(crate) fn response_hidden(&self, hidden: Tensor<3>) -> Tensor<3> {
        let h = hidden.dims()[2];
        let index = self
            .cols
            .clone()
            .unsqueeze_dim::<3>(2)
            .expand([self.rows, self.width, h]);
        hidden.gather(1, index)
    }
}

/// The metrics a trainer reports, by how they combine over micro-batches (and replicas).
#[derive(Debug)]
pub(crate) struct MetricSchema {
    /// Contributions that add up to the batch value (losses under global denominators).
    pub sums: &'static [&'static str],
    /// Token-weighted means (fractions, KL diagnostics).
    pub means: &'static [&'static str],
    /// Maxima.
    pub maxima: &'static [&'static str],
}

/// Sums of micro-batch metrics: contributions (losses, which add up to the batch value under
/// global denominators) and token-weighted means (fractions, KL diagnostics).
#[derive(Debug)]
pub(crate) struct MetricSums {
    schema: &'static MetricSchema,
    sums: BTreeMap<&'static str, f64>,
    weighted: BTreeMap<&'static str, f64>,
    maxima: BTreeMap<&'static str, f64>,
    tokens: f64,
}

impl MetricSums {
    pub(crate) fn new(schema: &'static MetricSchema) -> Self {
        Self {
            schema,
            sums: BTreeMap::new(),
            weighted: BTreeMap::new(),
            maxima: BTreeMap::new(),
            tokens: 0.0,
        }
    }

    /// Adds `values[i]` to the schema's `sums[i]`.
    pub(crate) fn add_sums<const N: usize>(&mut self, values: [f32; N]) {
        for (&key, v) in self.schema.sums.iter().zip(values) {
            *self.sums.entry(key).or_default() += f64::from(v);
        }
    }

    /// Adds `values[i]`, weighted by `tokens`, to the schema's `means[offset + i]`.
    pub(crate) fn add_means<const N: usize>(
        &mut self,
        offset: usize,
        values: [f32; N],
        tokens: usize,
    ) {
        for (&key, v) in self.schema.means[offset..].iter().zip(values) {
            *self.weighted.entry(key).or_default() += f64::from(v) * tokens as f64;
        }
    }

    /// Raises the schema's `maxima[i]` to `values[i]`.
    pub(crate) fn add_maxima<const N: usize>(&mut self, values: [f32; N]) {
        for (&key, v) in self.schema.maxima.iter().zip(values) {
            let m = self.maxima.entry(key).or_insert(f64::NEG_INFINITY);
            *m = m.max(f64::from(v));
        }
    }

    /// Sums `loss` and every metric over the replicas of `strategy` (in `f32`: they are
    /// diagnostics). A metric no replica reported stays absent.
    pub(crate) fn all_reduce(
        &mut self,
        strategy: &dyn Strategy,
        loss: &mut f64,
    ) -> roll_core::Result<()> {
        let schema = self.schema;
        let mut added = vec![*loss as f32, self.tokens as f32];
        for (keys, map) in [(schema.sums, &self.sums), (schema.means, &self.weighted)] {
            for key in keys {
                let v = map.get(key);
                added.extend([
                    f32::from(u8::from(v.is_some())),
                    v.map_or(0.0, |&v| v as f32),
                ]);
            }
        }
        strategy.all_reduce(&mut added, ReduceOp::Sum)?;
        let mut maxima: Vec<f32> = schema
            .maxima
            .iter()
            .map(|key| {
                self.maxima
                    .get(key)
                    .map_or(f32::NEG_INFINITY, |&v| v as f32)
            })
            .collect();
        strategy.all_reduce(&mut maxima, ReduceOp::Max)?;
        *loss = f64::from(added[0]);
        self.tokens = f64::from(added[1]);
        let mut pairs = added[2..].chunks_exact(2);
        for (keys, map) in [
            (schema.sums, &mut self.sums),
            (schema.means, &mut self.weighted),
        ] {
            for (key, pair) in keys.iter().zip(pairs.by_ref()) {
                if pair[0] > 0.0 {
                    map.insert(key, f64::from(pair[1]));
                }
            }
        }
        for (key, m) in schema.maxima.iter().zip(maxima) {
            if m > f32::NEG_INFINITY {
                self.maxima.insert(key, f64::from(m));
            }
        }
        Ok(())
    }

    pub(crate) fn add_tokens(&mut self, tokens: usize) {
        self.tokens += tokens as f64;
    }

    pub(crate) fn finish(self) -> BTreeMap<String, f64> {
        let n = self.tokens.max(1.0);
        let sums = self.sums.into_iter();
        let means = self.weighted.into_iter().map(|(k, v)| (k, v / n));
        sums.chain(means)
            .chain(self.maxima)
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }
}

/// Forces every lazily initialised parameter of `module` to take its value, so that clones made
/// afterwards no longer share an uninitialised cell (a `freeze()` on one would freeze the other).
struct Materialize;

impl ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

pub(crate) fn materialize_params<M: Module>(module: &M) {
    module.visit(&mut Materialize);
}

/// What an update did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Applied {
    pub grad_norm: f64,
    pub lr: f64,
    pub skipped: bool,
}

/// The trained module with its optimiser, schedule position and random state.
pub(crate) struct Core<M: Module> {
    /// `None` only if an optimiser step panicked half-way.
    module: Option<M>,
    /// How many times `module` was replaced (by an update or [`Core::set_module`]): the same
    /// count, the same parameter values.
    generation: u64,
    /// [`FusedAdamW`] (PyTorch's AdamW semantics) as a whole-module optimiser.
    optim: ModuleOptimizer,
    /// The clip coefficient `optim` applies in its pass.
    grad_scale: GradScale,
    pub config: TrainerConfig,
    pub step: u64,
    pub rng: TrainerRng,
    /// The plain device (inference copies).
    pub device: Device,
    /// The autodiff device the module lives on.
    pub ad_device: Device,
    /// The data-parallel group this trainer is one replica of; `None` when it trains alone.
    group: Option<Group>,
    /// The groups whose ranks each hold their own part of some parameters (a tensor-parallel
    /// rank's slices, a pipeline stage's layers), innermost first, and which those are on this
    /// rank: for the global norm their squared gradients are summed over the group, and so is
    /// what the groups inside it summed.
    parts: Vec<(Arc<dyn Strategy>, HashSet<ParamId>)>,
    /// The parameters the data-parallel group's other ranks do not all hold (an
    /// expert-parallel replica's experts): left out of the gradient all-reduce, and summed over
    /// `expert_replicas` (the ranks holding the same ones) when there are several.
    unreplicated: HashSet<ParamId>,
    expert_replicas: Option<Group>,
}

impl<M: Module> Core<M> {
    pub(crate) fn new(module: M, config: TrainerConfig, rng: TrainerRng, device: &Device) -> Self {
        let device = device.clone().inner();
        let grad_scale = GradScale::new();
        Self {
            module: Some(module),
            generation: 0,
            optim: FusedAdamW::module_optimizer(&config, grad_scale.clone()),
            grad_scale,
            config,
            step: 0,
            rng,
            ad_device: device.clone().autodiff(),
            device,
            group: None,
            parts: Vec::new(),
            unreplicated: HashSet::new(),
            expert_replicas: None,
        }
    }

    /// Makes this trainer one rank of a model whose ranks hold parts of it (tensor or pipeline
    /// parallel, or both): for each group, innermost first, the parameters only this rank of it
    /// holds (its part of them).
    pub(crate) fn own_parts(&mut self, levels: Vec<(Arc<dyn Strategy>, Vec<ParamId>)>) {
        self.parts = levels
            .into_iter()
            .map(|(group, own)| (group, own.into_iter().collect()))
            .collect();
    }

    /// Makes this trainer one replica of an expert-parallel model whose experts are divided
    /// among the ranks of its data-parallel group (or of one of several copies of it there; see
    /// [`Core::own_parts`] for the group), with `own` this replica's experts' parameters: their
    /// gradients are summed over `replicas` (the ranks holding the same experts; none: no other
    /// rank does) rather than the whole data-parallel group.
    pub(crate) fn own_experts(&mut self, own: Vec<ParamId>, replicas: Option<Arc<dyn Strategy>>) {
        self.unreplicated = own.into_iter().collect();
        self.expert_replicas = replicas.map(Group::new);
    }

    /// The size of the group of ranks holding this replica's experts, and this one's rank
    /// there (`(0, 1)` without).
    pub(crate) fn expert_replica_place(&self) -> (usize, usize) {
        self.expert_replicas
            .as_ref()
            .map_or((0, 1), |g| (g.rank(), g.world_size()))
    }

    /// This trainer's rank and the size of its data-parallel group (`(0, 1)` alone).
    pub(crate) fn data_place(&self) -> (usize, usize) {
        self.group
            .as_ref()
            .map_or((0, 1), |g| (g.rank(), g.world_size()))
    }

    /// The global L2 norm of `grads`: where ranks hold parts of the model, the squares of the
    /// parameters every rank holds alike once, plus every rank's own parts'. With groups inside
    /// groups (a pipeline of tensor-parallel stages) each group sums its ranks' own squares and
    /// what the group inside summed: the slices' over a stage, then with the stage's layers' over
    /// the pipeline.
    fn grad_norm(&self, grads: &mut GradientsParams) -> Result<f64> {
        if self.parts.is_empty() {
            return global_grad_norm(self.module()?, grads);
        }
        let sets: Vec<&HashSet<ParamId>> = self.parts.iter().map(|(_, own)| own).collect();
        let squares = squared_norms(self.module()?, grads, &sets)?;
        let mut summed = 0.0;
        for ((group, _), own) in self.parts.iter().zip(&squares) {
            let mut all = [(summed + own) as f32];
            group
                .all_reduce(&mut all, ReduceOp::Sum)
                .map_err(|e| BackendError::Collective(Box::new(e)))?;
            summed = f64::from(all[0]);
        }
        Ok((squares[sets.len()] + summed).sqrt())
    }

    /// This trainer's rank in its data-parallel group (0 alone).
    pub(crate) fn data_rank(&self) -> usize {
        self.group.as_ref().map_or(0, Group::rank)
    }

    /// Makes this trainer one replica of `strategy`'s data-parallel group.
    pub(crate) fn join(&mut self, strategy: Arc<dyn Strategy>) {
        self.group = Some(Group::new(strategy));
    }

    /// Runs `step`; if it fails, the other replicas are told (see [`Group::or_abort`]).
    pub(crate) fn or_abort<T>(&self, step: impl FnOnce() -> Result<T>) -> Result<T> {
        match &self.group {
            Some(group) => group.or_abort(step),
            None => step(),
        }
    }

    /// [`plan`] of this replica's shard, with the group's denominators.
    pub(crate) fn plan(&self, batch: &TrainBatch, layout: Layout) -> Result<Plan> {
        let mut plan = plan(batch, &self.config, layout)?;
        if let Some(group) = &self.group {
            group.globalise(&mut plan)?;
        }
        Ok(plan)
    }

    /// A batch's gradients, loss and metrics, summed over the group when there is one.
    pub(crate) fn batch_gradients(
        &self,
        grads: GradientsParams,
        mut loss: f64,
        mut sums: MetricSums,
        plan: &Plan,
    ) -> Result<BatchGradients> {
        let grads = match &self.group {
            Some(group) => {
                group.sum_metrics(&mut loss, &mut sums)?;
                let module = self.module()?;
                let all_but = Summed::AllBut(&self.unreplicated);
                let grads = group.sum_gradients(module, grads, all_but, &self.device)?;
                match &self.expert_replicas {
                    Some(replicas) => {
                        let only = Summed::Only(&self.unreplicated);
                        replicas.sum_gradients(module, grads, only, &self.device)?
                    }
                    None => grads,
                }
            }
            None => grads,
        };
        Ok(BatchGradients {
            grads,
            loss,
            trained_tokens: plan.trained_tokens,
            sequences: plan.sequences,
            micro_batches: plan.chunks.len(),
            metrics: sums.finish(),
        })
    }

    pub(crate) fn module(&self) -> Result<&M> {
        self.module.as_ref().ok_or_else(|| {
            BackendError::Train(
                "the trainer lost its model in an earlier step that panicked".into(),
            )
        })
    }

    pub(crate) fn set_module(&mut self, module: M) {
        self.module = Some(module);
        self.generation += 1;
    }

    /// Identifies the module's parameter values: it changes whenever they may have.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The optimiser's state (moments and step counts per parameter), for a checkpoint.
    pub(crate) fn optimizer(&self) -> &ModuleOptimizer {
        &self.optim
    }

    /// Resumes the optimiser's state from a checkpoint.
    pub(crate) fn load_optimizer(&mut self, record: OptimizerRecord) {
        self.optim =
            FusedAdamW::module_optimizer(&self.config, self.grad_scale.clone()).load_record(record);
    }

    /// Global-norm clipping, then one AdamW update at the scheduled learning rate, the clip
    /// coefficient applied inside the update's pass. A non-finite gradient norm skips the update.
    pub(crate) fn apply(&mut self, mut grads: GradientsParams) -> Result<Applied> {
        let lr = lr_at(&self.config, self.step);
        let grad_norm = self.grad_norm(&mut grads)?;
        self.grad_scale.set(
            self.config
                .max_grad_norm
                .map_or(1.0, |max| clip_coefficient(grad_norm, max)),
        );
        if !grad_norm.is_finite() {
            return Ok(Applied {
                grad_norm,
                lr,
                skipped: true,
            });
        }
        let module = self.module.take().ok_or_else(|| {
            BackendError::Train(
                "the trainer lost its model in an earlier step that panicked".into(),
            )
        })?;
        self.module = Some(self.optim.step(lr, module, grads));
        self.generation += 1;
        self.step += 1;
        Ok(Applied {
            grad_norm,
            lr,
            skipped: false,
        })
    }

    /// Applies a batch's gradients (nothing for a batch without a trained token) and reports. A
    /// replica that fails here tells its group: it would otherwise fall out of step with the
    /// others unnoticed.
    pub(crate) fn apply_batch(&mut self, g: BatchGradients) -> Result<TrainStepReport> {
        let applied = self.apply_batch_alone(g);
        if let (Err(e), Some(group)) = (&applied, &self.group) {
            group.abort(e);
        }
        applied
    }

    fn apply_batch_alone(&mut self, mut g: BatchGradients) -> Result<TrainStepReport> {
        let started = std::time::Instant::now();
        let applied = if g.trained_tokens == 0 {
            Applied {
                grad_norm: 0.0,
                lr: lr_at(&self.config, self.step),
                skipped: true,
            }
        } else {
            let grads = std::mem::replace(&mut g.grads, GradientsParams::new());
            self.apply(grads)?
        };
        let optimizer_time = started.elapsed();
        Ok(TrainStepReport {
            step: self.step,
            loss: g.loss,
            grad_norm: applied.grad_norm,
            lr: applied.lr,
            trained_tokens: g.trained_tokens,
            sequences: g.sequences,
            micro_batches: g.micro_batches,
            skipped: applied.skipped,
            metrics: g.metrics,
            optimizer_time,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use roll_core::SampleId;

    fn seq(id: u64, prompt: usize, response: usize, trained: bool) -> TrainSequence {
        TrainSequence {
            sample: SampleId(id),
            prompt_ids: vec![1; prompt],
            response_ids: vec![2; response],
            loss_mask: vec![trained; response],
            old_logprobs: vec![0.0; response],
            rollout_logprobs: vec![0.0; response],
            ref_logprobs: None,
            advantages: vec![1.0; response],
            returns: None,
            old_values: None,
            weight: 1.0,
            score: 1.0,
        }
    }

    #[test]
    fn plan_packs_longest_first_within_both_bounds() {
        let batch = TrainBatch::new(vec![
            seq(0, 2, 2, true),  // 4 tokens
            seq(1, 2, 8, true),  // 10
            seq(2, 1, 1, false), // skipped
            seq(3, 3, 3, true),  // 6
            seq(4, 1, 2, true),  // 3
        ])
        .unwrap();
        let cfg = TrainerConfig {
            micro_batch_tokens: Some(12),
            ..TrainerConfig::default()
        };
        let p = plan(&batch, &cfg, Layout::Padded).unwrap();
        assert_eq!(p.chunks, vec![vec![1], vec![3, 0], vec![4]]);
        assert_eq!(p.denominators, Denominators::global(15, 4));
        assert_eq!(p.max_response, 8);
        let cfg = TrainerConfig {
            micro_batch_tokens: None,
            micro_batch_size: Some(3),
            ..TrainerConfig::default()
        };
        assert_eq!(
            plan(&batch, &cfg, Layout::Padded).unwrap().chunks,
            vec![vec![1, 3, 0], vec![4]]
        );
    }

    /// Packed, a GRPO group's sequences go together and their prompt counts once; a batch that
    /// fits in one micro-batch is the padded plan's.
    #[test]
    fn packed_plans_keep_a_prompts_sequences_together_and_count_it_once() {
        let with_prompt = |id: u64, prompt: Vec<u32>, response: usize| TrainSequence {
            prompt_ids: prompt,
            ..seq(id, 1, response, true)
        };
        let (a, b, c) = (vec![1; 4], vec![2; 3], vec![3]);
        let batch = TrainBatch::new(vec![
            with_prompt(0, b.clone(), 1), // 4 tokens
            with_prompt(1, a.clone(), 6), // 10
            with_prompt(2, c, 3),         // 4
            with_prompt(3, b, 5),         // 8
            with_prompt(4, a, 2),         // 6
        ])
        .unwrap();
        let cfg = |tokens: Option<usize>, rows: Option<usize>| TrainerConfig {
            micro_batch_tokens: tokens,
            micro_batch_size: rows,
            ..TrainerConfig::default()
        };
        let chunks = |cfg: &TrainerConfig, layout| plan(&batch, cfg, layout).unwrap().chunks;
        // 10 + (6 − 3) = 13 tokens for the first group; 8 + (4 − 2) for the second.
        let budget = cfg(Some(13), None);
        assert_eq!(
            chunks(&budget, Layout::Packed),
            vec![vec![1, 4], vec![3, 0], vec![2]]
        );
        // Padded, by length: each group cut in two.
        assert_eq!(
            chunks(&budget, Layout::Padded),
            vec![vec![1], vec![3], vec![4, 0], vec![2]]
        );
        // One token fewer and the first group no longer fits: it fills one micro-batch after
        // another, its second sequence alone (6 tokens, and the next group's 8 exceed 12).
        assert_eq!(
            chunks(&cfg(Some(12), None), Layout::Packed),
            vec![vec![1], vec![4], vec![3, 0], vec![2]]
        );
        assert_eq!(
            chunks(&cfg(None, Some(2)), Layout::Packed),
            vec![vec![1, 4], vec![3, 0], vec![2]]
        );
        let whole = cfg(None, None);
        assert_eq!(chunks(&whole, Layout::Packed), vec![vec![1, 3, 4, 0, 2]]);
        assert_eq!(
            chunks(&whole, Layout::Packed),
            chunks(&whole, Layout::Padded)
        );
    }

    #[derive(burn::module::Module, Debug)]
    struct Scalar {
        p: Param<Tensor<1>>,
    }

    #[test]
    fn adamw_is_pytorch_adamw_on_a_scalar() {
        // torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1) with
        // p = 1 and gradients 0.5 then −0.25 gives p = 0.890000002, then 0.8544662986878463.
        let dev = Device::flex().autodiff();
        let cfg = TrainerConfig {
            lr: 0.1,
            weight_decay: 0.1,
            ..TrainerConfig::default()
        };
        let mut optim = FusedAdamW::module_optimizer(&cfg, GradScale::new());
        let mut m = Scalar {
            p: Param::from_tensor(Tensor::from_floats([1.0], &dev)),
        };
        for (g, want) in [(0.5f32, 0.890_000_002f64), (-0.25, 0.854_466_298_687_846_3)] {
            // loss = g·p, so ∂loss/∂p = g.
            let loss = m.p.val().mul_scalar(g).sum();
            let grads = GradientsParams::from_grads(loss.backward(), &m);
            m = optim.step(0.1, m, grads);
            let got: f32 = m.p.val().into_scalar();
            assert!((f64::from(got) - want).abs() < 1e-7, "{got} vs {want}");
        }
    }

    #[test]
    fn empty_prompt_is_an_error_naming_the_sample() {
        let batch = TrainBatch::new(vec![seq(9, 0, 2, true)]).unwrap();
        let err = plan(&batch, &TrainerConfig::default(), Layout::Padded).unwrap_err();
        assert!(err.to_string().contains("sample#9"), "{err}");
    }
}
