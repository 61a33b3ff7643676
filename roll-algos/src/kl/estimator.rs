//! Per-token estimators of `KL(π ‖ π_ref)` from the log-probabilities of the sampled tokens
//! (Schulman, "Approximating KL Divergence", 2020, <http://joschu.net/blog/kl-approx.html>).
//!
//! Each estimator exists on `f32` slices (here: for the per-token KL penalty subtracted from
//! rewards) and on tensors ([`kl_tensor`](super::kl_tensor), feature `tensor`: for the KL loss,
//! with gradients). Both forms compute the same numbers, checked against the same hand-computed
//! table.

use serde::{Deserialize, Serialize};

use crate::{AlgoError, Result};

/// Bound of ROLL's k3 clamp: `k3 ∈ [−10, 10]`.
pub const K3_CLAMP: f32 = 10.0;

/// Range to which `k = ref − logp` is clamped before `exp` in k3. Inside it nothing changes
/// (`exp(k) − k − 1` already exceeds [`K3_CLAMP`] for `k > 2.6` or `k < −11`); outside it keeps
/// `exp` finite so that a clamped token yields a zero gradient instead of `0·∞ = NaN`.
pub(crate) const K3_EXP_GUARD: f32 = 20.0;

/// Which estimator of the per-token KL divergence to use. With `d = logp − ref`:
///
/// ROLL's `"full"` (exact KL from the full vocabulary distributions) is not offered: it needs
/// `[B, T, V]` log-probabilities, not the sampled tokens' ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `k1 = d`: unbiased, high variance, can be negative (ROLL's `"kl"`).
    #[serde(alias = "kl")]
    K1,
    /// `|d|` (ROLL's `"abs"`).
    Abs,
    /// `k2 = ½·d²`: low variance, biased (ROLL's `"mse"`).
    #[serde(alias = "mse")]
    K2,
    /// `k3 = clamp(exp(−d) + d − 1, −10, 10)`, i.e. with `k = ref − logp`:
    /// `clamp(exp(k) − k − 1, −10, 10)`: unbiased, low variance, non-negative (ROLL's
    /// `"k3"`/`low_var_kl`, GRPO arXiv:2402.03300 Eq. 4). The default, as ROLL's KL loss.
    #[default]
    #[serde(alias = "low_var_kl")]
    K3,
}

impl KlEstimator {
    /// The estimate for one token (see the variants for the formulas).
    pub fn estimate(self, logp: f32, ref_logp: f32) -> f32 {
        let d = logp - ref_logp;
        match self {
            Self::K1 => d,
            Self::Abs => d.abs(),
            Self::K2 => 0.5 * d * d,
            Self::K3 => {
                let k = (-d).clamp(-K3_EXP_GUARD, K3_EXP_GUARD);
                (k.exp() - k - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
            }
        }
    }
}

/// Per-token KL estimate on slices: `out_i = estimate(logp_i, ref_i)` (see [`KlEstimator`]).
/// Used as the per-token KL penalty of KL-in-reward: `r_t ← r_t − β·out_t`.
///
/// # Errors
/// [`AlgoError::LengthMismatch`] if the slices differ in length.
pub fn kl_slice(estimator: KlEstimator, logp: &[f32], ref_logp: &[f32]) -> Result<Vec<f32>> {
    if logp.len() != ref_logp.len() {
        return Err(AlgoError::LengthMismatch {
            what: "ref_logp",
            expected: logp.len(),
            actual: ref_logp.len(),
        });
    }
    Ok(logp
        .iter()
        .zip(ref_logp)
        .map(|(&l, &r)| estimator.estimate(l, r))
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const ALL: [KlEstimator; 4] = [
        KlEstimator::K1,
        KlEstimator::Abs,
        KlEstimator::K2,
        KlEstimator::K3,
    ];

    /// d = logp − ref = −0.5, 0.3, 0, −20 (the last one clamps k3: exp(20) − 21 ≫ 10).
    pub(crate) const LOGP: [f32; 4] = [-1.5, -0.7, -2.0, -25.0];
    pub(crate) const REF: [f32; 4] = [-1.0, -1.0, -2.0, -5.0];

    pub(crate) fn expected(e: KlEstimator) -> [f32; 4] {
        match e {
            KlEstimator::K1 => [-0.5, 0.3, 0.0, -20.0],
            KlEstimator::Abs => [0.5, 0.3, 0.0, 20.0],
            KlEstimator::K2 => [0.125, 0.045, 0.0, 200.0],
            // k = −d: exp(0.5) − 1.5, exp(−0.3) − 0.7, 0, clamp(exp(20) − 21) = 10.
            KlEstimator::K3 => [0.5f32.exp() - 1.5, (-0.3f32).exp() - 0.7, 0.0, 10.0],
        }
    }

    #[test]
    fn slice_form() {
        for e in ALL {
            let got = kl_slice(e, &LOGP, &REF).unwrap();
            for (g, x) in got.iter().zip(expected(e)) {
                assert!((g - x).abs() < 1e-5, "{e:?}: {got:?}");
            }
        }
    }

    #[test]
    fn k3_clamps_both_tails_without_overflow() {
        // k = ref − logp = 200 overflows exp without the guard; k = −30 gives 29 → clamped to 10.
        assert_eq!(KlEstimator::K3.estimate(-200.0, 0.0), 10.0);
        assert_eq!(KlEstimator::K3.estimate(0.0, -30.0), 10.0);
    }

    #[test]
    fn length_mismatch() {
        assert!(matches!(
            kl_slice(KlEstimator::K1, &[0.0; 3], &[0.0; 2]),
            Err(AlgoError::LengthMismatch {
                expected: 3,
                actual: 2,
                ..
            })
        ));
    }

    #[test]
    fn serde_names() {
        let e: KlEstimator = serde_json::from_str("\"mse\"").unwrap();
        assert_eq!(e, KlEstimator::K2);
        let e: KlEstimator = serde_json::from_str("\"k3\"").unwrap();
        assert_eq!(e, KlEstimator::K3);
        assert!(serde_json::from_str::<KlEstimator>("\"full\"").is_err());
    }
}
