//! agentic_sokoban — a small transformer learns to push a box onto its target, multi-turn, on
//! the CPU, with nothing to download.
//!
//! The recipe of `agentic_frozen_lake`: warm-start episodes of two scripted players — a solver
//! (shortest solutions by breadth-first search) and a wanderer (random moves), `task.rs` —
//! teach a 0.9M-parameter Qwen2 built from scratch (with a BPE tokenizer learned from their
//! text) the game's format and moves by multi-turn SFT; GiGPO then trains it on its own
//! episodes, rewarded by the environment (−0.1 a move, +1 for a box on its target, +10 when
//! solved); episodes on held-out rooms (never in the warm start) measure the success rate after
//! SFT, during and after RL — sampled as in training (the config's `run.eval_temperature`) and
//! greedy.
//!
//! ```sh
//! cargo run --release --example agentic_sokoban [-- --model DIR] [-- key.path=value ...]
//! ```
//!
//! Every setting is in `examples/configs/agentic_sokoban.toml`.

#[path = "../common/cli.rs"]
mod cli;
mod task;
#[path = "../common/warm_start.rs"]
mod warm_start;

use roll::env::{Sokoban, SokobanConfig};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    roll::init_logging();
    let config = cli::config("examples/configs/agentic_sokoban.toml")?;
    let task: warm_start::Task = config.task()?;
    task.validate()?;
    let room: SokobanConfig = warm_start::env_options(&config, "sokoban")?;
    let data = task.datasets(&mut Sokoban::new(room)?, &config)?;
    warm_start::train(config, data, ["the solver", "the wanderer"]).await
}
