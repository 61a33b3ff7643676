//! The LLM judge with a scripted policy: prompt rendering, score parsing, failures and the
//! concurrency limit.

mod common;

use common::{ScriptedPolicy, sample};
use roll_core::config::ComponentSpec;
use roll_core::testing::ByteTokenizer;
use roll_core::{Generate, RewardWorker};
use roll_reward::judge::{LlmJudge, LlmJudgeConfig, ScoreForm, parse_judge_score};
use roll_reward::router::RewardRegistry;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn judge(policy: Arc<ScriptedPolicy>, config: LlmJudgeConfig) -> LlmJudge {
    LlmJudge::new(policy, Arc::new(ByteTokenizer), config)
        .unwrap_or_else(|e| panic!("a valid judge config: {e}"))
}

/// (judge output, max score, expected score and form).
type ParserCase = (&'static str, f32, Option<(f32, ScoreForm)>);

#[tokio::test]
async fn renders_the_prompt_and_reads_the_score() {
    let policy = Arc::new(ScriptedPolicy::fixed("The steps are sound.\nScore: 7/10"));
    let j = judge(
        policy.clone(),
        LlmJudgeConfig {
            system: Some("You are strict.".into()),
            ..Default::default()
        },
    );
    let s = sample("chat", "<think>secret</think>It is 4.", Some("4"));
    let r = j.score(&s).await.unwrap();
    assert_eq!((r.value, r.score), (0.7, Some(0.7)));
    assert_eq!(r.details["judge_form"], "fraction");
    assert!(r.details["judge_output"].contains("Score: 7/10"));
    let prompts = policy.prompts.lock().unwrap();
    let p = &prompts[0];
    assert!(p.contains("<|im_start|>system\nYou are strict."), "{p}");
    assert!(
        p.contains(&s.prompt.text) && p.contains("Reference answer:\n4"),
        "{p}"
    );
    assert!(
        p.contains("Response:\nIt is 4.") && !p.contains("secret"),
        "{p}"
    );
    assert!(p.ends_with("<|im_start|>assistant\n"), "{p}");
}

#[tokio::test]
async fn an_empty_answer_scores_zero_without_asking_the_judge() {
    // A judge that would give full marks to anything.
    let policy = Arc::new(ScriptedPolicy::fixed("Score: 10/10"));
    for include_thinking in [false, true] {
        let j = judge(
            policy.clone(),
            LlmJudgeConfig {
                include_thinking,
                ..Default::default()
            },
        );
        for response in [
            "",
            "  \n ",
            "<|im_end|>",
            "<think>It is 4.</think>",
            "<think>It is 4.</think> <|endoftext|>",
            "<think>It is 4, still thinking",
        ] {
            let r = j.score(&sample("chat", response, Some("4"))).await.unwrap();
            assert_eq!(
                (r.value, r.details["judge_form"].as_str()),
                (0.0, "empty"),
                "{response:?}"
            );
        }
    }
    assert_eq!(
        policy.calls.load(Ordering::SeqCst),
        0,
        "the judge was asked"
    );
    let j = judge(policy.clone(), LlmJudgeConfig::default());
    let r = j.score(&sample("chat", "4", Some("4"))).await.unwrap();
    assert_eq!(r.value, 1.0);
    assert_eq!(policy.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unparsable_outputs_are_errors_unless_a_fallback_is_set() {
    let policy = Arc::new(ScriptedPolicy::fixed("I cannot decide."));
    let strict = judge(policy.clone(), LlmJudgeConfig::default());
    let err = strict
        .score(&sample("chat", "x", Some("y")))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no score or verdict"), "{err}");
    let lenient = judge(
        policy,
        LlmJudgeConfig {
            unparsable_score: Some(0.0),
            ..Default::default()
        },
    );
    let r = lenient
        .score(&sample("chat", "x", Some("y")))
        .await
        .unwrap();
    assert_eq!(
        (r.value, r.details["judge_form"].as_str()),
        (0.0, "unparsable")
    );
}

#[tokio::test]
async fn policy_failures_and_missing_references_fail_the_sample() {
    let failing = Arc::new(ScriptedPolicy::new(|_| Err("engine crashed".into())));
    let err = judge(failing, LlmJudgeConfig::default())
        .score(&sample("chat", "x", Some("y")))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("engine crashed"), "{err}");
    let ok = Arc::new(ScriptedPolicy::fixed("yes"));
    let err = judge(ok.clone(), LlmJudgeConfig::default())
        .score(&sample("chat", "x", None))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no ground truth"), "{err}");
    // A reference-free template needs no ground truth.
    let free = judge(
        ok,
        LlmJudgeConfig {
            template: "Is this helpful? {response}\nAnswer yes or no.".into(),
            ..Default::default()
        },
    );
    assert_eq!(
        free.score(&sample("chat", "x", None)).await.unwrap().value,
        1.0
    );
}

#[test]
fn bad_configs_are_rejected() {
    let p = Arc::new(ScriptedPolicy::fixed("yes"));
    let tok = Arc::new(ByteTokenizer);
    let bad = |c: LlmJudgeConfig| {
        LlmJudge::new(p.clone(), tok.clone(), c)
            .unwrap_err()
            .to_string()
    };
    assert!(
        bad(LlmJudgeConfig {
            max_concurrency: 0,
            ..Default::default()
        })
        .contains("max_concurrency")
    );
    assert!(
        bad(LlmJudgeConfig {
            max_score: 0.0,
            ..Default::default()
        })
        .contains("max_score")
    );
    assert!(
        bad(LlmJudgeConfig {
            template: "{question}".into(),
            ..Default::default()
        })
        .contains("{response}")
    );
}

#[tokio::test]
async fn judge_calls_are_batched_and_concurrency_limited() {
    let policy = Arc::new(
        ScriptedPolicy::new(|p| Ok(if p.contains("good") { "Yes" } else { "No" }.to_owned()))
            .with_delay(Duration::from_millis(20)),
    );
    let j = judge(
        policy.clone(),
        LlmJudgeConfig {
            max_concurrency: 3,
            template: "{response}".into(),
            ..Default::default()
        },
    );
    let samples: Vec<_> = (0..20)
        .map(|i| sample("chat", if i % 2 == 0 { "good" } else { "bad" }, None))
        .collect();
    let start = Instant::now();
    let rewards = j.score_batch(&samples).await;
    let elapsed = start.elapsed();
    let values: Vec<f32> = rewards.into_iter().map(|r| r.unwrap().value).collect();
    let want: Vec<f32> = (0..20)
        .map(|i| if i % 2 == 0 { 1.0 } else { 0.0 })
        .collect();
    assert_eq!(values, want);
    assert_eq!(policy.calls.load(Ordering::SeqCst), 20);
    assert_eq!(policy.max_in_flight.load(Ordering::SeqCst), 3);
    // 20 calls, 3 at a time, 20 ms each: at least 7 rounds.
    assert!(elapsed >= Duration::from_millis(140), "{elapsed:?}");
}

#[tokio::test]
async fn the_limit_holds_across_separate_callers() {
    let policy = Arc::new(ScriptedPolicy::fixed("8").with_delay(Duration::from_millis(10)));
    let j = Arc::new(judge(
        policy.clone(),
        LlmJudgeConfig {
            max_concurrency: 2,
            template: "{response}".into(),
            ..Default::default()
        },
    ));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let j = j.clone();
            tokio::spawn(async move { j.score(&sample("chat", "x", None)).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().value, 0.8);
    }
    assert_eq!(policy.max_in_flight.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_registry_builds_a_judge_when_given_one() {
    let policy: Arc<dyn Generate> = Arc::new(ScriptedPolicy::fixed("Rating: 9"));
    let registry = RewardRegistry::with_builtins().with_judge(policy, Arc::new(ByteTokenizer));
    let built = registry
        .build(
            &ComponentSpec::new("llm_judge")
                .with_option("max_concurrency", 2)
                .with_option("timeout_s", 30),
        )
        .unwrap();
    let r = built
        .worker
        .score(&sample("chat", "x", Some("y")))
        .await
        .unwrap();
    assert_eq!(r.value, 0.9);
    assert_eq!(built.options.timeout, Some(Duration::from_secs(30)));
    let err = registry
        .build(&ComponentSpec::new("llm_judge").with_option("temprature", 0.5))
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown field `temprature`"),
        "{err}"
    );
}

/// `9…9/9…9` with 400 nines on each side.
const LONG_FRACTION: &str = concat!(
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "/",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
);

/// `Score: 1…1 out of 1…1`, each 320 digits.
const LONG_OUT_OF: &str = concat!(
    "Score: ",
    "11111111111111111111111111111111111111111111111111111111111111111111111111111111",
    "11111111111111111111111111111111111111111111111111111111111111111111111111111111",
    "11111111111111111111111111111111111111111111111111111111111111111111111111111111",
    "11111111111111111111111111111111111111111111111111111111111111111111111111111111",
    " out of ",
    "11111111111111111111111111111111111111111111111111111111111111111111111111111111",
    "11111111111111111111111111111111111111111111111111111111111111111111111111111111",
    "11111111111111111111111111111111111111111111111111111111111111111111111111111111",
    "11111111111111111111111111111111111111111111111111111111111111111111111111111111",
);

#[test]
fn score_parser_table() {
    let cases: &[ParserCase] = &[
        ("Score: 7/10", 10.0, Some((0.7, ScoreForm::Fraction))),
        ("score:7/10", 10.0, Some((0.7, ScoreForm::Fraction))),
        (
            "Final Score: 10/10.",
            10.0,
            Some((1.0, ScoreForm::Fraction)),
        ),
        (
            "I rate it 4 out of 5",
            10.0,
            Some((0.8, ScoreForm::Fraction)),
        ),
        ("Score: 3", 5.0, Some((0.6, ScoreForm::Labelled))),
        ("**Rating:** 6", 10.0, Some((0.6, ScoreForm::Labelled))),
        ("The score is 0.", 10.0, Some((0.0, ScoreForm::Labelled))),
        ("Rating: [[9]]", 10.0, Some((0.9, ScoreForm::Labelled))),
        ("10", 10.0, Some((1.0, ScoreForm::Bare))),
        ("[[3]]", 10.0, Some((0.3, ScoreForm::Bare))),
        ("yes", 10.0, Some((1.0, ScoreForm::Verdict))),
        ("YES, they match.", 10.0, Some((1.0, ScoreForm::Verdict))),
        ("No.", 10.0, Some((0.0, ScoreForm::Verdict))),
        ("[[No]]", 10.0, Some((0.0, ScoreForm::Verdict))),
        (
            "After checking, the answer is correct",
            10.0,
            Some((1.0, ScoreForm::Verdict)),
        ),
        (
            "After checking, the answer is not correct",
            10.0,
            Some((0.0, ScoreForm::Verdict)),
        ),
        ("Verdict: incorrect", 10.0, Some((0.0, ScoreForm::Verdict))),
        (
            "<think>Score: 2/10? no...</think>Score: 9/10",
            10.0,
            Some((0.9, ScoreForm::Fraction)),
        ),
        ("Score: 11", 10.0, None),
        ("It depends.", 10.0, None),
        ("", 10.0, None),
        // Digit runs too long for f64 are infinite: ∞/∞ would be a NaN score.
        (LONG_FRACTION, 10.0, None),
        (LONG_OUT_OF, 10.0, None),
    ];
    for (text, max, want) in cases {
        let got = parse_judge_score(text, *max).map(|s| (s.value, s.form));
        match (got, want) {
            (Some((g, gf)), Some((w, wf))) => {
                assert!(
                    (g - w).abs() < 1e-6 && gf == *wf,
                    "{text:?}: got {g} {gf:?}, want {w} {wf:?}"
                )
            }
            (None, None) => {}
            _ => panic!("{text:?}: got {got:?}, want {want:?}"),
        }
    }
}
