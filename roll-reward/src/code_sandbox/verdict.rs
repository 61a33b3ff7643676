//! [`CaseFailure`]: why a test case did not pass, as written in the reward's details.

use super::harness::{CaseReport, Status};
use super::sandbox::{RunEnd, RunOutcome};
use crate::text::shorten;
use std::fmt;
use std::time::Duration;

/// Why a case failed.
#[derive(Debug, Clone, PartialEq)]
pub enum CaseFailure {
    /// The program ran but its output (or return value, or assert) was wrong.
    WrongAnswer(String),
    /// Killed at the wall-clock limit.
    Timeout(Duration),
    /// Killed at the CPU-time limit (`SIGXCPU`).
    CpuLimit,
    /// Ran out of its address space (`MemoryError`), or was killed by the kernel for memory.
    MemoryLimit,
    /// Wrote more than the output limit.
    OutputLimit(usize),
    /// Raised an exception or exited non-zero: the last line of stderr (or of the traceback).
    RuntimeError(String),
    /// Killed by a signal.
    Killed(i32),
    /// Not run: an earlier failure stopped the run (or the harness died before reaching it).
    NotRun,
}

impl fmt::Display for CaseFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WrongAnswer(d) => write!(f, "wrong answer: {d}"),
            Self::Timeout(t) => write!(f, "timeout: wall clock over {:.3}s", t.as_secs_f64()),
            Self::CpuLimit => f.write_str("timeout: CPU-time limit (SIGXCPU)"),
            Self::MemoryLimit => f.write_str("memory limit exceeded"),
            Self::OutputLimit(n) => write!(f, "output limit exceeded (over {n} bytes)"),
            Self::RuntimeError(m) => write!(f, "runtime error: {m}"),
            Self::Killed(s) => write!(f, "killed by signal {s}"),
            Self::NotRun => f.write_str("not run"),
        }
    }
}

/// The failure a run that did not exit cleanly stands for; `None` for exit code 0.
pub(crate) fn run_failure(
    out: &RunOutcome,
    wall: Duration,
    output_cap: usize,
) -> Option<CaseFailure> {
    match out.end {
        RunEnd::Exited(0) => None,
        RunEnd::WallTimeout => Some(CaseFailure::Timeout(wall)),
        RunEnd::OutputLimit => Some(CaseFailure::OutputLimit(output_cap)),
        end => Some(match end.signal() {
            Some(24) => CaseFailure::CpuLimit,
            Some(9) => CaseFailure::MemoryLimit, // SIGKILL not sent by us: the OOM killer
            Some(s) => CaseFailure::Killed(s),
            None => match error_line(&out.stderr) {
                Some(l) if l.starts_with("MemoryError") => CaseFailure::MemoryLimit,
                Some(l) => CaseFailure::RuntimeError(l),
                None => CaseFailure::RuntimeError(format!("exit status {end:?}")),
            },
        }),
    }
}

/// The failure a harness case report stands for; `None` when it passed.
pub(crate) fn report_failure(r: &CaseReport, per_case: Duration) -> Option<CaseFailure> {
    let msg = || shorten(r.error.as_deref().unwrap_or("").trim(), 200);
    match r.status {
        Status::Ok => None,
        Status::Timeout => Some(CaseFailure::Timeout(per_case)),
        Status::Memory => Some(CaseFailure::MemoryLimit),
        Status::Assert => Some(CaseFailure::WrongAnswer(msg())),
        Status::Error => Some(CaseFailure::RuntimeError(msg())),
    }
}

/// The line of `stderr` that says what went wrong, shortened: the last one that names an
/// exception (`ZeroDivisionError: division by zero`, `MemoryError`), else the last non-blank
/// one. Processes a program forked all write their tracebacks to the same stream, interleaved,
/// so the last line alone may be any line of any traceback.
pub(crate) fn error_line(stderr: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stderr);
    let lines = || text.lines().rev().map(str::trim).filter(|l| !l.is_empty());
    lines()
        .find(|l| names_exception(l))
        .or_else(|| lines().next())
        .map(|l| shorten(l, 200))
}

/// `SomeError`, `pkg.SomeException: message`, `KeyboardInterrupt`, ...: an identifier path ending
/// in an exception-like name, alone or before `: `.
fn names_exception(line: &str) -> bool {
    let name = line.split_once(':').map_or(line, |(name, _)| name);
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && ["Error", "Exception", "Interrupt", "Exit"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
}

/// `expected …, got …`, each side shortened.
pub(crate) fn mismatch(expected: &str, got: &str) -> String {
    format!(
        "expected {:?}, got {:?}",
        shorten(expected.trim(), 80),
        shorten(got.trim(), 80)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(end: RunEnd, stderr: &str) -> RunOutcome {
        RunOutcome {
            end,
            stdout: vec![],
            stderr: stderr.as_bytes().to_vec(),
        }
    }

    #[test]
    fn run_ends_map_to_reasons() {
        let w = Duration::from_secs(1);
        let f = |end, err: &str| run_failure(&out(end, err), w, 10).map(|f| f.to_string());
        assert_eq!(f(RunEnd::Exited(0), "warn"), None);
        assert_eq!(
            f(RunEnd::WallTimeout, ""),
            Some("timeout: wall clock over 1.000s".into())
        );
        assert_eq!(
            f(RunEnd::Exited(152), ""),
            Some("timeout: CPU-time limit (SIGXCPU)".into())
        );
        assert_eq!(
            f(RunEnd::Exited(1), "Traceback\n  x\nMemoryError\n"),
            Some("memory limit exceeded".into())
        );
        assert_eq!(
            f(
                RunEnd::Exited(1),
                "Traceback\nZeroDivisionError: division by zero\n\n"
            ),
            Some("runtime error: ZeroDivisionError: division by zero".into())
        );
        // Tracebacks of forked processes interleave: the exception line wins over the last line.
        assert_eq!(
            f(
                RunEnd::Exited(1),
                "Traceback (most recent call last):\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n  File \"s.py\", line 3, in <module>\n"
            ),
            Some(
                "runtime error: BlockingIOError: [Errno 11] Resource temporarily unavailable"
                    .into()
            )
        );
        assert_eq!(
            f(RunEnd::Exited(1), "something odd\n"),
            Some("runtime error: something odd".into())
        );
        assert_eq!(
            f(RunEnd::Signalled(11), ""),
            Some("killed by signal 11".into())
        );
        assert_eq!(
            f(RunEnd::OutputLimit, ""),
            Some("output limit exceeded (over 10 bytes)".into())
        );
    }
}
