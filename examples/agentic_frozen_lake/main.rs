//! agentic_frozen_lake — a small transformer learns to cross a frozen lake, multi-turn, on the
//! CPU, with nothing to download.
//!
//! 1. Plays warm-start episodes with two scripted players (a planner that walks round the holes,
//!    a walker blind to them) and learns a byte-level BPE tokenizer from their text.
//! 2. Builds a 0.9M-parameter Qwen2 from the sizes in the config (or loads an HF directory:
//!    `--model DIR`) and warm-starts it with multi-turn SFT on those episodes: the loss covers
//!    the assistant turns only, and the token stream is exactly the one RL will play.
//! 3. Trains it with GRPO on episodes it plays itself: each turn it answers the lake's
//!    observation with a move, the environment rewards reaching the goal, and every episode of
//!    a group starts from the same map.
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

mod task;

use roll::core::config::ModelSource;
use roll::prelude::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    roll::init_logging();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join("examples/configs/agentic_frozen_lake.toml");
    // `--model DIR` replaces the model built from scratch; everything else goes to the config.
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let model = match args.iter().position(|a| a == "--model") {
        Some(i) if i + 1 < args.len() => Some(args.drain(i..=i + 1).nth(1).unwrap_or_default()),
        Some(_) => anyhow::bail!("--model needs a directory"),
        None => None,
    };
    if !args.iter().any(|a| a.starts_with("--config") || a == "-c") {
        args.splice(0..0, ["--config".to_owned(), file.display().to_string()]);
    }
    let mut config = Config::from_args(args)?;
    if let Some(dir) = model {
        config.model.source = ModelSource::HfDir { path: dir.into() };
        config.validate()?;
    }
    let task: task::Task = config.task()?;
    task.validate()?;
    let data = task.datasets(&config)?;
    println!(
        "warm start: {} episodes (planner solves {:.0}%, hole-blind walker {:.0}%); {} held-out maps",
        data.sft.len(),
        100.0 * data.planner_success,
        100.0 * data.walker_success,
        data.eval_seeds.len()
    );

    let mut run = RunBuilder::new(config)
        .sft_examples(data.sft, data.sft_held_out)
        .eval_seeds(data.eval_seeds)
        .build()?;
    let dir = run.plan().run.output_dir.display().to_string();
    println!("resolved config: {dir}/config.toml");
    let summary = run.train().await?;

    println!("\n{summary}");
    println!("summary: {dir}/summary.md\nmetrics: {dir}/metrics.jsonl");
    Ok(())
}
