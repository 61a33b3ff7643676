//! Causal grouped-query attention over packed sequences: forward keeping the probabilities, and
//! the analytic backward.
//!
//! Sequences sit end to end in one `[tokens, heads·d]` activation; each attends only within its
//! own bounds (varlen packing: no padding, no mask tensor). Per sequence and query head `h`
//! (key/value head `h / rep`): `S = q·kᵀ·s`, `P = softmax(S)` over `t ≤ i`, `O = P·v`. Backward:
//! `dP = dO·vᵀ`, `dS = P ⊙ (dP − rowsum(dP ⊙ P))`, `dq = s·dS·k`, `dk = s·dSᵀ·q`, `dv = Pᵀ·dO`.
//! One task per (sequence, key/value head) owns its `dk`/`dv` rows, so tasks never share output.

use crate::engine::cpu::exp::exp;
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

/// The (sequence, key/value head) pairs, sequence-major: one rayon task each, in the order the
/// forward's probabilities are kept and the backward reads them.
fn tasks(seqs: usize, kv_heads: usize) -> Vec<(usize, usize)> {
    (0..seqs)
        .flat_map(|s| (0..kv_heads).map(move |j| (s, j)))
        .collect()
}

/// The probabilities of one (sequence, key/value head) task: `[rep, T, T]`, zero above the
/// diagonal.
pub(crate) type Probs = Vec<f32>;

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `O` (`[tokens, heads·d]`) and the probabilities of every task (sequence-major).
pub(crate) fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seqs: &[(usize, usize)],
    shape: Heads,
) -> (Vec<f32>, Vec<Probs>) {
    let Heads {
        heads,
        kv_heads,
        dim: d,
    } = shape;
    let (rep, scale) = (shape.rep(), shape.scale());
    let tasks = tasks(seqs.len(), kv_heads);
    let parts: Vec<(Vec<f32>, Probs)> = tasks
        .par_iter()
        .map(|&(s, j)| {
            let (start, len) = seqs[s];
            let mut out = vec![0.0f32; rep * len * d];
            let mut probs = vec![0.0f32; rep * len * len];
            let krow = |t: usize| &k[(start + t) * kv_heads * d + j * d..][..d];
            let vrow = |t: usize| &v[(start + t) * kv_heads * d + j * d..][..d];
            for r in 0..rep {
                let h = j * rep + r;
                for i in 0..len {
                    let qi = &q[(start + i) * heads * d + h * d..][..d];
                    let p = &mut probs[(r * len + i) * len..][..len];
                    let mut max = f32::NEG_INFINITY;
                    for (t, s) in p[..=i].iter_mut().enumerate() {
                        *s = dot(qi, krow(t)) * scale;
                        max = max.max(*s);
                    }
                    let mut z = 0.0f32;
                    for x in &mut p[..=i] {
                        *x = exp(*x - max);
                        z += *x;
                    }
                    let o = &mut out[(r * len + i) * d..][..d];
                    for (t, pt) in p[..=i].iter_mut().enumerate() {
                        *pt /= z;
                        for (o, &vv) in o.iter_mut().zip(vrow(t)) {
                            *o += *pt * vv;
                        }
                    }
                }
            }
            (out, probs)
        })
        .collect();
    let tokens = q.len() / (heads * d);
    let mut o = vec![0.0f32; tokens * heads * d];
    let mut all_probs = Vec::with_capacity(parts.len());
    for (&(s, j), (out, probs)) in tasks.iter().zip(parts) {
        let (start, len) = seqs[s];
        for r in 0..rep {
            let h = j * rep + r;
            for i in 0..len {
                o[(start + i) * heads * d + h * d..][..d]
                    .copy_from_slice(&out[(r * len + i) * d..][..d]);
            }
        }
        all_probs.push(probs);
    }
    (o, all_probs)
}

/// `(dq, dk, dv)` from `dO`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    probs: &[Probs],
    d_out: &[f32],
    seqs: &[(usize, usize)],
    shape: Heads,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let Heads {
        heads,
        kv_heads,
        dim: d,
    } = shape;
    let (rep, scale) = (shape.rep(), shape.scale());
    let tasks = tasks(seqs.len(), kv_heads);
    let parts: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = tasks
        .par_iter()
        .zip(probs)
        .map(|(&(s, j), probs)| {
            let (start, len) = seqs[s];
            let mut dq = vec![0.0f32; rep * len * d];
            let mut dk = vec![0.0f32; len * d];
            let mut dv = vec![0.0f32; len * d];
            let krow = |t: usize| &k[(start + t) * kv_heads * d + j * d..][..d];
            let vrow = |t: usize| &v[(start + t) * kv_heads * d + j * d..][..d];
            let mut ds = vec![0.0f32; len];
            for r in 0..rep {
                let h = j * rep + r;
                for i in 0..len {
                    let qi = &q[(start + i) * heads * d + h * d..][..d];
                    let doi = &d_out[(start + i) * heads * d + h * d..][..d];
                    let p = &probs[(r * len + i) * len..][..len];
                    let mut sum = 0.0f32;
                    for t in 0..=i {
                        ds[t] = dot(doi, vrow(t));
                        sum += ds[t] * p[t];
                    }
                    let dqi = &mut dq[(r * len + i) * d..][..d];
                    for t in 0..=i {
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
        .collect();
    let tokens = q.len() / (heads * d);
    let mut dq = vec![0.0f32; tokens * heads * d];
    let mut dk = vec![0.0f32; tokens * kv_heads * d];
    let mut dv = vec![0.0f32; tokens * kv_heads * d];
    for (&(s, j), (tq, tk, tv)) in tasks.iter().zip(parts) {
        let (start, len) = seqs[s];
        for i in 0..len {
            for r in 0..rep {
                let h = j * rep + r;
                dq[(start + i) * heads * d + h * d..][..d]
                    .copy_from_slice(&tq[(r * len + i) * d..][..d]);
            }
            dk[(start + i) * kv_heads * d + j * d..][..d].copy_from_slice(&tk[i * d..][..d]);
            dv[(start + i) * kv_heads * d + j * d..][..d].copy_from_slice(&tv[i * d..][..d]);
        }
    }
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::fused::testing::{check_gradient, random};

    #[test]
    fn backward_matches_finite_differences_on_two_packed_sequences() {
        let shape = Heads {
            heads: 4,
            kv_heads: 2,
            dim: 4,
        };
        let seqs = [(0, 3), (3, 2)];
        let n = 5;
        let q = random(n * 16, 9);
        let k = random(n * 8, 10);
        let v = random(n * 8, 11);
        let w = random(n * 16, 12);
        let loss = |q: &[f32], k: &[f32], v: &[f32]| -> f64 {
            let (o, _) = forward(q, k, v, &seqs, shape);
            o.iter().zip(&w).map(|(a, b)| f64::from(a * b)).sum()
        };
        let (_, probs) = forward(&q, &k, &v, &seqs, shape);
        let (dq, dk, dv) = backward(&q, &k, &v, &probs, &w, &seqs, shape);
        check_gradient(&q, &dq, |q| loss(q, &k, &v));
        check_gradient(&k, &dk, |k| loss(&q, k, &v));
        check_gradient(&v, &dv, |v| loss(&q, &k, v));
    }

    #[test]
    fn a_packed_sequence_attends_only_within_its_bounds() {
        let shape = Heads {
            heads: 2,
            kv_heads: 1,
            dim: 4,
        };
        let (q, k, v) = (random(5 * 8, 13), random(5 * 4, 14), random(5 * 4, 15));
        let (packed, _) = forward(&q, &k, &v, &[(0, 3), (3, 2)], shape);
        let (alone, _) = forward(&q[24..], &k[12..], &v[12..], &[(0, 2)], shape);
        assert_eq!(&packed[24..], &alone[..]);
    }
}
