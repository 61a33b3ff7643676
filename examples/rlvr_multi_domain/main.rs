//! rlvr_multi_domain — three reward domains in one RLVR run on a transformer built from scratch:
//! math (roll-reward's math verifier), code (its sandbox, running Python test cases) and
//! instruction following (its IFEval rules), mixed by the ratios of `[domains]`, each sample
//! scored by its own domain's worker.
//!
//! 1. Draws the three tasks (`task.rs`): arithmetic, one-line Python functions, sentences under
//!    an instruction; per domain, held-out prompts never trained on.
//! 2. Builds a 0.8M-parameter Qwen2 whose BPE tokenizer is learned from the warm start's text,
//!    and warm-starts it with SFT on all three domains (a share of the answers by a novice with
//!    one systematic mistake per domain, for RL to unlearn).
//! 3. Trains it with GRPO; every step's prompts hold each domain's share of
//!    `rollout.prompts_per_step` (to within one prompt), and the reward router sends each sample
//!    to its domain's worker.
//! 4. Reports greedy held-out accuracy per domain after SFT and after RL (the run's own
//!    evaluation: `domain/<name>/accuracy` in `metrics.jsonl`, a table in `summary.md`).
//!
//! ```sh
//! cargo run --release --example rlvr_multi_domain [-- --model DIR] [-- key.path=value ...]
//! ```
//!
//! Before training, the expert's answer to every held-out prompt goes through the reward router
//! and must score 1: a task and a worker that disagree, or a worker that cannot run, stop the
//! run there. The code sandbox runs each program confined (namespaces, an unprivileged user,
//! rlimits), which needs root and util-linux; elsewhere this check fails with the sandbox's
//! reason (`domains.code.reward.allow_unconfined=true` runs the programs with rlimits only).

#[path = "../common/cli.rs"]
mod cli;
mod held_out;
mod task;

use held_out::HeldOut;
use roll::prelude::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    roll::init_logging();
    let config = cli::config("examples/configs/rlvr_multi_domain.toml")?;
    let task: task::Task = config.task()?;
    task.validate()?;
    let data = task.datasets(config.run.seed);
    let held_out = HeldOut::new(&config, data.held_out.clone())?;
    held_out.check(&data.held_out_answers).await?;

    let has_sft = config.sft.is_some();
    let mut run = RunBuilder::new(config)
        .prompts(data.rl)
        .eval_prompts(data.held_out);
    if has_sft {
        run = run.sft_examples(data.sft, data.sft_held_out);
    }
    // The run's held-out evaluation prints accuracy per domain after SFT and after RL, and
    // the summary's "Solved per domain" table has both.
    cli::train(run).await
}
