//! An environment that echoes the agent.

use crate::env::{Observation, StepResult};
use crate::{Env, Result};

/// Echoes each action back as the next observation. Reward 1 for a non-empty action, −0.1 (a
/// format penalty) for an empty one; the episode terminates when the action contains `stop` and is
/// truncated after `max_turns` steps. The seed appears in the first observation, so determinism
/// under a seed is visible.
#[derive(Debug, Clone)]
pub struct EchoEnv {
    max_turns: u32,
    turn: u32,
}

impl EchoEnv {
    /// An echo environment that truncates after `max_turns` steps.
    pub fn new(max_turns: u32) -> Self {
        Self { max_turns, turn: 0 }
    }
}

impl Env for EchoEnv {
    fn reset(&mut self, seed: u64) -> Result<Observation> {
        self.turn = 0;
        Ok(Observation::new(format!(
            "echo #{seed}: say something ({} turns)",
            self.max_turns
        )))
    }

    fn step(&mut self, action: &str) -> Result<StepResult> {
        self.turn += 1;
        let action = action.trim();
        let reward = if action.is_empty() { -0.1 } else { 1.0 };
        let step = if action.contains("stop") {
            StepResult::terminated(action, reward)
        } else if self.turn >= self.max_turns {
            StepResult::truncated(action, reward)
        } else {
            StepResult::running(action, reward)
        };
        Ok(step
            .with_action_valid(!action.is_empty())
            .with_info("turn", self.turn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EnvStatus;

    #[test]
    fn echoes_and_ends_on_stop_or_turn_limit() {
        let mut env = EchoEnv::new(2);
        assert!(env.reset(5).unwrap().text.contains("#5"));
        let r = env.step(" hi ").unwrap();
        assert_eq!((r.observation.as_str(), r.reward), ("hi", 1.0));
        assert_eq!(r.status, EnvStatus::Running);
        assert_eq!(
            (r.info["turn"].as_u64(), r.action_is_valid()),
            (Some(1), Some(true))
        );
        let r = env.step("").unwrap();
        assert!(r.is_truncated());
        assert_eq!((r.reward, r.action_is_valid()), (-0.1, Some(false)));
        env.reset(0).unwrap();
        assert!(env.step("please stop").unwrap().is_terminated());
    }
}
