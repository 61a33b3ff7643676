//! The inference engine: continuous batching over a key/value cache.
//!
//! An [`Engine`] runs on its own thread and serves many sampled requests at once. Requests join the
//! running batch as soon as a sequence slot and their cache reservation are free, and leave it when
//! they stop (stop token or string), run out of tokens, or are aborted — each on its own, between
//! any two decode steps, as in vLLM and ROLL. Every step feeds one token per decoding sequence plus
//! chunks of new prompts under a token budget, and samples one token per sequence whose prompt is
//! fully fed.
//!
//! - Per-request [`SamplingParams`](roll_core::policy::SamplingParams): temperature, top-k, top-p,
//!   max new tokens, stop ids, stop strings, seed. Each request draws from its own random stream
//!   and the decoders are batch-invariant, so **a seeded request yields the same tokens whatever
//!   else shares the batch**.
//! - Returned log-probs are those of the sampled tokens under the **temperature-1** distribution
//!   (see [`sampler`]), the quantity the trainer recomputes.
//! - Weight sync: [`Engine::sync_weights`] swaps weights between two steps and increments the
//!   weight version; requests in flight finish on their old weights or restart
//!   ([`InFlightPolicy`]).
//! - Decoders ([`DecodeBackend`]): [`CpuDecoder`], fast kernels over a paged key/value cache for
//!   dense Qwen models on the CPU; [`DeviceDecoder`], a paged cache on any device and any
//!   architecture (roll's CubeCL kernels on a GPU); and [`BurnDecoder`], which recomputes every
//!   sequence at every step — the oracle the other two are tested against.
//!   [`Engine::for_model`] picks the fastest that covers the model and device.
//!
//! ```no_run
//! use roll_backend_burn::engine::{Engine, EngineConfig};
//! use roll_core::policy::{GenerationRequest, SamplingParams};
//!
//! let device = roll_backend_burn::Device::flex();
//! let model = roll_backend_burn::load_model("tiny-qwen2", &device)?;
//! let engine = Engine::for_model(&model, &device, EngineConfig::default(), None)?;
//! let params = SamplingParams { max_new_tokens: 16, seed: Some(7), ..Default::default() };
//! let generation = engine.submit(GenerationRequest::new(vec![1, 2, 3], params))?.wait()?;
//! println!("{:?} {:?}", generation.token_ids, generation.finish_reason);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod backend;
pub mod burn_decoder;
mod config;
mod core;
pub mod cpu;
pub mod device_decoder;
mod handle;
pub mod lockstep;
mod logprob;
pub mod paged;
pub mod prefix;
mod request;
pub mod sampler;
#[cfg(test)]
pub(crate) mod test_support;

pub use backend::{CacheConfig, Continuation, DecodeBackend, SeqId, StepInput};
pub use burn_decoder::BurnDecoder;
pub use config::{EngineConfig, InFlightPolicy};
pub use cpu::{CpuCache, CpuDecoder};
pub use device_decoder::{DeviceCache, DeviceDecoder};
pub use handle::{DecoderKind, Engine, EngineStats, ServedWeights};
pub use request::{Aborter, GenerationEvent, RequestHandle};
pub use sampler::{Draw, SampledToken, SamplingRule, TokenSampler};
