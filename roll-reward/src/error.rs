//! [`RewardError`]: everything that can go wrong in roll-reward.

use std::time::Duration;

/// The error type of roll-reward.
///
/// Every variant names what was wrong — the domain, the worker kind, the option key, the
/// instruction — so the message alone tells a user what to fix. It converts into
/// [`roll_core::Error::Reward`], which is what [`RewardWorker::score`](roll_core::RewardWorker::score)
/// returns; a scheduler drops the sample and counts the failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RewardError {
    /// A sample's domain (or tag) that no route serves.
    #[error("unknown domain `{domain}`; known domains: {}", list(known))]
    UnknownDomain {
        /// The domain (or tag) the prompt carried.
        domain: String,
        /// The domains the router serves.
        known: Vec<String>,
    },
    /// A `kind` that no factory of the registry builds.
    #[error(
        "unknown reward worker kind `{kind}`{}; registered kinds: {}",
        at_suffix(at),
        list(known)
    )]
    UnknownKind {
        /// The requested kind.
        kind: String,
        /// Where the spec sits in the config (`domains.<name>.reward`), if known.
        at: String,
        /// The registered kinds.
        known: Vec<String>,
    },
    /// Options of a reward worker that do not deserialise into its config (an unknown key, a
    /// value of the wrong type, a value out of range).
    #[error(
        "invalid options for reward worker `{kind}`{}: {message}",
        at_suffix(at)
    )]
    InvalidOptions {
        /// The worker kind.
        kind: String,
        /// Where the options came from, e.g. `domains.math.reward` (empty when unknown).
        at: String,
        /// What is wrong, naming the key.
        message: String,
    },
    /// A worker kind that needs something the registry was not given (the judge policy).
    #[error("reward worker `{kind}` needs {what}; give it to the registry first")]
    MissingResource {
        /// The worker kind.
        kind: String,
        /// What is missing and how to provide it.
        what: String,
    },
    /// A sample whose prompt has no ground truth, scored by a worker that needs one.
    #[error("{worker}: prompt {prompt} has no ground truth")]
    MissingGroundTruth {
        /// The worker.
        worker: &'static str,
        /// The prompt's id.
        prompt: String,
    },
    /// A ground truth the worker cannot read.
    #[error("{worker}: invalid ground truth: {reason}")]
    InvalidGroundTruth {
        /// The worker.
        worker: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An IFEval `func_name` that no instruction implements.
    #[error(
        "unknown instruction `{func_name}`; known instructions: {}",
        list(known)
    )]
    UnknownInstruction {
        /// The requested instruction.
        func_name: String,
        /// The implemented instructions.
        known: Vec<String>,
    },
    /// IFEval kwargs that do not fit the instruction.
    #[error("invalid kwargs for instruction `{func_name}`: {reason}")]
    InvalidInstructionArgs {
        /// The instruction.
        func_name: String,
        /// What is wrong, naming the argument.
        reason: String,
    },
    /// A judge output with no recognisable score or verdict.
    #[error("the judge's output has no score or verdict: {output:?}")]
    UnparsableJudgeOutput {
        /// The judge's output (shortened).
        output: String,
    },
    /// A worker panicked; the panic was caught and costs only this sample.
    #[error("reward worker of domain `{domain}` panicked: {message}")]
    Panicked {
        /// The domain whose worker panicked.
        domain: String,
        /// The panic message.
        message: String,
    },
    /// A worker took longer than its limit.
    #[error("reward worker {what} timed out after {after:?}")]
    Timeout {
        /// Which worker (e.g. "of domain `math`").
        what: String,
        /// The limit.
        after: Duration,
    },
    /// A worker task ended without a result (its runtime shut down).
    #[error("reward worker task of domain `{domain}` was cancelled")]
    Cancelled {
        /// The domain.
        domain: String,
    },
    /// A setting outside its allowed range (a negative weight, an empty clip range, ...).
    #[error("invalid {what}: {reason}")]
    InvalidConfig {
        /// The setting, e.g. `clip`.
        what: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// Scoring was called outside a Tokio runtime.
    #[error("the reward router needs a Tokio runtime (call it from inside one)")]
    NoRuntime,
    /// The code sandbox cannot run on this machine (found by its probe); the message says what
    /// is missing and how to fix it.
    #[error("code sandbox unavailable: {reason}")]
    SandboxUnavailable {
        /// What is missing (root, a tool, the interpreter) and what to do.
        reason: String,
    },
    /// A sandbox run failed for a reason that is not the program's (spawning, setup).
    #[error("code sandbox failed: {reason}")]
    SandboxFailed {
        /// What failed.
        reason: String,
    },
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "(none)".to_owned()
    } else {
        items
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn at_suffix(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!(" at `{at}`")
    }
}

impl RewardError {
    /// An [`InvalidConfig`](Self::InvalidConfig) error.
    pub fn invalid_config(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

impl From<RewardError> for roll_core::Error {
    fn from(e: RewardError) -> Self {
        roll_core::Error::Reward(Box::new(e))
    }
}

/// `Result` with [`RewardError`].
pub type Result<T, E = RewardError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_is_wrong() {
        let e = RewardError::UnknownDomain {
            domain: "chem".into(),
            known: vec!["code".into(), "math".into()],
        };
        assert_eq!(
            e.to_string(),
            "unknown domain `chem`; known domains: `code`, `math`"
        );
        let e = RewardError::InvalidOptions {
            kind: "math_rule".into(),
            at: "domains.math.reward".into(),
            message: "unknown field `tolerence`".into(),
        };
        assert!(
            e.to_string()
                .contains("`domains.math.reward`: unknown field `tolerence`")
        );
    }

    #[test]
    fn converts_into_a_core_reward_error() {
        let core: roll_core::Error = RewardError::NoRuntime.into();
        assert!(matches!(core, roll_core::Error::Reward(_)));
        assert!(core.to_string().starts_with("reward worker failed: "));
    }
}
