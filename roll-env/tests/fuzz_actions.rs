//! Seeded fuzz loops over every built-in environment's action parser (CI-sized): hostile actions
//! never panic, an environment fails only with a named error, and an action the environment
//! marks invalid never collects a positive reward — the reward a format-hacking policy would
//! look for.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use roll_core::config::ComponentSpec;
use roll_core::rng::SplitMix64;
use roll_env::{BUILTIN_KINDS, EnvRegistry};

/// Inputs that once looked interesting to a parser: empty, whitespace, tags half-open, huge,
/// nested, non-ASCII, control characters, numbers at the edges.
const REGRESSIONS: &[&str] = &[
    "",
    " ",
    "\n\n\t",
    "<answer>",
    "<answer></answer>",
    "</answer><answer>",
    "<answer><answer>Up</answer></answer>",
    "Up || Down",
    "up up up up up up up up",
    "LEFT\u{0}",
    "➡️",
    "Ｕｐ",
    "search[]",
    "search[[[[[[[[[[[[",
    "click[]",
    "calculator(1/0)",
    "calculator(9^9^9^9)",
    "calculator(((((((((((((((((((((((((((((1))))))))))))))))))))))))))))",
    "18446744073709551616",
    "-0",
    "NaN",
    "<think>Up</think>",
];

fn random_action(rng: &mut SplitMix64) -> String {
    const PIECES: &[&str] = &[
        "Up",
        "Down",
        "Left",
        "Right",
        "up",
        "<answer>",
        "</answer>",
        "search[",
        "]",
        "click[",
        "buy",
        "calculator(",
        ")",
        "1",
        "+",
        "^",
        "/",
        "0",
        " ",
        "\n",
        "||",
        "é",
        "🙂",
        "[",
        "{",
        "\"",
        "'",
        "\\",
        "think",
        "<",
        ">",
    ];
    let n = (rng.next_u64() % 12) as usize;
    (0..n)
        .map(|_| PIECES[(rng.next_u64() % PIECES.len() as u64) as usize])
        .collect()
}

#[test]
fn hostile_actions_never_panic_and_invalid_actions_earn_nothing() {
    let registry = EnvRegistry::with_builtins();
    let mut rng = SplitMix64::new(2026);
    for kind in BUILTIN_KINDS {
        let mut env = registry.build(&ComponentSpec::new(kind)).expect(kind);
        let (mut steps, mut invalid) = (0, 0);
        for episode in 0..30u64 {
            env.reset(episode).expect("reset");
            let long = "Up ".repeat(5000);
            let actions = REGRESSIONS
                .iter()
                .map(|s| s.to_string())
                .chain([long])
                .chain((0..40).map(|_| random_action(&mut rng)));
            for action in actions {
                match env.step(&action) {
                    Ok(result) => {
                        steps += 1;
                        assert!(result.reward.is_finite(), "{kind}: {action:?}");
                        if result.action_is_valid() == Some(false) {
                            invalid += 1;
                            assert!(
                                result.reward <= 0.0,
                                "{kind}: invalid action {action:?} earned {}",
                                result.reward
                            );
                        }
                        if result.is_done() {
                            env.reset(episode + 1000).expect("reset");
                        }
                    }
                    // A named error (e.g. stepping a finished episode) is fine; a panic is not.
                    Err(e) => assert!(!e.to_string().is_empty(), "{kind}"),
                }
            }
        }
        assert!(steps > 100, "{kind}: only {steps} steps ran");
        assert!(
            invalid > 10,
            "{kind}: only {invalid} actions were marked invalid"
        );
    }
}
