//! Deciding whether two final answers are the same, and by which rule.

use super::expr::Expr;
use super::normalize::normalize;
use super::rational::{DecimalLiteral, Rational};
use super::value::{Agreement, Value, compare, quotient};
use roll_core::rng::SplitMix64;
use std::fmt;

/// The rule by which two answers were found equal (reported in [`Reward::details`](roll_core::Reward)
/// under `rule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Equal strings after normalisation (`\dfrac{1}{2}` and `\frac12` are not; `$ 5 $` and `5`
    /// are).
    Exact,
    /// Equal numbers: integers, decimals, fractions, percentages, scientific notation and
    /// constant expressions (`\sqrt{8}` = `2\sqrt{2}`). Exact values are compared exactly
    /// (`10^{400} ≠ 10^{401}`, `10^{-400} ≠ 0`), or as a decimal rounded to its places
    /// (`0.333333333` = `\frac{1}{3}`); irrational ones within the relative tolerance.
    Numeric,
    /// Expressions with variables equal at sample points (exactly where both are exact).
    Symbolic,
    /// Equations whose sides differ by the same relation (`y = 2x` and `2x - y = 0`).
    Equation,
    /// Tuples equal element by element.
    Tuple,
    /// Intervals (or unions of intervals) with equal endpoints and bracket types.
    Interval,
    /// Sets or answer lists equal as multisets.
    Set,
    /// Words equal ignoring case and punctuation.
    Text,
}

impl Rule {
    /// The rule's name as reported in details: `exact`, `numeric`, ...
    pub fn name(self) -> &'static str {
        match self {
            Rule::Exact => "exact",
            Rule::Numeric => "numeric",
            Rule::Symbolic => "symbolic",
            Rule::Equation => "equation",
            Rule::Tuple => "tuple",
            Rule::Interval => "interval",
            Rule::Set => "set",
            Rule::Text => "text",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How strictly numbers are compared.
///
/// The tolerance never makes two different exact numbers equal: exact values (integers,
/// decimals, fractions, integer powers) are equal only when they are, or when one is a decimal
/// that the other rounds to with an error within `relative`. It applies to values with an
/// irrational part (`\pi`, `\sqrt{2}`, `\sin 1`), compared by
/// `|a − b| ≤ relative · max(|a|, |b|)` plus their rounding-error bounds — never an absolute
/// tolerance, which would ignore a small added term. A NaN tolerance makes such values
/// unequal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Relative tolerance: `|a − b| ≤ rel · max(|a|, |b|)`.
    pub relative: f64,
    /// Number of pseudo-random points (twice this, half of them positive) at which symbolic
    /// expressions are compared; at most [`MAX_POINTS`] are used.
    pub points: usize,
}

/// Most sample points per half of the symbolic comparison.
pub const MAX_POINTS: usize = 1_000;

impl Default for Tolerance {
    fn default() -> Self {
        Self {
            relative: 1e-6,
            points: 8,
        }
    }
}

/// Nesting limit for structures (tuples of sets of tuples ...).
const MAX_NESTING: usize = 4;
/// Answers longer than this (in bytes, normalised) are compared as strings only.
pub const MAX_ANSWER_LEN: usize = 2_000;
/// Structures with more elements than this are compared as strings only (unordered matching
/// is quadratic).
pub const MAX_ELEMENTS: usize = 64;

/// Whether `predicted` and `gold` are the same answer, and by which rule.
///
/// The rules are tried in order: exact string after normalisation; structures (tuples, intervals,
/// sets, unions, bare answer lists), compared element by element with these same rules;
/// equations; numbers and constant expressions; symbolic expressions at random points; words.
///
/// Answers longer than [`MAX_ANSWER_LEN`] are only compared as strings, and structures with more
/// than [`MAX_ELEMENTS`] elements likewise, so a degenerate answer costs linear time.
pub fn equivalent(predicted: &str, gold: &str, tol: &Tolerance) -> Option<Rule> {
    if predicted.len() > MAX_ANSWER_LEN || gold.len() > MAX_ANSWER_LEN {
        let same = !predicted.trim().is_empty() && predicted.trim() == gold.trim();
        return same.then_some(Rule::Exact);
    }
    equivalent_at(&normalize(predicted), &normalize(gold), tol, 0)
}

fn equivalent_at(p: &str, g: &str, tol: &Tolerance, depth: usize) -> Option<Rule> {
    if p.is_empty() || g.is_empty() || depth > MAX_NESTING {
        return None;
    }
    if p == g {
        return (!undefined_constant(p)).then_some(Rule::Exact);
    }
    if p.len() > MAX_ANSWER_LEN || g.len() > MAX_ANSWER_LEN {
        return None;
    }
    let (sp, sg) = (Shape::of(p), Shape::of(g));
    match (&sp, &sg) {
        (Shape::Scalar, Shape::Scalar) => scalar(p, g, tol),
        (Shape::Seq(a), Shape::Seq(b)) => {
            let same_brackets = a.open == b.open && a.close == b.close;
            let ok = same_brackets
                && a.items.len() == b.items.len()
                && a.items.len() <= MAX_ELEMENTS
                && a.items
                    .iter()
                    .zip(&b.items)
                    .all(|(x, y)| element(x, y, tol, depth));
            ok.then(|| {
                if a.is_interval() {
                    Rule::Interval
                } else {
                    Rule::Tuple
                }
            })
        }
        (Shape::Union(a), Shape::Union(b)) => unordered(a, b, tol, depth).then_some(Rule::Interval),
        (Shape::Set(a) | Shape::List(a), Shape::Set(b) | Shape::List(b)) => {
            unordered(a, b, tol, depth).then_some(Rule::Set)
        }
        _ => None,
    }
}

fn element(p: &str, g: &str, tol: &Tolerance, depth: usize) -> bool {
    equivalent_at(&normalize(p), &normalize(g), tol, depth + 1).is_some()
}

/// Multiset equality: every predicted item matched to a distinct gold item.
///
/// A maximum bipartite matching (augmenting paths, Kuhn's algorithm), not a greedy first fit:
/// equality within a tolerance or by rounding is not transitive, and a greedy pairing could miss
/// a valid one — and then accept the sets one way round and reject them the other, so the
/// verdict would depend on which side is the gold. Equalities are computed on demand, free gold
/// items first, so equal sets in the same order take a linear number of comparisons.
fn unordered(p: &[String], g: &[String], tol: &Tolerance, depth: usize) -> bool {
    if p.len() != g.len() || p.len() > MAX_ELEMENTS {
        return false;
    }
    let mut m = Matcher {
        p,
        g,
        tol,
        depth,
        equal: vec![None; p.len() * g.len()],
        owner: vec![None; g.len()],
    };
    (0..p.len()).all(|i| {
        let mut seen = vec![false; g.len()];
        m.augment(i, &mut seen)
    })
}

struct Matcher<'a> {
    p: &'a [String],
    g: &'a [String],
    tol: &'a Tolerance,
    depth: usize,
    /// `equal[i * n + j]`: whether predicted `i` equals gold `j`, once computed.
    equal: Vec<Option<bool>>,
    /// The predicted item each gold item is matched to.
    owner: Vec<Option<usize>>,
}

impl Matcher<'_> {
    fn equal(&mut self, i: usize, j: usize) -> bool {
        let k = i * self.g.len() + j;
        if let Some(e) = self.equal[k] {
            return e;
        }
        let e = element(&self.p[i], &self.g[j], self.tol, self.depth);
        self.equal[k] = Some(e);
        e
    }

    /// Finds a gold item for predicted `i`, re-matching others along an augmenting path.
    fn augment(&mut self, i: usize, seen: &mut [bool]) -> bool {
        for j in 0..self.g.len() {
            if self.owner[j].is_none() && self.equal(i, j) {
                self.owner[j] = Some(i);
                return true;
            }
        }
        for j in 0..self.g.len() {
            if seen[j] || !self.equal(i, j) {
                continue;
            }
            seen[j] = true;
            if let Some(k) = self.owner[j]
                && self.augment(k, seen)
            {
                self.owner[j] = Some(i);
                return true;
            }
        }
        false
    }
}

/// A bracketed sequence: a tuple or an interval.
struct Seq {
    open: char,
    close: char,
    items: Vec<String>,
}

impl Seq {
    fn is_interval(&self) -> bool {
        !(self.open == '(' && self.close == ')')
            || self
                .items
                .iter()
                .any(|i| i.contains("infty") || i.contains('∞'))
    }
}

enum Shape {
    Scalar,
    Seq(Seq),
    Set(Vec<String>),
    List(Vec<String>),
    Union(Vec<String>),
}

impl Shape {
    fn of(s: &str) -> Shape {
        let union = split_top(s, &["\\cup", "∪"]);
        if union.len() > 1 {
            return Shape::Union(union);
        }
        if let Some(inner) = s.strip_prefix("\\{").and_then(|r| r.strip_suffix("\\}"))
            && encloses(s, 1)
        {
            return Shape::Set(split_top(inner, &[","]));
        }
        let first = s.chars().next().unwrap_or(' ');
        let last = s.chars().last().unwrap_or(' ');
        if matches!(first, '(' | '[') && matches!(last, ')' | ']') && encloses(s, 0) {
            let items = split_top(&s[1..s.len() - 1], &[","]);
            if items.len() > 1 {
                return Shape::Seq(Seq {
                    open: first,
                    close: last,
                    items,
                });
            }
        }
        if first == '{' && last == '}' && encloses(s, 0) {
            let items = split_top(&s[1..s.len() - 1], &[","]);
            if items.len() > 1 {
                return Shape::Set(items);
            }
        }
        let items = split_top(s, &[","]);
        if items.len() > 1 {
            return Shape::List(items);
        }
        Shape::Scalar
    }
}

/// Whether the bracket opening at byte `at` closes only at the very end of `s`.
fn encloses(s: &str, at: usize) -> bool {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 && i > at && i + c.len_utf8() < s.len() {
                    return false;
                }
            }
            _ => {}
        }
    }
    depth == 0
}

/// Splits at top-level (bracket depth 0) occurrences of any separator.
fn split_top(s: &str, seps: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let c = rest.chars().next().unwrap_or(' ');
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
        if depth == 0
            && let Some(sep) = seps.iter().find(|sep| rest.starts_with(**sep))
        {
            out.push(s[start..i].to_owned());
            i += sep.len();
            start = i;
            continue;
        }
        i += c.len_utf8();
    }
    out.push(s[start..].to_owned());
    out
}

/// Scalars: equations, numbers, expressions, words.
fn scalar(p: &str, g: &str, tol: &Tolerance) -> Option<Rule> {
    match (split_equation(p), split_equation(g)) {
        (Some(a), Some(b)) => return equation(a, b, tol).then_some(Rule::Equation),
        (None, None) => {}
        _ => return None,
    }
    let (p_body, p_pct) = strip_percent(p);
    let (g_body, g_pct) = strip_percent(g);
    match (Expr::parse(p_body), Expr::parse(g_body)) {
        (Ok(ep), Ok(eg)) => {
            let (vp, vg) = (ep.variables(), eg.variables());
            if vp.is_empty() && vg.is_empty() {
                let a = Number::written(p_body, ep.value(&[]));
                let b = Number::written(g_body, eg.value(&[]));
                let hit = a.equals(&b, tol.relative)
                    || (p_pct && a.percent().equals(&b, tol.relative))
                    || (g_pct && a.equals(&b.percent(), tol.relative));
                return hit.then_some(Rule::Numeric);
            }
            if vp == vg && !p_pct && !g_pct && same_function(&ep, &eg, &vp, tol) {
                return Some(Rule::Symbolic);
            }
            text(p, g).then_some(Rule::Text)
        }
        _ => text(p, g).then_some(Rule::Text),
    }
}

fn strip_percent(s: &str) -> (&str, bool) {
    match s.strip_suffix('%') {
        Some(body) => (body, true),
        None => (s, false),
    }
}

/// Whether `s` parses as a constant expression with no value (`0/0`, `\ln 0`): such an answer
/// equals nothing, not even itself written the same way.
fn undefined_constant(s: &str) -> bool {
    Expr::parse(s).is_ok_and(|e| e.variables().is_empty() && e.value(&[]) == Value::Undefined)
}

/// A constant answer: its value and, when it is a decimal literal as written (`0.333`,
/// `-1.50`, `6.02e23`), that text, whose number of places says how it was rounded.
struct Number<'a> {
    value: Value,
    decimal: Option<&'a str>,
}

impl<'a> Number<'a> {
    fn written(text: &'a str, value: Value) -> Self {
        let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
        let decimal = DecimalLiteral::parse(unsigned)
            .is_some()
            .then_some(unsigned);
        Self { value, decimal }
    }

    /// The value read as a percentage (`50%` → `0.5`); no longer a literal as written.
    fn percent(&self) -> Self {
        let hundred = Value::Exact(Rational::from_integer(100));
        Self {
            value: quotient(self.value.clone(), hundred),
            decimal: None,
        }
    }

    /// Equal values (see [`compare`]), or one side a decimal that is the other's exact value
    /// correctly rounded to its places, with a rounding error within the relative tolerance:
    /// `0.333333333` is `1/3` written to nine places, `0.333` is too coarse to be (its error,
    /// `3·10⁻⁴`, is above `10⁻⁶` of the value), and `1.0000001` is never `1.0000002`.
    fn equals(&self, other: &Number<'_>, relative: f64) -> bool {
        compare(&self.value, &other.value, relative) == Agreement::Equal
            || self.rounds(other, relative)
            || other.rounds(self, relative)
    }

    /// Whether `self` is a decimal literal that `other`'s exact value rounds to.
    fn rounds(&self, other: &Number<'_>, relative: f64) -> bool {
        let (Some(text), Value::Exact(d), Value::Exact(x)) =
            (self.decimal, &self.value, &other.value)
        else {
            return false;
        };
        let Some(half) = DecimalLiteral::parse(text).and_then(|l| l.half_unit()) else {
            return false;
        };
        // Exactly: in floats, a difference of 10^-400 would underflow and pass any tolerance.
        let allowed =
            Rational::from_f64(relative).and_then(|rel| rel.checked_mul(&x.abs().max(d.abs())));
        match (x.checked_sub(d).map(|r| r.abs()), allowed) {
            (Some(diff), Some(allowed)) => diff <= half && diff <= allowed,
            _ => false,
        }
    }
}

/// Words equal ignoring case, spacing and punctuation (`Monday` = `\text{monday}`), for answers
/// with at least two letters. Signs and operators are kept (`-inf` is not `inf`, `a-b` is not
/// `ab`): only decoration is ignored.
fn text(p: &str, g: &str) -> bool {
    let key = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_alphanumeric() || SIGNIFICANT.contains(c))
            .flat_map(char::to_lowercase)
            .collect()
    };
    let (kp, kg) = (key(p), key(g));
    kp.chars().filter(|c| c.is_alphabetic()).count() >= 2 && kp == kg
}

/// Characters that change what an answer means and so are kept in the text key.
const SIGNIFICANT: &[char] = &['-', '+', '*', '/', '^', '=', '<', '>', '!', '∞'];

fn split_equation(s: &str) -> Option<(&str, &str)> {
    let (l, r) = s.split_once('=')?;
    (!r.contains('=') && !l.is_empty() && !r.is_empty()).then_some((l, r))
}

/// Equations `l₁ = r₁` and `l₂ = r₂` are the same when `l₁ − r₁ = c·(l₂ − r₂)` for one constant
/// `c ≠ 0` at every sample point (exactly, when both sides are exact there).
fn equation(a: (&str, &str), b: (&str, &str), tol: &Tolerance) -> bool {
    let parse = |(l, r): (&str, &str)| -> Option<Expr> {
        Some(Expr::Sub(
            Box::new(Expr::parse(l).ok()?),
            Box::new(Expr::parse(r).ok()?),
        ))
    };
    let (Some(fa), Some(fb)) = (parse(a), parse(b)) else {
        return false;
    };
    let vars = fa.variables();
    if vars != fb.variables() || vars.is_empty() {
        return false;
    }
    let zero = Value::Exact(Rational::zero());
    let is_zero = |v: &Value| compare(v, &zero, tol.relative) == Agreement::Equal;
    let finite = |v: &Value| matches!(v, Value::Exact(_) | Value::Approx { .. });
    let quotient = Expr::Div(Box::new(fa.clone()), Box::new(fb.clone()));
    let mut ratio: Option<Value> = None;
    let mut valid = 0;
    for point in sample_points(&vars, tol.points) {
        let (x, y) = (fa.value(&point), fb.value(&point));
        if !finite(&x) || !finite(&y) {
            continue;
        }
        if is_zero(&y) {
            if !is_zero(&x) {
                return false;
            }
            continue;
        }
        let r = quotient.value(&point);
        match &ratio {
            None if !finite(&r) => continue, // unresolved here: no verdict
            None if is_zero(&r) => return false,
            None => ratio = Some(r),
            Some(c) => match compare(c, &r, tol.relative) {
                Agreement::Equal => {}
                Agreement::Unknown => continue,
                Agreement::Different | Agreement::BothUndefined => return false,
            },
        }
        valid += 1;
    }
    valid >= 3
}

/// Two expressions agree at sample points: exactly where both are exact (polynomials and
/// rational functions with exact coefficients: `x + 10^{-12}` is not `x`), within the relative
/// tolerance and the rounding-error bounds elsewhere. A point where only one is defined is a
/// difference; points where a value is unresolved (overflow) are skipped; at least three points
/// must agree.
fn same_function(a: &Expr, b: &Expr, vars: &[String], tol: &Tolerance) -> bool {
    let mut valid = 0;
    for point in sample_points(vars, tol.points) {
        match compare(&a.value(&point), &b.value(&point), tol.relative) {
            Agreement::Equal => valid += 1,
            Agreement::Different => return false,
            Agreement::BothUndefined | Agreement::Unknown => {}
        }
    }
    valid >= 3
}

/// Denominator of the sample points: a prime, so that no point is an integer or a fraction with
/// a small denominator, where answers have their removable singularities (`\frac{x^2-1}{x-1}`
/// at 1) — every point is an ordinary point of both answers.
const POINT_DENOMINATOR: i64 = 10_007;

/// `n` exact points in `[-3, 3]` and `n` in `[0.1, 3]` (where logarithms and roots are
/// defined), multiples of `1/10007` but never integers, from a fixed seed so a verdict never
/// changes between runs.
fn sample_points(vars: &[String], n: usize) -> Vec<Vec<(String, Rational)>> {
    let mut rng = SplitMix64::new(0x5EED_F0A7_5EED_F0A7);
    let n = n.min(MAX_POINTS);
    let d = POINT_DENOMINATOR;
    let mut points = Vec::with_capacity(2 * n);
    for k in 0..2 * n {
        let (lo, hi) = if k < n {
            (-3 * d, 3 * d)
        } else {
            (d / 10, 3 * d)
        };
        let span = u64::try_from(hi - lo + 1).unwrap_or(1);
        let point = vars
            .iter()
            .map(|v| {
                let mut num = lo + i64::try_from(rng.next_u64() % span).unwrap_or(0);
                if num % d == 0 {
                    num += 1;
                }
                let x = Rational::ratio(num, d).unwrap_or_else(Rational::zero);
                (v.clone(), x)
            })
            .collect();
        points.push(point);
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eq(p: &str, g: &str) -> Option<Rule> {
        equivalent(p, g, &Tolerance::default())
    }

    #[test]
    fn rules_are_reported() {
        assert_eq!(eq("5", "5"), Some(Rule::Exact));
        assert_eq!(eq("0.5", r"\frac{1}{2}"), Some(Rule::Numeric));
        assert_eq!(eq("(x+1)^2", "x^2+2x+1"), Some(Rule::Symbolic));
        assert_eq!(eq("(1,2)", "(1.0, 2)"), Some(Rule::Tuple));
        assert_eq!(eq("[1,2)", "[1, 2)"), Some(Rule::Exact));
        assert_eq!(eq("[1,2.0)", "[1, 2)"), Some(Rule::Interval));
        assert_eq!(eq(r"\{3,1\}", r"\{1,3\}"), Some(Rule::Set));
        assert_eq!(eq("Monday", r"\text{monday}"), Some(Rule::Text));
        assert_eq!(eq("2x - y = 0", "y = 2x"), None); // `y =` is stripped from the gold
        assert_eq!(eq("2x - y = 0", "4x = 2y"), Some(Rule::Equation));
    }

    #[test]
    fn differences_are_found() {
        assert_eq!(eq("0.5", "1/3"), None);
        assert_eq!(eq("x", "|x|"), None);
        assert_eq!(eq("[1,2]", "[1,2)"), None);
        assert_eq!(eq("2x", "2y"), None);
        assert_eq!(eq("100000000000000001", "100000000000000000"), None);
    }

    #[test]
    fn sets_are_matched_as_a_whole_not_greedily() {
        // 0.1234567886 equals both gold items (one exactly, one as its rounding to 9 places);
        // 0.1234567894 equals only 0.123456789. A greedy first fit pairs the first predicted
        // item with 0.123456789 and then finds nothing for the second.
        let (p, g) = (
            r"\{0.1234567886, 0.1234567894\}",
            r"\{0.123456789, 0.1234567886\}",
        );
        assert_eq!(eq(p, g), Some(Rule::Set));
        assert_eq!(eq(g, p), Some(Rule::Set));
        assert_eq!(eq(r"\{0.1234567894, 0.1234567894\}", g), None);
    }

    #[test]
    fn decimals_equal_what_they_round() {
        assert_eq!(eq("0.333333333", r"\frac13"), Some(Rule::Numeric));
        assert_eq!(eq("-0.333333333", r"-\frac13"), Some(Rule::Numeric));
        assert_eq!(eq("0.333", r"\frac13"), None); // too coarse for 1e-6
        assert_eq!(eq("1.0000001", "1.0000002"), None); // neither rounds the other
        assert_eq!(eq("3", "3.0000001"), None); // an integer is exact
        assert_eq!(eq("1e-400", "0.0"), None); // within half a unit, not within 1e-6
    }
}
