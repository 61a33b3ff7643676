//! The paged key/value cache of the CPU decoder.
//!
//! Storage is a pool of fixed-size blocks of [`BLOCK_TOKENS`] positions, shared by all sequences
//! (the block tables are [`PagedBlocks`]). Per layer, keys and values each live in one flat pool,
//! laid out for the attention loop, which walks a sequence's blocks in order and, within a block, its kv heads in order — so it reads
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

use super::super::backend::CacheConfig;
pub use super::super::paged::BLOCK_TOKENS;
use super::super::paged::{CacheShape, PagedBlocks, PagedCache};
use crate::{BackendError, Result};

/// A paged key/value cache for [`CpuDecoder`](super::CpuDecoder).
///
/// Made by [`DecodeBackend::new_cache`](super::super::DecodeBackend::new_cache); its blocks (see
/// [`PagedBlocks`]) are `ceil(max_cached_tokens / 16) + max_seqs`, so that every sequence's
/// partially filled last block is covered and a reservation of `max_cached_tokens` never fails
/// for want of blocks.
#[derive(Debug)]
pub struct CpuCache {
    pub(crate) shape: CacheShape,
    /// Which blocks each sequence holds.
    pub(crate) blocks: PagedBlocks,
    /// Per layer, keys `[block, kv_head, head_dim, slot]`.
    pub(crate) k: Vec<Vec<f32>>,
    /// Per layer, values `[block, kv_head, slot, head_dim]`.
    pub(crate) v: Vec<Vec<f32>>,
}

impl CpuCache {
    /// An empty cache of `shape`.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if `config` is empty or the pools cannot be allocated.
    pub(crate) fn new(shape: CacheShape, config: &CacheConfig) -> Result<Self> {
        let blocks = PagedBlocks::new(config)?;
        let per_layer = shape.pool_len(&blocks, config)?;
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
        let mut k = Vec::with_capacity(shape.layers);
        let mut v = Vec::with_capacity(shape.layers);
        for _ in 0..shape.layers {
            k.push(pool()?);
            v.push(pool()?);
        }
        Ok(Self {
            shape,
            blocks,
            k,
            v,
        })
    }

    /// An empty cache of `shape` for one forward (the training path's), its pools taken from
    /// the [`scratch`](super::scratch) buffers: a fresh allocation would fault in and zero every
    /// page again at each micro-batch. Give them back with [`CpuCache::recycle`].
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if `config` is empty.
    pub(crate) fn scratch(shape: CacheShape, config: &CacheConfig) -> Result<Self> {
        let blocks = PagedBlocks::new(config)?;
        let per_layer = shape.pool_len(&blocks, config)?;
        let pools = || {
            (0..shape.layers)
                .map(|_| super::scratch::zeroed(per_layer))
                .collect()
        };
        Ok(Self {
            shape,
            blocks,
            k: pools(),
            v: pools(),
        })
    }

    /// Gives the pools back to the [`scratch`](super::scratch) buffers.
    pub(crate) fn recycle(self) {
        self.k
            .into_iter()
            .chain(self.v)
            .for_each(super::scratch::recycle);
    }

    /// Which blocks each sequence holds.
    pub fn blocks(&self) -> &PagedBlocks {
        &self.blocks
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
        let d = self.shape.head_dim;
        let block = blocks[pos / BLOCK_TOKENS] as usize;
        let slot = pos % BLOCK_TOKENS;
        let tile = (block * self.shape.kv_heads + g) * d * BLOCK_TOKENS;
        let k = &mut self.k[layer][tile..tile + d * BLOCK_TOKENS];
        for (dst, &x) in k.iter_mut().skip(slot).step_by(BLOCK_TOKENS).zip(key) {
            *dst = x;
        }
        let row = tile + slot * d;
        self.v[layer][row..row + d].copy_from_slice(value);
    }

    /// Copies the keys and values of positions `0..len` of the sequence with block table `from`
    /// to the same positions of the one with table `to`, in `layer`: a sequence continuing a
    /// prompt that another one computes reads the same rows in the same slots, so its attention
    /// gives the bits it would give had it computed the prompt itself.
    pub(crate) fn copy_prefix(&mut self, layer: usize, from: &[u32], to: &[u32], len: usize) {
        let tile = self.shape.kv_heads * self.shape.head_dim * BLOCK_TOKENS;
        let d = self.shape.head_dim;
        for (b, (&src, &dst)) in from
            .iter()
            .zip(to)
            .take(len.div_ceil(BLOCK_TOKENS))
            .enumerate()
        {
            let slots = (len - b * BLOCK_TOKENS).min(BLOCK_TOKENS);
            let (src, dst) = (src as usize * tile, dst as usize * tile);
            if slots == BLOCK_TOKENS {
                self.k[layer].copy_within(src..src + tile, dst);
                self.v[layer].copy_within(src..src + tile, dst);
                continue;
            }
            // Keys are `[kv_head, head_dim, slot]` within a block, values `[kv_head, slot, dim]`.
            for row in 0..self.shape.kv_heads * d {
                let at = row * BLOCK_TOKENS;
                self.k[layer].copy_within(src + at..src + at + slots, dst + at);
            }
            for g in 0..self.shape.kv_heads {
                let at = g * BLOCK_TOKENS * d;
                self.v[layer].copy_within(src + at..src + at + slots * d, dst + at);
            }
        }
    }
}

impl PagedCache for CpuCache {
    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn blocks_mut(&mut self) -> &mut PagedBlocks {
        &mut self.blocks
    }
}
