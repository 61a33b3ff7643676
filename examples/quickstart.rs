//! quickstart — one GRPO run end to end, on the CPU, in a few seconds.
//!
//! A tour of the pipeline's parts in seconds: the actor is roll's learning mock policy (a unigram
//! softmax over the digits 0–9 and an end-of-sequence token, with real sampling, exact log-probs
//! and a real gradient step) instead of a transformer — `rlvr_arithmetic` trains a real Qwen2
//! model. Everything around the actor is the real thing: the RLVR
//! scheduler (sample-level rollout, reward as each sample finishes, dynamic filter), the GRPO
//! estimator from roll-algos, the pipeline, and a reward worker written as a closure.
//!
//! The task: answer with as many 7s as possible. Watch the reward rise.
//!
//! ```sh
//! cargo run --example quickstart [-- steps]
//! ```

use roll::core::testing::{ByteTokenizer, MockPolicy};
use roll::prelude::*;
use std::sync::Arc;

/// The verifiable reward: the fraction of digits in the response that are 7.
fn sevens(sample: &Sample) -> f32 {
    let digits = sample.text.chars().filter(char::is_ascii_digit).count();
    let sevens = sample.text.chars().filter(|c| *c == '7').count();
    if digits == 0 {
        0.0
    } else {
        sevens as f32 / digits as f32
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let steps: u64 = match std::env::args().nth(1) {
        Some(s) => s
            .parse()
            .map_err(|e| anyhow::anyhow!("steps must be a number: {e}"))?,
        None => 20,
    };

    // The actor: any `Policy`. Here the mock; `BurnPolicy` is a Qwen model on Burn.
    let actor = Arc::new(MockPolicy::digits().with_learning_rate(2.0));

    // An endless stream of prompts, all in one domain.
    let prompts = (0..).map(|i| Prompt::new(PromptId(i), "Say some digits, mostly 7s.", "sevens"));

    // The scheduler: 8 prompts per step, 8 samples each, groups with no reward spread dropped.
    // The pipeline hands it the actor's generating side.
    let scheduler = |generator: Arc<dyn Generate>| -> roll::core::Result<Box<dyn Scheduler>> {
        let config = RlvrSchedulerConfig {
            prompts_per_step: 8,
            group_size: 8,
            oversample_prompts: 2,
            sampling: SamplingParams {
                max_new_tokens: 16,
                ..Default::default()
            },
            ..Default::default()
        };
        let filter = DynamicFilter {
            min_std: Some(0.0),
            ..Default::default()
        };
        let tokenizer = Arc::new(ByteTokenizer);
        let scheduler =
            RlvrScheduler::new(config, generator, tokenizer, Arc::new(sevens), prompts)?;
        Ok(Box::new(scheduler.with_filter(filter)))
    };

    // GRPO with the default PPO-clipped objective.
    let algorithm = AlgorithmConfig::default();
    let config = RlvrPipelineConfig {
        max_turn_tokens: 16,
        ..Default::default()
    };
    let mut pipeline = RlvrPipeline::new(actor.clone(), scheduler, algorithm, config)?;

    println!("GRPO on the mock policy: reward = fraction of 7s in the answer");
    let mut first = None;
    let mut last = 0.0;
    for _ in 0..steps {
        let report = pipeline.step().await?;
        println!("{report}");
        first.get_or_insert(report.reward_mean);
        last = report.reward_mean;
    }
    let p7 = actor.probabilities()[7];
    println!(
        "reward {:.3} -> {:.3}; the policy now says 7 with probability {:.2}",
        first.unwrap_or(0.0),
        last,
        p7
    );
    Ok(())
}
