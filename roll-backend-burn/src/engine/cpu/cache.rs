//! The paged key/value cache of the CPU decoder.
//!
//! Storage is a pool of fixed-size blocks of [`BLOCK_TOKENS`] positions, shared by all sequences;
//! each sequence owns a block table (the blocks holding its positions, in order) and a free list
//! hands blocks out and takes them back.
//!
//! Per layer, keys and values each live in one flat pool, laid out for the attention loop, which
//! walks a sequence's blocks in order and, within a block, its kv heads in order — so it reads
//! each block's keys (then values) front to back as one contiguous `kv_heads · 16 · head_dim` run:
//!
//! - keys `[block, kv_head, head_dim, slot]`: a block's 16 keys of one head, **transposed**, are
//!   one `head_dim × 16` tile, so the 16 scores of a block accumulate side by side in one pass
//!   over the head dimension (vectorised across positions, no horizontal sums);
//! - values `[block, kv_head, slot, head_dim]`: a block's 16 values of one head are 16 rows,
//!   added to the output row by row.
//!
//! Writes (one token, every kv head) are scattered instead, but a token is written once per layer
//! and read by every later token.

use super::super::backend::{CacheConfig, SeqId, StepInput};
use crate::{BackendError, Result};
use std::collections::{HashMap, HashSet};

/// Positions per cache block.
pub const BLOCK_TOKENS: usize = 16;

/// The cached positions of one sequence.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeqEntry {
    /// Blocks holding positions `16·i .. 16·(i+1)`.
    pub blocks: Vec<u32>,
    /// Positions cached.
    pub len: usize,
}

/// A paged key/value cache for [`CpuDecoder`](super::CpuDecoder).
///
/// Made by [`DecodeBackend::new_cache`](super::super::DecodeBackend::new_cache); holds
/// `ceil(max_cached_tokens / 16) + max_seqs` blocks, so that every sequence's partially filled
/// last block is covered and a reservation of `max_cached_tokens` never fails for want of blocks.
#[derive(Debug)]
pub struct CpuCache {
    pub(crate) layers: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) max_seqs: usize,
    pub(crate) num_blocks: usize,
    /// Per layer, keys `[block, kv_head, head_dim, slot]`.
    pub(crate) k: Vec<Vec<f32>>,
    /// Per layer, values `[block, kv_head, slot, head_dim]`.
    pub(crate) v: Vec<Vec<f32>>,
    /// Unused blocks (popped from the end).
    pub(crate) free: Vec<u32>,
    pub(crate) seqs: HashMap<SeqId, SeqEntry>,
}

/// What [`CpuCache::reserve`] changed: per input, its sequence, its block count before, and
/// whether the entry is new.
#[derive(Debug)]
pub(crate) struct Reservation {
    undo: Vec<(SeqId, usize, bool)>,
}

impl CpuCache {
    /// An empty cache for `layers` layers of `kv_heads × head_dim` keys and values.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if `config` is empty or the pools cannot be allocated.
    pub(crate) fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        config: &CacheConfig,
    ) -> Result<Self> {
        if config.max_seqs == 0 || config.max_cached_tokens == 0 {
            return Err(BackendError::InvalidInput(format!(
                "a cache needs room for at least one sequence and one token, got {config:?}"
            )));
        }
        let num_blocks = config
            .max_cached_tokens
            .div_ceil(BLOCK_TOKENS)
            .checked_add(config.max_seqs)
            .filter(|&n| u32::try_from(n).is_ok());
        let per_layer = num_blocks
            .and_then(|n| n.checked_mul(kv_heads * BLOCK_TOKENS * head_dim))
            .filter(|n| n.checked_mul(2 * layers * 4).is_some());
        let (Some(num_blocks), Some(per_layer)) = (num_blocks, per_layer) else {
            return Err(BackendError::InvalidInput(format!(
                "a cache of {config:?} is too large to address"
            )));
        };
        let pool = || -> Result<Vec<f32>> {
            let mut v = Vec::new();
            v.try_reserve_exact(per_layer).map_err(|e| {
                BackendError::InvalidInput(format!(
                    "cannot allocate a key/value cache of {} MiB per layer for {config:?}: {e}",
                    (per_layer * 4) >> 20
                ))
            })?;
            v.resize(per_layer, 0.0);
            Ok(v)
        };
        let mut k = Vec::with_capacity(layers);
        let mut v = Vec::with_capacity(layers);
        for _ in 0..layers {
            k.push(pool()?);
            v.push(pool()?);
        }
        // Reversed so that blocks are handed out in increasing order.
        let free = (0..num_blocks as u32).rev().collect();
        Ok(Self {
            layers,
            kv_heads,
            head_dim,
            max_seqs: config.max_seqs,
            num_blocks,
            k,
            v,
            free,
            seqs: HashMap::new(),
        })
    }

    /// Positions cached for `seq` (0 if it has none).
    pub fn cached_len(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |e| e.len)
    }

    /// Sequences holding cache entries.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Blocks not held by any sequence.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Forgets `seq`'s positions from `len` on (keeping the first `len`) and frees the blocks that
    /// no longer hold any; the next forward of `seq` starts at `len`. Nothing happens if `seq`
    /// holds `len` positions or fewer. Useful to roll back tokens (and to benchmark a decode step
    /// at a fixed context length).
    pub fn truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(e) = self.seqs.get_mut(&seq)
            && len < e.len
        {
            e.len = len;
            let keep = len.div_ceil(BLOCK_TOKENS);
            let extra: Vec<u32> = e.blocks.drain(keep..).collect();
            self.free.extend(extra.into_iter().rev());
        }
    }

    /// Frees `seq`'s blocks (nothing if it has none).
    pub(crate) fn release(&mut self, seq: SeqId) {
        if let Some(entry) = self.seqs.remove(&seq) {
            self.free.extend(entry.blocks.into_iter().rev());
        }
    }

    /// Checks `inputs` against the cache and reserves the blocks their new positions need, all or
    /// nothing. Lengths are not advanced: [`CpuCache::commit`] does that once the keys and values
    /// are written, [`CpuCache::rollback`] undoes the reservation.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`], naming the sequence, if an input is empty, a sequence
    /// appears twice, `start` is not the sequence's cached length, there would be more than
    /// `max_seqs` sequences, or the pool lacks blocks.
    pub(crate) fn reserve(&mut self, inputs: &[StepInput<'_>]) -> Result<Reservation> {
        let mut seen = HashSet::with_capacity(inputs.len());
        let mut new_seqs = 0usize;
        let mut needed = 0usize;
        for input in inputs {
            let seq = input.seq;
            if input.tokens.is_empty() {
                return Err(BackendError::InvalidInput(format!(
                    "sequence {seq:?}: no tokens to append"
                )));
            }
            if !seen.insert(seq) {
                return Err(BackendError::InvalidInput(format!(
                    "sequence {seq:?} appears twice in one forward call"
                )));
            }
            let (len, have) = match self.seqs.get(&seq) {
                Some(e) => (e.len, e.blocks.len()),
                None => {
                    new_seqs += 1;
                    (0, 0)
                }
            };
            if input.start != len {
                return Err(BackendError::InvalidInput(format!(
                    "sequence {seq:?}: start {} but the cache holds {len} positions",
                    input.start
                )));
            }
            let end = len.checked_add(input.tokens.len()).ok_or_else(|| {
                BackendError::InvalidInput(format!("sequence {seq:?}: length overflows"))
            })?;
            needed += end.div_ceil(BLOCK_TOKENS).saturating_sub(have);
        }
        if self.seqs.len() + new_seqs > self.max_seqs {
            return Err(BackendError::InvalidInput(format!(
                "cache full: {} sequences cached and {new_seqs} new ones exceed max_seqs {}",
                self.seqs.len(),
                self.max_seqs
            )));
        }
        if needed > self.free.len() {
            return Err(BackendError::InvalidInput(format!(
                "cache full: this step needs {needed} blocks of {BLOCK_TOKENS} tokens, {} are free \
                 (sequences {:?})",
                self.free.len(),
                inputs.iter().map(|i| i.seq).collect::<Vec<_>>()
            )));
        }
        let mut undo = Vec::with_capacity(inputs.len());
        for input in inputs {
            let entry = self.seqs.entry(input.seq);
            let is_new = matches!(entry, std::collections::hash_map::Entry::Vacant(_));
            let entry = entry.or_default();
            undo.push((input.seq, entry.blocks.len(), is_new));
            let want = (input.start + input.tokens.len()).div_ceil(BLOCK_TOKENS);
            while entry.blocks.len() < want {
                // Cannot fail: `needed <= free.len()` was checked above.
                if let Some(b) = self.free.pop() {
                    entry.blocks.push(b);
                }
            }
        }
        Ok(Reservation { undo })
    }

    /// Advances each input's sequence length past its tokens (after a successful forward).
    pub(crate) fn commit(&mut self, inputs: &[StepInput<'_>]) {
        for input in inputs {
            if let Some(e) = self.seqs.get_mut(&input.seq) {
                e.len = input.start + input.tokens.len();
            }
        }
    }

    /// Undoes a [`CpuCache::reserve`]: gives back the blocks it took and forgets sequences it
    /// created.
    pub(crate) fn rollback(&mut self, reservation: Reservation) {
        for (seq, blocks, is_new) in reservation.undo.into_iter().rev() {
            if is_new {
                self.release(seq);
            } else if let Some(e) = self.seqs.get_mut(&seq) {
                let extra: Vec<u32> = e.blocks.drain(blocks..).collect();
                self.free.extend(extra.into_iter().rev());
            }
        }
    }

    /// Stores the key and value of kv head `g` at position `pos` of a sequence with block table
    /// `blocks`, in `layer`.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        blocks: &[u32],
        pos: usize,
        g: usize,
        key: &[f32],
        value: &[f32],
    ) {
        let d = self.head_dim;
        let block = blocks[pos / BLOCK_TOKENS] as usize;
        let slot = pos % BLOCK_TOKENS;
        let tile = (block * self.kv_heads + g) * d * BLOCK_TOKENS;
        let k = &mut self.k[layer][tile..tile + d * BLOCK_TOKENS];
        for (dst, &x) in k.iter_mut().skip(slot).step_by(BLOCK_TOKENS).zip(key) {
            *dst = x;
        }
        let row = tile + slot * d;
        self.v[layer][row..row + d].copy_from_slice(value);
    }
}
