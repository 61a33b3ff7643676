//! The one random-number helper of roll: a tiny deterministic generator (per-request sampling
//! streams, mocks, environments) and the seed derivation that makes every seed of a run follow
//! from `run.seed`.

/// splitmix64: small, fast, splittable by seed, and good enough for token sampling; no
/// dependency.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// A uniform number in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// splitmix64's output function: a bijective 64-bit mix with good avalanche, so nearby inputs
/// give unrelated outputs.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one component of a run, derived from the run seed and the component's name
/// (`"engine"`, `"trainer"`, `"environments"`, ...): one `run.seed` fixes every random choice, and
/// two components never share a stream by accident.
///
/// ```
/// use roll_core::rng::derive_seed;
/// assert_eq!(derive_seed(42, "engine"), derive_seed(42, "engine"));
/// assert_ne!(derive_seed(42, "engine"), derive_seed(42, "trainer"));
/// assert_ne!(derive_seed(42, "engine"), derive_seed(43, "engine"));
/// ```
pub fn derive_seed(run_seed: u64, component: &str) -> u64 {
    // FNV-1a of the name: stable across Rust versions and platforms, unlike `DefaultHasher`.
    let name = component.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    mix64(run_seed ^ mix64(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_matches_the_reference_splitmix64() {
        // First outputs of splitmix64 seeded with 0 (Vigna's reference implementation).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert!((0.0..1.0).contains(&r.next_f64()));
    }
}
