//! [`Trainer`]: the actor's optimisation step on a [`TrainBatch`] under a roll-algos objective.

use super::blockwise;
use super::checkpoint::{self, CheckpointMeta, TrainedRole};
use super::config::TrainKernels;
use super::config::TrainerConfig;
use super::core::{
    BatchGradients, Chunk, Core, MetricSchema, MetricSums, Plan, TrainStepReport,
    materialize_params,
};
use super::fused;
use super::group::{Group, Summed};
use super::lora::{LoraAttach, TrainerRng, count_adapters};
use crate::engine::cpu::CpuDecoder;
use crate::models::token_logprobs_and_entropy;
use crate::models::{CausalLm, PartLevel, PipelineStage, StageCompute};
use crate::{BackendError, Result, ScoringOptions, score};
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Tensor};
use roll_algos::loss::{LossAggregation, PolicyInputs, PolicyMetrics, policy_objective};
use roll_core::policy::{Objective, ScoreRequest, TokenScores};
use roll_core::strategy::{ReduceOp, Strategy};
use roll_core::{TrainBatch, TrainSequence};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The actor's metrics, by how they combine (see [`MetricSums`]).
static POLICY_METRICS: MetricSchema = MetricSchema {
    sums: &["pg_loss", "kl_loss", "entropy"],
    means: &[
        "clip_frac_low",
        "clip_frac_high",
        "dual_clip_frac",
        "approx_kl",
        "policy_kl",
        "ratio_mean",
        "train_infer/mean_abs_diff",
        "train_infer/filtered_frac",
        "train_infer/mean_is_weight",
    ],
    maxima: &["train_infer/max_abs_diff"],
};

/// Trains a [`CausalLm`] policy: micro-batched forward/backward with gradient accumulation,
/// global-norm clipping, AdamW with a warmup/cosine schedule, optional LoRA, and atomic
/// checkpoints that resume bit-for-bit.
///
/// One [`Trainer::step`]:
/// 1. drops sequences without a trained token and packs the rest into micro-batches (longest
///    first, bounded by [`TrainerConfig::micro_batch_tokens`] / `micro_batch_size`);
/// 2. for each micro-batch: forward of `prompt ‖ response`, log-probs of the response tokens (the
///    LM head runs on response positions only), the objective of
///    [`roll_algos::loss::policy_objective`] with the **whole batch's** denominators (so the sum
///    over micro-batches is the full-batch loss, whatever the split), backward, and gradients
///    added up;
/// 3. clips the global gradient norm, and applies AdamW at the scheduled learning rate.
///
/// With LoRA only the adapters train; the base weights stay frozen and double as the reference
/// policy ([`Trainer::reference_scores`]).
///
/// ```no_run
/// use roll_backend_burn::train::{Trainer, TrainerConfig};
/// use roll_backend_burn::{Device, load_model};
/// use roll_core::{SampleId, TrainBatch, TrainSequence};
/// let device = Device::flex();
/// let model = load_model("tiny-qwen2", &device)?;
/// let batch = TrainBatch::new(vec![TrainSequence {
///     sample: SampleId(0),
///     prompt_ids: vec![1, 2, 3],
///     response_ids: vec![4, 5],
///     loss_mask: vec![true; 2],
///     old_logprobs: vec![-1.0; 2],
///     rollout_logprobs: vec![-1.0; 2],
///     ref_logprobs: None,
///     advantages: vec![1.0; 2],
///     returns: None,
///     old_values: None,
///     weight: 1.0,
///     score: 1.0,
/// }])?;
/// let mut trainer = Trainer::new(model, TrainerConfig { lr: 1e-5, ..Default::default() }, &device)?;
/// let report = trainer.step(&batch, &roll_core::policy::Objective::default())?;
/// println!("{:?}", report.to_metrics());
/// let for_inference = trainer.inference_model()?; // plain device, adapters merged
/// # let _ = for_inference;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Trainer {
    core: Core<CausalLm>,
    /// The frozen base on the plain device (LoRA only): the reference policy.
    base: Option<CausalLm>,
    /// The model's weights in the CPU decoder's layout as the inference engine was given them,
    /// with the module's generation they were packed at: what the next fused forward reads
    /// instead of packing the same values itself ([`Trainer::offer_packed`]).
    packed: Mutex<Option<(u64, Arc<CpuDecoder>)>>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("step", &self.core.step)
            .field("lora", &self.core.config.lora)
            .finish_non_exhaustive()
    }
}

/// Why an expert-parallel trainer does not write a checkpoint alone.
fn no_expert_checkpoint() -> BackendError {
    BackendError::InvalidInput(
        "an expert-parallel trainer holds only some of the experts: every rank of its group \
         writes its part (Trainer::save_part, DataParallel::save_checkpoint), or save the \
         gathered model (Trainer::whole_model)"
            .into(),
    )
}

impl Trainer {
    /// A trainer for `model` (moved to `device`'s autodiff twin) with a fresh optimiser.
    ///
    /// # Errors
    /// [`BackendError::InvalidTrainConfig`] for a bad config, including a LoRA target that names
    /// no linear layer of the model (key `lora.target_modules`).
    ///
    /// A tensor-parallel model ([`CausalLm::shard_tensors`]) or a pipeline stage
    /// ([`CausalLm::split_stages`]) trains with every rank of its group stepping together on the
    /// same batch, on either path (on Burn's autodiff block by block, or stage by stage); an
    /// expert-parallel model ([`CausalLm::shard_experts`]) trains on Burn's autodiff path, one
    /// replica of the data-parallel group that holds its experts ([`Trainer::with_strategy`]
    /// with that group, or with several copies of it side by side:
    /// [`CausalLm::with_expert_replicas`]), each rank on its own shard of the batch. With LoRA,
    /// [`BackendError::InvalidInput`].
    pub fn new(model: CausalLm, config: TrainerConfig, device: &Device) -> Result<Self> {
        if let (Some(what), Some(_)) = (model.sharding(), &config.lora) {
            return Err(BackendError::InvalidInput(format!(
                "{what}: it trains without LoRA (its adapters would need parts of their own)"
            )));
        }
        let rng = TrainerRng::new(config.seed);
        let mut trainer = Self::build(model, config, rng, device)?;
        trainer.own_parts()?;
        Ok(trainer)
    }

    fn build(
        model: CausalLm,
        config: TrainerConfig,
        mut rng: TrainerRng,
        device: &Device,
    ) -> Result<Self> {
        config.validate()?;
        let plain = device.clone().inner();
        let ad = plain.clone().autodiff();
        materialize_params(&model);
        let model = model.to_device(&plain);
        let (model, base) = match &config.lora {
            None => (model.to_device(&ad).train(), None),
            Some(lora) => {
                let base = model.clone();
                let mut attach = LoraAttach::new(lora, &mut rng);
                let adapted = model
                    .to_device(&ad)
                    .train()
                    .apply_reparameterization(&mut attach);
                attach.check_all_matched()?;
                (adapted, Some(base))
            }
        };
        Ok(Self {
            core: Core::new(model, config, rng, device),
            base,
            packed: Mutex::new(None),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.core.config
    }

    /// Optimiser updates applied so far (skipped steps do not count).
    pub fn step_count(&self) -> u64 {
        self.core.step
    }

    /// Whether LoRA adapters are trained (and the base frozen).
    pub fn has_lora(&self) -> bool {
        self.base.is_some()
    }

    /// Number of weights carrying a LoRA adapter (0 without LoRA).
    pub fn num_adapters(&self) -> usize {
        self.core.module().map(count_adapters).unwrap_or(0)
    }

    /// The model being trained, on the autodiff device (with adapters attached, if any).
    ///
    /// # Errors
    /// [`BackendError::Train`] if an earlier step panicked half-way.
    pub fn training_model(&self) -> Result<&CausalLm> {
        self.core.module()
    }

    /// A copy of the current weights on the plain (non-autodiff) device with LoRA adapters merged
    /// into the base weights: what the inference engine receives after each step. Later steps
    /// do not change it (the optimiser replaces parameter tensors rather than writing into them).
    ///
    /// # Errors
    /// [`BackendError::Train`] if an earlier step panicked half-way.
    pub fn inference_model(&self) -> Result<CausalLm> {
        Ok(self.core.module()?.valid().materialize())
    }

    /// [`Trainer::inference_model`] of an expert-parallel trainer, its mixtures exchanging their
    /// tokens over `engines` instead of the trainer's group: what an inference engine stepping
    /// with the other ranks' engines on `engines` (a channel of the same ranks) serves. See
    /// [`CausalLm::with_expert_group`].
    ///
    /// # Errors
    /// As [`Trainer::inference_model`] and [`CausalLm::with_expert_group`].
    pub fn served_part(&self, engines: &Arc<dyn Strategy>) -> Result<CausalLm> {
        self.inference_model()?.with_expert_group(engines.clone())
    }

    /// Identifies the current parameter values: it changes with every update or new model.
    pub(crate) fn generation(&self) -> u64 {
        self.core.generation()
    }

    /// Hands the trainer the CPU decoder the engine was given, packed from
    /// [`Trainer::whole_model`] when the trainer was at `generation`: if its parameters have not
    /// changed since, the next fused forward reads that decoder instead of packing the same
    /// values again (the same function of the same values, so the same bits). Kept only where
    /// the whole model is the trained module itself: a LoRA module's merged weights, or a part
    /// of a model, are other values.
    pub(crate) fn offer_packed(&self, generation: u64, decoder: Arc<CpuDecoder>) {
        if self.base.is_some() || self.holds_part() || self.holds_some_experts() {
            return;
        }
        if let Ok(mut packed) = self.packed.lock() {
            *packed = Some((generation, decoder));
        }
    }

    /// The offered decoder, if it is still the current parameters' (it is handed over once: the
    /// forward holds it for the step).
    fn take_packed(&self) -> Option<Arc<CpuDecoder>> {
        let current = self.generation();
        self.packed
            .lock()
            .ok()?
            .take()
            .and_then(|(generation, decoder)| (generation == current).then_some(decoder))
    }

    /// Where the ranks of the model hold parts of it, tells the optimiser core the group to sum
    /// the squared gradients of their own parameters over, and which those are on this rank. (A
    /// part trains on either path: on Burn's autodiff block by block or stage by stage, see
    /// `blockwise`.)
    fn own_parts(&mut self) -> Result<()> {
        let model = self.core.module()?;
        let levels = model.part_levels();
        let experts = model
            .expert_group()
            .map(|_| (model.own_expert_params(), model.expert_replicas()));
        self.core
            .own_parts(levels.into_iter().map(|l| (l.group, l.own)).collect());
        if let Some((own, replicas)) = experts {
            self.core.own_experts(own, replicas);
        }
        Ok(())
    }

    /// This rank's index among the ranks of its copy of a tensor-, pipeline- or
    /// expert-parallel model (its slice, its stage, its block of experts; slice `t` of stage
    /// `s` of a pipeline of `T`-rank tensor-parallel stages is `s·T + t`); `None` for a whole
    /// model.
    pub fn part_index(&self) -> Option<usize> {
        let levels = self.core.module().ok()?.part_levels();
        (!levels.is_empty()).then(|| PartLevel::copy_index(&levels))
    }

    /// Writes this rank's part of a checkpoint of a tensor-, pipeline- or expert-parallel model
    /// under `dir` ([`part_dir`]), if it belongs to the first copy (the other copies hold the
    /// same parts); nothing for a whole model.
    ///
    /// # Errors
    /// As [`Trainer::save_checkpoint`].
    pub fn save_part(&self, dir: &Path, weight_version: u64) -> Result<()> {
        let first_copy = if self.holds_some_experts() {
            self.core.expert_replica_place().0 == 0
        } else {
            self.core.data_rank() == 0
        };
        if let (Some(index), true) = (self.part_index(), first_copy) {
            self.write_checkpoint(part_dir(dir, index), weight_version)?;
        }
        Ok(())
    }

    /// Whether this trainer's model is a part of one (tensor-, pipeline- or expert-parallel):
    /// its ranks then step, and gather, together.
    pub fn holds_part(&self) -> bool {
        self.core.module().is_ok_and(CausalLm::is_sharded)
    }

    /// Whether this trainer's model holds only some of the experts ([`CausalLm::shard_experts`]).
    pub fn holds_some_experts(&self) -> bool {
        self.core.module().is_ok_and(CausalLm::is_expert_sharded)
    }

    /// The whole current model on the plain device: [`Trainer::inference_model`], gathered from
    /// every rank's part when this trainer holds one ([`CausalLm::gather`], a collective: every
    /// rank of the part's group calls it).
    ///
    /// # Errors
    /// As [`Trainer::inference_model`] and [`CausalLm::gather`].
    pub fn whole_model(&self) -> Result<CausalLm> {
        self.inference_model()?.gather()
    }

    /// The model with its adapters merged (`W + (alpha/r)·A·B`) on the plain device; the same as
    /// [`Trainer::inference_model`], named for weight synchronisation.
    ///
    /// # Errors
    /// As [`Trainer::inference_model`].
    pub fn merged_model(&self) -> Result<CausalLm> {
        self.inference_model()
    }

    /// The policy with its adapters disabled (the frozen base) on the plain device — the reference
    /// policy of LoRA training; `None` without LoRA.
    pub fn reference_model(&self) -> Option<CausalLm> {
        self.base.clone()
    }

    /// Scores `request` under the reference policy (adapters disabled), as ROLL does for LoRA
    /// (`disable_adapter=True`).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] without LoRA (the reference is then a separate model), and
    /// the errors of [`score`].
    pub fn reference_scores(
        &self,
        request: &ScoreRequest,
        options: &ScoringOptions,
    ) -> Result<Vec<TokenScores>> {
        let base = self.base.as_ref().ok_or_else(|| {
            BackendError::InvalidInput(
                "reference scores from the trainer need LoRA (without it the reference is a \
                 separate frozen model)"
                    .into(),
            )
        })?;
        score(base, None, request, options, &self.core.device)
    }

    /// One optimisation step: [`Trainer::accumulate_gradients`] then
    /// [`Trainer::apply_gradients`].
    ///
    /// # Errors
    /// As those two.
    pub fn step(&mut self, batch: &TrainBatch, objective: &Objective) -> Result<TrainStepReport> {
        let grads = self.accumulate_gradients(batch, objective)?;
        self.apply_gradients(grads)
    }

    /// Makes this trainer one replica of a data-parallel group: each step then trains on this
    /// replica's shard of the group's batch with the **group's** loss denominators, and applies
    /// the group's summed gradients, so N replicas train exactly as one trainer on the union of
    /// their shards (to rounding) and stay identical to each other. Every replica must start from
    /// the same weights and config and take every step (an empty shard included).
    ///
    /// [`DataParallel`](super::DataParallel) runs a group in one process; `roll-mpi`'s strategy
    /// runs one replica per process.
    #[must_use]
    pub fn with_strategy(mut self, strategy: Arc<dyn Strategy>) -> Self {
        self.core.join(strategy);
        self
    }

    /// Forward and backward over every micro-batch of `batch`, gradients summed; the weights are
    /// not changed.
    ///
    /// `seq_mean_token_sum_norm` without a `horizon` uses the longest response of the whole batch
    /// (the padded length of the full batch), so that micro-batching does not change the loss.
    ///
    /// # Errors
    /// [`BackendError::Train`] if the objective is invalid or needs an input the batch lacks
    /// (`kl_loss` without `ref_logprobs`);
    /// [`BackendError::InvalidInput`] / [`BackendError::TokenOutOfVocab`] for a bad sequence;
    /// [`BackendError::Collective`] when this trainer is a replica and the group failed.
    pub fn accumulate_gradients(
        &self,
        batch: &TrainBatch,
        objective: &Objective,
    ) -> Result<BatchGradients> {
        self.core
            .or_abort(|| self.accumulate_gradients_alone(batch, objective))
    }

    fn accumulate_gradients_alone(
        &self,
        batch: &TrainBatch,
        objective: &Objective,
    ) -> Result<BatchGradients> {
        let objective = checked_objective(objective)?;
        let model = self.core.module()?;
        model.check_lengths(
            batch
                .sequences()
                .iter()
                .map(|s| s.prompt_ids.len() + s.response_ids.len()),
        )?;
        let kernels = self.kernels();
        let plan = self.core.plan(batch, kernels.layout())?;
        let mut objective = objective;
        if let LossAggregation::SeqMeanTokenSumNorm { horizon: None } = objective.loss_aggregation {
            objective.loss_aggregation = LossAggregation::SeqMeanTokenSumNorm {
                horizon: Some(plan.max_response.max(1)),
            };
        }
        let fused = match kernels {
            TrainKernels::Auto => Some(fused::extract(model, self.take_packed())?),
            TrainKernels::Autodiff => None,
        };
        let mut acc = GradientsAccumulator::<CausalLm>::new();
        let mut sums = MetricSums::new(&POLICY_METRICS);
        let mut loss = 0.0;
        let seqs = batch.sequences();
        let chunk = |indices: &Vec<usize>| {
            Chunk::new(
                indices.iter().map(|&i| &seqs[i]).collect(),
                model.vocab_size(),
                &self.core.ad_device,
            )
        };
        // Where the experts are divided among ranks holding different tokens, every rank of
        // their group runs each micro-batch index together: one with fewer serves the others'.
        let micro_batches = match model.expert_group() {
            Some(experts) => {
                self.check_expert_place(experts.as_ref())?;
                let mut count = [plan.chunks.len() as f32];
                experts
                    .all_reduce(&mut count, ReduceOp::Max)
                    .map_err(|e| BackendError::Collective(Box::new(e)))?;
                count[0] as usize
            }
            None => plan.chunks.len(),
        };
        if let Some(stage) = model.pipeline_stage() {
            let chunks = plan.chunks.iter().map(chunk).collect::<Result<Vec<_>>>()?;
            let mut grads = match &fused {
                Some(weights) => self.fused_stage_gradients(
                    weights, stage, &chunks, &objective, &plan, &mut sums, &mut loss,
                )?,
                None => {
                    let mut compute = blockwise::BurnStage {
                        model,
                        plain: model.valid(),
                        chunks: &chunks,
                        first: stage.is_first(),
                        last: stage.is_last(),
                        device: self.core.ad_device.clone(),
                        objective: |i: usize, out: Tensor<3>| {
                            let c = &chunks[i];
                            let hidden = model.final_norm(out);
                            let (l, m) = burn_objective(model, c, &objective, &plan, hidden)?;
                            record(&mut sums, &mut loss, &m, c.trained);
                            Ok(l)
                        },
                        grads: GradientsParams::new(),
                    };
                    stage.run(micro_batches, &mut compute)?;
                    compute.grads
                }
            };
            // The embedding, final norm and head: each stage made its part of their gradients
            // (and the last stage alone the loss and metrics).
            let shared = model.shared_stage_params();
            let device = &self.core.device;
            grads = sum_over(stage.group(), grads, model, &shared, device)?;
            if fused.is_none() {
                grads = sum_replicated_over_slices(model, grads, device)?;
            }
            sums.all_reduce(stage.group().as_ref(), &mut loss)
                .map_err(|e| BackendError::Collective(Box::new(e)))?;
            acc.accumulate(model, grads);
            return self.core.batch_gradients(acc.grads(), loss, sums, &plan);
        }
        // Ranks that exchange inside a block (tensor- or expert-parallel) train block by block;
        // a whole model goes through Burn's autodiff at once. A rank whose experts serve other
        // ranks' tokens may run more micro-batches than its own.
        let by_blocks = model.tensor_shard().is_some() || model.expert_group().is_some();
        for k in 0..micro_batches {
            let Some(indices) = plan.chunks.get(k) else {
                acc.accumulate(
                    model,
                    blockwise::idle_gradients(model, &self.core.ad_device)?,
                );
                continue;
            };
            let chunk = chunk(indices)?;
            let m = match &fused {
                Some(weights) => {
                    let (grads, metrics) =
                        self.fused_gradients(weights, &chunk, &objective, &plan)?;
                    acc.accumulate(model, grads);
                    metrics
                }
                None => {
                    let objective = |hidden: Tensor<3>| {
                        burn_objective(model, &chunk, &objective, &plan, hidden)
                    };
                    let (grads, metrics) = if by_blocks {
                        blockwise::blockwise_gradients(model, &chunk, |last| {
                            objective(model.final_norm(last))
                        })?
                    } else {
                        let (loss, metrics) = objective(model.forward_hidden(&chunk.tokens))?;
                        (GradientsParams::from_grads(loss.backward(), model), metrics)
                    };
                    acc.accumulate(model, grads);
                    metrics
                }
            };
            record(&mut sums, &mut loss, &m, chunk.trained);
        }
        let mut grads = acc.grads();
        if fused.is_none() {
            grads = sum_replicated_over_slices(model, grads, &self.core.device)?;
        }
        self.core.batch_gradients(grads, loss, sums, &plan)
    }

    /// Refuses to train an expert-parallel model outside the data-parallel group that holds its
    /// experts: the group is its experts' group, or its copies side by side, rank `c·E + r`
    /// holding block `r` in copy `c` (`c` its rank among the replicas) — for a pipeline stage,
    /// among the same stage of every pipeline.
    fn check_expert_place(&self, experts: &dyn Strategy) -> Result<()> {
        let (rank, ranks) = self.core.data_place();
        let (copy, copies) = self.core.expert_replica_place();
        let (e, width) = (experts.rank(), experts.world_size());
        if (rank, ranks) == (copy * width + e, copies * width) {
            return Ok(());
        }
        Err(BackendError::InvalidInput(format!(
            "an expert-parallel model trains in the data-parallel group that holds its experts \
             (Trainer::with_strategy with the group given to CausalLm::shard_experts, or with \
             its copies, each rank's replicas given to CausalLm::with_expert_replicas): its \
             experts are on {width} ranks in {copies} copies, this trainer is rank {rank} of \
             {ranks}"
        )))
    }

    /// A pipeline stage's part of a batch on the fused CPU path: its micro-batches in its
    /// one-forward-one-backward order (see [`pipeline_parallel`](crate::models::pipeline_parallel)),
    /// the last stage running the objective; this stage's gradients.
    #[allow(clippy::too_many_arguments)]
    fn fused_stage_gradients(
        &self,
        weights: &fused::Weights,
        stage: &PipelineStage,
        chunks: &[Chunk<'_>],
        objective: &Objective,
        plan: &Plan,
        sums: &mut MetricSums,
        loss: &mut f64,
    ) -> Result<GradientsParams> {
        let mut compute = FusedStage {
            trainer: self,
            weights,
            last: stage.is_last(),
            packed: chunks.iter().map(|c| fused::pack(&c.seqs)).collect(),
            chunks,
            objective,
            plan,
            sums,
            loss,
            sink: fused::GradSink::default(),
        };
        stage.run(chunks.len(), &mut compute)?;
        Ok(compute.sink.into_params(&self.core.device))
    }

    /// The kernels this trainer's gradients run on: [`TrainKernels::Auto`] when the fused CPU
    /// path covers the model (dense Qwen2/Qwen3 on the CPU device; LoRA on the decoder layers'
    /// linear layers, not on the embedding or the LM head) and the config allows it,
    /// [`TrainKernels::Autodiff`] otherwise.
    pub fn kernels(&self) -> TrainKernels {
        match self.core.module() {
            Ok(m) => fused::kernels_for(&self.core.config, &self.core.device, m),
            Err(_) => TrainKernels::Autodiff,
        }
    }

    /// One micro-batch on the fused path: the model's forward on the fused kernels, the
    /// objective on Burn over the log-prob (and entropy) leaves, and the fused backward from
    /// their gradients.
    fn fused_gradients(
        &self,
        weights: &fused::Weights,
        chunk: &Chunk<'_>,
        objective: &Objective,
        plan: &Plan,
    ) -> Result<(GradientsParams, PolicyMetrics)> {
        let packed = fused::pack(&chunk.seqs);
        let tape = fused::forward(weights, &packed, None, fused::Outputs::LogProbs)?;
        let (d_logp, d_entropy, metrics) =
            self.objective_gradients(&tape, chunk, objective, plan)?;
        let mut sink = fused::GradSink::default();
        fused::backward(weights, &packed, tape, &d_logp, &d_entropy, &mut sink)?;
        Ok((sink.into_params(&self.core.device), metrics))
    }

    /// The objective on Burn over a fused forward's log-prob (and entropy) leaves: the gradients
    /// of the loss with respect to each trained token's log-prob and entropy, and the metrics.
    fn objective_gradients(
        &self,
        tape: &fused::Tape,
        chunk: &Chunk<'_>,
        objective: &Objective,
        plan: &Plan,
    ) -> Result<(Vec<f32>, Vec<f32>, PolicyMetrics)> {
        let leaf =
            |values: &[f32]| fused::leaf(values, &chunk.seqs, chunk.width, &self.core.ad_device);
        let logp = leaf(&tape.logprobs);
        let entropy = leaf(&tape.entropy);
        // `policy_inputs` detaches the entropy unless the bonus is on; its gradient is then None.
        let inputs = policy_inputs(logp.clone(), entropy.clone(), chunk, objective);
        let out = policy_objective(objective, inputs, &plan.denominators)
            .map_err(|e| BackendError::Train(format!("objective: {e}")))?;
        let grads = out.loss.backward();
        let d_logp = fused::leaf_grad(logp.grad(&grads), &chunk.seqs, chunk.width)?;
        let d_entropy = fused::leaf_grad(entropy.grad(&grads), &chunk.seqs, chunk.width)?;
        Ok((d_logp, d_entropy, out.metrics))
    }

    /// Clips the global gradient norm (when configured) and applies one AdamW update at the
    /// scheduled learning rate. Gradients of a batch without a trained token, or with a non-finite
    /// norm, are dropped and the step count does not advance (`skipped` in the report).
    ///
    /// # Errors
    /// [`BackendError::Train`] if the gradient norm cannot be read.
    pub fn apply_gradients(&mut self, grads: BatchGradients) -> Result<TrainStepReport> {
        self.core.apply_batch(grads)
    }

    /// Writes a checkpoint of everything a resumed run needs — weights (base, adapters), the
    /// optimiser state, the step count, the random state, the config and `weight_version` — under
    /// `dir`, atomically: a crash at any point leaves the previous checkpoint loadable. Returns
    /// the directory that holds this checkpoint's files (inside `dir`).
    ///
    /// # Errors
    /// [`BackendError::Checkpoint`] naming the file that could not be written;
    /// [`BackendError::InvalidInput`] for an expert-parallel model, whose ranks write their
    /// parts together ([`Trainer::save_part`], [`DataParallel::save_checkpoint`]).
    ///
    /// [`DataParallel::save_checkpoint`]: super::DataParallel::save_checkpoint
    pub fn save_checkpoint(&self, dir: impl AsRef<Path>, weight_version: u64) -> Result<PathBuf> {
        if self.holds_some_experts() {
            return Err(no_expert_checkpoint());
        }
        self.write_checkpoint(dir, weight_version)
    }

    /// [`Trainer::save_checkpoint`] of whatever this trainer holds.
    fn write_checkpoint(&self, dir: impl AsRef<Path>, weight_version: u64) -> Result<PathBuf> {
        let model = self.core.module()?;
        let meta = CheckpointMeta::new(
            TrainedRole::Actor,
            self.core.step,
            weight_version,
            self.core.rng,
            self.core.config.clone(),
            model.hf_config(),
        );
        checkpoint::save(dir.as_ref(), model, self.core.optimizer(), &meta)
    }

    /// Restores a trainer saved by [`Trainer::save_checkpoint`] on `device`, with the weight
    /// version that was saved. The next step equals the one the saving trainer would have taken
    /// (bit for bit on the same device and thread count).
    ///
    /// # Errors
    /// [`BackendError::Checkpoint`] if `dir` holds no complete checkpoint, or one of another role
    /// or format, or a file that does not match the model.
    pub fn load_checkpoint(dir: impl AsRef<Path>, device: &Device) -> Result<(Self, u64)> {
        Self::load_checkpoint_part(dir, device, Ok)
    }

    /// Restores a rank's part of a tensor- or pipeline-parallel trainer saved by
    /// [`Trainer::save_checkpoint`]: the whole model of the checkpoint's config is cut by `part`
    /// (`CausalLm::shard_tensors` or `CausalLm::split_stages` over this rank's group, as when it
    /// was saved) before the part's weights and optimiser state are read back.
    ///
    /// # Errors
    /// As [`Trainer::load_checkpoint`], and `part`'s.
    pub fn load_checkpoint_part(
        dir: impl AsRef<Path>,
        device: &Device,
        part: impl FnOnce(CausalLm) -> Result<CausalLm>,
    ) -> Result<(Self, u64)> {
        let loaded = checkpoint::load(dir.as_ref(), TrainedRole::Actor)?;
        let plain = device.clone().inner();
        let fresh = part(CausalLm::init(&loaded.meta.model_config, &plain)?)?;
        let lora = loaded.meta.config.lora.is_some();
        // The base weights (and, without LoRA, everything) come from the record; the adapters of
        // a LoRA checkpoint are applied after they are attached.
        let model = checkpoint::apply_record(fresh, loaded.model.clone(), lora, &loaded.file)?;
        let mut trainer = Self::build(model, loaded.meta.config.clone(), loaded.meta.rng, device)?;
        if lora {
            let adapted = trainer.core.module()?.clone();
            let adapted = checkpoint::apply_record(adapted, loaded.model, false, &loaded.file)?;
            trainer.core.set_module(adapted);
        }
        trainer.own_parts()?;
        trainer.core.load_optimizer(loaded.optimizer);
        trainer.core.step = loaded.meta.step;
        trainer.core.rng = loaded.meta.rng;
        Ok((trainer, loaded.meta.weight_version))
    }
}

/// Where part `index` of a tensor- or pipeline-parallel trainer's checkpoint in `dir` lives.
pub fn part_dir(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("part-{index}"))
}

/// Validates the objective.
pub(crate) fn checked_objective(objective: &Objective) -> Result<Objective> {
    objective
        .validate()
        .map_err(|e| BackendError::Train(format!("objective: {e}")))?;
    Ok(objective.clone())
}

/// On Burn's autodiff path, a tensor-parallel rank made its heads', units' and experts' part of
/// the gradients of the layers' norm gains and routers: sums them over its group (nothing for a
/// whole model). The fused CPU path completes them in its backward.
///
/// # Errors
/// A failed all-reduce.
fn sum_replicated_over_slices(
    model: &CausalLm,
    grads: GradientsParams,
    device: &Device,
) -> Result<GradientsParams> {
    let Some(shard) = model.tensor_shard() else {
        return Ok(grads);
    };
    let replicated = model.replicated_layer_params().into_iter().collect();
    sum_over(shard.group(), grads, model, &replicated, device)
}

/// Sums over `group` the gradients of `model`'s parameters in `ids` (those every rank of it
/// holds alike, each making its part of their gradient), the others kept as they are: the
/// data-parallel sum ([`Group::sum_gradients`]) restricted to them.
///
/// # Errors
/// A gradient that cannot be read, or a failed all-reduce.
fn sum_over(
    group: Arc<dyn Strategy>,
    grads: GradientsParams,
    model: &CausalLm,
    ids: &std::collections::HashSet<burn::module::ParamId>,
    device: &Device,
) -> Result<GradientsParams> {
    Group::new(group).sum_gradients(model, grads, Summed::Only(ids), device)
}

/// A pipeline stage on the fused CPU path: the forward keeps its tape; the last stage's backward
/// starts from the objective's gradients.
struct FusedStage<'a, 'c> {
    trainer: &'a Trainer,
    weights: &'a fused::Weights,
    last: bool,
    packed: Vec<fused::Packed>,
    chunks: &'a [Chunk<'c>],
    objective: &'a Objective,
    plan: &'a Plan,
    sums: &'a mut MetricSums,
    loss: &'a mut f64,
    sink: fused::GradSink,
}

impl StageCompute for FusedStage<'_, '_> {
    type Kept = fused::Tape;

    fn forward(
        &mut self,
        i: usize,
        input: Option<Vec<f32>>,
    ) -> Result<(fused::Tape, Option<Vec<f32>>)> {
        let outputs = if self.last {
            fused::Outputs::LogProbs
        } else {
            fused::Outputs::Stream
        };
        let mut tape = fused::forward(self.weights, &self.packed[i], input.as_deref(), outputs)?;
        let output = (!self.last).then(|| std::mem::take(&mut tape.stream_out));
        Ok((tape, output))
    }

    fn backward(
        &mut self,
        i: usize,
        tape: fused::Tape,
        output_grad: Option<Vec<f32>>,
    ) -> Result<Option<Vec<f32>>> {
        let (w, p) = (self.weights, &self.packed[i]);
        match output_grad {
            Some(d) => {
                fused::backward_stage(w, p, tape, fused::StageGrad::Stream(d), &mut self.sink)
            }
            None => {
                let (d_logp, d_entropy, m) = self.trainer.objective_gradients(
                    &tape,
                    &self.chunks[i],
                    self.objective,
                    self.plan,
                )?;
                record(self.sums, self.loss, &m, self.chunks[i].trained);
                let from = fused::StageGrad::LogProbs {
                    d_logp: &d_logp,
                    d_entropy: &d_entropy,
                };
                fused::backward_stage(w, p, tape, from, &mut self.sink)
            }
        }
    }
}

/// The objective on Burn's autodiff path for one micro-batch, from the final norm's output at
/// every position (`hidden`): the loss and the metrics.
fn burn_objective(
    model: &CausalLm,
    chunk: &Chunk<'_>,
    objective: &Objective,
    plan: &Plan,
    hidden: Tensor<3>,
) -> Result<(Tensor<1>, PolicyMetrics)> {
    let (logp, entropy) = response_logprobs(model, chunk, hidden);
    let inputs = policy_inputs(logp, entropy, chunk, objective);
    let out = policy_objective(objective, inputs, &plan.denominators)
        .map_err(|e| BackendError::Train(format!("objective: {e}")))?;
    Ok((out.loss, out.metrics))
}

/// Adds a micro-batch's loss and metrics (`trained` tokens) to the batch's.
fn record(sums: &mut MetricSums, loss: &mut f64, m: &PolicyMetrics, trained: usize) {
    *loss += f64::from(m.total_loss);
    sums.add_sums([m.pg_loss, m.kl_loss, m.entropy]);
    let means = [
        m.clip_frac_low,
        m.clip_frac_high,
        m.dual_clip_frac,
        m.approx_kl,
        m.policy_kl,
        m.ratio_mean,
    ];
    sums.add_means(0, means, trained);
    if let Some(c) = m.correction {
        let correction = [c.mean_abs_diff, c.filtered_frac, c.mean_is_weight];
        sums.add_means(means.len(), correction, trained);
        sums.add_maxima([c.max_abs_diff]);
    }
    sums.add_tokens(trained);
}

/// The log-probs and entropies of a micro-batch's response tokens on Burn's autodiff (`[rows, T]`
/// each; the entropy carries a gradient only when the objective's entropy bonus is on), from the
/// final norm's output at every position (`hidden`, `[batch, seq, hidden]`).
fn response_logprobs(
    model: &CausalLm,
    chunk: &Chunk<'_>,
    hidden: Tensor<3>,
) -> (Tensor<2>, Tensor<2>) {
    let hidden = chunk.response_hidden(hidden);
    // Straight from the logits: no [B, T, V] log-softmax is materialised, and the gradients are
    // the analytic ones (see `token_logprobs_and_entropy`).
    let (logp, entropy) =
        token_logprobs_and_entropy(model.logits(hidden), chunk.targets.clone(), true);
    let entropy = entropy.unwrap_or_else(|| logp.zeros_like());
    (logp, entropy)
}

/// The objective's inputs for one micro-batch: the response tokens' log-probs and entropies
/// (the entropy detached unless the entropy bonus is on), and the batch's per-token data — the
/// rollout's log-probs only when the objective corrects against them.
fn policy_inputs(
    logp: Tensor<2>,
    entropy: Tensor<2>,
    chunk: &Chunk<'_>,
    objective: &Objective,
) -> PolicyInputs {
    let entropy = if objective.entropy_coef != 0.0 {
        entropy
    } else {
        entropy.detach()
    };
    let mut inputs = PolicyInputs::new(
        logp,
        chunk.per_token(|s| &s.old_logprobs),
        chunk.per_token(|s| &s.advantages),
        chunk.mask.clone(),
    )
    .with_sample_weights(chunk.per_sequence(|s| s.weight))
    .with_scores(chunk.per_sequence(|s| s.score))
    .with_entropy(entropy);
    if objective.train_infer_correction.is_some() {
        inputs = inputs.with_infer_logp(chunk.per_token(|s| &s.rollout_logprobs));
    }
    if chunk.seqs.iter().all(|s| s.ref_logprobs.is_some()) {
        inputs = inputs.with_ref_logp(
            chunk.per_token(|s: &TrainSequence| s.ref_logprobs.as_deref().unwrap_or(&[])),
        );
    }
    inputs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::engine::test_support::{ids, models_under_test};
    use crate::train::LoraConfig;
    use roll_core::SampleId;

    /// Three SFT sequences, two sharing a prompt.
    fn batch(vocab: usize) -> TrainBatch {
        let prompt = ids(7, vocab, 1);
        let seqs = [(prompt.clone(), 5), (prompt, 3), (ids(4, vocab, 2), 6)]
            .into_iter()
            .enumerate()
            .map(|(i, (p, n))| {
                let response = ids(n, vocab, 10 + i as u64);
                TrainSequence::supervised(SampleId(i as u64), p, response, vec![true; n])
            })
            .collect();
        TrainBatch::new(seqs).unwrap()
    }

    fn config() -> TrainerConfig {
        TrainerConfig {
            lr: 1e-3,
            ..TrainerConfig::default()
        }
    }

    /// The `tiny-qwen2-sft` fixture, the other fixture's weights in the decoder's layout (the
    /// same shapes, other values: a wrong offer) and a batch.
    fn setup() -> (CausalLm, Arc<CpuDecoder>, TrainBatch) {
        let mut models = models_under_test();
        let (_, model, _) = models.swap_remove(1);
        let wrong = Arc::new(CpuDecoder::of_layers(&models[0].1).unwrap());
        let batch = batch(model.vocab_size());
        (model, wrong, batch)
    }

    /// The loss and diagnostics of a batch, to the bit.
    fn outcome(trainer: &Trainer, batch: &TrainBatch) -> (u64, Vec<(String, u64)>) {
        let g = trainer
            .accumulate_gradients(batch, &Objective::sft())
            .unwrap();
        let metrics = g.metrics.iter().map(|(k, v)| (k.clone(), v.to_bits()));
        (g.loss.to_bits(), metrics.collect())
    }

    /// The fused forward reads the engine's copy of the weights only while the trainer's
    /// parameters are those it was packed from: a decoder of other weights offered at the
    /// current generation changes the loss (so it is read), the same offer at a past generation
    /// is ignored, and the engine's real copy gives the bits the trainer's own packing gives.
    #[test]
    fn an_offered_decoder_is_read_only_while_its_parameters_are_current() {
        let (model, wrong, batch) = setup();
        let mut trainer = Trainer::new(model, config(), &Device::flex()).unwrap();
        let own = outcome(&trainer, &batch);

        trainer.offer_packed(trainer.generation(), wrong.clone());
        assert_ne!(
            outcome(&trainer, &batch),
            own,
            "the offered decoder was not read"
        );
        // Handed over once: the next forward packs its own again.
        assert_eq!(outcome(&trainer, &batch), own);

        let before = trainer.generation();
        trainer.step(&batch, &Objective::sft()).unwrap();
        assert_ne!(trainer.generation(), before);
        let own = outcome(&trainer, &batch);
        trainer.offer_packed(before, wrong);
        assert_eq!(outcome(&trainer, &batch), own, "a stale decoder was read");

        let served = CpuDecoder::from_model(&trainer.whole_model().unwrap()).unwrap();
        trainer.offer_packed(trainer.generation(), Arc::new(served));
        assert_eq!(outcome(&trainer, &batch), own);
    }

    /// Under LoRA the engine's weights are the merged ones, not the module's: never offered.
    #[test]
    fn a_lora_trainer_packs_its_own_weights() {
        let (model, wrong, batch) = setup();
        let config = TrainerConfig {
            lora: Some(LoraConfig {
                rank: 4,
                alpha: 8.0,
                target_modules: vec!["q_proj".into(), "down_proj".into()],
            }),
            ..config()
        };
        let trainer = Trainer::new(model, config, &Device::flex()).unwrap();
        let own = outcome(&trainer, &batch);
        trainer.offer_packed(trainer.generation(), wrong);
        assert_eq!(outcome(&trainer, &batch), own);
    }
}
