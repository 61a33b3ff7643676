//! The LM head fused with the log-prob and entropy of each trained position, and its backward,
//! a chunk of rows at a time: the `[rows, vocab]` logits exist for one chunk only, in the forward
//! and again (recomputed) in the backward; nothing of vocabulary width is kept between them.
//!
//! Per row with logits `z`, `p = softmax(z)`, target `y`: `logp = z_y − lse(z)` and
//! `H = lse(z) − Σ p·z`. Gradients: `∂logp/∂z = onehot(y) − p`, `∂H/∂z = −p ⊙ (log p + H)`.

use super::mm;
use crate::Result;
use crate::engine::cpu::exp::exp;
use burn::tensor::{Device, Tensor};
use rayon::prelude::*;

/// Rows whose logits exist at once.
const ROW_CHUNK: usize = 256;

/// The output projection: its own `[hidden, vocab]` matrix, or the `[vocab, hidden]` embedding.
#[derive(Debug, Clone)]
pub(crate) enum Head {
    /// `lm_head.weight`, `[hidden, vocab]`.
    Untied(Tensor<2>),
    /// `embed_tokens.weight`, `[vocab, hidden]`, used transposed.
    Tied(Tensor<2>),
}

impl Head {
    fn logits(&self, h: &Tensor<2>) -> Result<Vec<f32>> {
        match self {
            Head::Untied(w) => mm::mul(h, w),
            Head::Tied(e) => mm::mul_t(h, e),
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
    device: &Device,
) -> Result<Vec<f32>> {
    let rows = targets.len();
    let mut dh = Vec::with_capacity(rows * h);
    for r0 in (0..rows).step_by(ROW_CHUNK) {
        let r1 = (r0 + ROW_CHUNK).min(rows);
        let chunk = mm::tensor(hidden[r0 * h..r1 * h].to_vec(), r1 - r0, h, device);
        let mut z = head.logits(&chunk)?;
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
        let dz = mm::tensor(z, r1 - r0, vocab, device);
        match head {
            Head::Untied(w) => {
                dh.extend(mm::mul_t(&dz, w)?);
                if let Some(dw) = dw.as_deref_mut() {
                    mm::add_in_place(dw, &mm::t_mul(&chunk, &dz)?);
                }
            }
            Head::Tied(e) => {
                dh.extend(mm::mul(&dz, e)?);
                if let Some(dw) = dw.as_deref_mut() {
                    mm::add_in_place(dw, &mm::t_mul(&dz, &chunk)?);
                }
            }
        }
    }
    Ok(dh)
}
