//! custom_env — your own environment, trained by the agentic pipeline with a real transformer:
//! implement `Env` (reset, step), register it by name, and `agentic.env.kind` plays it.
//! `cargo run --release --example custom_env`
//!
//! `Sums` asks three additions in a row; each right answer earns 1/3, and the next question
//! says whether the last answer was right.

use roll::core::{Env, Observation, StepResult};
use roll::prelude::*;

#[derive(Default)]
struct Sums {
    seed: u64,
    turn: u64,
}

impl Sums {
    fn operands(&self) -> (u64, u64) {
        let x = (self.seed ^ self.turn).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        (x % 10, (x / 10) % 10)
    }
}

impl Env for Sums {
    fn reset(&mut self, seed: u64) -> roll::core::Result<Observation> {
        (self.seed, self.turn) = (seed, 0);
        let (a, b) = self.operands();
        Ok(Observation::new(format!("Q: {a}+{b}=? A:")))
    }

    fn step(&mut self, action: &str) -> roll::core::Result<StepResult> {
        let (a, b) = self.operands();
        // The first word is the answer; an empty answer is wrong.
        let right = action.split_whitespace().next() == Some(&(a + b).to_string());
        let (reward, verdict) = if right {
            (1.0 / 3.0, "Right.")
        } else {
            (0.0, "Wrong.")
        };
        self.turn += 1;
        if self.turn == 3 {
            return Ok(StepResult::terminated(verdict, reward).with_info("success", right));
        }
        let (a, b) = self.operands();
        let next = format!(" {verdict}\nQ: {a}+{b}=? A:");
        Ok(StepResult::running(next, reward))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/tiny-qwen2-sft"
    );
    let config = Config::from_toml(&format!(
        r#"
        pipeline = "agentic"
        run = {{ max_steps = 20, output_dir = "./output/custom_env" }}
        model = {{ source = {{ kind = "hf_dir", path = "{fixture}" }}, prompt_format = "plain" }}
        train = {{ learning_rate = 2e-4 }}
        [agentic]
        env = {{ kind = "sums" }}
        num_groups = 8
        group_size = 8
        max_turns = 3
        max_tokens_per_turn = 4
        "#
    ))?;
    let mut run = RunBuilder::new(config)
        .env("sums", Sums::default)
        .eval_seeds(1_000..1_100) // one greedy episode each, before and after RL
        .build()?;
    let summary = run.train().await?;
    let (first, last) = summary.rl_reward_first_last().unwrap_or_default();
    println!("mean episode reward: first quarter {first:.3}, last quarter {last:.3}");
    Ok(())
}
