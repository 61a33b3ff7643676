//! The error type of roll-core.

use std::path::PathBuf;

/// A boxed error from an implementation of one of roll's traits (a backend, a reward worker, an
/// environment). Implementations in other crates convert their own error enums into it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in roll-core: configuration, data that breaks the data model's
/// invariants, and failures reported by implementations of the traits.
///
/// Config variants name the dotted key (`rollout.group_size`) and, where the value came from an
/// environment variable or a command-line override, that origin, so a user can find what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A config key that no section defines.
    #[error("unknown config key `{key}`{}{}", suggestion.as_ref().map(|s| format!("; did you mean `{s}`?")).unwrap_or_default(), origin_suffix(origin))]
    UnknownKey {
        /// Dotted path of the unknown key.
        key: String,
        /// The closest valid key at the same level, if one is close enough.
        suggestion: Option<String>,
        /// Where the key came from (file, environment variable, override), if known.
        origin: Option<String>,
    },
    /// A config value of the wrong type (a string where a number was expected, ...).
    #[error(
        "config key `{key}` has the wrong type: found {found}, expected {expected}{}",
        origin_suffix(origin)
    )]
    InvalidType {
        /// Dotted path of the key.
        key: String,
        /// What was found, e.g. `string "eight"`.
        found: String,
        /// What the key accepts.
        expected: String,
        /// Where the value came from, if known.
        origin: Option<String>,
    },
    /// A config value of the right type but outside what is allowed.
    #[error(
        "config key `{key}` has an invalid value {value}; allowed: {allowed}{}",
        origin_suffix(origin)
    )]
    InvalidValue {
        /// Dotted path of the key.
        key: String,
        /// The value that was given.
        value: String,
        /// What would have been accepted.
        allowed: String,
        /// Where the value came from, if known.
        origin: Option<String>,
    },
    /// A required config key that no source provides.
    #[error("missing required config key `{key}`")]
    MissingKey {
        /// Dotted path of the key.
        key: String,
    },
    /// A config source that cannot be parsed at all (malformed TOML/YAML, a bad override).
    #[error("cannot read config from {origin}: {message}")]
    ConfigSource {
        /// The file, variable or argument.
        origin: String,
        /// What the parser said.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{action} `{}`: {source}", path.display())]
    Io {
        /// What was being done, e.g. "cannot read config file".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Data that breaks an invariant of the data model (lengths that must agree, an empty group).
    #[error("invalid {what}: {reason}")]
    InvalidData {
        /// The kind of object, e.g. "sample".
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An algorithm rejected its inputs or settings.
    #[error(transparent)]
    Algo(#[from] roll_algos::AlgoError),
    /// A policy (actor, reference, critic, judge) failed.
    #[error("policy failed: {0}")]
    Policy(#[source] BoxError),
    /// A reward worker failed on a sample.
    #[error("reward worker failed: {0}")]
    Reward(#[source] BoxError),
    /// An environment failed.
    #[error("environment failed: {0}")]
    Env(#[source] BoxError),
    /// A parallelisation strategy failed (a collective, a placement).
    #[error("strategy failed: {0}")]
    Strategy(#[source] BoxError),
    /// A data-parallel replica failed, so the collective the others were waiting in cannot
    /// complete: the whole step stops rather than hang.
    #[error("replica {rank} of {world_size} failed: {reason}")]
    ReplicaFailed {
        /// The failed replica's rank.
        rank: usize,
        /// Replicas in the group.
        world_size: usize,
        /// What it reported.
        reason: String,
    },
    /// Replicas called a collective with different arguments: they disagree on what they are
    /// doing, a bug in the caller (each replica must issue the same collectives in order).
    #[error("collective mismatch: replica {rank} passed {got} where another passed {expected}")]
    CollectiveMismatch {
        /// The replica whose call differed.
        rank: usize,
        /// What the round's first caller passed (length and operation).
        expected: String,
        /// What this replica passed.
        got: String,
    },
    /// An operation took longer than its limit.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What timed out.
        what: String,
        /// The limit.
        after: std::time::Duration,
    },
    /// A component shut down while a request to it was in flight.
    #[error("{0} has shut down")]
    Closed(&'static str),
}

fn origin_suffix(origin: &Option<String>) -> String {
    origin
        .as_ref()
        .map(|o| format!(" (from {o})"))
        .unwrap_or_default()
}

impl Error {
    /// A policy error from any error type.
    pub fn policy(e: impl Into<BoxError>) -> Self {
        Self::Policy(e.into())
    }
    /// A reward-worker error from any error type.
    pub fn reward(e: impl Into<BoxError>) -> Self {
        Self::Reward(e.into())
    }
    /// An environment error from any error type.
    pub fn env(e: impl Into<BoxError>) -> Self {
        Self::Env(e.into())
    }
    /// An algorithm error, with an invalid setting's key placed under `prefix` (e.g.
    /// `algorithm.`) and reported as [`Error::InvalidValue`] like every other config value.
    pub fn from_algo(e: roll_algos::AlgoError, prefix: &str) -> Self {
        match e {
            roll_algos::AlgoError::InvalidValue {
                key,
                value,
                allowed,
            } => Self::InvalidValue {
                key: format!("{prefix}{key}"),
                value,
                allowed,
                origin: None,
            },
            other => Self::Algo(other),
        }
    }

    /// A data-model invariant violation.
    pub fn invalid_data(what: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidData {
            what,
            reason: reason.into(),
        }
    }
}

/// `Result` with roll-core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
