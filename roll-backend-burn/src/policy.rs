//! roll-core's model roles on a Burn model. Each role is its own type and implements exactly the
//! capabilities it has, so a role mistake is a compile error:
//!
//! | type | role | [`Generate`] | [`Score`] | [`Train`] |
//! |---|---|---|---|---|
//! | [`BurnPolicy`] | actor | ✓ | ✓ | ✓ |
//! | [`BurnCritic`] | critic (value head) | | ✓ | ✓ |
//! | [`BurnReference`] | reference | | ✓ | |
//! | [`BurnFrozen`] | judge, evaluation | ✓ | ✓ | |
//!
//! ```compile_fail
//! # use roll_core::policy::{Objective, Train};
//! // A reference has no `train_step`: asking it to train does not compile.
//! async fn train(reference: roll_backend_burn::BurnReference, batch: roll_core::TrainBatch) {
//!     let _ = reference.train_step(batch, &Objective::default()).await;
//! }
//! ```
//! ```compile_fail
//! # use roll_core::policy::{Generate, GenerationRequest};
//! // A critic has no `generate`.
//! async fn generate(critic: roll_backend_burn::BurnCritic, request: GenerationRequest) {
//!     let _ = critic.generate(request).await;
//! }
//! ```
//!
//! Generation runs on the inference engine's thread, scoring and training on tokio's blocking
//! pool: the async methods never block the runtime. Text generation needs a tokenizer (to decode
//! the text reward workers read, to find stop strings, and for its EOS), so the generating roles
//! take one as a required argument.
//!
//! # One step of the actor
//! [`Train::train_step`] runs `TrainerConfig::epochs` optimiser updates on the batch, then takes
//! the new weights out of the trainer **once**, converts them for serving **once**
//! ([`ServedWeights`]: the CPU decoder's layout is shared by the engine and inference-path
//! scoring), syncs the engine once (weight version + 1), and measures the **train–inference
//! log-prob gap** once: the engine generates a short greedy probe from the batch's first prompt
//! and the training kernels rescore it; the largest absolute difference of the per-token
//! log-probs is reported as `train_infer_logprob_gap` (ROLL users' most reported numerical
//! problem is this gap growing unnoticed). On the CPU with the fused trainer it is **0**: the
//! training forward is the CPU decoder's forward (see `train::fused`); on Burn's autodiff path it
//! is float round-off (~1e-6) and should stay ≤ 1e-4.
//!
//! # Scoring
//! One entry point, [`Score::score`]; the request names its kernels ([`ScoreKernels`]):
//! `Inference` runs the engine's kernels (the CPU decoder where it serves the model — the
//! numbers the rollout was sampled with), `Training` runs the trainer's forward: the same CPU
//! decoder when the actor trains on the fused path, Burn's forward ([`score`]) otherwise. A
//! critic always scores through its value head on the Burn forward.

use crate::engine::{DecoderKind, Engine, EngineConfig, ServedWeights};
use crate::hf::{HfSource, SaveOptions, export_hf_dir};
use crate::train::{CriticTrainer, DataParallel, Replica, TrainKernels, Trainer, TrainerConfig};
use crate::{
    BackendError, CausalLm, ExpertSplit, Result, ScoringOptions, ValueHead, device as device_for,
    score,
};
use async_trait::async_trait;
use burn::module::Module;
use burn::tensor::Device;
use roll_core::policy::{
    Generate, Generation, GenerationRequest, Objective, SamplingParams, Score, ScoreKernels,
    ScoreRequest, ScoreSequence, TokenScores, Train, TrainOutput,
};
use roll_core::strategy::{DeviceSpec, Messenger, Strategy};
use roll_core::{Tokenizer, TrainBatch, WeightVersion};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// Where a trainable role's trainer replicas run. Inference — the engine and scoring — runs on
/// the first replica's device.
#[derive(Clone)]
pub enum Placement {
    /// Replicas in this process, one per device, in rank order: one device trains alone, several
    /// train data-parallel ([`DataParallel`]: each step split across them by tokens, gradients
    /// summed, the replicas kept identical).
    Devices(Vec<DeviceSpec>),
    /// Rank 0 of a data-parallel group that spans processes (e.g. `roll_mpi`'s strategy): one
    /// replica here, on `device`; every other rank runs [`follow`](crate::train::follow) with a
    /// trainer built from the same weights and config ([`DataParallel::leader`]). A group serves
    /// one role: a second trainable role (a critic) needs a group of its own.
    Leader {
        /// This process's device.
        device: DeviceSpec,
        /// Rank 0 of the group: every training rank.
        group: Arc<dyn Strategy>,
        /// When the ranks of each copy of the model hold parts of it (tensor or pipeline
        /// parallel): how, and the data-parallel group of this rank's copy. `None`: every rank
        /// holds the whole model and `group` is the data-parallel group.
        parts: Option<ModelParts>,
    },
}

/// How the ranks of one copy of the actor hold it, in a job whose trainers are tensor-,
/// pipeline- or expert-parallel, and the groups a rank trains in.
#[derive(Clone)]
pub struct ModelParts {
    /// Slices of every layer ([`CausalLm::shard_tensors`]), stages
    /// ([`CausalLm::split_stages`]) or blocks of experts ([`CausalLm::shard_experts`]), or
    /// stages with their experts divided among pipelines.
    pub kind: PartKind,
    /// The ranks of this copy, this one among them.
    pub group: Arc<dyn Messenger>,
    /// The data-parallel group this rank's trainer joins: the ranks holding the same part in
    /// the other copies — but where the copy's ranks hold different tokens (its experts divided
    /// among them: [`PartKind::Experts`], [`PartKind::PipelineExperts`]), the ranks holding the
    /// same layers with every pipeline's tokens: every training rank, or this stage in every
    /// pipeline.
    pub data: Arc<dyn Strategy>,
    /// Where the copy's ranks divide its experts among different tokens: the ranks holding the
    /// same part in every copy (this one among them), over which the experts' gradients are
    /// summed ([`CausalLm::with_expert_replicas`]); `None` for the other kinds.
    pub expert_replicas: Option<Arc<dyn Strategy>>,
    /// Whether this copy's ranks generate together ([`PartKind::Experts`] in the first copy of
    /// a colocated run, config `rollout.expert_parallel`): each rank runs an inference engine on
    /// its own block of experts, the engines stepping together over a
    /// [channel](Messenger::channel) of `group` made for them ([`ModelParts::engine_channel`]) —
    /// rank 0's takes the requests, the others serve their experts' share of every token — and
    /// after each step every engine syncs from its own trainer, so no weights travel. `false`:
    /// rank 0's engine serves the whole model, gathered after each step.
    pub generates: bool,
}

/// How a copy of the model is divided among its ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// Tensor parallelism: each rank a slice of every layer's heads and MLP, a mixture's
    /// experts divided as `experts` says.
    Tensor {
        /// How a mixture of experts' experts are divided (config `model.expert_parallel`).
        experts: ExpertSplit,
    },
    /// Pipeline parallelism: each rank a stage, a block of the layers.
    Pipeline,
    /// Both: the copy's ranks form stages of `tensor` tensor-parallel ranks each, rank
    /// `s·tensor + t` holding slice `t` of stage `s`'s layers (Megatron's order), a mixture's
    /// experts divided among a stage's ranks as `experts` says. [`ModelParts::part_of`] forms
    /// the stages' groups and the links between them
    /// ([`tensor_pipeline_groups`](crate::tensor_pipeline_groups)), a collective of the copy's
    /// ranks.
    TensorPipeline {
        /// Tensor-parallel ranks per stage (config `model.tensor_parallel`).
        tensor: usize,
        /// How a mixture of experts' experts are divided (config `model.expert_parallel`).
        experts: ExpertSplit,
    },
    /// Expert parallelism across the data-parallel ranks: each rank a block of every mixture's
    /// experts and the rest whole, and its own tokens ([`CausalLm::shard_experts`]); the
    /// copies side by side make one data-parallel group.
    Experts,
    /// Pipelines side by side, each on its own tokens, whose stages divide their experts: the
    /// copy's ranks form stages of `experts` ranks, rank `s·experts + p` holding stage `s` of
    /// pipeline `p` and block `p` of that stage's experts ([`CausalLm::split_stages`], then
    /// [`CausalLm::shard_experts`] over the stage's ranks). The groups are formed as
    /// [`PartKind::TensorPipeline`]'s are.
    PipelineExperts {
        /// Pipelines per copy, among which each stage's experts are divided (config
        /// `model.expert_parallel`).
        experts: usize,
    },
}

impl ModelParts {
    /// Where this copy generates together ([`ModelParts::generates`]), a new channel of its
    /// ranks for one set of their engines: a collective of the copy's ranks, which each makes
    /// before it starts its engine (rank 0 as its policy starts, the others before they follow
    /// it). `None` elsewhere.
    ///
    /// # Errors
    /// As [`Messenger::channel`].
    pub fn engine_channel(&self) -> Result<Option<Arc<dyn Strategy>>> {
        if !self.generates {
            return Ok(None);
        }
        let channel: Arc<dyn Strategy> = self
            .group
            .channel()
            .map_err(|e| BackendError::Collective(Box::new(e)))?;
        Ok(Some(channel))
    }

    /// This rank's part of a trainer checkpoint written by the ranks of a copy
    /// ([`DataParallel::save_checkpoint`]): the trainer and the weight version.
    ///
    /// # Errors
    /// As [`Trainer::load_checkpoint_part`].
    pub fn load_checkpoint(&self, dir: &Path, device: &Device) -> Result<(Trainer, u64)> {
        let part = crate::train::part_dir(dir, self.group.rank());
        Trainer::load_checkpoint_part(part, device, |model| self.part_of(model))
    }

    /// This rank's part of `model`. Every rank of the copy calls it together (for
    /// [`PartKind::TensorPipeline`] and [`PartKind::PipelineExperts`] it forms the copy's
    /// groups).
    ///
    /// # Errors
    /// As [`CausalLm::shard_tensors`], [`CausalLm::split_stages`],
    /// [`CausalLm::shard_experts`] and [`tensor_pipeline_groups`](crate::tensor_pipeline_groups);
    /// an expert kind without [`ModelParts::expert_replicas`].
    pub fn part_of(&self, model: CausalLm) -> Result<CausalLm> {
        let replicas = || {
            self.expert_replicas.clone().ok_or_else(|| {
                BackendError::InvalidInput(format!(
                    "{:?} divides the experts among different tokens: it needs the ranks \
                     holding the same experts in every copy (ModelParts::expert_replicas)",
                    self.kind
                ))
            })
        };
        match self.kind {
            PartKind::Tensor { experts } => model.shard_tensors(self.group.clone(), experts),
            PartKind::Pipeline => model.split_stages(self.group.clone()),
            PartKind::TensorPipeline { tensor, experts } => {
                let (slices, link) = crate::tensor_pipeline_groups(&self.group, tensor)?;
                model.split_stages(link)?.shard_tensors(slices, experts)
            }
            PartKind::Experts => model
                .shard_experts(self.group.clone())?
                .with_expert_replicas(replicas()?),
            PartKind::PipelineExperts { experts } => {
                let (stage, link) = crate::tensor_pipeline_groups(&self.group, experts)?;
                model
                    .split_stages(link)?
                    .shard_experts(stage)?
                    .with_expert_replicas(replicas()?)
            }
        }
    }
}

impl Default for Placement {
    fn default() -> Self {
        Self::Devices(vec![DeviceSpec::Cpu])
    }
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Devices(devices) => f.debug_tuple("Devices").field(devices).finish(),
            Self::Leader {
                device,
                group,
                parts,
            } => f
                .debug_struct("Leader")
                .field("device", device)
                .field("group", &group.name())
                .field("parts", &parts.as_ref().map(|p| p.kind))
                .finish(),
        }
    }
}

impl Placement {
    /// The device inference runs on: the first replica's.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for an empty device list.
    fn inference_device(&self) -> Result<DeviceSpec> {
        match self {
            Self::Devices(devices) => devices.first().copied().ok_or_else(|| {
                BackendError::InvalidInput("a role needs at least one device (none given)".into())
            }),
            Self::Leader { device, .. } => Ok(*device),
        }
    }

    /// The trainer replicas this process runs, each built by `replica` on its device.
    fn trainers<T: Replica>(
        &self,
        mut replica: impl FnMut(Device) -> Result<T>,
    ) -> Result<DataParallel<T>> {
        match self {
            Self::Devices(devices) => DataParallel::new(devices, replica),
            Self::Leader {
                device,
                group,
                parts,
            } => {
                let data = match parts {
                    Some(parts) => parts.data.clone(),
                    None => group.clone(),
                };
                DataParallel::leader_of(replica(device_for(*device)?)?, group.clone(), data)
            }
        }
    }

    /// This process's part of `model`: the whole model unless its copies are divided among
    /// ranks ([`ModelParts`]).
    fn part_of(&self, model: CausalLm) -> Result<CausalLm> {
        match self {
            Self::Leader {
                parts: Some(parts), ..
            } => parts.part_of(model),
            _ => Ok(model),
        }
    }
}

/// How a Burn role is placed and served.
#[derive(Debug, Clone)]
pub struct PolicyOptions {
    /// Where the role's trainer replicas run. Default: this process, on the CPU.
    pub placement: Placement,
    /// Inference engine settings (generating roles).
    pub engine: EngineConfig,
    /// Force a decoder; `None` picks the fastest that covers the model ([`DecoderKind::auto`]).
    pub decoder: Option<DecoderKind>,
    /// Micro-batching of training-path scoring.
    pub scoring: ScoringOptions,
    /// Tokens of the greedy probe that measures the train–inference gap after each step
    /// (0 = do not measure).
    pub gap_probe_tokens: u32,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            placement: Placement::default(),
            engine: EngineConfig::default(),
            decoder: None,
            scoring: ScoringOptions::default(),
            gap_probe_tokens: 8,
        }
    }
}

fn poisoned() -> BackendError {
    BackendError::Engine("a previous call panicked while holding the policy's state".into())
}

/// The weights scoring reads: the latest synced model in its served layouts and, for a critic,
/// its value head, with their weight version. Replaced as a whole after each step, so a score
/// never mixes two versions.
struct Snapshot {
    served: ServedWeights,
    head: Option<ValueHead>,
    version: WeightVersion,
}

impl Snapshot {
    /// Scores `request` with the kernels it names; a non-finite log-prob (weights gone bad, a
    /// config the checks missed) is an error naming the sequence and position, never a number
    /// that flows into a loss.
    fn score(&self, request: &ScoreRequest, scoring: &Scoring) -> Result<Vec<TokenScores>> {
        let scores = self.score_unchecked(request, scoring)?;
        for (sequence, s) in scores.iter().enumerate() {
            if let Some((position, &value)) =
                s.logprobs.iter().enumerate().find(|(_, v)| !v.is_finite())
            {
                return Err(BackendError::NonFiniteLogprob {
                    sequence,
                    position,
                    value,
                });
            }
        }
        Ok(scores)
    }

    fn score_unchecked(
        &self,
        request: &ScoreRequest,
        scoring: &Scoring,
    ) -> Result<Vec<TokenScores>> {
        let decoder_kernels = match request.kernels {
            ScoreKernels::Inference => true,
            ScoreKernels::Training => scoring.training_on_decoder,
        };
        match (decoder_kernels, self.served.cpu(), &self.head) {
            (true, Some(cpu), None) => {
                // The training path's `score` checks lengths itself.
                self.served.model().check_lengths(
                    request
                        .sequences
                        .iter()
                        .map(|s| s.prompt_ids.len() + s.response_ids.len()),
                )?;
                cpu.score(request)
            }
            // Without a CPU-decoder layout the engine runs Burn's forward: the same ops as the
            // training path, so both kernel choices are the training forward here.
            _ => score(
                self.served.model(),
                self.head.as_ref(),
                request,
                &scoring.options,
                &scoring.device,
            ),
        }
    }
}

/// What every role shares: the device, the scoring snapshot and its options.
struct Scoring {
    device: Device,
    snapshot: RwLock<Arc<Snapshot>>,
    options: ScoringOptions,
    /// Whether the role trains on the fused path, whose forward is the CPU decoder's: then
    /// [`ScoreKernels::Training`] runs the decoder too — the same function, so the same bits.
    training_on_decoder: bool,
}

impl Scoring {
    /// Scoring of `model` (and `head`) as weight version `version`.
    fn new(
        model: CausalLm,
        head: Option<ValueHead>,
        kind: DecoderKind,
        device: Device,
        options: ScoringOptions,
        version: WeightVersion,
    ) -> Result<Self> {
        let served = ServedWeights::new(model, kind)?;
        Ok(Self {
            device,
            snapshot: RwLock::new(Arc::new(Snapshot {
                served,
                head,
                version,
            })),
            options,
            training_on_decoder: false,
        })
    }

    fn current(&self) -> Result<Arc<Snapshot>> {
        Ok(self.snapshot.read().map_err(|_| poisoned())?.clone())
    }

    fn replace(&self, snapshot: Snapshot) -> Result<Arc<Snapshot>> {
        let snapshot = Arc::new(snapshot);
        *self.snapshot.write().map_err(|_| poisoned())? = snapshot.clone();
        Ok(snapshot)
    }

    async fn score(
        self: &Arc<Self>,
        request: &ScoreRequest,
    ) -> roll_core::Result<Vec<TokenScores>> {
        let snapshot = self.current()?;
        let this = self.clone();
        let request = request.clone();
        blocking(move || snapshot.score(&request, &this)).await
    }
}

/// Places `model` on the options' inference device and picks the engine's decoder.
fn placed(model: CausalLm, options: &PolicyOptions) -> Result<(CausalLm, Device, DecoderKind)> {
    let device = device_for(options.placement.inference_device()?)?;
    let model = model.to_device(&device);
    let kind = options
        .decoder
        .unwrap_or_else(|| DecoderKind::auto(&model, &device));
    Ok((model, device, kind))
}

/// The actor: generates with the inference engine, scores, and trains (see the
/// [module docs](self)).
#[derive(Clone)]
pub struct BurnPolicy {
    inner: Arc<ActorInner>,
}

struct ActorInner {
    /// Declared (so dropped) before the engine: dropping it releases the followers, and with
    /// `engines` the engine stops only once theirs, which they close when released, stop too.
    trainer: Mutex<DataParallel<Trainer>>,
    engine: Engine,
    kind: DecoderKind,
    scoring: Arc<Scoring>,
    gap_probe_tokens: u32,
    /// Where the engine serves this rank's block of experts, stepping with the copy's other
    /// ranks' ([`ModelParts::generates`]): the channel they step over; the engine syncs from
    /// the trainer's own part after each step. Scoring reads the whole model, gathered when
    /// something scores (its snapshot falls a version behind the engine until then).
    engines: Option<Arc<dyn Strategy>>,
}

impl std::fmt::Debug for BurnPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnPolicy")
            .field("device", &self.inner.scoring.device)
            .field("weight_version", &self.inner.engine.weight_version())
            .finish_non_exhaustive()
    }
}

impl BurnPolicy {
    /// A trainable actor on `model`, generating text with `tokenizer` (its EOS ends every
    /// generation, besides `options.engine.eos_token_ids`).
    ///
    /// # Errors
    /// A bad trainer config, a device that is not built in, or an engine that cannot start.
    pub fn new(
        model: CausalLm,
        tokenizer: Arc<dyn Tokenizer>,
        trainer: TrainerConfig,
        options: PolicyOptions,
    ) -> Result<Self> {
        let model = options.placement.part_of(model)?;
        let trainer = options
            .placement
            .trainers(|device| Trainer::new(model.clone(), trainer.clone(), &device))?;
        Self::build(trainer, tokenizer, options)
    }

    /// An actor resumed from [`BurnPolicy::save_checkpoint`]: weights, optimiser, RNG, step count
    /// and weight version continue where they stopped.
    ///
    /// # Errors
    /// A missing or corrupt checkpoint, or as [`BurnPolicy::new`].
    pub fn resume(
        dir: impl AsRef<Path>,
        tokenizer: Arc<dyn Tokenizer>,
        mut options: PolicyOptions,
    ) -> Result<Self> {
        let mut version = 0;
        let trainer = options.placement.trainers(|device| {
            let (trainer, v) = match &options.placement {
                Placement::Leader {
                    parts: Some(parts), ..
                } => parts.load_checkpoint(dir.as_ref(), &device)?,
                _ => Trainer::load_checkpoint(dir.as_ref(), &device)?,
            };
            version = v;
            Ok(trainer)
        })?;
        options.engine.start_version = version;
        Self::build(trainer, tokenizer, options)
    }

    fn build(
        trainer: DataParallel<Trainer>,
        tokenizer: Arc<dyn Tokenizer>,
        options: PolicyOptions,
    ) -> Result<Self> {
        // The engines' channel first: the followers make it before they follow.
        let engines = match &options.placement {
            Placement::Leader {
                parts: Some(parts), ..
            } => parts.engine_channel()?,
            _ => None,
        };
        let (model, device, kind) = placed(trainer.whole_model()?, &options)?;
        let part = match &engines {
            Some(channel) => Some(trainer.first().served_part(channel)?),
            None => None,
        };
        let engine = Engine::with_decoder(
            kind,
            part.as_ref().unwrap_or(&model),
            &device,
            options.engine.clone(),
            Some(tokenizer),
        )?;
        let version = WeightVersion(options.engine.start_version);
        let mut scoring = Scoring::new(model, None, kind, device, options.scoring, version)?;
        scoring.training_on_decoder = trainer.first().kernels() == TrainKernels::Auto;
        let scoring = Arc::new(scoring);
        Ok(Self {
            inner: Arc::new(ActorInner {
                engine,
                kind,
                scoring,
                trainer: Mutex::new(trainer),
                gap_probe_tokens: options.gap_probe_tokens,
                engines,
            }),
        })
    }

    /// The inference engine.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The weights new generations use, as a Burn model (e.g. to export or evaluate them).
    ///
    /// # Errors
    /// If a previous call panicked while holding the policy's state.
    pub fn model(&self) -> Result<CausalLm> {
        Ok(self.snapshot()?.served.model().clone())
    }

    /// The weights scoring reads, of the version the engine serves: with the experts divided
    /// among the engines ([`ModelParts::generates`]), gathered from the trainers' parts the first
    /// time something reads them after a step.
    ///
    /// # Errors
    /// A failed gather, or a previous call that panicked holding the policy's state.
    fn snapshot(&self) -> Result<Arc<Snapshot>> {
        if self.inner.engines.is_none() {
            return self.inner.scoring.current();
        }
        let trainer = self.inner.trainer.lock().map_err(|_| poisoned())?;
        self.snapshot_of(&trainer)
    }

    /// [`BurnPolicy::snapshot`] with the trainer held: its weights are the engine's version
    /// (a step syncs the engine before it lets go of the trainer).
    fn snapshot_of(&self, trainer: &DataParallel<Trainer>) -> Result<Arc<Snapshot>> {
        let inner = &self.inner;
        let version = inner.engine.weight_version();
        let current = inner.scoring.current()?;
        if current.version == version {
            return Ok(current);
        }
        let whole = trainer.whole_model()?.to_device(&inner.scoring.device);
        let served = ServedWeights::new(whole, inner.kind)?;
        inner.scoring.replace(Snapshot {
            served,
            head: None,
            version,
        })
    }

    /// Exports the weights new generations use as a HuggingFace directory next to everything
    /// else of `source` (the directory the model was loaded from): its `config.json` with every
    /// key kept, tokenizer files, `generation_config.json` — so transformers and roll load it
    /// and it generates and stops as the trained policy does (see [`export_hf_dir`]).
    ///
    /// # Errors
    /// As [`export_hf_dir`].
    pub fn export(
        &self,
        source: &HfSource,
        out_dir: impl AsRef<Path>,
        options: &SaveOptions,
    ) -> Result<()> {
        export_hf_dir(&self.model()?, source, out_dir, options)
    }

    /// Writes the trainer's state (weights, optimiser, RNG, step, weight version) atomically to
    /// `dir`; returns the directory written.
    ///
    /// # Errors
    /// The trainer's I/O errors.
    pub fn save_checkpoint(&self, dir: impl AsRef<Path>) -> Result<PathBuf> {
        let version = self.inner.engine.weight_version().0;
        let trainer = self.inner.trainer.lock().map_err(|_| poisoned())?;
        trainer.save_checkpoint(dir.as_ref(), version)
    }

    /// Releases the ranks that follow this actor's trainer (a [`Placement::Leader`]) now, so that
    /// another policy can lead them (see [`DataParallel::release`]): this one trains no more. A
    /// policy that leads no other rank is unchanged.
    ///
    /// # Errors
    /// A failed announcement, or a previous call that panicked holding the trainer.
    pub fn release_followers(&self) -> Result<()> {
        let mut trainer = self.inner.trainer.lock().map_err(|_| poisoned())?;
        if self.inner.engines.is_some() {
            // The last weights, gathered while the followers can still take part, for what
            // reads the model after (the export, evaluation).
            self.snapshot_of(&trainer)?;
        }
        trainer.release()
    }

    /// The blocking body of [`Train::train_step`].
    fn train_blocking(&self, batch: &TrainBatch, objective: &Objective) -> Result<TrainOutput> {
        let inner = &self.inner;
        let mut trainer = inner.trainer.lock().map_err(|_| poisoned())?;
        let epochs = trainer.first().config().epochs;
        let started = Instant::now();
        let (mut metrics, updated) = run_epochs(epochs, |_| trainer.step(batch, objective))?;
        metrics.insert("time/update_s".into(), started.elapsed().as_secs_f64());
        let version = if updated {
            let started = Instant::now();
            let (version, snapshot) = match &inner.engines {
                Some(channel) => {
                    // Every engine of the copy syncs from its own trainer's part, together.
                    trainer.announce_serve()?;
                    let part = trainer.first().served_part(channel)?;
                    let served = ServedWeights::new(part, inner.kind)?;
                    let version = inner.engine.sync_served_blocking(&served)?;
                    drop(trainer);
                    metrics.insert("time/weight_sync_s".into(), started.elapsed().as_secs_f64());
                    // Scoring's whole model is gathered when something reads it (the probe).
                    (version, None)
                }
                None => {
                    let generation = trainer.first().generation();
                    let model = trainer.whole_model()?;
                    drop(trainer);
                    let served = ServedWeights::new(model, inner.kind)?;
                    if let Some(decoder) = served.cpu() {
                        let trainer = inner.trainer.lock().map_err(|_| poisoned())?;
                        trainer.first().offer_packed(generation, decoder.clone());
                    }
                    let version = inner.engine.sync_served_blocking(&served)?;
                    let snapshot = inner.scoring.replace(Snapshot {
                        served,
                        head: None,
                        version,
                    })?;
                    metrics.insert("time/weight_sync_s".into(), started.elapsed().as_secs_f64());
                    (version, Some(snapshot))
                }
            };
            if let Some(first) = batch.sequences().first()
                && inner.gap_probe_tokens > 0
            {
                let started = Instant::now();
                let snapshot = match snapshot {
                    Some(snapshot) => snapshot,
                    None => self.snapshot()?,
                };
                let gap = self.logprob_gap(&snapshot, &first.prompt_ids)?;
                metrics.insert("train_infer_logprob_gap".into(), gap);
                metrics.insert("time/gap_probe_s".into(), started.elapsed().as_secs_f64());
            }
            version
        } else {
            inner.engine.weight_version()
        };
        metrics.insert("weight_version".into(), version.0 as f64);
        Ok(TrainOutput {
            weight_version: version,
            metrics,
        })
    }

    /// Largest |engine log-prob − training-kernel log-prob| over a greedy probe from `prompt`.
    fn logprob_gap(&self, snapshot: &Snapshot, prompt: &[u32]) -> Result<f64> {
        let params = SamplingParams {
            temperature: 0.0,
            max_new_tokens: self.inner.gap_probe_tokens,
            ..SamplingParams::default()
        };
        let probe = self
            .inner
            .engine
            .submit(GenerationRequest::new(prompt.to_vec(), params))?
            .wait()?;
        let request = ScoreRequest {
            sequences: vec![ScoreSequence {
                prompt_ids: prompt.to_vec(),
                response_ids: probe.token_ids.clone(),
            }],
            with_entropy: false,
            kernels: ScoreKernels::Training,
        };
        let scoring = &self.inner.scoring;
        let scored = snapshot.score(&request, scoring)?;
        Ok(scored
            .first()
            .map(|s| {
                s.logprobs
                    .iter()
                    .zip(&probe.logprobs)
                    .map(|(a, b)| f64::from((a - b).abs()))
                    .fold(0.0, f64::max)
            })
            .unwrap_or(0.0))
    }
}

/// Runs `epochs` optimiser steps; returns the last step's metrics (with `epochs`) and whether any
/// step changed the weights.
fn run_epochs(
    epochs: u32,
    mut step: impl FnMut(u32) -> Result<crate::train::TrainStepReport>,
) -> Result<(BTreeMap<String, f64>, bool)> {
    let mut updated = false;
    let mut metrics = BTreeMap::new();
    for epoch in 0..epochs.max(1) {
        let report = step(epoch)?;
        updated |= !report.skipped;
        metrics = report.to_metrics();
    }
    metrics.insert("epochs".into(), f64::from(epochs.max(1)));
    Ok((metrics, updated))
}

#[async_trait]
impl Generate for BurnPolicy {
    async fn generate(&self, request: GenerationRequest) -> roll_core::Result<Generation> {
        Ok(self.inner.engine.submit(request)?.finish().await?)
    }

    fn weight_version(&self) -> WeightVersion {
        self.inner.engine.weight_version()
    }
}

#[async_trait]
impl Score for BurnPolicy {
    async fn score(&self, request: &ScoreRequest) -> roll_core::Result<Vec<TokenScores>> {
        if self.inner.engines.is_none() {
            return self.inner.scoring.score(request).await;
        }
        let (this, request) = (self.clone(), request.clone());
        blocking(move || this.snapshot()?.score(&request, &this.inner.scoring)).await
    }
}

#[async_trait]
impl Train for BurnPolicy {
    async fn train_step(
        &self,
        batch: TrainBatch,
        objective: &Objective,
    ) -> roll_core::Result<TrainOutput> {
        let this = self.clone();
        let objective = objective.clone();
        blocking(move || this.train_blocking(&batch, &objective)).await
    }
}

/// The critic: a trunk with a value head; scores values and trains on the value loss. It has no
/// inference engine and cannot generate.
#[derive(Clone)]
pub struct BurnCritic {
    inner: Arc<CriticInner>,
}

struct CriticInner {
    scoring: Arc<Scoring>,
    trainer: Mutex<DataParallel<CriticTrainer>>,
    version: AtomicU64,
}

impl std::fmt::Debug for BurnCritic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnCritic")
            .field("device", &self.inner.scoring.device)
            .field("version", &self.inner.version.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

impl BurnCritic {
    /// A critic on `trunk` plus a value head (fresh from the trainer's seed when `None`).
    ///
    /// # Errors
    /// A bad trainer config or a device that is not built in.
    pub fn new(
        trunk: CausalLm,
        head: Option<ValueHead>,
        trainer: TrainerConfig,
        options: PolicyOptions,
    ) -> Result<Self> {
        let trainer = options.placement.trainers(|device| {
            CriticTrainer::new(trunk.clone(), head.clone(), trainer.clone(), &device)
        })?;
        let (trunk, head) = trainer.first().inference_model()?;
        let (trunk, device, _) = placed(trunk, &options)?;
        let scoring = Scoring::new(
            trunk,
            Some(head),
            DecoderKind::Burn,
            device,
            options.scoring,
            WeightVersion(options.engine.start_version),
        )?;
        Ok(Self {
            inner: Arc::new(CriticInner {
                scoring: Arc::new(scoring),
                trainer: Mutex::new(trainer),
                version: AtomicU64::new(options.engine.start_version),
            }),
        })
    }

    /// Writes the critic trainer's state atomically to `dir`; returns the directory written.
    ///
    /// # Errors
    /// The trainer's I/O errors.
    pub fn save_checkpoint(&self, dir: impl AsRef<Path>) -> Result<PathBuf> {
        let version = self.inner.version.load(Ordering::Acquire);
        let trainer = self.inner.trainer.lock().map_err(|_| poisoned())?;
        trainer.first().save_checkpoint(dir, version)
    }

    fn train_blocking(&self, batch: &TrainBatch, objective: &Objective) -> Result<TrainOutput> {
        let inner = &self.inner;
        let mut trainer = inner.trainer.lock().map_err(|_| poisoned())?;
        let epochs = trainer.first().config().epochs;
        let started = Instant::now();
        let (mut metrics, updated) = run_epochs(epochs, |_| trainer.step(batch, objective))?;
        metrics.insert("time/update_s".into(), started.elapsed().as_secs_f64());
        let version = if updated {
            let started = Instant::now();
            let (trunk, head) = trainer.first().inference_model()?;
            drop(trainer);
            let served = ServedWeights::new(trunk, DecoderKind::Burn)?;
            let version = WeightVersion(inner.version.load(Ordering::Acquire) + 1);
            inner.scoring.replace(Snapshot {
                served,
                head: Some(head),
                version,
            })?;
            metrics.insert("time/weight_sync_s".into(), started.elapsed().as_secs_f64());
            inner.version.store(version.0, Ordering::Release);
            version
        } else {
            WeightVersion(inner.version.load(Ordering::Acquire))
        };
        metrics.insert("weight_version".into(), version.0 as f64);
        Ok(TrainOutput {
            weight_version: version,
            metrics,
        })
    }
}

#[async_trait]
impl Score for BurnCritic {
    async fn score(&self, request: &ScoreRequest) -> roll_core::Result<Vec<TokenScores>> {
        self.inner.scoring.score(request).await
    }
}

#[async_trait]
impl Train for BurnCritic {
    async fn train_step(
        &self,
        batch: TrainBatch,
        objective: &Objective,
    ) -> roll_core::Result<TrainOutput> {
        let this = self.clone();
        let objective = objective.clone();
        blocking(move || this.train_blocking(&batch, &objective)).await
    }
}

/// The reference: frozen weights that only score (the KL anchor). No engine, no trainer.
#[derive(Clone)]
pub struct BurnReference {
    scoring: Arc<Scoring>,
}

impl std::fmt::Debug for BurnReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnReference")
            .field("device", &self.scoring.device)
            .finish_non_exhaustive()
    }
}

impl BurnReference {
    /// A reference on `model`.
    ///
    /// # Errors
    /// A device that is not built in, or a model the CPU decoder cannot take.
    pub fn new(model: CausalLm, options: PolicyOptions) -> Result<Self> {
        let (model, device, kind) = placed(model, &options)?;
        Ok(Self {
            scoring: Arc::new(Scoring::new(
                model,
                None,
                kind,
                device,
                options.scoring,
                WeightVersion(options.engine.start_version),
            )?),
        })
    }
}

#[async_trait]
impl Score for BurnReference {
    async fn score(&self, request: &ScoreRequest) -> roll_core::Result<Vec<TokenScores>> {
        self.scoring.score(request).await
    }
}

/// Frozen weights that generate and score but never train: an LLM judge, or a model under
/// evaluation.
#[derive(Clone)]
pub struct BurnFrozen {
    engine: Arc<Engine>,
    scoring: Arc<Scoring>,
}

impl std::fmt::Debug for BurnFrozen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnFrozen")
            .field("device", &self.scoring.device)
            .finish_non_exhaustive()
    }
}

impl BurnFrozen {
    /// Frozen `model` served with `tokenizer`.
    ///
    /// # Errors
    /// A device that is not built in, or an engine that cannot start.
    pub fn new(
        model: CausalLm,
        tokenizer: Arc<dyn Tokenizer>,
        options: PolicyOptions,
    ) -> Result<Self> {
        let (model, device, kind) = placed(model, &options)?;
        let version = WeightVersion(options.engine.start_version);
        let engine = Engine::with_decoder(kind, &model, &device, options.engine, Some(tokenizer))?;
        Ok(Self {
            engine: Arc::new(engine),
            scoring: Arc::new(Scoring::new(
                model,
                None,
                kind,
                device,
                options.scoring,
                version,
            )?),
        })
    }

    /// The inference engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

#[async_trait]
impl Generate for BurnFrozen {
    async fn generate(&self, request: GenerationRequest) -> roll_core::Result<Generation> {
        Ok(self.engine.submit(request)?.finish().await?)
    }

    fn weight_version(&self) -> WeightVersion {
        self.engine.weight_version()
    }
}

#[async_trait]
impl Score for BurnFrozen {
    async fn score(&self, request: &ScoreRequest) -> roll_core::Result<Vec<TokenScores>> {
        self.scoring.score(request).await
    }
}

/// Runs `f` on tokio's blocking pool when inside a runtime, inline otherwise.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> roll_core::Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(f)
            .await
            .map_err(|e| BackendError::Engine(format!("worker task failed: {e}")))?
            .map_err(Into::into),
        Err(_) => f().map_err(Into::into),
    }
}
