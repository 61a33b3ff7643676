//! KL divergence to a reference policy: per-token estimators (as a reward penalty on slices and,
//! with the `tensor` feature, as a loss term on tensors) and the controllers of the KL-in-reward
//! coefficient.
//!
//! * [`estimator`]: [`KlEstimator`] (k1, abs, k2/mse, k3) and [`kl_slice`].
//! * [`tensor`](mod@tensor) (feature `tensor`): [`kl_tensor`], the same estimators on Burn tensors.
//! * [`controller`]: [`KlController`] (fixed, adaptive) and its running [`KlControllerState`].

pub mod controller;
pub mod estimator;
#[cfg(feature = "tensor")]
pub mod tensor;

pub use controller::{KlController, KlControllerState};
pub use estimator::{KlEstimator, kl_slice};
#[cfg(feature = "tensor")]
pub use tensor::kl_tensor;
