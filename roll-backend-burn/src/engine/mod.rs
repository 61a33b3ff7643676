//! The inference engine: continuous batching over a key/value cache.

pub mod backend;
pub mod cpu;

pub use backend::{CacheConfig, DecodeBackend, SeqId, StepInput};
