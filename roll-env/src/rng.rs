//! The seeded random numbers of roll-env: roll-core's [`SplitMix64`] with the draws level
//! generation needs (ranges, coin flips, choices, shuffles).

use roll_core::rng::SplitMix64;

/// A [`SplitMix64`] stream, identical on every platform, so a seed means the same level
/// everywhere.
#[derive(Debug, Clone)]
pub(crate) struct Rng(SplitMix64);

impl Rng {
    /// A generator seeded with `seed`; `stream` separates independent uses of one seed.
    ///
    /// The generator starts at `seed ⊕ stream·0xD1B54A32D192ED03` and skips its first output, so
    /// that nearby seeds and streams do not start on related values.
    pub(crate) fn new(seed: u64, stream: u64) -> Self {
        let mut r = Self(SplitMix64::new(
            seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03),
        ));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A uniform number in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        self.0.next_f64()
    }

    /// A uniform integer in `0..n` (0 when `n` is 0), without modulo bias worth mentioning
    /// (Lemire's multiply-shift).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// `true` with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }

    /// A uniformly chosen element (`None` when empty).
    pub(crate) fn choose<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            items.get(self.below(items.len()))
        }
    }

    /// Shuffles in place (Fisher–Yates).
    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first outputs of `Rng::new(0, 0)`: splitmix64 from state 0 (Steele, Lea & Flood's
    /// reference values 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F), the first
    /// one skipped. Levels depend on this stream; it must not change.
    #[test]
    fn the_stream_is_splitmix64_after_one_skipped_output() {
        let mut r = Rng::new(0, 0);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn streams_are_reproducible_and_below_stays_in_range() {
        let mut a = Rng::new(7, 1);
        let mut b = Rng::new(7, 1);
        let mut c = Rng::new(7, 2);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..8).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(xs[0], c.next_u64());
        let mut counts = [0usize; 3];
        for _ in 0..3000 {
            counts[a.below(3)] += 1;
        }
        assert!(counts.iter().all(|&n| n > 900), "{counts:?}");
        assert_eq!(a.below(0), 0);
        assert!(a.choose::<u8>(&[]).is_none());
    }
}
