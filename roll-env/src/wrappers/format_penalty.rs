//! [`FormatPenalty`]: a reward penalty for actions the environment could not use.

use crate::EnvError;
use crate::error::invalid_option;
use roll_core::{Env, Observation, StepResult};

/// Adds `penalty` (≤ 0) to the reward of every step whose action the environment marked invalid
/// with [`StepResult::with_action_valid(false)`](StepResult::with_action_valid) — an unparseable
/// action, or one not available in the current state. Valid steps, and steps of environments that
/// do not say, pass through unchanged, as do observation, status and info.
///
/// The environment only reports *that* an action was invalid (and answers it with a no-op step
/// and whatever reward its rules give a no-op: 0, or Sokoban's −0.1 per step); how much that
/// costs is configuration, so it lives here once instead of in every environment (ROLL's
/// `format_penalty`).
///
/// ```
/// use roll_core::testing::EchoEnv;
/// use roll_core::Env;
/// use roll_env::wrappers::EnvExt;
///
/// // EchoEnv gives −0.1 for an empty action and marks it invalid; 1 for anything else.
/// let mut env = EchoEnv::new(10).with_format_penalty(-0.5)?;
/// env.reset(0)?;
/// assert_eq!(env.step("hi")?.reward, 1.0);
/// assert!((env.step("")?.reward - (-0.6)).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct FormatPenalty<E> {
    inner: E,
    penalty: f32,
}

impl<E> FormatPenalty<E> {
    /// `inner`, with `penalty` added to the reward of invalid actions.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] (`format_penalty`) unless `penalty` is finite and ≤ 0: a
    /// positive one would reward the agent for not following the format.
    pub fn new(inner: E, penalty: f32) -> Result<Self, EnvError> {
        check_penalty(penalty)?;
        Ok(Self { inner, penalty })
    }

    /// The penalty.
    pub fn penalty(&self) -> f32 {
        self.penalty
    }

    /// The wrapped environment.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// The wrapped environment, mutably.
    pub fn inner_mut(&mut self) -> &mut E {
        &mut self.inner
    }

    /// Unwraps the environment.
    pub fn into_inner(self) -> E {
        self.inner
    }
}

/// A finite `penalty ≤ 0`, the check behind [`FormatPenalty::new`] and the environments' configs.
pub(crate) fn check_penalty(penalty: f32) -> Result<(), EnvError> {
    if !(penalty.is_finite() && penalty <= 0.0) {
        return invalid_option("format_penalty", penalty, "a finite number ≤ 0");
    }
    Ok(())
}

impl<E: Env> Env for FormatPenalty<E> {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.inner.reset(seed)
    }

    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        let mut result = self.inner.step(action)?;
        if result.action_is_valid() == Some(false) {
            result.reward += self.penalty;
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrappers::test_support::Script;
    use roll_core::EnvStatus;

    #[test]
    fn only_steps_marked_invalid_are_penalised() {
        // Script: reward 1 per step; "junk" is marked invalid, "mute" says nothing either way.
        let mut env = FormatPenalty::new(Script::endless(), -0.25).unwrap();
        env.reset(0).unwrap();
        let rewards: Vec<f32> = ["ok", "junk", "mute", "junk"]
            .iter()
            .map(|a| env.step(a).unwrap().reward)
            .collect();
        assert_eq!(rewards, [1.0, 0.75, 1.0, 0.75]);
    }

    #[test]
    fn everything_but_the_reward_passes_through() {
        let mut plain = Script::endless();
        let mut penalised = FormatPenalty::new(Script::endless(), -1.0).unwrap();
        assert_eq!(plain.reset(4).unwrap(), penalised.reset(4).unwrap());
        let (a, b) = (plain.step("junk").unwrap(), penalised.step("junk").unwrap());
        assert_eq!(
            (&a.observation, a.status, &a.info),
            (&b.observation, b.status, &b.info)
        );
        assert_eq!((a.reward, b.reward), (1.0, 0.0));
        assert_eq!(b.status, EnvStatus::Running);
    }

    #[test]
    fn positive_or_non_finite_penalties_are_refused() {
        for bad in [0.1, f32::NAN, f32::NEG_INFINITY] {
            let err = FormatPenalty::new(Script::endless(), bad)
                .unwrap_err()
                .to_string();
            assert!(err.contains("format_penalty"), "{err}");
        }
        assert!(FormatPenalty::new(Script::endless(), 0.0).is_ok());
    }
}
