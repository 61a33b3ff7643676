//! [`Rational`]: exact rational numbers of bounded size.
//!
//! Final answers are mostly exact numbers — `42`, `0.75`, `\frac{3}{4}`, `6.02 \times 10^{23}`
//! — and comparing them through `f64` is wrong at both ends: `10^{400}` and `10^{500}` both
//! overflow to `∞` and compare equal, `10^{-400}` and `0` both underflow to `0`, and integers
//! above 2⁵³ collide with their neighbours. A [`Rational`] is a fraction of two big integers,
//! so equal values are equal and different ones differ, whatever their size — up to
//! [`MAX_BITS`] bits in the numerator and the denominator, a bound that keeps every operation
//! cheap (`2^{10^9}` is refused, not computed). Operations that would exceed it return `None`;
//! callers then treat the value as unresolved, never as equal to anything.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};
use std::fmt;

/// Most bits in the numerator or the denominator of a [`Rational`] (about 2,466 decimal
/// digits): enough for every literal of an answer the parser accepts (2,000 bytes) and for
/// powers like `2^{1000}`, small enough that one operation costs microseconds.
pub const MAX_BITS: u64 = 8_192;

/// Largest `n` whose `n!` is computed exactly (`1000!` has 8,530 bits, just over
/// [`MAX_BITS`]).
const MAX_FACTORIAL: u64 = 900;

/// An exact rational number whose numerator and denominator have at most [`MAX_BITS`] bits.
///
/// ```
/// use roll_reward::math::Rational;
///
/// let a = Rational::parse_decimal("0.1").unwrap();
/// let b = Rational::parse_decimal("0.2").unwrap();
/// let c = Rational::parse_decimal("0.3").unwrap();
/// assert_eq!(a.checked_add(&b), Some(c)); // exact, unlike 0.1 + 0.2 in f64
/// let ten = Rational::from_integer(10);
/// let big = ten.checked_pow(&Rational::from_integer(400)).unwrap();
/// assert_ne!(big, ten.checked_pow(&Rational::from_integer(401)).unwrap());
/// assert!(ten.checked_pow(&Rational::from_integer(100_000)).is_none()); // over the bound
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rational(BigRational);

impl Rational {
    /// The integer `n`.
    pub fn from_integer(n: i64) -> Self {
        Self(BigRational::from_integer(BigInt::from(n)))
    }

    /// `0`.
    pub fn zero() -> Self {
        Self(BigRational::zero())
    }

    /// The exact value of a finite float (`0.1` is `3602879701896397/36028797018963968`);
    /// `None` for NaN and infinities.
    pub fn from_f64(x: f64) -> Option<Self> {
        BigRational::from_float(x).and_then(Self::bounded)
    }

    /// `numer / denom`, or `None` when `denom` is 0.
    pub fn ratio(numer: i64, denom: i64) -> Option<Self> {
        (denom != 0).then(|| Self(BigRational::new(numer.into(), denom.into())))
    }

    fn bounded(r: BigRational) -> Option<Self> {
        (r.numer().bits() <= MAX_BITS && r.denom().bits() <= MAX_BITS).then_some(Self(r))
    }

    /// The value of a decimal literal: `12`, `0.50`, `.5`, `3.`, `1.5e-3`, `2E+10` (no sign;
    /// the parser reads `-` as negation). `None` when `text` is not such a literal or its value
    /// exceeds the size bound.
    pub fn parse_decimal(text: &str) -> Option<Self> {
        DecimalLiteral::parse(text).and_then(|d| d.value())
    }

    /// Whether this is zero.
    pub fn is_zero(&self) -> bool {
        self.0.is_zero()
    }

    /// Whether this is an integer.
    pub fn is_integer(&self) -> bool {
        self.0.is_integer()
    }

    /// Whether this is below zero.
    pub fn is_negative(&self) -> bool {
        self.0.is_negative()
    }

    /// `-self`.
    pub fn neg(&self) -> Self {
        Self(-self.0.clone())
    }

    /// `|self|`.
    pub fn abs(&self) -> Self {
        Self(self.0.abs())
    }

    /// `self + other`, `None` past the size bound.
    pub fn checked_add(&self, other: &Self) -> Option<Self> {
        // (a/b) + (c/d) = (ad + cb) / bd: bound the operands before the work.
        let bits = self.0.numer().bits() + other.0.denom().bits();
        let bits = bits.max(other.0.numer().bits() + self.0.denom().bits());
        if bits > MAX_BITS + 1 || self.0.denom().bits() + other.0.denom().bits() > 2 * MAX_BITS {
            return None;
        }
        Self::bounded(&self.0 + &other.0)
    }

    /// `self − other`, `None` past the size bound.
    pub fn checked_sub(&self, other: &Self) -> Option<Self> {
        self.checked_add(&other.neg())
    }

    /// `self · other`, `None` past the size bound.
    pub fn checked_mul(&self, other: &Self) -> Option<Self> {
        let (a, b) = (&self.0, &other.0);
        if a.numer().bits() + b.numer().bits() > 2 * MAX_BITS
            || a.denom().bits() + b.denom().bits() > 2 * MAX_BITS
        {
            return None;
        }
        Self::bounded(a * b)
    }

    /// `self / other`, `None` when `other` is 0 or past the size bound.
    pub fn checked_div(&self, other: &Self) -> Option<Self> {
        if other.is_zero() {
            return None;
        }
        self.checked_mul(&Self(other.0.recip()))
    }

    /// `self ^ exp` for an integer `exp` (negative allowed, `0^0 = 1`); `None` for a
    /// non-integer exponent, for `0` to a negative power, or past the size bound (checked
    /// before any multiplication, so `10^{10^9}` costs nothing).
    pub fn checked_pow(&self, exp: &Self) -> Option<Self> {
        if !exp.is_integer() {
            return None;
        }
        let e = exp.0.to_integer();
        if e.is_zero() {
            return Some(Self::from_integer(1));
        }
        if self.is_zero() {
            return (!e.is_negative()).then(Self::zero);
        }
        if self.abs() == Self::from_integer(1) {
            // ±1 to any power, however large: no work, no bound.
            let odd = e.bit(0); // two's complement: the low bit is the parity, sign or not
            return Some(if odd {
                self.clone()
            } else {
                Self::from_integer(1)
            });
        }
        let n = e.abs().to_u64()?;
        let base = if e.is_negative() {
            self.0.recip()
        } else {
            self.0.clone()
        };
        let too_big = |x: &BigInt| x.bits() > 1 && (x.bits() - 1).saturating_mul(n) > MAX_BITS;
        if too_big(base.numer()) || too_big(base.denom()) {
            return None;
        }
        let n = u32::try_from(n).ok()?;
        Self::bounded(BigRational::new_raw(
            base.numer().pow(n),
            base.denom().pow(n),
        ))
    }

    /// The exact square root when numerator and denominator are perfect squares, else `None`.
    pub fn sqrt(&self) -> Option<Self> {
        if self.is_negative() {
            return None;
        }
        let (n, d) = (self.0.numer().sqrt(), self.0.denom().sqrt());
        (&n * &n == *self.0.numer() && &d * &d == *self.0.denom())
            .then(|| Self(BigRational::new_raw(n, d)))
    }

    /// `n!` for an integer `0 ≤ n ≤ 900`; `None` otherwise.
    pub fn factorial(&self) -> Option<Self> {
        if !self.is_integer() || self.is_negative() {
            return None;
        }
        let n = self
            .0
            .to_integer()
            .to_u64()
            .filter(|n| *n <= MAX_FACTORIAL)?;
        let product = (2..=n).fold(BigInt::one(), |acc, k| acc * k);
        Self::bounded(BigRational::from_integer(product))
    }

    /// The nearest `f64`: `±∞` above its range, `±0` below it.
    pub fn to_f64(&self) -> f64 {
        self.0.to_f64().unwrap_or(f64::NAN)
    }

    /// Whether [`to_f64`](Self::to_f64) loses the magnitude: the value overflows `f64`, or is
    /// non-zero and underflows to zero or a subnormal (a few significant bits).
    pub fn outside_f64(&self) -> bool {
        let x = self.to_f64();
        !x.is_finite() || (!self.is_zero() && !x.is_normal())
    }
}

impl fmt::Display for Rational {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A decimal literal as written: its digits, and how many places after the point it gives.
///
/// The number of places tells how precisely the literal was rounded: `0.333` stands for any
/// value within `0.0005` of it, `3` (no point) for itself only. See
/// [`half_unit`](Self::half_unit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecimalLiteral {
    /// The digits, without the point.
    digits: BigInt,
    /// The power of ten the digits are scaled by: `1.5e-3` is `15 · 10^-4`.
    scale: i64,
    /// Whether the literal has a decimal point.
    has_point: bool,
}

/// Exponents of scientific notation beyond this are refused outright (the value would exceed
/// [`MAX_BITS`] anyway, and parsing the exponent must not overflow).
const MAX_EXPONENT_DIGITS: usize = 6;

impl DecimalLiteral {
    /// Parses `[digits][.digits][(e|E)[+-]digits]` with at least one digit before the
    /// exponent.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (mantissa, exponent) = match text.find(['e', 'E']) {
            Some(i) => (&text[..i], Some(&text[i + 1..])),
            None => (text, None),
        };
        let (int, frac) = match mantissa.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (mantissa, None),
        };
        let frac_digits = frac.unwrap_or("");
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if int.len() + frac_digits.len() == 0 || !all_digits(int) || !all_digits(frac_digits) {
            return None;
        }
        let exp: i64 = match exponent {
            None => 0,
            Some(e) => {
                let body = e.strip_prefix(['+', '-']).unwrap_or(e);
                if body.is_empty() || body.len() > MAX_EXPONENT_DIGITS || !all_digits(body) {
                    return None;
                }
                e.parse().ok()?
            }
        };
        let digits: BigInt = format!("{int}{frac_digits}").parse().ok()?;
        let places = i64::try_from(frac_digits.len()).ok()?;
        Some(Self {
            digits,
            scale: exp - places,
            has_point: frac.is_some(),
        })
    }

    /// The exact value, `None` past the size bound.
    pub(crate) fn value(&self) -> Option<Rational> {
        if self.digits.is_zero() {
            return Some(Rational::zero()); // `0e99999` is 0, however large the exponent
        }
        let ten = Rational::from_integer(10);
        let scale = ten.checked_pow(&Rational::from_integer(self.scale))?;
        Rational(BigRational::from_integer(self.digits.clone())).checked_mul(&scale)
    }

    /// Half a unit in the last written place (`0.0005` for `0.333`, `5·10^20` for
    /// `6.02e23`), when the literal has a decimal point — the most a correctly rounded value
    /// can differ from it. `None` without a point: `3` means exactly three.
    pub(crate) fn half_unit(&self) -> Option<Rational> {
        if !self.has_point {
            return None;
        }
        let ten = Rational::from_integer(10);
        ten.checked_pow(&Rational::from_integer(self.scale))?
            .checked_div(&Rational::from_integer(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Rational {
        Rational::parse_decimal(s).unwrap_or_else(|| panic!("{s}"))
    }

    #[test]
    fn decimals_parse_exactly() {
        assert_eq!(q("0.50"), Rational::ratio(1, 2).unwrap());
        assert_eq!(q(".5"), q("0.5"));
        assert_eq!(q("3."), Rational::from_integer(3));
        assert_eq!(q("1.5e-3"), Rational::ratio(3, 2000).unwrap());
        assert_eq!(q("2E+3"), Rational::from_integer(2000));
        assert_eq!(
            q("100000000000000001").checked_sub(&q("100000000000000000")),
            Some(Rational::from_integer(1))
        );
        for bad in ["", ".", "e5", "1e", "1e+", "1.2.3", "-1", "1e9999999", "x"] {
            assert_eq!(Rational::parse_decimal(bad), None, "{bad:?}");
        }
        // Over the size bound: refused, not rounded.
        assert_eq!(Rational::parse_decimal("1e5000"), None);
    }

    #[test]
    fn arithmetic_is_exact_and_bounded() {
        let third = Rational::ratio(1, 3).unwrap();
        let sum = third.checked_add(&third).unwrap().checked_add(&third);
        assert_eq!(sum, Some(Rational::from_integer(1)));
        assert_eq!(third.checked_div(&Rational::zero()), None);
        let two = Rational::from_integer(2);
        assert_eq!(
            two.checked_pow(&Rational::from_integer(-3)),
            Rational::ratio(1, 8)
        );
        assert_eq!(two.checked_pow(&third), None);
        assert_eq!(
            Rational::zero().checked_pow(&Rational::from_integer(-1)),
            None
        );
        assert!(two.checked_pow(&Rational::from_integer(8_000)).is_some());
        assert!(two.checked_pow(&Rational::from_integer(9_000)).is_none());
        let big = two.checked_pow(&Rational::from_integer(8_000)).unwrap();
        assert!(big.checked_mul(&big).is_none());
        assert_eq!(Rational::ratio(9, 4).unwrap().sqrt(), Rational::ratio(3, 2));
        assert_eq!(two.sqrt(), None);
        assert_eq!(
            Rational::from_integer(5).factorial(),
            Some(Rational::from_integer(120))
        );
        assert_eq!(Rational::from_integer(901).factorial(), None);
        assert_eq!(Rational::ratio(1, 2).unwrap().factorial(), None);
    }

    #[test]
    fn f64_conversion_reports_lost_magnitude() {
        let ten = Rational::from_integer(10);
        let huge = ten.checked_pow(&Rational::from_integer(400)).unwrap();
        let tiny = ten.checked_pow(&Rational::from_integer(-400)).unwrap();
        assert!(huge.outside_f64() && tiny.outside_f64());
        assert!(!Rational::zero().outside_f64());
        assert_eq!(q("0.1").to_f64(), 0.1);
        assert!(!q("0.1").outside_f64());
        // The float 0.1 is not the decimal 0.1.
        let float = Rational::from_f64(0.1).unwrap();
        assert_ne!(float, q("0.1"));
        assert_eq!(float.to_f64(), 0.1);
        assert_eq!(Rational::from_f64(f64::NAN), None);
        assert_eq!(Rational::from_f64(f64::INFINITY), None);
    }

    #[test]
    fn half_units_follow_the_written_places() {
        let d = DecimalLiteral::parse("0.333").unwrap();
        assert_eq!(d.half_unit(), Rational::ratio(1, 2000));
        assert_eq!(DecimalLiteral::parse("3").unwrap().half_unit(), None);
        let sci = DecimalLiteral::parse("6.02e23").unwrap();
        assert_eq!(
            sci.half_unit(),
            Some(Rational::from_integer(5).checked_mul(&q("1e20")).unwrap())
        );
    }
}
