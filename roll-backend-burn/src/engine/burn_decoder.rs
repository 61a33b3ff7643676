//! The portable decoder: Burn tensors on any device, any architecture (Qwen3-MoE included).
//!
//! It keeps each sequence's token history instead of key/value tensors and recomputes the whole
//! sequence with [`CausalLm::forward`] on every call, one sequence per forward. That makes it
//! quadratic in the sequence length — it is the reference the cached decoders
//! ([`CpuDecoder`](super::cpu::CpuDecoder), [`DeviceDecoder`](super::device_decoder::DeviceDecoder))
//! are tested against, never what [`DecoderKind::auto`](super::DecoderKind::auto) picks — but it
//! is exact, batch-invariant by construction (a sequence never shares a forward with another),
//! and needs nothing from the model beyond its ordinary forward pass.

use super::backend::{CacheConfig, DecodeBackend, SeqId, StepInput};
use crate::models::TokenBatch;
use crate::{BackendError, CausalLm, Result};
use burn::tensor::Device;
use std::collections::HashMap;

/// A [`CausalLm`] used as a [`DecodeBackend`] by recomputation.
#[derive(Debug)]
pub struct BurnDecoder {
    model: CausalLm,
    device: Device,
}

/// The token history of every cached sequence.
#[derive(Debug)]
pub struct TokenHistory {
    sequences: HashMap<SeqId, Vec<u32>>,
    config: CacheConfig,
    cached_tokens: usize,
}

impl BurnDecoder {
    /// Wraps `model`, which must live on `device`.
    pub fn new(model: CausalLm, device: Device) -> Self {
        Self { model, device }
    }

    /// Copies `model` for decoding (a cheap, shared-storage clone).
    ///
    /// # Errors
    /// Never; the signature matches the other decoders' constructors.
    pub fn from_model(model: &CausalLm, device: &Device) -> Result<Self> {
        Ok(Self::new(model.clone(), device.clone()))
    }
}

impl DecodeBackend for BurnDecoder {
    type Cache = TokenHistory;

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn new_cache(&self, config: &CacheConfig) -> Result<TokenHistory> {
        Ok(TokenHistory {
            sequences: HashMap::new(),
            config: *config,
            cached_tokens: 0,
        })
    }

    fn fits(&self, _cache: &TokenHistory) -> bool {
        true
    }

    fn forward(&self, cache: &mut TokenHistory, inputs: &[StepInput<'_>]) -> Result<Vec<f32>> {
        let vocab = self.vocab_size();
        check_inputs(cache, inputs)?;
        let mut logits = Vec::with_capacity(inputs.len() * vocab);
        for input in inputs {
            let history = cache.sequences.entry(input.seq).or_default();
            history.extend_from_slice(input.tokens);
            cache.cached_tokens += input.tokens.len();
            let batch = TokenBatch::single(history, vocab, &self.device)?;
            let last = history.len() - 1;
            let row = self.model.forward(&batch).narrow(1, last, 1);
            let row: Vec<f32> = row
                .into_data()
                .try_into_vec()
                .map_err(|e| BackendError::InvalidInput(format!("reading logits: {e:?}")))?;
            logits.extend_from_slice(&row);
        }
        Ok(logits)
    }

    fn release(&self, cache: &mut TokenHistory, seq: SeqId) {
        if let Some(history) = cache.sequences.remove(&seq) {
            cache.cached_tokens -= history.len();
        }
    }

    fn truncate(&self, cache: &mut TokenHistory, seq: SeqId, len: usize) {
        if let Some(history) = cache.sequences.get_mut(&seq)
            && len < history.len()
        {
            cache.cached_tokens -= history.len() - len;
            history.truncate(len);
        }
    }
}

/// The checks every decoder makes before touching its cache.
fn check_inputs(cache: &TokenHistory, inputs: &[StepInput<'_>]) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    let mut new_tokens = 0;
    let mut new_seqs = 0;
    for input in inputs {
        if !seen.insert(input.seq) {
            return Err(BackendError::InvalidInput(format!(
                "sequence {:?} appears twice in one forward call",
                input.seq
            )));
        }
        if input.tokens.is_empty() {
            return Err(BackendError::InvalidInput(format!(
                "sequence {:?} appends no tokens",
                input.seq
            )));
        }
        let cached = cache.sequences.get(&input.seq).map_or(0, Vec::len);
        if cached == 0 {
            new_seqs += 1;
        }
        if cached != input.start {
            return Err(BackendError::InvalidInput(format!(
                "sequence {:?} starts at {} but {cached} tokens are cached",
                input.seq, input.start
            )));
        }
        new_tokens += input.tokens.len();
    }
    if cache.sequences.len() + new_seqs > cache.config.max_seqs
        || cache.cached_tokens + new_tokens > cache.config.max_cached_tokens
    {
        return Err(BackendError::InvalidInput(format!(
            "cache full: {} sequences / {} tokens cached, {new_seqs} / {new_tokens} more requested, \
             capacity {} / {}",
            cache.sequences.len(),
            cache.cached_tokens,
            cache.config.max_seqs,
            cache.config.max_cached_tokens
        )));
    }
    Ok(())
}
