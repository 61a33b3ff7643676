//! The analytic backward of causal grouped-query attention over packed sequences, from the
//! probabilities the CPU decoder's forward kept.
//!
//! Sequences sit end to end in one `[tokens, heads·d]` activation; each attends only within its
//! own bounds (varlen packing: no padding, no mask tensor). Per sequence and query head `h`
//! (key/value head `h / rep`): `S = q·kᵀ·s`, `P = softmax(S)` over `t ≤ i`, `O = P·v`. Backward:
//! `dP = dO·vᵀ`, `dS = P ⊙ (dP − rowsum(dP ⊙ P))`, `dq = s·dS·k`, `dk = s·dSᵀ·q`, `dv = Pᵀ·dO`.
//! One task per (sequence, key/value head) owns its `dk`/`dv` rows, so tasks never share output;
//! a sequence continuing another's prompt adds its share of the prompt's after all have run.

use super::model::PackedSeq;
use crate::engine::cpu::vectorized;
use rayon::prelude::*;

/// Head counts and width.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head width `d`.
    pub dim: usize,
}

impl Heads {
    fn rep(&self) -> usize {
        self.heads / self.kv_heads
    }
    fn scale(&self) -> f32 {
        (self.dim as f32).powf(-0.5)
    }
}

/// The (sequence, key/value head) pairs, sequence-major: one rayon task each.
fn tasks(seqs: usize, kv_heads: usize) -> Vec<(usize, usize)> {
    (0..seqs)
        .flat_map(|s| (0..kv_heads).map(move |j| (s, j)))
        .collect()
}

/// One token's attention probabilities, `[heads, position + 1]`, as the CPU decoder's forward
/// leaves them (see [`Recorder::attention`](crate::engine::cpu::Recorder::attention)).
pub(crate) type Probs = Vec<f32>;

/// `a·b` over [`DOT_LANES`] interleaved partial sums: independent chains the compiler keeps in
/// vector lanes (one serial chain of `d` additions waits on each add's latency). The order of
/// the backward's `dP` products, which [`dots`] computes eight at a time (the forward is the
/// decoder's, whose order the engine shares); the tests hold `dots` to it bit for bit.
#[cfg(test)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; DOT_LANES];
    let (ca, cb) = (a.chunks_exact(DOT_LANES), b.chunks_exact(DOT_LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, x), y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Partial sums of each `dP` dot product (see [`dots`]).
const DOT_LANES: usize = 8;

/// Columns of [`dots`] computed together: one AVX2 vector of f32.
const DOT_COLUMNS: usize = 8;

/// `out[t] = dot(a, column t of b_t)` for every `t < out.len()`, [`DOT_COLUMNS`] columns at a
/// time, where `b_t` is `[a.len(), stride]` (rows of `B` transposed, zero-padded to `stride`, a
/// multiple of [`DOT_COLUMNS`] at least `out.len()` rounded up to one). Each result is `dot`'s
/// chain of operations — lane `l`'s partial sum of `a[8c + l]·b[8c + l]` in order of `c`, the
/// lanes added in order, then the tail's sum — so the same bits; but the lanes' final additions,
/// which `dot` (the tests' specification) makes one after the other for each column, run here
/// across eight columns at once.
#[inline(always)]
fn dots(a: &[f32], b_t: &[f32], stride: usize, out: &mut [f32]) {
    let d = a.len();
    let whole = d - d % DOT_LANES;
    // The value `Iterator::sum` starts from, as `dot`'s sums do.
    let zero: f32 = std::iter::empty::<f32>().sum();
    for (t0, out) in (0..).step_by(DOT_COLUMNS).zip(out.chunks_mut(DOT_COLUMNS)) {
        let column = |e: usize| &b_t[e * stride + t0..][..DOT_COLUMNS];
        let mut acc = [[0.0f32; DOT_COLUMNS]; DOT_LANES];
        for c in (0..whole).step_by(DOT_LANES) {
            for (l, lane) in acc.iter_mut().enumerate() {
                let (x, col) = (a[c + l], column(c + l));
                for (s, &y) in lane.iter_mut().zip(col) {
                    *s += x * y;
                }
            }
        }
        let mut sum = [zero; DOT_COLUMNS];
        for lane in &acc {
            for (s, &v) in sum.iter_mut().zip(lane) {
                *s += v;
            }
        }
        let mut tail = [zero; DOT_COLUMNS];
        for (e, &x) in a.iter().enumerate().skip(whole) {
            for (s, &y) in tail.iter_mut().zip(column(e)) {
                *s += x * y;
            }
        }
        for ((o, s), t) in out.iter_mut().zip(sum).zip(tail) {
            *o = s + t;
        }
    }
}

/// The gradient of `q|k|v` (`[tokens, (heads + 2·kv_heads)·d]`, the layout of `qkv`, the
/// values attention read) from `dO` (`[tokens, heads·d]`).
///
/// A sequence continuing another ([`PackedSeq::after`]) attends to that one's rows first: its
/// keys `0..offset` are those rows, then its own. Its task computes the gradient of every key it
/// reads; what falls on the continued sequence's rows is added there after every task's own rows
/// are in place, in task order (a fixed order: the same bits on every run).
pub(crate) fn backward(
    qkv: &[f32],
    probs: &[Probs],
    d_out: &[f32],
    seqs: &[PackedSeq],
    shape: Heads,
) -> Vec<f32> {
    let Heads {
        heads,
        kv_heads,
        dim: d,
    } = shape;
    let (rep, scale) = (shape.rep(), shape.scale());
    let width = (heads + 2 * kv_heads) * d;
    let (k_at, v_at) = (heads * d, (heads + kv_heads) * d);
    // Per sequence, where its keys before its own rows lie: `(first row, count)`.
    let prefix = |s: usize| -> (usize, usize) {
        let seq = seqs[s];
        seq.after.map_or((0, 0), |p| (seqs[p].start, seq.offset))
    };
    let tasks = tasks(seqs.len(), kv_heads);
    let parts: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = tasks
        .par_iter()
        .map(|&(s, j)| {
            // Compiled with the widest vector instructions the CPU has (element-wise loops and
            // sums in a fixed order: the same bits on every CPU).
            vectorized!(|| {
                let PackedSeq { start, len, .. } = seqs[s];
                let (before_at, before) = prefix(s);
                let keys = before + len;
                let key_row = |t: usize| {
                    if t < before {
                        before_at + t
                    } else {
                        start + t - before
                    }
                };
                let mut dq = vec![0.0f32; rep * len * d];
                let mut dk = vec![0.0f32; keys * d];
                let mut dv = vec![0.0f32; keys * d];
                let krow = |t: usize| &qkv[key_row(t) * width + k_at + j * d..][..d];
                // The values transposed, `[d, stride]`, for `dP = dO·vᵀ` eight positions at a time.
                let stride = keys.next_multiple_of(DOT_COLUMNS);
                let mut v_t = vec![0.0f32; d * stride];
                for t in 0..keys {
                    let v = &qkv[key_row(t) * width + v_at + j * d..][..d];
                    for (e, &x) in v.iter().enumerate() {
                        v_t[e * stride + t] = x;
                    }
                }
                let mut ds = vec![0.0f32; stride];
                for r in 0..rep {
                    let h = j * rep + r;
                    for i in 0..len {
                        // The query's position: the keys it reads are `0..=at`.
                        let at = before + i;
                        let qi = &qkv[(start + i) * width + h * d..][..d];
                        let doi = &d_out[(start + i) * heads * d + h * d..][..d];
                        let p = &probs[start + i][h * (at + 1)..][..=at];
                        dots(doi, &v_t, stride, &mut ds[..=at]);
                        let mut sum = 0.0f32;
                        for (&x, &pt) in ds.iter().zip(p) {
                            sum += x * pt;
                        }
                        let dqi = &mut dq[(r * len + i) * d..][..d];
                        for t in 0..=at {
                            let g = p[t] * (ds[t] - sum) * scale;
                            for (a, &b) in dqi.iter_mut().zip(krow(t)) {
                                *a += g * b;
                            }
                            for (a, &b) in dk[t * d..][..d].iter_mut().zip(qi) {
                                *a += g * b;
                            }
                            for (a, &b) in dv[t * d..][..d].iter_mut().zip(doi) {
                                *a += p[t] * b;
                            }
                        }
                    }
                }
                (dq, dk, dv)
            })
        })
        .collect();
    let mut dqkv = crate::engine::cpu::scratch::zeroed(qkv.len());
    for (&(s, j), (tq, tk, tv)) in tasks.iter().zip(&parts) {
        let PackedSeq { start, len, .. } = seqs[s];
        let before = prefix(s).1;
        for i in 0..len {
            let row = &mut dqkv[(start + i) * width..][..width];
            for r in 0..rep {
                let h = j * rep + r;
                row[h * d..][..d].copy_from_slice(&tq[(r * len + i) * d..][..d]);
            }
            row[k_at + j * d..][..d].copy_from_slice(&tk[(before + i) * d..][..d]);
            row[v_at + j * d..][..d].copy_from_slice(&tv[(before + i) * d..][..d]);
        }
    }
    for (&(s, j), (_, tk, tv)) in tasks.iter().zip(&parts) {
        let (before_at, before) = prefix(s);
        for t in 0..before {
            let row = &mut dqkv[(before_at + t) * width..][..width];
            for (a, &b) in row[k_at + j * d..][..d].iter_mut().zip(&tk[t * d..][..d]) {
                *a += b;
            }
            for (a, &b) in row[v_at + j * d..][..d].iter_mut().zip(&tv[t * d..][..d]) {
                *a += b;
            }
        }
    }
    dqkv
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::fused::model::Packed;
    use crate::train::fused::testing::{check_gradient, random};

    /// The packed rows sequence `s` attends to, in key order: those of the sequence it
    /// continues, then its own.
    fn key_rows(seqs: &[PackedSeq], s: usize) -> Vec<usize> {
        let seq = seqs[s];
        let before = seq.after.map(|p| seqs[p].start..seqs[p].start + seq.offset);
        before
            .into_iter()
            .flatten()
            .chain(seq.start..seq.start + seq.len)
            .collect()
    }

    /// Textbook causal attention over packed sequences: the output `[tokens, heads·d]` and each
    /// token's probabilities in the decoder's layout.
    fn forward(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        seqs: &[PackedSeq],
        shape: Heads,
    ) -> (Vec<f32>, Vec<Probs>) {
        let Heads {
            heads,
            kv_heads,
            dim: d,
        } = shape;
        let mut out = vec![0.0f32; q.len()];
        let mut probs = vec![Vec::new(); q.len() / (heads * d)];
        for (s, seq) in seqs.iter().enumerate() {
            let rows = key_rows(seqs, s);
            let before = rows.len() - seq.len;
            for i in 0..seq.len {
                let (token, at) = (seq.start + i, before + i);
                let mut token_probs = Vec::with_capacity(heads * (at + 1));
                for h in 0..heads {
                    let j = h / shape.rep();
                    let qi = &q[token * heads * d + h * d..][..d];
                    let row =
                        |m: &[f32], t: usize| m[rows[t] * kv_heads * d + j * d..][..d].to_vec();
                    let s: Vec<f32> = (0..=at)
                        .map(|t| dot(qi, &row(k, t)) * shape.scale())
                        .collect();
                    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
                    let z: f32 = e.iter().sum();
                    for (t, e) in e.iter().enumerate() {
                        let p = e / z;
                        token_probs.push(p);
                        for (o, vv) in out[token * heads * d + h * d..][..d]
                            .iter_mut()
                            .zip(row(v, t))
                        {
                            *o += p * vv;
                        }
                    }
                }
                probs[token] = token_probs;
            }
        }
        (out, probs)
    }

    /// The backward against finite differences of `Σ w ⊙ O` for the sequences of `packed` (4
    /// query heads on 2 key/value heads of width 4).
    fn check_backward(packed: &Packed) {
        let seqs = &packed.seqs;
        let shape = Heads {
            heads: 4,
            kv_heads: 2,
            dim: 4,
        };
        let n = packed.tokens.len();
        let q = random(n * 16, 9);
        let k = random(n * 8, 10);
        let v = random(n * 8, 11);
        let w = random(n * 16, 12);
        let loss = |q: &[f32], k: &[f32], v: &[f32]| -> f64 {
            let (o, _) = forward(q, k, v, seqs, shape);
            o.iter().zip(&w).map(|(a, b)| f64::from(a * b)).sum()
        };
        let (_, probs) = forward(&q, &k, &v, seqs, shape);
        // `q|k|v` per token, as the decoder's projection leaves them, and back.
        let joined: Vec<f32> = (0..n)
            .flat_map(|t| [&q[t * 16..][..16], &k[t * 8..][..8], &v[t * 8..][..8]].concat())
            .collect();
        let split = |qkv: &[f32]| -> [Vec<f32>; 3] {
            let rows = || qkv.chunks_exact(32);
            [
                rows().flat_map(|r| &r[..16]).copied().collect(),
                rows().flat_map(|r| &r[16..24]).copied().collect(),
                rows().flat_map(|r| &r[24..]).copied().collect(),
            ]
        };
        let dqkv = backward(&joined, &probs, &w, seqs, shape);
        check_gradient(&joined, &dqkv, |qkv| {
            let [q, k, v] = split(qkv);
            loss(&q, &k, &v)
        });
    }

    /// `dots` is `dot` column by column, bit for bit: widths below, at and off the lane count,
    /// column counts below, at and off a block of eight, values of mixed signs and magnitudes.
    #[test]
    fn dots_are_dot_bit_for_bit() {
        for (d, n) in [
            (3usize, 5usize),
            (8, 8),
            (12, 13),
            (32, 17),
            (64, 1),
            (37, 24),
        ] {
            let stride = n.next_multiple_of(DOT_COLUMNS);
            let a: Vec<f32> = random(d, 31).iter().map(|x| x * 1e3).collect();
            let rows = random(n * d, 32);
            let mut b_t = vec![0.0f32; d * stride];
            for t in 0..n {
                for e in 0..d {
                    b_t[e * stride + t] = rows[t * d + e] * (1.0 + e as f32);
                }
            }
            let mut out = vec![0.0f32; n];
            dots(&a, &b_t, stride, &mut out);
            for (t, &got) in out.iter().enumerate() {
                let row: Vec<f32> = (0..d).map(|e| b_t[e * stride + t]).collect();
                assert_eq!(
                    got.to_bits(),
                    dot(&a, &row).to_bits(),
                    "d {d}, column {t} of {n}"
                );
            }
        }
    }

    /// Sequences of `lens` tokens packed end to end.
    fn packed(lens: &[usize]) -> Packed {
        let mut p = Packed::default();
        for &len in lens {
            p.push(&vec![0; len], 1);
        }
        p
    }

    #[test]
    fn backward_matches_finite_differences_on_two_packed_sequences() {
        check_backward(&packed(&[3, 2]));
    }

    /// Longer sequences: the probabilities of a row reach past a vector's width, and a key's
    /// gradient gathers many queries.
    #[test]
    fn backward_matches_finite_differences_on_longer_sequences() {
        check_backward(&packed(&[23, 17]));
    }

    /// Prompts shared by continuations (a GRPO group's layout): the prompt's keys gather the
    /// gradients of its own queries and of every continuation's, which reach past a vector's
    /// width; a sequence continuing nothing sits between them.
    #[test]
    fn backward_matches_finite_differences_with_shared_prompts() {
        let mut p = packed(&[5]);
        p.push_after(0, &[0; 3], 1).unwrap();
        p.push(&[0; 4], 1);
        p.push_after(0, &[0; 9], 1).unwrap();
        let long = p.push(&[0; 11], 1);
        p.push_after(long, &[0; 2], 1).unwrap();
        assert_eq!(p.push_after(1, &[0; 2], 1), None, "one level deep");
        assert_eq!(p.seqs[5].offset, 11);
        check_backward(&p);
    }
}
