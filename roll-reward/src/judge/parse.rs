//! Turning a judge's free-form output into a score in `[0, 1]`.

use crate::text::after_think;

/// How a score was read from a judge's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreForm {
    /// A fraction: `7/10`, `7 out of 10`.
    Fraction,
    /// A number after `score`, `rating` or `grade`: `Score: 7`, `a rating of 8`.
    Labelled,
    /// The only number in the output: `8`, `[[6]]`.
    Bare,
    /// A verdict word: `yes`/`correct`/`true` (1) or `no`/`incorrect`/`false`/`wrong` (0).
    Verdict,
}

impl ScoreForm {
    /// The name reported in details.
    pub fn name(self) -> &'static str {
        match self {
            ScoreForm::Fraction => "fraction",
            ScoreForm::Labelled => "labelled",
            ScoreForm::Bare => "bare",
            ScoreForm::Verdict => "verdict",
        }
    }
}

/// A judge's score, normalised to `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JudgeScore {
    /// The score in `[0, 1]`.
    pub value: f32,
    /// How it was read.
    pub form: ScoreForm,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Word(String),
    Slash,
    Other,
}

fn tokenize(text: &str) -> Vec<Tok> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let s: String = chars[start..i].iter().collect();
            out.push(s.parse().map_or(Tok::Other, Tok::Num));
        } else if c.is_alphabetic() {
            let start = i;
            while i < chars.len() && chars[i].is_alphabetic() {
                i += 1;
            }
            out.push(Tok::Word(
                chars[start..i].iter().collect::<String>().to_lowercase(),
            ));
        } else {
            if c == '/' {
                out.push(Tok::Slash);
            } else if !c.is_whitespace() {
                out.push(Tok::Other);
            }
            i += 1;
        }
    }
    out
}

fn word(t: Option<&Tok>, w: &str) -> bool {
    matches!(t, Some(Tok::Word(x)) if x == w)
}

/// `x / max` when `0 ≤ x ≤ max` and both are finite. Digit runs too long for `f64` parse as
/// `∞`; without the finiteness check `∞/∞` would be a NaN reward.
fn in_range(x: f64, max: f64) -> Option<f32> {
    (x.is_finite() && max.is_finite() && max > 0.0 && (0.0..=max).contains(&x))
        .then(|| (x / max) as f32)
}

/// Reads a score from a judge's output; `max_score` is the top of the scale asked for (10 for a
/// 0–10 rubric). The text after the judge's own `</think>` is read, and the first of these that
/// applies wins:
///
/// 1. the last fraction `a/b` or `a out of b` with `0 ≤ a ≤ b` → `a/b`;
/// 2. the last number labelled by `score`, `rating` or `grade` (`Score: 7`, `a rating of 8`),
///    within `[0, max_score]` → `n / max_score`;
/// 3. the only number of an output with no words (`8`, `[[6]]`) → `n / max_score`;
/// 4. a verdict: the first word if it is `yes` or `no`, else the last of `yes`, `correct`,
///    `true`, `right` (1) and `no`, `incorrect`, `false`, `wrong` (0), negated by a `not` just
///    before it.
///
/// `None` when nothing applies (or a number is out of range and nothing else applies).
///
/// ```
/// use roll_reward::judge::parse_judge_score;
///
/// assert_eq!(parse_judge_score("Score: 7/10", 10.0).map(|s| s.value), Some(0.7));
/// assert_eq!(parse_judge_score("I'd give it a rating of 4.", 10.0).map(|s| s.value), Some(0.4));
/// assert_eq!(parse_judge_score("Yes.", 10.0).map(|s| s.value), Some(1.0));
/// assert_eq!(parse_judge_score("The response is not correct.", 10.0).map(|s| s.value), Some(0.0));
/// assert_eq!(parse_judge_score("no idea what to say", 10.0).map(|s| s.value), Some(0.0));
/// assert!(parse_judge_score("hmm", 10.0).is_none());
/// ```
pub fn parse_judge_score(output: &str, max_score: f32) -> Option<JudgeScore> {
    let text = after_think(output).unwrap_or(output);
    let toks = tokenize(text);
    let max = f64::from(max_score);
    let score = |value, form| Some(JudgeScore { value, form });

    // 1. Fractions, last first.
    for i in (0..toks.len()).rev() {
        let Some(Tok::Num(a)) = toks.get(i) else {
            continue;
        };
        let den = match (toks.get(i + 1), toks.get(i + 2), toks.get(i + 3)) {
            (Some(Tok::Slash), Some(Tok::Num(b)), _) => Some(*b),
            (Some(Tok::Word(o)), Some(Tok::Word(f)), Some(Tok::Num(b)))
                if o == "out" && f == "of" =>
            {
                Some(*b)
            }
            _ => None,
        };
        if let Some(b) = den
            && let Some(v) = in_range(*a, b)
        {
            return score(v, ScoreForm::Fraction);
        }
    }

    // 2. Labelled numbers, last label first; up to four filler tokens between.
    const LABELS: &[&str] = &["score", "rating", "grade", "scores", "rated"];
    const FILLER: &[&str] = &[
        "is", "of", "a", "an", "was", "final", "overall", "my", "be", "as",
    ];
    for i in (0..toks.len()).rev() {
        if !matches!(&toks[i], Tok::Word(w) if LABELS.contains(&w.as_str())) {
            continue;
        }
        for t in toks.iter().skip(i + 1).take(5) {
            match t {
                Tok::Num(n) => {
                    if let Some(v) = in_range(*n, max) {
                        return score(v, ScoreForm::Labelled);
                    }
                    break;
                }
                Tok::Other => {}
                Tok::Word(w) if FILLER.contains(&w.as_str()) => {}
                _ => break,
            }
        }
    }

    // 3. A lone number.
    let nums: Vec<f64> = toks
        .iter()
        .filter_map(|t| if let Tok::Num(n) = t { Some(*n) } else { None })
        .collect();
    let has_words = toks.iter().any(|t| matches!(t, Tok::Word(_)));
    if let ([n], false) = (nums.as_slice(), has_words)
        && let Some(v) = in_range(*n, max)
    {
        return score(v, ScoreForm::Bare);
    }

    // 4. Verdict words.
    let first = toks.iter().find(|t| matches!(t, Tok::Word(_)));
    if word(first, "yes") {
        return score(1.0, ScoreForm::Verdict);
    }
    if word(first, "no") {
        return score(0.0, ScoreForm::Verdict);
    }
    for i in (0..toks.len()).rev() {
        let Tok::Word(w) = &toks[i] else { continue };
        let positive = match w.as_str() {
            "yes" | "correct" | "true" | "right" => true,
            "no" | "incorrect" | "false" | "wrong" => false,
            _ => continue,
        };
        let negated = i > 0 && word(toks.get(i - 1), "not");
        let v = if positive != negated { 1.0 } else { 0.0 };
        return score(v, ScoreForm::Verdict);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Option<(f32, ScoreForm)> {
        parse_judge_score(s, 10.0).map(|j| (j.value, j.form))
    }

    #[test]
    fn fractions() {
        assert_eq!(v("Score: 7/10"), Some((0.7, ScoreForm::Fraction)));
        assert_eq!(v("**Score**: 3 / 5"), Some((0.6, ScoreForm::Fraction)));
        assert_eq!(v("I'd say 8 out of 10."), Some((0.8, ScoreForm::Fraction)));
        assert_eq!(
            v("first 2/10, on reflection 9/10"),
            Some((0.9, ScoreForm::Fraction))
        );
        assert_eq!(v("Score: 0/10"), Some((0.0, ScoreForm::Fraction)));
        // An impossible fraction is skipped, the label still reads.
        assert_eq!(
            v("Score: 12/10 ... final score: 6"),
            Some((0.6, ScoreForm::Labelled))
        );
    }

    #[test]
    fn labels_and_bare_numbers() {
        assert_eq!(v("Score: 7"), Some((0.7, ScoreForm::Labelled)));
        assert_eq!(
            v("My overall rating is 8.5"),
            Some((0.85, ScoreForm::Labelled))
        );
        assert_eq!(v("Final grade = 10"), Some((1.0, ScoreForm::Labelled)));
        assert_eq!(v("Rating: [[6]]"), Some((0.6, ScoreForm::Labelled)));
        assert_eq!(v("[[6]]"), Some((0.6, ScoreForm::Bare)));
        assert_eq!(v("  9 "), Some((0.9, ScoreForm::Bare)));
        assert_eq!(v("Score: 15"), None);
        assert_eq!(v("42"), None);
    }

    #[test]
    fn numbers_too_long_for_f64_are_not_scores() {
        let huge = "9".repeat(400);
        // ∞/∞ was NaN, ∞ out of ∞ likewise.
        assert_eq!(v(&format!("{huge}/{huge}")), None);
        assert_eq!(v(&format!("Score: {huge} out of {huge}")), None);
        assert_eq!(
            parse_judge_score(&format!("[[{huge}]]"), f32::INFINITY),
            None
        );
        assert_eq!(
            v(&format!("{huge}/{huge}, final score: 7")).map(|s| s.0),
            Some(0.7)
        );
    }

    #[test]
    fn verdicts() {
        assert_eq!(v("Yes"), Some((1.0, ScoreForm::Verdict)));
        assert_eq!(
            v("**NO**, the answer differs."),
            Some((0.0, ScoreForm::Verdict))
        );
        assert_eq!(
            v("The response is correct."),
            Some((1.0, ScoreForm::Verdict))
        );
        assert_eq!(
            v("The response is incorrect."),
            Some((0.0, ScoreForm::Verdict))
        );
        assert_eq!(v("This is not right."), Some((0.0, ScoreForm::Verdict)));
        assert_eq!(
            v("I know the answer; it is wrong"),
            Some((0.0, ScoreForm::Verdict))
        );
        assert_eq!(
            v("<think>no wait</think>yes"),
            Some((1.0, ScoreForm::Verdict))
        );
        assert_eq!(v("I cannot decide."), None);
        assert_eq!(v(""), None);
    }
}
