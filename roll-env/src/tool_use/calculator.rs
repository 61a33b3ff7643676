//! The calculator tool: exact-enough arithmetic on `f64` with `+ - * / ^`, parentheses and unary
//! minus (`×`, `÷` and `**` accepted too, and `,` as a thousands separator).
//!
//! Parsing and evaluation are roll-reward's [`Expr`]; this module is the calculator's rules on
//! top of it. `Expr` reads far more (variables, functions, LaTeX, implicit multiplication), so
//! the calculator first allows only digits, `.`, the operators, parentheses and whitespace, then
//! refuses an implicit product (`2(3)`, `1 2`: more products in the tree than `*` in the text),
//! a division by zero anywhere in the expression, and a result that is not finite.

use roll_reward::math::Expr;

/// Longest expression accepted, in bytes.
const MAX_LEN: usize = 256;

/// Evaluates `expr`.
///
/// # Errors
/// A message for the agent: a character the calculator does not know, a syntax error (from
/// [`Expr::parse`]), a missing operator, division by zero, a non-finite result, or an
/// expression too long.
///
/// ```
/// use roll_env::tool_use::calculator::evaluate;
/// assert_eq!(evaluate("2 + 3 * (4 - 1) ^ 2"), Ok(29.0));
/// assert!(evaluate("1 / 0").is_err());
/// assert!(evaluate("2x").is_err());
/// ```
pub fn evaluate(expr: &str) -> Result<f64, String> {
    if expr.len() > MAX_LEN {
        return Err(format!("expression longer than {MAX_LEN} characters"));
    }
    let normalised = expr
        .replace('×', "*")
        .replace('÷', "/")
        .replace("**", "^")
        .replace(',', "");
    if let Some(c) = normalised
        .chars()
        .find(|c| !(c.is_ascii_digit() || c.is_whitespace() || "+-*/^().".contains(*c)))
    {
        return Err(format!(
            "unexpected `{c}`: the calculator knows numbers, + - * / ^ and parentheses"
        ));
    }
    let parsed = Expr::parse(&normalised)?;
    let written = normalised.matches('*').count();
    if products(&parsed) > written {
        return Err("missing operator between two numbers or parentheses".into());
    }
    if divides_by_zero(&parsed) {
        return Err("division by zero".into());
    }
    let v = parsed.eval(&[]);
    if v.is_finite() {
        Ok(v)
    } else {
        Err("the result is not a finite number".into())
    }
}

/// The number of products in `e` (the only other place `Expr` makes one is implicit
/// multiplication, which the character check leaves as the only way).
fn products(e: &Expr) -> usize {
    match e {
        Expr::Num(_) | Expr::Var(_) => 0,
        Expr::Mul(a, b) => 1 + products(a) + products(b),
        Expr::Neg(a) | Expr::Call(_, a) | Expr::Factorial(a) => products(a),
        Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Div(a, b) | Expr::Pow(a, b) | Expr::Log(a, b) => {
            products(a) + products(b)
        }
    }
}

/// Whether some division in `e` has a divisor that evaluates to exactly zero.
fn divides_by_zero(e: &Expr) -> bool {
    match e {
        Expr::Num(_) | Expr::Var(_) => false,
        Expr::Div(a, b) => b.eval(&[]) == 0.0 || divides_by_zero(a) || divides_by_zero(b),
        Expr::Neg(a) | Expr::Call(_, a) | Expr::Factorial(a) => divides_by_zero(a),
        Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Pow(a, b) | Expr::Log(a, b) => {
            divides_by_zero(a) || divides_by_zero(b)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn precedence_associativity_and_errors() {
        assert_eq!(evaluate("1 - 2 - 3"), Ok(-4.0));
        assert_eq!(evaluate("2 ^ 3 ^ 2"), Ok(512.0));
        assert_eq!(evaluate("-2 ^ 2"), Ok(-4.0));
        assert_eq!(evaluate("2 ^ -1"), Ok(0.5));
        assert_eq!(evaluate("12 × 3 ÷ 4"), Ok(9.0));
        assert_eq!(evaluate("1,234 + 1"), Ok(1235.0));
        assert_eq!(evaluate("2**10"), Ok(1024.0));
        for bad in [
            "",
            "1 +",
            "(1",
            "1 2",
            "abc",
            "1 / (2 - 2)",
            "10 ^ 1000",
            "1..2",
        ] {
            assert!(evaluate(bad).is_err(), "{bad}");
        }
        assert!(evaluate(&"(".repeat(100)).is_err());
        assert!(evaluate(&"-".repeat(100)).is_err());
    }

    #[test]
    fn the_calculator_rules_on_top_of_the_shared_parser() {
        // Expr would read these; the calculator does not.
        for (bad, says) in [
            ("2(3)", "missing operator"),
            ("(1)(2)", "missing operator"),
            ("1 2", "missing operator"),
            ("2x", "unexpected `x`"),
            ("sqrt(4)", "unexpected `s`"),
            ("pi", "unexpected `p`"),
            ("5!", "unexpected `!`"),
            ("50%", "unexpected `%`"),
            ("[1+2]", "unexpected `[`"),
            ("1 / (1 / 0)", "division by zero"),
            ("0 / 0", "division by zero"),
            ("10 ^ 1000", "not a finite number"),
        ] {
            let err = evaluate(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert!(
            evaluate(&"1+".repeat(200))
                .unwrap_err()
                .contains("longer than")
        );
        // Written products count, `**` is a power, not two products.
        assert_eq!(evaluate("2 * 3 * 4"), Ok(24.0));
        assert_eq!(evaluate("2 ** 3 * 2"), Ok(16.0));
        assert_eq!(evaluate(".5 + 5."), Ok(5.5));
    }

    proptest! {
        #[test]
        fn integer_sums_and_products_are_exact(a in -10_000i64..10_000, b in -10_000i64..10_000) {
            prop_assert_eq!(evaluate(&format!("{a} + {b}")), Ok((a + b) as f64));
            prop_assert_eq!(evaluate(&format!("({a}) * ({b})")), Ok((a * b) as f64));
        }

        #[test]
        fn never_panics(s in ".{0,64}") {
            let _ = evaluate(&s);
        }
    }
}
