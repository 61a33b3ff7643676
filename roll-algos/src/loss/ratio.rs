//! Importance ratios between the current policy and the policy that produced the samples.

use super::config::policy_loss::RatioLevel;
use super::masked::{row_mean, zero_untrained};
use super::shape::{batch_dims, expect_shape};
use crate::Result;
use burn::tensor::{Bool, Tensor};

/// Log-ratio on trained tokens, zero elsewhere: `ℓ_bt = (logp_bt − old_bt)·m_bt`.
///
/// # Shapes
/// `logp`, `old_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn log_ratio(logp: Tensor<2>, old_logp: Tensor<2>, mask: Tensor<2, Bool>) -> Result<Tensor<2>> {
    let dims = batch_dims("logp", &logp)?;
    expect_shape("old_logp", old_logp.dims(), dims)?;
    expect_shape("loss mask", mask.dims(), dims)?;
    Ok(zero_untrained(logp - old_logp, mask))
}

/// Token-level ratio: `r_bt = exp((logp_bt − old_bt)·m_bt)`, i.e. `1` on untrained tokens.
///
/// # Shapes
/// `logp`, `old_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn token_ratio(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    mask: Tensor<2, Bool>,
) -> Result<Tensor<2>> {
    Ok(log_ratio(logp, old_logp, mask)?.exp())
}

/// Sequence-level ratio (GSPO): `r_b = exp(Σ_t m_bt·(logp_bt − old_bt) / max(n_b, 1))` broadcast
/// to every token of sequence `b` (`1` for a sequence without trained tokens).
///
/// The gradient reaches every trained token of the sequence: `∂r_b/∂logp_bt = r_b·m_bt / n_b`.
///
/// # Shapes
/// `logp`, `old_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn sequence_ratio(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    mask: Tensor<2, Bool>,
) -> Result<Tensor<2>> {
    let [_, t] = logp.dims();
    let l = log_ratio(logp, old_logp, mask.clone())?;
    Ok(row_mean(l, mask).exp().repeat_dim(1, t))
}

/// The ratio at the chosen granularity: [`token_ratio`] or [`sequence_ratio`].
///
/// # Shapes
/// `logp`, `old_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn importance_ratio(
    level: RatioLevel,
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    mask: Tensor<2, Bool>,
) -> Result<Tensor<2>> {
    match level {
        RatioLevel::Token => token_ratio(logp, old_logp, mask),
        RatioLevel::Sequence => sequence_ratio(logp, old_logp, mask),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close as close, floats as v};
    use burn::tensor::Device;

    #[test]
    fn token_and_sequence_ratios() {
        let dev = Device::flex();
        let logp = Tensor::<2>::from_floats([[-1.0, -2.0, -3.0], [-0.5, -0.5, 7.0]], &dev);
        let old = Tensor::<2>::from_floats([[-1.2, -1.7, -3.0], [-1.0, -0.5, 0.0]], &dev);
        let mask = Tensor::<2, Bool>::from_bool([[true, true, false], [true, false, false]], &dev);
        let tok = v(token_ratio(logp.clone(), old.clone(), mask.clone()).unwrap());
        close(
            &tok,
            &[0.2f32.exp(), (-0.3f32).exp(), 1.0, 0.5f32.exp(), 1.0, 1.0],
        );
        // Row 0: mean log-ratio (0.2 − 0.3)/2 = −0.05; row 1: 0.5 / 1.
        let seq = v(sequence_ratio(logp, old, mask).unwrap());
        let (a, b) = ((-0.05f32).exp(), 0.5f32.exp());
        close(&seq, &[a, a, a, b, b, b]);
    }

    #[test]
    fn shape_mismatch() {
        let dev = Device::flex();
        let logp = Tensor::<2>::zeros([2, 3], &dev);
        let old = Tensor::<2>::zeros([2, 2], &dev);
        let mask = Tensor::<2, Bool>::from_bool([[true, true, true], [true, true, true]], &dev);
        assert!(matches!(
            token_ratio(logp, old, mask),
            Err(crate::AlgoError::ShapeMismatch {
                what: "old_logp",
                ..
            })
        ));
    }
}
