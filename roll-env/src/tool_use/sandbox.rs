//! The code-sandbox tool, as a trait so that any sandbox plugs in: roll-reward's, a remote one, a
//! closure in tests.

use roll_core::BoxError;
use std::time::Duration;

/// What a program printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SandboxOutput {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// The exit code, if the program exited.
    pub exit_code: Option<i32>,
    /// Whether the program was killed for exceeding its time limit.
    pub timed_out: bool,
}

/// Runs Python code for the [`ToolUse`](super::ToolUse) environment's `python[...]` tool.
///
/// Errors are for the sandbox itself failing (it is unreachable, cannot start a process): they
/// fail the episode, and the environment manager restarts the environment. A program that
/// crashes or times out is a normal [`SandboxOutput`] the agent gets to read.
///
/// roll-reward's code sandbox can be adapted in a line, and any closure of the right shape is a
/// sandbox:
///
/// ```
/// use roll_env::tool_use::{CodeSandbox, SandboxOutput};
/// use std::time::Duration;
///
/// let echo = |code: &str, _limit: Duration| -> Result<SandboxOutput, roll_core::BoxError> {
///     Ok(SandboxOutput { stdout: code.to_uppercase(), exit_code: Some(0), ..Default::default() })
/// };
/// assert_eq!(echo.run("print(1)", Duration::from_secs(1)).unwrap().stdout, "PRINT(1)");
/// ```
pub trait CodeSandbox: Send + Sync {
    /// Runs `code` with a wall-clock limit.
    ///
    /// # Errors
    /// If the sandbox itself fails (not the code inside it).
    fn run(&self, code: &str, limit: Duration) -> Result<SandboxOutput, BoxError>;
}

impl<F> CodeSandbox for F
where
    F: Fn(&str, Duration) -> Result<SandboxOutput, BoxError> + Send + Sync,
{
    fn run(&self, code: &str, limit: Duration) -> Result<SandboxOutput, BoxError> {
        self(code, limit)
    }
}
