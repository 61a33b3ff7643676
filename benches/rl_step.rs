//! One whole GRPO step of `rlvr_arithmetic`'s shape on the `tiny-qwen2-sft` fixture: 8 prompts ×
//! 8 samples × at most 6 new tokens, rewarded by `math_rule`, then one optimiser step — rollout
//! (generation and reward), training and the engine's weight sync, as `RunBuilder` wires them.
//! `benches/trl_grpo_step.py` times HF TRL's `GRPOTrainer` on the same work.
//!
//! `cargo bench --bench rl_step` (measure with the machine otherwise idle). Besides criterion's
//! time per step it prints the mean rollout and train times of the measured steps.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use roll::core::config::ConfigLoader;
use roll::core::rng::SplitMix64;
use roll::prelude::*;
use std::path::PathBuf;

/// 4,096 `Q: a+b=? A:` prompts with their answers, operands 0–99 (the fixture's training
/// distribution); the run repeats them when used up.
fn prompts() -> impl Iterator<Item = Prompt> + Send {
    let mut rng = SplitMix64::new(7);
    (0..4096).map(move |i| {
        let (a, b) = (rng.next_u64() % 100, rng.next_u64() % 100);
        Prompt::new(PromptId(i), format!("Q: {a}+{b}=? A:"), "arithmetic")
            .with_ground_truth((a + b).to_string())
    })
}

fn config(fixture: &std::path::Path, out: &std::path::Path) -> roll::core::Result<Config> {
    let toml = format!(
        r#"
        pipeline = "rlvr"
        [run]
        max_steps = 1000000
        output_dir = "{out}"
        log_every = 1000000
        [model]
        source = {{ kind = "hf_dir", path = "{fixture}" }}
        prompt_format = "plain"
        [rollout]
        prompts_per_step = 8
        group_size = 8
        max_new_tokens = 6
        [train]
        learning_rate = 1e-6
        [domains.arithmetic]
        reward = {{ kind = "math_rule", answer = "whole" }}
        "#,
        out = out.display(),
        fixture = fixture.display(),
    );
    ConfigLoader::new().toml_str(&toml).load()
}

fn rl_step(c: &mut Criterion) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fixture = root.join("../shared/fixtures/tiny-qwen2-sft");
    if !fixture.exists() {
        eprintln!("skipping: {} is absent", fixture.display());
        return;
    }
    let out = root.join("target/bench-rl-step");
    let config = config(&fixture, &out).expect("config");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut run = RunBuilder::new(config)
        .prompts(prompts())
        .build()
        .expect("build");
    let mut parts = Parts::default();
    let mut group = c.benchmark_group("rl_step");
    group.sample_size(20);
    group.bench_function("tiny-qwen2-sft 8x8x6", |b| {
        b.iter(|| {
            let report = runtime.block_on(run.step()).expect("step");
            parts.add(&report);
        });
    });
    group.finish();
    parts.print();
}

/// Seconds of each part of the measured steps, summed.
#[derive(Default)]
struct Parts {
    steps: u32,
    rollout: f64,
    reward: f64,
    score: f64,
    update: f64,
    optimizer: f64,
    sync: f64,
    probe: f64,
    train: f64,
    sequences: f64,
    trained_tokens: f64,
    aborted: f64,
}

impl Parts {
    fn add(&mut self, report: &StepReport) {
        let metric = |name: &str| report.metrics.get(name).copied().unwrap_or(0.0);
        self.steps += 1;
        self.rollout += report.rollout_time.as_secs_f64();
        self.reward += metric("rollout/reward_s");
        self.score += metric("time/score_s");
        self.update += metric("actor/time/update_s");
        self.optimizer += metric("actor/time/optimizer_s");
        self.sync += metric("actor/time/weight_sync_s");
        self.probe += metric("actor/time/gap_probe_s");
        self.train += report.train_time.as_secs_f64();
        self.sequences += metric("actor/sequences");
        self.trained_tokens += metric("actor/trained_tokens");
        self.aborted += metric("rollout/samples_aborted");
    }

    /// The mean step's parts in milliseconds: the rollout's wall time (generation, with the
    /// reward calls overlapping it), then the training side's.
    fn print(&self) {
        if self.steps == 0 {
            return;
        }
        let ms = |s: f64| s * 1e3 / f64::from(self.steps);
        let rest = self.train - self.score - self.update - self.sync - self.probe;
        println!(
            "rl_step breakdown over {} steps (ms): rollout {:.1} (reward calls {:.2} of it, \
             overlapping generation) | scoring {:.1} | update {:.1} (forward and backward {:.1}, \
             norm, clip and AdamW {:.1}) | weight sync {:.1} | gap probe {:.1} | batch building \
             and the rest {:.1}",
            self.steps,
            ms(self.rollout),
            ms(self.reward),
            ms(self.score),
            ms(self.update),
            ms(self.update - self.optimizer),
            ms(self.optimizer),
            ms(self.sync),
            ms(self.probe),
            ms(rest),
        );
        // What a step computes, for its model-FLOPs count: the trained samples' response tokens
        // (their prompts are `Q: a+b=? A:`, 7 tokens and the digits), and the samples generated
        // and then aborted when their group was already complete.
        let mean = |x: f64| x / f64::from(self.steps);
        println!(
            "rl_step work per step: {:.1} sequences trained, {:.1} response tokens trained, {:.1} \
             samples aborted",
            mean(self.sequences),
            mean(self.trained_tokens),
            mean(self.aborted),
        );
    }
}

criterion_group!(benches, rl_step);
criterion_main!(benches);
