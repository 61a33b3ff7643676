//! [`EpisodeGuard`]: stepping outside an episode is an error, not undefined behaviour.

use crate::EnvError;
use roll_core::{Env, EnvStatus, Observation, StepResult};
use std::sync::Arc;

/// Where the guarded environment is in its episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    NotReset,
    Running,
    /// Ended, and why (for the error message).
    Ended(&'static str),
}

/// Refuses `step` before the first `reset` ([`EnvError::NotReset`]) and after the episode ended
/// ([`EnvError::EpisodeOver`]) — terminated or truncated, or broken by a failed step or reset —
/// until the next successful `reset`. The inner environment is not called then, so its rules
/// never have to consider a step that cannot happen.
///
/// Put it outside the wrappers that change the status ([`StepLimit`](super::StepLimit)), so that
/// it sees the status the agent sees.
///
/// ```
/// use roll_core::testing::EchoEnv;
/// use roll_core::Env;
/// use roll_env::wrappers::EnvExt;
///
/// let mut env = EchoEnv::new(5).with_episode_guard("echo");
/// assert!(env.step("hi").unwrap_err().to_string().contains("before reset"));
/// env.reset(0)?;
/// env.step("stop")?; // EchoEnv terminates on "stop"
/// assert!(env.step("hi").unwrap_err().to_string().contains("terminated"));
/// env.reset(1)?;
/// assert!(env.step("hi").is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct EpisodeGuard<E> {
    inner: E,
    name: Arc<str>,
    state: State,
}

impl<E> EpisodeGuard<E> {
    /// Guards `inner`; `name` (the environment kind) goes into the errors.
    pub fn new(inner: E, name: impl Into<Arc<str>>) -> Self {
        Self {
            inner,
            name: name.into(),
            state: State::NotReset,
        }
    }

    /// Whether an episode is under way (reset, and not ended).
    pub fn is_running(&self) -> bool {
        self.state == State::Running
    }

    /// The name used in errors.
    pub fn name(&self) -> &str {
        &self.name
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

impl<E: Env> Env for EpisodeGuard<E> {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        let result = self.inner.reset(seed);
        self.state = match &result {
            Ok(_) => State::Running,
            Err(_) => State::Ended("its reset failed"),
        };
        result
    }

    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        match self.state {
            State::Running => {}
            State::NotReset => {
                return Err(EnvError::NotReset {
                    env: self.name.to_string(),
                }
                .into());
            }
            State::Ended(why) => {
                return Err(EnvError::EpisodeOver {
                    env: self.name.to_string(),
                    why,
                }
                .into());
            }
        }
        let result = self.inner.step(action);
        self.state = match &result {
            // A failed step may have left the inner state half-updated.
            Err(_) => State::Ended("a step failed"),
            Ok(r) => match r.status {
                EnvStatus::Running => State::Running,
                EnvStatus::Terminated => State::Ended("it terminated"),
                EnvStatus::Truncated => State::Ended("it was truncated"),
            },
        };
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrappers::test_support::Script;

    fn env_error(e: roll_core::Error) -> String {
        match e {
            roll_core::Error::Env(inner) => match inner.downcast::<EnvError>() {
                Ok(e) => format!("{e:?}"),
                Err(other) => panic!("not an EnvError: {other}"),
            },
            other => panic!("not an env error: {other}"),
        }
    }

    #[test]
    fn a_step_before_the_first_reset_is_named_and_does_not_reach_the_env() {
        let mut env = EpisodeGuard::new(Script::endless(), "script");
        let err = env_error(env.step("x").unwrap_err());
        assert!(err.contains("NotReset") && err.contains("script"), "{err}");
        assert_eq!(env.inner().steps(), 0);
    }

    #[test]
    fn the_sequence_reset_step_end_step_reset_step() {
        // Terminates on step 2.
        let mut env = EpisodeGuard::new(Script::terminating_at(2, 1.0), "script");
        env.reset(0).unwrap();
        assert!(env.is_running());
        assert!(env.step("a").unwrap().status == EnvStatus::Running);
        assert!(env.step("b").unwrap().status == EnvStatus::Terminated);
        assert!(!env.is_running());
        let err = env.step("c").unwrap_err().to_string();
        assert!(
            err.contains("`script`") && err.contains("it terminated"),
            "{err}"
        );
        assert_eq!(
            env.inner().steps(),
            2,
            "the refused step never reached the env"
        );
        env.reset(1).unwrap();
        assert_eq!(env.step("d").unwrap().observation, "d#1");
    }

    #[test]
    fn truncation_from_an_inner_wrapper_ends_the_episode() {
        let limited = crate::wrappers::StepLimit::new(Script::endless(), 1).unwrap();
        let mut env = EpisodeGuard::new(limited, "script");
        env.reset(0).unwrap();
        assert_eq!(env.step("a").unwrap().status, EnvStatus::Truncated);
        let err = env_error(env.step("b").unwrap_err());
        assert!(
            err.contains("EpisodeOver") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn a_failed_step_or_reset_ends_the_episode_until_a_good_reset() {
        let mut env = EpisodeGuard::new(Script::endless(), "script");
        env.reset(0).unwrap();
        assert!(env.step("fail").is_err());
        let err = env.step("x").unwrap_err().to_string();
        assert!(err.contains("a step failed"), "{err}");
        // Script fails to reset on seed 666.
        assert!(env.reset(666).is_err());
        let err = env.step("x").unwrap_err().to_string();
        assert!(err.contains("reset failed"), "{err}");
        env.reset(0).unwrap();
        assert!(env.step("x").is_ok());
    }
}
