//! RMSNorm with HF's arithmetic on Burn's `RmsNorm` parameter.

use burn::nn::{RmsNorm, RmsNormConfig};
use burn::tensor::{Device, Tensor};

/// RMSNorm exactly as HF computes it: `weight * (x * rsqrt(mean(x²) + eps))`.
///
/// Burn's `RmsNorm::forward` divides by the root instead of multiplying by its reciprocal;
/// the two differ in the last bit, which adds up over a deep network. The parameter still lives
/// in Burn's `RmsNorm` (`gamma`), so checkpoints map as usual.
///
/// # Shapes
/// - `x`: `[..., d]`
/// - output: `[..., d]`
pub fn rms_norm_hf<const D: usize>(norm: &RmsNorm, x: Tensor<D>) -> Tensor<D> {
    let inv_rms = (x.clone().square().mean_dim(D - 1) + norm.epsilon)
        .sqrt()
        .recip();
    norm.gamma.val().unsqueeze() * (x * inv_rms)
}

/// An RMSNorm of width `d` with epsilon `eps`.
pub(crate) fn rms_norm(d: usize, eps: f64, device: &Device) -> RmsNorm {
    RmsNormConfig::new(d).with_epsilon(eps).init(device)
}
