//! LoRA adapters on named linear layers, on top of Burn's parameter reparameterisation.
//!
//! Burn 0.22.1 can attach a [`LoraAdapter`] to any 2-D parameter (`Param::val()` then returns
//! `W + scale·A·B`, gradients flow to `A` and `B` only, records and optimisers see `A`/`B` as
//! ordinary parameters, and `valid().materialize()` merges them). Its own `Lora` reparameteriser
//! draws `A` from Burn's global RNG and selects weights by a path predicate; this one selects by
//! PEFT-style layer name (`q_proj` adapts every `…q_proj.weight`), initialises `A` with PEFT's
//! default (`kaiming_uniform(a=√5)` = `U(−1/√d_in, 1/√d_in)`) from the trainer's seeded RNG and
//! `B = 0`, and freezes every other parameter.

use super::config::LoraConfig;
use crate::{BackendError, Result};
use burn::module::{LoraAdapter, Module, Param, Reparameterizer};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The trainer's deterministic random numbers (SplitMix64): its state is one `u64`, saved in
/// checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerRng {
    /// The generator state.
    pub state: u64,
}

impl TrainerRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x5DEE_CE66_D1CE_4E5B,
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// `n` uniform numbers in `[lo, hi)`.
    pub fn uniform_vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Attaches adapters to the weights of the named linear layers and freezes all other parameters
/// (used through `Module::apply_reparameterization`).
pub(crate) struct LoraAttach<'a> {
    rank: usize,
    scale: f64,
    targets: &'a [String],
    rng: &'a mut TrainerRng,
    /// How many weights each target adapted.
    pub(crate) matched: BTreeMap<String, usize>,
}

impl<'a> LoraAttach<'a> {
    pub(crate) fn new(config: &'a LoraConfig, rng: &'a mut TrainerRng) -> Self {
        Self {
            rank: config.rank,
            scale: config.scale(),
            targets: &config.target_modules,
            rng,
            matched: config
                .target_modules
                .iter()
                .map(|t| (t.clone(), 0))
                .collect(),
        }
    }

    /// The target layer `path` (`…layers.3.self_attn.q_proj.weight`) is the weight of, if any.
    fn target_of(&self, path: &str) -> Option<String> {
        let mut parts = path.rsplit('.');
        if parts.next() != Some("weight") {
            return None;
        }
        let layer = parts.next()?;
        self.targets.iter().find(|t| t.as_str() == layer).cloned()
    }
}

impl LoraAttach<'_> {
    /// Fails if a target module adapted no weight (a typo, or a layer this model lacks).
    pub(crate) fn check_all_matched(&self) -> Result<()> {
        match self.matched.iter().find(|(_, n)| **n == 0) {
            Some((name, _)) => Err(BackendError::InvalidTrainConfig {
                key: "lora.target_modules".into(),
                message: format!(
                    "`{name}` names no 2-D linear weight of this model (Qwen layers: q_proj, \
                     k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
                ),
            }),
            None => Ok(()),
        }
    }
}

impl Reparameterizer for &mut LoraAttach<'_> {
    type Reparam = LoraAdapter;

    fn reparameterize<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<D>>,
    ) -> (Param<Tensor<D>>, Option<LoraAdapter>) {
        (**self).reparameterize(path, param)
    }
}

impl Reparameterizer for LoraAttach<'_> {
    type Reparam = LoraAdapter;

    fn reparameterize<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<D>>,
    ) -> (Param<Tensor<D>>, Option<LoraAdapter>) {
        let param = param.set_require_grad(false);
        if D != 2 {
            return (param, None);
        }
        let Some(target) = self.target_of(path) else {
            return (param, None);
        };
        let [d_in, d_out] = param.lazy_shape().dims::<2>();
        let device = param.lazy_device();
        let bound = 1.0 / (d_in.max(1) as f32).sqrt();
        let a = self.rng.uniform_vec(d_in * self.rank, -bound, bound);
        let a = Tensor::<2>::from_data(TensorData::new(a, [d_in, self.rank]), &device);
        let b = Tensor::<2>::zeros([self.rank, d_out], &device);
        if let Some(n) = self.matched.get_mut(&target) {
            *n += 1;
        }
        let adapter = LoraAdapter {
            a: Param::from_tensor(a),
            b: Param::from_tensor(b),
            scale: self.scale,
        };
        (param, Some(adapter))
    }
}

/// Counts the parameters that have a LoRA adapter attached.
#[derive(Default)]
pub(crate) struct CountAdapters {
    pub(crate) adapted: usize,
}

impl burn::module::ModuleVisitor for CountAdapters {
    // A visitor sees a reparameterised parameter as its base followed by the reparameterisation's
    // own parameters inside a module of container type `Reparameterization`.
    fn enter_module(&mut self, _name: &str, container_type: &str) {
        if container_type == "Reparameterization" {
            self.adapted += 1;
        }
    }
}

/// Number of adapted weights in `module`.
pub(crate) fn count_adapters<M: Module>(module: &M) -> usize {
    let mut c = CountAdapters::default();
    module.visit(&mut c);
    c.adapted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let mut a = TrainerRng::new(7);
        let mut b = TrainerRng::new(7);
        let xs = a.uniform_vec(1000, -0.5, 0.5);
        assert_eq!(xs, b.uniform_vec(1000, -0.5, 0.5));
        assert!(xs.iter().all(|x| (-0.5..0.5).contains(x)));
        let mean: f32 = xs.iter().sum::<f32>() / 1000.0;
        assert!(mean.abs() < 0.05, "{mean}");
        assert_ne!(TrainerRng::new(8).next_u64(), TrainerRng::new(7).next_u64());
    }
}
