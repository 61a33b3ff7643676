//! rlvr_arithmetic — the main job: a small transformer learns arithmetic on the CPU, in one
//! command, with nothing to download.
//!
//! 1. Builds a byte-level tokenizer and a 0.8M-parameter Qwen2 from the sizes in the config
//!    (or loads an HF directory: `--model ../shared/fixtures/tiny-qwen2-sft`).
//! 2. Warm-starts it with SFT on `Q: a op b=? A: c` pairs, small operands first (a curriculum).
//! 3. Trains it with GRPO; the reward is roll-reward's math verifier (`math_rule` reading the
//!    whole answer): 1 for the exact result, 0 otherwise — no partial credit.
//! 4. Evaluates greedy accuracy on 500 held-out prompts (never trained on) after SFT and after
//!    RL, and exports both models as HF directories next to `eval_prompts.jsonl`.
//!
//! ```sh
//! cargo run --release --example rlvr_arithmetic [-- --model DIR] [-- key.path=value ...]
//! ```
//!
//! Every setting is in `examples/configs/rlvr_arithmetic.toml`; the run directory
//! (`run.output_dir`) receives the resolved config, `metrics.jsonl`, checkpoints, the exported
//! models, plots and `summary.md`. Stopped (Ctrl-C, a crash, a kill), the run continues from its
//! newest checkpoint with `-- run.resume=true`; logs follow `RUST_LOG`.

#[path = "../common/cli.rs"]
mod cli;
mod task;

use roll::prelude::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    roll::init_logging();
    let config = cli::config("examples/configs/rlvr_arithmetic.toml")?;
    let task: task::Task = config.task()?;
    task.validate()?;
    let data = task.datasets(config.run.seed);

    let has_sft = config.sft.is_some();
    let mut run = RunBuilder::new(config)
        .prompts(data.rl)
        .eval_prompts(data.held_out);
    if has_sft {
        run = run.sft_examples(data.sft, data.sft_held_out);
    }
    cli::train(run).await
}
