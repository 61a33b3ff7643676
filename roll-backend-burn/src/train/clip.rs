//! Global gradient-norm clipping, as `torch.nn.utils.clip_grad_norm_`.
//!
//! Burn's `GradientClippingConfig::Norm` clips each parameter on its own; RL trainers (ROLL,
//! DeepSpeed, FSDP) clip the norm of *all* gradients taken together, which is what this module
//! does.
//!
//! On the CPU each parameter's `Σ g²` is summed on the host in f64, in an order fixed by the code
//! alone ([`sum_of_squares`]), not by the CPU's vector width or the thread count: clipping is
//! active on most steps of a typical run, so the norm's last bit is every update's last bit, and
//! a sum whose order followed the SIMD width (Flex's `sum` does) would train to other bits on an
//! AVX-512 host than on an AVX2 one.

use crate::engine::cpu::vectorized;
use crate::{BackendError, Result};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use rayon::prelude::*;
use std::collections::HashSet;

/// Elements per partial sum of [`sum_of_squares`]: part of its fixed order, so changing it
/// changes the last bits of every norm (and of every run that clips).
const CHUNK: usize = 1 << 15;

/// Independent accumulators within a chunk: also part of the fixed order. Eight f64 lanes are
/// two AVX2 vectors or one AVX-512 vector; the compiler keeps them apart (Rust does not
/// reassociate floating-point sums), so the width only decides how fast they run.
const LANES: usize = 8;

/// `Σ x²` in f64, in one order whatever the CPU, its vector width or the thread count: element
/// `i` of a chunk of [`CHUNK`] goes to accumulator `i mod LANES`; a chunk's accumulators are
/// added in order, then the chunks' sums in order. Each square is exact in f64 (an f32 has 24
/// significant bits), so only the additions round, and much less than f32's would.
pub(crate) fn sum_of_squares(values: &[f32]) -> f64 {
    let partial: Vec<f64> = values.par_chunks(CHUNK).map(chunk_sum_of_squares).collect();
    partial.iter().sum()
}

/// One chunk of [`sum_of_squares`].
fn chunk_sum_of_squares(chunk: &[f32]) -> f64 {
    vectorized!(|| {
        let mut acc = [0f64; LANES];
        let mut lanes = chunk.chunks_exact(LANES);
        for block in &mut lanes {
            for (a, &x) in acc.iter_mut().zip(block) {
                let x = f64::from(x);
                *a += x * x;
            }
        }
        for (a, &x) in acc.iter_mut().zip(lanes.remainder()) {
            let x = f64::from(x);
            *a += x * x;
        }
        acc.iter().sum()
    })
}

/// Collects `Σ g²` of each parameter's gradient, and the first of the `sets` each is in
/// (`sets.len()` for none).
struct SquaredNorms<'a> {
    /// Each gradient is taken out and put back, so that reading it on the CPU moves its buffer
    /// rather than copying it (a tensor `grads` still held would be copied).
    grads: &'a mut GradientsParams,
    sets: &'a [&'a HashSet<ParamId>],
    /// Each parameter's sum, in visiting order: summed on the host already, or a placeholder
    /// for one in `on_device`.
    parts: Vec<f64>,
    /// The sums left on an accelerator (reading every gradient back would cost more than the
    /// step), with their index in `parts`: read back together, in one sync.
    on_device: Vec<(usize, Tensor<1>)>,
    set_of: Vec<usize>,
    /// The first gradient that could not be read back, to report.
    error: Option<String>,
}

impl ModuleVisitor for SquaredNorms<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(g) = self.grads.remove::<D>(param.id) else {
            return;
        };
        let device = g.device();
        let mut part = 0.0;
        if device == Device::flex() {
            let data = g.into_data();
            let sum = match data.as_slice::<f32>() {
                Ok(values) => Ok(sum_of_squares(values)),
                // Another float dtype: summed in f32 from a converted copy.
                Err(_) => data
                    .clone()
                    .convert::<f32>()
                    .as_slice::<f32>()
                    .map(sum_of_squares),
            };
            match sum {
                Ok(sum) => part = sum,
                Err(e) => {
                    self.error
                        .get_or_insert_with(|| format!("{}: {e:?}", param.id));
                }
            }
            self.grads
                .register::<D>(param.id, Tensor::from_data(data, &device));
        } else {
            self.on_device
                .push((self.parts.len(), g.clone().square().sum()));
            self.grads.register::<D>(param.id, g);
        }
        self.parts.push(part);
        let set = self.sets.iter().position(|s| s.contains(&param.id));
        self.set_of.push(set.unwrap_or(self.sets.len()));
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
/// parameter's sum of squares is computed in f64 in a fixed order on the CPU (see `train/clip.rs`),
/// on the device in f32 on an accelerator (one sync for all); they are added on the host in f64,
/// in the module's parameter order. `0` when there is no gradient. The gradients are taken out
/// and put back unchanged (hence `&mut`): on the CPU, reading one then moves its buffer.
///
/// # Errors
/// [`BackendError::Train`] if the sums cannot be read back.
pub fn global_grad_norm<M: Module>(module: &M, grads: &mut GradientsParams) -> Result<f64> {
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
    grads: &mut GradientsParams,
    sets: &[&HashSet<ParamId>],
) -> Result<Vec<f64>> {
    let mut v = SquaredNorms {
        grads,
        sets,
        parts: Vec::new(),
        on_device: Vec::new(),
        set_of: Vec::new(),
        error: None,
    };
    module.visit(&mut v);
    if let Some(e) = v.error {
        return Err(BackendError::Train(format!(
            "cannot read the gradient of parameter {e}"
        )));
    }
    if !v.on_device.is_empty() {
        let (at, sums): (Vec<usize>, Vec<Tensor<1>>) = v.on_device.into_iter().unzip();
        let sums = Tensor::cat(sums, 0)
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .map_err(|e| BackendError::Train(format!("cannot read gradient norms: {e:?}")))?;
        for (i, s) in at.into_iter().zip(sums) {
            v.parts[i] = f64::from(s);
        }
    }
    let mut out = vec![0.0; sets.len() + 1];
    for (part, set) in v.parts.into_iter().zip(v.set_of) {
        out[set] += part;
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
        let after = global_grad_norm(&m, &mut grads).unwrap();
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

    /// The CPU's norm is summed in f64: the squares `10⁸` and sixteen `1`s add up exactly, where
    /// an f32 sum (Flex's, in any lane order) loses the ones against `10⁸` (its spacing there is 8).
    #[test]
    fn norm_on_the_cpu_is_summed_in_f64() {
        let dev = Device::flex().autodiff();
        let mut big = vec![0.0f32; 17];
        big[0] = 1e4;
        let m = Two {
            a: Param::from_tensor(Tensor::from_floats(big.as_slice(), &dev)),
            b: Param::from_tensor(Tensor::from_floats([[0.0, 0.0], [0.0, 0.0]], &dev)),
        };
        // ∂a = a + [0, 1, …, 1]: [10⁴, 1 × 16]; ∂b = 0.
        let ones: Vec<f32> = (0..17).map(|i| if i == 0 { 0.0 } else { 1.0 }).collect();
        let shift = Tensor::<1>::from_floats(ones.as_slice(), &dev);
        let loss = (m.a.val().square().mul_scalar(0.5) + m.a.val() * shift).sum()
            + m.b.val().sum().mul_scalar(0.0);
        let mut grads = GradientsParams::from_grads(loss.backward(), &m);
        let norm = global_grad_norm(&m, &mut grads).unwrap();
        assert_eq!(norm, (1e8f64 + 16.0).sqrt());
    }

    /// The order of [`sum_of_squares`] is the code's, not the thread count's: the same bits with
    /// one thread and with three, over lengths around the chunk and lane boundaries; and exact
    /// where every partial sum is an integer below 2⁵³.
    #[test]
    fn sum_of_squares_is_fixed_by_the_code() {
        for n in [0, 1, 7, 8, 9, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5] {
            let values: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 1001) as f32 * 1.37e-3 - 0.6)
                .collect();
            let with = |threads: usize| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap()
                    .install(|| sum_of_squares(&values))
            };
            assert_eq!(with(1).to_bits(), with(3).to_bits(), "n = {n}");
            let ints: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
            let exact: u64 = (0..n as u64).map(|i| (i % 97) * (i % 97)).sum();
            assert_eq!(sum_of_squares(&ints), exact as f64, "n = {n}");
        }
    }

    #[test]
    fn small_gradients_are_untouched() {
        let (m, mut grads) = setup();
        let pre = clip_grad_norm(&m, &mut grads, 100.0).unwrap();
        let after = global_grad_norm(&m, &mut grads).unwrap();
        assert_eq!(pre, after);
    }
}
