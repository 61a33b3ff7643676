//! The router: dispatch on the resolved domain, isolation of failing, panicking and hanging
//! workers, config through the registry, domain ratios, and the prompt mixer that resolves
//! domains and feeds a scheduler.

mod common;

use async_trait::async_trait;
use common::{resolved, sample};
use proptest::prelude::*;
use roll_core::config::{ComponentSpec, DomainConfig, DomainMap};
use roll_core::scheduler::{RlvrScheduler, RlvrSchedulerConfig};
use roll_core::testing::{ByteTokenizer, ConstantReward, MockPolicy};
use roll_core::{Prompt, PromptId, Reward, RewardWorker, Sample, SamplingParams, Scheduler};
use roll_reward::router::{
    DomainQuota, MixerEnd, PromptMixer, RewardRegistry, RewardRouter, RouteOptions,
};
use roll_reward::{RewardError, SharedWorker};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn opts(timeout_ms: u64, max_concurrency: usize) -> RouteOptions {
    RouteOptions {
        timeout: Some(Duration::from_millis(timeout_ms)),
        max_concurrency,
    }
}

#[tokio::test]
async fn dispatches_on_the_resolved_domain_and_names_unknown_domains() {
    let router = RewardRouter::builder()
        .route("a", ConstantReward(1.0))
        .route("b", ConstantReward(2.0))
        .build()
        .unwrap();
    let map = DomainMap::new([("a", vec![]), ("b", vec!["b-data"])]).unwrap();
    assert_eq!(
        router.score(&sample("a", "", None)).await.unwrap().value,
        1.0
    );
    let tagged = resolved(&map, sample("b-data", "", None));
    assert_eq!(
        (tagged.prompt.tag.as_str(), tagged.prompt.domain.as_str()),
        ("b-data", "b")
    );
    assert_eq!(router.score(&tagged).await.unwrap().value, 2.0);
    // The router resolves nothing itself: an unresolved tag is an unknown domain.
    let err = router
        .score(&sample("b-data", "", None))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown domain `b-data`") && err.contains("`a`, `b`"),
        "{err}"
    );
    let err = router
        .score(&sample("chem", "", None))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown domain `chem`") && err.contains("`a`, `b`"),
        "{err}"
    );
    // The failure costs that sample only: the rest of a batch is scored.
    let batch = [sample("chem", "", None), sample("a", "", None), tagged];
    let results = router.score_batch(&batch).await;
    assert!(results[0].is_err());
    assert_eq!(results[1].as_ref().unwrap().value, 1.0);
    assert_eq!(results[2].as_ref().unwrap().value, 2.0);
}

#[tokio::test]
async fn builder_rejects_inconsistent_routes() {
    let dup = RewardRouter::builder()
        .route("a", ConstantReward(1.0))
        .route("a", ConstantReward(1.0))
        .build();
    assert!(dup.unwrap_err().to_string().contains("routed twice"));
    let bad_ratio = RewardRouter::builder()
        .route("a", ConstantReward(1.0))
        .ratio("z", 1.0)
        .build();
    assert!(
        bad_ratio
            .unwrap_err()
            .to_string()
            .contains("domains.z.ratio")
    );
    let zero = RewardRouter::builder()
        .route_with("a", SharedWorker::new(ConstantReward(1.0)), opts(10, 0))
        .build();
    assert!(zero.unwrap_err().to_string().contains("max_concurrency"));
    assert!(RewardRouter::builder().build().is_err());
}

#[tokio::test]
async fn concurrency_is_limited_per_domain() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Counting {
        now: AtomicUsize,
        max: Arc<AtomicUsize>,
    }
    #[async_trait]
    impl RewardWorker for Counting {
        async fn score(&self, _: &Sample) -> roll_core::Result<Reward> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.max.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            Ok(Reward::new(1.0))
        }
    }
    let max = Arc::new(AtomicUsize::new(0));
    let w = Counting {
        now: AtomicUsize::new(0),
        max: max.clone(),
    };
    let router = RewardRouter::builder()
        .route_with("d", SharedWorker::new(w), opts(5_000, 3))
        .build()
        .unwrap();
    let batch: Vec<_> = (0..12).map(|_| sample("d", "", None)).collect();
    assert!(router.score_batch(&batch).await.iter().all(Result::is_ok));
    assert_eq!(max.load(Ordering::SeqCst), 3);
}

fn domains(entries: &[(&str, ComponentSpec, f64, &[&str])]) -> BTreeMap<String, DomainConfig> {
    entries
        .iter()
        .map(|(name, spec, ratio, tags)| {
            let mut d = DomainConfig::new(spec.clone());
            d.ratio = *ratio;
            d.tags = tags.iter().map(|t| t.to_string()).collect();
            (name.to_string(), d)
        })
        .collect()
}

#[tokio::test]
async fn built_from_config_with_wrapper_options() {
    let cfg = domains(&[
        (
            "math",
            ComponentSpec::new("math_rule")
                .with_option("timeout_s", 2.5)
                .with_option("max_concurrency", 4)
                .with_option("weight", 0.5)
                .with_option("answer", "boxed"),
            2.0,
            &["gsm8k", "math500"],
        ),
        ("if", ComponentSpec::new("ifeval"), 1.0, &[]),
        (
            "fmt",
            ComponentSpec::new("format").with_option("clip", serde_json::json!([0.0, 0.25])),
            1.0,
            &[],
        ),
        (
            "mc",
            ComponentSpec::new("multiple_choice").with_option("scoring", "soft"),
            0.0,
            &[],
        ),
    ]);
    let router = RewardRouter::from_config(&cfg, &RewardRegistry::with_builtins()).unwrap();
    let map = DomainMap::from_config(&cfg).unwrap();
    assert_eq!(router.domains(), vec!["fmt", "if", "math", "mc"]);
    assert_eq!(router.options("math"), Some(opts(2_500, 4)));
    assert_eq!(router.options("if"), Some(RouteOptions::default()));
    let r = router
        .score(&resolved(
            &map,
            sample("math500", r"\boxed{12}", Some("12")),
        ))
        .await
        .unwrap();
    assert_eq!((r.value, r.score), (0.5, Some(1.0)));
    let r = router
        .score(&sample("fmt", r"<think>x</think>\boxed{1}", None))
        .await
        .unwrap();
    assert_eq!(r.value, 0.25);
    let r = router
        .score(&sample(
            "if",
            "hello world",
            Some(r#"{"func_name": "validate_lowercase"}"#),
        ))
        .await
        .unwrap();
    assert_eq!(r.value, 1.0);
    assert_eq!(router.quota().unwrap().next_counts(8), vec![2, 2, 4, 0]);
}

#[test]
fn config_errors_name_the_key_or_kind() {
    let registry = RewardRegistry::with_builtins();
    let bad_key = domains(&[(
        "math",
        ComponentSpec::new("math_rule").with_option("tolerence", 1e-3),
        1.0,
        &[],
    )]);
    let e = RewardRouter::from_config(&bad_key, &registry)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`domains.math.reward`") && e.contains("unknown field `tolerence`"),
        "{e}"
    );
    let bad_kind = domains(&[("code", ComponentSpec::new("lean_prover"), 1.0, &[])]);
    let e = RewardRouter::from_config(&bad_kind, &registry)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown reward worker kind `lean_prover` at `domains.code.reward`")
            && e.contains("`math_rule`")
            && e.contains("`code_sandbox`"),
        "{e}"
    );
    let bad_type = domains(&[(
        "math",
        ComponentSpec::new("math_rule").with_option("weight", "heavy"),
        1.0,
        &[],
    )]);
    let e = RewardRouter::from_config(&bad_type, &registry)
        .unwrap_err()
        .to_string();
    assert!(e.contains("math_rule") && e.contains("heavy"), "{e}");
    let bad_timeout = domains(&[(
        "math",
        ComponentSpec::new("math_rule").with_option("timeout_s", -1),
        1.0,
        &[],
    )]);
    let e = RewardRouter::from_config(&bad_timeout, &registry)
        .unwrap_err()
        .to_string();
    assert!(e.contains("timeout_s"), "{e}");
    let no_judge = domains(&[("chat", ComponentSpec::new("llm_judge"), 1.0, &[])]);
    let e = RewardRouter::from_config(&no_judge, &registry).unwrap_err();
    assert!(matches!(e, RewardError::MissingResource { .. }), "{e}");
    let bad_value = domains(&[(
        "math",
        ComponentSpec::new("math_rule").with_option("symbolic_points", 1),
        1.0,
        &[],
    )]);
    let e = RewardRouter::from_config(&bad_value, &registry)
        .unwrap_err()
        .to_string();
    assert!(e.contains("symbolic_points"), "{e}");
}

/// Any kind registered later routes like a built-in, and replaces a built-in of the same name
/// (here a stub in place of the real `code_sandbox`).
#[tokio::test]
async fn a_kind_registered_later_routes_like_a_builtin() {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct StubSandboxConfig {
        pass: bool,
    }
    let mut registry = RewardRegistry::with_builtins();
    registry.register("code_sandbox", |c: StubSandboxConfig, _| {
        Ok(move |_: &Sample| c.pass)
    });
    let cfg = domains(&[(
        "code",
        ComponentSpec::new("code_sandbox").with_option("pass", true),
        1.0,
        &["mbpp"],
    )]);
    let router = RewardRouter::from_config(&cfg, &registry).unwrap();
    let map = DomainMap::from_config(&cfg).unwrap();
    assert_eq!(
        router
            .score(&resolved(&map, sample("mbpp", "print(1)", None)))
            .await
            .unwrap()
            .value,
        1.0
    );
}

fn check_counts(counts: &[usize], probs: &[f64], batch: usize) {
    assert_eq!(counts.iter().sum::<usize>(), batch);
    for (n, p) in counts.iter().zip(probs) {
        let exact = p * batch as f64;
        assert!(
            (*n as f64 - exact).abs() <= 1.0 + 1e-9,
            "{counts:?} vs {probs:?}·{batch}"
        );
    }
}

proptest! {
    /// Every batch holds each domain's share within ±1 prompt, and over many steps the totals
    /// track the shares (within ±1 prompt, cumulatively).
    #[test]
    fn ratios_hold_within_one_prompt_per_batch(
        weights in proptest::collection::vec(0.0f64..10.0, 1..7),
        batch in 1usize..300,
    ) {
        prop_assume!(weights.iter().sum::<f64>() > 1e-6);
        let names: Vec<String> = (0..weights.len()).map(|i| format!("d{i}")).collect();
        let mut q = DomainQuota::new(names.iter().cloned().zip(weights.iter().copied())).unwrap();
        let probs = q.probabilities().to_vec();
        let mut totals = vec![0usize; weights.len()];
        for step in 1..=60 {
            let counts = q.next_counts(batch);
            check_counts(&counts, &probs, batch);
            for (t, c) in totals.iter_mut().zip(&counts) {
                *t += c;
            }
            for (t, p) in totals.iter().zip(&probs) {
                let exact = p * (batch * step) as f64;
                prop_assert!((*t as f64 - exact).abs() <= 1.0 + 1e-6,
                    "step {step}: total {t} vs {exact}");
            }
        }
    }
}

#[test]
fn the_mixer_fills_batches_by_the_routers_ratios() {
    let router = RewardRouter::builder()
        .route("math", ConstantReward(1.0))
        .route("code", ConstantReward(1.0))
        .route("chat", ConstantReward(1.0))
        .ratio("math", 0.5)
        .ratio("code", 0.3)
        .ratio("chat", 0.2)
        .build()
        .unwrap();
    let quota = router.quota().unwrap();
    let probs = quota.probabilities().to_vec();
    let domains = quota.domains().to_vec();
    let sources: Vec<(String, Box<dyn Iterator<Item = Sample> + Send>)> = domains
        .iter()
        .map(|d| {
            let d2 = d.clone();
            let it: Box<dyn Iterator<Item = Sample> + Send> =
                Box::new(std::iter::repeat_with(move || sample(&d2, "", None)));
            (d.clone(), it)
        })
        .collect();
    let mut mixer = PromptMixer::new(quota, sources, 7).unwrap();
    for _ in 0..50 {
        let batch: Vec<Sample> = mixer.by_ref().take(7).collect();
        let counts: Vec<usize> = domains
            .iter()
            .map(|d| batch.iter().filter(|s| &s.prompt.domain == d).count())
            .collect();
        check_counts(&counts, &probs, 7);
    }
}

/// `[domains]` with `math` (tags `gsm8k`, `math500`, ratio 3) and `code` (tag `mbpp`, ratio 1),
/// each scored by a `const` reward of its own value.
fn mixed_config() -> (BTreeMap<String, DomainConfig>, RewardRegistry) {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Const {
        value: f32,
    }
    let mut registry = RewardRegistry::new();
    registry.register("const", |c: Const, _| Ok(ConstantReward(c.value)));
    let spec = |v: f64| ComponentSpec::new("const").with_option("value", v);
    let cfg = domains(&[
        ("math", spec(1.0), 3.0, &["gsm8k", "math500"]),
        ("code", spec(2.0), 1.0, &["mbpp"]),
    ]);
    (cfg, registry)
}

/// A dataset whose tags cycle through `tags`.
fn dataset(n: u64, tags: &[&str]) -> Vec<Prompt> {
    (0..n)
        .map(|i| Prompt::new(PromptId(i), format!("q{i}"), tags[i as usize % tags.len()]))
        .collect()
}

#[test]
fn a_mixed_dataset_is_resolved_once_and_mixed_by_the_config_ratios() {
    let (cfg, _) = mixed_config();
    // Half code, half math by count; the ratios ask for 1 code in 4.
    let data = dataset(40, &["gsm8k", "mbpp", "math500", "code"]);
    let mut mixer = PromptMixer::from_config(&cfg, data, 8).unwrap();
    let quota = mixer.quota().clone();
    let probs = quota.probabilities().to_vec();
    let mut math_tags = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let batch: Vec<Prompt> = mixer.by_ref().take(8).collect();
        let counts: Vec<usize> = quota
            .domains()
            .iter()
            .map(|d| batch.iter().filter(|p| &p.domain == d).count())
            .collect();
        assert_eq!(counts, vec![2, 6], "code, math");
        check_counts(&counts, &probs, 8);
        for p in &batch {
            let want = match p.tag.as_str() {
                "gsm8k" | "math500" => "math",
                "mbpp" | "code" => "code",
                other => panic!("unexpected tag {other}"),
            };
            assert_eq!(p.domain, want, "{}", p.id);
            if want == "math" {
                math_tags.insert(p.tag.clone());
            }
        }
    }
    assert_eq!(
        math_tags.len(),
        2,
        "both math tags are drawn, as one domain"
    );
    assert_eq!(mixer.status().end(), None, "dataset domains repeat");
}

#[test]
fn an_unknown_tag_in_the_dataset_is_an_error_naming_it() {
    let (cfg, _) = mixed_config();
    let mut data = dataset(6, &["gsm8k", "mbpp"]);
    data.push(Prompt::new(PromptId(6), "q", "chem"));
    let err = PromptMixer::from_config(&cfg, data, 4)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tag `chem` (1, first prompt#6)")
            && err.contains("known domains: `code`, `math`")
            && err.contains("known tags: `gsm8k`, `math500`, `mbpp`"),
        "{err}"
    );
}

#[test]
fn per_domain_sources_end_at_the_first_dry_domain() {
    let quota = DomainQuota::new([("code", 1.0), ("math", 3.0)]).unwrap();
    let code = dataset(3, &["code"]).into_iter();
    let math = dataset(100, &["math"]).into_iter();
    let mut mixer = PromptMixer::new(quota, [("code", code), ("math", math)], 4).unwrap();
    let status = mixer.status();
    assert_eq!(
        mixer.by_ref().count(),
        12,
        "three batches of 1 code + 3 math"
    );
    assert_eq!(
        status.end(),
        Some(MixerEnd::Exhausted {
            domain: "code".into(),
            dropped: 0
        })
    );
    assert_eq!(status.yielded(), 12);
}

/// The whole path: one config gives the router and the mixer; the mixer feeds an RLVR scheduler,
/// and every sample is scored by its tag's domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mixer_feeds_the_scheduler_and_the_router_scores_resolved_domains() {
    let (cfg, registry) = mixed_config();
    let router = RewardRouter::from_config(&cfg, &registry).unwrap();
    let data = dataset(12, &["gsm8k", "mbpp", "math500"]);
    let mixer = PromptMixer::from_config(&cfg, data, 4).unwrap();
    let status = mixer.status();
    let config = RlvrSchedulerConfig {
        prompts_per_step: 4,
        group_size: 2,
        sampling: SamplingParams {
            max_new_tokens: 4,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut scheduler = RlvrScheduler::new(
        config,
        Arc::new(MockPolicy::digits()),
        Arc::new(ByteTokenizer),
        Arc::new(router),
        mixer,
    )
    .unwrap();
    let batch = scheduler
        .next_batch(roll_core::WeightVersion(0))
        .await
        .unwrap();
    assert_eq!(batch.groups.len(), 4);
    assert!(status.yielded() >= 4);
    let mut seen = BTreeMap::new();
    for g in &batch.groups {
        let want = if g.prompt().tag == "mbpp" {
            ("code", 2.0)
        } else {
            ("math", 1.0)
        };
        assert_eq!(g.prompt().domain, want.0, "{}", g.prompt().tag);
        assert!(g.rewards().unwrap().iter().all(|r| *r == want.1));
        *seen.entry(want.0).or_insert(0) += 1;
    }
    assert_eq!(seen, BTreeMap::from([("code", 1), ("math", 3)]));
}

/// `router/{builtins,dispatch,registry}.rs` and their siblings import each other without a
/// circle: the `super::` imports of `src/router` form a DAG.
#[test]
fn router_modules_import_each_other_without_a_circle() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/router");
    let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "mod" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let uses: Vec<String> = text
            .split("super::")
            .skip(1)
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .filter(|m| m.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
            .collect();
        edges.insert(name, uses);
    }
    assert!(edges.contains_key("dispatch") && edges.contains_key("registry"));
    assert!(edges["builtins"].contains(&"registry".to_owned()));
    // Depth-first search for a back edge.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(start) = path.iter().position(|p| p == m) {
            panic!("import circle: {} -> {m}", path[start..].join(" -> "));
        }
        path.push(m.to_owned());
        for next in edges.get(m).into_iter().flatten() {
            if edges.contains_key(next) {
                visit(next, edges, path, done);
            }
        }
        path.pop();
        done.insert(m.to_owned());
    }
    let mut done = std::collections::BTreeSet::new();
    for m in edges.keys() {
        visit(m, &edges, &mut Vec::new(), &mut done);
    }
}
