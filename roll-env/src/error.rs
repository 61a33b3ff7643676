//! [`EnvError`]: everything that can go wrong in roll-env.

use roll_core::BoxError;
use std::time::Duration;

/// The error type of roll-env: building environments from config, generating levels, and running
/// them in the [`EnvManager`](crate::EnvManager).
///
/// Nothing an agent does is an error — an unparseable action is a penalised no-op step. These
/// errors are about configuration and about environments breaking.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// No environment is registered under this name.
    #[error("unknown environment kind `{kind}`; registered kinds: {}", known.join(", "))]
    UnknownKind {
        /// The requested name.
        kind: String,
        /// The registered names.
        known: Vec<String>,
    },
    /// The options of an environment could not be read into its config (an unknown key, a value
    /// of the wrong type). The message names the key.
    #[error("invalid options for environment `{kind}`: {message}")]
    InvalidOptions {
        /// The environment kind.
        kind: String,
        /// What serde said, e.g. ``unknown field `siez`, expected one of `size`, `p`, ...``.
        message: String,
    },
    /// An option with a value outside what the environment allows.
    #[error("environment option `{key}` has an invalid value {value}; allowed: {allowed}")]
    InvalidOption {
        /// The option's name, e.g. `dim_room`.
        key: &'static str,
        /// The value that was given.
        value: String,
        /// What would have been accepted.
        allowed: String,
    },
    /// A level could not be generated for a seed.
    #[error("cannot generate a level for seed {seed}: {reason}")]
    Generation {
        /// The seed.
        seed: u64,
        /// Why.
        reason: String,
    },
    /// `step` was called before the first `reset` (see
    /// [`EpisodeGuard`](crate::wrappers::EpisodeGuard)).
    #[error("environment `{env}` was stepped before reset")]
    NotReset {
        /// The environment kind.
        env: String,
    },
    /// `step` was called after the episode ended and before the next `reset` (see
    /// [`EpisodeGuard`](crate::wrappers::EpisodeGuard)).
    #[error("environment `{env}` was stepped after its episode ended ({why}); reset it first")]
    EpisodeOver {
        /// The environment kind.
        env: String,
        /// How the episode ended: `it terminated`, `it was truncated`, `a step failed`, `its
        /// reset failed`.
        why: &'static str,
    },
    /// An environment panicked; its episode was dropped and the environment rebuilt.
    #[error("environment `{kind}` panicked: {message}")]
    Panicked {
        /// The environment kind.
        kind: String,
        /// The panic payload, if it was a string.
        message: String,
    },
    /// An environment's reset or step took longer than the step timeout; its thread was abandoned
    /// and the environment rebuilt.
    #[error("environment `{kind}` did not finish a {phase} within {after:?}")]
    StepTimeout {
        /// The environment kind.
        kind: String,
        /// What it was doing (`reset`, `step`, `construction`).
        phase: &'static str,
        /// The limit.
        after: Duration,
    },
    /// Too many episodes failed in a row; the manager gives up rather than spin.
    #[error("{failures} episodes of `{kind}` failed in a row; last error: {last}")]
    TooManyFailures {
        /// The environment kind.
        kind: String,
        /// Consecutive failures.
        failures: u64,
        /// The last failure.
        last: String,
    },
    /// The group filter rejected more groups than a batch allows (see
    /// [`AgenticScheduler::with_filter`](crate::AgenticScheduler::with_filter)): the task is
    /// probably too hard or too easy for the policy to give any group a learning signal.
    #[error(
        "the group filter rejected {rejected} groups of `{kind}` while collecting {wanted} (at most {allowed} allowed){}",
        .last_error.as_ref().map(|e| format!("; last filter error: {e}")).unwrap_or_default()
    )]
    TooManyFiltered {
        /// The environment kind.
        kind: String,
        /// Groups rejected in this batch.
        rejected: u64,
        /// The most that may be rejected per batch.
        allowed: u64,
        /// Groups the batch needs.
        wanted: usize,
        /// The last error the filter returned (an error counts as a rejection), if any.
        last_error: Option<String>,
    },
    /// The environment manager needs a tokio runtime to drive the policy from its threads.
    #[error("the environment manager must run inside a tokio runtime")]
    NoRuntime,
    /// Finished episodes did not form a valid group (a bug: they are built to).
    #[error("episodes did not form a valid group: {0}")]
    Episode(#[source] roll_core::Error),
    /// The environment manager's event channel closed (it cannot while the manager lives).
    #[error("the environment manager's event channel closed")]
    Closed,
    /// An OS thread could not be started.
    #[error("cannot start an environment thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// A code sandbox used as a tool failed (not the code inside it).
    #[error("code sandbox failed: {0}")]
    Sandbox(#[source] BoxError),
}

impl From<EnvError> for roll_core::Error {
    fn from(e: EnvError) -> Self {
        roll_core::Error::Env(Box::new(e))
    }
}

/// `Err(EnvError::InvalidOption)` for option `key`.
pub(crate) fn invalid_option<T>(
    key: &'static str,
    value: impl ToString,
    allowed: &str,
) -> Result<T, EnvError> {
    Err(EnvError::InvalidOption {
        key,
        value: value.to_string(),
        allowed: allowed.into(),
    })
}

/// Checks the options every environment has, as the wrappers that apply them do:
/// `max_steps ≥ 1` ([`StepLimit`](crate::wrappers::StepLimit)) and a finite `format_penalty ≤ 0`
/// ([`FormatPenalty`](crate::wrappers::FormatPenalty)).
pub(crate) fn check_episode_options(max_steps: u32, format_penalty: f32) -> Result<(), EnvError> {
    crate::wrappers::check_max_steps(max_steps)?;
    crate::wrappers::check_penalty(format_penalty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_to_the_core_env_error_and_keeps_the_message() {
        let e: roll_core::Error = EnvError::NotReset {
            env: "sokoban".into(),
        }
        .into();
        assert!(matches!(e, roll_core::Error::Env(_)));
        assert!(e.to_string().contains("sokoban"), "{e}");
    }

    #[test]
    fn the_filter_error_mentions_the_last_filter_error_only_when_there_was_one() {
        let mut e = EnvError::TooManyFiltered {
            kind: "sokoban".into(),
            rejected: 11,
            allowed: 10,
            wanted: 1,
            last_error: None,
        };
        let text = e.to_string();
        assert!(
            text.contains("rejected 11 groups of `sokoban`") && !text.contains("last filter error"),
            "{text}"
        );
        if let EnvError::TooManyFiltered { last_error, .. } = &mut e {
            *last_error = Some("unrewarded sample".into());
        }
        assert!(
            e.to_string()
                .ends_with("; last filter error: unrewarded sample")
        );
    }
}
