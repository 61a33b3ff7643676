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
    let mut reports = Vec::new();
    loop {
        let mut bytes = Vec::new();
        strategy.broadcast(&mut bytes, 0).map_err(collective)?;
        let (shard, objective) = match my_work(&bytes, strategy) {
            Ok(Some(work)) => work,
            Ok(None) => return Ok(reports),
            Err(e) => {
                strategy.abort(&e.to_string());
                return Err(e);
            }
        };
        reports.push(replica.step(&shard, &objective)?);
    }
}

/// This rank's shard of an announced step and its objective; `None` when the leader stopped.
fn my_work(bytes: &[u8], strategy: &dyn Strategy) -> Result<Option<(TrainBatch, Objective)>> {
    let unreadable = |why: String| BackendError::InvalidInput(format!("the leader's step: {why}"));
    let command: Command = serde_json::from_slice(bytes).map_err(|e| unreadable(e.to_string()))?;
    let Command::Step {
        sequences,
        objective,
    } = command
    else {
        return Ok(None);
    };
    let batch = TrainBatch::new(sequences).map_err(|e| unreadable(e.to_string()))?;
    let rank = strategy.rank();
    let shard = shards(&batch, strategy)?
        .into_iter()
        .nth(rank)
        .ok_or_else(|| unreadable(format!("no shard for rank {rank}")))?;
    Ok(Some((shard, objective)))
}
