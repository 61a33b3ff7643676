//! The [`Env`] trait: text environments for multi-turn agents.

use crate::Result;
use std::collections::BTreeMap;

/// Free-form diagnostics an environment attaches to a reset or a step (metrics, the parsed action,
/// whether the action was valid, ...).
pub type Info = BTreeMap<String, serde_json::Value>;

/// What the agent sees after a reset.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    /// The text shown to the model: the environment formats its own prompt (instructions, state,
    /// actions left).
    pub text: String,
    /// Diagnostics.
    pub info: Info,
}

impl Observation {
    /// An observation with text only.
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            info: Info::new(),
        }
    }
}

/// Whether an episode goes on after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EnvStatus {
    /// The episode continues.
    Running,
    /// The episode reached a terminal state of the task (solved, or failed for good).
    Terminated,
    /// The episode was cut short (step limit) without reaching a terminal state.
    Truncated,
}

/// The info key under which an environment says whether the agent's action was valid
/// (ROLL's `action_is_valid` metric). Set it with [`StepResult::with_action_valid`], read it with
/// [`StepResult::action_is_valid`]: wrappers such as roll-env's `FormatPenalty` react to it, so an
/// environment reports an unparseable action once and the penalty lives in one place.
pub const ACTION_IS_VALID: &str = "action_is_valid";

/// The result of one step: gym's `(observation, reward, terminated, truncated, info)`, with the two
/// flags folded into one [`EnvStatus`] so that "terminated and truncated" cannot be expressed.
///
/// Built with [`running`](Self::running), [`terminated`](Self::terminated) or
/// [`truncated`](Self::truncated) (the status the constructor is named after) and
/// [`with_info`](Self::with_info); read with [`is_running`](Self::is_running),
/// [`is_terminated`](Self::is_terminated), [`is_truncated`](Self::is_truncated) and
/// [`is_done`](Self::is_done).
///
/// ```
/// use roll_core::{EnvStatus, StepResult};
///
/// let r = StepResult::terminated("solved", 1.0).with_info("moves", 7);
/// assert_eq!((r.status, r.reward), (EnvStatus::Terminated, 1.0));
/// assert!(r.is_terminated() && r.is_done() && !r.is_truncated());
/// assert_eq!(r.info["moves"], 7);
///
/// let r = StepResult::running("what?", 0.0).with_action_valid(false);
/// assert_eq!(r.action_is_valid(), Some(false));
/// assert_eq!(StepResult::running("ok", 0.0).action_is_valid(), None);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// What the agent sees next.
    pub observation: String,
    /// The step's reward.
    pub reward: f32,
    /// Whether the episode continues.
    pub status: EnvStatus,
    /// Diagnostics.
    pub info: Info,
}

impl StepResult {
    /// A step with this status and no info.
    pub fn new(observation: impl Into<String>, reward: f32, status: EnvStatus) -> Self {
        Self {
            observation: observation.into(),
            reward,
            status,
            info: Info::new(),
        }
    }

    /// A step after which the episode continues.
    pub fn running(observation: impl Into<String>, reward: f32) -> Self {
        Self::new(observation, reward, EnvStatus::Running)
    }

    /// A step that reached a terminal state of the task.
    pub fn terminated(observation: impl Into<String>, reward: f32) -> Self {
        Self::new(observation, reward, EnvStatus::Terminated)
    }

    /// A step after which the episode is cut short without reaching a terminal state.
    pub fn truncated(observation: impl Into<String>, reward: f32) -> Self {
        Self::new(observation, reward, EnvStatus::Truncated)
    }

    /// Adds (or replaces) one info entry.
    #[must_use]
    pub fn with_info(
        mut self,
        key: impl Into<String>,
        value: impl Into<serde_json::Value>,
    ) -> Self {
        self.info.insert(key.into(), value.into());
        self
    }

    /// Records whether the agent's action was valid (info key [`ACTION_IS_VALID`]).
    #[must_use]
    pub fn with_action_valid(self, valid: bool) -> Self {
        self.with_info(ACTION_IS_VALID, valid)
    }

    /// Whether the agent's action was valid, if the environment said
    /// (info key [`ACTION_IS_VALID`] holding a boolean).
    pub fn action_is_valid(&self) -> Option<bool> {
        self.info
            .get(ACTION_IS_VALID)
            .and_then(serde_json::Value::as_bool)
    }

    /// Whether the episode continues.
    pub fn is_running(&self) -> bool {
        self.status == EnvStatus::Running
    }

    /// Whether the episode reached a terminal state.
    pub fn is_terminated(&self) -> bool {
        self.status == EnvStatus::Terminated
    }

    /// Whether the episode was cut short.
    pub fn is_truncated(&self) -> bool {
        self.status == EnvStatus::Truncated
    }

    /// Whether the episode is over, either way.
    pub fn is_done(&self) -> bool {
        self.status != EnvStatus::Running
    }
}

/// A text environment an LLM agent can play: text in, text out, deterministic under a seed.
///
/// The environment parses actions leniently and answers an unparseable action with a no-op step
/// marked [`with_action_valid(false)`](StepResult::with_action_valid) (which a format-penalty
/// wrapper turns into a penalty) rather than an error: errors are for the environment itself
/// breaking, and the environment manager restarts a broken environment and drops only its
/// trajectory.
///
/// Environments are driven from one thread at a time (`&mut self`), possibly different threads
/// over their life, hence `Send`.
///
/// # Example
/// ```
/// use roll_core::{Env, Observation, StepResult};
///
/// /// Guess the number; the seed picks it.
/// struct Guess { target: u64, tries: u32 }
///
/// impl Env for Guess {
///     fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
///         self.target = seed % 10;
///         self.tries = 0;
///         Ok(Observation::new("Guess a digit. Answer with one digit."))
///     }
///     fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
///         self.tries += 1;
///         let guess = action.trim().parse::<u64>().ok();
///         Ok(match guess {
///             Some(g) if g == self.target => StepResult::terminated("correct", 1.0),
///             _ if self.tries >= 3 => StepResult::truncated("out of tries", 0.0),
///             Some(g) if g < self.target => StepResult::running("higher", 0.0),
///             Some(_) => StepResult::running("lower", 0.0),
///             None => StepResult::running("say one digit", -0.1).with_action_valid(false),
///         })
///     }
/// }
///
/// let mut env = Guess { target: 0, tries: 0 };
/// env.reset(7).unwrap();
/// assert_eq!(env.step("3").unwrap().observation, "higher");
/// assert!(env.step("7").unwrap().is_terminated());
/// ```
pub trait Env: Send {
    /// Starts a new episode; the same seed gives the same episode.
    ///
    /// # Errors
    /// If the environment itself fails (not for anything the agent does).
    fn reset(&mut self, seed: u64) -> Result<Observation>;

    /// Applies the agent's action (its raw text).
    ///
    /// # Errors
    /// If the environment itself fails; an invalid action is a penalised no-op, not an error.
    fn step(&mut self, action: &str) -> Result<StepResult>;
}

/// A boxed environment is an environment, so generic code (wrappers, factories) takes
/// `Box<dyn Env>` as readily as a concrete type.
impl<E: Env + ?Sized> Env for Box<E> {
    fn reset(&mut self, seed: u64) -> Result<Observation> {
        (**self).reset(seed)
    }

    fn step(&mut self, action: &str) -> Result<StepResult> {
        (**self).step(action)
    }
}
