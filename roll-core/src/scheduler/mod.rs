//! The [`Scheduler`] trait and the RLVR scheduler.
//!
//! A scheduler turns prompts (or environments) into finished, rewarded groups and hands them to the
//! pipeline. How it does so — all at once or sample by sample, synchronously or running ahead of
//! training — is its own business; the pipeline only calls [`Scheduler::next_batch`].

mod filter;
mod rlvr;
mod seed;

pub use filter::GroupFilter;
pub use rlvr::{RlvrScheduler, RlvrSchedulerConfig};
pub use seed::sample_seed;

use crate::{Group, Result, WeightVersion};
use async_trait::async_trait;

/// Counts of what happened while a batch was collected, for metrics and for the user to see
/// where rollout time went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RolloutStats {
    /// Prompts started.
    pub prompts_started: u64,
    /// Samples whose generation finished (stop or length).
    pub samples_finished: u64,
    /// Samples aborted or discarded because the batch was full (synchronous mode), including
    /// finished samples of groups that could not complete.
    pub samples_aborted: u64,
    /// Samples discarded after generating at least one token: aborted mid-generation, or
    /// finished in a group that could not be used. The wasted part of `samples_aborted`.
    pub samples_wasted: u64,
    /// Prompts whose groups were aborted when the batch closed and that start again next step.
    pub prompts_requeued: u64,
    /// Samples dropped because their reward worker (or environment) failed.
    pub samples_failed: u64,
    /// Groups dropped by the dynamic filter (no learning signal).
    pub groups_filtered: u64,
    /// Samples of those groups.
    pub samples_filtered: u64,
    /// Groups dropped because their data was older than the staleness bound allows.
    pub groups_stale: u64,
    /// Largest staleness (in weight versions) among the returned samples.
    pub max_staleness: u64,
    /// Sum of staleness over returned samples (divide by their count for the mean).
    pub total_staleness: u64,
}

impl RolloutStats {
    /// Records how many weight versions each sample of `groups` lags behind `current` (the oldest
    /// turn counts), into `max_staleness` and `total_staleness`.
    pub fn record_staleness(&mut self, groups: &[Group], current: WeightVersion) {
        for s in groups.iter().flat_map(Group::samples) {
            if let Ok(v) = s.weight_version() {
                let lag = v.staleness(current);
                self.max_staleness = self.max_staleness.max(lag);
                self.total_staleness += lag;
            }
        }
    }
}

/// Rewarded groups ready for training.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutBatch {
    /// The groups, each with at least one rewarded sample.
    pub groups: Vec<Group>,
    /// What happened while collecting them.
    pub stats: RolloutStats,
}

impl RolloutBatch {
    /// Number of samples over all groups.
    pub fn num_samples(&self) -> usize {
        self.groups.iter().map(Group::len).sum()
    }
}

/// Turns prompts (or environments) into finished, rewarded groups.
///
/// # Example
/// A scheduler that replays fixed groups (real ones drive a [`Policy`](crate::Policy)):
/// ```
/// use async_trait::async_trait;
/// use roll_core::scheduler::{RolloutBatch, RolloutStats, Scheduler};
/// use roll_core::WeightVersion;
///
/// struct Replay(Vec<RolloutBatch>);
///
/// #[async_trait]
/// impl Scheduler for Replay {
///     async fn next_batch(&mut self, _current: WeightVersion) -> roll_core::Result<RolloutBatch> {
///         self.0.pop().ok_or(roll_core::Error::Closed("replay scheduler"))
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let mut s = Replay(vec![RolloutBatch { groups: vec![], stats: RolloutStats::default() }]);
/// assert_eq!(s.next_batch(WeightVersion(0)).await.unwrap().num_samples(), 0);
/// assert!(s.next_batch(WeightVersion(0)).await.is_err());
/// # });
/// ```
#[async_trait]
pub trait Scheduler: Send {
    /// Collects the next batch for training. `current` is the weight version the actor trains
    /// from now on: the pipeline says it, so the scheduler needs no back channel to the trainer to
    /// measure staleness.
    ///
    /// # Errors
    /// If the prompt source is exhausted before a batch is complete, or the policy fails as a
    /// whole (individual sample failures are counted in [`RolloutStats`], not returned).
    async fn next_batch(&mut self, current: WeightVersion) -> Result<RolloutBatch>;
}
