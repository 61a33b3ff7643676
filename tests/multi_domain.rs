//! The multi-domain example's config, shrunk to a tiny model: every RL step's batch holds each
//! domain's prompts in the configured ratio, to within one prompt, and every sample is scored
//! by its own domain's worker.
//!
//! The observable is the reward workers themselves: each domain's worker (built from the
//! example's own `[domains]` options) is wrapped in a probe that records every sample it
//! scores — the sample's domain, the weight version it was generated with (one per RL step,
//! synchronous training) and its group. With no oversampling and no dynamic filter (the
//! example's settings), the groups scored at a version are exactly that step's batch.

use roll::core::config::{ComponentSpec, Config, ConfigLoader};
use roll::prelude::*;
use roll::reward::SharedWorker;
use roll::reward::code_sandbox::{CodeSandboxConfig, CodeSandboxWorker};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

mod common;
use common::out_dir;

#[path = "../examples/rlvr_multi_domain/task.rs"]
#[allow(dead_code)] // the example's data only; its own checks are the example's business
mod task;

/// One scored sample.
#[derive(Debug, Clone)]
struct Seen {
    /// The domain whose worker scored it.
    worker: String,
    /// The sample's own domain.
    domain: String,
    /// The weight version it was generated with.
    version: u64,
    group: u64,
    prompt: PromptId,
}

/// A domain's real worker, recording what it is asked to score.
struct Probe {
    worker: String,
    inner: SharedWorker,
    log: Arc<Mutex<Vec<Seen>>>,
}

#[async_trait::async_trait]
impl RewardWorker for Probe {
    async fn score(&self, sample: &Sample) -> roll::core::Result<Reward> {
        let seen = Seen {
            worker: self.worker.clone(),
            domain: sample.prompt.domain.clone(),
            version: sample.weight_version()?.0,
            group: sample.group.0,
            prompt: sample.prompt.id,
        };
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(seen);
        self.inner.score(sample).await
    }
}

const STEPS: u64 = 4;
const PROMPTS_PER_STEP: usize = 10;
const GROUP_SIZE: usize = 2;

fn config(out: &std::path::Path) -> Config {
    let root = env!("CARGO_MANIFEST_DIR");
    let output = format!("run.output_dir=\"{}\"", out.display());
    let steps = format!("run.max_steps={STEPS}");
    let prompts = format!("rollout.prompts_per_step={PROMPTS_PER_STEP}");
    let group = format!("rollout.group_size={GROUP_SIZE}");
    ConfigLoader::new()
        .file(format!("{root}/examples/configs/rlvr_multi_domain.toml"))
        .overrides([
            output.as_str(),
            steps.as_str(),
            prompts.as_str(),
            group.as_str(),
            "run.eval_every=0",
            "run.save_every=0",
            "rollout.max_new_tokens=8",
            "train.warmup_steps=0",
            "sft.warmup_steps=0",
            "sft.batch_size=16",
            "sft.eval_every=0",
            "sft.save_every=0",
            "model.source.hidden_size=32",
            "model.source.intermediate_size=64",
            "model.source.num_hidden_layers=1",
            "model.source.tokenizer.vocab_size=300",
            "task.held_out=3",
            "task.math.sft_examples=32",
            "task.code.sft_examples=32",
            "task.ifeval.sft_examples=32",
            "task.math.rl_prompts=20",
            "task.code.rl_prompts=20",
            "task.ifeval.rl_prompts=20",
        ])
        .load()
        .expect("the example's config, shrunk")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multi_domain_run_keeps_the_ratios_in_every_batch_and_routes_by_domain() {
    let out = out_dir("multi-domain");
    let mut config = config(&out);
    let task: task::Task = config.task().expect("[task]");
    task.validate().expect("valid [task]");
    let data = task.datasets(config.run.seed);
    let rl_prompts: HashSet<PromptId> = data.rl.iter().map(|p| p.id).collect();
    // Every group started is then trained on: the scored groups of a step are its batch.
    assert_eq!(config.rollout.oversample_prompts, 0);
    assert!(config.algorithm.dynamic_filter.is_none());

    // Without root the confined sandbox is unavailable and every code sample would fail (and be
    // replaced by another domain's prompt): what is tested here is the mix, not the sandbox.
    let sandbox = CodeSandboxWorker::new(CodeSandboxConfig::default()).expect("sandbox");
    if let Err(e) = sandbox.probe().await {
        eprintln!("NOTE: the confined code sandbox is unavailable ({e}); running code unconfined");
        let code = config.domains.get_mut("code").expect("[domains.code]");
        code.reward = code.reward.clone().with_option("allow_unconfined", true);
    }

    // Each domain's worker, as the example's config builds it, behind a probe.
    let log = Arc::new(Mutex::new(Vec::new()));
    let registry = RewardRegistry::with_builtins();
    let total_ratio: f64 = config.domains.values().map(|d| d.ratio).sum();
    let mut shares = BTreeMap::new();
    let mut probes = Vec::new();
    for (name, domain) in &mut config.domains {
        let built = registry.build(&domain.reward).expect("the domain's worker");
        let kind = format!("probe_{name}");
        domain.reward = ComponentSpec::new(&kind);
        probes.push((kind, built.worker, name.clone()));
        shares.insert(name.clone(), domain.ratio / total_ratio);
    }
    let mut builder = RunBuilder::new(config);
    for (kind, inner, worker) in probes {
        let log = log.clone();
        builder = builder.reward(&kind, Probe { worker, inner, log });
    }
    let mut run = builder
        .prompts(data.rl)
        .eval_prompts(data.held_out)
        .sft_examples(data.sft, data.sft_held_out)
        .build()
        .expect("build");
    let summary = run.train().await.expect("train");
    assert_eq!(summary.rl.len() as u64, STEPS);
    for report in &summary.rl {
        assert_eq!(report.groups, PROMPTS_PER_STEP, "{report}");
    }

    let seen = log.lock().expect("log").clone();
    // Routing: every sample, trained on or held out, reached its own domain's worker, and each
    // worker had samples.
    let misrouted: Vec<&Seen> = seen.iter().filter(|s| s.worker != s.domain).collect();
    assert!(misrouted.is_empty(), "misrouted: {misrouted:?}");
    let workers: BTreeSet<&str> = seen.iter().map(|s| s.worker.as_str()).collect();
    assert_eq!(workers, ["code", "ifeval", "math"].into());

    // Ratios: the groups of each step (weight version) by domain.
    let mut groups: BTreeMap<u64, BTreeMap<&str, BTreeSet<u64>>> = BTreeMap::new();
    let mut samples = 0;
    for s in seen.iter().filter(|s| rl_prompts.contains(&s.prompt)) {
        let by_domain = groups.entry(s.version).or_default();
        by_domain
            .entry(s.domain.as_str())
            .or_default()
            .insert(s.group);
        samples += 1;
    }
    assert_eq!(groups.len() as u64, STEPS, "one weight version per step");
    assert_eq!(samples, STEPS as usize * PROMPTS_PER_STEP * GROUP_SIZE);
    let mut totals: BTreeMap<&str, usize> = BTreeMap::new();
    for (version, by_domain) in &groups {
        let counts: BTreeMap<&str, usize> = by_domain.iter().map(|(d, g)| (*d, g.len())).collect();
        assert_eq!(counts.values().sum::<usize>(), PROMPTS_PER_STEP);
        for (domain, share) in &shares {
            let n = counts.get(domain.as_str()).copied().unwrap_or(0);
            let want = share * PROMPTS_PER_STEP as f64;
            assert!(
                (n as f64 - want).abs() <= 1.0,
                "step at version {version}: {n} {domain} prompts, want {want} ± 1 ({counts:?})"
            );
            *totals.entry(domain.as_str()).or_default() += n;
        }
    }
    // Over the run the per-step roundings even out: the totals are the ratios to within one.
    for (domain, share) in &shares {
        let want = share * (STEPS as usize * PROMPTS_PER_STEP) as f64;
        let n = totals[domain.as_str()];
        assert!(
            (n as f64 - want).abs() <= 1.0,
            "{domain}: {n} prompts, want {want}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The expert's answer to every held-out prompt scores 1 with the example's own workers (the
/// example checks this too before training), and no held-out prompt is trained on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_experts_answers_pass_their_workers_and_held_out_prompts_stay_out() {
    let mut config = config(&out_dir("multi-domain-experts"));
    let task: task::Task = config.task().expect("[task]");
    let data = task.datasets(7);
    let sandbox = CodeSandboxWorker::new(CodeSandboxConfig::default()).expect("sandbox");
    if sandbox.probe().await.is_err() {
        let code = config.domains.get_mut("code").expect("[domains.code]");
        code.reward = code.reward.clone().with_option("allow_unconfined", true);
    }
    let router = RewardRouter::from_config(&config.domains, &RewardRegistry::with_builtins())
        .expect("router");
    let samples: Vec<Sample> = data
        .held_out
        .iter()
        .zip(&data.held_out_answers)
        .enumerate()
        .map(|(i, (p, answer))| {
            let (id, group) = (
                roll::core::SampleId(i as u64),
                roll::core::GroupId(i as u64),
            );
            let mut s = Sample::new(id, group, Arc::new(p.clone()), Vec::new());
            s.text = answer.clone();
            s
        })
        .collect();
    assert_eq!(samples.len(), 3 * task.held_out);
    for (s, r) in samples.iter().zip(router.score_batch(&samples).await) {
        let r = r.unwrap_or_else(|e| panic!("{:?}: {e}", s.prompt.text));
        assert_eq!(
            r.value, 1.0,
            "{:?} -> {:?}: {:?}",
            s.prompt.text, s.text, r.details
        );
    }
    let held: HashSet<&str> = data.held_out.iter().map(|p| p.text.as_str()).collect();
    assert!(data.rl.iter().all(|p| !held.contains(p.text.as_str())));
    for pair in &data.sft {
        assert!(!pair.texts().iter().any(|t| held.contains(t)));
    }
}

#[test]
fn bad_task_settings_are_refused_naming_the_key() {
    let out = out_dir("multi-domain-bad");
    let refused = |key: &str, value: &str| {
        let mut config = config(&out);
        let mut table = config.task.take().expect("[task]");
        let mut slot = &mut table;
        let parts: Vec<&str> = key.split('.').collect();
        for part in &parts[..parts.len() - 1] {
            slot = &mut slot[*part];
        }
        slot[parts[parts.len() - 1]] = serde_json::from_str(value).expect("json");
        config.task = Some(table);
        match config.task::<task::Task>() {
            Err(e) => e.to_string(),
            Ok(t) => t.validate().expect_err(key).to_string(),
        }
    };
    for (key, value, says) in [
        ("math.operators", r#"["*"]"#, "task.math.operators"),
        ("math.max_operand", "0", "task.math.max_operand"),
        ("code.max_constant", "100", "task.code.max_constant"),
        ("ifeval.novice_share", "1.5", "task.ifeval.novice_share"),
        ("code.rl_prompts", "0", "task.code.rl_prompts"),
        ("held_out", "500", "distinct ifeval problems"),
        ("ifeval.typo", "1", "typo"),
    ] {
        let err = refused(key, value);
        assert!(err.contains(says), "{key} = {value}: {err}");
    }
}
