//! The bookkeeping of a paged key/value cache, shared by the decoders that page: which blocks of
//! [`BLOCK_TOKENS`] positions each sequence holds, and which are free.
//!
//! Storage is a pool of fixed-size blocks shared by all sequences; each sequence owns a block
//! table (the blocks holding its positions, in order) and a free list hands blocks out and takes
//! them back. Where the keys and values of a block live, and in which layout, is each decoder's
//! own business ([`CpuCache`](super::cpu::CpuCache) keeps them in host memory laid out for its
//! attention loop, [`DeviceCache`](super::device_decoder::DeviceCache) in device tensors); block
//! `b`'s position `p` is pool row `b · BLOCK_TOKENS + p mod BLOCK_TOKENS` in both.

use super::backend::{CacheConfig, SeqId, StepInput};
use crate::{BackendError, Result};
use std::collections::{HashMap, HashSet};

/// Positions per cache block.
pub const BLOCK_TOKENS: usize = 16;

/// What a paged cache is shaped for: layers × key/value heads × head width. A cache serves the
/// weights of any model of its shape (new weights continue sequences cached by old ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheShape {
    /// Decoder layers.
    pub layers: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
}

impl std::fmt::Display for CacheShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} layers × {} kv heads × {} head_dim",
            self.layers, self.kv_heads, self.head_dim
        )
    }
}

impl CacheShape {
    /// f32 elements of one layer's key (or value) pool over `blocks`, checked so that every
    /// pool of the cache together stays addressable in bytes.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] naming `config` if it does not.
    pub(crate) fn pool_len(&self, blocks: &PagedBlocks, config: &CacheConfig) -> Result<usize> {
        blocks
            .total_blocks()
            .checked_mul(BLOCK_TOKENS * self.kv_heads * self.head_dim)
            .filter(|n| n.checked_mul(2 * self.layers * 4).is_some())
            .ok_or_else(|| {
                BackendError::InvalidInput(format!("a cache of {config:?} is too large to address"))
            })
    }
}

/// A cache whose positions are paged by [`PagedBlocks`], for [`checked_step`].
pub(crate) trait PagedCache {
    /// What the cache is shaped for.
    fn shape(&self) -> CacheShape;
    /// Its block tables.
    fn blocks_mut(&mut self) -> &mut PagedBlocks;
}

/// The checks and bookkeeping around one forward call of a paged decoder, the same for all of
/// them: refuses a cache of another shape than `model` and token ids outside `vocab`, reserves
/// the blocks the inputs need, runs `run`, and commits the new positions if it succeeds — or
/// gives the reservation back (rows written past a sequence's committed length are never read).
///
/// # Errors
/// [`BackendError::InvalidInput`] for a cache of another shape or one without room (see
/// [`PagedBlocks::reserve`]), [`BackendError::TokenOutOfVocab`], or `run`'s error.
pub(crate) fn checked_step<C: PagedCache, T>(
    cache: &mut C,
    model: CacheShape,
    vocab: usize,
    inputs: &[StepInput<'_>],
    run: impl FnOnce(&mut C) -> Result<T>,
) -> Result<T> {
    if cache.shape() != model {
        return Err(BackendError::InvalidInput(format!(
            "cache made for {}, model has {model}",
            cache.shape()
        )));
    }
    for input in inputs {
        if let Some(&id) = input.tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(BackendError::TokenOutOfVocab {
                id,
                vocab_size: vocab,
            });
        }
    }
    let reservation = cache.blocks_mut().reserve(inputs)?;
    match run(cache) {
        Ok(out) => {
            cache.blocks_mut().commit(inputs);
            Ok(out)
        }
        Err(e) => {
            cache.blocks_mut().rollback(reservation);
            Err(e)
        }
    }
}

/// The cached positions of one sequence.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeqEntry {
    /// Blocks holding positions `16·i .. 16·(i+1)`.
    pub blocks: Vec<u32>,
    /// Positions cached.
    pub len: usize,
}

/// Which blocks of a paged cache each sequence holds.
///
/// Holds `ceil(max_cached_tokens / 16) + max_seqs` blocks, so that every sequence's partially
/// filled last block is covered and a reservation of `max_cached_tokens` never fails for want of
/// blocks.
#[derive(Debug)]
pub struct PagedBlocks {
    max_seqs: usize,
    num_blocks: usize,
    /// Unused blocks (popped from the end).
    free: Vec<u32>,
    seqs: HashMap<SeqId, SeqEntry>,
}

/// What [`PagedBlocks::reserve`] changed: per input, its sequence, its block count before, and
/// whether the entry is new.
#[derive(Debug)]
pub(crate) struct Reservation {
    undo: Vec<(SeqId, usize, bool)>,
}

impl PagedBlocks {
    /// Blocks for `config`, all free.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if `config` is empty or too large to address.
    pub(crate) fn new(config: &CacheConfig) -> Result<Self> {
        if config.max_seqs == 0 || config.max_cached_tokens == 0 {
            return Err(BackendError::InvalidInput(format!(
                "a cache needs room for at least one sequence and one token, got {config:?}"
            )));
        }
        let num_blocks = config
            .max_cached_tokens
            .div_ceil(BLOCK_TOKENS)
            .checked_add(config.max_seqs)
            .filter(|&n| u32::try_from(n).is_ok())
            .ok_or_else(|| {
                BackendError::InvalidInput(format!("a cache of {config:?} is too large to address"))
            })?;
        Ok(Self {
            max_seqs: config.max_seqs,
            num_blocks,
            // Reversed so that blocks are handed out in increasing order.
            free: (0..num_blocks as u32).rev().collect(),
            seqs: HashMap::new(),
        })
    }

    /// The blocks holding `seq`'s positions, in order (`None` if it has none).
    pub(crate) fn table(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|e| e.blocks.as_slice())
    }

    /// The pool row of each of `seq`'s first `len` positions (see the [module docs](self)).
    pub(crate) fn rows(&self, seq: SeqId, len: usize) -> Option<Vec<usize>> {
        let table = self.table(seq)?;
        (0..len)
            .map(|p| {
                table
                    .get(p / BLOCK_TOKENS)
                    .map(|&b| b as usize * BLOCK_TOKENS + p % BLOCK_TOKENS)
            })
            .collect()
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
    pub(crate) fn truncate(&mut self, seq: SeqId, len: usize) {
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

    /// Makes `seq` a new entry that already holds `len` positions, on fresh blocks whose rows its
    /// decoder fills itself: a sequence that continues a prompt another sequence of the same
    /// forward computes, its keys and values copied from that one's (see
    /// [`CpuDecoder::forward_recorded`](super::cpu::CpuDecoder::forward_recorded)).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`], naming the sequence, if it already has an entry, or the
    /// cache has no room for one more sequence or for its blocks.
    pub(crate) fn start_at(&mut self, seq: SeqId, len: usize) -> Result<()> {
        if self.seqs.contains_key(&seq) {
            return Err(BackendError::InvalidInput(format!(
                "sequence {seq:?} already has a cache entry"
            )));
        }
        if self.seqs.len() >= self.max_seqs {
            return Err(BackendError::InvalidInput(format!(
                "cache full: sequence {seq:?} exceeds max_seqs {}",
                self.max_seqs
            )));
        }
        let needed = len.div_ceil(BLOCK_TOKENS);
        if needed > self.free.len() {
            return Err(BackendError::InvalidInput(format!(
                "cache full: sequence {seq:?} needs {needed} blocks of {BLOCK_TOKENS} tokens, {} \
                 are free",
                self.free.len()
            )));
        }
        let blocks = self.free.split_off(self.free.len() - needed);
        self.seqs.insert(
            seq,
            SeqEntry {
                blocks: blocks.into_iter().rev().collect(),
                len,
            },
        );
        Ok(())
    }

    /// Checks `inputs` against the cache and reserves the blocks their new positions need, all or
    /// nothing. Lengths are not advanced: [`PagedBlocks::commit`] does that once the keys and values
    /// are written, [`PagedBlocks::rollback`] undoes the reservation.
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

    /// Undoes a [`PagedBlocks::reserve`]: gives back the blocks it took and forgets sequences it
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
}
