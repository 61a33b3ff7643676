//! Every IFEval instruction with a response that follows it and one that does not, plus the
//! ground-truth formats and their errors.

mod common;

use common::sample;
use roll_core::RewardWorker;
use roll_reward::ifeval::{INSTRUCTIONS, IfEvalConfig, IfEvalWorker, parse_instructions};
use serde_json::json;
use std::collections::BTreeSet;

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// (func_name, kwargs, passing response, failing response).
fn cases() -> Vec<(&'static str, serde_json::Value, &'static str, &'static str)> {
    vec![
        (
            "verify_keywords",
            json!({"keyword_list": ["Rust", "borrow"]}),
            "rust has a BORROW checker",
            "rust is fast",
        ),
        (
            "verify_keyword_frequency",
            json!({"word": "cat", "N": 2}),
            "Cat and cat; category is not one",
            "cat cat cat",
        ),
        (
            "validate_forbidden_words",
            json!({"forbidden_words": ["bad", "evil"]}),
            "a badge is fine",
            "that is bad",
        ),
        (
            "verify_letter_frequency",
            json!({"letter": "z", "N": 3}),
            "zzz",
            "zz Z",
        ),
        (
            "verify_paragraph_count",
            json!({"N": 3}),
            "one\n* * *\ntwo\n* * *\nthree",
            "one\n* * *\n\n* * *\nthree",
        ),
        (
            "validate_word_constraint",
            json!({"N": 5, "quantifier": "at least"}),
            "one two three four five",
            "one two three four",
        ),
        (
            "validate_word_constraint",
            json!({"N": 3, "quantifier": "at most"}),
            "one two",
            "one two three four",
        ),
        (
            "validate_word_constraint",
            json!({"N": 20, "quantifier": "around"}),
            leak("w ".repeat(22)),
            leak("w ".repeat(23)),
        ),
        (
            "verify_sentence_constraint",
            json!({"N": 2, "quantifier": "at most"}),
            "It costs 3.5 dollars. Buy it!",
            "One. Two. Three.",
        ),
        (
            "verify_sentence_constraint",
            json!({"N": 3, "quantifier": "at least"}),
            "One. Two? Three!",
            "One. Two.",
        ),
        (
            "validate_paragraphs",
            json!({"N": 2, "first_word": "second", "i": 2}),
            "First part.\n\nSecond, the rest.",
            "First part.\n\nThird part.",
        ),
        (
            "verify_postscript",
            json!({"postscript_marker": "P.S."}),
            "Hello.\nP.S. see you",
            "Hello. P.S.",
        ),
        (
            "validate_placeholders",
            json!({"N": 2}),
            "Dear [name], at [address]",
            "Dear [name]",
        ),
        (
            "verify_bullet_points",
            json!({"N": 2}),
            "Intro\n* one\n* two",
            "* one\n* two\n- three",
        ),
        (
            "validate_title",
            json!({}),
            "<<A Poem>>\nroses",
            "A Poem\nroses",
        ),
        (
            "validate_choice",
            json!({"options": ["My answer is yes.", "My answer is no."]}),
            "My answer is no.",
            "Maybe.",
        ),
        (
            "validate_highlighted_sections",
            json!({"N": 2}),
            "*one* and *two*",
            "*one* only",
        ),
        (
            "validate_sections",
            json!({"N": 2, "section_splitter": "Section"}),
            "SECTION 1\na\nSection 2\nb",
            "Section 1\nonly",
        ),
        (
            "validate_json_format",
            json!({}),
            "```json\n{\"a\": 1}\n```",
            "{\"a\": 1} trailing",
        ),
        (
            "validate_repeat_prompt",
            json!({"original_prompt": "Write a haiku."}),
            "Write a haiku. Leaves fall.",
            "Leaves fall.",
        ),
        (
            "validate_two_responses",
            json!({}),
            "First answer.\n******\nSecond answer.",
            "Same.\n******\nSame.",
        ),
        (
            "validate_uppercase",
            json!({}),
            "ALL CAPS 123",
            "Not all caps",
        ),
        (
            "validate_lowercase",
            json!({}),
            "all lower",
            "Not all lower",
        ),
        (
            "validate_frequency_capital_words",
            json!({"N": 2, "quantifier": "at least"}),
            "THE END is NEAR",
            "The End",
        ),
        (
            "validate_end",
            json!({"end_phrase": "Any other questions?"}),
            "Done. Any other questions?\n",
            "Any other questions? Bye.",
        ),
        ("validate_quotation", json!({}), "\"wrapped\"", "\"half"),
        (
            "validate_no_commas",
            json!({}),
            "no commas here",
            "one, two",
        ),
    ]
}

async fn value(func: &str, kwargs: &serde_json::Value, response: &str) -> f32 {
    let truth = json!({"func_name": func, "kwargs": kwargs}).to_string();
    IfEvalWorker::default()
        .score(&sample("ifeval", response, Some(&truth)))
        .await
        .unwrap_or_else(|e| panic!("{func}: {e}"))
        .value
}

#[tokio::test]
async fn every_instruction_passes_and_fails() {
    let cases = cases();
    let covered: BTreeSet<&str> = cases.iter().map(|c| c.0).collect();
    assert_eq!(
        covered.len(),
        INSTRUCTIONS.len(),
        "every instruction has a case"
    );
    assert!(INSTRUCTIONS.len() >= 15);
    for (func, kwargs, pass, fail) in &cases {
        assert_eq!(
            value(func, kwargs, pass).await,
            1.0,
            "{func} should pass {pass:?}"
        );
        assert_eq!(
            value(func, kwargs, fail).await,
            0.0,
            "{func} should fail {fail:?}"
        );
    }
}

#[tokio::test]
async fn think_blocks_are_not_checked() {
    let kwargs = json!({});
    assert_eq!(
        value(
            "validate_lowercase",
            &kwargs,
            "<think>Hmm, OK</think>all good"
        )
        .await,
        1.0
    );
    // A think block never closed holds no answer: nothing to be lowercase.
    assert_eq!(
        value("validate_lowercase", &kwargs, "<think>never closed").await,
        0.0
    );
}

/// Responses that say nothing: empty, blank, special tokens only, a think block and nothing
/// after it, a think block never closed.
const NOTHING: &[&str] = &[
    "",
    "   \n\t ",
    "<|im_end|>",
    "<|endoftext|><|im_end|>",
    "<think>The answer could be yes.</think>",
    "<think>The answer could be yes.</think>  \n<|im_end|>",
    "<think>still thinking, never closed",
    "<think>",
];

#[tokio::test]
async fn saying_nothing_follows_no_instruction() {
    let mut failures = Vec::new();
    for (func, kwargs, _, _) in cases() {
        for response in NOTHING {
            if value(func, &kwargs, response).await != 0.0 {
                failures.push(format!("{func} {kwargs} rewarded {response:?}"));
            }
        }
    }
    // With partial credit too: no fraction of the instructions is followed by nothing.
    let truth = json!([
        {"func_name": "validate_lowercase"},
        {"func_name": "validate_uppercase"},
        {"func_name": "validate_no_commas"},
        {"func_name": "validate_forbidden_words", "kwargs": {"forbidden_words": ["bad"]}},
        {"func_name": "verify_keyword_frequency", "kwargs": {"word": "cat", "N": 0}},
        {"func_name": "validate_frequency_capital_words", "kwargs": {"N": 1, "quantifier": "at most"}},
        {"func_name": "validate_word_constraint", "kwargs": {"N": 10, "quantifier": "at most"}},
    ])
    .to_string();
    let partial = IfEvalWorker::new(IfEvalConfig {
        partial_credit: true,
    });
    for response in NOTHING {
        let r = partial
            .score(&sample("ifeval", response, Some(&truth)))
            .await
            .unwrap();
        if r.value != 0.0 {
            failures.push(format!("partial credit {} for {response:?}", r.value));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn negative_instructions_need_content_of_their_own() {
    // (func_name, kwargs, content-free response, response with content that follows it)
    let cases = [
        (
            "validate_lowercase",
            json!({}),
            "123 ... !!!",
            "all lower 123",
        ),
        (
            "validate_uppercase",
            json!({}),
            "123 ... !!!",
            "ALL UPPER 123",
        ),
        (
            "validate_no_commas",
            json!({}),
            "... !!! ?",
            "no commas here",
        ),
        (
            "validate_forbidden_words",
            json!({"forbidden_words": ["bad"]}),
            "... !!!",
            "all good",
        ),
        ("validate_quotation", json!({}), "\"  \"", "\"quoted\""),
    ];
    for (func, kwargs, empty, full) in &cases {
        assert_eq!(value(func, kwargs, empty).await, 0.0, "{func} on {empty:?}");
        assert_eq!(value(func, kwargs, full).await, 1.0, "{func} on {full:?}");
    }
}

#[tokio::test]
async fn degenerate_ground_truths_are_refused_naming_the_field() {
    // (func_name, kwargs, what the error must name)
    let cases = [
        (
            "verify_keywords",
            json!({"keyword_list": []}),
            "`keyword_list` is an empty list",
        ),
        (
            "verify_keywords",
            json!({"keyword_list": ["tea", " "]}),
            "`keyword_list` has an empty entry at index 1",
        ),
        (
            "verify_keyword_frequency",
            json!({"word": "", "N": 1}),
            "`word` is empty",
        ),
        (
            "verify_keyword_frequency",
            json!({"word": "two words", "N": 1}),
            "`word` \"two words\" is not a single word",
        ),
        (
            "validate_forbidden_words",
            json!({"forbidden_words": []}),
            "`forbidden_words` is an empty list",
        ),
        (
            "validate_forbidden_words",
            json!({"forbidden_words": [""]}),
            "`forbidden_words` has an empty entry",
        ),
        (
            "verify_letter_frequency",
            json!({"letter": "1", "N": 1}),
            "`letter` '1' is not a letter",
        ),
        ("verify_paragraph_count", json!({"N": 0}), "`N` is 0"),
        (
            "validate_word_constraint",
            json!({"N": 0, "quantifier": "at most"}),
            "`N` is 0",
        ),
        (
            "validate_word_constraint",
            json!({"N": 0, "quantifier": "at least"}),
            "`N` is 0",
        ),
        (
            "verify_sentence_constraint",
            json!({"N": 0, "quantifier": "around"}),
            "`N` is 0",
        ),
        (
            "validate_paragraphs",
            json!({"N": 0, "first_word": "a", "i": 1}),
            "`N` is 0",
        ),
        (
            "validate_paragraphs",
            json!({"N": 2, "first_word": " ", "i": 1}),
            "`first_word` is empty",
        ),
        (
            "validate_paragraphs",
            json!({"N": 2, "first_word": "a", "i": 0}),
            "`i` = 0",
        ),
        (
            "verify_postscript",
            json!({"postscript_marker": ""}),
            "`postscript_marker` is empty",
        ),
        ("validate_placeholders", json!({"N": 0}), "`N` is 0"),
        ("verify_bullet_points", json!({"N": 0}), "`N` is 0"),
        (
            "validate_choice",
            json!({"options": []}),
            "`options` is an empty list",
        ),
        (
            "validate_choice",
            json!({"options": ["yes", ""]}),
            "`options` has an empty entry at index 1",
        ),
        ("validate_highlighted_sections", json!({"N": 0}), "`N` is 0"),
        (
            "validate_sections",
            json!({"N": 0, "section_splitter": "Section"}),
            "`N` is 0",
        ),
        (
            "validate_sections",
            json!({"N": 2, "section_splitter": ""}),
            "`section_splitter` is empty",
        ),
        (
            "validate_repeat_prompt",
            json!({"original_prompt": "  "}),
            "`original_prompt` is empty",
        ),
        (
            "validate_frequency_capital_words",
            json!({"N": 0, "quantifier": "at least"}),
            "`N` is 0 with `quantifier` \"at least\"",
        ),
        (
            "validate_end",
            json!({"end_phrase": ""}),
            "`end_phrase` is empty",
        ),
    ];
    for (func, kwargs, field) in &cases {
        let truth = json!({"func_name": func, "kwargs": kwargs}).to_string();
        let err = parse_instructions(&truth).unwrap_err().to_string();
        assert!(err.contains(func) && err.contains(field), "{truth}: {err}");
        // The worker refuses the sample (an error, not a reward) for any response.
        let scored = IfEvalWorker::default()
            .score(&sample("ifeval", "Some answer, with words.", Some(&truth)))
            .await;
        assert!(scored.is_err(), "{truth} was scored");
    }
    // Zero is meaningful where it is a prohibition.
    for ok in [
        json!({"func_name": "verify_keyword_frequency", "kwargs": {"word": "cat", "N": 0}}),
        json!({"func_name": "verify_letter_frequency", "kwargs": {"letter": "z", "N": 0}}),
        json!({"func_name": "validate_frequency_capital_words", "kwargs": {"N": 0, "quantifier": "at most"}}),
    ] {
        assert!(parse_instructions(&ok.to_string()).is_ok(), "{ok}");
    }
}

#[test]
fn flat_and_nested_ground_truths_agree_and_nulls_are_ignored() {
    let flat = r#"{"func_name": "validate_word_constraint", "N": 5, "quantifier": "at most", "word": null, "keyword_list": null}"#;
    let nested =
        r#"{"func_name": "validate_word_constraint", "kwargs": {"N": 5, "quantifier": "at most"}}"#;
    assert_eq!(
        parse_instructions(flat).unwrap(),
        parse_instructions(nested).unwrap()
    );
}

#[test]
fn errors_name_the_instruction_and_argument() {
    let e = parse_instructions(r#"{"func_name": "validate_rhymes"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown instruction `validate_rhymes`") && e.contains("validate_no_commas"),
        "{e}"
    );
    let e = parse_instructions(r#"{"func_name": "verify_bullet_points", "kwargs": {"n": 3}}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`verify_bullet_points`") && e.contains("unknown field `n`"),
        "{e}"
    );
    let e = parse_instructions(r#"{"func_name": "verify_bullet_points"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`verify_bullet_points`") && e.contains("missing field `N`"),
        "{e}"
    );
    let e = parse_instructions(
        r#"{"func_name": "validate_word_constraint", "N": 3, "quantifier": "roughly"}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("roughly"), "{e}");
    let e =
        parse_instructions(r#"{"func_name": "verify_letter_frequency", "letter": "ab", "N": 1}"#)
            .unwrap_err()
            .to_string();
    assert!(e.contains("`letter`"), "{e}");
    let e = parse_instructions(
        r#"{"func_name": "validate_paragraphs", "N": 2, "first_word": "a", "i": 3}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`i` = 3"), "{e}");
    let e = parse_instructions(r#"{"func_name": "validate_title", "kwargs": {}, "N": 2}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`N` is outside `kwargs`"), "{e}");
    for bad in ["not json", "[]", "3", r#"{"kwargs": {}}"#] {
        assert!(parse_instructions(bad).is_err(), "{bad}");
    }
}

#[tokio::test]
async fn several_instructions_all_or_partial_credit() {
    let truth = json!([
        {"func_name": "validate_lowercase"},
        {"func_name": "validate_no_commas"},
        {"func_name": "verify_keywords", "kwargs": {"keyword_list": ["tea"]}},
    ])
    .to_string();
    let s = sample("ifeval", "i like coffee, not tea", Some(&truth));
    let all = IfEvalWorker::default().score(&s).await.unwrap();
    assert_eq!(all.value, 0.0);
    assert_eq!(all.details["passed"], "2/3");
    assert_eq!(all.details["failed"], "validate_no_commas");
    let partial = IfEvalWorker::new(IfEvalConfig {
        partial_credit: true,
    })
    .score(&s)
    .await
    .unwrap();
    assert!((partial.value - 2.0 / 3.0).abs() < 1e-6);
    let err = IfEvalWorker::default()
        .score(&sample("ifeval", "x", None))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no ground truth"));
}
