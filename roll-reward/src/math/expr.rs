//! A small parser and evaluator for the arithmetic and LaTeX that final answers are written in.
//!
//! Recursive descent over tokens, with the usual precedence: `+ −` < `× ÷` and implicit
//! multiplication (`2x`, `3\pi`, `x(x+1)`) < unary minus < `^` (right-associative, so
//! `-x^2 = -(x^2)` and `2^3^2 = 2^9`) < postfix `!` and `%`. Understood:
//!
//! * numbers `12`, `0.5`, `.5`, `1.5e-3`, kept exact ([`Expr::Lit`]); constants `e`,
//!   `\pi`/`π`/`pi`, `\infty`/`∞`;
//! * `\frac{a}{b}` (and `\dfrac`, `\tfrac`), `\sqrt{x}`, `\sqrt[n]{x}`, `\binom{n}{k}`, `|x|`;
//! * functions `sin cos tan sec csc cot arcsin arccos arctan sinh cosh tanh ln log exp sqrt abs`
//!   with or without a backslash and parentheses (`\sin x`, `\sin^2(x)`, `\log_2 8`);
//! * `\cdot`, `\times`, `*`, `×`, `·`, `\div`, `÷`, `**`, braces and brackets as grouping;
//! * variables: any other letter (`x`, `xy` is `x·y`), a Greek command (`\theta`), with an
//!   optional subscript (`x_1`, `a_{n}`).
//!
//! Input longer than [`MAX_INPUT`] bytes or nested deeper than [`MAX_DEPTH`] is rejected, so
//! parsing is linear and cannot overflow the stack.

use super::rational::{DecimalLiteral, Rational};
use std::f64::consts::{E, PI};

/// Longest input accepted, in bytes.
pub const MAX_INPUT: usize = 2_000;
/// Deepest nesting accepted.
pub const MAX_DEPTH: usize = 64;

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A number written in the input (`12`, `0.5`, `1.5e-3`), exactly.
    Lit(Rational),
    /// A constant without an exact value: `π`, `e`, `∞`.
    Num(f64),
    /// A free variable.
    Var(String),
    /// `-a`.
    Neg(Box<Expr>),
    /// `a + b`.
    Add(Box<Expr>, Box<Expr>),
    /// `a - b`.
    Sub(Box<Expr>, Box<Expr>),
    /// `a · b`.
    Mul(Box<Expr>, Box<Expr>),
    /// `a / b`.
    Div(Box<Expr>, Box<Expr>),
    /// `a ^ b`.
    Pow(Box<Expr>, Box<Expr>),
    /// `f(a)`.
    Call(Func, Box<Expr>),
    /// `log_b(a)`: base first.
    Log(Box<Expr>, Box<Expr>),
    /// `n!`.
    Factorial(Box<Expr>),
}

/// A function of one argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    /// `sin`.
    Sin,
    /// `cos`.
    Cos,
    /// `tan`.
    Tan,
    /// `sec = 1/cos`.
    Sec,
    /// `csc = 1/sin`.
    Csc,
    /// `cot = 1/tan`.
    Cot,
    /// `arcsin` (also `sin^{-1}`).
    Asin,
    /// `arccos` (also `cos^{-1}`).
    Acos,
    /// `arctan` (also `tan^{-1}`).
    Atan,
    /// `sinh`.
    Sinh,
    /// `cosh`.
    Cosh,
    /// `tanh`.
    Tanh,
    /// Natural logarithm `ln`.
    Ln,
    /// `log` without a base: base 10.
    Log10,
    /// `exp`.
    Exp,
    /// `sqrt`.
    Sqrt,
    /// `abs`, `|x|`.
    Abs,
}

const FUNCS: &[(&str, Func)] = &[
    ("arcsin", Func::Asin),
    ("arccos", Func::Acos),
    ("arctan", Func::Atan),
    ("sinh", Func::Sinh),
    ("cosh", Func::Cosh),
    ("tanh", Func::Tanh),
    ("sqrt", Func::Sqrt),
    ("sin", Func::Sin),
    ("cos", Func::Cos),
    ("tan", Func::Tan),
    ("sec", Func::Sec),
    ("csc", Func::Csc),
    ("cot", Func::Cot),
    ("exp", Func::Exp),
    ("abs", Func::Abs),
    ("log", Func::Log10),
    ("ln", Func::Ln),
];

impl Func {
    /// `f(x)` in floats.
    pub(crate) fn apply(self, x: f64) -> f64 {
        match self {
            Func::Sin => x.sin(),
            Func::Cos => x.cos(),
            Func::Tan => x.tan(),
            Func::Sec => 1.0 / x.cos(),
            Func::Csc => 1.0 / x.sin(),
            Func::Cot => 1.0 / x.tan(),
            Func::Asin => x.asin(),
            Func::Acos => x.acos(),
            Func::Atan => x.atan(),
            Func::Sinh => x.sinh(),
            Func::Cosh => x.cosh(),
            Func::Tanh => x.tanh(),
            Func::Ln => x.ln(),
            Func::Log10 => x.log10(),
            Func::Exp => x.exp(),
            Func::Sqrt => x.sqrt(),
            Func::Abs => x.abs(),
        }
    }

    /// `f'(x)`, for the rounding-error bound of [`Expr::value`].
    pub(crate) fn derivative(self, x: f64) -> f64 {
        match self {
            Func::Sin => x.cos(),
            Func::Cos => -x.sin(),
            Func::Tan => 1.0 + x.tan().powi(2),
            Func::Sec => x.tan() / x.cos(),
            Func::Csc => -1.0 / (x.sin() * x.tan()),
            Func::Cot => -(1.0 + 1.0 / x.tan().powi(2)),
            Func::Asin => 1.0 / (1.0 - x * x).sqrt(),
            Func::Acos => -1.0 / (1.0 - x * x).sqrt(),
            Func::Atan => 1.0 / (1.0 + x * x),
            Func::Sinh => x.cosh(),
            Func::Cosh => x.sinh(),
            Func::Tanh => 1.0 - x.tanh().powi(2),
            Func::Ln => 1.0 / x,
            Func::Log10 => 1.0 / (x * std::f64::consts::LN_10),
            Func::Exp => x.exp(),
            Func::Sqrt => 0.5 / x.sqrt(),
            Func::Abs => 1.0,
        }
    }

    fn inverse(self) -> Option<Func> {
        match self {
            Func::Sin => Some(Func::Asin),
            Func::Cos => Some(Func::Acos),
            Func::Tan => Some(Func::Atan),
            _ => None,
        }
    }
}

impl Expr {
    /// Parses `input`.
    ///
    /// # Errors
    /// A message saying where parsing failed, for anything that is not a single expression
    /// (relations, commas, unbalanced brackets, unknown symbols, over-long input).
    pub fn parse(input: &str) -> Result<Expr, String> {
        if input.len() > MAX_INPUT {
            return Err(format!("input longer than {MAX_INPUT} bytes"));
        }
        let tokens = lex(input)?;
        let mut p = Parser {
            tokens,
            pos: 0,
            depth: 0,
            bars: 0,
        };
        let e = p.expr()?;
        match p.peek() {
            None => Ok(e),
            Some(t) => Err(format!("unexpected {t:?} at token {}", p.pos)),
        }
    }

    /// The free variables, sorted and deduplicated.
    pub fn variables(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_vars(&mut out);
        out.sort();
        out.dedup();
        out
    }

    fn collect_vars(&self, out: &mut Vec<String>) {
        match self {
            Expr::Lit(_) | Expr::Num(_) => {}
            Expr::Var(v) => out.push(v.clone()),
            Expr::Neg(a) | Expr::Call(_, a) | Expr::Factorial(a) => a.collect_vars(out),
            Expr::Add(a, b)
            | Expr::Sub(a, b)
            | Expr::Mul(a, b)
            | Expr::Div(a, b)
            | Expr::Pow(a, b)
            | Expr::Log(a, b) => {
                a.collect_vars(out);
                b.collect_vars(out);
            }
        }
    }

    /// The value in `f64` with `vars` bound (`(name, value)` pairs); an unbound variable is
    /// NaN. Overflow gives `±∞` and underflow `0`, as in any float arithmetic: to compare
    /// answers use [`value`](Expr::value), which keeps exact numbers exact and tells overflow
    /// from infinity.
    pub fn eval(&self, vars: &[(String, f64)]) -> f64 {
        match self {
            Expr::Lit(r) => r.to_f64(),
            Expr::Num(x) => *x,
            Expr::Var(v) => vars
                .iter()
                .find(|(n, _)| n == v)
                .map_or(f64::NAN, |(_, x)| *x),
            Expr::Neg(a) => -a.eval(vars),
            Expr::Add(a, b) => a.eval(vars) + b.eval(vars),
            Expr::Sub(a, b) => a.eval(vars) - b.eval(vars),
            Expr::Mul(a, b) => a.eval(vars) * b.eval(vars),
            Expr::Div(a, b) => a.eval(vars) / b.eval(vars),
            Expr::Pow(a, b) => real_pow(a.eval(vars), b.eval(vars)),
            Expr::Call(f, a) => f.apply(a.eval(vars)),
            Expr::Log(base, a) => a.eval(vars).ln() / base.eval(vars).ln(),
            Expr::Factorial(a) => factorial(a.eval(vars)),
        }
    }
}

/// `a^b`, with odd roots of negative numbers real (`(-8)^(1/3) = -2`).
pub(crate) fn real_pow(a: f64, b: f64) -> f64 {
    if a < 0.0 && b.fract() != 0.0 {
        let inv = 1.0 / b;
        if (inv - inv.round()).abs() < 1e-9 && inv.round() as i64 % 2 != 0 {
            return -(-a).powf(b);
        }
    }
    a.powf(b)
}

fn factorial(n: f64) -> f64 {
    if n < 0.0 || n.fract() != 0.0 || n > 170.0 {
        return f64::NAN;
    }
    (1..=n as u32).fold(1.0, |acc, k| acc * f64::from(k))
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A number or a constant, and its text (for subscripts: `x_1`).
    Num(Expr, String),
    Var(String),
    Func(Func),
    Frac,
    Sqrt,
    Binom,
    Plus,
    Minus,
    Star,
    Slash,
    Caret,
    Under,
    Bang,
    Percent,
    Bar,
    Open(char),
    Close(char),
}

const GREEK: &[&str] = &[
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Sigma",
    "Phi",
    "Psi",
    "Omega",
];

fn lex(input: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = input.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '0'..='9' | '.' => {
                let (x, next) = lex_number(&chars, i)?;
                out.push(x);
                i = next;
            }
            '\\' => i = lex_command(&chars, i + 1, &mut out)?,
            c if c.is_alphabetic() => {
                let start = i;
                while i < chars.len() && chars[i].is_ascii_alphabetic() {
                    i += 1;
                }
                if i == start {
                    // A non-ASCII letter: one variable (π is a constant).
                    out.push(if c == 'π' {
                        Tok::Num(Expr::Num(PI), c.to_string())
                    } else {
                        Tok::Var(c.to_string())
                    });
                    i += 1;
                } else {
                    let word: String = chars[start..i].iter().collect();
                    lex_word(&word, &mut out);
                }
            }
            '+' => push(&mut out, Tok::Plus, &mut i),
            '-' | '−' | '–' => push(&mut out, Tok::Minus, &mut i),
            '*' if chars.get(i + 1) == Some(&'*') => {
                out.push(Tok::Caret);
                i += 2;
            }
            '*' | '×' | '·' | '⋅' => push(&mut out, Tok::Star, &mut i),
            '/' | '÷' => push(&mut out, Tok::Slash, &mut i),
            '^' => push(&mut out, Tok::Caret, &mut i),
            '_' => push(&mut out, Tok::Under, &mut i),
            '!' => push(&mut out, Tok::Bang, &mut i),
            '%' => push(&mut out, Tok::Percent, &mut i),
            '|' => push(&mut out, Tok::Bar, &mut i),
            '(' | '[' | '{' => push(&mut out, Tok::Open(c), &mut i),
            ')' | ']' | '}' => push(&mut out, Tok::Close(c), &mut i),
            '√' => push(&mut out, Tok::Sqrt, &mut i),
            '∞' => push(
                &mut out,
                Tok::Num(Expr::Num(f64::INFINITY), "∞".into()),
                &mut i,
            ),
            other => return Err(format!("unexpected character {other:?}")),
        }
    }
    Ok(out)
}

fn push(out: &mut Vec<Tok>, t: Tok, i: &mut usize) {
    out.push(t);
    *i += 1;
}

/// A number literal from `start`: exact ([`Expr::Lit`]), or for an exponent too large for an
/// exact value (`1e99999`), the product `m · 10^k` it stands for, which evaluates as
/// unresolved instead of overflowing to an infinity.
fn lex_number(chars: &[char], start: usize) -> Result<(Tok, usize), String> {
    let mut i = start;
    while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
        i += 1;
    }
    // Scientific notation: `e`/`E`, an optional sign, then a digit.
    if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
        let mut j = i + 1;
        if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
            j += 1;
        }
        if j < chars.len() && chars[j].is_ascii_digit() {
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            i = j;
        }
    }
    let text: String = chars[start..i].iter().collect();
    let bad = || format!("bad number {text:?}");
    let literal = DecimalLiteral::parse(&text).ok_or_else(bad)?;
    let expr = match literal.value() {
        Some(r) => Expr::Lit(r),
        None => {
            let (mantissa, exponent) = text.split_once(['e', 'E']).ok_or_else(bad)?;
            let mantissa = Rational::parse_decimal(mantissa).ok_or_else(bad)?;
            let (negative, digits) = match exponent.strip_prefix('-') {
                Some(d) => (true, d),
                None => (false, exponent.trim_start_matches('+')),
            };
            let exponent = Expr::Lit(Rational::parse_decimal(digits).ok_or_else(bad)?);
            let exponent = if negative {
                Expr::Neg(Box::new(exponent))
            } else {
                exponent
            };
            Expr::Mul(
                Box::new(Expr::Lit(mantissa)),
                Box::new(Expr::Pow(
                    Box::new(Expr::Lit(Rational::from_integer(10))),
                    Box::new(exponent),
                )),
            )
        }
    };
    Ok((Tok::Num(expr, text), i))
}

/// A run of ASCII letters: known function names and `pi` are taken greedily from the front,
/// every other letter is one variable (`e` is Euler's number).
fn lex_word(word: &str, out: &mut Vec<Tok>) {
    let mut rest = word;
    while !rest.is_empty() {
        if let Some((name, f)) = FUNCS.iter().find(|(n, _)| rest.starts_with(n)) {
            out.push(Tok::Func(*f));
            rest = &rest[name.len()..];
        } else if let Some(tail) = rest.strip_prefix("pi") {
            out.push(Tok::Num(Expr::Num(PI), "pi".into()));
            rest = tail;
        } else {
            let (head, tail) = rest.split_at(1);
            out.push(if head == "e" {
                Tok::Num(Expr::Num(E), "e".into())
            } else {
                Tok::Var(head.to_owned())
            });
            rest = tail;
        }
    }
}

/// A LaTeX command starting after the backslash at `i`; returns the index after it.
fn lex_command(chars: &[char], i: usize, out: &mut Vec<Tok>) -> Result<usize, String> {
    let mut j = i;
    while j < chars.len() && chars[j].is_ascii_alphabetic() {
        j += 1;
    }
    if j == i {
        // A one-character command: `\{`, `\}`, `\,`, `\%`, `\|`.
        return match chars.get(i) {
            Some('{') => Ok(push_at(out, Tok::Open('{'), i)),
            Some('}') => Ok(push_at(out, Tok::Close('}'), i)),
            Some('%') => Ok(push_at(out, Tok::Percent, i)),
            Some('|') => Ok(push_at(out, Tok::Bar, i)),
            Some(',' | ';' | ':' | '!' | ' ') => Ok(i + 1),
            other => Err(format!("unknown command \\{other:?}")),
        };
    }
    let name: String = chars[i..j].iter().collect();
    let tok = match name.as_str() {
        "frac" | "dfrac" | "tfrac" | "cfrac" => Tok::Frac,
        "sqrt" => Tok::Sqrt,
        "binom" | "dbinom" | "tbinom" | "choose" => Tok::Binom,
        "pi" => Tok::Num(Expr::Num(PI), "\\pi".into()),
        "infty" | "infin" => Tok::Num(Expr::Num(f64::INFINITY), "\\infty".into()),
        "cdot" | "times" | "ast" => Tok::Star,
        "div" => Tok::Slash,
        "lvert" | "rvert" | "vert" => Tok::Bar,
        "left" | "right" | "bigl" | "bigr" | "Bigl" | "Bigr" | "big" | "Big" => {
            // Sizing prefixes: drop them, and a `.` (empty delimiter) after them.
            return Ok(if chars.get(j) == Some(&'.') { j + 1 } else { j });
        }
        "displaystyle" | "quad" | "qquad" => return Ok(j),
        "exp" => Tok::Func(Func::Exp),
        "ln" => Tok::Func(Func::Ln),
        "log" | "lg" => Tok::Func(Func::Log10),
        "mathrm" | "text" | "operatorname" | "mathit" | "mathbf" => {
            return Err(format!("unexpected \\{name} (normalise first)"));
        }
        other => {
            if let Some((_, f)) = FUNCS.iter().find(|(n, _)| *n == other) {
                Tok::Func(*f)
            } else if GREEK.contains(&other) {
                Tok::Var(format!("\\{other}"))
            } else {
                return Err(format!("unknown command \\{other}"));
            }
        }
    };
    // LaTeX takes single-character arguments without braces: `\frac12` is 1/2, `\sqrt2x` is
    // √2·x. Split such digit runs so the parser sees one digit per argument.
    let args = match tok {
        Tok::Frac | Tok::Binom => 2,
        Tok::Sqrt => 1,
        _ => 0,
    };
    out.push(tok);
    for _ in 0..args {
        while j < chars.len() && chars[j] == ' ' {
            j += 1;
        }
        match chars.get(j) {
            Some(d) if d.is_ascii_digit() => {
                let digit = i64::from(d.to_digit(10).unwrap_or(0));
                out.push(Tok::Num(
                    Expr::Lit(Rational::from_integer(digit)),
                    d.to_string(),
                ));
                j += 1;
            }
            _ => break,
        }
    }
    Ok(j)
}

fn push_at(out: &mut Vec<Tok>, t: Tok, i: usize) -> usize {
    out.push(t);
    i + 1
}

fn lit(n: i64) -> Expr {
    Expr::Lit(Rational::from_integer(n))
}

struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
    depth: usize,
    bars: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn enter(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            Err(format!("nested deeper than {MAX_DEPTH}"))
        } else {
            Ok(())
        }
    }

    fn expr(&mut self) -> Result<Expr, String> {
        self.enter()?;
        let mut lhs = self.term()?;
        loop {
            if self.eat(&Tok::Plus) {
                lhs = Expr::Add(Box::new(lhs), Box::new(self.term()?));
            } else if self.eat(&Tok::Minus) {
                lhs = Expr::Sub(Box::new(lhs), Box::new(self.term()?));
            } else {
                break;
            }
        }
        self.depth -= 1;
        Ok(lhs)
    }

    fn term(&mut self) -> Result<Expr, String> {
        let mut lhs = self.unary()?;
        loop {
            if self.eat(&Tok::Star) {
                lhs = Expr::Mul(Box::new(lhs), Box::new(self.unary()?));
            } else if self.eat(&Tok::Slash) {
                lhs = Expr::Div(Box::new(lhs), Box::new(self.unary()?));
            } else if self.starts_primary() {
                lhs = Expr::Mul(Box::new(lhs), Box::new(self.power()?));
            } else {
                break;
            }
        }
        Ok(lhs)
    }

    /// Whether the next token begins an implicit factor (`2x`, `x(y)`, `3\sqrt{2}`).
    fn starts_primary(&self) -> bool {
        match self.peek() {
            Some(
                Tok::Num(..) | Tok::Var(_) | Tok::Func(_) | Tok::Frac | Tok::Sqrt | Tok::Binom,
            ) => true,
            Some(Tok::Open(_)) => true,
            Some(Tok::Bar) => self.bars == 0,
            _ => false,
        }
    }

    fn unary(&mut self) -> Result<Expr, String> {
        self.enter()?;
        let e = if self.eat(&Tok::Minus) {
            Expr::Neg(Box::new(self.unary()?))
        } else if self.eat(&Tok::Plus) {
            self.unary()?
        } else {
            self.power()?
        };
        self.depth -= 1;
        Ok(e)
    }

    fn power(&mut self) -> Result<Expr, String> {
        let base = self.postfix()?;
        if self.eat(&Tok::Caret) {
            let exp = self.unary()?;
            Ok(Expr::Pow(Box::new(base), Box::new(exp)))
        } else {
            Ok(base)
        }
    }

    fn postfix(&mut self) -> Result<Expr, String> {
        let mut e = self.primary()?;
        loop {
            if self.eat(&Tok::Bang) {
                e = Expr::Factorial(Box::new(e));
            } else if self.eat(&Tok::Percent) {
                e = Expr::Div(Box::new(e), Box::new(lit(100)));
            } else {
                return Ok(e);
            }
        }
    }

    /// `{...}`, `(...)` or `[...]`, or a single token-level primary (for `\frac12`, `x^2`).
    fn group_or_atom(&mut self) -> Result<Expr, String> {
        match self.peek() {
            Some(Tok::Open(_)) => self.primary(),
            Some(Tok::Num(x, _)) => {
                let x = x.clone();
                self.pos += 1;
                Ok(x)
            }
            Some(Tok::Minus) => {
                self.pos += 1;
                Ok(Expr::Neg(Box::new(self.group_or_atom()?)))
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Result<Expr, String> {
        self.enter()?;
        let e = self.primary_inner()?;
        self.depth -= 1;
        Ok(e)
    }

    fn primary_inner(&mut self) -> Result<Expr, String> {
        match self.next() {
            Some(Tok::Num(x, _)) => Ok(x),
            Some(Tok::Var(v)) => {
                if self.eat(&Tok::Under) {
                    let sub = self.subscript()?;
                    Ok(Expr::Var(format!("{v}_{sub}")))
                } else {
                    Ok(Expr::Var(v))
                }
            }
            Some(Tok::Open(c)) => {
                let close = match c {
                    '(' => ')',
                    '[' => ']',
                    _ => '}',
                };
                let saved = self.bars;
                self.bars = 0;
                let e = self.expr()?;
                self.bars = saved;
                if self.eat(&Tok::Close(close)) {
                    Ok(e)
                } else {
                    Err(format!("expected {close:?}"))
                }
            }
            Some(Tok::Bar) => {
                self.bars += 1;
                let e = self.expr()?;
                self.bars -= 1;
                if self.eat(&Tok::Bar) {
                    Ok(Expr::Call(Func::Abs, Box::new(e)))
                } else {
                    Err("unclosed |".to_owned())
                }
            }
            Some(Tok::Frac) => {
                let num = self.group_or_atom()?;
                let den = self.group_or_atom()?;
                Ok(Expr::Div(Box::new(num), Box::new(den)))
            }
            Some(Tok::Binom) => {
                let n = self.group_or_atom()?;
                let k = self.group_or_atom()?;
                // n! / (k! (n-k)!)
                let nk = Expr::Sub(Box::new(n.clone()), Box::new(k.clone()));
                Ok(Expr::Div(
                    Box::new(Expr::Factorial(Box::new(n))),
                    Box::new(Expr::Mul(
                        Box::new(Expr::Factorial(Box::new(k))),
                        Box::new(Expr::Factorial(Box::new(nk))),
                    )),
                ))
            }
            Some(Tok::Sqrt) => {
                let index = if self.eat(&Tok::Open('[')) {
                    let n = self.expr()?;
                    if !self.eat(&Tok::Close(']')) {
                        return Err("expected ] after root index".to_owned());
                    }
                    Some(n)
                } else {
                    None
                };
                let radicand = self.group_or_atom()?;
                Ok(match index {
                    None => Expr::Call(Func::Sqrt, Box::new(radicand)),
                    Some(n) => Expr::Pow(
                        Box::new(radicand),
                        Box::new(Expr::Div(Box::new(lit(1)), Box::new(n))),
                    ),
                })
            }
            Some(Tok::Func(f)) => self.call(f),
            Some(t) => Err(format!("unexpected {t:?}")),
            None => Err("unexpected end of input".to_owned()),
        }
    }

    /// A subscript: a number, a letter or a braced group of them, as text.
    fn subscript(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Tok::Num(_, text)) => Ok(text),
            Some(Tok::Var(v)) => Ok(v),
            Some(Tok::Open('{')) => {
                let mut s = String::new();
                loop {
                    match self.next() {
                        Some(Tok::Close('}')) => return Ok(s),
                        Some(Tok::Num(_, text)) => s.push_str(&text),
                        Some(Tok::Var(v)) => s.push_str(&v),
                        _ => return Err("bad subscript".to_owned()),
                    }
                }
            }
            _ => Err("bad subscript".to_owned()),
        }
    }

    /// A function call after its name: optional `_base` (log), optional `^power`, argument.
    fn call(&mut self, f: Func) -> Result<Expr, String> {
        let base = if self.eat(&Tok::Under) {
            Some(self.group_or_atom()?)
        } else {
            None
        };
        let power = if self.eat(&Tok::Caret) {
            Some(self.group_or_atom()?)
        } else {
            None
        };
        let arg = match self.peek() {
            Some(Tok::Open(_)) => self.primary()?,
            _ => self.power()?,
        };
        let mut func = f;
        let mut power = power;
        if let Some(Expr::Neg(inner)) = &power
            && **inner == lit(1)
            && let Some(inv) = f.inverse()
        {
            func = inv; // sin^{-1} x = arcsin x
            power = None;
        }
        let applied = match (func, base) {
            (Func::Log10, Some(b)) => Expr::Log(Box::new(b), Box::new(arg)),
            (_, Some(_)) => return Err("subscript on a function other than log".to_owned()),
            (func, None) => Expr::Call(func, Box::new(arg)),
        };
        Ok(match power {
            Some(p) => Expr::Pow(Box::new(applied), Box::new(p)),
            None => applied,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(s: &str) -> f64 {
        Expr::parse(s)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .eval(&[])
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn precedence_and_associativity() {
        assert!(close(val("1+2*3"), 7.0));
        assert!(close(val("-2^2"), -4.0));
        assert!(close(val("2^3^2"), 512.0));
        assert!(close(val("2^-1"), 0.5));
        assert!(close(val("(1+2)(3+4)"), 21.0));
        assert!(close(val("8/2/2"), 2.0));
        assert!(close(val("2**3"), 8.0));
        assert!(close(val("3!"), 6.0));
        assert!(close(val("50%"), 0.5));
        assert!(close(val("1.5e3"), 1500.0));
        assert!(close(val("2e"), 2.0 * E));
    }

    #[test]
    fn latex_constructs() {
        assert!(close(val(r"\frac{3}{4}"), 0.75));
        assert!(close(val(r"\frac12"), 0.5));
        assert!(close(val(r"\sqrt{16}"), 4.0));
        assert!(close(val(r"\sqrt[3]{27}"), 3.0));
        assert!(close(val(r"\sqrt[3]{-8}"), -2.0));
        assert!(close(val(r"2\sqrt{2}"), 8f64.sqrt()));
        assert!(close(val(r"\pi"), PI));
        assert!(close(val(r"3 \cdot 4 \times 2"), 24.0));
        assert!(close(val(r"\left(1+1\right)^{2}"), 4.0));
        assert!(close(val(r"\binom{5}{2}"), 10.0));
        assert!(close(val(r"|-3|"), 3.0));
        assert!(close(val(r"\log_2 8"), 3.0));
        assert!(close(val(r"\log_{2}(8)"), 3.0));
        assert!(close(val(r"\ln(e^2)"), 2.0));
        assert!(close(val(r"\sin^2(1)+\cos^2(1)"), 1.0));
        assert!(close(val(r"\sin^{-1}(1)"), PI / 2.0));
        assert!(close(val("sqrt(9)"), 3.0));
        assert!(val(r"\infty").is_infinite());
    }

    #[test]
    fn variables_and_implicit_multiplication() {
        let e = Expr::parse("2xy + x_1 + a_{n}").unwrap();
        assert_eq!(e.variables(), vec!["a_n", "x", "x_1", "y"]);
        let vars = vec![
            ("x".to_owned(), 2.0),
            ("y".to_owned(), 3.0),
            ("x_1".to_owned(), 1.0),
            ("a_n".to_owned(), 1.0),
        ];
        assert!(close(e.eval(&vars), 14.0));
        let t = Expr::parse(r"\theta").unwrap();
        assert_eq!(t.variables(), vec!["\\theta"]);
        assert!(Expr::parse("x").unwrap().eval(&[]).is_nan());
    }

    #[test]
    fn rejects_what_is_not_one_expression() {
        for bad in ["1,2", "x=1", "(1+2", "1+", "\\foo", "", "a<b", "|x"] {
            assert!(Expr::parse(bad).is_err(), "{bad}");
        }
        let deep = "(".repeat(200) + "1" + &")".repeat(200);
        assert!(Expr::parse(&deep).is_err());
        assert!(Expr::parse(&"1+".repeat(MAX_INPUT)).is_err());
    }
}
