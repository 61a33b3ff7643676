//! agentic_async_speedup — synchronous vs asynchronous agentic RL when environments are slow.
//!
//! ```sh
//! cargo run --release --example agentic_async_speedup [-- STEPS]
//! ```
//!
//! The environment asks three sums in a row (as `custom_env`), and every step takes a random
//! time, as a tool call or a simulator would: 10–190 ms, drawn from the episode's seed and turn.
//! The tiny Qwen2 fixture plays 8 groups of 8 episodes per step, `STEPS` steps (default 20),
//! twice: with `agentic.max_staleness = 0` (each batch is played from start to end, then
//! trained on while the environments idle) and `= 1` (the next batch's episodes play while the
//! trainer trains; every turn at most one weight version old). It prints the wall-clock time of
//! the RL steps, the speedup, and the mean episode reward of the first and last five steps, so
//! that a speedup is not bought with worse learning.

#[path = "common/speedup.rs"]
mod speedup;

use roll::core::rng::mix64;
use roll::core::{Env, Observation, StepResult};
use roll::prelude::*;
use std::time::Duration;

#[derive(Default)]
struct SlowSums {
    seed: u64,
    turn: u64,
}

impl SlowSums {
    fn operands(&self) -> (u64, u64) {
        let x = mix64(self.seed ^ self.turn);
        (x % 10, (x / 10) % 10)
    }
}

impl Env for SlowSums {
    fn reset(&mut self, seed: u64) -> roll::core::Result<Observation> {
        (self.seed, self.turn) = (seed, 0);
        let (a, b) = self.operands();
        Ok(Observation::new(format!("Q: {a}+{b}=? A:")))
    }

    fn step(&mut self, action: &str) -> roll::core::Result<StepResult> {
        let latency = 10 + mix64(self.seed.wrapping_add(self.turn) ^ 0xA5A5) % 181;
        std::thread::sleep(Duration::from_millis(latency));
        let (a, b) = self.operands();
        let right = action.split_whitespace().next() == Some(&(a + b).to_string());
        let reward = if right { 1.0 / 3.0 } else { 0.0 };
        self.turn += 1;
        if self.turn == 3 {
            return Ok(StepResult::terminated("", reward).with_info("success", right));
        }
        let (a, b) = self.operands();
        Ok(StepResult::running(format!(" Q: {a}+{b}=? A:"), reward))
    }
}

/// The run of one mode: `max_staleness` 0 (synchronous) or 1, `steps` RL steps, outputs in `out`.
fn build(max_staleness: u32, steps: u64, out: &std::path::Path) -> anyhow::Result<Run> {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/tiny-qwen2-sft"
    );
    let config = Config::from_toml(&format!(
        r#"
        pipeline = "agentic"
        run = {{ seed = 5, max_steps = {steps}, output_dir = "{}" }}
        model = {{ source = {{ kind = "hf_dir", path = "{fixture}" }}, prompt_format = "plain" }}
        train = {{ learning_rate = 2e-4 }}
        [agentic]
        env = {{ kind = "slow_sums" }}
        num_groups = 8
        group_size = 8
        max_turns = 3
        max_tokens_per_turn = 4
        max_staleness = {max_staleness}
        "#,
        out.display()
    ))?;
    Ok(RunBuilder::new(config)
        .env("slow_sums", SlowSums::default)
        .build()?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    speedup::compare("agentic-async", 20, "episode", build).await
}
