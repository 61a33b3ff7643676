//! Causal grouped-query attention of one token over its sequence's paged key/value cache.

use super::cache::BLOCK_TOKENS;
use super::exp::exp;
use super::vectorized;

/// Head counts and widths of one attention layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
}

/// Causal attention of one query token over positions `0..len` of its sequence.
///
/// - `q`: the token's queries `[heads, head_dim]`, already normed and rotated;
/// - `k_pool`: one layer's keys, `[blocks, kv_heads, head_dim, BLOCK_TOKENS]` (a block's keys
///   transposed, so the scores of a block's 16 positions accumulate side by side);
/// - `v_pool`: one layer's values, `[blocks, kv_heads, BLOCK_TOKENS, head_dim]`;
/// - `blocks`: the sequence's block table (position `p` lives in `blocks[p / BLOCK_TOKENS]`);
/// - `scores`: scratch, resized here;
/// - `out`: `[heads, head_dim]`, overwritten.
///
/// Query head `j` reads kv head `j / (heads / kv_heads)`. Each score sums over the head dimension
/// in order, the softmax sum and each output element over positions in order.
///
/// Runs with the widest vector instructions this CPU has (AVX-512, else AVX2, else the build's
/// baseline): the loops are element-wise across positions and head dimensions, each lane the same
/// sequence of roundings as a scalar one (Rust neither fuses a multiply and an add nor reorders a
/// sum on its own), so the bits do not depend on which runs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    shape: HeadShape,
    q: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    blocks: &[u32],
    len: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    // Compiled with the widest vector instructions the CPU has (see `vectorized!`).
    vectorized!(|| {
        const B: usize = BLOCK_TOKENS;
        let HeadShape {
            heads,
            kv_heads,
            head_dim: d,
        } = shape;
        let group = heads / kv_heads;
        let scale = (d as f32).powf(-0.5);
        let n_blocks = len.div_ceil(B);
        let blocks = &blocks[..n_blocks];
        // Scores `[heads, stride]` of a whole number of blocks; slots past `len` are never read.
        let stride = n_blocks * B;
        scores.clear();
        scores.resize(heads * stride, 0.0);
        // Blocks outer, heads inner: a block's keys (then values) of all heads are one contiguous
        // `kv_heads · 16 · head_dim` run, read front to back.
        for (b, &block) in blocks.iter().enumerate() {
            let base = block as usize * kv_heads * d * B;
            let tiles = k_pool[base..base + kv_heads * d * B].chunks_exact(d * B);
            for (g, kt) in tiles.enumerate() {
                for r in 0..group {
                    let j = g * group + r;
                    let mut acc = [0.0f32; B];
                    for (qi, krow) in q[j * d..(j + 1) * d].iter().zip(kt.chunks_exact(B)) {
                        for (a, k) in acc.iter_mut().zip(krow) {
                            *a += qi * k;
                        }
                    }
                    let s = &mut scores[j * stride + b * B..j * stride + (b + 1) * B];
                    for (s, a) in s.iter_mut().zip(acc) {
                        *s = a * scale;
                    }
                }
            }
        }
        for s in scores.chunks_exact_mut(stride) {
            let s = &mut s[..len];
            let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            for x in s.iter_mut() {
                *x = exp(*x - max);
            }
            let sum = s.iter().fold(0.0f32, |a, &x| a + x);
            for x in s.iter_mut() {
                *x /= sum;
            }
        }
        out.fill(0.0);
        for (b, &block) in blocks.iter().enumerate() {
            let valid = B.min(len - b * B);
            let base = block as usize * kv_heads * B * d;
            let tiles = v_pool[base..base + kv_heads * B * d].chunks_exact(B * d);
            for (g, vt) in tiles.enumerate() {
                let vb = &vt[..valid * d];
                for r in 0..group {
                    let j = g * group + r;
                    let w = &scores[j * stride + b * B..j * stride + b * B + valid];
                    let or = &mut out[j * d..(j + 1) * d];
                    // Eight output elements at a time stay in registers across the block's positions.
                    let mut chunks = or.chunks_exact_mut(8);
                    for (c, oc) in (&mut chunks).enumerate() {
                        let mut acc = [0.0f32; 8];
                        acc.copy_from_slice(oc);
                        for (wp, vrow) in w.iter().zip(vb.chunks_exact(d)) {
                            for (a, v) in acc.iter_mut().zip(&vrow[c * 8..c * 8 + 8]) {
                                *a += wp * v;
                            }
                        }
                        oc.copy_from_slice(&acc);
                    }
                    let tail = chunks.into_remainder();
                    let t0 = d - tail.len();
                    for (wp, vrow) in w.iter().zip(vb.chunks_exact(d)) {
                        for (a, v) in tail.iter_mut().zip(&vrow[t0..]) {
                            *a += wp * v;
                        }
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::uniform;

    #[test]
    fn attention_matches_a_naive_softmax() {
        let shape = HeadShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 6,
        };
        let (h, kvh, d, len) = (4, 2, 6, 37);
        let blocks = [5u32, 0, 3];
        let mut rnd = uniform(11);
        let keys: Vec<f32> = (0..len * kvh * d).map(|_| rnd()).collect(); // [pos, kvh, d]
        let values: Vec<f32> = (0..len * kvh * d).map(|_| rnd()).collect();
        let q: Vec<f32> = (0..h * d).map(|_| rnd()).collect();
        let pool = 6 * kvh * BLOCK_TOKENS * d;
        let (mut kp, mut vp) = (vec![0.0; pool], vec![0.0; pool]);
        for p in 0..len {
            let block = blocks[p / BLOCK_TOKENS] as usize;
            let slot = p % BLOCK_TOKENS;
            for g in 0..kvh {
                for i in 0..d {
                    let src = (p * kvh + g) * d + i;
                    kp[((block * kvh + g) * d + i) * BLOCK_TOKENS + slot] = keys[src];
                    vp[((block * kvh + g) * BLOCK_TOKENS + slot) * d + i] = values[src];
                }
            }
        }
        let mut out = vec![0.0; h * d];
        attend(shape, &q, &kp, &vp, &blocks, len, &mut Vec::new(), &mut out);
        for j in 0..h {
            let g = j / (h / kvh);
            let qj = &q[j * d..(j + 1) * d];
            let s: Vec<f32> = (0..len)
                .map(|p| {
                    let k = &keys[(p * kvh + g) * d..(p * kvh + g + 1) * d];
                    qj.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() / (d as f32).sqrt()
                })
                .collect();
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
            let z: f32 = e.iter().sum();
            for i in 0..d {
                let want: f32 = (0..len)
                    .map(|p| e[p] / z * values[(p * kvh + g) * d + i])
                    .sum();
                assert!((out[j * d + i] - want).abs() < 1e-5, "head {j} dim {i}");
            }
        }
    }
}
