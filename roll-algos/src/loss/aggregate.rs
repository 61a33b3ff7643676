//! Loss aggregation: from a per-token loss `L [B, T]` to the scalar that is differentiated.
//!
//! The four modes of ROLL's `agg_loss` (`roll/utils/functionals.py`), with optional per-sample
//! weights `w_b` and with the denominators (global token count `N`, global sample count `S`)
//! suppliable from outside through [`Denominators`], so that data-parallel shards and gradient
//! accumulation micro-batches reproduce one big batch exactly:
//!
//! ```text
//! full-batch loss = Σ over micro-batches and shards of aggregate(L_k, m_k, mode, w_k, global)
//! ```
//!
//! i.e. with global denominators the caller **sums** (never averages) micro-batch losses and shard
//! gradients. With [`Denominators::local`] each call normalises by its own counts, which is what a
//! single-batch caller wants.

use burn::tensor::{Bool, Tensor};

use super::config::aggregation::{Denominators, LossAggregation};
use super::masked::{row_mean, row_sum, token_count, valid_sample_count, zero_untrained};
use super::shape::{batch_dims, expect_shape, read_f32s};
use crate::Result;

impl Denominators {
    /// This batch's own counts, `N = Σ_{b,t} m_bt` and `S = Σ_b [Σ_t m_bt > 0]`, read back from the
    /// device (one sync). Add the results of all micro-batches/shards to get the global counts.
    ///
    /// # Shapes
    /// `mask`: `[B, T]`.
    ///
    /// # Errors
    /// [`AlgoError::TensorRead`](crate::AlgoError::TensorRead) if the counts cannot be read.
    pub fn from_mask(mask: Tensor<2, Bool>) -> Result<Self> {
        let both = Tensor::cat(vec![token_count(mask.clone()), valid_sample_count(mask)], 0);
        let v = read_f32s("loss mask counts", both)?;
        // Counts of a 0/1 mask are exact small integers in f32 (< 2^24 per batch).
        let count = |i: usize| v.get(i).map_or(0, |x| x.round().max(0.0) as usize);
        Ok(Self::global(count(0), count(1)))
    }

    /// `N` as a `[1]` tensor: the supplied count, else the batch's; at least `1`.
    fn tokens(&self, mask: Tensor<2, Bool>) -> Tensor<1> {
        match self.num_tokens {
            Some(n) => Tensor::from_floats([n.max(1) as f32], &mask.device()),
            None => token_count(mask).clamp_min(1.0),
        }
    }

    /// `S` as a `[1]` tensor: the supplied count, else the batch's; at least `1`.
    fn samples(&self, mask: Tensor<2, Bool>) -> Tensor<1> {
        match self.num_samples {
            Some(n) => Tensor::from_floats([n.max(1) as f32], &mask.device()),
            None => valid_sample_count(mask).clamp_min(1.0),
        }
    }
}

/// Reduces a per-token loss to a scalar (see [`LossAggregation`] for each mode's formula):
///
/// * token-mean: `Σ_{b,t} L_bt·m_bt·w_b / N`
/// * seq-mean-token-sum: `Σ_b w_b·Σ_t L_bt·m_bt / S`
/// * seq-mean-token-mean: `Σ_b w_b·(Σ_t L_bt·m_bt / max(n_b, 1)) / S`
/// * seq-mean-token-sum-norm: `Σ_b w_b·Σ_t L_bt·m_bt / H`
///
/// `N` and `S` come from `denominators` (clamped to ≥ 1). Untrained tokens contribute neither value
/// nor gradient to `loss`; `weights` are used as given (pass detached weights). A NaN computed
/// upstream at an untrained position would still turn `0·∂/∂x = NaN` in the backward pass, so
/// zero the *inputs* on untrained tokens as [`policy_objective`](super::policy_objective) and
/// [`critic_loss`](super::critic_loss) do.
///
/// # Shapes
/// `loss`, `mask`: `[B, T]`; `weights`: `[B]`; output `[1]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree,
/// [`AlgoError::Empty`](crate::AlgoError::Empty) for an empty batch.
pub fn aggregate(
    loss: Tensor<2>,
    mask: Tensor<2, Bool>,
    mode: LossAggregation,
    weights: Option<Tensor<1>>,
    denominators: &Denominators,
) -> Result<Tensor<1>> {
    let [b, t] = batch_dims("loss", &loss)?;
    expect_shape("loss mask", mask.dims(), [b, t])?;
    let weights = match weights {
        Some(w) => {
            expect_shape("sample weights", w.dims(), [b])?;
            Some(w.unsqueeze_dim::<2>(1))
        }
        None => None,
    };
    let weigh = |x: Tensor<2>| match &weights {
        Some(w) => x * w.clone(),
        None => x,
    };
    let out = match mode {
        LossAggregation::TokenMean {} => {
            weigh(zero_untrained(loss, mask.clone())).sum() / denominators.tokens(mask)
        }
        LossAggregation::SeqMeanTokenSum {} => {
            weigh(row_sum(loss, mask.clone())).sum() / denominators.samples(mask)
        }
        LossAggregation::SeqMeanTokenMean {} => {
            weigh(row_mean(loss, mask.clone())).sum() / denominators.samples(mask)
        }
        LossAggregation::SeqMeanTokenSumNorm { horizon } => {
            let h = horizon.unwrap_or(t).max(1) as f32;
            weigh(row_sum(loss, mask)).sum().div_scalar(h)
        }
    };
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    const NAN: f32 = f32::NAN;

    /// Rows of 3, 2, 1 and 0 trained tokens; padding holds garbage (NaN, 9).
    fn batch() -> (Tensor<2>, Tensor<2, Bool>, Tensor<1>) {
        let dev = Device::flex();
        let loss = Tensor::<2>::from_floats(
            [
                [1.0, 2.0, 3.0, NAN],
                [4.0, 5.0, 9.0, 9.0],
                [6.0, NAN, 9.0, 9.0],
                [9.0, 9.0, 9.0, 9.0],
            ],
            &dev,
        );
        let mask = Tensor::<2, Bool>::from_bool(
            [
                [true, true, true, false],
                [true, true, false, false],
                [true, false, false, false],
                [false, false, false, false],
            ],
            &dev,
        );
        let w = Tensor::<1>::from_floats([1.0, 2.0, 0.5, 3.0], &dev);
        (loss, mask, w)
    }

    fn agg(mode: LossAggregation, weighted: bool, d: &Denominators) -> f32 {
        let (l, m, w) = batch();
        aggregate(l, m, mode, weighted.then_some(w), d)
            .unwrap()
            .into_scalar::<f32>()
    }

    const MODES: [LossAggregation; 5] = [
        LossAggregation::TokenMean {},
        LossAggregation::SeqMeanTokenSum {},
        LossAggregation::SeqMeanTokenMean {},
        LossAggregation::SeqMeanTokenSumNorm { horizon: None },
        LossAggregation::SeqMeanTokenSumNorm { horizon: Some(8) },
    ];

    #[test]
    fn each_mode_on_a_padded_batch() {
        // Masked losses: row sums 6, 9, 6, 0; row means 2, 4.5, 6, 0; N = 6; S = 3; T = 4.
        // Weighted row sums 6, 18, 3; weighted row means 2, 9, 3.
        let local = Denominators::local();
        let expected = [
            (21.0 / 6.0, 27.0 / 6.0),
            (21.0 / 3.0, 27.0 / 3.0),
            (12.5 / 3.0, 14.0 / 3.0),
            (21.0 / 4.0, 27.0 / 4.0),
            (21.0 / 8.0, 27.0 / 8.0),
        ];
        for (mode, (plain, weighted)) in MODES.into_iter().zip(expected) {
            assert!((agg(mode, false, &local) - plain).abs() < 1e-5, "{mode:?}");
            assert!(
                (agg(mode, true, &local) - weighted).abs() < 1e-5,
                "{mode:?} weighted"
            );
        }
    }

    #[test]
    fn supplied_denominators_replace_the_counts() {
        let d = Denominators::global(12, 6);
        assert!((agg(LossAggregation::TokenMean {}, false, &d) - 21.0 / 12.0).abs() < 1e-5);
        assert!((agg(LossAggregation::SeqMeanTokenSum {}, false, &d) - 21.0 / 6.0).abs() < 1e-5);
    }

    #[test]
    fn two_halves_with_global_denominators_sum_to_the_full_batch() {
        let (l, m, w) = batch();
        let global = Denominators::from_mask(m.clone()).unwrap();
        assert_eq!(global, Denominators::global(6, 3));
        let half = |x: Tensor<2>, i: usize| x.narrow(0, 2 * i, 2);
        let half_mask = |i: usize| m.clone().narrow(0, 2 * i, 2);
        let halves_of_counts = Denominators::from_mask(half_mask(0)).unwrap()
            + Denominators::from_mask(half_mask(1)).unwrap();
        assert_eq!(halves_of_counts, global);
        for mode in MODES {
            for weighted in [false, true] {
                let full = agg(mode, weighted, &Denominators::local());
                let parts: f32 = (0..2)
                    .map(|i| {
                        let wi = weighted.then(|| w.clone().narrow(0, 2 * i, 2));
                        aggregate(half(l.clone(), i), half_mask(i), mode, wi, &global)
                            .unwrap()
                            .into_scalar::<f32>()
                    })
                    .sum();
                assert!(
                    (full - parts).abs() < 1e-5,
                    "{mode:?} {weighted}: {full} vs {parts}"
                );
            }
        }
    }

    #[test]
    fn shape_mismatches_are_errors() {
        let (l, m, _) = batch();
        let dev = Device::flex();
        let bad_w = Tensor::<1>::from_floats([1.0, 2.0], &dev);
        let err = aggregate(
            l.clone(),
            m.clone(),
            LossAggregation::TokenMean {},
            Some(bad_w),
            &Denominators::local(),
        );
        assert!(matches!(
            err,
            Err(crate::AlgoError::ShapeMismatch {
                what: "sample weights",
                ..
            })
        ));
        let err = aggregate(
            l.narrow(1, 0, 3),
            m,
            LossAggregation::TokenMean {},
            None,
            &Denominators::local(),
        );
        assert!(matches!(
            err,
            Err(crate::AlgoError::ShapeMismatch {
                what: "loss mask",
                ..
            })
        ));
    }
}
