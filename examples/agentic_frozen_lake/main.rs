//! agentic_frozen_lake — a small transformer learns to cross a frozen lake, multi-turn, on the
//! CPU, with nothing to download.
//!
//! 1. Plays warm-start episodes with two scripted players — a planner that walks round the
//!    holes and a walker blind to them (`task.rs`) — and learns a byte-level BPE tokenizer from
//!    their text.
//! 2. Builds a 0.9M-parameter Qwen2 from the sizes in the config (or loads an HF directory:
//!    `--model DIR`) and warm-starts it with multi-turn SFT on those episodes: the loss covers
//!    the assistant turns only, and the token stream is exactly the one RL will play.
//! 3. Trains it with GiGPO on episodes it plays itself: each turn it answers the lake's
//!    observation with a move, the environment rewards reaching the goal, every episode of a
//!    group starts from the same map, and turns that acted on the same grid are compared with
//!    each other as well as whole episodes.
//! 4. Evaluates the success rate of greedy episodes on held-out maps (never in the warm start)
//!    after SFT, during and after RL, and exports both models as HF directories.
//!
//! ```sh
//! cargo run --release --example agentic_frozen_lake [-- --model DIR] [-- key.path=value ...]
//! ```
//!
//! Every setting is in `examples/configs/agentic_frozen_lake.toml`; the run directory
//! (`run.output_dir`) receives the resolved config, `metrics.jsonl`, checkpoints, the exported
//! models, plots and `summary.md`. Continue a stopped run with `-- run.resume=true`.

#[path = "../common/cli.rs"]
mod cli;
mod task;
#[path = "../common/warm_start.rs"]
mod warm_start;

use roll::env::{FrozenLake, FrozenLakeConfig};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    roll::init_logging();
    let config = cli::config("examples/configs/agentic_frozen_lake.toml")?;
    let task: warm_start::Task = config.task()?;
    task.validate()?;
    let lake: FrozenLakeConfig = warm_start::env_options(&config, "frozen_lake")?;
    let data = task.datasets(&mut FrozenLake::new(lake)?, &config)?;
    warm_start::train(config, data, ["the planner", "the hole-blind walker"]).await
}
