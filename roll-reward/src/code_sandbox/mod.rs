//! The code sandbox: runs a model's Python program against test cases, with every limit really
//! enforced.
//!
//! [`CodeSandboxWorker`] extracts the program ([`extract_code`]), reads the test cases from the
//! ground truth ([`TestSuite`]: stdin/stdout cases, assert-style test code, or calls of an entry
//! point) and rewards the cases passed ([`RewardMode`]).
//!
//! # The mechanism (confined mode)
//!
//! Each run (one stdin/stdout case, or one harness run for an `assert`/`call` suite) is this
//! chain, built from util-linux tools so that the crate needs no `unsafe`:
//!
//! ```text
//! unshare --mount --ipc --pid --kill-child --mount-proc [--net] -- sh -c SCRIPT
//!   SCRIPT (root, pid 1 of the new pid namespace):
//!     every writable mount point remounted read-only (private to the namespace) — proc,
//!     sysfs, cgroup and devpts included — from a plan that Rust reads from
//!     /proc/self/mountinfo (escaped paths such as `my\040disk` unescaped); then a check that
//!     no writable mount is left that the plan does not know. Any failure stops the setup:
//!     the program never starts
//!     this run's files bind-mounted read-only from the root-only staging directory
//!     a fresh tmpfs of `disk_limit_mb` owned by the sandbox user on the run's work directory,
//!     another on /dev/shm
//!     setpriv --reuid=UID --regid=GID --clear-groups --no-new-privs --bounding-set=-all
//!       prlimit --nproc --as --cpu --fsize --nofile=64 --core=0 -- python3 -I -B program.py
//! ```
//!
//! started from Rust in its own process group, stdin fed and stdout/stderr read on threads
//! (inside `spawn_blocking`, so the async runtime is never blocked).
//!
//! | limit | enforced by |
//! |---|---|
//! | wall clock (`time_limit_s` per case) | Rust: SIGKILL to the process group and to `unshare`; `--kill-child` then kills pid 1 of the namespace, and the kernel kills every process in it (even ones that left the process group) |
//! | CPU time | `RLIMIT_CPU` (SIGXCPU) |
//! | memory | `RLIMIT_AS` per process (`MemoryError`); with `max_processes` = n the total is at most n × the limit |
//! | processes and threads (`max_processes`, default 1: no fork, no shell, no thread) | `RLIMIT_NPROC`, which the kernel enforces only because the code runs as the unprivileged `uid` (default 65534, `nobody`) — it is never enforced for root. The count is per user, so concurrent sandboxes with the same `uid` share it (a program that forks may fail while another sandbox is busy; default programs never fork) |
//! | file writes | every mount is read-only in the namespace (a mount that cannot be remounted read-only, or a writable one the plan missed, refuses the run); the only writable places are the private tmpfs work directory (`disk_limit_mb`) and /dev/shm, both freed when the namespace dies; `RLIMIT_FSIZE` per file. The host-side staging directory is removed after the run |
//! | other runs' files | each run's files (solution, harness, test spec) lie in a directory only root may enter (`private/`, 0700); a run sees its own through a read-only bind mount in its own mount namespace, and finds every other run's empty — though all runs share the uid |
//! | privileges | `setpriv` drops to `uid`/`gid` with no supplementary groups, an empty capability bounding set and `no_new_privs` (setuid binaries do not elevate) |
//! | network (unless `allow_network`) | a new network namespace: only a loopback interface, down; nothing of the host's network, its loopback included, is reachable |
//! | processes of the host | a new pid namespace with its own /proc: the program sees and can signal only its own processes |
//! | output (`max_output_bytes`) | Rust stops reading at the cap and kills the run |
//!
//! The interpreter must be executable by `uid`: the default `/usr/bin/python3`, not one under
//! root's home (pyenv). Tools are looked up in `/usr/bin`, `/bin`, `/usr/sbin`, `/sbin` only.
//!
//! # When it is unavailable
//!
//! The first use runs a probe program through the whole chain and caches the answer. Confined
//! mode needs root (or `CAP_SYS_ADMIN` and `CAP_SETUID`), user `uid`, and util-linux's
//! `unshare`, `setpriv`, `prlimit` and `mount`; the probe also checks that /tmp is read-only
//! and the staging directories closed to the sandbox user. When the probe fails, every sample
//! fails with
//! [`RewardError::SandboxUnavailable`](crate::RewardError::SandboxUnavailable), naming what is
//! missing — code never runs unconfined silently, and no sample is scored 0 for it. With
//! `allow_unconfined = true` the worker instead runs code with only `prlimit` and a process
//! group, as the current user: the file system (beyond `RLIMIT_FSIZE`) and the network are open,
//! the process limit counts all of that user's processes (and does not hold at all for root),
//! and a process that leaves its group survives the kill. Its rewards carry
//! `isolation = unconfined` and `fallback` (why).
//!
//! # What is not confined
//!
//! Reads: the program can read whatever `uid` may read on the host (world-readable files), but
//! not another run's files.
//! Assert-style tests run inside the program's interpreter, so a program written to tamper with
//! the harness could fake them (as with ROLL's and HumanEval's checkers); stdin/stdout and
//! `call` results are compared outside the sandbox, and the expected values of `call` cases never
//! enter it. Memory is bounded per process, not by a cgroup.
//!
//! ```no_run
//! use roll_reward::code_sandbox::{CodeSandboxConfig, CodeSandboxWorker, TestSuite};
//!
//! # async fn run() -> Result<(), roll_reward::RewardError> {
//! let worker = CodeSandboxWorker::new(CodeSandboxConfig { time_limit_s: 2.0, ..Default::default() })?;
//! let suite = TestSuite::parse(r#"{"type": "stdio", "cases": [{"input": "2 3\n", "output": "5"}]}"#)?;
//! let outcome = worker.run_suite("a, b = map(int, input().split())\nprint(a + b)\n", &suite).await?;
//! assert_eq!((outcome.passed, outcome.total), (1, 1));
//! # Ok(())
//! # }
//! ```

mod config;
mod extract;
mod harness;
mod mounts;
mod sandbox;
mod suite;
mod verdict;
mod worker;

pub use config::{CodeSandboxConfig, RewardMode};
pub use extract::{CodeSource, extract_code};
pub use sandbox::Isolation;
pub use suite::{CallCase, IoCase, TestSuite, json_equal, outputs_match};
pub use verdict::CaseFailure;
pub use worker::{CodeSandboxWorker, SuiteOutcome};
