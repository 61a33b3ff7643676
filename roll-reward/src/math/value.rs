//! [`Value`]: what an expression is worth — exactly when it can be, approximately (with a
//! bound on the rounding error) when it cannot, and never confused with an overflow or with an
//! undefined result.
//!
//! Evaluating answers in `f64` alone lets wrong answers through: `10^{400}` and `10^{500}` both
//! become `∞`, `e^{-1000}` and `10^{-400}` both become `0`, and `0/0` is a NaN that some
//! comparisons treat as "both undefined, so equal". [`Expr::value`] keeps literals and their
//! sums, products, quotients and integer powers as exact [`Rational`]s; irrational constants
//! and functions (`\pi`, `\sqrt{2}`, `\sin 1`) become floats carrying a running error bound
//! (Wilkinson's running error analysis: each operation adds the propagated input errors and its
//! own half-ulp); a float that overflows or underflows becomes [`Value::Unresolved`]; only a
//! written `\infty` is infinite; and [`compare`] never calls an undefined or unresolved value
//! equal to anything.

use super::expr::{Expr, Func, real_pow};
use super::rational::Rational;

/// Relative rounding error of one `f64` operation (the unit roundoff, `2^-53`, doubled for the
/// library functions, which are within one ulp rather than half an ulp).
const ROUNDOFF: f64 = f64::EPSILON;

/// Factor on the summed error bounds when two floats are compared: the bounds are first-order
/// estimates, so give them some slack.
const ERROR_SLACK: f64 = 4.0;

/// The value of an expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An exact rational: a literal, or sums, differences, products, quotients and integer
    /// powers of exact values.
    Exact(Rational),
    /// A finite float from an irrational constant or function, and a bound on its accumulated
    /// rounding error.
    Approx {
        /// The value.
        value: f64,
        /// Bound on `|value − true value|` (first order).
        error: f64,
    },
    /// `+∞` or `−∞` as written (`\infty`, `∞`); an overflow is [`Unresolved`](Self::Unresolved).
    Infinite {
        /// Whether it is `−∞`.
        negative: bool,
    },
    /// Mathematically undefined: a division by zero, a logarithm of zero or of a negative
    /// number, an even root of a negative number, a factorial of a non-integer, an unbound
    /// variable.
    Undefined,
    /// Defined, but beyond what can be resolved: an exact value past the size bound, a float
    /// that overflowed or underflowed, a division by a float indistinguishable from zero.
    Unresolved,
}

/// How two values compare (see [`compare`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// Equal: exactly for exact values, within tolerance for floats, same sign for infinities.
    Equal,
    /// Different.
    Different,
    /// Both undefined (the same point is outside both domains); never "equal".
    BothUndefined,
    /// At least one value is unresolved: no verdict either way.
    Unknown,
}

/// Compares two values: exact values exactly; floats (or a float and an exact value) within
/// `|a − b| ≤ relative · max(|a|, |b|)` plus their rounding-error bounds; infinities by sign.
/// An undefined value differs from every defined one and is never equal to anything, not even
/// another undefined value.
pub fn compare(a: &Value, b: &Value, relative: f64) -> Agreement {
    use Value::*;
    match (a, b) {
        (Undefined, Undefined) => Agreement::BothUndefined,
        (Unresolved, _) | (_, Unresolved) => Agreement::Unknown,
        (Undefined, _) | (_, Undefined) => Agreement::Different,
        (Infinite { negative: x }, Infinite { negative: y }) => agree(x == y),
        (Infinite { .. }, _) | (_, Infinite { .. }) => Agreement::Different,
        (Exact(x), Exact(y)) => agree(x == y),
        _ => match (a.float(), b.float()) {
            (Some((x, ex)), Some((y, ey))) => {
                let bound = relative * x.abs().max(y.abs()) + ERROR_SLACK * (ex + ey);
                agree((x - y).abs() <= bound)
            }
            _ => Agreement::Unknown,
        },
    }
}

fn agree(equal: bool) -> Agreement {
    if equal {
        Agreement::Equal
    } else {
        Agreement::Different
    }
}

impl Expr {
    /// The value with `vars` bound to exact numbers (an unbound variable is
    /// [`Value::Undefined`]). Unlike [`eval`](Expr::eval), it keeps exact arithmetic exact and
    /// tells overflow, underflow and undefinedness apart.
    ///
    /// ```
    /// use roll_reward::math::{Expr, Value};
    ///
    /// let v = |s: &str| Expr::parse(s).unwrap().value(&[]);
    /// assert_eq!(v("0.1 + 0.2"), v("0.3")); // exact
    /// assert_eq!(v("10^{400}").to_string(), format!("1{}", "0".repeat(400)));
    /// assert_eq!(v("e^{1000}"), Value::Unresolved); // overflows f64
    /// assert_eq!(v(r"\frac{1}{0}"), Value::Undefined);
    /// assert_eq!(v(r"-\infty"), Value::Infinite { negative: true });
    /// ```
    pub fn value(&self, vars: &[(String, Rational)]) -> Value {
        match self {
            Expr::Lit(r) => Value::Exact(r.clone()),
            Expr::Num(x) => constant(*x),
            Expr::Var(v) => vars
                .iter()
                .find(|(n, _)| n == v)
                .map_or(Value::Undefined, |(_, r)| Value::Exact(r.clone())),
            Expr::Neg(a) => a.value(vars).neg(),
            Expr::Add(a, b) => binary(a.value(vars), b.value(vars), Op::Add),
            Expr::Sub(a, b) => binary(a.value(vars), b.value(vars), Op::Sub),
            Expr::Mul(a, b) => binary(a.value(vars), b.value(vars), Op::Mul),
            Expr::Div(a, b) => binary(a.value(vars), b.value(vars), Op::Div),
            Expr::Pow(a, b) => power(a.value(vars), b.value(vars)),
            Expr::Call(f, a) => call(*f, a.value(vars)),
            Expr::Log(base, a) => binary(
                call(Func::Ln, a.value(vars)),
                call(Func::Ln, base.value(vars)),
                Op::Div,
            ),
            Expr::Factorial(a) => factorial(a.value(vars)),
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Exact(r) => write!(f, "{r}"),
            Value::Approx { value, .. } => write!(f, "{value}"),
            Value::Infinite { negative: true } => f.write_str("-∞"),
            Value::Infinite { negative: false } => f.write_str("∞"),
            Value::Undefined => f.write_str("undefined"),
            Value::Unresolved => f.write_str("unresolved"),
        }
    }
}

fn constant(x: f64) -> Value {
    if x.is_nan() {
        Value::Undefined
    } else if x.is_infinite() {
        Value::Infinite { negative: x < 0.0 }
    } else {
        Value::Approx {
            value: x,
            error: x.abs() * ROUNDOFF,
        }
    }
}

impl Value {
    /// `−self`.
    pub fn neg(&self) -> Value {
        match self {
            Value::Exact(r) => Value::Exact(r.neg()),
            Value::Approx { value, error } => Value::Approx {
                value: -value,
                error: *error,
            },
            Value::Infinite { negative } => Value::Infinite {
                negative: !negative,
            },
            other => other.clone(),
        }
    }

    /// The value as a float and its error bound; `None` for non-finite values and exact ones
    /// that `f64` cannot hold (their magnitude would be lost).
    fn float(&self) -> Option<(f64, f64)> {
        match self {
            Value::Exact(r) if r.outside_f64() => None,
            Value::Exact(r) => {
                let x = r.to_f64();
                Some((x, x.abs() * ROUNDOFF / 2.0))
            }
            Value::Approx { value, error } => Some((*value, *error)),
            _ => None,
        }
    }

    /// The value as an IEEE float, infinities included, for arithmetic with an infinity.
    fn ieee(&self) -> Option<f64> {
        match self {
            Value::Infinite { negative: true } => Some(f64::NEG_INFINITY),
            Value::Infinite { negative: false } => Some(f64::INFINITY),
            other => other.float().map(|(x, _)| x),
        }
    }

    fn is_exact_zero(&self) -> bool {
        matches!(self, Value::Exact(r) if r.is_zero())
    }
}

/// `a / b` (a division by exact zero is undefined).
pub(crate) fn quotient(a: Value, b: Value) -> Value {
    binary(a, b, Op::Div)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
}

/// `a op b`: exact when both are; otherwise in floats with the error bound propagated.
fn binary(a: Value, b: Value, op: Op) -> Value {
    use Value::*;
    match (&a, &b) {
        (Undefined, _) | (_, Undefined) => return Undefined,
        (Unresolved, _) | (_, Unresolved) => return Unresolved,
        _ => {}
    }
    if op == Op::Div && b.is_exact_zero() {
        return Undefined;
    }
    if let (Exact(x), Exact(y)) = (&a, &b) {
        let r = match op {
            Op::Add => x.checked_add(y),
            Op::Sub => x.checked_sub(y),
            Op::Mul => x.checked_mul(y),
            Op::Div => x.checked_div(y),
        };
        return r.map_or(Unresolved, Exact);
    }
    if matches!(a, Infinite { .. }) || matches!(b, Infinite { .. }) {
        let (Some(x), Some(y)) = (a.ieee(), b.ieee()) else {
            return Unresolved;
        };
        return from_ieee(match op {
            Op::Add => x + y,
            Op::Sub => x - y,
            Op::Mul => x * y,
            Op::Div => x / y,
        });
    }
    let (Some((x, ex)), Some((y, ey))) = (a.float(), b.float()) else {
        return Unresolved;
    };
    let (r, error) = match op {
        Op::Add => (x + y, ex + ey),
        Op::Sub => (x - y, ex + ey),
        Op::Mul => (x * y, x.abs() * ey + y.abs() * ex + ex * ey),
        Op::Div => {
            if y.abs() <= ey {
                return Unresolved; // the divisor may be zero
            }
            let r = x / y;
            (r, (ex + r.abs() * ey) / (y.abs() - ey))
        }
    };
    let nonzero_operands = x != 0.0 && (op == Op::Div || y != 0.0);
    finish(
        r,
        error,
        matches!(op, Op::Mul | Op::Div) && nonzero_operands,
    )
}

/// A float result with its error bound, or [`Value::Unresolved`] when it overflowed, lost its
/// precision to a subnormal, or (`must_be_nonzero`) underflowed to zero.
fn finish(r: f64, error: f64, must_be_nonzero: bool) -> Value {
    if r.is_nan() {
        return Value::Undefined;
    }
    if r.is_infinite() || (r != 0.0 && !r.is_normal()) || (r == 0.0 && must_be_nonzero) {
        return Value::Unresolved;
    }
    Value::Approx {
        value: r,
        error: error + r.abs() * ROUNDOFF,
    }
}

/// The result of arithmetic with an infinity: NaN (`∞ − ∞`, `0 · ∞`) is undefined.
fn from_ieee(r: f64) -> Value {
    if r.is_nan() {
        Value::Undefined
    } else if r.is_infinite() {
        Value::Infinite { negative: r < 0.0 }
    } else {
        Value::Approx {
            value: r,
            error: 0.0,
        }
    }
}

/// `a ^ b`: exact for exact bases and integer exponents (and square roots of perfect squares),
/// else in floats with odd roots of negative numbers real.
fn power(a: Value, b: Value) -> Value {
    use Value::*;
    match (&a, &b) {
        (Undefined, _) | (_, Undefined) => return Undefined,
        (Unresolved, _) | (_, Unresolved) => return Unresolved,
        _ => {}
    }
    if let (Exact(x), Exact(y)) = (&a, &b) {
        if x.is_zero() && y.is_negative() {
            return Undefined;
        }
        if y.is_integer() {
            return x.checked_pow(y).map_or(Unresolved, Exact);
        }
        if Rational::ratio(1, 2).as_ref() == Some(y)
            && let Some(root) = x.sqrt()
        {
            return Exact(root);
        }
    }
    if matches!(a, Infinite { .. }) || matches!(b, Infinite { .. }) {
        return match (a.ieee(), b.ieee()) {
            (Some(x), Some(y)) => from_ieee(real_pow(x, y)),
            _ => Unresolved,
        };
    }
    let (Some((x, ex)), Some((y, ey))) = (a.float(), b.float()) else {
        return Unresolved;
    };
    if x == 0.0 && y < 0.0 {
        return if ex == 0.0 { Undefined } else { Unresolved };
    }
    let r = real_pow(x, y);
    // d(x^y) = y·x^(y−1)·dx + x^y·ln|x|·dy
    let error = if x == 0.0 {
        0.0
    } else {
        r.abs() * (y.abs() * ex / x.abs() + x.abs().ln().abs() * ey)
    };
    finish(r, error, x != 0.0)
}

/// `f(a)`: `abs` and square roots of perfect squares stay exact; everything else in floats,
/// with a pole or a domain error undefined and an overflow unresolved.
fn call(f: Func, a: Value) -> Value {
    match &a {
        Value::Undefined | Value::Unresolved => return a,
        Value::Exact(r) if f == Func::Abs => return Value::Exact(r.abs()),
        Value::Exact(r) if f == Func::Sqrt => {
            if r.is_negative() {
                return Value::Undefined;
            }
            if let Some(root) = r.sqrt() {
                return Value::Exact(root);
            }
        }
        Value::Infinite { .. } => {
            return a
                .ieee()
                .map_or(Value::Unresolved, |x| from_ieee(f.apply(x)));
        }
        _ => {}
    }
    let Some((x, ex)) = a.float() else {
        return Value::Unresolved;
    };
    let r = f.apply(x);
    if r.is_infinite() {
        // exp, sinh and cosh overflow; the others only reach ∞ at a pole (ln 0, csc 0).
        return if matches!(f, Func::Exp | Func::Sinh | Func::Cosh) {
            Value::Unresolved
        } else {
            Value::Undefined
        };
    }
    let error = f.derivative(x).abs() * ex + r.abs() * ROUNDOFF;
    finish(r, error, f == Func::Exp)
}

/// `n!` for a non-negative integer.
fn factorial(a: Value) -> Value {
    match a {
        Value::Exact(r) => match r.factorial() {
            Some(f) => Value::Exact(f),
            None if r.is_integer() && !r.is_negative() => Value::Unresolved,
            None => Value::Undefined,
        },
        Value::Approx { .. } | Value::Infinite { .. } => Value::Undefined,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Value {
        Expr::parse(s)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .value(&[])
    }

    fn exact(n: i64) -> Value {
        Value::Exact(Rational::from_integer(n))
    }

    #[test]
    fn exact_arithmetic_stays_exact() {
        assert_eq!(v("0.1 + 0.2"), v("0.3"));
        assert_eq!(v(r"\frac{6}{8}"), v("0.75"));
        assert_eq!(v("2^{-2}"), v("0.25"));
        assert_eq!(v(r"\sqrt{16}"), exact(4));
        assert_eq!(v(r"\binom{5}{2}"), exact(10));
        assert_eq!(v("|-3|"), exact(3));
        assert_eq!(v("1.5e3"), exact(1500));
        assert_ne!(v("10^{400}"), v("10^{401}"));
        assert_ne!(v("10^{-400}"), exact(0));
    }

    #[test]
    fn overflow_underflow_and_domain_errors_are_told_apart() {
        assert_eq!(v("e^{1000}"), Value::Unresolved);
        assert_eq!(v("e^{-1000}"), Value::Unresolved);
        assert_eq!(v(r"\pi^{-1000}"), Value::Unresolved);
        assert_eq!(v("2^{100000}"), Value::Unresolved);
        assert_eq!(v("1e999999"), Value::Unresolved);
        assert_eq!(v(r"\frac{1}{0}"), Value::Undefined);
        assert_eq!(v("0^{-1}"), Value::Undefined);
        assert_eq!(v(r"\ln(0)"), Value::Undefined);
        assert_eq!(v(r"\sqrt{-4}"), Value::Undefined);
        assert_eq!(v("(-1)!"), Value::Undefined);
        assert_eq!(v("x"), Value::Undefined);
        assert_eq!(v(r"\infty"), Value::Infinite { negative: false });
        assert_eq!(v(r"-\infty"), Value::Infinite { negative: true });
        assert_eq!(v(r"\infty - \infty"), Value::Undefined);
    }

    #[test]
    fn comparison_rules() {
        let c = |a: &str, b: &str| compare(&v(a), &v(b), 1e-6);
        assert_eq!(c("0.5", r"\frac12"), Agreement::Equal);
        assert_eq!(c("10^{400}", "10^{401}"), Agreement::Different);
        assert_eq!(c("e^{1000}", "e^{1001}"), Agreement::Unknown);
        assert_eq!(c(r"\infty", r"-\infty"), Agreement::Different);
        assert_eq!(c(r"-\infty", r"-\infty"), Agreement::Equal);
        assert_eq!(c(r"\frac{0}{0}", r"\frac{0}{0}"), Agreement::BothUndefined);
        assert_eq!(c(r"\frac{1}{0}", "1"), Agreement::Different);
        assert_eq!(c(r"\sqrt{2}", "1.41421356"), Agreement::Equal);
        assert_eq!(c(r"\pi", "3.14"), Agreement::Different);
        // A rounding error of the size of the operands, not of the (zero) result.
        assert_eq!(c(r"\sin(\pi)", "0"), Agreement::Equal);
        assert_eq!(c(r"\sin(\pi) + 10^{-12}", "0"), Agreement::Different);
    }
}
