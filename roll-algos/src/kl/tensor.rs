//! The per-token KL estimators of [`KlEstimator`] on tensors, for the KL loss term (with
//! gradients). The formulas are on the variants of [`KlEstimator`]; [`kl_slice`](super::kl_slice)
//! computes the same numbers on slices.

use burn::tensor::Tensor;

use super::estimator::{K3_CLAMP, K3_EXP_GUARD, KlEstimator};
use crate::Result;
use crate::loss::shape::{batch_dims, expect_shape};

/// Per-token KL estimate on tensors (see [`KlEstimator`]); differentiable in both inputs (detach
/// `ref_logp` yourself if it should carry no gradient). The k3 clamp zeroes the gradient of
/// clamped tokens.
///
/// # Shapes
/// `logp`, `ref_logp`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn kl_tensor(
    estimator: KlEstimator,
    logp: Tensor<2>,
    ref_logp: Tensor<2>,
) -> Result<Tensor<2>> {
    let dims = batch_dims("logp", &logp)?;
    expect_shape("ref_logp", ref_logp.dims(), dims)?;
    let d = logp - ref_logp;
    Ok(match estimator {
        KlEstimator::K1 => d,
        KlEstimator::Abs => d.abs(),
        KlEstimator::K2 => d.square().mul_scalar(0.5),
        KlEstimator::K3 => {
            let k = d.neg().clamp(-K3_EXP_GUARD, K3_EXP_GUARD);
            (k.clone().exp() - k)
                .sub_scalar(1.0)
                .clamp(-K3_CLAMP, K3_CLAMP)
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::kl::estimator::tests::{ALL, LOGP, REF, expected};
    use burn::tensor::Device;

    #[test]
    fn tensor_form_matches() {
        let dev = Device::flex();
        let logp = Tensor::<2>::from_floats([LOGP], &dev);
        let r = Tensor::<2>::from_floats([REF], &dev);
        for e in ALL {
            let got: Vec<f32> = kl_tensor(e, logp.clone(), r.clone())
                .unwrap()
                .into_data()
                .try_into_vec()
                .unwrap();
            for (g, x) in got.iter().zip(expected(e)) {
                assert!((g - x).abs() < 1e-5, "{e:?}: {got:?}");
            }
        }
    }
}
