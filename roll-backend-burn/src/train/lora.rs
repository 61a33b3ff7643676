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
use roll_core::rng::SplitMix64;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The trainer's deterministic random numbers, drawn from the project's generator
/// ([`SplitMix64`]) and kept as one `u64` so that checkpoints can save and restore it.
///
/// Each request (one number or a whole vector) reads a fresh `SplitMix64` seeded with `state`,
/// and that stream's next output becomes the new state: splitmix's own way of splitting a stream
/// by seeding a new one from it. A request is therefore one unbroken splitmix stream, and the
/// state alone determines everything drawn after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerRng {
    /// The generator state.
    pub state: u64,
}

impl TrainerRng {
    /// A generator seeded with `seed` (mixed with a constant, so that the trainer's numbers differ
    /// from a sampler's seeded with the same value).
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x5DEE_CE66_D1CE_4E5B,
        }
    }

    /// Runs `draw` on the stream seeded with the state, then moves the state on.
    fn stream<T>(&mut self, draw: impl FnOnce(&mut SplitMix64) -> T) -> T {
        let mut rng = SplitMix64::new(self.state);
        let out = draw(&mut rng);
        self.state = rng.next_u64();
        out
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.stream(SplitMix64::next_u64)
    }

    /// A uniform number in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        self.stream(|rng| uniform(rng, lo, hi))
    }

    /// `n` uniform numbers in `[lo, hi)`.
    pub fn uniform_vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        self.stream(|rng| (0..n).map(|_| uniform(rng, lo, hi)).collect())
    }
}

/// A uniform f32 in `[lo, hi)` from the top 24 bits of one draw (exactly representable, so the
/// unit value is below 1).
fn uniform(rng: &mut SplitMix64, lo: f32, hi: f32) -> f32 {
    let unit = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
    lo + (hi - lo) * unit
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

    /// A request is one `SplitMix64` stream from the state, and the state it leaves behind is
    /// all a restored generator needs (what a checkpoint saves).
    #[test]
    fn requests_are_splitmix_streams_and_the_state_restores_them() {
        let mut rng = TrainerRng { state: 42 };
        let xs = rng.uniform_vec(3, 0.0, 1.0);
        let mut reference = SplitMix64::new(42);
        let want: Vec<f32> = (0..3)
            .map(|_| (reference.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
            .collect();
        assert_eq!(xs, want);
        assert_eq!(
            rng.state,
            reference.next_u64(),
            "next state: the stream's next output"
        );

        let mut restored = TrainerRng { state: rng.state };
        assert_eq!(
            rng.uniform_vec(5, -1.0, 1.0),
            restored.uniform_vec(5, -1.0, 1.0)
        );
        assert_eq!(rng.next_u64(), restored.next_u64());
        assert_eq!(rng, restored);
        // Consecutive requests do not repeat each other.
        assert_ne!(rng.uniform_vec(4, 0.0, 1.0), rng.uniform_vec(4, 0.0, 1.0));
    }
}
