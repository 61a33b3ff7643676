//! Normalisation of an answer string before comparison: LaTeX wrappers, spacing, units,
//! thousands separators and `x =` prefixes removed, so that equal answers written differently
//! become equal strings (or at least parseable expressions).

/// Commands whose braced argument is kept and the command dropped.
const UNWRAP: &[&str] = &[
    "\\boxed",
    "\\textbf",
    "\\textit",
    "\\textrm",
    "\\textsf",
    "\\texttt",
    "\\text",
    "\\mathrm",
    "\\mathbf",
    "\\mathit",
    "\\mathsf",
    "\\mathbb",
    "\\mbox",
    "\\hbox",
    "\\operatorname",
];

/// Fragments deleted outright.
const DELETE: &[&str] = &[
    "\\displaystyle",
    "\\qquad",
    "\\quad",
    "\\left",
    "\\right",
    "\\bigl",
    "\\bigr",
    "\\Bigl",
    "\\Bigr",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\ ",
    "\\$",
    "$",
    "\\(",
    "\\)",
    "\\[",
    "\\]",
    "^{\\circ}",
    "^\\circ",
    "\\circ",
    "°",
    "{,}",
];

/// Replacements applied before anything else.
const REPLACE: &[(&str, &str)] = &[
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("\\cfrac", "\\frac"),
    ("\\%", "%"),
    ("−", "-"),
    ("~", " "),
    ("\u{a0}", " "),
];

/// Unit words stripped after a number (plurals are handled by an `s` suffix).
const UNITS: &[&str] = &[
    "mm",
    "cm",
    "m",
    "km",
    "in",
    "inch",
    "inche",
    "ft",
    "foot",
    "feet",
    "yd",
    "yard",
    "mile",
    "mi",
    "g",
    "mg",
    "kg",
    "lb",
    "pound",
    "ounce",
    "oz",
    "ton",
    "s",
    "sec",
    "second",
    "min",
    "minute",
    "h",
    "hr",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "l",
    "ml",
    "liter",
    "litre",
    "gallon",
    "dollar",
    "cent",
    "euro",
    "unit",
    "degree",
    "meter",
    "metre",
    "centimeter",
    "kilometer",
    "millimeter",
    "gram",
    "kilogram",
    "mph",
    "kmh",
    "percent",
    "point",
    "sq",
    "square",
    "cubic",
    "people",
    "person",
    "student",
    "apple",
    "book",
    "page",
    "item",
    "way",
    "time",
];

/// Longest answer normalised, in bytes (64 KiB, far above [`MAX_ANSWER_LEN`]). A longer one is
/// returned trimmed and otherwise unchanged: the comparison rules only ever compare such answers
/// as strings, so normalising them would be work for nothing.
///
/// [`MAX_ANSWER_LEN`]: super::MAX_ANSWER_LEN
pub const MAX_NORMALIZE_LEN: usize = 64 * 1024;

/// The normal form of `answer`: LaTeX wrappers (`\text{}`, `\boxed{}`, ...) unwrapped, spacing,
/// `$`, `\left`/`\right`, degree signs, units, thousands separators and a leading `x =`
/// removed, mixed numbers made sums.
///
/// Linear in the length of `answer`: every pass is a single scan, and the braces closing each
/// `{` are found once for the whole text (a scan per `\text{` would make `\text{\text{...` of
/// unclosed wrappers quadratic). Answers over [`MAX_NORMALIZE_LEN`] bytes are only trimmed.
pub fn normalize(answer: &str) -> String {
    normalize_counted(answer).0
}

/// [`normalize`], and the number of steps the unwrapping of commands took (for the test that
/// it stays linear).
fn normalize_counted(answer: &str) -> (String, usize) {
    let trimmed = answer.trim();
    if trimmed.len() > MAX_NORMALIZE_LEN {
        return (trimmed.to_owned(), 0);
    }
    let mut s = trimmed.to_owned();
    for (from, to) in REPLACE {
        if s.contains(from) {
            s = s.replace(from, to);
        }
    }
    let mut unwrapper = Unwrapper::new(&s);
    let mut out = String::with_capacity(s.len() + 16);
    unwrapper.unwrap(&s, 0, s.len(), 0, &mut out);
    let steps = unwrapper.steps;
    let mut s = out;
    for d in DELETE {
        if s.contains(d) {
            s = s.replace(d, " ");
        }
    }
    let s = collapse_spaces(&s);
    // Sentence-final periods (not a decimal point), trimmed as a slice: one pass.
    let mut t = s.as_str();
    while let Some(rest) = t.strip_suffix('.') {
        t = rest.trim_end();
    }
    let s = strip_assignment(t);
    let s = strip_units(s);
    let s = strip_thousands(&s);
    let s = mixed_number(&s).unwrap_or(s);
    (s.replace(' ', ""), steps)
}

/// Nesting of `\text{..}`-like wrappers unwrapped; deeper ones are left as they are.
const MAX_UNWRAP_DEPTH: usize = 8;

/// `\text{abc}` → ` abc ` (spaces keep a unit apart from its number), in one pass over a table
/// of matching braces.
struct Unwrapper {
    /// For each byte that is an unescaped `{`, the byte index of its matching `}` (`usize::MAX`
    /// when it has none); unused elsewhere.
    closing: Vec<usize>,
    /// Steps taken: characters copied and commands tried.
    steps: usize,
}

impl Unwrapper {
    /// The table of matching braces of `s`, escaped braces (`\{`) skipped — the same pairs as
    /// [`matching_brace`](crate::text::matching_brace) finds, in one scan with a stack.
    fn new(s: &str) -> Self {
        let bytes = s.as_bytes();
        let mut closing = vec![usize::MAX; bytes.len()];
        let mut open: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => i += 1,
                b'{' => open.push(i),
                b'}' => {
                    if let Some(o) = open.pop() {
                        closing[o] = i;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        Self { closing, steps: 0 }
    }

    /// Appends `s[start..end]` with its wrappers unwrapped to `out`.
    fn unwrap(&mut self, s: &str, start: usize, end: usize, depth: usize, out: &mut String) {
        if depth >= MAX_UNWRAP_DEPTH {
            out.push_str(&s[start..end]);
            self.steps += 1;
            return;
        }
        let mut i = start;
        'outer: while i < end {
            self.steps += 1;
            let rest = &s[i..end];
            if rest.starts_with('\\') {
                for cmd in UNWRAP {
                    self.steps += 1;
                    let Some(after) = rest.strip_prefix(cmd) else {
                        continue;
                    };
                    let after_ws = after.trim_start();
                    let open = end - after_ws.len();
                    if after_ws.starts_with('{')
                        && let Some(&close) = self.closing.get(open)
                        && close < end
                    {
                        out.push(' ');
                        self.unwrap(s, open + 1, close, depth + 1, out);
                        out.push(' ');
                        i = close + 1;
                        continue 'outer;
                    }
                }
            }
            let c = rest.chars().next().map_or(1, char::len_utf8);
            out.push_str(&rest[..c]);
            i += c;
        }
    }
}

fn collapse_spaces(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `x = 5` → `5`, `k \in [1, 2]` → `[1, 2]`: a single variable (a letter, a Greek command, with
/// an optional subscript) on the left of the only `=`.
fn strip_assignment(s: &str) -> String {
    for rel in ["\\in", "="] {
        let Some(i) = s.find(rel) else { continue };
        let after = &s[i + rel.len()..];
        if rel == "=" && after.contains('=') {
            return s.to_owned();
        }
        if rel == "\\in" && after.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue; // `\infty`, not `\in`
        }
        let lhs = s[..i].trim();
        let rhs = after.trim();
        if !rhs.is_empty() && is_variable(lhs) {
            return rhs.to_owned();
        }
    }
    s.to_owned()
}

/// A letter or a Greek command, with an optional subscript: `x`, `x_1`, `\theta`, `a_{n}`.
fn is_variable(s: &str) -> bool {
    let (base, sub) = match s.split_once('_') {
        Some((b, sub)) => (b, Some(sub)),
        None => (s, None),
    };
    let mut chars = base.chars();
    let single = matches!((chars.next(), chars.next()), (Some(c), None) if c.is_alphabetic());
    let greek = base.len() > 1
        && base.starts_with('\\')
        && base[1..].chars().all(|c| c.is_ascii_alphabetic());
    let sub_ok = sub.is_none_or(|t| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '{' || c == '}')
    });
    (single || greek) && sub_ok
}

/// `10 cm`, `5 dollars`, `12 square units`, `3 m/s` → the number. Only when what follows the
/// number is made of unit words (see [`UNITS`], plural `s` allowed), so `2 x` stays.
fn strip_units(s: String) -> String {
    let Some(split) = s.find(|c: char| c.is_ascii_alphabetic() || c == '\\') else {
        return s;
    };
    let (number, tail) = s.split_at(split);
    let number = number.trim();
    if number.is_empty()
        || !number
            .chars()
            .all(|c| c.is_ascii_digit() || ".,-+/ ".contains(c))
    {
        return s;
    }
    let is_unit_tail = tail
        .split(|c: char| {
            c == ' ' || c == '/' || c == '^' || c.is_ascii_digit() || c == '{' || c == '}'
        })
        .filter(|w| !w.is_empty())
        .all(|w| {
            let w = w.to_ascii_lowercase();
            let singular = w.strip_suffix('s').unwrap_or(&w);
            UNITS.contains(&w.as_str()) || UNITS.contains(&singular)
        });
    if is_unit_tail { number.to_owned() } else { s }
}

/// `1,234,567.5` → `1234567.5` when the whole answer is one such number.
fn strip_thousands(s: &str) -> String {
    let body = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (body, None),
    };
    let groups: Vec<&str> = int.split(',').collect();
    let ok = groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && groups[1..].iter().all(|g| g.len() == 3)
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_digit()))
        && frac.is_none_or(|f| !f.is_empty() && f.chars().all(|c| c.is_ascii_digit()));
    if ok { s.replace(',', "") } else { s.to_owned() }
}

/// `2\frac{1}{3}` → `(2+\frac{1}{3})` (a mixed number, not a product), also negated.
fn mixed_number(s: &str) -> Option<String> {
    let (sign, body) = match s.strip_prefix('-') {
        Some(b) => ("-", b),
        None => ("", s),
    };
    let i = body.find("\\frac")?;
    let whole = body[..i].trim();
    let frac = &body[i..];
    let digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit());
    let args = frac.strip_prefix("\\frac{")?;
    let (num, rest) = args.split_once("}{")?;
    let den = rest.strip_suffix('}')?;
    (digits(whole) && digits(num) && digits(den)).then(|| format!("{sign}({whole}+{frac})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrappers_spacing_and_units_go() {
        assert_eq!(normalize(r"$\text{10 cm}$"), "10");
        assert_eq!(normalize(r"10\text{ inches}"), "10");
        assert_eq!(normalize("5 dollars."), "5");
        assert_eq!(normalize(r"\$1,234.50"), "1234.50");
        assert_eq!(normalize(r"x = \dfrac{1}{2}"), r"\frac{1}{2}");
        assert_eq!(normalize(r"\left( 1, 2 \right)"), "(1,2)");
        assert_eq!(normalize(r"90^\circ"), "90");
        assert_eq!(normalize(r"50\%"), "50%");
        assert_eq!(normalize(r"1{,}000"), "1000");
        assert_eq!(normalize(r"2\frac{1}{2}"), r"(2+\frac{1}{2})");
        assert_eq!(normalize(r"\textbf{Monday}"), "Monday");
        assert_eq!(normalize("2 x"), "2x");
        assert_eq!(normalize(r"k \in [1, 2]"), "[1,2]");
        assert_eq!(normalize("y = 2x + 1"), "2x+1");
        assert_eq!(normalize("a = b = c"), "a=b=c");
        assert_eq!(normalize("(100,200)"), "(100,200)");
        assert_eq!(normalize("3 m/s"), "3");
    }

    /// Steps per input byte that unwrapping may take: a constant, whatever the nesting.
    const STEPS_PER_BYTE: usize = 40;

    #[test]
    fn unwrapping_takes_linear_steps_on_pathological_nesting() {
        // (8,000 wrappers side by side are 64,000 bytes: just under the cut-off.)
        for n in [100, 1_000, 8_000] {
            // Unclosed wrappers: a scan to the end for each `\text{` would be n²/2 steps.
            let unclosed = r"\text{".repeat(n) + "1";
            // Closed ones, nested n deep (only MAX_UNWRAP_DEPTH levels are unwrapped).
            let nested = r"\text{".repeat(n) + "1" + &"}".repeat(n);
            // Many wrappers side by side.
            let flat = r"\text{1}".repeat(n);
            for input in [&unclosed, &nested, &flat] {
                let (out, steps) = normalize_counted(input);
                assert!(
                    steps <= STEPS_PER_BYTE * input.len(),
                    "{n}: {steps} steps for {} bytes",
                    input.len()
                );
                assert!(out.len() <= input.len(), "{n}: output grew");
            }
            assert!(normalize(&flat) == "1".repeat(n), "{n}: not unwrapped");
        }
        // Only the first levels are unwrapped; the rest stays as written.
        let deep = r"\text{".repeat(20) + "7" + &"}".repeat(20);
        let out = normalize(&deep);
        assert!(out.ends_with(&format!("7{}", "}".repeat(12))), "{out}");
    }

    #[test]
    fn long_inputs_are_bounded() {
        // Periods stripped in one pass, not by copying the string once per period.
        assert_eq!(normalize(&format!("1{}", ".".repeat(60_000))), "1");
        // Over the cut-off: trimmed, not normalised.
        let huge = format!("  {}  ", r"\text{".repeat(MAX_NORMALIZE_LEN / 6 + 1));
        assert!(normalize(&huge) == huge.trim(), "changed over the cut-off");
        let (_, steps) = normalize_counted(&huge);
        assert_eq!(steps, 0);
        // Just under it: normalised, in linear steps.
        let under = r"\text{".repeat(MAX_NORMALIZE_LEN / 6 - 1);
        let (out, steps) = normalize_counted(&under);
        assert!(steps <= STEPS_PER_BYTE * under.len());
        assert!(out.len() <= under.len());
    }
}
