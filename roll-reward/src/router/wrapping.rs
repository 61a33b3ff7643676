//! [`WrapperOptions`]: the option keys every worker kind accepts, applied around the worker.

use crate::error::RewardError;
use crate::shared::SharedWorker;
use crate::wrappers::{
    Cache, Clip, LengthPenalty, LengthPenaltyConfig, RepetitionPenalty, RepetitionPenaltyConfig,
    Weight,
};
use serde::{Deserialize, Serialize};

/// The options every worker kind accepts besides its own, applied by the registry and router
/// rather than by each worker. Their keys are reserved: no worker config may use them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WrapperOptions {
    /// Seconds before a sample of this worker fails with a timeout. Default: the router's
    /// (`RouteOptions::default`, 120 s).
    pub timeout_s: Option<f64>,
    /// Samples of this worker scored at once. Default: the router's (64).
    pub max_concurrency: Option<usize>,
    /// Multiply the reward value ([`Weight`]).
    pub weight: Option<f32>,
    /// Clamp the reward value to `[min, max]` ([`Clip`]).
    pub clip: Option<[f32; 2]>,
    /// Penalise repeated n-grams ([`RepetitionPenalty`]).
    pub repetition_penalty: Option<RepetitionPenaltyConfig>,
    /// Penalise over-long responses ([`LengthPenalty`]).
    pub length_penalty: Option<LengthPenaltyConfig>,
    /// Cache up to this many rewards ([`Cache`]).
    pub cache: Option<usize>,
}

/// The reserved option keys of [`WrapperOptions`].
pub const WRAPPER_KEYS: &[&str] = &[
    "timeout_s",
    "max_concurrency",
    "weight",
    "clip",
    "repetition_penalty",
    "length_penalty",
    "cache",
];

/// Wraps `w` in the value wrappers `o` asks for, innermost first: repetition penalty, length
/// penalty, weight, clip, cache (so the cache stores the final value).
pub(super) fn apply_wrappers(
    mut w: SharedWorker,
    o: &WrapperOptions,
) -> Result<SharedWorker, RewardError> {
    if let Some(c) = &o.repetition_penalty {
        w = SharedWorker::new(RepetitionPenalty::new(w, c.clone())?);
    }
    if let Some(c) = &o.length_penalty {
        w = SharedWorker::new(LengthPenalty::new(w, c.clone())?);
    }
    if let Some(weight) = o.weight {
        w = SharedWorker::new(Weight::new(w, weight)?);
    }
    if let Some([min, max]) = o.clip {
        w = SharedWorker::new(Clip::new(w, min, max)?);
    }
    if let Some(capacity) = o.cache {
        w = SharedWorker::new(Cache::new(w, capacity)?);
    }
    Ok(w)
}
