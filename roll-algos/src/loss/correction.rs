//! Train–inference mismatch correction (ROLL's `roll/utils/train_infer_corrections.py`).
//!
//! The rollout engine's log-probabilities (`infer_logp`) differ from the training engine's
//! (`train_logp`, the detached old log-probabilities) through kernels, precision and sampling
//! tricks, so the samples are slightly off-policy even on the first epoch. The correction
//! re-weights the loss by a truncated importance weight (as in "Your Efficient RL Framework
//! Secretly Brings You Off-Policy RL Training", Yao et al. 2025, truncated IS) and/or drops tokens or
//! sequences whose ratio leaves a trust band (masked IS, "MIS"). With `ℓ_bt = (train_bt −
//! infer_bt)·m_bt` the log-ratio at each granularity is:
//!
//! ```text
//! token:      ρ_bt = ℓ_bt
//! sequence:   ρ_bt = Σ_t' ℓ_bt'                 (log of the product of token ratios)
//! geometric:  ρ_bt = Σ_t' ℓ_bt' / max(n_b, 1)    (log of their geometric mean)
//! ```
//!
//! Everything here is computed on detached inputs: the weights and masks are constants of the
//! loss.

use burn::tensor::{Bool, Tensor};
use serde::Serialize;

use super::config::correction::{
    CorrectionLevel, IsWeightConfig, RatioFilterConfig, TrainInferCorrection,
};
use super::masked::{
    masked_max_non_negative, masked_mean, row_mean, row_sum, token_count, zero_untrained,
};
use super::shape::{batch_dims, expect_shape, read_f32s};
use crate::Result;

impl TrainInferCorrection {
    /// Applies the correction to one batch: the importance weights (if configured) and the loss
    /// mask with every filter applied, `m' = m ∧ ⋀_f [low_f ≤ exp(ρ_f) ≤ high_f]`.
    ///
    /// Weights and filters are computed on the original mask `m`. The weights are `0` on tokens
    /// outside `m'`.
    ///
    /// Supplied global [`Denominators`](super::Denominators) should be counted on `m'` (call this
    /// before counting) so that filtered tokens leave the denominators too.
    ///
    /// # Shapes
    /// `train_logp`, `infer_logp`, `mask`: `[B, T]`.
    ///
    /// # Errors
    /// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
    pub fn apply(
        &self,
        train_logp: Tensor<2>,
        infer_logp: Tensor<2>,
        mask: Tensor<2, Bool>,
    ) -> Result<Correction> {
        let dims = batch_dims("train_logp", &train_logp)?;
        expect_shape("infer_logp", infer_logp.dims(), dims)?;
        expect_shape("loss mask", mask.dims(), dims)?;
        let delta = zero_untrained(train_logp.detach() - infer_logp.detach(), mask.clone());
        let mut kept = mask.clone();
        for f in &self.filters {
            let rho = log_ratio_at(f.level, delta.clone(), mask.clone());
            kept = kept.bool_and(keep_band(rho, f.low, f.high));
        }
        let weights = self.is_weight.map(|w| {
            truncated_weight(
                log_ratio_at(w.level, delta.clone(), mask.clone()),
                w.upper_bound,
            )
            .mask_fill(kept.clone().bool_not(), 0.0)
        });
        let dev = delta.device();
        let abs = delta.abs();
        let diagnostics = CorrectionDiagnostics {
            mean_abs_diff: masked_mean(abs.clone(), mask.clone()),
            max_abs_diff: masked_max_non_negative(abs, mask.clone()),
            filtered_frac: (token_count(mask.clone()) - token_count(kept.clone()))
                / token_count(mask).clamp_min(1.0),
            mean_is_weight: match &weights {
                Some(w) => masked_mean(w.clone(), kept.clone()),
                None => Tensor::ones([1], &dev),
            },
        };
        Ok(Correction {
            weights,
            mask: kept,
            diagnostics,
        })
    }
}

/// `ρ` at the given granularity from the masked token log-ratios `ℓ` (see the module doc).
fn log_ratio_at(level: CorrectionLevel, delta: Tensor<2>, mask: Tensor<2, Bool>) -> Tensor<2> {
    let [_, t] = delta.dims();
    match level {
        CorrectionLevel::Token => delta,
        CorrectionLevel::Sequence => row_sum(delta, mask).repeat_dim(1, t),
        CorrectionLevel::Geometric => row_mean(delta, mask).repeat_dim(1, t),
    }
}

/// `clamp(exp(ρ), 0, C)` computed as `exp(min(ρ, ln C))`, which cannot overflow.
fn truncated_weight(rho: Tensor<2>, upper_bound: f32) -> Tensor<2> {
    rho.clamp_max(upper_bound.ln()).exp()
}

/// `low ≤ exp(ρ) ≤ high`, compared in log space (`ln 0 = −∞` keeps every low ratio).
fn keep_band(rho: Tensor<2>, low: f32, high: f32) -> Tensor<2, Bool> {
    let above_low = rho.clone().greater_equal_elem(low.ln());
    above_low.bool_and(rho.lower_equal_elem(high.ln()))
}

/// Truncated importance weights at a granularity: `w_bt = sg(clamp(exp(ρ_bt), 0, C))`, `0` on
/// untrained tokens (`ρ` as in the module doc).
///
/// # Shapes
/// `train_logp`, `infer_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn is_weights(
    level: CorrectionLevel,
    train_logp: Tensor<2>,
    infer_logp: Tensor<2>,
    mask: Tensor<2, Bool>,
    upper_bound: f32,
) -> Result<Tensor<2>> {
    let c = TrainInferCorrection {
        is_weight: Some(IsWeightConfig { level, upper_bound }),
        filters: Vec::new(),
    };
    let out = c.apply(train_logp, infer_logp, mask)?;
    Ok(out.weights.unwrap_or_else(|| out.mask.float()))
}

/// A loss mask with one ratio filter applied: `m'_bt = m_bt ∧ [low ≤ exp(ρ_bt) ≤ high]`.
///
/// # Shapes
/// `train_logp`, `infer_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn ratio_filter(
    filter: RatioFilterConfig,
    train_logp: Tensor<2>,
    infer_logp: Tensor<2>,
    mask: Tensor<2, Bool>,
) -> Result<Tensor<2, Bool>> {
    let c = TrainInferCorrection {
        is_weight: None,
        filters: vec![filter],
    };
    Ok(c.apply(train_logp, infer_logp, mask)?.mask)
}

/// The result of [`TrainInferCorrection::apply`].
#[derive(Debug, Clone)]
pub struct Correction {
    /// Detached importance weights `[B, T]` to multiply into the per-token loss, if configured.
    pub weights: Option<Tensor<2>>,
    /// The loss mask after the filters `[B, T]`.
    pub mask: Tensor<2, Bool>,
    /// Diagnostics, still on the device (read them with [`CorrectionDiagnostics::read`]).
    pub diagnostics: CorrectionDiagnostics,
}

/// Diagnostics of a correction as `[1]` tensors, so that callers can read them together with
/// other metrics in one device sync.
#[derive(Debug, Clone)]
pub struct CorrectionDiagnostics {
    /// `Σ m·|train − infer| / Σ m` over the original mask.
    pub mean_abs_diff: Tensor<1>,
    /// `max_{m} |train − infer|` over the original mask.
    pub max_abs_diff: Tensor<1>,
    /// Fraction of originally trained tokens removed by the filters: `1 − Σ m' / Σ m`.
    pub filtered_frac: Tensor<1>,
    /// Mean importance weight over the kept tokens `m'` (`1` without weights).
    pub mean_is_weight: Tensor<1>,
}

impl CorrectionDiagnostics {
    /// The four tensors, in [`CorrectionMetrics`] field order.
    pub(crate) fn into_tensors(self) -> [Tensor<1>; 4] {
        [
            self.mean_abs_diff,
            self.max_abs_diff,
            self.filtered_frac,
            self.mean_is_weight,
        ]
    }

    /// Reads the diagnostics back (one device sync).
    ///
    /// # Errors
    /// [`AlgoError::TensorRead`](crate::AlgoError::TensorRead) if the device fails.
    pub fn read(self) -> Result<CorrectionMetrics> {
        let v = read_f32s(
            "correction diagnostics",
            Tensor::cat(self.into_tensors().to_vec(), 0),
        )?;
        Ok(CorrectionMetrics::from_values(&v))
    }
}

/// Train–inference mismatch diagnostics as numbers (see [`CorrectionDiagnostics`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct CorrectionMetrics {
    /// Mean `|Δlogp|` over trained tokens.
    pub mean_abs_diff: f32,
    /// Largest `|Δlogp|` over trained tokens.
    pub max_abs_diff: f32,
    /// Fraction of trained tokens removed by the filters.
    pub filtered_frac: f32,
    /// Mean importance weight over the kept tokens.
    pub mean_is_weight: f32,
}

impl CorrectionMetrics {
    /// From values in field order (missing values read as `0`).
    pub(crate) fn from_values(v: &[f32]) -> Self {
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        Self {
            mean_abs_diff: at(0),
            max_abs_diff: at(1),
            filtered_frac: at(2),
            mean_is_weight: at(3),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close as close, floats as v};
    use burn::tensor::Device;

    fn bools(t: Tensor<2, Bool>) -> Vec<bool> {
        t.into_data().try_into_vec::<bool>().unwrap()
    }

    /// Δ = train − infer = [[0.1, −0.3, 0.05, pad], [0.2, 0.1, pad, pad]].
    fn case() -> (Tensor<2>, Tensor<2>, Tensor<2, Bool>) {
        let dev = Device::flex();
        let infer =
            Tensor::<2>::from_floats([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]], &dev);
        let delta =
            Tensor::<2>::from_floats([[0.1, -0.3, 0.05, 50.0], [0.2, 0.1, 9.0, -9.0]], &dev);
        let mask = Tensor::<2, Bool>::from_bool(
            [[true, true, true, false], [true, true, false, false]],
            &dev,
        );
        (infer.clone() + delta, infer, mask)
    }

    #[test]
    fn token_weights_are_truncated() {
        let (tr, inf, m) = case();
        let w = v(is_weights(CorrectionLevel::Token, tr, inf, m, 1.2).unwrap());
        let e = |x: f32| x.exp().min(1.2);
        close(&w, &[e(0.1), e(-0.3), e(0.05), 0.0, 1.2, e(0.1), 0.0, 0.0]);
    }

    #[test]
    fn sequence_and_geometric_weights() {
        let (tr, inf, m) = case();
        // Row sums −0.15 and 0.3; row means −0.05 and 0.15.
        let w = v(is_weights(
            CorrectionLevel::Sequence,
            tr.clone(),
            inf.clone(),
            m.clone(),
            1.2,
        )
        .unwrap());
        let (a, b) = ((-0.15f32).exp(), 0.3f32.exp().min(1.2));
        close(&w, &[a, a, a, 0.0, b, b, 0.0, 0.0]);
        let w = v(is_weights(CorrectionLevel::Geometric, tr, inf, m, 1.2).unwrap());
        let (a, b) = ((-0.05f32).exp(), 0.15f32.exp());
        close(&w, &[a, a, a, 0.0, b, b, 0.0, 0.0]);
    }

    #[test]
    fn token_and_sequence_filters() {
        let (tr, inf, m) = case();
        // Token band [0.8, 1.2] = log band [−0.2231, 0.1823]: drops −0.3 and 0.2.
        let f = RatioFilterConfig::default();
        let kept = bools(ratio_filter(f, tr.clone(), inf.clone(), m.clone()).unwrap());
        assert_eq!(kept, [true, false, true, false, false, true, false, false]);
        // Sequence band: exp(−0.15) = 0.86 kept, exp(0.3) = 1.35 dropped as a whole.
        let f = RatioFilterConfig {
            level: CorrectionLevel::Sequence,
            ..f
        };
        let kept = bools(ratio_filter(f, tr, inf, m).unwrap());
        assert_eq!(kept, [true, true, true, false, false, false, false, false]);
    }

    #[test]
    fn apply_combines_and_reports() {
        let (tr, inf, m) = case();
        let c = TrainInferCorrection {
            is_weight: Some(IsWeightConfig::default()),
            filters: vec![RatioFilterConfig::default()],
        };
        let out = c.apply(tr, inf, m).unwrap();
        let w = v(out.weights.unwrap());
        close(
            &w,
            &[
                0.1f32.exp(),
                0.0,
                0.05f32.exp(),
                0.0,
                0.0,
                0.1f32.exp(),
                0.0,
                0.0,
            ],
        );
        let d = out.diagnostics.read().unwrap();
        // |Δ| over the 5 trained tokens: 0.1, 0.3, 0.05, 0.2, 0.1 → mean 0.15, max 0.3.
        assert!((d.mean_abs_diff - 0.15).abs() < 1e-5);
        assert!((d.max_abs_diff - 0.3).abs() < 1e-5);
        assert!((d.filtered_frac - 0.4).abs() < 1e-5);
        let mean_w = (2.0 * 0.1f32.exp() + 0.05f32.exp()) / 3.0;
        assert!((d.mean_is_weight - mean_w).abs() < 1e-5);
    }
}
