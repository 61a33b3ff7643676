//! async_speedup — synchronous vs asynchronous RL on a long-tail workload, with the learning each
//! buys.
//!
//! ```sh
//! cargo run --release --example async_speedup [-- STEPS]
//! ```
//!
//! The workload: a fresh 2-layer Qwen2 whose responses stop at any of eight stop characters, so
//! lengths are geometric (mean ≈ 30 tokens) and cut at 96 — a long tail: most samples of a batch
//! finish early, a few run to the limit. The reward is the fraction of a response's characters
//! that are vowels, something GRPO can raise whatever the length.
//!
//! The same seeds train twice for `STEPS` steps (default 30): with `rollout.max_staleness = 0`
//! (each step waits for its slowest sample, then trains while the engine idles) and with
//! `max_staleness = 1` (the engine generates the next batch during training; samples are at most
//! one version old). It prints the wall-clock time of the RL steps, the speedup, and the mean
//! reward of the first and last five steps of each, so a speedup is not bought with worse
//! learning.

use roll::core::config::ConfigLoader;
use roll::prelude::*;
use std::time::{Duration, Instant};

fn vowels(sample: &Sample) -> f32 {
    let text = sample.text.as_str();
    let n = text.chars().count();
    if n == 0 {
        return 0.0;
    }
    text.chars().filter(|c| "aeiou".contains(*c)).count() as f32 / n as f32
}

struct Outcome {
    time: Duration,
    rewards: Vec<f32>,
    stale: u64,
}

async fn train(max_staleness: u32, steps: u64) -> anyhow::Result<Outcome> {
    let out = std::env::temp_dir().join(format!("roll-async-speedup-{max_staleness}"));
    let config = ConfigLoader::new()
        .toml_str(format!(
            r#"
            [run]
            seed = 11
            max_steps = {steps}
            output_dir = "{}"
            [model]
            prompt_format = "plain"
            [model.source]
            kind = "new"
            model_type = "qwen2"
            hidden_size = 64
            intermediate_size = 176
            num_hidden_layers = 2
            num_attention_heads = 4
            num_key_value_heads = 2
            max_position_embeddings = 128
            [rollout]
            prompts_per_step = 8
            group_size = 8
            max_new_tokens = 96
            max_staleness = {max_staleness}
            max_running_requests = 128
            sampling = {{ stop = ["x", "q", "z", "j", "k", "v", "w", "y"] }}
            [train]
            learning_rate = 1e-3
            [domains.text]
            reward = {{ kind = "vowels" }}
            "#,
            out.display()
        ))
        .load()?;
    let prompts = (0..).map(|i| Prompt::new(PromptId(i), format!("Say something #{i}:"), "text"));
    let mut run = RunBuilder::new(config)
        .reward("vowels", vowels)
        .prompts(prompts.take(10_000))
        .build()?;
    let started = Instant::now();
    let mut rewards = Vec::new();
    let mut stale = 0;
    for _ in 0..steps {
        let report = run.step().await?;
        rewards.push(report.reward_mean);
        stale += report.rollout.staleness_counts[1..].iter().sum::<u64>();
    }
    let time = started.elapsed();
    let _ = std::fs::remove_dir_all(&out);
    Ok(Outcome {
        time,
        rewards,
        stale,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let steps: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 30,
    };
    let sync = train(0, steps).await?;
    let asynchronous = train(1, steps).await?;
    let ends = |r: &[f32]| {
        let k = r.len().min(5);
        let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len().max(1) as f32;
        (mean(&r[..k]), mean(&r[r.len() - k..]))
    };
    println!(
        "| mode | RL time (s) | s/step | reward, first 5 → last 5 steps | samples 1 version old |"
    );
    println!("|---|---:|---:|---|---:|");
    for (name, o) in [
        ("sync (max_staleness 0)", &sync),
        ("async (max_staleness 1)", &asynchronous),
    ] {
        let (first, last) = ends(&o.rewards);
        println!(
            "| {name} | {:.1} | {:.2} | {first:.3} → {last:.3} | {} |",
            o.time.as_secs_f64(),
            o.time.as_secs_f64() / steps as f64,
            o.stale
        );
    }
    println!(
        "\nasync speedup over sync: {:.2}× ({steps} steps each)",
        sync.time.as_secs_f64() / asynchronous.time.as_secs_f64()
    );
    Ok(())
}
