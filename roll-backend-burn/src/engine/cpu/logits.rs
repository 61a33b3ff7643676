//! Log-probabilities of target tokens and entropies, reduced straight from transposed logits.

use super::exp::exp;
use crate::engine::logprob::{ExpSum, logprob};
use rayon::prelude::*;

/// Columns of logits one task of [`logprobs_and_entropy_t`] reduces.
const SCORE_COLS: usize = 64;

/// Per column `c` of transposed logits `logits_t` (`[vocab, cols]`, row-major):
/// `log_softmax(column)[targets[c]]` and, when `with_entropy`, the entropy of `softmax(column)`.
///
/// Each column reduces over the vocabulary in a fixed order (maximum, then `Σ exp(x − max)` as
/// the sampler sums it — [`ExpSum`] — and `Σ exp(x − max)·(x − max)` in f64), whatever the
/// column count or the thread, so results are batch-invariant and a log-prob has the bits the
/// sampler reports for the same logits. Columns are split into tasks of [`SCORE_COLS`] run with rayon;
/// each task walks the rows front to back, reading a contiguous slice of each.
///
/// Returns `(logprobs, entropy)`, each of length `cols` (`entropy` empty unless requested).
/// `targets` must hold `cols` ids below `vocab` (checked by the caller).
pub(crate) fn logprobs_and_entropy_t(
    logits_t: &[f32],
    cols: usize,
    targets: &[u32],
    with_entropy: bool,
) -> (Vec<f32>, Vec<f32>) {
    debug_assert_eq!(targets.len(), cols);
    debug_assert!(cols == 0 || logits_t.len().is_multiple_of(cols));
    let mut logprobs = vec![0.0f32; cols];
    let mut entropy = vec![0.0f32; if with_entropy { cols } else { 0 }];
    if cols == 0 {
        return (logprobs, entropy);
    }
    let vocab = logits_t.len() / cols;
    let reduce = |c0: usize, lp: &mut [f32], ent: &mut [f32]| {
        let w = lp.len();
        let rows = || logits_t.chunks_exact(cols).map(|row| &row[c0..c0 + w]);
        let mut max = vec![f32::NEG_INFINITY; w];
        for row in rows() {
            for (m, &x) in max.iter_mut().zip(row) {
                *m = m.max(x);
            }
        }
        let mut z = vec![ExpSum::default(); w];
        let mut s1 = vec![0.0f64; w];
        let mut e = vec![0.0f32; w];
        for (r, row) in rows().enumerate() {
            for ((e, &x), &m) in e.iter_mut().zip(row).zip(&max) {
                *e = exp(x - m);
            }
            for (z, &e) in z.iter_mut().zip(&e) {
                z.add(r, vocab, e);
            }
            if with_entropy {
                for (((s, &e), &x), &m) in s1.iter_mut().zip(&e).zip(row).zip(&max) {
                    *s += f64::from(e) * f64::from(x - m);
                }
            }
        }
        for j in 0..w {
            let c = c0 + j;
            let total = z[j].total();
            let target = targets[c] as usize;
            debug_assert!(target < vocab);
            lp[j] = logprob(logits_t[target * cols + c], max[j], total);
            if with_entropy {
                ent[j] = (total.ln() - s1[j] / total) as f32;
            }
        }
    };
    if with_entropy {
        logprobs
            .par_chunks_mut(SCORE_COLS)
            .zip(entropy.par_chunks_mut(SCORE_COLS))
            .enumerate()
            .for_each(|(i, (lp, ent))| reduce(i * SCORE_COLS, lp, ent));
    } else {
        logprobs
            .par_chunks_mut(SCORE_COLS)
            .enumerate()
            .for_each(|(i, lp)| reduce(i * SCORE_COLS, lp, &mut []));
    }
    (logprobs, entropy)
}
