//! [`BurnPolicy`]: roll-core's [`Policy`] on a Burn model — the inference engine for `generate`,
//! micro-batched scoring for `score` (on the CPU decoder, [`CpuDecoder::score`], when the model
//! runs there and has no value head), and a trainer for `train_step`.
//!
//! One type serves every model role of a pipeline:
//! - **actor** ([`BurnPolicy::actor`]): generates, scores, trains; after each step the engine
//!   receives the new weights and the weight version increments;
//! - **critic** ([`BurnPolicy::critic`]): scores values with its value head and trains on the
//!   value loss; it does not generate;
//! - **reference** or **judge** ([`BurnPolicy::frozen`]): generates and scores, never trains.
//!
//! The async methods never block the tokio runtime: generation runs on the engine's thread and
//! scoring and training on tokio's blocking pool.
//!
//! Every train step also measures the **train–inference log-prob gap**: after the weight sync
//! the engine generates a short greedy probe from the batch's first prompt, and the training
//! code path rescores it; the largest absolute difference of the per-token log-probs is reported
//! as `train_infer_logprob_gap` (it should stay ≤ 1e-4; ROLL users' most reported numerical
//! problem is this gap growing unnoticed).

use crate::engine::cpu::CpuDecoder;
use crate::engine::{DecoderKind, Engine, EngineConfig};
use crate::train::{CriticTrainer, Trainer, TrainerConfig};
use crate::{
    BackendError, CausalLm, Result, ScoringOptions, ValueHead, device as device_for, score,
};
use async_trait::async_trait;
use burn::module::Module;
use burn::tensor::Device;
use roll_core::policy::{
    Generation, GenerationRequest, Objective, Policy, SamplingParams, ScoreRequest, ScoreSequence,
    TokenScores, TrainOutput,
};
use roll_core::strategy::{SingleDevice, Strategy};
use roll_core::{TrainBatch, WeightVersion};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// How a [`BurnPolicy`] is placed and served.
#[derive(Clone)]
pub struct PolicyOptions {
    /// Where the model runs (one device).
    pub strategy: SingleDevice,
    /// Inference engine settings.
    pub engine: EngineConfig,
    /// Force a decoder; `None` picks the fastest that covers the model ([`DecoderKind::auto`]).
    pub decoder: Option<DecoderKind>,
    /// Micro-batching of `score`.
    pub scoring: ScoringOptions,
    /// Decodes generated text and finds stop strings; without it `Generation::text` is empty.
    pub tokenizer: Option<Arc<dyn roll_core::Tokenizer>>,
    /// Tokens of the greedy probe that measures the train–inference gap after each step
    /// (0 = do not measure).
    pub gap_probe_tokens: u32,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            strategy: SingleDevice::new(roll_core::strategy::DeviceSpec::Cpu),
            engine: EngineConfig::default(),
            decoder: None,
            scoring: ScoringOptions::default(),
            tokenizer: None,
            gap_probe_tokens: 8,
        }
    }
}

impl std::fmt::Debug for PolicyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyOptions")
            .field("strategy", &self.strategy.device())
            .field("engine", &self.engine)
            .field("decoder", &self.decoder)
            .field("tokenizer", &self.tokenizer.is_some())
            .field("gap_probe_tokens", &self.gap_probe_tokens)
            .finish_non_exhaustive()
    }
}

/// What a policy can do beyond scoring.
enum Role {
    Frozen,
    Actor(Box<Trainer>),
    Critic(Box<CriticTrainer>),
}

/// The weights `score` uses: the latest synced model and, for a critic, its value head.
struct Scorer {
    model: CausalLm,
    head: Option<ValueHead>,
    /// The model in the CPU decoder's layout, when it scores faster there: no value head, and
    /// [`DecoderKind::auto`] picks the CPU decoder for the model on the policy's device.
    cpu: Option<Arc<CpuDecoder>>,
}

impl Scorer {
    /// Wraps `model` (and `head`), building the CPU decoder copy where it applies.
    ///
    /// # Errors
    /// If the CPU decoder cannot take the model's weights.
    fn new(model: CausalLm, head: Option<ValueHead>, device: &Device) -> Result<Self> {
        let cpu = if head.is_none() && DecoderKind::auto(&model, device) == DecoderKind::Cpu {
            Some(Arc::new(CpuDecoder::from_model(&model)?))
        } else {
            None
        };
        Ok(Self { model, head, cpu })
    }

    /// Scores `request`: on the CPU decoder when there is one, through [`score`] otherwise.
    fn score(
        &self,
        request: &ScoreRequest,
        options: &ScoringOptions,
        device: &Device,
    ) -> Result<Vec<TokenScores>> {
        match &self.cpu {
            Some(cpu) => cpu.score(request),
            None => score(&self.model, self.head.as_ref(), request, options, device),
        }
    }
}

struct Inner {
    device: Device,
    engine: Option<Engine>,
    scorer: RwLock<Arc<Scorer>>,
    role: Mutex<Role>,
    scoring: ScoringOptions,
    gap_probe_tokens: u32,
    /// Version counter of a policy without an engine (a critic).
    own_version: AtomicU64,
}

/// A Burn model as a roll [`Policy`] (see the [module docs](self)).
#[derive(Clone)]
pub struct BurnPolicy {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BurnPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnPolicy")
            .field("device", &self.inner.device)
            .field("weight_version", &self.weight_version())
            .finish_non_exhaustive()
    }
}

fn poisoned() -> BackendError {
    BackendError::Engine("a previous call panicked while holding the policy's state".into())
}

impl BurnPolicy {
    /// A policy that generates and scores but never trains (reference model, judge).
    ///
    /// # Errors
    /// If the device is not built in or the engine cannot start.
    pub fn frozen(model: CausalLm, options: PolicyOptions) -> Result<Self> {
        Self::build(model, None, Role::Frozen, true, options)
    }

    /// A trainable actor.
    ///
    /// # Errors
    /// A bad trainer config, a device that is not built in, or an engine that cannot start.
    pub fn actor(model: CausalLm, trainer: TrainerConfig, options: PolicyOptions) -> Result<Self> {
        let device = device_for(options.strategy.device())?;
        let trainer = Trainer::new(model, trainer, &device)?;
        let served = trainer.inference_model()?;
        Self::build(served, None, Role::Actor(Box::new(trainer)), true, options)
    }

    /// A critic: `trunk` plus a value head (fresh from the trainer's seed when `None`); scores
    /// values and trains on the value loss.
    ///
    /// # Errors
    /// A bad trainer config or a device that is not built in.
    pub fn critic(
        trunk: CausalLm,
        head: Option<ValueHead>,
        trainer: TrainerConfig,
        options: PolicyOptions,
    ) -> Result<Self> {
        let device = device_for(options.strategy.device())?;
        let trainer = CriticTrainer::new(trunk, head, trainer, &device)?;
        let (trunk, head) = trainer.inference_model()?;
        Self::build(
            trunk,
            Some(head),
            Role::Critic(Box::new(trainer)),
            false,
            options,
        )
    }

    /// An actor resumed from [`BurnPolicy::save_checkpoint`]: weights, optimiser, RNG, step count
    /// and weight version continue where they stopped.
    ///
    /// # Errors
    /// A missing or corrupt checkpoint, or as [`BurnPolicy::actor`].
    pub fn resume_actor(dir: impl AsRef<Path>, mut options: PolicyOptions) -> Result<Self> {
        let device = device_for(options.strategy.device())?;
        let (trainer, version) = Trainer::load_checkpoint(dir, &device)?;
        options.engine.start_version = version;
        let served = trainer.inference_model()?;
        Self::build(served, None, Role::Actor(Box::new(trainer)), true, options)
    }

    fn build(
        model: CausalLm,
        head: Option<ValueHead>,
        role: Role,
        serve: bool,
        options: PolicyOptions,
    ) -> Result<Self> {
        if options.strategy.world_size() != 1 {
            return Err(BackendError::InvalidInput(
                "BurnPolicy runs on one device; use one policy per device".into(),
            ));
        }
        let device = device_for(options.strategy.device())?;
        let model = model.to_device(&device);
        let engine = if serve {
            let kind = options
                .decoder
                .unwrap_or_else(|| DecoderKind::auto(&model, &device));
            Some(Engine::with_decoder(
                kind,
                &model,
                &device,
                options.engine.clone(),
                options.tokenizer.clone(),
            )?)
        } else {
            None
        };
        let own_version = AtomicU64::new(options.engine.start_version);
        let scorer = Scorer::new(model, head, &device)?;
        Ok(Self {
            inner: Arc::new(Inner {
                device,
                engine,
                scorer: RwLock::new(Arc::new(scorer)),
                role: Mutex::new(role),
                scoring: options.scoring,
                gap_probe_tokens: options.gap_probe_tokens,
                own_version,
            }),
        })
    }

    /// The inference engine (absent for a critic).
    pub fn engine(&self) -> Option<&Engine> {
        self.inner.engine.as_ref()
    }

    /// Writes the trainer's state (weights, optimiser, RNG, step, weight version) atomically to
    /// `dir`; returns the directory written.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a frozen policy; the trainer's I/O errors.
    pub fn save_checkpoint(&self, dir: impl AsRef<Path>) -> Result<PathBuf> {
        let version = self.weight_version().0;
        let role = self.inner.role.lock().map_err(|_| poisoned())?;
        match &*role {
            Role::Frozen => Err(BackendError::InvalidInput(
                "a frozen policy has no trainer state to checkpoint".into(),
            )),
            Role::Actor(t) => t.save_checkpoint(dir, version),
            Role::Critic(t) => t.save_checkpoint(dir, version),
        }
    }

    /// The blocking body of [`Policy::train_step`].
    fn train_blocking(&self, batch: &TrainBatch, objective: &Objective) -> Result<TrainOutput> {
        let inner = &self.inner;
        let mut role = inner.role.lock().map_err(|_| poisoned())?;
        let (report, scorer) = match &mut *role {
            Role::Frozen => {
                return Err(BackendError::InvalidInput(
                    "this policy is frozen (a reference or judge): it cannot train".into(),
                ));
            }
            Role::Actor(trainer) => {
                let report = trainer.step(batch, objective)?;
                let model = trainer.inference_model()?;
                (report, Scorer::new(model, None, &inner.device)?)
            }
            Role::Critic(trainer) => {
                let report = trainer.step(batch, objective)?;
                let (model, head) = trainer.inference_model()?;
                (report, Scorer::new(model, Some(head), &inner.device)?)
            }
        };
        drop(role);
        let mut metrics = report.to_metrics();
        let version = if report.skipped {
            self.weight_version()
        } else {
            let version = match &inner.engine {
                Some(engine) => engine.sync_weights_blocking(&scorer.model)?,
                None => WeightVersion(inner.own_version.fetch_add(1, Ordering::AcqRel) + 1),
            };
            let scorer = Arc::new(scorer);
            *inner.scorer.write().map_err(|_| poisoned())? = scorer.clone();
            if let (Some(engine), Some(first)) = (&inner.engine, batch.sequences().first())
                && inner.gap_probe_tokens > 0
            {
                let gap = self.logprob_gap(engine, &scorer.model, &first.prompt_ids)?;
                metrics.insert("train_infer_logprob_gap".into(), gap);
            }
            version
        };
        metrics.insert("weight_version".into(), version.0 as f64);
        Ok(TrainOutput {
            weight_version: version,
            metrics,
        })
    }

    /// Largest |engine log-prob − training-path log-prob| over a greedy probe from `prompt`.
    fn logprob_gap(&self, engine: &Engine, model: &CausalLm, prompt: &[u32]) -> Result<f64> {
        let params = SamplingParams {
            temperature: 0.0,
            max_new_tokens: self.inner.gap_probe_tokens,
            ..SamplingParams::default()
        };
        let probe = engine
            .submit(GenerationRequest::new(prompt.to_vec(), params))?
            .wait()?;
        let request = ScoreRequest {
            sequences: vec![ScoreSequence {
                prompt_ids: prompt.to_vec(),
                response_ids: probe.token_ids.clone(),
            }],
            with_entropy: false,
        };
        let scored = score(
            model,
            None,
            &request,
            &self.inner.scoring,
            &self.inner.device,
        )?;
        Ok(scored[0]
            .logprobs
            .iter()
            .zip(&probe.logprobs)
            .map(|(a, b)| f64::from((a - b).abs()))
            .fold(0.0, f64::max))
    }
}

/// Runs `f` on tokio's blocking pool when inside a runtime, inline otherwise.
async fn blocking<T: Send + 'static>(
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

#[async_trait]
impl Policy for BurnPolicy {
    async fn generate(&self, request: GenerationRequest) -> roll_core::Result<Generation> {
        let engine = self.inner.engine.as_ref().ok_or_else(|| {
            BackendError::InvalidInput("a critic scores values; it does not generate".into())
        })?;
        Ok(engine.submit(request)?.finish().await?)
    }

    async fn score(&self, request: &ScoreRequest) -> roll_core::Result<Vec<TokenScores>> {
        let scorer = self.inner.scorer.read().map_err(|_| poisoned())?.clone();
        let inner = self.inner.clone();
        let request = request.clone();
        blocking(move || scorer.score(&request, &inner.scoring, &inner.device)).await
    }

    async fn train_step(
        &self,
        batch: &TrainBatch,
        objective: &Objective,
    ) -> roll_core::Result<TrainOutput> {
        let this = self.clone();
        let batch = batch.clone();
        let objective = objective.clone();
        blocking(move || this.train_blocking(&batch, &objective)).await
    }

    fn weight_version(&self) -> WeightVersion {
        match &self.inner.engine {
            Some(engine) => engine.weight_version(),
            None => WeightVersion(self.inner.own_version.load(Ordering::Acquire)),
        }
    }
}
