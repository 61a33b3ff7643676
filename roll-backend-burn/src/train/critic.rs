//! [`CriticTrainer`]: the PPO value function, a decoder trunk with a [`ValueHead`], trained on
//! roll-algos' critic loss.

use super::checkpoint::{self, CheckpointMeta, TrainedRole};
use super::config::TrainKernels;
use super::config::TrainerConfig;
use super::core::{
    BatchGradients, Chunk, Core, MetricSchema, MetricSums, TrainStepReport, materialize_params,
};
use super::fused;
use super::lora::{LoraAttach, TrainerRng};
use crate::models::{CausalLm, TokenBatch, ValueHead};
use crate::{BackendError, Result, ScoringOptions, score};
use burn::module::{Module, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Tensor, TensorData};
use roll_algos::loss::{CriticLossOutput, LossAggregation, critic_loss};
use roll_core::TrainBatch;
use roll_core::policy::{Objective, ScoreRequest, TokenScores};
use roll_core::strategy::Strategy;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A critic: the decoder trunk (its LM head unused) and a scalar value head.
#[derive(Module, Debug)]
pub struct CriticModel {
    /// The decoder; [`CausalLm::forward_hidden`] feeds the head.
    pub trunk: CausalLm,
    /// hidden → value.
    pub head: ValueHead,
}

impl CriticModel {
    /// Values at every position.
    ///
    /// # Shapes
    /// - `batch.input_ids`: `[batch, seq]`
    /// - output: `[batch, seq]`
    pub fn values(&self, batch: &TokenBatch) -> Tensor<2> {
        self.head.forward(self.trunk.forward_hidden(batch))
    }
}

/// The critic's metrics, by how they combine (see [`MetricSums`]).
static VALUE_METRICS: MetricSchema = MetricSchema {
    sums: &["vf_loss"],
    means: &["vf_clip_frac", "value_mean"],
    maxima: &[],
};

/// Trains a [`CriticModel`] on the value loss of [`roll_algos::loss::critic_loss`]
/// (`½·(v − R)²`, or its clipped form with `objective.value_loss.clip`), reduced like ROLL's
/// critic with seq-mean-token-mean over the whole batch, with the same micro-batching, clipping,
/// AdamW, schedule, LoRA and checkpoints as [`super::Trainer`].
///
/// The value of response token `t` is the head's output at the position that predicts it
/// (`prompt_len − 1 + t`), as [`score`] reports values; batches need `returns`, and `old_values`
/// when value clipping is on.
pub struct CriticTrainer {
    core: Core<CriticModel>,
}

impl std::fmt::Debug for CriticTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriticTrainer")
            .field("step", &self.core.step)
            .field("lora", &self.core.config.lora)
            .finish_non_exhaustive()
    }
}

/// A value head with weights `U(−0.02·√3, 0.02·√3)` (standard deviation 0.02, as HF initialises
/// `*ForTokenClassification` heads) from the trainer's RNG and bias 0.
fn init_head(hidden: usize, rng: &mut TrainerRng, device: &Device) -> ValueHead {
    let mut head = ValueHead::init(hidden, device);
    let bound = 0.02 * 3f32.sqrt();
    let w = rng.uniform_vec(hidden, -bound, bound);
    head.score.weight =
        Param::from_tensor(Tensor::from_data(TensorData::new(w, [hidden, 1]), device));
    head.score.bias = Some(Param::from_tensor(Tensor::zeros([1], device)));
    head
}

impl CriticTrainer {
    /// A critic trainer for `trunk` with `head` (a fresh head from the config's seed when
    /// `None`), moved to `device`'s autodiff twin. With LoRA, adapters go on the trunk and the head
    /// trains in full.
    ///
    /// # Errors
    /// As [`super::Trainer::new`].
    pub fn new(
        trunk: CausalLm,
        head: Option<ValueHead>,
        config: TrainerConfig,
        device: &Device,
    ) -> Result<Self> {
        trunk.require_whole("train")?;
        let rng = TrainerRng::new(config.seed);
        Self::build(trunk, head, config, rng, device)
    }

    fn build(
        trunk: CausalLm,
        head: Option<ValueHead>,
        config: TrainerConfig,
        mut rng: TrainerRng,
        device: &Device,
    ) -> Result<Self> {
        config.validate()?;
        let plain = device.clone().inner();
        let ad = plain.clone().autodiff();
        let head = match head {
            Some(h) => h,
            None => init_head(trunk.hidden_size(), &mut rng, &plain),
        };
        materialize_params(&trunk);
        materialize_params(&head);
        let trunk = trunk.to_device(&ad).train();
        let trunk = match &config.lora {
            None => trunk,
            Some(lora) => {
                let mut attach = LoraAttach::new(lora, &mut rng);
                let adapted = trunk.apply_reparameterization(&mut attach);
                attach.check_all_matched()?;
                adapted
            }
        };
        let model = CriticModel {
            trunk,
            head: head.to_device(&ad).train(),
        };
        Ok(Self {
            core: Core::new(model, config, rng, device),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.core.config
    }

    /// Optimiser updates applied so far.
    pub fn step_count(&self) -> u64 {
        self.core.step
    }

    /// The critic being trained, on the autodiff device.
    ///
    /// # Errors
    /// [`BackendError::Train`] if an earlier step panicked half-way.
    pub fn training_model(&self) -> Result<&CriticModel> {
        self.core.module()
    }

    /// Trunk (adapters merged) and head on the plain device, for scoring values with [`score`].
    ///
    /// # Errors
    /// As [`CriticTrainer::training_model`].
    pub fn inference_model(&self) -> Result<(CausalLm, ValueHead)> {
        let m = self.core.module()?.valid().materialize();
        Ok((m.trunk, m.head))
    }

    /// Values (and log-probs of the unused LM head) of `request` under the current critic.
    ///
    /// # Errors
    /// As [`score`].
    pub fn value_scores(
        &self,
        request: &ScoreRequest,
        options: &ScoringOptions,
    ) -> Result<Vec<TokenScores>> {
        let (trunk, head) = self.inference_model()?;
        score(&trunk, Some(&head), request, options, &self.core.device)
    }

    /// One optimisation step on the value loss.
    ///
    /// # Errors
    /// As [`CriticTrainer::accumulate_gradients`].
    pub fn step(&mut self, batch: &TrainBatch, objective: &Objective) -> Result<TrainStepReport> {
        let grads = self.accumulate_gradients(batch, objective)?;
        self.core.apply_batch(grads)
    }

    /// Makes this critic one replica of a data-parallel group, as
    /// [`Trainer::with_strategy`](super::Trainer::with_strategy).
    #[must_use]
    pub fn with_strategy(mut self, strategy: Arc<dyn Strategy>) -> Self {
        self.core.join(strategy);
        self
    }

    /// Clips and applies gradients of [`CriticTrainer::accumulate_gradients`].
    ///
    /// # Errors
    /// [`BackendError::Train`] if the gradient norm cannot be read.
    pub fn apply_gradients(&mut self, grads: BatchGradients) -> Result<TrainStepReport> {
        self.core.apply_batch(grads)
    }

    /// Forward and backward of the value loss over every micro-batch, gradients summed.
    ///
    /// # Errors
    /// [`BackendError::Train`] for an invalid objective, a batch without `returns`, or without
    /// `old_values` while `objective.value_loss.clip` is set; [`BackendError::InvalidInput`] for
    /// a bad sequence.
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
        objective
            .value_loss
            .validate()
            .map_err(|e| BackendError::Train(format!("objective: {e}")))?;
        let first = batch.sequences().first();
        if first.is_some_and(|s| s.returns.is_none()) {
            return Err(BackendError::Train(
                "critic training needs `returns` on every sequence".into(),
            ));
        }
        let clip = objective.value_loss.clip;
        if clip.is_some() && first.is_some_and(|s| s.old_values.is_none()) {
            return Err(BackendError::Train(
                "objective.value_loss.clip needs `old_values` on every sequence".into(),
            ));
        }
        let model = self.core.module()?;
        let kernels = self.kernels();
        let plan = self.core.plan(batch, kernels.layout())?;
        let fused = match kernels {
            TrainKernels::Auto => Some(fused::extract(&model.trunk, None)?),
            TrainKernels::Autodiff => None,
        };
        let mut acc = GradientsAccumulator::<CriticModel>::new();
        let mut sums = MetricSums::new(&VALUE_METRICS);
        let mut loss = 0.0;
        let seqs = batch.sequences();
        for indices in &plan.chunks {
            let chunk = Chunk::new(
                indices.iter().map(|&i| &seqs[i]).collect(),
                model.trunk.vocab_size(),
                &self.core.ad_device,
            )?;
            let loss_of = |values: Tensor<2>| {
                let returns = chunk.per_token(|s| s.returns.as_deref().unwrap_or(&[]));
                let old = chunk.per_token(|s| s.old_values.as_deref().unwrap_or(&[]));
                critic_loss(
                    values,
                    old,
                    returns,
                    chunk.mask.clone(),
                    &objective.value_loss,
                    LossAggregation::SeqMeanTokenMean {},
                    &plan.denominators,
                )
                .map_err(|e| BackendError::Train(format!("critic loss: {e}")))
            };
            let out = match &fused {
                Some(weights) => {
                    let (grads, out) = self.fused_gradients(model, weights, &chunk, loss_of)?;
                    acc.accumulate(model, grads);
                    out
                }
                None => {
                    let hidden = chunk.response_hidden(model.trunk.forward_hidden(&chunk.tokens));
                    let out = loss_of(model.head.forward(hidden))?;
                    let grads = GradientsParams::from_grads(out.loss.backward(), model);
                    acc.accumulate(model, grads);
                    out
                }
            };
            loss += f64::from(out.metrics.vf_loss);
            sums.add_sums([out.metrics.vf_loss]);
            let means = [out.metrics.clip_frac, out.metrics.value_mean];
            sums.add_means(0, means, chunk.trained);
            sums.add_tokens(chunk.trained);
        }
        self.core.batch_gradients(acc.grads(), loss, sums, &plan)
    }

    /// The kernels this critic's gradients run on, decided as for the actor
    /// ([`super::Trainer::kernels`]): the fused CPU path under the same conditions, Burn's
    /// autodiff otherwise.
    pub fn kernels(&self) -> TrainKernels {
        match self.core.module() {
            Ok(m) => fused::kernels_for(&self.core.config, &self.core.device, &m.trunk),
            Err(_) => TrainKernels::Autodiff,
        }
    }

    /// One micro-batch on the fused path: the trunk's forward on the fused kernels (the hidden
    /// states at the positions that predict response tokens), the value head and the loss on
    /// Burn over the values as leaves, then the head's gradient by hand and the trunk's by the
    /// fused backward.
    fn fused_gradients(
        &self,
        model: &CriticModel,
        weights: &fused::Weights,
        chunk: &Chunk<'_>,
        loss_of: impl Fn(Tensor<2>) -> Result<CriticLossOutput>,
    ) -> Result<(GradientsParams, CriticLossOutput)> {
        let device = &self.core.device;
        let h = weights.hidden;
        let packed = fused::pack(&chunk.seqs);
        let tape = fused::forward(weights, &packed, None, fused::Outputs::Hidden)?;
        let w = fused::vector(&model.head.score.weight, "score.weight")?;
        let bias = model
            .head
            .score
            .bias
            .as_ref()
            .map(|b| fused::vector(b, "score.bias"))
            .transpose()?;
        let b = bias.as_ref().map_or(0.0, |b| b.values[0]);
        // v = h·w + b at each scored row.
        let values: Vec<f32> = tape
            .hidden_rows
            .chunks_exact(h)
            .map(|row| row.iter().zip(&w.values).map(|(x, w)| x * w).sum::<f32>() + b)
            .collect();
        let leaf = fused::leaf(&values, &chunk.seqs, chunk.width, &self.core.ad_device);
        let out = loss_of(leaf.clone())?;
        let grads = out.loss.backward();
        let dv = fused::leaf_grad(leaf.grad(&grads), &chunk.seqs, chunk.width)?;
        // ∂/∂w = Σ_rows dv·h, ∂/∂b = Σ dv, ∂/∂h = dv·wᵀ.
        let mut dw = vec![0.0f32; h];
        let mut dh_rows = Vec::with_capacity(dv.len() * h);
        for (row, &d) in tape.hidden_rows.chunks_exact(h).zip(&dv) {
            for ((g, x), w) in dw.iter_mut().zip(row).zip(&w.values) {
                *g += d * x;
                dh_rows.push(d * w);
            }
        }
        let mut sink = fused::GradSink::default();
        sink.add_matrix(w.id, [h, 1], dw);
        if let Some(bias) = &bias {
            sink.add_vector(bias, vec![dv.iter().sum()]);
        }
        fused::backward_from_hidden(weights, &packed, tape, &dh_rows, &mut sink)?;
        Ok((sink.into_params(device), out))
    }

    /// Writes an atomic checkpoint (see [`super::Trainer::save_checkpoint`]).
    ///
    /// # Errors
    /// [`BackendError::Checkpoint`] naming the file that could not be written.
    pub fn save_checkpoint(&self, dir: impl AsRef<Path>, weight_version: u64) -> Result<PathBuf> {
        let model = self.core.module()?;
        let meta = CheckpointMeta::new(
            TrainedRole::Critic,
            self.core.step,
            weight_version,
            self.core.rng,
            self.core.config.clone(),
            model.trunk.hf_config(),
        );
        checkpoint::save(dir.as_ref(), model, self.core.optimizer(), &meta)
    }

    /// Restores a critic saved by [`CriticTrainer::save_checkpoint`], with its weight version.
    ///
    /// # Errors
    /// [`BackendError::Checkpoint`] if `dir` holds no complete critic checkpoint or a file does
    /// not match the model.
    pub fn load_checkpoint(dir: impl AsRef<Path>, device: &Device) -> Result<(Self, u64)> {
        let loaded = checkpoint::load(dir.as_ref(), TrainedRole::Critic)?;
        let plain = device.clone().inner();
        let trunk = CausalLm::init(&loaded.meta.model_config, &plain)?;
        let head = ValueHead::init(trunk.hidden_size(), &plain);
        let mut trainer = Self::build(
            trunk,
            Some(head),
            loaded.meta.config.clone(),
            loaded.meta.rng,
            device,
        )?;
        let model = trainer.core.module()?.clone();
        let model = checkpoint::apply_record(model, loaded.model, false, &loaded.file)?;
        trainer.core.set_module(model);
        trainer.core.load_optimizer(loaded.optimizer);
        trainer.core.step = loaded.meta.step;
        trainer.core.rng = loaded.meta.rng;
        Ok((trainer, loaded.meta.weight_version))
    }
}
