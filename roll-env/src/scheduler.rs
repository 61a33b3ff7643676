//! [`AgenticScheduler`]: the environment manager behind roll-core's [`Scheduler`] trait.

use crate::{EnvError, EnvManager, EnvManagerConfig, EnvRegistry, registry::BUILTIN_KINDS};
use async_trait::async_trait;
use roll_core::config::{AgenticConfig, ComponentSpec};
use roll_core::scheduler::{GroupFilter, RolloutBatch, Scheduler, SchedulerState};
use roll_core::tokenizer::Tokenizer;
use roll_core::{Generate, WeightVersion};
use std::fmt;
use std::sync::Arc;

/// Rejected groups allowed per batch, per group the batch needs, unless
/// [`with_max_filtered`](AgenticScheduler::with_max_filtered) says otherwise (as DAPO's
/// `max_num_gen_batches = 10`: at most ten batches' worth of groups to fill one).
const DEFAULT_FILTER_BUDGET: u64 = 10;

/// Collects `num_groups` complete groups of trajectories per batch from an [`EnvManager`], so an
/// agentic pipeline uses it exactly as an RLVR pipeline uses the RLVR scheduler.
///
/// Synchronous by default: each [`next_batch`](Scheduler::next_batch) starts its groups, waits
/// for them and aborts what is left (ROLL's agentic rollout with `async_generation_ratio = 0`).
/// With [`EnvManagerConfig::max_staleness`] `k ≥ 1` the next batch's groups start as soon as a
/// batch is handed over and play while it trains; groups older than `k` weight versions are
/// replaced. A checkpoint then lists the open groups, and a restored scheduler starts them
/// again (same ids and seeds, current weights).
///
/// With [`with_filter`](Self::with_filter) (e.g. `algorithm.dynamic_filter`), a finished group
/// the filter rejects does not count: it is replaced by a new group on a new seed, as the RLVR
/// scheduler replaces a prompt.
pub struct AgenticScheduler {
    manager: EnvManager,
    num_groups: usize,
    filter: Option<Box<dyn GroupFilter>>,
    max_filtered: Option<u64>,
}

impl fmt::Debug for AgenticScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgenticScheduler")
            .field("manager", &self.manager)
            .field("num_groups", &self.num_groups)
            .field("filter", &self.filter.is_some())
            .field("max_filtered", &self.max_filtered())
            .finish()
    }
}

impl AgenticScheduler {
    /// A scheduler over `manager`, `num_groups` groups per batch.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] if `num_groups` is 0.
    pub fn new(manager: EnvManager, num_groups: usize) -> Result<Self, EnvError> {
        if num_groups == 0 {
            return Err(EnvError::InvalidOption {
                key: "num_groups",
                value: "0".into(),
                allowed: "an integer ≥ 1".into(),
            });
        }
        Ok(Self {
            manager,
            num_groups,
            filter: None,
            max_filtered: None,
        })
    }

    /// Drops finished groups that `filter` rejects, each replaced by a new group, counted in the
    /// batch's `groups_filtered`. Pass roll-algos' `DynamicFilter` (the configured
    /// `algorithm.dynamic_filter`) to keep only groups with a learning signal.
    #[must_use]
    pub fn with_filter(mut self, filter: impl GroupFilter + 'static) -> Self {
        self.filter = Some(Box::new(filter));
        self
    }

    /// How many groups the filter may reject while one batch is collected before
    /// [`next_batch`](Scheduler::next_batch) fails with [`EnvError::TooManyFiltered`] rather than
    /// play forever. Default: 10 × `num_groups`.
    #[must_use]
    pub fn with_max_filtered(mut self, max_filtered: u64) -> Self {
        self.max_filtered = Some(max_filtered);
        self
    }

    /// How many rejected groups one batch tolerates.
    pub fn max_filtered(&self) -> u64 {
        self.max_filtered
            .unwrap_or_else(|| DEFAULT_FILTER_BUDGET.saturating_mul(self.num_groups as u64))
    }

    /// The scheduler an `[agentic]` config section describes: the environment built from
    /// `registry`, groups and limits from the section, group and sampling seeds from `seed`.
    ///
    /// The section's `format_penalty` applies to built-in environments whose options do not set
    /// their own (ROLL's env-level `format_penalty` wins the same way).
    ///
    /// # Errors
    /// As [`EnvRegistry::factory`] and [`EnvManagerConfig::from_agentic`].
    pub fn from_config(
        agentic: &AgenticConfig,
        registry: &EnvRegistry,
        policy: Arc<dyn Generate>,
        tokenizer: Arc<dyn Tokenizer>,
        seed: u64,
    ) -> Result<Self, EnvError> {
        let spec = Self::env_spec(agentic);
        let factory = registry.factory(&spec)?;
        let config = EnvManagerConfig::from_agentic(agentic, seed)?;
        let manager = EnvManager::new(config, factory, policy, tokenizer)?;
        Self::new(manager, agentic.num_groups as usize)
    }

    /// The environment an `[agentic]` section plays: `agentic.env` with the section's
    /// `format_penalty` filled in for built-in environments whose options do not set their own
    /// (ROLL's env-level `format_penalty` wins the same way).
    pub fn env_spec(agentic: &AgenticConfig) -> ComponentSpec {
        with_default_penalty(&agentic.env, agentic.format_penalty)
    }

    /// The manager (incidents, totals, watchdog).
    pub fn manager(&self) -> &EnvManager {
        &self.manager
    }

    /// Groups per batch.
    pub fn num_groups(&self) -> usize {
        self.num_groups
    }
}

fn with_default_penalty(spec: &ComponentSpec, penalty: f64) -> ComponentSpec {
    let mut spec = spec.clone();
    if penalty != 0.0 && BUILTIN_KINDS.contains(&spec.kind.as_str()) {
        spec.options
            .entry("format_penalty".into())
            .or_insert_with(|| penalty.into());
    }
    spec
}

#[async_trait]
impl Scheduler for AgenticScheduler {
    async fn next_batch(&mut self, _current: WeightVersion) -> roll_core::Result<RolloutBatch> {
        let max_filtered = self.max_filtered();
        let batch = match &self.filter {
            None => self.manager.collect(self.num_groups).await?,
            Some(filter) => {
                self.manager
                    .collect_filtered(self.num_groups, &**filter, max_filtered)
                    .await?
            }
        };
        Ok(batch)
    }

    /// The manager's position: groups started so far (each one seed), the next sample id.
    /// Nothing is pending between synchronous batches.
    fn save_state(&self) -> roll_core::Result<SchedulerState> {
        let (next_group, next_sample) = self.manager.position();
        Ok(SchedulerState {
            prompts_drawn: next_group,
            pending: Vec::new(),
            next_group,
            next_sample,
            open_groups: self.manager.open_groups().iter().map(|g| g.0).collect(),
        })
    }

    fn restore_state(&mut self, state: SchedulerState) -> roll_core::Result<()> {
        if !state.pending.is_empty() || state.prompts_drawn != state.next_group {
            return Err(roll_core::Error::invalid_data(
                "checkpoint",
                format!(
                    "an agentic scheduler's state has no pending prompts and one group per \
                     seed drawn; this one has {} pending and {} drawn for {} groups (saved by \
                     another scheduler?)",
                    state.pending.len(),
                    state.prompts_drawn,
                    state.next_group
                ),
            ));
        }
        self.manager
            .resume_at((state.next_group, state.next_sample))?;
        let open: Vec<roll_core::GroupId> = state
            .open_groups
            .iter()
            .copied()
            .map(roll_core::GroupId)
            .collect();
        Ok(self.manager.reopen(&open)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_penalty_fills_in_for_builtins_only() {
        let spec = with_default_penalty(&ComponentSpec::new("sokoban"), -0.15);
        assert_eq!(spec.options["format_penalty"], -0.15);
        let own = ComponentSpec::new("sokoban").with_option("format_penalty", -0.5);
        assert_eq!(
            with_default_penalty(&own, -0.15).options["format_penalty"],
            -0.5
        );
        assert!(
            with_default_penalty(&ComponentSpec::new("mine"), -0.15)
                .options
                .is_empty()
        );
    }
}
