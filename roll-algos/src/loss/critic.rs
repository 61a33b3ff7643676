//! The critic (value-function) loss of PPO, with optional value clipping (as in ROLL's
//! `CriticWorker.loss_func`, OpenAI baselines' `ppo2`).

use burn::tensor::{Bool, Tensor};
use serde::Serialize;

use super::aggregate::aggregate;
use super::config::aggregation::{Denominators, LossAggregation};
use super::config::value_loss::ValueLossConfig;
use super::masked::masked_mean;
use super::shape::{batch_dims, expect_shape, read_f32s};
use crate::Result;

/// Per-token critic loss and where the clipped branch was taken:
///
/// ```text
/// no clip:  L = 0.5·(v − R)²
/// clip c:   v_clip = clamp(v, v_old − c, v_old + c)
///           L = 0.5·max((v − R)², (v_clip − R)²)
/// ```
///
/// `clipped` marks tokens where `(v_clip − R)² > (v − R)²`: the loss is then constant in `v` and the
/// token contributes no gradient.
///
/// # Shapes
/// `values`, `old_values`, `returns`: `[B, T]` → `([B, T], Option<[B, T]>)`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn value_loss_per_token(
    values: Tensor<2>,
    old_values: Tensor<2>,
    returns: Tensor<2>,
    clip: Option<f32>,
) -> Result<(Tensor<2>, Option<Tensor<2, Bool>>)> {
    let dims = batch_dims("values", &values)?;
    expect_shape("old_values", old_values.dims(), dims)?;
    expect_shape("returns", returns.dims(), dims)?;
    let returns = returns.detach();
    let plain = (values.clone() - returns.clone()).square();
    Ok(match clip {
        None => (plain.mul_scalar(0.5), None),
        Some(c) => {
            let old = old_values.detach();
            let lo = old.clone().sub_scalar(c);
            let hi = old.add_scalar(c);
            let v_clip = values.max_pair(lo).min_pair(hi);
            let clipped_sq = (v_clip - returns).square();
            let active = clipped_sq.clone().greater(plain.clone());
            (plain.max_pair(clipped_sq).mul_scalar(0.5), Some(active))
        }
    })
}

/// Scalar critic loss and its diagnostics.
#[derive(Debug, Clone)]
pub struct CriticLossOutput {
    /// The aggregated loss (`[1]`), to differentiate.
    pub loss: Tensor<1>,
    /// Diagnostics read back as numbers.
    pub metrics: CriticMetrics,
}

/// Diagnostics of one critic-loss evaluation (means over trained tokens of the batch).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct CriticMetrics {
    /// Value of the aggregated loss.
    pub vf_loss: f32,
    /// Fraction of trained tokens whose clipped branch was taken (`0` without clipping).
    pub clip_frac: f32,
    /// Mean predicted value.
    pub value_mean: f32,
}

/// Critic loss: [`value_loss_per_token`] reduced with [`aggregate`]:
/// `agg(0.5·max((v − R)², (v_clip − R)²), m)` (or `agg(0.5·(v − R)², m)` without clip).
///
/// ROLL always reduces with seq-mean-token-mean; pass that mode to reproduce it. Inputs are zeroed
/// on untrained tokens first, so padding (even NaN) gets exactly zero gradient.
///
/// # Shapes
/// `values`, `old_values`, `returns`, `mask`: `[B, T]`; loss `[1]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree;
/// [`AlgoError::TensorRead`](crate::AlgoError::TensorRead) if the metrics cannot be read.
pub fn critic_loss(
    values: Tensor<2>,
    old_values: Tensor<2>,
    returns: Tensor<2>,
    mask: Tensor<2, Bool>,
    config: &ValueLossConfig,
    mode: LossAggregation,
    denominators: &Denominators,
) -> Result<CriticLossOutput> {
    let dims = batch_dims("values", &values)?;
    expect_shape("loss mask", mask.dims(), dims)?;
    // Zero the inputs on untrained tokens: their gradient is then exactly 0, even with NaN padding.
    let untrained = mask.clone().bool_not();
    let clean = |t: Tensor<2>| t.mask_fill(untrained.clone(), 0.0);
    let (per_token, clipped) = value_loss_per_token(
        clean(values.clone()),
        clean(old_values),
        clean(returns),
        config.clip,
    )?;
    let loss = aggregate(per_token, mask.clone(), mode, None, denominators)?;
    let dev = values.device();
    let clip_frac = match clipped {
        Some(c) => masked_mean(c.float(), mask.clone()),
        None => Tensor::zeros([1], &dev),
    };
    let stats = Tensor::cat(
        vec![
            loss.clone().detach(),
            clip_frac,
            masked_mean(values.detach(), mask),
        ],
        0,
    );
    let v = read_f32s("critic metrics", stats)?;
    let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
    Ok(CriticLossOutput {
        loss,
        metrics: CriticMetrics {
            vf_loss: at(0),
            clip_frac: at(1),
            value_mean: at(2),
        },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close as close, floats as v};
    use burn::tensor::Device;

    fn case() -> (Tensor<2>, Tensor<2>, Tensor<2>, Tensor<2, Bool>) {
        let dev = Device::flex();
        let values = Tensor::<2>::from_floats([[1.0, 2.0], [0.0, 3.0]], &dev);
        let old = Tensor::<2>::from_floats([[0.9, 1.0], [0.5, 9.0]], &dev);
        let returns = Tensor::<2>::from_floats([[2.0, 2.5], [-1.0, 0.0]], &dev);
        let mask = Tensor::<2, Bool>::from_bool([[true, true], [true, false]], &dev);
        (values, old, returns, mask)
    }

    #[test]
    fn without_clip() {
        let (v0, old, r, _) = case();
        let (l, c) = value_loss_per_token(v0, old, r, None).unwrap();
        close(&v(l), &[0.5, 0.125, 0.5, 4.5]);
        assert!(c.is_none());
    }

    #[test]
    fn with_clip() {
        let (v0, old, r, mask) = case();
        let (l, c) = value_loss_per_token(v0.clone(), old.clone(), r.clone(), Some(0.5)).unwrap();
        // v_clip = clamp(v, old ± 0.5) = 1.0, 1.5, 0.0, 8.5.
        // (v−R)² = 1, 0.25, 1, 9; (v_clip−R)² = 1, 1, 1, 72.25.
        close(&v(l), &[0.5, 0.5, 0.5, 36.125]);
        assert_eq!(
            c.unwrap().into_data().try_into_vec::<bool>().unwrap(),
            [false, true, false, true]
        );
        let out = critic_loss(
            v0,
            old,
            r,
            mask,
            &ValueLossConfig { clip: Some(0.5) },
            LossAggregation::SeqMeanTokenMean {},
            &Denominators::local(),
        )
        .unwrap();
        // Row means (0.5 + 0.5)/2 = 0.5 and 0.5 → 0.5; clip frac 1/3; mean value (1+2+0)/3 = 1.
        assert!((out.loss.into_scalar::<f32>() - 0.5).abs() < 1e-6);
        assert!((out.metrics.vf_loss - 0.5).abs() < 1e-6);
        assert!((out.metrics.clip_frac - 1.0 / 3.0).abs() < 1e-6);
        assert!((out.metrics.value_mean - 1.0).abs() < 1e-6);
    }
}
