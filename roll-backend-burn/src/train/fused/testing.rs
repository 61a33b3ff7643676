//! Helpers of the fused path's gradient tests.

#![allow(clippy::unwrap_used)]

use roll_core::rng::SplitMix64;

/// `n` values in `[-1, 1)` from `seed`.
pub(crate) fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
        .collect()
}

/// Checks `grad` against central finite differences of `loss` at `x` (in f64 around f32 inputs:
/// step 1e-2 with a relative tolerance of 1e-2 on each element, or 1e-3 absolute).
pub(crate) fn check_gradient(x: &[f32], grad: &[f32], loss: impl Fn(&[f32]) -> f64) {
    assert_eq!(x.len(), grad.len());
    let eps = 1e-2f32;
    for i in 0..x.len() {
        let mut plus = x.to_vec();
        plus[i] += eps;
        let mut minus = x.to_vec();
        minus[i] -= eps;
        let numeric = (loss(&plus) - loss(&minus)) / (2.0 * f64::from(eps));
        let analytic = f64::from(grad[i]);
        let err = (numeric - analytic).abs();
        assert!(
            err <= 1e-3 + 1e-2 * numeric.abs(),
            "element {i}: analytic {analytic} vs finite difference {numeric}"
        );
    }
}
