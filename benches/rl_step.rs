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
use std::time::Duration;

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
    let (mut rollout, mut train, mut steps) = (Duration::ZERO, Duration::ZERO, 0u32);
    let mut group = c.benchmark_group("rl_step");
    group.sample_size(20);
    group.bench_function("tiny-qwen2-sft 8x8x6", |b| {
        b.iter(|| {
            let report = runtime.block_on(run.step()).expect("step");
            rollout += report.rollout_time;
            train += report.train_time;
            steps += 1;
        });
    });
    group.finish();
    if steps > 0 {
        println!(
            "rl_step breakdown over {steps} steps: rollout (generation + reward) {:.1} ms, \
             train (update + weight sync) {:.1} ms",
            rollout.as_secs_f64() * 1e3 / f64::from(steps),
            train.as_secs_f64() * 1e3 / f64::from(steps),
        );
    }
}

criterion_group!(benches, rl_step);
criterion_main!(benches);
