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

#[path = "common/speedup.rs"]
mod speedup;

use roll::core::config::ConfigLoader;
use roll::prelude::*;

fn vowels(sample: &Sample) -> f32 {
    let text = sample.text.as_str();
    let n = text.chars().count();
    if n == 0 {
        return 0.0;
    }
    text.chars().filter(|c| "aeiou".contains(*c)).count() as f32 / n as f32
}

/// The run of one mode: `max_staleness` 0 (synchronous) or 1, `steps` RL steps, outputs in `out`.
fn build(max_staleness: u32, steps: u64, out: &std::path::Path) -> anyhow::Result<Run> {
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
    Ok(RunBuilder::new(config)
        .reward("vowels", vowels)
        .prompts(prompts.take(10_000))
        .build()?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    speedup::compare("async-speedup", 30, "mean", build).await
}
