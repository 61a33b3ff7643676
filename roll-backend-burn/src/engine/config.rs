//! Engine settings.

use crate::{BackendError, Result};
use serde::{Deserialize, Serialize};

/// What happens to requests in flight when new weights arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlightPolicy {
    /// They finish on the weights they started with (their generation carries the old version);
    /// only requests admitted after the sync use the new weights.
    #[default]
    Finish,
    /// They are restarted from their prompt on the new weights; tokens generated so far are
    /// discarded and a seeded request replays its random stream from the start, so the result is
    /// exactly what the new weights would have produced.
    Requeue,
}

/// Capacity and scheduling settings of an [`Engine`](super::Engine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Sequences decoded at once; more requests wait in a queue.
    pub max_seqs: usize,
    /// Tokens of key/value cache, summed over sequences. A request reserves
    /// `prompt + max_new_tokens` of it when admitted, so admitted requests never run out.
    pub max_cached_tokens: usize,
    /// Tokens fed to the model in one forward call (decode tokens first, then prompt chunks).
    pub max_batch_tokens: usize,
    /// Token ids that end every request besides the tokenizer's EOS ids (which the engine adds
    /// itself) and each request's own stop ids.
    pub eos_token_ids: Vec<u32>,
    /// Seed of the streams of requests that carry no seed of their own.
    pub seed: u64,
    /// What a weight sync does to requests in flight.
    pub on_weight_sync: InFlightPolicy,
    /// Version of the weights the engine starts with (a resumed run continues its count).
    pub start_version: u64,
    /// Whether prompts reuse the keys and values other sequences hold for their opening tokens:
    /// finished sequences' entries are kept for later requests that extend them (multi-turn
    /// conversations), and, on a decoder that can ([`DecodeBackend::continues_prompts`](super::DecodeBackend::continues_prompts):
    /// the CPU decoder), a prompt opening with tokens a running sequence has cached or computes
    /// in the same step copies them (the samples of one prompt, a common system prompt). See
    /// [`prefix`](super::prefix). It changes no result, only how many prompt tokens are
    /// computed; off, every request prefills its whole prompt.
    pub prefix_cache: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_seqs: 64,
            max_cached_tokens: 64 * 1024,
            max_batch_tokens: 2048,
            eos_token_ids: Vec::new(),
            seed: 0,
            on_weight_sync: InFlightPolicy::Finish,
            start_version: 0,
            prefix_cache: true,
        }
    }
}

impl EngineConfig {
    /// The engine a run config describes: `rollout.max_running_requests` sequences decoded at
    /// once, seed derived from `run.seed`; capacities not in the config keep their defaults.
    pub fn from_config(config: &roll_core::config::Config) -> Self {
        Self {
            max_seqs: config.rollout.max_running_requests as usize,
            seed: roll_core::rng::derive_seed(config.run.seed, "engine"),
            ..Self::default()
        }
    }

    /// Checks that every capacity is positive.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] naming the offending key.
    pub fn validate(&self) -> Result<()> {
        for (key, value) in [
            ("max_seqs", self.max_seqs),
            ("max_cached_tokens", self.max_cached_tokens),
            ("max_batch_tokens", self.max_batch_tokens),
        ] {
            if value == 0 {
                return Err(BackendError::InvalidInput(format!(
                    "engine config `{key}` must be at least 1"
                )));
            }
        }
        Ok(())
    }
}
