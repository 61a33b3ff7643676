//! [`Engine`]: the thread-safe front of the engine thread.

use super::backend::DecodeBackend;
use super::burn_decoder::BurnDecoder;
use super::config::EngineConfig;
use super::core::{Command, EngineLoop, SharedStats, Submission};
use super::cpu::CpuDecoder;
use super::device_decoder::DeviceDecoder;
use super::request::RequestHandle;
use crate::{BackendError, CausalLm, Result};
use burn::tensor::Device;
use roll_core::policy::GenerationRequest;
use roll_core::{Tokenizer, WeightVersion};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use tokio::sync::mpsc::unbounded_channel;
use tokio::sync::oneshot;

/// Sends a request to the engine thread.
type SubmitFn = dyn Fn(Submission) -> Result<()> + Send + Sync;
/// Converts a model into the engine's weights (on the caller's thread) and sends them over.
type SyncFn =
    dyn Fn(&ServedWeights) -> Result<oneshot::Receiver<Result<WeightVersion>>> + Send + Sync;

/// A continuous-batching inference engine running on its own thread.
///
/// [`Engine::submit`] never blocks: it queues the request and returns a [`RequestHandle`] to await,
/// stream or abort it. The engine thread owns the model's cache and decodes every admitted request
/// in one batch per step (see the [module docs](super)). Dropping the engine lets queued and running
/// requests finish, then stops the thread — for an engine over an expert-parallel model, whose
/// ranks' engines step together ([`lockstep`](super::lockstep)), once every peer's engine has
/// been dropped too: until then it serves their tokens.
pub struct Engine {
    // `Option` so that `Drop` can close the channel before joining the thread.
    submit: Option<Box<SubmitFn>>,
    sync: Option<Box<SyncFn>>,
    stats: Arc<SharedStats>,
    arrivals: AtomicU64,
    vocab_size: usize,
    max_request_tokens: usize,
    /// The model's `max_position_embeddings` (set by the constructors that see the model).
    max_positions: Option<usize>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("vocab_size", &self.vocab_size)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Which [`DecodeBackend`] an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderKind {
    /// [`CpuDecoder`]: CPU kernels over a paged key/value cache; dense Qwen2/Qwen3 only.
    Cpu,
    /// [`DeviceDecoder`]: a paged key/value cache on any device, any architecture; roll's
    /// CubeCL kernels on a cubecl device (feature `wgpu`), Burn's ops elsewhere.
    Device,
    /// [`BurnDecoder`]: any device, any architecture, recomputes each sequence every step — the
    /// oracle the others are tested against, never chosen by [`DecoderKind::auto`].
    Burn,
}

impl DecoderKind {
    /// The fastest decoder that covers `model` on `device`: [`DecoderKind::Cpu`] for dense models
    /// on the CPU (Flex) device, [`DecoderKind::Device`] otherwise (a GPU, or a mixture of
    /// experts).
    pub fn auto(model: &CausalLm, device: &Device) -> Self {
        let on_cpu = device.clone().inner() == Device::flex();
        if on_cpu && !matches!(model, CausalLm::Qwen3Moe(_)) {
            Self::Cpu
        } else {
            Self::Device
        }
    }
}

/// Whether `kind` can serve `model`: a whole model, or an expert-parallel one
/// ([`CausalLm::shard_experts`]) on the [`DeviceDecoder`], whose engines step with their peers
/// (see [`lockstep`](super::lockstep)).
///
/// # Errors
/// [`BackendError::InvalidInput`] for any other part of a model, or an expert-parallel one on
/// another decoder.
fn servable(model: &CausalLm, kind: DecoderKind) -> Result<()> {
    if model.is_expert_sharded() && kind == DecoderKind::Device {
        return Ok(());
    }
    model.require_whole(
        "serve an inference engine (only the device decoder steps with its peers, and only \
         expert-parallel)",
    )
}

/// A model's weights in every layout its consumers need, built once per weight version: the Burn
/// model (training-path scoring, [`BurnDecoder`]) and, when the engine decodes with the
/// [`CpuDecoder`], its weights in that layout — shared by the engine and inference-path scoring
/// instead of being converted twice.
#[derive(Clone)]
pub struct ServedWeights {
    model: CausalLm,
    cpu: Option<Arc<CpuDecoder>>,
}

impl std::fmt::Debug for ServedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedWeights")
            .field("cpu_layout", &self.cpu.is_some())
            .finish_non_exhaustive()
    }
}

impl ServedWeights {
    /// `model`, plus its CPU-decoder layout when `kind` is [`DecoderKind::Cpu`].
    ///
    /// # Errors
    /// If the CPU decoder cannot take the model's weights.
    pub fn new(model: CausalLm, kind: DecoderKind) -> Result<Self> {
        let cpu = match kind {
            DecoderKind::Cpu => Some(Arc::new(CpuDecoder::from_model(&model)?)),
            DecoderKind::Device | DecoderKind::Burn => None,
        };
        Ok(Self { model, cpu })
    }

    /// The Burn model.
    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    /// The weights in the CPU decoder's layout, when they were built.
    pub fn cpu(&self) -> Option<&Arc<CpuDecoder>> {
        self.cpu.as_ref()
    }
}

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineStats {
    /// Version of the weights new requests use.
    pub weight_version: WeightVersion,
    /// Forward steps run so far — for an engine stepping with peers
    /// ([`lockstep`](super::lockstep)), those in which it only served their tokens too.
    pub steps: u64,
    /// Tokens sampled so far.
    pub generated_tokens: u64,
    /// Prompt tokens computed so far.
    pub prefill_tokens: u64,
    /// Prompt tokens not computed because another sequence's cache entry held them, or another
    /// sequence computed them in the same step (prefix reuse:
    /// [`EngineConfig::prefix_cache`](super::EngineConfig::prefix_cache)).
    pub reused_prompt_tokens: u64,
    /// Requests being decoded after the last step.
    pub running: u64,
    /// Requests waiting for a slot after the last step.
    pub queued: u64,
}

impl Engine {
    /// Starts the engine thread on `weights`; `prepare` turns served weights into this backend's
    /// weights at every [`Engine::sync_weights`]. Generation ends on the tokenizer's EOS ids
    /// (when there is a tokenizer) and on every id of [`EngineConfig::eos_token_ids`].
    ///
    /// # Errors
    /// An invalid `config`, or a cache that cannot be allocated.
    pub fn start<B, F>(
        weights: B,
        prepare: F,
        mut config: EngineConfig,
        tokenizer: Option<Arc<dyn Tokenizer>>,
    ) -> Result<Self>
    where
        B: DecodeBackend,
        F: Fn(&ServedWeights) -> Result<Arc<B>> + Send + Sync + 'static,
    {
        config.validate()?;
        for eos in tokenizer.iter().flat_map(|t| t.eos_token_ids()) {
            if !config.eos_token_ids.contains(&eos) {
                config.eos_token_ids.push(eos);
            }
        }
        let vocab_size = weights.vocab_size();
        let max_request_tokens = config.max_cached_tokens;
        let stats = Arc::new(SharedStats::default());
        let engine_loop = EngineLoop::new(weights, config, tokenizer, stats.clone())?;
        let (tx, rx) = mpsc::channel::<Command<B>>();
        let thread = std::thread::Builder::new()
            .name("roll-engine".into())
            .spawn(move || engine_loop.run(rx))
            .map_err(|e| BackendError::Engine(format!("cannot start the engine thread: {e}")))?;
        let (submit_stats, sync_stats) = (stats.clone(), stats.clone());
        let submit_tx = tx.clone();
        let submit = move |sub: Submission| {
            submit_tx
                .send(Command::Submit(Box::new(sub)))
                .map_err(|_| BackendError::Engine(submit_stats.stop_reason()))
        };
        let sync = move |served: &ServedWeights| {
            let weights = prepare(served)?;
            let (reply, answer) = oneshot::channel();
            tx.send(Command::Sync { weights, reply })
                .map_err(|_| BackendError::Engine(sync_stats.stop_reason()))?;
            Ok(answer)
        };
        Ok(Self {
            submit: Some(Box::new(submit)),
            sync: Some(Box::new(sync)),
            stats,
            arrivals: AtomicU64::new(0),
            vocab_size,
            max_request_tokens,
            max_positions: None,
            thread: Some(thread),
        })
    }

    /// Starts an engine on the best decoder for `model` on `device` (see [`DecoderKind::auto`]).
    ///
    /// # Errors
    /// As [`Engine::start`].
    pub fn for_model(
        model: &CausalLm,
        device: &Device,
        config: EngineConfig,
        tokenizer: Option<Arc<dyn Tokenizer>>,
    ) -> Result<Self> {
        Self::with_decoder(
            DecoderKind::auto(model, device),
            model,
            device,
            config,
            tokenizer,
        )
    }

    /// Starts an engine on a chosen decoder.
    ///
    /// # Errors
    /// As [`Engine::start`]; [`DecoderKind::Cpu`] also fails for models it does not cover.
    pub fn with_decoder(
        kind: DecoderKind,
        model: &CausalLm,
        device: &Device,
        config: EngineConfig,
        tokenizer: Option<Arc<dyn Tokenizer>>,
    ) -> Result<Self> {
        servable(model, kind)?;
        let mut engine = match kind {
            DecoderKind::Cpu => {
                let weights = CpuDecoder::from_model(model)?;
                let prepare = |w: &ServedWeights| {
                    servable(w.model(), DecoderKind::Cpu)?;
                    match w.cpu() {
                        Some(cpu) => Ok(cpu.clone()),
                        None => CpuDecoder::from_model(w.model()).map(Arc::new),
                    }
                };
                Self::start(weights, prepare, config, tokenizer)?
            }
            DecoderKind::Device => {
                let device = device.clone();
                let weights = DeviceDecoder::from_model(model, &device)?;
                Self::start(
                    weights,
                    move |w: &ServedWeights| {
                        servable(w.model(), DecoderKind::Device)?;
                        DeviceDecoder::from_model(w.model(), &device).map(Arc::new)
                    },
                    config,
                    tokenizer,
                )?
            }
            DecoderKind::Burn => {
                let device = device.clone();
                let weights = BurnDecoder::from_model(model, &device)?;
                Self::start(
                    weights,
                    move |w: &ServedWeights| {
                        servable(w.model(), DecoderKind::Burn)?;
                        BurnDecoder::from_model(w.model(), &device).map(Arc::new)
                    },
                    config,
                    tokenizer,
                )?
            }
        };
        engine.max_positions = model.max_position_embeddings();
        Ok(engine)
    }

    /// Queues a request.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for an empty prompt, an id outside the vocabulary, or a
    /// request larger than the whole cache; [`BackendError::SequenceTooLong`] when the prompt
    /// plus `max_new_tokens` exceeds the model's `max_position_embeddings`;
    /// [`BackendError::Engine`] if the engine has stopped.
    pub fn submit(&self, request: GenerationRequest) -> Result<RequestHandle> {
        if request.prompt_ids.is_empty() {
            return Err(BackendError::InvalidInput("empty prompt".into()));
        }
        if let Some(&id) = request
            .prompt_ids
            .iter()
            .find(|&&id| id as usize >= self.vocab_size)
        {
            return Err(BackendError::TokenOutOfVocab {
                id,
                vocab_size: self.vocab_size,
            });
        }
        let need = request.prompt_ids.len() + request.params.max_new_tokens as usize;
        // As vLLM: the prompt and every token it may generate must fit the model's context.
        crate::models::check_length(self.max_positions, 0, need)?;
        if need > self.max_request_tokens {
            return Err(BackendError::InvalidInput(format!(
                "request needs {need} cache tokens (prompt {} + max_new_tokens {}) but the engine \
                 holds {} (raise max_cached_tokens)",
                request.prompt_ids.len(),
                request.params.max_new_tokens,
                self.max_request_tokens
            )));
        }
        if request.params.max_new_tokens == 0 {
            return Err(BackendError::InvalidInput(
                "max_new_tokens must be at least 1".into(),
            ));
        }
        let (events_tx, events) = unbounded_channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let submit = self
            .submit
            .as_ref()
            .ok_or_else(|| BackendError::Engine("the engine is shutting down".into()))?;
        submit(Submission {
            request,
            events: events_tx,
            cancelled: cancelled.clone(),
            arrival: self.arrivals.fetch_add(1, Ordering::Relaxed),
        })?;
        Ok(RequestHandle { events, cancelled })
    }

    /// Publishes new weights: requests admitted from now on use them, requests in flight finish
    /// on their old weights or restart, per [`EngineConfig::on_weight_sync`]. Returns the new
    /// weight version once the engine has switched.
    ///
    /// # Errors
    /// If the model cannot be converted, has another architecture, or the engine has stopped.
    pub async fn sync_weights(&self, model: &CausalLm) -> Result<WeightVersion> {
        let served = ServedWeights {
            model: model.clone(),
            cpu: None,
        };
        let answer = self.send_weights(&served)?;
        answer
            .await
            .map_err(|_| BackendError::Engine(self.stats.stop_reason()))?
    }

    /// Blocking version of [`Engine::sync_weights`] for code outside an async runtime.
    ///
    /// # Errors
    /// As [`Engine::sync_weights`].
    pub fn sync_weights_blocking(&self, model: &CausalLm) -> Result<WeightVersion> {
        self.sync_served_blocking(&ServedWeights {
            model: model.clone(),
            cpu: None,
        })
    }

    /// Blocking weight sync from weights already converted for serving (the policy converts
    /// once per step and shares the result with its scorer).
    ///
    /// # Errors
    /// As [`Engine::sync_weights`].
    pub fn sync_served_blocking(&self, served: &ServedWeights) -> Result<WeightVersion> {
        let answer = self.send_weights(served)?;
        answer
            .blocking_recv()
            .map_err(|_| BackendError::Engine(self.stats.stop_reason()))?
    }

    fn send_weights(
        &self,
        served: &ServedWeights,
    ) -> Result<oneshot::Receiver<Result<WeightVersion>>> {
        let sync = self
            .sync
            .as_ref()
            .ok_or_else(|| BackendError::Engine("the engine is shutting down".into()))?;
        sync(served)
    }

    /// The version of the weights new requests use.
    pub fn weight_version(&self) -> WeightVersion {
        WeightVersion(self.stats.version.load(Ordering::Acquire))
    }

    /// Vocabulary size of the served model.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The engine's counters.
    pub fn stats(&self) -> EngineStats {
        let s = &self.stats;
        EngineStats {
            weight_version: self.weight_version(),
            steps: s.steps.load(Ordering::Relaxed),
            generated_tokens: s.generated_tokens.load(Ordering::Relaxed),
            prefill_tokens: s.prefill_tokens.load(Ordering::Relaxed),
            reused_prompt_tokens: s.reused_tokens.load(Ordering::Relaxed),
            running: s.running.load(Ordering::Relaxed),
            queued: s.queued.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.submit = None;
        self.sync = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
