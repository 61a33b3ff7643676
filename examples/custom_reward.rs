//! custom_reward — your own reward in a few lines: a closure scores each response, and the RLVR
//! pipeline trains a real transformer (`BurnPolicy`: inference engine + trainer) on it.
//!
//! ```sh
//! cargo run --release --example custom_reward
//! ```
//!
//! The task: answer `Q: a+b=? A:` with the sum. The reward is ours: 1 for the exact sum, 0.25
//! for an answer with the right number of digits (shaping a small model can use), 0 for
//! anything else — including an empty answer, which no reward should pay for.

use roll::prelude::*;

/// The closure's whole contract: a `&Sample` in, an `f32` (or `bool`, `Reward`, `Result`) out.
fn sum_reward(sample: &Sample) -> f32 {
    let answer = sample.text.trim();
    let truth = sample.prompt.ground_truth.as_deref().unwrap_or_default();
    if answer.is_empty() || !answer.chars().all(|c| c.is_ascii_digit()) {
        0.0
    } else if answer == truth {
        1.0
    } else if answer.len() == truth.len() {
        0.25
    } else {
        0.0
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
        [run]
        max_steps = 20
        output_dir = "./output/custom_reward"
        [model]
        source = {{ kind = "hf_dir", path = "{fixture}" }}
        prompt_format = "plain"
        [rollout]
        prompts_per_step = 8
        group_size = 8
        max_new_tokens = 4
        [train]
        learning_rate = 2e-4
        [domains.arithmetic]
        reward = {{ kind = "sum_reward" }}
        "#
    ))?;
    let prompts = (0..256u64).map(|i| {
        let (a, b) = (10 + i % 40, 10 + (i * 7) % 40);
        Prompt::new(PromptId(i), format!("Q: {a}+{b}=? A:"), "arithmetic")
            .with_ground_truth((a + b).to_string())
    });
    let mut run = RunBuilder::new(config)
        .reward("sum_reward", sum_reward)
        .prompts(prompts)
        .build()?;
    let summary = run.train().await?;
    let (first, last) = summary.rl_reward_first_last().unwrap_or_default();
    println!("mean reward: first quarter {first:.3}, last quarter {last:.3}");
    Ok(())
}
