//! The one definition of a token's log-probability from a row of logits, shared by the sampler
//! (the log-prob a rollout reports) and by scoring and training on the CPU kernels (the log-probs
//! they recompute), so that the same logits give the same bits on every side.
//!
//! `log p(y) = z_y − (max + ln Σ exp(z − max))`: the exponentials are summed in f64 over
//! [`LANES`] interleaved partial sums (element `i` of the first `len − len % LANES` goes to lane
//! `i % LANES`), combined as `(lane₀ + lane₁) + (lane₂ + lane₃)`, then the tail in order; the
//! difference is taken in f64 and rounded once to f32.

/// Partial sums of [`ExpSum`].
pub(crate) const LANES: usize = 4;

/// `Σ exp(z − max)` of one row of logits, accumulated in [`LANES`] lanes and a tail (see the
/// [module docs](self)).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ExpSum {
    lanes: [f64; LANES],
    tail: f64,
}

impl ExpSum {
    /// The sum of a whole row of exponentials.
    pub(crate) fn of_row(exps: &[f32]) -> Self {
        let mut sum = Self::default();
        let chunks = exps.chunks_exact(LANES);
        for &e in chunks.remainder() {
            sum.tail += f64::from(e);
        }
        for c in chunks {
            for (a, &e) in sum.lanes.iter_mut().zip(c) {
                *a += f64::from(e);
            }
        }
        sum
    }

    /// Adds the exponential of element `i` of a row of `len`: element by element, in order, gives
    /// the same bits as [`ExpSum::of_row`].
    #[inline]
    pub(crate) fn add(&mut self, i: usize, len: usize, e: f32) {
        if i < len - len % LANES {
            self.lanes[i % LANES] += f64::from(e);
        } else {
            self.tail += f64::from(e);
        }
    }

    /// The total.
    pub(crate) fn total(&self) -> f64 {
        let [a, b, c, d] = self.lanes;
        (a + b) + (c + d) + self.tail
    }
}

/// `log p(target)` from the target's logit, the row's maximum and its [`ExpSum`] total.
#[inline]
pub(crate) fn logprob(target_logit: f32, max: f32, exp_sum: f64) -> f32 {
    (f64::from(target_logit) - (f64::from(max) + exp_sum.ln())) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_by_element_equals_the_whole_row() {
        for len in [1usize, 3, 4, 7, 8, 97, 256] {
            let exps: Vec<f32> = (0..len).map(|i| 1.0 / (1.0 + i as f32 * 0.37)).collect();
            let mut sum = ExpSum::default();
            for (i, &e) in exps.iter().enumerate() {
                sum.add(i, len, e);
            }
            let whole = ExpSum::of_row(&exps).total();
            assert_eq!(sum.total().to_bits(), whole.to_bits(), "len {len}");
            let plain: f64 = exps.iter().map(|&e| f64::from(e)).sum();
            assert!((whole - plain).abs() < 1e-12 * plain);
        }
    }

    #[test]
    fn logprob_is_the_log_softmax() {
        let logits = [1.0f32, -2.0, 0.5];
        let max = 1.0f32;
        let exps: Vec<f32> = logits.iter().map(|&z| (z - max).exp()).collect();
        let lp = logprob(logits[2], max, ExpSum::of_row(&exps).total());
        let z: f64 = logits.iter().map(|&z| f64::from(z).exp()).sum();
        assert!((f64::from(lp) - (0.5 - z.ln())).abs() < 1e-6);
    }
}
