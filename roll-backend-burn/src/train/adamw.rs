//! AdamW as one pass over each parameter's values, with the global-norm clip folded in.
//!
//! Loshchilov & Hutter, *Decoupled Weight Decay Regularization* (2019), with PyTorch's
//! `torch.optim.AdamW` semantics, for gradient `g` (already multiplied by the clip coefficient
//! `c`), step `t` (from 1), learning rate `η`, decay `λ`:
//!
//! ```text
//! m ← β₁·m + (1 − β₁)·c·g            (m = (1 − β₁)·c·g at t = 1)
//! v ← β₂·v + (1 − β₂)·(c·g)²         (v = (1 − β₂)·(c·g)² at t = 1)
//! p ← p·(1 − η·λ) − η · (m / (1 − β₁ᵗ)) / (sqrt(v / (1 − β₂ᵗ)) + ε)
//! ```
//!
//! Burn's `AdamW` computes the same thing as some fifteen whole-tensor operations, each a pass
//! over memory (and, before the step, the clip is one more); [`FusedAdamW`] reads `p`, `g`, `m`,
//! `v` once and writes `p`, `m`, `v` once, in parallel chunks. Every element goes through the
//! same f32 operations in the same order as Burn's (no fused multiply-add, scalars rounded to f32
//! as Flex rounds them), so the two agree **bit for bit** (tested below) and a run's figures do not
//! depend on which optimiser applied them (for f32 parameters; others are updated in f32 and
//! rounded back to their dtype). Its state is Burn's own [`AdamWState`], so checkpoints keep
//! their format (and ones written by Burn's optimiser load).

use super::config::TrainerConfig;
use crate::engine::cpu::vectorized;
use burn::optim::{AdamWState, AdaptiveMomentumState, LearningRate, ModuleOptimizer, Optimizer};
use burn::tensor::{DType, Device, Shape, Tensor, TensorData};
use rayon::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Elements per parallel chunk: large enough that a chunk outweighs rayon's scheduling (the
/// vectorised update takes well under a microsecond per thousand elements).
const CHUNK: usize = 1 << 16;

/// The factor every gradient is multiplied by in the next update (the global-norm clip
/// coefficient, or 1), shared between the trainer that computes it and the optimiser that applies
/// it inside its single pass.
#[derive(Debug, Clone)]
pub(crate) struct GradScale(Arc<AtomicU32>);

impl GradScale {
    pub(crate) fn new() -> Self {
        Self(Arc::new(AtomicU32::new(1f32.to_bits())))
    }

    pub(crate) fn set(&self, factor: f32) {
        self.0.store(factor.to_bits(), Ordering::Relaxed);
    }

    fn get(&self) -> f32 {
        f32::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// AdamW in one pass per parameter (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct FusedAdamW {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
    scale: GradScale,
}

impl FusedAdamW {
    /// The optimiser of `config`, applying `scale` to the gradients.
    pub(crate) fn new(config: &TrainerConfig, scale: GradScale) -> Self {
        Self {
            beta_1: config.betas.0,
            beta_2: config.betas.1,
            epsilon: config.eps,
            weight_decay: config.weight_decay,
            scale,
        }
    }

    /// As a whole-module optimiser (the form the trainers and checkpoints hold).
    pub(crate) fn module_optimizer(config: &TrainerConfig, scale: GradScale) -> ModuleOptimizer {
        ModuleOptimizer::from(Self::new(config, scale))
    }
}

/// The update's per-step constants, each rounded to f32 exactly where Burn's ops round them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Constants {
    beta_1: f32,
    beta_2: f32,
    /// `1 − β₁`, `1 − β₂` (f32, as Burn).
    factor_1: f32,
    factor_2: f32,
    /// `1 − β₁ᵗ`, `1 − β₂ᵗ` (f32 `powi`, as Burn).
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    /// `1 − η·λ` (computed in f64, then rounded), `None` without decay (Burn skips the op).
    decay: Option<f32>,
    /// `η` rounded to f32.
    lr: f32,
    scale: f32,
    /// The first step (`m` and `v` start from zero).
    pub(crate) first: bool,
}

impl Constants {
    /// The constants of `optimizer`'s step number `time` (from 1) at learning rate `lr`.
    fn new(optimizer: &FusedAdamW, lr: LearningRate, time: usize) -> Self {
        let exponent = i32::try_from(time).unwrap_or(i32::MAX);
        let decay_rate = lr * f64::from(optimizer.weight_decay);
        Self {
            beta_1: optimizer.beta_1,
            beta_2: optimizer.beta_2,
            factor_1: 1.0 - optimizer.beta_1,
            factor_2: 1.0 - optimizer.beta_2,
            correction_1: 1f32 - optimizer.beta_1.powi(exponent),
            correction_2: 1f32 - optimizer.beta_2.powi(exponent),
            epsilon: optimizer.epsilon,
            decay: (decay_rate != 0.0).then_some((1.0 - decay_rate) as f32),
            lr: lr as f32,
            scale: optimizer.scale.get(),
            first: time == 1,
        }
    }

    /// For a device kernel: `[β₁, β₂, 1−β₁, 1−β₂, c₁, c₂, ε, decay, lr, scale]`, a missing decay
    /// and scale as 1 (multiplying by 1 changes no bit, so the update is the same).
    #[cfg_attr(not(feature = "gpu-kernels"), allow(dead_code))]
    pub(crate) fn as_array(&self) -> [f32; 10] {
        [
            self.beta_1,
            self.beta_2,
            self.factor_1,
            self.factor_2,
            self.correction_1,
            self.correction_2,
            self.epsilon,
            self.decay.unwrap_or(1.0),
            self.lr,
            self.scale,
        ]
    }

    /// One element: returns the new `(p, m, v)`. `FIRST` is [`Constants::first`], a constant of
    /// the loop that calls it (so that the loop has no branch and vectorises); a scale or decay
    /// of 1 multiplies, which changes no bit, where Burn skips the op.
    #[inline(always)]
    fn update<const FIRST: bool>(
        &self,
        decay: f32,
        p: f32,
        g: f32,
        m: f32,
        v: f32,
    ) -> (f32, f32, f32) {
        let g = g * self.scale;
        let (m, v) = if FIRST {
            (g * self.factor_1, (g * g) * self.factor_2)
        } else {
            (
                m * self.beta_1 + g * self.factor_1,
                v * self.beta_2 + (g * g) * self.factor_2,
            )
        };
        let delta = (m / self.correction_1) / ((v / self.correction_2).sqrt() + self.epsilon);
        (p * decay - delta * self.lr, m, v)
    }

    /// Updates `p`, `m` and `v` in place from `g` (four slices of one length), with the widest
    /// vectors the CPU has: the update is element-wise and its square root and divisions exact,
    /// so the width changes no bit.
    fn apply(&self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        if self.first {
            self.apply_all::<true>(p, m, v, g);
        } else {
            self.apply_all::<false>(p, m, v, g);
        }
    }

    /// [`Constants::apply`] with the first step's branch resolved at compile time.
    fn apply_all<const FIRST: bool>(&self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        let n = p.len();
        // Indexed over slices of one length: a zip of four iterators does not vectorise.
        let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
        let decay = self.decay.unwrap_or(1.0);
        vectorized!(|| {
            for i in 0..n {
                (p[i], m[i], v[i]) = self.update::<FIRST>(decay, p[i], g[i], m[i], v[i]);
            }
        });
    }
}

/// A tensor's values as f32 (the update's arithmetic; a parameter of another float dtype is
/// converted here and back in [`from_values`]). For f32 the buffer moves, it is not copied.
fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    #[allow(clippy::expect_used)] // `convert` made it f32: only a Burn bug could fail here.
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 data reads back as f32")
}

/// A tensor of `dtype` from f32 `values`.
fn from_values<const D: usize>(
    values: Vec<f32>,
    shape: Shape,
    dtype: DType,
    device: &Device,
) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape).convert_dtype(dtype), device)
}

impl Optimizer for FusedAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let shape = tensor.shape();
        let device = tensor.device();
        let dtype = tensor.dtype();
        let n = shape.num_elements();
        let time = state.as_ref().map_or(1, |s| s.momentum.time + 1);
        let c = Constants::new(self, lr, time);
        // On a GPU the same update runs as one kernel over the device buffers.
        #[cfg(feature = "gpu-kernels")]
        if dtype == DType::F32 && crate::gpu::on_cube_device(&tensor) {
            let (m, v) = match state {
                Some(s) => (s.momentum.moment_1, s.momentum.moment_2),
                None => (tensor.zeros_like(), tensor.zeros_like()),
            };
            #[allow(clippy::expect_used)]
            // four tensors of one shape on one device, by construction
            let (p, m, v) = crate::gpu::adamw_apply(tensor, grad, m, v, &c)
                .expect("the parameter, its gradient and moments share shape and device");
            let state = AdamWState {
                momentum: AdaptiveMomentumState {
                    time,
                    moment_1: m,
                    moment_2: v,
                    max_moment_2: None,
                },
            };
            return (p, Some(state));
        }
        let mut p = values(tensor);
        let g = values(grad);
        let (mut m, mut v) = match state {
            Some(s) => (values(s.momentum.moment_1), values(s.momentum.moment_2)),
            None => (vec![0.0; n], vec![0.0; n]),
        };
        p.par_chunks_mut(CHUNK)
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|(((p, m), v), g)| c.apply(p, m, v, g));
        let state = AdamWState {
            momentum: AdaptiveMomentumState {
                time,
                moment_1: from_values(m, shape.clone(), dtype, &device),
                moment_2: from_values(v, shape.clone(), dtype, &device),
                max_moment_2: None,
            },
        };
        (from_values(p, shape, dtype, &device), Some(state))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &Device) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::train::clip::TwoParams as Two;
    use burn::module::Param;
    use burn::optim::{AdamWConfig, GradientsParams};
    use burn::tensor::Distribution;

    /// Burn's own AdamW with `config`'s hyper-parameters: the reference the fused one must equal.
    fn burns_adamw(config: &TrainerConfig) -> ModuleOptimizer {
        AdamWConfig::new()
            .with_beta_1(config.betas.0)
            .with_beta_2(config.betas.1)
            .with_epsilon(config.eps)
            .with_weight_decay(config.weight_decay)
            .init()
    }

    fn bits(m: &Two) -> Vec<u32> {
        let a: Vec<f32> = m.a.val().into_data().try_to_vec().unwrap();
        let b: Vec<f32> = m.b.val().into_data().try_to_vec().unwrap();
        a.iter().chain(&b).map(|x| x.to_bits()).collect()
    }

    /// Five steps of the fused optimiser and of Burn's `AdamW` on the same parameters and
    /// gradients (random, including a clip coefficient below 1, weight decay on and off, a
    /// parameter large enough to be cut into several parallel chunks): the parameters agree bit
    /// for bit after every step.
    #[test]
    fn the_fused_update_is_burns_adamw_bit_for_bit() {
        let dev = Device::flex().autodiff();
        for weight_decay in [0.0, 0.1] {
            let config = TrainerConfig {
                weight_decay,
                ..TrainerConfig::default()
            };
            let init = || Two {
                a: Param::from_tensor(Tensor::from_floats([1.0, -2.0, 0.0], &dev)),
                b: Param::from_tensor(Tensor::random(
                    [300, CHUNK / 100],
                    Distribution::Normal(0.0, 1.0),
                    &dev,
                )),
            };
            let mut ours = init();
            let mut theirs = ours.clone();
            assert_eq!(bits(&ours), bits(&theirs));
            let scale = GradScale::new();
            let mut fused = FusedAdamW::module_optimizer(&config, scale.clone());
            let mut burn = burns_adamw(&config);
            for (step, factor) in [1.0f32, 0.37, 1.0, 0.5, 0.9].into_iter().enumerate() {
                let target = Tensor::<2>::random(ours.b.dims(), Distribution::Default, &dev);
                let grads_of = |m: &Two| {
                    let loss = m.a.val().powf_scalar(2.0).sum().mul_scalar(1.5)
                        + (m.b.val() - target.clone()).powf_scalar(2.0).sum();
                    GradientsParams::from_grads(loss.backward(), m)
                };
                let lr = 1e-3 * (step + 1) as f64;
                scale.set(factor);
                let grads = grads_of(&ours);
                ours = fused.step(lr, ours, grads);
                // Burn's optimiser gets the clip applied beforehand, as the trainer used to do.
                let mut grads = grads_of(&theirs);
                if factor != 1.0 {
                    let ga = grads.remove::<1>(theirs.a.id).unwrap();
                    grads.register::<1>(theirs.a.id, ga.mul_scalar(factor));
                    let gb = grads.remove::<2>(theirs.b.id).unwrap();
                    grads.register::<2>(theirs.b.id, gb.mul_scalar(factor));
                }
                theirs = burn.step(lr, theirs, grads);
                assert_eq!(
                    bits(&ours),
                    bits(&theirs),
                    "step {step}, weight decay {weight_decay}"
                );
            }
        }
    }

    /// A state Burn's `AdamW` recorded (what checkpoints written before this optimiser hold)
    /// resumes in the fused one: the next update is the bits Burn's own next update gives.
    #[test]
    fn a_state_recorded_by_burns_adamw_resumes_bit_for_bit() {
        let dev = Device::flex().autodiff();
        let config = TrainerConfig::default();
        let target = Tensor::<2>::random([4, 3], Distribution::Default, &dev);
        let grads_of = |m: &Two| {
            let loss = m.a.val().powf_scalar(2.0).sum()
                + (m.b.val() - target.clone()).powf_scalar(2.0).sum();
            GradientsParams::from_grads(loss.backward(), m)
        };
        let mut m = Two {
            a: Param::from_tensor(Tensor::from_floats([0.5, -1.5], &dev)),
            b: Param::from_tensor(Tensor::random([4, 3], Distribution::Default, &dev)),
        };
        let mut burn = burns_adamw(&config);
        for _ in 0..2 {
            let grads = grads_of(&m);
            m = burn.step(1e-2, m, grads);
        }
        let mut resumed =
            FusedAdamW::module_optimizer(&config, GradScale::new()).load_record(burn.to_record());
        let grads = grads_of(&m);
        let ours = resumed.step(1e-2, m.clone(), grads);
        let grads = grads_of(&m);
        let theirs = burn.step(1e-2, m, grads);
        assert_eq!(bits(&ours), bits(&theirs));
    }
}
