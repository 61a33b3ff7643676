//! Shared statistics: sample moments, masked moments, standardisation, group layout and input checks.
//!
//! Every estimator and shaping step that needs a mean, a standard deviation or a group of contiguous
//! samples takes it from here, so the conventions below hold crate-wide:
//!
//! * sums are accumulated in `f64` and the variance is computed in two passes (mean first, then the
//!   squared deviations), so an all-equal group gives a mean equal to its members and a standard
//!   deviation of exactly 0;
//! * the standard deviation is the unbiased (Bessel-corrected) one, `sqrt(Σ(x − μ)² / (n − 1))`, as
//!   `torch.std` computes it; a set of fewer than two values has standard deviation 0;
//! * dividing by a standard deviation `σ` means dividing by `σ + 1e-6` ([`STD_EPS`]), and when
//!   `σ ≤ 1e-6` the result is defined as 0 (the values carry no relative signal).

use std::collections::HashMap;
use std::hash::Hash;

use crate::{AlgoError, Result};

/// Added to a standard deviation before dividing by it, `x / (σ + STD_EPS)`; also the threshold at
/// or below which a standard deviation counts as zero (ROLL's constant).
pub const STD_EPS: f32 = 1e-6;

/// Added to a variance before taking its inverse square root in whitening, `x / sqrt(var + VAR_EPS)`
/// (ROLL's constant).
pub const VAR_EPS: f32 = 1e-8;

/// [`STD_EPS`] as the `f64` literal it stands for, so `σ ≤ 1e-6` compares exactly.
const STD_EPS_F64: f64 = 1e-6;

/// Count, mean and unbiased standard deviation of a set of values.
///
/// `mean = Σx / n` (0 when `n = 0`), `std = sqrt(Σ(x − mean)² / (n − 1))` (0 when `n < 2`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
    /// Number of values.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Unbiased standard deviation; 0 for fewer than two values.
    pub std: f64,
}

impl Moments {
    /// Moments of every value in `xs`: `mean = Σx/n`, `std = sqrt(Σ(x − mean)²/(n − 1))`.
    pub fn of(xs: &[f32]) -> Self {
        Self::of_iter(xs.iter().copied())
    }

    /// Moments of the values whose mask is `true`:
    /// `mean = Σ x·m / Σ m`, `std = sqrt(Σ m·(x − mean)² / (Σ m − 1))`.
    ///
    /// Values at masked-off positions are never read, so they cannot influence the result (even
    /// if they are NaN).
    pub fn of_masked(xs: &[f32], mask: &[bool]) -> Result<Self> {
        check_len("mask", xs.len(), mask.len())?;
        Ok(Self::of_iter(
            xs.iter().zip(mask).filter(|(_, m)| **m).map(|(x, _)| *x),
        ))
    }

    /// Two-pass moments of an iterator that can be replayed.
    fn of_iter<I: Iterator<Item = f32> + Clone>(values: I) -> Self {
        let (count, sum) = values
            .clone()
            .fold((0usize, 0.0f64), |(n, s), x| (n + 1, s + f64::from(x)));
        if count == 0 {
            return Self {
                count,
                mean: 0.0,
                std: 0.0,
            };
        }
        let mean = sum / count as f64;
        let std = if count < 2 {
            0.0
        } else {
            let squares: f64 = values.map(|x| (f64::from(x) - mean).powi(2)).sum();
            (squares / (count - 1) as f64).sqrt()
        };
        Self { count, mean, std }
    }
}

/// Subtracts a mean and optionally divides by a standard deviation, in place:
///
/// * `std = None`: `y = x − mean`;
/// * `std = Some(σ)` with `σ > 1e-6`: `y = (x − mean) / (σ + 1e-6)`;
/// * `std = Some(σ)` with `σ ≤ 1e-6` (including a group of one, whose σ is 0): `y = 0`.
///
/// The last rule departs from ROLL's RLVR `reward_norm`, which divides by `σ + 1e-6` regardless and
/// so turns round-off in `x − mean` into values of order 1e6 for a nearly constant group; it matches
/// ROLL's agentic `agentic_reward_norm`.
pub fn standardize(xs: &mut [f32], mean: f64, std: Option<f64>) {
    xs.iter_mut()
        .for_each(|x| *x = standardize_value(*x, mean, std));
}

/// One value under the rules of [`standardize`]: `x − mean`, `(x − mean) / (σ + 1e-6)`, or 0 when
/// `σ ≤ 1e-6`.
pub fn standardize_value(x: f32, mean: f64, std: Option<f64>) -> f32 {
    match std {
        None => (f64::from(x) - mean) as f32,
        Some(s) if s.is_nan() || s <= STD_EPS_F64 => 0.0,
        Some(s) => ((f64::from(x) - mean) / (s + STD_EPS_F64)) as f32,
    }
}

/// The moments of each value's key set: `out_i = Moments::of({x_j : keys_j = keys_i})`.
///
/// A key set is every sample with an equal key, wherever it sits in the batch and however many
/// there are (ROLL's `DataProto.group_by` before `agentic_reward_norm`); contiguous groups of
/// `n` are the keys `⌊i / n⌋`. Values are summed in index order, so the result does not depend on
/// how the keys hash.
///
/// # Shapes
/// `xs`, `keys`: `[N]` → `[N]`. Fails with [`AlgoError::LengthMismatch`] when the lengths differ.
pub fn moments_by_key<K: Eq + Hash>(xs: &[f32], keys: &[K]) -> Result<Vec<Moments>> {
    check_len("keys", xs.len(), keys.len())?;
    let mut members: HashMap<&K, Vec<usize>> = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        members.entry(k).or_default().push(i);
    }
    let mut out = vec![Moments::of(&[]); xs.len()];
    for rows in members.values() {
        let m = Moments::of_iter(rows.iter().map(|&i| xs[i]));
        rows.iter().for_each(|&i| out[i] = m);
    }
    Ok(out)
}

/// Normalises a set of values by its own moments, in place:
/// `y = (x − mean(x)) / (std(x) + 1e-6)` when `std_normalize`, else `y = x − mean(x)`
/// (see [`standardize`] for the zero-spread rule).
pub fn normalize_in_place(xs: &mut [f32], std_normalize: bool) {
    let m = Moments::of(xs);
    standardize(xs, m.mean, std_normalize.then_some(m.std));
}

/// Checks that a batch of `len` samples splits into contiguous groups of `group_size`
/// (samples `[k·n, (k+1)·n)` form group `k`) and returns the number of groups, `len / group_size`.
///
/// Fails with [`AlgoError::GroupSize`] when `group_size` is 0 or does not divide `len`.
pub fn group_count(len: usize, group_size: usize) -> Result<usize> {
    if group_size == 0 || !len.is_multiple_of(group_size) {
        return Err(AlgoError::GroupSize {
            group_size,
            batch: len,
        });
    }
    Ok(len / group_size)
}

/// Fails with [`AlgoError::LengthMismatch`] unless `actual == expected`.
pub fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(AlgoError::LengthMismatch {
            what,
            expected,
            actual,
        })
    }
}

/// Fails with [`AlgoError::NonFinite`] at the first NaN or infinite value of `xs`.
pub fn check_finite(what: &'static str, xs: &[f32]) -> Result<()> {
    match xs.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(index) => Err(AlgoError::NonFinite {
            what,
            index,
            value: xs[index],
        }),
    }
}

/// Fails with [`AlgoError::NonFinite`] at the first NaN or infinite value of `xs` whose mask is
/// `true`; masked-off positions may hold anything. `mask` must be as long as `xs`.
pub fn check_finite_masked(what: &'static str, xs: &[f32], mask: &[bool]) -> Result<()> {
    check_len("mask", xs.len(), mask.len())?;
    match xs.iter().zip(mask).position(|(x, m)| *m && !x.is_finite()) {
        None => Ok(()),
        Some(index) => Err(AlgoError::NonFinite {
            what,
            index,
            value: xs[index],
        }),
    }
}

/// Fails with [`AlgoError::InvalidValue`] naming `key` unless `ok`; the config `validate` methods
/// are written with it.
pub(crate) fn ensure(
    ok: bool,
    key: &str,
    value: impl std::fmt::Display,
    allowed: &str,
) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(AlgoError::InvalidValue {
            key: key.to_owned(),
            value: value.to_string(),
            allowed: allowed.to_owned(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn moments_of_small_sets() {
        let m = Moments::of(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m.count, 4);
        assert!(close(m.mean, 2.5));
        // Σ(x − 2.5)² = 5, /3 → 1.666667, sqrt → 1.290994.
        assert!(close(m.std, 1.290_994_4));
        let one = Moments::of(&[7.0]);
        assert_eq!((one.count, one.mean, one.std), (1, 7.0, 0.0));
        let none = Moments::of(&[]);
        assert_eq!((none.count, none.mean, none.std), (0, 0.0, 0.0));
    }

    #[test]
    fn masked_moments_ignore_masked_values() {
        let m = Moments::of_masked(&[1.0, f32::NAN, 3.0], &[true, false, true]).unwrap();
        assert_eq!(m.count, 2);
        assert!(close(m.mean, 2.0));
        assert!(close(m.std, 2f64.sqrt()));
        assert!(Moments::of_masked(&[1.0], &[true, true]).is_err());
    }

    #[test]
    fn all_equal_values_have_exactly_zero_spread() {
        let m = Moments::of(&[0.1, 0.1, 0.1]);
        assert_eq!(m.std, 0.0);
        assert_eq!(m.mean as f32, 0.1);
        let mut xs = [0.1f32, 0.1, 0.1];
        normalize_in_place(&mut xs, false);
        assert_eq!(xs, [0.0; 3]);
    }

    #[test]
    fn standardize_rules() {
        let mut xs = [1.0f32, 3.0];
        standardize(&mut xs, 2.0, None);
        assert_eq!(xs, [-1.0, 1.0]);
        let mut xs = [1.0f32, 3.0];
        standardize(&mut xs, 2.0, Some(2.0));
        assert!((xs[0] + 0.499_999_75).abs() < 1e-7);
        let mut xs = [1.0f32, 3.0];
        standardize(&mut xs, 2.0, Some(1e-7));
        assert_eq!(xs, [0.0, 0.0]);
    }

    #[test]
    fn moments_by_key_groups_scattered_keys() {
        // Keys a, b, a, c, b: set a = {1, 3} (mean 2, std sqrt(2)), set b = {4, 8} (mean 6,
        // std sqrt(8)), set c = {5} (mean 5, std 0).
        let m = moments_by_key(&[1.0, 4.0, 3.0, 5.0, 8.0], &['a', 'b', 'a', 'c', 'b']).unwrap();
        let got: Vec<(usize, f64, f64)> = m.iter().map(|m| (m.count, m.mean, m.std)).collect();
        let (r2, r8) = (2f64.sqrt(), 8f64.sqrt());
        let want = [
            (2, 2.0, r2),
            (2, 6.0, r8),
            (2, 2.0, r2),
            (1, 5.0, 0.0),
            (2, 6.0, r8),
        ];
        for ((n, mean, std), (wn, wmean, wstd)) in got.into_iter().zip(want) {
            assert!(n == wn && close(mean, wmean) && close(std, wstd), "{m:?}");
        }
        assert_eq!(
            moments_by_key(&[1.0, 2.0], &[0u8]),
            Err(AlgoError::LengthMismatch {
                what: "keys",
                expected: 2,
                actual: 1
            })
        );
        assert!(moments_by_key::<u8>(&[], &[]).unwrap().is_empty());
    }

    #[test]
    fn group_count_checks_layout() {
        assert_eq!(group_count(8, 4).unwrap(), 2);
        assert_eq!(group_count(0, 4).unwrap(), 0);
        assert_eq!(
            group_count(6, 4),
            Err(AlgoError::GroupSize {
                group_size: 4,
                batch: 6
            })
        );
        assert!(group_count(6, 0).is_err());
    }

    #[test]
    fn finiteness_checks() {
        assert!(check_finite("x", &[1.0, 2.0]).is_ok());
        assert_eq!(
            check_finite("x", &[1.0, f32::INFINITY]),
            Err(AlgoError::NonFinite {
                what: "x",
                index: 1,
                value: f32::INFINITY
            })
        );
        assert!(check_finite_masked("x", &[1.0, f32::NAN], &[true, false]).is_ok());
        assert!(check_finite_masked("x", &[1.0, f32::NAN], &[true, true]).is_err());
        assert!(check_len("x", 2, 3).is_err());
    }
}
