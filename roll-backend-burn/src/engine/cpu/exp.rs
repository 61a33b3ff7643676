//! A vectorisable f32 exponential, shared by the softmaxes, SiLU and the sampler.

/// `eˣ` for f32, branch-free so that loops over it vectorise (libm's `expf` is a call per
/// element): `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`, a degree-7 Taylor polynomial for `eʳ`
/// (truncation error < 1e-8 relative), and `2ⁿ` built from its bits. Within 2 ulps of
/// `f32::exp` on `[-87, 88]`; inputs are clamped to that range (below it the result is ~1e-38
/// instead of a denormal or 0, above it finite instead of infinite; NaN gives ~1e-38).
// Always inlined: the callers' loops run under `widest`, whose instructions reach only inlined code.
#[inline(always)]
// `max`/`min` vectorise to `maxps`/`minps`; `clamp` keeps NaN, which costs scalar checks.
#[allow(clippy::manual_clamp)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // ln 2 to 17 bits
    const LN2_LO: f32 = 1.428_606_8e-6; // ln 2 − LN2_HI
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding and subtracting it rounds to an integer
    let x = x.max(-87.0).min(88.0);
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2ⁿ for n ∈ [-126, 127]: `2²³ + n + 127` holds `n + 127` in its low mantissa bits, which
    // the shift moves into the exponent field (a float-to-int cast would not vectorise).
    let biased = n + (8_388_608.0 + 127.0);
    p * f32::from_bits(biased.to_bits() << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_within_a_few_ulps_of_libm() {
        let mut worst = 0.0f32;
        for i in -87_000..88_000 {
            let x = i as f32 * 1e-3 + 1.7e-4;
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 2.5e-7, "max relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) < 1e-37 && exp(1000.0).is_finite());
    }
}
