//! Seeded fuzz loops over the reward side's parsers, sized for CI (well under a few seconds
//! each in a debug build), with the inputs that found the bugs of issue #12 kept as named
//! regressions.
//!
//! Generation is deterministic (SplitMix64, fixed seeds): a failure names the seed and the
//! input, and reproduces. The invariants are the ones a reward-hacking policy would probe:
//! no input panics; an empty or content-free answer never earns a reward; equivalence is
//! symmetric; a number never equals a different exact number; an undefined value never equals
//! anything; a judge's score is a finite number in `[0, 1]`.

mod common;

use common::sample;
use roll_core::RewardWorker;
use roll_core::rng::SplitMix64;
use roll_reward::ifeval::{IfEvalConfig, IfEvalWorker, Instruction, parse_instructions};
use roll_reward::judge::parse_judge_score;
use roll_reward::math::{MathRuleWorker, Tolerance, equivalent, extract_answer, normalize};
use serde_json::json;

/// Inputs per loop.
const ROUNDS: usize = 1_500;

/// A deterministic input generator.
struct Gen(SplitMix64);

impl Gen {
    fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }

    fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n.max(1) as u64) as usize
    }

    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.0.next_u64() % (hi - lo + 1) as u64) as i64
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// Up to `max` atoms, concatenated.
    fn soup(&mut self, atoms: &[&str], max: usize) -> String {
        let n = self.below(max + 1);
        (0..n).map(|_| self.pick(atoms)).collect()
    }

    /// `n` random decimal digits (a leading zero allowed).
    fn digits(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + self.below(10) as u8))
            .collect()
    }
}

// --- named regressions: the inputs that found today's bugs ----------------------------------

/// (predicted, gold): wrong answers the math verifier used to accept.
const MATH_REGRESSIONS: &[(&str, &str)] = &[
    ("10^{400}", "10^{500}"),              // both overflowed to ∞
    ("2^{2000}", "3^{2000}"),              // likewise
    ("10^{400}", r"\infty"),               // an overflow is not infinity
    ("10^{-400}", "0"),                    // both underflowed to 0
    ("e^{-1000}", "0"),                    // likewise, through a float
    ("1e-400", "0.0"),                     // a rounding check in floats underflowed too
    ("x + 10^{-10}", "x"),                 // under the old absolute tolerance 1e-9
    (r"x + \frac{x}{10^{12}}", "x"),       // likewise
    ("x + y = 1 + 10^{-12}", "x + y = 1"), // an equation off by a small constant
    ("-inf", "inf"),                       // the text key dropped the sign
    ("-ab", "ab"),                         // likewise for any word
    (r"-\infty", r"\infty"),
    (r"\frac{0}{0}", r"\frac{0}{0}"), // NaN equal to itself as a string
    ("0/0", "0"),
    ("1.0000001", "1.0000002"), // different exact numbers within 1e-6
    ("12345678.9", "12345679"),
];

/// Responses with no answer, which no worker may reward: nothing, special tokens, a think
/// block with nothing after it, a think block never closed.
const EMPTY_RESPONSES: &[&str] = &[
    "",
    "   \n\t",
    "<|im_end|>",
    "<think>the answer is 4</think>",
    "<think>the answer is 4</think>  <|endoftext|>",
    r"<think>\boxed{4} and still thinking",
    "<think>",
];

/// Answer markers with nothing in them, which the math verifier may not reward.
const EMPTY_MATH_ANSWERS: &[&str] = &[r"\boxed{}", r"\boxed{ }", "####", "the answer is"];

/// Judge outputs whose numbers overflow f64 (∞/∞ was a NaN score).
fn judge_regressions() -> Vec<String> {
    let nines = "9".repeat(400);
    vec![
        format!("{nines}/{nines}"),
        format!("Score: {nines} out of {nines}"),
        format!("[[{nines}]]"),
        format!("Rating: {nines}"),
    ]
}

// --- math: extraction and equivalence ---------------------------------------------------------

#[rustfmt::skip]
const MATH_ATOMS: &[&str] = &[
    "1", "2", "0", "7", "10", "-", "+", "*", "/", "^", "{", "}", "(", ")", "[", "]", ",", "=", "x",
    "y", "e", ".", ".5", "1e5", "e-3", "%", "!", "|", " ", r"\frac", r"\sqrt", r"\pi", r"\infty",
    "∞", r"\cdot", r"\ln", r"\sin", r"\{", r"\}", r"\cup", r"\text{", r"\boxed{", "<think>",
    "</think>", "####", "the answer is ", "10^{400}", "10^{-400}", "0/0", "inf", r"\left(",
    r"\right)", "\n", "é", "\u{0}", "$",
];

/// Answer-shaped strings: the pool equivalence is checked on.
#[rustfmt::skip]
const ANSWERS: &[&str] = &[
    "1", "-1", "0", "0.5", r"\frac12", "1/2", "50%", "0.333333333", r"\frac13", "0.333",
    "10^{400}", "100^{200}", "10^{-400}", "0.0", r"\infty", r"-\infty", "-∞", "2x", "x+x",
    "(x+1)^2", "x^2+2x+1", "x + 10^{-10}", "x", "-x", "(1,2)", "(2,1)", "[1,2)", r"\{1,2\}",
    r"\{2,1\}", "1, 2", "x = 1", "y = 2x", "2x - y = 0", "4x = 2y", "Monday", "-inf", "inf",
    r"\sqrt{2}", "1.41421356", r"\pi", "3.14159265", "0.1234567894", "0.123456789", "0.1234567886",
    r"\{0.1234567894, 0.1234567886\}", r"\{0.123456789, 0.1234567886\}", "0/0", r"\ln(-1)",
    "1e400", "e^{1000}",
];

#[test]
fn math_no_panic_and_symmetric_equivalence() {
    let tol = Tolerance::default();
    let mut g = Gen::new(0x4d41_5448);
    let mut failures = Vec::new();
    // Every pair of the pool, then random soups.
    let pool = ANSWERS.iter().flat_map(|p| {
        ANSWERS
            .iter()
            .map(move |q| ((*p).to_owned(), (*q).to_owned()))
    });
    let soups: Vec<(String, String)> = (0..ROUNDS)
        .map(|_| (g.soup(MATH_ATOMS, 12), g.soup(MATH_ATOMS, 12)))
        .collect();
    for (p, q) in pool.chain(soups) {
        let (a, b) = (equivalent(&p, &q, &tol), equivalent(&q, &p, &tol));
        if a.is_some() != b.is_some() {
            failures.push(format!("asymmetric: {p:?} vs {q:?}: {a:?} / {b:?}"));
        }
        // Whatever the text, extraction and verification answer.
        let _ = extract_answer(&p);
        let _ = normalize(&p);
        let _ = MathRuleWorker::default().verify(&p, &q);
    }
    for (p, q) in MATH_REGRESSIONS {
        let (a, b) = (equivalent(p, q, &tol), equivalent(q, p, &tol));
        if a.is_some() || b.is_some() {
            failures.push(format!("regression: {p:?} vs {q:?}: {a:?} / {b:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn math_empty_or_garbage_answers_earn_nothing() {
    let w = MathRuleWorker::default();
    // Garbage: structure and punctuation, no digit, letter or infinity.
    const GARBAGE: &[&str] = &[
        "{", "}", "(", ")", "[", "]", ",", "^", "_", "-", "+", "/", "*", "|", "!", "%", ".", " ",
        "=", r"\{", r"\}", r"\left(", r"\right)", r"\,", "$", r"\boxed{", "</think>",
    ];
    let mut g = Gen::new(0x4741_5242);
    let mut failures = Vec::new();
    for _ in 0..ROUNDS {
        let gold = g.pick(ANSWERS);
        let garbage = g.soup(GARBAGE, 16);
        for response in [garbage.clone(), format!(r"\boxed{{{garbage}}}")] {
            let v = w.verify(&response, gold);
            if v.correct {
                failures.push(format!("{response:?} earned {gold:?} by {:?}", v.rule));
            }
        }
    }
    for gold in ANSWERS {
        for response in EMPTY_RESPONSES.iter().chain(EMPTY_MATH_ANSWERS) {
            if w.verify(response, gold).correct {
                failures.push(format!("empty {response:?} earned {gold:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn math_different_exact_numbers_are_never_equal() {
    let tol = Tolerance::default();
    let mut g = Gen::new(0x4e55_4d53);
    let mut failures = Vec::new();
    let mut check = |a: String, b: String| {
        if let Some(rule) = equivalent(&a, &b, &tol) {
            failures.push(format!("{a:?} = {b:?} by {rule}"));
        }
    };
    for round in 0..ROUNDS {
        match round % 5 {
            // Integers of any size, differing anywhere.
            0 => {
                let len = g.below(40);
                let a = format!("{}{}", 1 + g.below(9), g.digits(len));
                let mut b = a.clone().into_bytes();
                let k = g.below(b.len());
                b[k] = b'0' + ((b[k] - b'0' + 1 + g.below(9) as u8) % 10);
                let b = String::from_utf8(b).unwrap_or_default();
                if b.starts_with('0') {
                    continue;
                }
                check(a, b);
            }
            // Decimals with the same number of places.
            1 => {
                let places = 1 + g.below(12);
                let (x, y) = (g.digits(places), g.digits(places));
                if x != y {
                    let int = g.below(1000);
                    check(format!("{int}.{x}"), format!("{int}.{y}"));
                }
            }
            // Fractions of different value.
            2 => {
                let (p, q, r, s) = (
                    g.range(-999, 999),
                    g.range(1, 999),
                    g.range(-999, 999),
                    g.range(1, 999),
                );
                if p * s != r * q {
                    check(
                        format!(r"\frac{{{p}}}{{{q}}}"),
                        format!(r"\frac{{{r}}}{{{s}}}"),
                    );
                }
            }
            // Powers far beyond f64, both ways.
            3 => {
                let (k, m) = (g.range(-2400, 2400), g.range(-2400, 2400));
                if k != m {
                    check(format!("10^{{{k}}}"), format!("10^{{{m}}}"));
                    check(format!("1e{k}"), format!("1e{m}"));
                }
                if k != 0 {
                    check(
                        format!("10^{{{k}}}"),
                        if k > 0 { r"\infty" } else { "0" }.into(),
                    );
                }
            }
            // Sign flips.
            _ => {
                let x = g.pick(&[
                    "1", "0.5", r"\frac13", "10^{400}", r"\infty", "inf", "ab", "x",
                ]);
                check(format!("-{x}"), x.to_owned());
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn math_undefined_values_equal_nothing() {
    let tol = Tolerance::default();
    const UNDEFINED: &[&str] = &[
        "0/0",
        r"\frac{0}{0}",
        r"\frac{1}{0}",
        r"\ln(0)",
        r"\ln(-1)",
        r"\sqrt{-4}",
        r"\infty - \infty",
        r"0 \cdot \infty",
        "(-1)!",
        r"\frac{1}{2}!",
    ];
    let mut failures = Vec::new();
    for u in UNDEFINED {
        for other in UNDEFINED.iter().chain(ANSWERS) {
            if let Some(rule) = equivalent(u, other, &tol) {
                failures.push(format!("{u:?} = {other:?} by {rule}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// --- IFEval ---------------------------------------------------------------------------------

#[rustfmt::skip]
const TEXT_ATOMS: &[&str] = &[
    "word", "Word", "WORD", "cat", "tea", " ", "  ", "\n", "\n\n", ",", ".", "!", "?", "*", "* ",
    "- ", "* * *", "******", "<<", ">>", "[", "]", "\"", "{", "}", "Section 1", "P.S.",
    "Any other questions?", "z", "é", "ß", "<think>", "</think>", "<|im_end|>", "```json", "```",
    "123", ":",
];

/// A content-free response: punctuation, markup and whitespace only (the worker also strips
/// special tokens before the rules see the text).
#[rustfmt::skip]
const HOLLOW_ATOMS: &[&str] = &[
    " ", "\n", "\n\n", ",", ".", "!", "?", "*", "* ", "- ", "* * *", "******", "<<", ">>", "[",
    "]", "\"", "{", "}", "```", "{}", "[]", "\"\"", "<<>>", "***",
];

/// One valid instance of every instruction.
fn instructions() -> Vec<Instruction> {
    let truths = [
        json!({"func_name": "verify_keywords", "keyword_list": ["tea"]}),
        json!({"func_name": "verify_keyword_frequency", "word": "cat", "N": 0}),
        json!({"func_name": "verify_keyword_frequency", "word": "cat", "N": 2}),
        json!({"func_name": "validate_forbidden_words", "forbidden_words": ["cat"]}),
        json!({"func_name": "verify_letter_frequency", "letter": "z", "N": 0}),
        json!({"func_name": "verify_paragraph_count", "N": 1}),
        json!({"func_name": "validate_word_constraint", "N": 3, "quantifier": "at most"}),
        json!({"func_name": "validate_word_constraint", "N": 1, "quantifier": "at least"}),
        json!({"func_name": "verify_sentence_constraint", "N": 2, "quantifier": "at most"}),
        json!({"func_name": "validate_paragraphs", "N": 1, "first_word": "word", "i": 1}),
        json!({"func_name": "verify_postscript", "postscript_marker": "P.S."}),
        json!({"func_name": "validate_placeholders", "N": 1}),
        json!({"func_name": "verify_bullet_points", "N": 1}),
        json!({"func_name": "validate_title"}),
        json!({"func_name": "validate_choice", "options": ["word"]}),
        json!({"func_name": "validate_highlighted_sections", "N": 1}),
        json!({"func_name": "validate_sections", "N": 1, "section_splitter": "Section"}),
        json!({"func_name": "validate_json_format"}),
        json!({"func_name": "validate_repeat_prompt", "original_prompt": "word"}),
        json!({"func_name": "validate_two_responses"}),
        json!({"func_name": "validate_uppercase"}),
        json!({"func_name": "validate_lowercase"}),
        json!({"func_name": "validate_frequency_capital_words", "N": 0, "quantifier": "at most"}),
        json!({"func_name": "validate_end", "end_phrase": "Any other questions?"}),
        json!({"func_name": "validate_quotation"}),
        json!({"func_name": "validate_no_commas"}),
    ];
    truths
        .iter()
        .flat_map(|t| parse_instructions(&t.to_string()).unwrap_or_else(|e| panic!("{t}: {e}")))
        .collect()
}

#[test]
fn ifeval_rules_never_panic_and_reward_no_hollow_response() {
    let rules = instructions();
    assert_eq!(
        rules
            .iter()
            .map(Instruction::func_name)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        roll_reward::ifeval::INSTRUCTIONS.len(),
        "every rule is fuzzed"
    );
    let mut g = Gen::new(0x4946_4556);
    let mut failures = Vec::new();
    for _ in 0..ROUNDS {
        let text = g.soup(TEXT_ATOMS, 20);
        let hollow = g.soup(HOLLOW_ATOMS, 10);
        for rule in &rules {
            let _ = rule.check(&text);
            if rule.check(&hollow) {
                failures.push(format!("{} passed {hollow:?}", rule.func_name()));
            }
        }
    }
    for rule in &rules {
        // The rules see the text after the worker removed special tokens and the think block.
        for response in ["", " ", "\n\t  \n"] {
            if rule.check(response) {
                failures.push(format!("{} passed {response:?}", rule.func_name()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn ifeval_worker_gives_nothing_for_empty_or_think_only_answers() {
    // The rules an empty answer used to pass, and those content-free markup could.
    let truth = json!([
        {"func_name": "validate_lowercase"},
        {"func_name": "validate_uppercase"},
        {"func_name": "validate_no_commas"},
        {"func_name": "validate_forbidden_words", "forbidden_words": ["cat"]},
        {"func_name": "verify_keyword_frequency", "word": "cat", "N": 0},
        {"func_name": "verify_letter_frequency", "letter": "z", "N": 0},
        {"func_name": "validate_word_constraint", "N": 3, "quantifier": "at most"},
        {"func_name": "validate_frequency_capital_words", "N": 0, "quantifier": "at most"},
        {"func_name": "validate_json_format"},
        {"func_name": "validate_two_responses"},
        {"func_name": "validate_quotation"},
        {"func_name": "validate_title"},
    ])
    .to_string();
    let worker = IfEvalWorker::new(IfEvalConfig {
        partial_credit: true,
    });
    let mut g = Gen::new(0x5448_4b21);
    let mut responses: Vec<String> = EMPTY_RESPONSES.iter().map(|s| (*s).to_owned()).collect();
    for _ in 0..200 {
        // A think block with any content, then nothing or only hollow text.
        let thought = g.soup(TEXT_ATOMS, 10).replace("</think>", "");
        let after = g.soup(HOLLOW_ATOMS, 5) + g.pick(&["", "<|im_end|>", "<|endoftext|>"]);
        responses.push(format!("<think>{thought}</think>{after}"));
        responses.push(format!("<think>{thought}"));
    }
    for response in &responses {
        let r = worker
            .score(&sample("ifeval", response, Some(&truth)))
            .await
            .unwrap();
        assert_eq!(r.value, 0.0, "{response:?}: {:?}", r.details);
    }
}

// --- the judge's score parser ---------------------------------------------------------------

#[rustfmt::skip]
const JUDGE_ATOMS: &[&str] = &[
    "Score", "score", "Rating", ": ", " ", "7", "10", "0", "3.5", "/", " out of ", "[[", "]]",
    "yes", "no", "not", "correct", "wrong", "is", "the", ".", "\n", "<think>", "</think>", "**",
    "-", "99999999999999999999999999999999999999", "1e400", "é",
];

#[test]
fn judge_scores_are_finite_and_in_range() {
    let mut g = Gen::new(0x4a55_4447);
    let mut failures = Vec::new();
    let mut outputs: Vec<String> = judge_regressions();
    for _ in 0..ROUNDS {
        outputs.push(g.soup(JUDGE_ATOMS, 14));
    }
    for output in &outputs {
        for max in [
            1.0,
            5.0,
            10.0,
            100.0,
            f32::MAX,
            f32::INFINITY,
            0.0,
            -1.0,
            f32::NAN,
        ] {
            if let Some(s) = parse_judge_score(output, max)
                && !(s.value.is_finite() && (0.0..=1.0).contains(&s.value))
            {
                failures.push(format!("{output:?} / {max}: {s:?}"));
            }
        }
    }
    // No digit and no letter: nothing to read.
    for _ in 0..ROUNDS {
        let hollow = g.soup(
            &[" ", ".", ":", "/", "[[", "]]", "*", "\n", "-", "!", "?"],
            12,
        );
        if let Some(s) = parse_judge_score(&hollow, 10.0) {
            failures.push(format!("{hollow:?} read as {s:?}"));
        }
    }
    for output in judge_regressions() {
        if let Some(s) = parse_judge_score(&output, 10.0) {
            failures.push(format!("regression {output:?} read as {s:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
