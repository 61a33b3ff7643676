//! The math rule verifier on a table of (response, ground truth, expected) cases covering every
//! answer form it understands, and the tricky negatives.

use roll_core::config::ComponentSpec;
use roll_reward::math::{MAX_POINTS, MathRuleConfig, MathRuleWorker, Tolerance, equivalent};
use roll_reward::router::RewardRegistry;

/// (response, ground truth, expected correct, expected rule or "none").
const CASES: &[(&str, &str, bool, &str)] = &[
    // Integers and extraction sources.
    (r"\boxed{42}", "42", true, "exact"),
    (r"The total is $\boxed{42}$.", "42", true, "exact"),
    (r"\boxed{ 42 }", "42", true, "exact"),
    (r"\boxed{042}", "42", true, "numeric"),
    (r"\boxed{+42}", "42", true, "numeric"),
    (r"\boxed{43}", "42", false, "none"),
    ("Natalia sold 72 clips.\n#### 72", "72", true, "exact"),
    ("#### 71", "72", false, "none"),
    ("So the answer is 18.", "18", true, "exact"),
    ("The final answer is: **18**", "18", true, "exact"),
    ("I think it's 18", "18", false, "none"),
    (r"\boxed{5}", r"\boxed{5}", true, "exact"),
    ("#### 5", "steps...\n#### 5", true, "exact"),
    // Two boxes: the last wins.
    (r"First \boxed{3}, corrected: \boxed{4}", "4", true, "exact"),
    (r"First \boxed{4}, corrected: \boxed{3}", "4", false, "none"),
    // Empty box, unterminated box.
    (r"\boxed{}", "0", false, "none"),
    (r"\boxed{7} then \boxed{8", "7", true, "exact"),
    // Think blocks.
    (
        r"<think>maybe \boxed{3}</think> The answer is \boxed{5}.",
        "5",
        true,
        "exact",
    ),
    (
        r"<think>it is \boxed{5}</think> I am not sure.",
        "5",
        false,
        "none",
    ),
    (
        r"<think>it is \boxed{5} and I keep thinking",
        "5",
        false,
        "none",
    ),
    (
        r"<think>x</think>\boxed{5}<|im_end|><|endoftext|>",
        "5",
        true,
        "exact",
    ),
    // Negatives.
    (r"\boxed{-7}", "-7", true, "exact"),
    (r"\boxed{-7}", "7", false, "none"),
    (r"\boxed{−7}", "-7", true, "exact"),
    (r"\boxed{-(7)}", "-7", true, "numeric"),
    (r"\boxed{- 7}", "-7", true, "exact"),
    // Decimals.
    (r"\boxed{3.50}", "3.5", true, "numeric"),
    (r"\boxed{.5}", "0.5", true, "numeric"),
    (r"\boxed{3.51}", "3.5", false, "none"),
    (r"\boxed{0.333}", r"\frac{1}{3}", false, "none"),
    (r"\boxed{0.5}", "1/3", false, "none"),
    // Fractions.
    (r"\boxed{\frac{3}{4}}", "0.75", true, "numeric"),
    (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", true, "exact"),
    (r"\boxed{\tfrac34}", "3/4", true, "numeric"),
    (r"\boxed{6/8}", "3/4", true, "numeric"),
    (r"\boxed{\frac{-3}{4}}", "-0.75", true, "numeric"),
    (r"\boxed{-\frac{3}{4}}", r"\frac{-3}{4}", true, "numeric"),
    (r"\boxed{\frac{4}{3}}", r"\frac{3}{4}", false, "none"),
    (r"\boxed{2\frac{1}{2}}", "2.5", true, "numeric"),
    (r"\boxed{\frac{1}{2}}", "1/2", true, "numeric"),
    // Percentages.
    (r"\boxed{50\%}", "50", true, "numeric"),
    (r"\boxed{50\%}", "0.5", true, "numeric"),
    (r"\boxed{50}", r"50\%", true, "numeric"),
    (r"\boxed{5\%}", "0.5", false, "none"),
    (r"\boxed{12.5%}", "0.125", true, "numeric"),
    // Scientific notation.
    (r"\boxed{1.5 \times 10^{3}}", "1500", true, "numeric"),
    (r"\boxed{1.5e3}", "1500", true, "numeric"),
    (r"\boxed{6.02 \cdot 10^{23}}", "6.02e23", true, "numeric"),
    (r"\boxed{3 \times 10^{-2}}", "0.03", true, "numeric"),
    (r"\boxed{1.5 \times 10^{4}}", "1500", false, "none"),
    // Thousands separators.
    (r"\boxed{1,000,000}", "1000000", true, "exact"),
    (r"\boxed{1{,}234}", "1234", true, "exact"),
    (r"\boxed{12,345.6}", "12345.6", true, "exact"),
    (r"\boxed{1,000}", "100", false, "none"),
    // Huge integers compare exactly.
    (
        r"\boxed{100000000000000001}",
        "100000000000000000",
        false,
        "none",
    ),
    (
        r"\boxed{123456789012345678901234567890}",
        "123456789012345678901234567890",
        true,
        "exact",
    ),
    // LaTeX wrappers.
    (r"\boxed{\text{5}}", "5", true, "exact"),
    (r"$\boxed{\left( 1, 2 \right)}$", "(1,2)", true, "exact"),
    (r"\boxed{\displaystyle \frac{1}{2}}", "0.5", true, "numeric"),
    (r"\boxed{\mathbf{12}}", "12", true, "exact"),
    (r"\boxed{x = 3}", "3", true, "exact"),
    (r"\boxed{90^\circ}", "90", true, "exact"),
    (r"\boxed{90^{\circ}}", r"90^\circ", true, "exact"),
    // Units stripped.
    (r"\boxed{10 \text{ cm}}", "10", true, "exact"),
    (r"\boxed{10\text{cm}^2}", "10", true, "exact"),
    (r"\boxed{\$18}", "18", true, "exact"),
    (r"\boxed{18 \text{ dollars}}", r"\$18", true, "exact"),
    ("The answer is 5 apples.", "5", true, "exact"),
    (r"\boxed{12 \text{ inches}}", "13", false, "none"),
    // Radicals and constants.
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", true, "numeric"),
    (
        r"\boxed{\sqrt{2}/2}",
        r"\frac{\sqrt{2}}{2}",
        true,
        "numeric",
    ),
    (
        r"\boxed{\frac{1}{\sqrt{2}}}",
        r"\frac{\sqrt2}{2}",
        true,
        "numeric",
    ),
    (r"\boxed{2\pi}", r"2 \pi", true, "exact"),
    (r"\boxed{\pi}", "3.14", false, "none"),
    (r"\boxed{\sqrt{3}}", r"\sqrt{2}", false, "none"),
    (r"\boxed{e^2}", r"e^{2}", true, "numeric"),
    // Symbolic expressions.
    (r"\boxed{(x+1)^2}", "x^2 + 2x + 1", true, "symbolic"),
    (r"\boxed{x^2 + 2x + 2}", "(x+1)^2", false, "none"),
    (r"\boxed{\frac{x^2-1}{x-1}}", "x+1", true, "symbolic"),
    (r"\boxed{2(a+b)}", "2a+2b", true, "symbolic"),
    (r"\boxed{2a+2c}", "2a+2b", false, "none"),
    (r"\boxed{\sin^2 x + \cos^2 x}", "1", false, "none"),
    (r"\boxed{\frac{1}{2}x}", "x/2", true, "symbolic"),
    (r"\boxed{x}", r"\left| x \right|", false, "none"),
    (r"\boxed{\ln(x^2)}", r"2\ln|x|", true, "symbolic"),
    (r"\boxed{y = 2x + 1}", "2x+1", true, "exact"),
    (r"\boxed{x^2 + y^2 = 1}", "y^2 + x^2 = 1", true, "equation"),
    (r"\boxed{2y = 4x}", "y = 2x", false, "none"),
    (r"\boxed{\sqrt{x^2}}", "x", false, "none"),
    (r"\boxed{3i+4}", "4+3i", true, "symbolic"),
    // Tuples.
    (r"\boxed{(1, 2)}", "(1,2)", true, "exact"),
    (r"\boxed{(0.5, -2)}", r"(\frac{1}{2}, -2)", true, "tuple"),
    (r"\boxed{(2, 1)}", "(1,2)", false, "none"),
    (r"\boxed{(1, 2, 3)}", "(1,2)", false, "none"),
    // Intervals.
    (r"\boxed{[1, 2)}", "[1,2)", true, "exact"),
    (r"\boxed{[1, 2]}", "[1,2)", false, "none"),
    (
        r"\boxed{(-\infty, 0.5]}",
        r"(-\infty, \frac{1}{2}]",
        true,
        "interval",
    ),
    (
        r"\boxed{(-\infty, 1) \cup (2, \infty)}",
        r"(2,\infty)\cup(-\infty,1)",
        true,
        "interval",
    ),
    (r"\boxed{x \in [0, 1]}", "[0,1]", true, "exact"),
    // Sets and answer lists.
    (r"\boxed{\{3, 1, 2\}}", r"\{1,2,3\}", true, "set"),
    (r"\boxed{\{1, 2\}}", r"\{1,2,3\}", false, "none"),
    (r"\boxed{3, -1}", "-1, 3", true, "set"),
    (r"\boxed{x = 3, -1}", "-1, 3", true, "set"),
    (r"\boxed{x = 3, 1}", "-1, 3", false, "none"),
    (r"\boxed{\{0.5, 1\}}", r"\{1, \frac12\}", true, "set"),
    // Words and choices written as text.
    (r"\boxed{\text{Monday}}", "monday", true, "text"),
    (r"\boxed{\text{Tuesday}}", "Monday", false, "none"),
    (r"\boxed{\text{yes}}", "Yes", true, "text"),
    // Garbage and mismatched shapes.
    (r"\boxed{(1,2)}", "3", false, "none"),
    (r"\boxed{\frac{1}{0}}", "1", false, "none"),
    (r"\boxed{((((1))))}", "1", true, "numeric"),
    (r"\boxed{5}", "", false, "none"),
    ("", "5", false, "none"),
];

#[test]
fn math_verifier_table() {
    assert!(CASES.len() >= 80, "the table needs at least 80 cases");
    let w = MathRuleWorker::default();
    let mut failures = Vec::new();
    for (i, (response, truth, correct, rule)) in CASES.iter().enumerate() {
        let v = w.verify(response, truth);
        let got_rule = v.rule.map_or("none", |r| r.name());
        if v.correct != *correct || got_rule != *rule {
            failures.push(format!(
                "#{i}: {response:?} vs {truth:?}: got ({}, {got_rule}) want ({correct}, {rule}); extracted {:?}",
                v.correct, v.answer
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn format_flag_is_reported() {
    let w = MathRuleWorker::default();
    assert!(w.verify(r"<think>a</think>\boxed{1}", "1").format_ok);
    assert!(!w.verify("#### 1", "1").format_ok);
    assert!(!w.verify(r"\boxed{}", "1").format_ok);
    assert!(
        !w.verify(r"<think>a</think><think>b</think>\boxed{1}", "1")
            .format_ok
    );
}

#[test]
fn degenerate_responses_stay_cheap() {
    let w = MathRuleWorker::default();
    let start = std::time::Instant::now();
    let repeated_boxes = r"\boxed{".repeat(20_000) + "1";
    assert!(!w.verify(&repeated_boxes, "1").correct);
    let nested_text = r"\text{".repeat(5_000) + "1" + &"}".repeat(5_000);
    let _ = w.verify(&format!(r"\boxed{{{nested_text}}}"), "1");
    let nested_parens = "(".repeat(5_000) + "1" + &")".repeat(5_000);
    assert!(
        !w.verify(&format!(r"\boxed{{{nested_parens}}}"), "2")
            .correct
    );
    let long_list = (0..500)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    assert!(
        w.verify(&format!(r"\boxed{{{long_list}}}"), &long_list)
            .correct
    );
    let long_set = format!(r"\{{{long_list}\}}");
    let _ = w.verify(&format!(r"\boxed{{{long_set}}}"), &long_set);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// Wrong answers that `f64` arithmetic let through, by class: (class, predicted, gold, equal).
/// Each `false` row was scored correct before exact arithmetic; the `true` rows keep what must
/// still match.
const HOSTILE: &[(&str, &str, &str, bool)] = &[
    // Both sides overflow f64 to ∞.
    ("overflow", "10^{400}", "10^{500}", false),
    ("overflow", "2^{2000}", "3^{2000}", false),
    ("overflow", "1e400", "1e500", false),
    ("overflow", "(10^{200})^{2}", "10^{401}", false),
    ("overflow", "10^{400}", r"\infty", false),
    ("overflow", "e^{1000}", r"\infty", false),
    ("overflow", "e^{1000}", "e^{1001}", false),
    ("overflow", "-10^{400}", r"-\infty", false),
    ("overflow", "10^{400}", "100^{200}", true),
    ("overflow", "1e400", "10^{400}", true),
    // Both sides underflow to 0.
    ("underflow", "10^{-400}", "0", false),
    ("underflow", "10^{-400}", "10^{-500}", false),
    ("underflow", "e^{-1000}", "0", false),
    ("underflow", r"\frac{1}{10^{400}}", "0", false),
    ("underflow", "1e-400", "0.0", false),
    ("underflow", r"\pi^{-1000}", "0", false),
    ("underflow", "10^{-400}", "0.1^{400}", true),
    // A small added term under the old absolute tolerance (1e-9).
    ("small term", "x + 10^{-10}", "x", false),
    ("small term", "x^2 + 0.000000001", "x^2", false),
    ("small term", r"x + \frac{x}{10^{12}}", "x", false),
    (
        "small term",
        r"\frac{\sin x}{10^{6}} + 10^{-10}",
        r"\frac{\sin x}{10^{6}}",
        false,
    ),
    ("small term", "x + y = 1 + 10^{-12}", "x + y = 1", false),
    ("small term", "(x+1)^2", "x^2+2x+1", true),
    ("small term", r"\sin(x + \pi)", r"-\sin(x)", true),
    ("small term", r"\frac{x^2-1}{x-1}", "x+1", true),
    // Infinities keep their sign, in every notation.
    ("signed infinity", r"-\infty", r"\infty", false),
    ("signed infinity", "-inf", "inf", false),
    ("signed infinity", "-infinity", "infinity", false),
    ("signed infinity", r"[1, \infty)", r"[1, -\infty)", false),
    ("signed infinity", "-ab", "ab", false),
    ("signed infinity", "-∞", r"-\infty", true),
    (
        "signed infinity",
        r"(-\infty, 0.5]",
        r"(-\infty, \frac{1}{2}]",
        true,
    ),
    // Undefined values equal nothing, not even themselves.
    ("nan", r"\frac{0}{0}", r"\frac{0}{0}", false),
    ("nan", "0/0", r"\frac{0}{0}", false),
    ("nan", r"\frac{1}{0}", r"\frac{2}{0}", false),
    ("nan", r"\infty - \infty", r"\infty - \infty", false),
    ("nan", r"\ln(-1)", r"\ln(-2)", false),
    ("nan", r"\sqrt{-1}", r"\sqrt{-1}", false),
    ("nan", "0/0", "0", false),
    // Exact numbers: different ones never equal; a decimal equals what it is a rounding of.
    ("exact", "1.0000001", "1.0000002", false),
    ("exact", "12345678.9", "12345679", false),
    ("exact", "9007199254740993", "9007199254740992", false),
    ("exact", "0.333", r"\frac13", false),
    ("exact", "0.333333333", r"\frac13", true),
    ("exact", "0.1+0.2", "0.3", true),
    ("exact", "6.02e23", r"6.02 \times 10^{23}", true),
];

#[test]
fn hostile_answers_by_class() {
    let tol = Tolerance::default();
    let mut failures = Vec::new();
    for (class, p, g, want) in HOSTILE {
        for (a, b) in [(p, g), (g, p)] {
            let got = equivalent(a, b, &tol);
            if got.is_some() != *want {
                failures.push(format!("{class}: {a:?} vs {b:?}: got {got:?}, want {want}"));
            }
        }
        // Through the worker, as a boxed answer.
        let v = MathRuleWorker::default().verify(&format!(r"\boxed{{{p}}}"), g);
        if v.correct != *want {
            failures.push(format!("{class}: worker on {p:?} vs {g:?}: {:?}", v.rule));
        }
    }
    for class in [
        "overflow",
        "underflow",
        "small term",
        "signed infinity",
        "nan",
        "exact",
    ] {
        assert!(HOSTILE.iter().any(|c| c.0 == class), "no case of {class}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bad_options_are_refused_naming_the_option() {
    let base = MathRuleConfig::default();
    let cases: Vec<(MathRuleConfig, &str)> = vec![
        (
            MathRuleConfig {
                relative_tolerance: f64::NAN,
                ..base.clone()
            },
            "math_rule.relative_tolerance",
        ),
        (
            MathRuleConfig {
                relative_tolerance: f64::INFINITY,
                ..base.clone()
            },
            "math_rule.relative_tolerance",
        ),
        (
            MathRuleConfig {
                relative_tolerance: -1e-6,
                ..base.clone()
            },
            "math_rule.relative_tolerance",
        ),
        (
            MathRuleConfig {
                relative_tolerance: 1.0,
                ..base.clone()
            },
            "math_rule.relative_tolerance",
        ),
        (
            MathRuleConfig {
                symbolic_points: 0,
                ..base.clone()
            },
            "math_rule.symbolic_points",
        ),
        (
            MathRuleConfig {
                symbolic_points: 2,
                ..base.clone()
            },
            "math_rule.symbolic_points",
        ),
        (
            MathRuleConfig {
                symbolic_points: MAX_POINTS + 1,
                ..base.clone()
            },
            "math_rule.symbolic_points",
        ),
    ];
    for (config, key) in cases {
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(key), "{config:?}: {err}");
        let err = MathRuleWorker::new(config).unwrap_err().to_string();
        assert!(err.contains(key), "{err}");
    }
    // Through the registry, from a run config's options.
    let spec = ComponentSpec::new("math_rule").with_option("symbolic_points", 0);
    let err = RewardRegistry::with_builtins().build(&spec).unwrap_err();
    assert!(
        err.to_string().contains("math_rule.symbolic_points"),
        "{err}"
    );
    assert!(base.validate().is_ok());
    // A tolerance that is NaN in a hand-built `Tolerance` makes irrational values unequal
    // rather than equal.
    let nan = Tolerance {
        relative: f64::NAN,
        points: 8,
    };
    assert_eq!(equivalent(r"\sqrt{2}", "1.41421356", &nan), None);
    assert!(equivalent("0.75", r"\frac34", &nan).is_some()); // exact needs no tolerance
}

mod properties {
    use proptest::prelude::*;
    use roll_reward::math::{Expr, MathRuleWorker};

    proptest! {
        /// Whatever the model writes, the verifier answers (no panic, no hang).
        #[test]
        fn never_panics_on_arbitrary_text(response in ".{0,200}", truth in ".{0,40}") {
            let _ = MathRuleWorker::default().verify(&response, &truth);
        }

        /// Nor on arbitrary LaTeX-ish soup.
        #[test]
        fn never_panics_on_latex_soup(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(r"\frac"), Just(r"\sqrt"), Just("{"), Just("}"), Just("("), Just(")"),
                    Just("["), Just("]"), Just("^"), Just("_"), Just("-"), Just("x"), Just("2"),
                    Just(","), Just("="), Just("|"), Just(r"\left("), Just(r"\boxed{"), Just("!"),
                    Just("%"), Just(r"\infty"), Just(r"\{"), Just(r"\}"), Just(r"\cup"), Just("e"),
                    Just(r"\text{"), Just(" "), Just("."), Just("</think>"), Just("<think>"),
                ],
                0..40,
            ),
            truth in prop_oneof![Just("1"), Just("x"), Just("(1,2)"), Just(r"\{1\}"), Just("x=1")],
        ) {
            let text: String = parts.concat();
            let _ = MathRuleWorker::default().verify(&text, truth);
            let _ = Expr::parse(&text).map(|e| e.eval(&[]));
        }

        /// Integers match themselves in every wrapper and never their neighbours.
        #[test]
        fn integers(n in -1_000_000i64..1_000_000) {
            let w = MathRuleWorker::default();
            let boxed = format!(r"$\boxed{{{n}}}$");
            let hashed = format!("#### {n}");
            let gold_boxed = format!(r"\boxed{{{n}}}");
            let neighbour = format!(r"\boxed{{{}}}", n + 1);
            let plain = n.to_string();
            prop_assert!(w.verify(&boxed, &plain).correct);
            prop_assert!(w.verify(&hashed, &gold_boxed).correct);
            prop_assert!(!w.verify(&neighbour, &plain).correct);
        }

        /// A fraction equals its decimal value (to 9 places) and not a nearby one.
        #[test]
        fn fractions_and_decimals(a in -500i32..500, b in 1i32..500) {
            let w = MathRuleWorker::default();
            let value = f64::from(a) / f64::from(b);
            let frac = format!(r"\boxed{{\frac{{{a}}}{{{b}}}}}");
            let slash = format!(r"\boxed{{{a}/{b}}}");
            let exact = format!("{value:.9}");
            let off = format!("{:.9}", value + 0.01);
            prop_assert!(w.verify(&frac, &exact).correct);
            prop_assert!(!w.verify(&slash, &off).correct);
        }
    }
}
