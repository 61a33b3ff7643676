//! `[agentic]`: the environments of a multi-turn agentic run.

use serde::{Deserialize, Serialize};

use super::check::Checker;
use super::component::ComponentSpec;
use crate::Result;

/// `[agentic]`: which environment the actor plays and how episodes are grouped. Required when
/// `pipeline = "agentic"`. ROLL: `train_env_manager` (`EnvManagerConfig`) and the env's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgenticConfig {
    /// The environment, by registered name (e.g. `sokoban`, `frozen_lake`), with its options.
    /// Required. ROLL: `custom_envs.<tag>.env_type` and `env_config`.
    pub env: ComponentSpec,
    /// Environment groups per step; each group plays one seed. Default `8`.
    /// ROLL: `num_env_groups` (ROLL default 128).
    #[serde(default = "default_num_groups")]
    pub num_groups: u32,
    /// Episodes per group: trajectories on the same seed, compared against each other.
    /// Default `8`. ROLL: `group_size` (ROLL default 1).
    #[serde(default = "default_group_size")]
    pub group_size: u32,
    /// Extra episodes started per group; the group completes with its first `group_size`
    /// finished episodes, so slow or failed environments do not stall it. Default `0`.
    /// ROLL: `group_size_redundancy`.
    #[serde(default)]
    pub group_size_redundancy: u32,
    /// Most actions per episode, in turns; the episode is truncated after it. Default `10`.
    /// ROLL: `max_actions_per_traj`.
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// Most tokens the actor generates per turn, in tokens. Default `128`.
    /// ROLL: `max_tokens_per_step`.
    #[serde(default = "default_max_tokens_per_turn")]
    pub max_tokens_per_turn: u32,
    /// Longest an environment step may take, in seconds (> 0); a step that takes longer fails
    /// its episode, not the run. Default `30.0`.
    #[serde(default = "default_step_timeout")]
    pub step_timeout: f64,
    /// The watchdog's bound, in seconds (> 0): an episode that makes no progress (no reset,
    /// step or generation finished) for this long is named in the log — environment, thread,
    /// episode, what it is waiting on and for how long — once per wait, and counted in
    /// `rollout/calls_overdue`. A stuck step is also cut at `step_timeout`; a stuck generation
    /// is only reported. Default `60.0`. ROLL: `env_monitor.hung_timeout`.
    #[serde(default = "default_hung_timeout")]
    pub hung_timeout: f64,
    /// Reward given for an action the environment cannot parse (<= 0). Default `0.0`.
    /// ROLL: `format_penalty` (ROLL examples: sokoban −0.15, frozen lake −0.01).
    #[serde(default)]
    pub format_penalty: f64,
}

fn default_num_groups() -> u32 {
    8
}
fn default_group_size() -> u32 {
    8
}
fn default_max_turns() -> u32 {
    10
}
fn default_max_tokens_per_turn() -> u32 {
    128
}
fn default_step_timeout() -> f64 {
    30.0
}
fn default_hung_timeout() -> f64 {
    60.0
}

impl AgenticConfig {
    /// Settings for playing `env`, every other key at its default.
    pub fn new(env: ComponentSpec) -> Self {
        Self {
            env,
            num_groups: default_num_groups(),
            group_size: default_group_size(),
            group_size_redundancy: 0,
            max_turns: default_max_turns(),
            max_tokens_per_turn: default_max_tokens_per_turn(),
            step_timeout: default_step_timeout(),
            hung_timeout: default_hung_timeout(),
            format_penalty: 0.0,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let c = Checker::new("agentic");
        self.env.validate(&c.key("env"))?;
        c.at_least("num_groups", self.num_groups.into(), 1)?;
        c.at_least("group_size", self.group_size.into(), 1)?;
        c.at_least("max_turns", self.max_turns.into(), 1)?;
        c.at_least("max_tokens_per_turn", self.max_tokens_per_turn.into(), 1)?;
        c.positive("step_timeout", self.step_timeout)?;
        c.positive("hung_timeout", self.hung_timeout)?;
        c.require(
            self.format_penalty.is_finite() && self.format_penalty <= 0.0,
            "format_penalty",
            self.format_penalty,
            "a finite number <= 0",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert!(
            AgenticConfig::new(ComponentSpec::new("sokoban"))
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn a_positive_penalty_is_rejected() {
        let mut a = AgenticConfig::new(ComponentSpec::new("sokoban"));
        a.format_penalty = 0.1;
        let err = a.validate().expect_err("penalty").to_string();
        assert!(err.contains("agentic.format_penalty"), "{err}");
    }
}
