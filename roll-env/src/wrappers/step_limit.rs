//! [`StepLimit`]: truncate an episode after a number of steps.

use crate::EnvError;
use crate::error::invalid_option;
use roll_core::{Env, EnvStatus, Observation, StepResult};

/// Truncates episodes after `max_steps` steps: the step that uses up the budget is returned with
/// status [`EnvStatus::Truncated`] unless the environment already ended the episode itself (a
/// terminal state on the last step stays [`Terminated`](EnvStatus::Terminated)). Every step
/// counts, invalid actions included (ROLL's `max_steps`). Observation, reward and info pass
/// through unchanged.
///
/// The counter restarts at every reset. A failed step does not count.
///
/// ```
/// use roll_core::testing::EchoEnv;
/// use roll_core::{Env, EnvStatus};
/// use roll_env::wrappers::EnvExt;
///
/// let mut env = EchoEnv::new(100).with_step_limit(2)?;
/// env.reset(0)?;
/// assert_eq!(env.step("a")?.status, EnvStatus::Running);
/// assert_eq!(env.step("b")?.status, EnvStatus::Truncated);
/// assert_eq!(env.remaining(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct StepLimit<E> {
    inner: E,
    max_steps: u32,
    steps: u32,
}

impl<E> StepLimit<E> {
    /// `inner`, truncated after `max_steps` steps.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] (`max_steps`) if `max_steps` is 0: no episode could be played.
    pub fn new(inner: E, max_steps: u32) -> Result<Self, EnvError> {
        check_max_steps(max_steps)?;
        Ok(Self {
            inner,
            max_steps,
            steps: 0,
        })
    }

    /// The step budget of an episode.
    pub fn max_steps(&self) -> u32 {
        self.max_steps
    }

    /// Steps taken since the last reset.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// Steps left in this episode.
    pub fn remaining(&self) -> u32 {
        self.max_steps.saturating_sub(self.steps)
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

/// `max_steps ≥ 1`, the check behind [`StepLimit::new`] and the environments' configs.
pub(crate) fn check_max_steps(max_steps: u32) -> Result<(), EnvError> {
    if max_steps == 0 {
        return invalid_option("max_steps", 0, "an integer ≥ 1");
    }
    Ok(())
}

impl<E: Env> Env for StepLimit<E> {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.steps = 0;
        self.inner.reset(seed)
    }

    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        let mut result = self.inner.step(action)?;
        self.steps = self.steps.saturating_add(1);
        if result.status == EnvStatus::Running && self.steps >= self.max_steps {
            result.status = EnvStatus::Truncated;
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrappers::test_support::Script;

    #[test]
    fn truncates_the_nth_running_step_and_counts_from_each_reset() {
        // The inner env never ends on its own.
        let mut env = StepLimit::new(Script::endless(), 3).unwrap();
        env.reset(0).unwrap();
        let statuses: Vec<EnvStatus> = (0..3).map(|_| env.step("x").unwrap().status).collect();
        assert_eq!(
            statuses,
            [EnvStatus::Running, EnvStatus::Running, EnvStatus::Truncated]
        );
        assert_eq!((env.steps(), env.remaining()), (3, 0));
        env.reset(1).unwrap();
        assert_eq!((env.steps(), env.remaining()), (0, 3));
        assert_eq!(env.step("x").unwrap().status, EnvStatus::Running);
    }

    #[test]
    fn a_terminal_last_step_stays_terminated_and_the_rest_passes_through() {
        // Step 2 terminates (reward 5); the limit is also 2.
        let mut env = StepLimit::new(Script::terminating_at(2, 5.0), 2).unwrap();
        env.reset(0).unwrap();
        let first = env.step("a").unwrap();
        assert_eq!(
            (first.observation.as_str(), first.reward, first.status),
            ("a#1", 1.0, EnvStatus::Running)
        );
        let last = env.step("b").unwrap();
        assert_eq!((last.reward, last.status), (5.0, EnvStatus::Terminated));
        assert_eq!(last.info["step"], 2);
    }

    #[test]
    fn a_limit_of_one_truncates_the_first_step_and_zero_is_refused() {
        let mut env = StepLimit::new(Script::endless(), 1).unwrap();
        env.reset(0).unwrap();
        assert_eq!(env.step("x").unwrap().status, EnvStatus::Truncated);
        let err = StepLimit::new(Script::endless(), 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_steps"), "{err}");
    }

    #[test]
    fn failed_steps_do_not_count() {
        let mut env = StepLimit::new(Script::endless(), 2).unwrap();
        env.reset(0).unwrap();
        assert!(env.step("fail").is_err());
        assert_eq!(env.steps(), 0);
        assert_eq!(env.step("x").unwrap().status, EnvStatus::Running);
        assert_eq!(env.step("x").unwrap().status, EnvStatus::Truncated);
    }
}
