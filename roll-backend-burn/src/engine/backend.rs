//! The contract between the inference engine and a model implementation that decodes with a
//! key/value cache.
//!
//! The engine owns scheduling (which sequences run this step, how many tokens each appends);
//! a [`DecodeBackend`] owns the arithmetic and the cache layout. Three implement it:
//! [`CpuDecoder`](super::cpu::CpuDecoder), hand-scheduled f32 kernels over a paged cache for dense
//! Qwen models on the CPU; [`DeviceDecoder`](super::device_decoder::DeviceDecoder), a paged cache
//! in device tensors for any device and any architecture; and
//! [`BurnDecoder`](super::burn_decoder::BurnDecoder), plain recomputation, the test oracle.
//!
//! Weights and cache are separate values on purpose: after a weight sync, sequences that started
//! on the old weights can finish on them while new sequences use the new ones, all in one cache.

use super::sampler::{Draw, SampledToken, pick_rows};
use crate::Result;
use roll_core::strategy::Strategy;
use std::sync::Arc;

/// Identifies one sequence's entries in a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Tokens one sequence appends in one forward call.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    /// The sequence.
    pub seq: SeqId,
    /// Tokens to append, at positions `start .. start + tokens.len()`. Never empty.
    pub tokens: &'a [u32],
    /// How many tokens of this sequence the cache already holds (0 for a new sequence).
    pub start: usize,
}

/// An input of a forward that continues a prompt another input of the same call computes: the
/// samples of one prompt (a GRPO group), or prompts opening with the same system prompt,
/// compute the shared part once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Continuation {
    /// The sequence whose positions `0..len` are cached or computed by its input in the call
    /// (an input that continues no other).
    pub from: SeqId,
    /// A sequence not cached yet, whose input starts at position `len`: its positions `0..len`
    /// hold `from`'s keys and values.
    pub to: SeqId,
    /// Positions `to` takes from `from`.
    pub len: usize,
}

/// Size of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Sequences that can be cached at once.
    pub max_seqs: usize,
    /// Tokens (summed over sequences) that can be cached at once. The engine never asks for more:
    /// it reserves `prompt + max_new_tokens` per sequence before admitting it.
    pub max_cached_tokens: usize,
}

/// A model's weights in a layout ready for cached decoding.
///
/// Implementations must be **batch-invariant**: the logits of a sequence do not depend on which
/// other sequences share the call, bit for bit. That is what makes a seeded request reproducible
/// whatever else the engine is serving.
pub trait DecodeBackend: Send + Sync + 'static {
    /// This backend's key/value storage.
    type Cache: Send + 'static;

    /// Vocabulary size (each logits row has this many entries).
    fn vocab_size(&self) -> usize;

    /// An empty cache of the given size, shaped for this model's architecture.
    ///
    /// # Errors
    /// If the cache cannot be allocated.
    fn new_cache(&self, config: &CacheConfig) -> Result<Self::Cache>;

    /// Whether `cache` was made for a model of this architecture (layers, heads, widths), so that
    /// new weights can continue sequences cached by old ones.
    fn fits(&self, cache: &Self::Cache) -> bool;

    /// Runs every input through the model, appending its tokens to its sequence's cache, and
    /// returns the next-token logits after each input's **last** token, row-major
    /// `[inputs.len(), vocab]`. Inputs may mix prefills (many tokens) and decodes (one token).
    ///
    /// # Errors
    /// [`BackendError::TokenOutOfVocab`](crate::BackendError::TokenOutOfVocab) for a bad id,
    /// [`BackendError::InvalidInput`](crate::BackendError::InvalidInput) if `start` disagrees with
    /// the cache, a sequence appears twice, or the cache is full.
    fn forward(&self, cache: &mut Self::Cache, inputs: &[StepInput<'_>]) -> Result<Vec<f32>>;

    /// [`DecodeBackend::forward`], then the next token of every input that has a draw
    /// (`draws[i]` for `inputs[i]`; `None` where the logits are not wanted, such as a prompt
    /// chunk short of the prompt's end) — the engine's step. A row's pick is its own result: a
    /// row of NaN logits fails that row only.
    ///
    /// The default picks on the host from `forward`'s logits ([`pick_rows`]). A decoder whose
    /// logits live on a device overrides it to pick there and read back two numbers per row
    /// instead of a vocabulary's worth.
    ///
    /// # Errors
    /// As [`DecodeBackend::forward`].
    fn forward_sample(
        &self,
        cache: &mut Self::Cache,
        inputs: &[StepInput<'_>],
        draws: &[Option<Draw>],
    ) -> Result<Vec<Option<Result<SampledToken>>>> {
        let logits = self.forward(cache, inputs)?;
        Ok(pick_rows(&logits, self.vocab_size(), draws))
    }

    /// Whether this backend runs [`DecodeBackend::forward_sample_continuing`]. The default is
    /// false: the engine then prefills every prompt whole.
    fn continues_prompts(&self) -> bool {
        false
    }

    /// [`DecodeBackend::forward_sample`] where some inputs continue a prompt that another input
    /// of the call computes (see [`Continuation`]): each continuation's sequence is created
    /// holding `len` positions, and reads the keys and values of `from`'s once they are
    /// written. Batch invariance extends to it: a continuation's logits are the bits its whole
    /// prompt would give.
    ///
    /// # Errors
    /// As [`DecodeBackend::forward`], and [`BackendError::InvalidInput`](crate::BackendError::InvalidInput)
    /// for a continuation that does not match its inputs; the default, for a backend that does
    /// not continue prompts, is [`BackendError::UnsupportedByDecoder`](crate::BackendError::UnsupportedByDecoder).
    fn forward_sample_continuing(
        &self,
        cache: &mut Self::Cache,
        inputs: &[StepInput<'_>],
        continuations: &[Continuation],
        draws: &[Option<Draw>],
    ) -> Result<Vec<Option<Result<SampledToken>>>> {
        if continuations.is_empty() {
            return self.forward_sample(cache, inputs, draws);
        }
        Err(crate::BackendError::UnsupportedByDecoder {
            what: "inputs continuing another input's prompt".into(),
        })
    }

    /// Makes `to`, a sequence not cached yet, hold the keys and values of `from`'s first `len`
    /// cached positions, so that its first input starts at `len`: a prompt opening with tokens
    /// that a running sequence has cached skips them. Supported where
    /// [`DecodeBackend::continues_prompts`] is.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`](crate::BackendError::InvalidInput) if `from` holds fewer
    /// than `len` positions, `to` is cached already, or the cache has no room; the default is
    /// [`BackendError::UnsupportedByDecoder`](crate::BackendError::UnsupportedByDecoder).
    fn fork(&self, cache: &mut Self::Cache, from: SeqId, to: SeqId, len: usize) -> Result<()> {
        let _ = (cache, from, to, len);
        Err(crate::BackendError::UnsupportedByDecoder {
            what: "copying a sequence's cached prefix".into(),
        })
    }

    /// The ranks whose engines this backend's forward exchanges with — an expert-parallel
    /// model's group ([`CausalLm::shard_experts`](crate::CausalLm::shard_experts)) — or `None`
    /// (the default) for a backend that computes alone.
    ///
    /// With peers, the engines step together (see [`lockstep`](super::lockstep)): in every step
    /// each rank calls [`DecodeBackend::forward_sample`] once per weight version the group has
    /// in use, in version order, **even with no inputs of its own**, and the backend takes part
    /// in its exchanges whatever its own inputs are (a rank with none serves the others').
    fn peers(&self) -> Option<Arc<dyn Strategy>> {
        None
    }

    /// Frees a sequence's cache entries (unknown ids are ignored).
    fn release(&self, cache: &mut Self::Cache, seq: SeqId);

    /// Keeps the first `len` positions of `seq`'s entries and frees the rest, so that its next
    /// forward starts at `len` — how a request reuses the prefix a finished sequence left
    /// (see [`prefix`](super::prefix)). Nothing happens if `seq` holds `len` positions or fewer.
    fn truncate(&self, cache: &mut Self::Cache, seq: SeqId, len: usize);
}
