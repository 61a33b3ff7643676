//! Global gradient-norm clipping, as `torch.nn.utils.clip_grad_norm_`.
//!
//! Burn's `GradientClippingConfig::Norm` clips each parameter on its own; RL trainers (ROLL,
//! DeepSpeed, FSDP) clip the norm of *all* gradients taken together, which is what this module
//! does.

use crate::{BackendError, Result};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use std::collections::HashSet;

/// Collects `Σ g²` of each parameter's gradient (one `[1]` tensor per parameter), and the first
/// of the `sets` each is in (`sets.len()` for none).
struct SquaredNorms<'a> {
    grads: &'a GradientsParams,
    sets: &'a [&'a HashSet<ParamId>],
    parts: Vec<Tensor<1>>,
    set_of: Vec<usize>,
}

impl ModuleVisitor for SquaredNorms<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            self.parts.push(g.square().sum());
            let set = self.sets.iter().position(|s| s.contains(&param.id));
            self.set_of.push(set.unwrap_or(self.sets.len()));
        }
    }
}

/// Multiplies every gradient by `factor`.
struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f32,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads
                .register::<D>(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// The global L2 norm `sqrt(Σ_params Σ g²)` of the gradients of `module`'s parameters. Each
/// parameter's sum of squares is computed on the device in f32; they are added on the host in
/// f64 (one device sync). `0` when there is no gradient.
///
/// # Errors
/// [`BackendError::Train`] if the sums cannot be read back.
pub fn global_grad_norm<M: Module>(module: &M, grads: &GradientsParams) -> Result<f64> {
    // No sets: one sum, over every parameter.
    let whole: f64 = squared_norms(module, grads, &[])?.iter().sum();
    Ok(whole.sqrt())
}

/// `Σ g²` over the gradients of `module`'s parameters, split by the first of `sets` each is in
/// (a tensor-parallel rank's slices, a stage's layers: squares a group adds up), the last of
/// the `sets.len() + 1` sums over those in none.
///
/// # Errors
/// As [`global_grad_norm`].
pub(crate) fn squared_norms<M: Module>(
    module: &M,
    grads: &GradientsParams,
    sets: &[&HashSet<ParamId>],
) -> Result<Vec<f64>> {
    let mut v = SquaredNorms {
        grads,
        sets,
        parts: Vec::new(),
        set_of: Vec::new(),
    };
    module.visit(&mut v);
    let mut out = vec![0.0; sets.len() + 1];
    if v.parts.is_empty() {
        return Ok(out);
    }
    let sums = Tensor::cat(v.parts, 0)
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| BackendError::Train(format!("cannot read gradient norms: {e:?}")))?;
    for (s, set) in sums.iter().zip(v.set_of) {
        out[set] += f64::from(*s);
    }
    Ok(out)
}

/// Scales all gradients by `max_norm / (norm + 1e-6)` when that is below 1, exactly as
/// `torch.nn.utils.clip_grad_norm_`, and returns the pre-clip global norm. A non-finite norm is
/// returned without touching the gradients (the caller decides whether to skip the update).
///
/// # Errors
/// As [`global_grad_norm`].
pub fn clip_grad_norm<M: Module>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f32,
) -> Result<f64> {
    let norm = global_grad_norm(module, grads)?;
    let factor = clip_coefficient(norm, max_norm);
    if factor != 1.0 {
        module.visit(&mut Scale { grads, factor });
    }
    Ok(norm)
}

/// What `torch.nn.utils.clip_grad_norm_` multiplies every gradient by for a global norm `norm`:
/// `max_norm / (norm + 1e-6)` when that is below 1, else 1 (also 1 for a non-finite norm, whose
/// update the caller skips).
pub(crate) fn clip_coefficient(norm: f64, max_norm: f32) -> f32 {
    let coef = f64::from(max_norm) / (norm + 1e-6);
    if norm.is_finite() && coef < 1.0 {
        coef as f32
    } else {
        1.0
    }
}

/// A module of two parameters (ranks 1 and 2): what the clipping and optimiser tests update.
#[cfg(test)]
#[derive(Module, Debug)]
pub(crate) struct TwoParams {
    pub a: Param<Tensor<1>>,
    pub b: Param<Tensor<2>>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::TwoParams as Two;
    use super::*;
    use burn::tensor::Device;

    fn setup() -> (Two, GradientsParams) {
        let dev = Device::flex().autodiff();
        let m = Two {
            a: Param::from_tensor(Tensor::from_floats([1.0, -2.0], &dev)),
            b: Param::from_tensor(Tensor::from_floats([[0.5, 1.0], [2.0, 3.0]], &dev)),
        };
        // loss = 3·Σa + Σ b²  → ∂a = [3, 3], ∂b = 2b = [[1, 2], [4, 6]].
        let loss = m.a.val().sum().mul_scalar(3.0) + m.b.val().square().sum();
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        (m, grads)
    }

    #[test]
    fn norm_of_all_parameters_together() {
        let (m, mut grads) = setup();
        let expected = (9.0f64 + 9.0 + 1.0 + 4.0 + 16.0 + 36.0).sqrt(); // √75
        let pre = clip_grad_norm(&m, &mut grads, 1.0).unwrap();
        assert!((pre - expected).abs() < 1e-6, "{pre}");
        let after = global_grad_norm(&m, &grads).unwrap();
        assert!(after <= 1.0 + 1e-4 && after > 0.99, "{after}");
        // The direction is kept: every gradient is scaled by the same factor.
        let ga: Vec<f32> = grads
            .get::<1>(m.a.id)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        let gb: Vec<f32> = grads
            .get::<2>(m.b.id)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        let f = 1.0 / (expected + 1e-6);
        for (g, raw) in ga.iter().chain(&gb).zip([3.0, 3.0, 1.0, 2.0, 4.0, 6.0]) {
            assert!((f64::from(*g) - raw * f).abs() < 1e-6);
        }
    }

    #[test]
    fn small_gradients_are_untouched() {
        let (m, mut grads) = setup();
        let pre = clip_grad_norm(&m, &mut grads, 100.0).unwrap();
        let after = global_grad_norm(&m, &grads).unwrap();
        assert_eq!(pre, after);
    }
}
