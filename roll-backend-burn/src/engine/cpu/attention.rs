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

impl HeadShape {
    /// Query heads per key/value head: query head `j` reads kv head `j / group`.
    fn group(self) -> usize {
        self.heads / self.kv_heads
    }

    /// The scores' scale, `1/√head_dim`.
    fn scale(self) -> f32 {
        (self.head_dim as f32).powf(-0.5)
    }
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
        let (group, scale) = (shape.group(), shape.scale());
        let n_blocks = len.div_ceil(B);
        let blocks = &blocks[..n_blocks];
        // Scores `[heads, stride]` of a whole number of blocks; slots past `len` are never read.
        let stride = n_blocks * B;
        scores.clear();
        scores.resize(heads * stride, 0.0);
        // A head's scores over four blocks at a time: four 16-lane chains over the head
        // dimension side by side, where one chain alone would wait on each add's latency.
        let key_tile = |block: u32, g: usize| {
            let base = (block as usize * kv_heads + g) * d * B;
            &k_pool[base..base + d * B]
        };
        for j in 0..heads {
            let (qj, g) = (&q[j * d..(j + 1) * d], j / group);
            let row = &mut scores[j * stride..(j + 1) * stride];
            for (quad, out) in blocks.chunks(4).zip(row.chunks_mut(4 * B)) {
                let tile = |n: usize| key_tile(quad[n], g);
                match quad.len() {
                    4 => block_scores(qj, [tile(0), tile(1), tile(2), tile(3)], scale, out),
                    3 => block_scores(qj, [tile(0), tile(1), tile(2)], scale, out),
                    2 => block_scores(qj, [tile(0), tile(1)], scale, out),
                    _ => block_scores(qj, [tile(0)], scale, out),
                }
            }
        }
        for s in scores.chunks_exact_mut(stride) {
            let s = &mut s[..len];
            let max = max_of(s);
            for x in s.iter_mut() {
                *x = exp(*x - max);
            }
        }
        // Each head's sum over positions in order; eight heads' chains side by side.
        let mut sums = [0.0f32; 8];
        for h0 in (0..heads).step_by(8) {
            let sums = &mut sums[..8.min(heads - h0)];
            sums.fill(0.0);
            for p in 0..len {
                for (k, sum) in sums.iter_mut().enumerate() {
                    *sum += scores[(h0 + k) * stride + p];
                }
            }
            for (k, &sum) in sums.iter().enumerate() {
                let at = (h0 + k) * stride;
                for x in &mut scores[at..at + len] {
                    *x /= sum;
                }
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
                    // Thirty-two output elements at a time stay in registers across the block's
                    // positions (independent chains side by side), then eight.
                    let mut wide = or.chunks_exact_mut(32);
                    for (c, oc) in (&mut wide).enumerate() {
                        let mut acc = [0.0f32; 32];
                        acc.copy_from_slice(oc);
                        for (wp, vrow) in w.iter().zip(vb.chunks_exact(d)) {
                            for (a, v) in acc.iter_mut().zip(&vrow[c * 32..c * 32 + 32]) {
                                *a += wp * v;
                            }
                        }
                        oc.copy_from_slice(&acc);
                    }
                    let or = wide.into_remainder();
                    let w0 = d - or.len();
                    let mut chunks = or.chunks_exact_mut(8);
                    for (c, oc) in (&mut chunks).enumerate() {
                        let mut acc = [0.0f32; 8];
                        acc.copy_from_slice(oc);
                        for (wp, vrow) in w.iter().zip(vb.chunks_exact(d)) {
                            for (a, v) in acc.iter_mut().zip(&vrow[w0 + c * 8..w0 + c * 8 + 8]) {
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

/// The largest of `s` (NaNs skipped, as `f32::max` does), over sixteen lanes: a maximum does not
/// depend on the order it is taken in (the sign of a zero maximum may, and `exp(x − max)` is the
/// same for both), where a sum would.
#[inline(always)]
fn max_of(s: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = s.chunks_exact(16);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = m.max(x);
        }
    }
    for (m, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *m = m.max(x);
    }
    lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// `out[n·16 + p] = scale · Σ_i q[i]·tiles[n][i·16 + p]`, the sum over `i` in order: the
/// scores of a query head over `N` key blocks (each `[head_dim, 16]`), their chains side by side.
#[inline(always)]
fn block_scores<const N: usize>(q: &[f32], tiles: [&[f32]; N], scale: f32, out: &mut [f32]) {
    const B: usize = BLOCK_TOKENS;
    let mut acc = [[0.0f32; B]; N];
    for (i, &qi) in q.iter().enumerate() {
        for (a, tile) in acc.iter_mut().zip(&tiles) {
            for (a, k) in a.iter_mut().zip(&tile[i * B..(i + 1) * B]) {
                *a += qi * k;
            }
        }
    }
    for (o, a) in out.chunks_exact_mut(B).zip(acc) {
        for (s, a) in o.iter_mut().zip(a) {
            *s = a * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::uniform;

    /// The same arithmetic as [`attend`], one chain at a time: each score summed over the head
    /// dimension in order, each output element over positions in order.
    fn one_chain_at_a_time(
        shape: HeadShape,
        q: &[f32],
        k_pool: &[f32],
        v_pool: &[f32],
        blocks: &[u32],
        len: usize,
    ) -> Vec<f32> {
        const B: usize = BLOCK_TOKENS;
        let HeadShape {
            heads,
            kv_heads,
            head_dim: d,
        } = shape;
        let (group, scale) = (shape.group(), shape.scale());
        let mut out = vec![0.0f32; heads * d];
        for j in 0..heads {
            let g = j / group;
            let mut s = vec![0.0f32; len];
            for (p, s) in s.iter_mut().enumerate() {
                let base = (blocks[p / B] as usize * kv_heads + g) * d * B + p % B;
                let mut a = 0.0f32;
                for i in 0..d {
                    a += q[j * d + i] * k_pool[base + i * B];
                }
                *s = a * scale;
            }
            let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            for x in s.iter_mut() {
                *x = exp(*x - max);
            }
            let sum = s.iter().fold(0.0f32, |a, &x| a + x);
            for x in s.iter_mut() {
                *x /= sum;
            }
            for i in 0..d {
                let mut a = 0.0f32;
                for (p, w) in s.iter().enumerate() {
                    let base = ((blocks[p / B] as usize * kv_heads + g) * B + p % B) * d;
                    a += w * v_pool[base + i];
                }
                out[j * d + i] = a;
            }
        }
        out
    }

    #[test]
    fn side_by_side_chains_give_the_bits_of_one_chain_at_a_time() {
        for (heads, kv_heads, d) in [(4, 2, 32), (8, 4, 64), (2, 1, 6), (4, 4, 40), (3, 1, 72)] {
            let shape = HeadShape {
                heads,
                kv_heads,
                head_dim: d,
            };
            let mut rnd = uniform(heads as u64 * 100 + d as u64);
            let pool_blocks = 9;
            let pool = pool_blocks * kv_heads * BLOCK_TOKENS * d;
            let kp: Vec<f32> = (0..pool).map(|_| rnd()).collect();
            let vp: Vec<f32> = (0..pool).map(|_| rnd()).collect();
            let q: Vec<f32> = (0..heads * d).map(|_| 3.0 * rnd()).collect();
            let blocks = [7u32, 2, 0, 8, 5, 1, 4];
            for len in [1, 5, 16, 17, 33, 64, 65, 100, 112] {
                let mut out = vec![f32::NAN; heads * d];
                attend(shape, &q, &kp, &vp, &blocks, len, &mut Vec::new(), &mut out);
                let want = one_chain_at_a_time(shape, &q, &kp, &vp, &blocks, len);
                let same = out
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "heads {heads}/{kv_heads}, dim {d}, {len} positions");
            }
        }
    }

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
