//! [`AgenticScheduler`]: the environment manager behind roll-core's [`Scheduler`] trait.

use crate::{EnvError, EnvManager, EnvManagerConfig, EnvRegistry, registry::BUILTIN_KINDS};
use async_trait::async_trait;
use roll_core::{Generate, WeightVersion};
use roll_core::config::{AgenticConfig, ComponentSpec};
use roll_core::scheduler::{RolloutBatch, Scheduler};
use roll_core::tokenizer::Tokenizer;
use std::sync::Arc;

/// Collects `num_groups` complete groups of trajectories per batch from an [`EnvManager`], so an
/// agentic pipeline uses it exactly as an RLVR pipeline uses the RLVR scheduler.
///
/// Synchronous: each [`next_batch`](Scheduler::next_batch) starts its groups, waits for them and
/// aborts what is left (ROLL's agentic rollout with `async_generation_ratio = 0`).
#[derive(Debug)]
pub struct AgenticScheduler {
    manager: EnvManager,
    num_groups: usize,
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
        })
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
        Ok(self.manager.collect(self.num_groups).await?)
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
