//! The LM head fused with the log-prob and entropy of each trained position, and its backward,
//! a chunk of rows at a time: the `[rows, vocab]` logits exist for one chunk only, in the forward
//! and again (recomputed) in the backward; nothing of vocabulary width is kept between them.
//!
//! Per row with logits `z`, `p = softmax(z)`, target `y`: `logp = z_y − lse(z)` and
//! `H = lse(z) − Σ p·z`. Gradients: `∂logp/∂z = onehot(y) − p`, `∂H/∂z = −p ⊙ (log p + H)`.

use super::mm::{self, Mat, MatRef, PackedB};
use crate::engine::cpu::exp::exp;
use rayon::prelude::*;

/// Rows whose logits exist at once.
const ROW_CHUNK: usize = 256;

/// The output projection `W` (`[hidden, vocab]`: `lm_head.weight`, or the transpose of the
/// `[vocab, hidden]` embedding when tied), packed for the two products that read it: the logits
/// `H·W` and the input gradient `dZ·Wᵀ`.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    w: PackedB,
    w_t: PackedB,
    /// Whether `W` is the embedding's transpose: its gradient is then shaped `[vocab, hidden]`.
    tied: bool,
}

impl Head {
    /// `lm_head.weight`, `[hidden, vocab]`.
    pub(crate) fn untied(w: &Mat) -> Self {
        Self {
            w: PackedB::new(w.view()),
            w_t: PackedB::new(w.view().t()),
            tied: false,
        }
    }

    /// The embedding table `[vocab, hidden]`, used transposed.
    pub(crate) fn tied(embed: &Mat) -> Self {
        Self {
            w: PackedB::new(embed.view().t()),
            w_t: PackedB::new(embed.view()),
            tied: true,
        }
    }
}

/// Per row of a `[rows, vocab]` chunk: the softmax in place of the logits, `logp`, `H`.
fn softmax_rows(z: &mut [f32], vocab: usize, targets: &[u32], lp: &mut [f32], ent: &mut [f32]) {
    z.par_chunks_mut(vocab)
        .zip(targets.par_iter())
        .zip(lp.par_iter_mut().zip(ent.par_iter_mut()))
        .for_each(|((z, &y), (lp, ent))| {
            let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let target = z[y as usize] - max;
            let mut sum = 0.0f64;
            let mut sum_zx = 0.0f64;
            for x in z.iter_mut() {
                let shifted = *x - max;
                *x = exp(shifted);
                sum += f64::from(*x);
                sum_zx += f64::from(*x) * f64::from(shifted);
            }
            let log_z = sum.ln();
            *lp = (f64::from(target) - log_z) as f32;
            *ent = (log_z - sum_zx / sum) as f32;
            let inv = (1.0 / sum) as f32;
            for x in z.iter_mut() {
                *x *= inv;
            }
        });
}

/// The gradient of `Σ dlogp·logp + dent·H` with respect to `hidden`; the head's weight gradient
/// (shaped as the weight) is added to `dw` (`None`: a frozen head, no weight gradient).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    head: &Head,
    hidden: &[f32],
    h: usize,
    targets: &[u32],
    vocab: usize,
    d_logp: &[f32],
    d_entropy: &[f32],
    mut dw: Option<&mut [f32]>,
) -> Vec<f32> {
    let rows = targets.len();
    let mut dh = Vec::with_capacity(rows * h);
    for r0 in (0..rows).step_by(ROW_CHUNK) {
        let r1 = (r0 + ROW_CHUNK).min(rows);
        let chunk = MatRef::row_major(&hidden[r0 * h..r1 * h], r1 - r0, h);
        let mut z = mm::mul_packed(chunk, &head.w);
        let (mut lp, mut ent) = (vec![0.0f32; r1 - r0], vec![0.0f32; r1 - r0]);
        softmax_rows(&mut z, vocab, &targets[r0..r1], &mut lp, &mut ent);
        // z now holds p; turn it into ∂loss/∂z.
        z.par_chunks_mut(vocab)
            .zip(targets[r0..r1].par_iter())
            .zip(d_logp[r0..r1].par_iter().zip(&d_entropy[r0..r1]))
            .zip(ent.par_iter())
            .for_each(|(((p, &y), (&dl, &de)), &entropy)| {
                if de == 0.0 {
                    // No entropy term (its coefficient is 0, or the row is masked): skip the
                    // logarithms, a vocabulary's worth per row.
                    for x in p.iter_mut() {
                        *x *= -dl;
                    }
                } else {
                    for x in p.iter_mut() {
                        let pv = *x;
                        let log_p = if pv > 0.0 { pv.ln() } else { 0.0 };
                        *x = -dl * pv - de * pv * (log_p + entropy);
                    }
                }
                p[y as usize] += dl;
            });
        let dz = MatRef::row_major(&z, r1 - r0, vocab);
        dh.extend(mm::mul_packed(dz, &head.w_t));
        if let Some(dw) = dw.as_deref_mut() {
            if head.tied {
                mm::add_mul(dw, dz.t(), chunk);
            } else {
                mm::add_mul(dw, chunk.t(), dz);
            }
        }
    }
    dh
}
