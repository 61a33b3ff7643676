//! Composable environment wrappers: each is a small [`Env`] around an inner one, adding one
//! episode rule (tower style), instead of a copy of the rule inside every environment.
//!
//! | wrapper | rule |
//! |---|---|
//! | [`StepLimit`] | the `n`-th step of an episode is returned [`Truncated`](roll_core::EnvStatus::Truncated) (ROLL's `max_steps`) |
//! | [`FormatPenalty`] | a step marked [invalid](roll_core::StepResult::with_action_valid) gets `penalty ≤ 0` added to its reward (ROLL's `format_penalty`) |
//! | [`EpisodeGuard`] | `step` before `reset` or after the episode ended is a named [`EnvError`] |
//! | [`CallTimeout`] | a `reset` or `step` that takes longer than a limit fails, and the environment is abandoned |
//!
//! An environment then only implements its task: it parses the action, answers an invalid one
//! with a no-op step marked `with_action_valid(false)`, and ends the episode when the task says
//! so. [`EnvExt`] chains the wrappers onto any environment; [`Episodic`] is the usual stack, which
//! every built-in environment wears:
//!
//! ```
//! use roll_core::testing::EchoEnv;
//! use roll_core::{Env, EnvStatus};
//! use roll_env::wrappers::EnvExt;
//!
//! let mut env = EchoEnv::new(100)
//!     .with_format_penalty(-0.5)?
//!     .with_step_limit(2)?
//!     .with_episode_guard("echo");
//! env.reset(7)?;
//! let r = env.step("")?; // invalid: EchoEnv's −0.1, plus the penalty
//! assert!((r.reward - (-0.6)).abs() < 1e-6);
//! assert_eq!(env.step("hi")?.status, EnvStatus::Truncated);
//! assert!(env.step("more").is_err()); // the episode is over
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Order matters only for the guard: put it outermost, so that it sees the status the agent
//! sees (a truncation by [`StepLimit`] included).

mod call_timeout;
mod episode_guard;
mod format_penalty;
mod step_limit;

pub use call_timeout::CallTimeout;
pub use episode_guard::EpisodeGuard;
pub use format_penalty::FormatPenalty;
pub use step_limit::StepLimit;

pub(crate) use format_penalty::check_penalty;
pub(crate) use step_limit::check_max_steps;

use crate::EnvError;
use roll_core::Env;
use std::sync::Arc;

/// The usual stack of episode rules: a format penalty, a step limit, and the guard outside them
/// (what [`EnvExt::episodic`] builds).
pub type Episodic<E> = EpisodeGuard<StepLimit<FormatPenalty<E>>>;

impl<E> Episodic<E> {
    /// The environment under the three wrappers.
    pub fn base(&self) -> &E {
        self.inner().inner().inner()
    }

    /// The environment under the three wrappers, mutably.
    pub fn base_mut(&mut self) -> &mut E {
        self.inner_mut().inner_mut().inner_mut()
    }
}

/// Chains the [wrappers](self) onto any environment.
pub trait EnvExt: Env + Sized {
    /// Truncates episodes after `max_steps` steps.
    ///
    /// # Errors
    /// If `max_steps` is 0.
    fn with_step_limit(self, max_steps: u32) -> Result<StepLimit<Self>, EnvError> {
        StepLimit::new(self, max_steps)
    }

    /// Adds `penalty` to the reward of steps marked invalid.
    ///
    /// # Errors
    /// If `penalty` is positive or not finite.
    fn with_format_penalty(self, penalty: f32) -> Result<FormatPenalty<Self>, EnvError> {
        FormatPenalty::new(self, penalty)
    }

    /// Makes stepping outside an episode an error naming `name`.
    fn with_episode_guard(self, name: impl Into<Arc<str>>) -> EpisodeGuard<Self> {
        EpisodeGuard::new(self, name)
    }

    /// All three, in the right order: `self.with_format_penalty(penalty)?
    /// .with_step_limit(max_steps)?.with_episode_guard(name)`.
    ///
    /// # Errors
    /// As [`with_step_limit`](Self::with_step_limit) and
    /// [`with_format_penalty`](Self::with_format_penalty).
    fn episodic(
        self,
        name: impl Into<Arc<str>>,
        max_steps: u32,
        penalty: f32,
    ) -> Result<Episodic<Self>, EnvError> {
        Ok(self
            .with_format_penalty(penalty)?
            .with_step_limit(max_steps)?
            .with_episode_guard(name))
    }

    /// Type-erases the environment.
    fn boxed(self) -> Box<dyn Env>
    where
        Self: 'static,
    {
        Box::new(self)
    }
}

impl<E: Env> EnvExt for E {}

#[cfg(test)]
pub(crate) mod test_support {
    use roll_core::{Env, Observation, StepResult};

    /// A scripted environment for the wrapper tests. Each step answers `"{action}#{n}"` (`n`
    /// counting from 1 after each reset) with reward 1 and info `step = n`; on step `end_at` it
    /// terminates with `end_reward` instead. The action `junk` is marked invalid, `mute` is not
    /// marked either way, anything else is marked valid; `fail` is an error, and so is a reset
    /// on seed 666.
    #[derive(Debug)]
    pub(crate) struct Script {
        end_at: Option<u32>,
        end_reward: f32,
        steps: u32,
    }

    impl Script {
        pub(crate) fn endless() -> Self {
            Self {
                end_at: None,
                end_reward: 0.0,
                steps: 0,
            }
        }

        pub(crate) fn terminating_at(step: u32, reward: f32) -> Self {
            Self {
                end_at: Some(step),
                end_reward: reward,
                steps: 0,
            }
        }

        /// Steps that reached the script since its last reset.
        pub(crate) fn steps(&self) -> u32 {
            self.steps
        }
    }

    impl Env for Script {
        fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
            if seed == 666 {
                return Err(roll_core::Error::env("cannot reset on seed 666"));
            }
            self.steps = 0;
            Ok(Observation::new(format!("reset {seed}")))
        }

        fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
            if action == "fail" {
                return Err(roll_core::Error::env("asked to fail"));
            }
            self.steps += 1;
            let text = format!("{action}#{}", self.steps);
            let step = if self.end_at == Some(self.steps) {
                StepResult::terminated(text, self.end_reward)
            } else {
                StepResult::running(text, 1.0)
            }
            .with_info("step", self.steps);
            Ok(match action {
                "junk" => step.with_action_valid(false),
                "mute" => step,
                _ => step.with_action_valid(true),
            })
        }
    }
}
