//! Data parallelism across processes: rank 0 leads, every other rank [`follow`]s.
//!
//! The leader — the process that runs the pipeline — hands each step's whole batch to the group
//! with one [`Strategy::broadcast`]; every rank takes the same token-balanced
//! [`Strategy::partition`] of it and trains its own shard, and the replicas meet again in the
//! step's all-reduces. Sending the whole batch rather than each rank's shard costs a few
//! kilobytes per sequence once per step, against the megabytes of every gradient all-reduce,
//! and lets every rank cut the batch itself.

use super::core::TrainStepReport;
use super::group::collective;
use super::parallel::Replica;
use crate::{BackendError, Result};
use roll_core::policy::Objective;
use roll_core::strategy::Strategy;
use roll_core::{TrainBatch, TrainSequence};
use serde::{Deserialize, Serialize};

/// What the leader tells the group.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Command {
    /// Train on your shard of these sequences.
    Step {
        sequences: Vec<TrainSequence>,
        objective: Objective,
    },
    /// The leader needs the whole model: every rank holding a part of one gathers it with the
    /// others of its part's group ([`CausalLm::gather`](crate::CausalLm::gather)).
    Gather,
    /// The weights changed: where this rank's inference engine steps with the leader's (the
    /// experts divided among a copy's ranks, [`ModelParts::generates`](crate::ModelParts)), sync
    /// it to this rank's part — every engine of the group syncs at once.
    Serve,
    /// Write your part of the trainer's checkpoint under `dir` (the first copy's ranks), then
    /// meet the others (an all-reduce) so the leader knows every part is written.
    Checkpoint {
        dir: std::path::PathBuf,
        weight_version: u64,
    },
    /// The leader is done: return from [`follow`].
    Stop,
}

/// Broadcasts `command` from rank 0.
pub(crate) fn announce(strategy: &dyn Strategy, command: &Command) -> Result<()> {
    let mut bytes = serde_json::to_vec(command).map_err(|e| {
        BackendError::InvalidInput(format!("cannot encode the step for the group: {e}"))
    })?;
    strategy.broadcast(&mut bytes, 0).map_err(collective)
}

/// The shards of `batch`, one per rank of `strategy`'s group (see [`Strategy::partition`]).
pub(crate) fn shards(batch: &TrainBatch, strategy: &dyn Strategy) -> Result<Vec<TrainBatch>> {
    let seqs = batch.sequences();
    let tokens: Vec<usize> = seqs
        .iter()
        .map(|s| s.prompt_ids.len() + s.response_ids.len())
        .collect();
    strategy
        .partition(&tokens)
        .into_iter()
        .map(|part| {
            let shard: Vec<TrainSequence> = part.iter().map(|&i| seqs[i].clone()).collect();
            TrainBatch::new(shard).map_err(|e| BackendError::InvalidInput(e.to_string()))
        })
        .collect()
}

/// Serves the leader (rank 0) of `strategy`'s group as one more replica until it stops: each
/// announced step trains this rank's shard. `replica` must have joined the same group
/// ([`Trainer::with_strategy`](super::Trainer::with_strategy)) and start from the leader's
/// weights and config. Returns the steps taken, each one's report.
///
/// # Errors
/// A step's error (the group is told, see [`Strategy::abort`]), a failed collective, or a
/// message that cannot be read.
pub fn follow<T: Replica>(
    replica: &mut T,
    strategy: &dyn Strategy,
) -> Result<Vec<TrainStepReport>> {
    follow_in(replica, strategy, strategy)
}

/// [`follow`] where the leader announces to more ranks than one data-parallel group: the ranks
/// of each copy of a tensor- or pipeline-parallel model ([`CausalLm::shard_tensors`],
/// [`CausalLm::split_stages`]) hold parts of it, and each copy is one replica of `data`. The
/// leader is rank 0 of `announce` (every training rank); a rank trains `data`'s shard of each
/// step for its rank there, the same as the other ranks of its copy.
///
/// [`CausalLm::shard_tensors`]: crate::CausalLm::shard_tensors
/// [`CausalLm::split_stages`]: crate::CausalLm::split_stages
///
/// # Errors
/// As [`follow`].
pub fn follow_in<T: Replica>(
    replica: &mut T,
    announce: &dyn Strategy,
    data: &dyn Strategy,
) -> Result<Vec<TrainStepReport>> {
    follow_serving(replica, announce, data, |_| Ok(()))
}

/// [`follow_in`] on a rank whose inference engine steps with the leader's (the experts divided
/// among the ranks of a copy, each rank's engine on its own block: [`ModelParts::generates`]):
/// each time the leader's weights change it announces it, and `serve` syncs this rank's engine
/// to `replica`'s part. A rank without an engine passes nothing to do (as [`follow_in`] does).
///
/// [`ModelParts::generates`]: crate::ModelParts::generates
///
/// # Errors
/// As [`follow`], and `serve`'s.
pub fn follow_serving<T: Replica>(
    replica: &mut T,
    announce: &dyn Strategy,
    data: &dyn Strategy,
    mut serve: impl FnMut(&T) -> Result<()>,
) -> Result<Vec<TrainStepReport>> {
    let mut reports = Vec::new();
    loop {
        let mut bytes = Vec::new();
        announce.broadcast(&mut bytes, 0).map_err(collective)?;
        let work = match my_work(&bytes, data) {
            Ok(work) => work,
            Err(e) => {
                announce.abort(&e.to_string());
                return Err(e);
            }
        };
        match work {
            Work::Step(shard, objective) => reports.push(replica.step(&shard, &objective)?),
            Work::Gather => replica.gather()?,
            Work::Serve => serve(replica)?,
            Work::Checkpoint(dir, version) => {
                let saved = replica.save_part(&dir, version);
                announce
                    .all_reduce(&mut [0.0], roll_core::strategy::ReduceOp::Sum)
                    .map_err(collective)?;
                saved?;
            }
            Work::Stop => return Ok(reports),
        }
    }
}

/// What an announced command asks of this rank.
enum Work {
    Step(TrainBatch, Objective),
    Gather,
    Serve,
    Checkpoint(std::path::PathBuf, u64),
    Stop,
}

/// This rank's part of an announced command: its shard of a step (by its rank in `data`) and
/// the objective.
fn my_work(bytes: &[u8], data: &dyn Strategy) -> Result<Work> {
    let unreadable = |why: String| BackendError::InvalidInput(format!("the leader's step: {why}"));
    let command: Command = serde_json::from_slice(bytes).map_err(|e| unreadable(e.to_string()))?;
    let (sequences, objective) = match command {
        Command::Step {
            sequences,
            objective,
        } => (sequences, objective),
        Command::Gather => return Ok(Work::Gather),
        Command::Serve => return Ok(Work::Serve),
        Command::Checkpoint {
            dir,
            weight_version,
        } => return Ok(Work::Checkpoint(dir, weight_version)),
        Command::Stop => return Ok(Work::Stop),
    };
    let batch = TrainBatch::new(sequences).map_err(|e| unreadable(e.to_string()))?;
    let rank = data.rank();
    let shard = shards(&batch, data)?
        .into_iter()
        .nth(rank)
        .ok_or_else(|| unreadable(format!("no shard for rank {rank}")))?;
    Ok(Work::Step(shard, objective))
}
