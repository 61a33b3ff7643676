//! distributed_grpo — GRPO across processes on MPI: rank 0 runs the whole pipeline (rollouts,
//! rewards, the controller) and trains; the other ranks serve it in one of two ways.
//!
//! - Colocated (the default, `rollout.ranks=0`): every other rank is one more data-parallel
//!   replica of the actor's trainer. Each step's batch is split across the ranks by tokens, the
//!   gradients are summed with `MPI_Allreduce`, and every replica applies the same update, so
//!   the run trains as one process would on the whole batch.
//! - Disaggregated (`rollout.ranks=N-1`): every other rank only generates, with an inference
//!   engine of its own; rank 0 sends each of them the new weights, with their version, after
//!   every step.
//!
//! Either way, `model.tensor_parallel=T` or `model.pipeline_parallel=P` makes the training ranks
//! hold the actor in copies of `T` (`P`) ranks: slices of every layer, or blocks of layers; both
//! make copies of `T·P` ranks, `P` stages of `T` slices each. With a Qwen3-MoE,
//! `model.expert_parallel=E` divides its experts among the training ranks (with
//! `model.pipeline_parallel=P`: among `E` pipelines side by side, stage by stage), and
//! `rollout.expert_parallel=E` makes the rollout ranks hold them divided among groups of `E`,
//! their engines stepping together — or, colocated, with `model.expert_parallel=E` too, the
//! training ranks generate together, each engine on its own trainer's block of experts.
//!
//! ```sh
//! cargo build --release --features mpi --example distributed_grpo
//! mpirun -np 2 target/release/examples/distributed_grpo                  # one machine (root: add --allow-run-as-root)
//! mpirun -np 3 target/release/examples/distributed_grpo rollout.ranks=2  # rank 0 trains, 1 and 2 generate
//! mpirun -np 2 target/release/examples/distributed_grpo model.tensor_parallel=2    # 2 slices of one copy
//! mpirun -np 3 target/release/examples/distributed_grpo model.pipeline_parallel=3  # 3 stages of one copy
//! mpirun -np 4 target/release/examples/distributed_grpo model.tensor_parallel=2 model.pipeline_parallel=2
//! mpirun -np 3 target/release/examples/distributed_grpo model.source.path=MOE_DIR rollout.ranks=2 rollout.expert_parallel=2
//! mpirun -np 2 target/release/examples/distributed_grpo model.source.path=MOE_DIR model.expert_parallel=2 rollout.expert_parallel=2
//! mpirun -np 4 target/release/examples/distributed_grpo model.source.path=MOE_DIR model.pipeline_parallel=2 model.expert_parallel=2
//! srun --ntasks=4 target/release/examples/distributed_grpo               # a Slurm allocation
//! ```
//!
//! Every rank reads the same config (`examples/configs/distributed_grpo.toml`, or `--config
//! FILE`, then `key.path=value` overrides) and must see the same files: the model directory,
//! and the run directory when resuming (`run.resume=true`). See docs/distributed.md.

#[path = "common/cli.rs"]
mod cli;

use roll::mpi::MpiWorld;
use roll::prelude::*;
use std::sync::Arc;

fn main() -> anyhow::Result<()> {
    roll::init_logging();
    let world = MpiWorld::init()?;
    let config = cli::config("examples/configs/distributed_grpo.toml")?;
    let group: Arc<dyn Messenger> = Arc::new(world.replica(config.model.device));
    if world.rank() > 0 {
        match follow(&config, group)? {
            Followed::Trained { steps, .. } => {
                println!(
                    "rank {}: trained {steps} steps of rank 0's run",
                    world.rank()
                );
            }
            Followed::Generated(served) => println!(
                "rank {}: generated {} requests of rank 0's run, last on weight version {}",
                world.rank(),
                served.requests,
                served.version.0
            ),
        }
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let run = RunBuilder::new(config).prompts(sums(256)).lead(group);
        // `train` ends the run, which releases the other ranks.
        cli::train(run).await
    })
}

/// `Q: a+b=? A:` prompts with their sums as ground truth (the fixture's format).
fn sums(n: u64) -> impl Iterator<Item = Prompt> {
    (0..n).map(|i| {
        let (a, b) = (i % 50, (i * 7 + 3) % 50);
        Prompt::new(PromptId(i), format!("Q: {a}+{b}=? A:"), "arithmetic")
            .with_ground_truth((a + b).to_string())
    })
}
