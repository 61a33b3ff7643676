//! A run across processes: rank 0 runs the whole pipeline (rollouts, rewards, the controller)
//! and leads the actor's data-parallel group ([`RunBuilder::lead`](super::RunBuilder::lead));
//! every other rank runs [`follow`]: one more replica of the actor's trainer, nothing else.
//!
//! Before anything trains, the leader tells the group where the actor starts — the model
//! directory, or the checkpoint it resumes — so the followers build the same trainer from the
//! same files (a shared file system, as on a cluster). From then on the followers only serve
//! the leader's steps ([`roll_backend_burn::train::follow`]).

use roll_backend_burn::hf::HfSource;
use roll_backend_burn::train::Trainer;
use roll_core::config::Config;
use roll_core::strategy::Strategy;
use roll_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

use super::RunPlan;

/// Where the actor starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Start {
    /// A fresh trainer on the weights of this HF directory.
    Weights(PathBuf),
    /// The trainer checkpoint in this directory.
    Checkpoint(PathBuf),
}

/// Tells the followers where the actor starts (rank 0).
pub(crate) fn announce(group: &dyn Strategy, start: &Start) -> Result<()> {
    let mut bytes =
        serde_json::to_vec(start).map_err(|e| Error::invalid_data("run start", e.to_string()))?;
    group.broadcast(&mut bytes, 0)
}

/// What a distributed run needs of its config, checked on every rank alike.
pub(crate) fn check(plan: &RunPlan) -> Result<()> {
    if plan.sft.is_some() {
        return Err(Error::invalid_data(
            "config",
            "a run across processes does not take `[sft]` yet: warm-start in a single-process \
             run and start the distributed run from its export (`model.source.path`)",
        ));
    }
    if plan.model.trainer_devices.len() != 1 {
        return Err(Error::invalid_data(
            "config",
            "`model.data_parallel` must be 1 in a run across processes: each process runs one \
             replica, and the processes are the data-parallel group",
        ));
    }
    Ok(())
}

/// Serves as rank `group.rank()` (≥ 1) of a run across processes whose rank 0 runs `config`
/// with [`RunBuilder::lead`](super::RunBuilder::lead): builds the actor's trainer where the
/// leader says the actor starts and trains every step the leader announces, until the leader's
/// run ends. Returns the number of steps served.
///
/// Every rank is started with the same config (e.g. the same command line under `mpirun` or
/// `srun`). A failure here is reported to the whole group (the job stops, naming this rank).
///
/// # Errors
/// A config that does not validate or that a distributed run does not take, a model or
/// checkpoint that does not load, or a failed step.
pub fn follow(config: &Config, group: Arc<dyn Strategy>) -> Result<usize> {
    let rank = group.rank();
    let served = serve(config, &group);
    if let Err(e) = &served {
        group.abort(&format!("rank {rank} (actor trainer): {e}"));
    }
    served
}

fn serve(config: &Config, group: &Arc<dyn Strategy>) -> Result<usize> {
    let plan = RunPlan::from_config(config)?;
    check(&plan)?;
    let mut bytes = Vec::new();
    group.broadcast(&mut bytes, 0)?;
    let start: Start = serde_json::from_slice(&bytes)
        .map_err(|e| Error::invalid_data("run start from rank 0", e.to_string()))?;
    let device = roll_backend_burn::device(plan.model.device)?;
    let trainer = match start {
        Start::Weights(dir) => {
            let model = HfSource::open(&dir)?.load_model(&device)?;
            Trainer::new(model, plan.trainer.clone(), &device)?
        }
        Start::Checkpoint(dir) => Trainer::load_checkpoint(&dir, &device)?.0,
    };
    let mut trainer = trainer.with_strategy(group.clone());
    let reports = roll_backend_burn::train::follow(&mut trainer, group.as_ref())?;
    tracing::info!(
        rank = group.rank(),
        steps = reports.len(),
        "the leader's run ended"
    );
    Ok(reports.len())
}
