//! [`Sandbox`]: runs one program under the limits, confined or (opt-in) not.
//!
//! Safe Rust only: every privileged step (namespaces, mounts, dropping to the sandbox user,
//! rlimits) is done by util-linux tools (`unshare`, `mount`, `setpriv`, `prlimit`) chained by a
//! fixed shell script; untrusted text never reaches a command line except as a file the
//! interpreter reads.

use super::config::CodeSandboxConfig;
use super::mounts::{RemountPlan, parse_mountinfo};
use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

/// The line the setup script prints on stdout just before it starts the interpreter. Nothing
/// the program does can come before it, so its presence proves the setup succeeded.
const READY: &[u8] = b"roll-sandbox-ready\n";

/// Run as root, pid 1 of the new pid namespace: make every mount read-only, expose only this
/// run's files, mount two fresh private tmpfs (the working directory and /dev/shm), then start
/// the program as the sandbox user under rlimits. It does not `exec` the last command, so it
/// stays pid 1 (root, killed by `unshare --kill-child` when `unshare` dies) and the namespace
/// dies with it.
///
/// Arguments: work dir, tmpfs size, uid, gid, setpriv, prlimit, the program's view of its files
/// (an empty directory on the host), the private directory holding them (0700 root), the number
/// of mount points to remount, those mount points, the escaped list of known mount points, then
/// the prlimit command line. Fails closed: any mount that cannot be remounted read-only, and any
/// writable mount the plan does not know, stops the setup before the ready line, so the program
/// never runs.
const CONFINED_SCRIPT: &str = r#"set -e
work=$1; size=$2; uid=$3; gid=$4; setpriv=$5; prlimit=$6; view=$7; files=$8; n=$9; shift 9
fail() { printf 'roll-sandbox: %s\n' "$1" >&2; exit 97; }
mount --make-rprivate /
i=0
while [ "$i" -lt "$n" ]; do
  mount -o remount,bind,ro "$1" 2>/dev/null || fail "cannot remount '$1' read-only"
  shift; i=$((i + 1))
done
known=$1; shift
while read -r _ _ _ _ mnt opts _; do
  case ",$opts," in *,ro,*) continue;; esac
  case " $known " in *" $mnt "*) continue;; esac
  fail "the mount point $mnt is writable and was not remounted"
done < /proc/self/mountinfo
mount --bind "$files" "$view" || fail "cannot expose the program's files"
mount -o remount,bind,ro "$view" || fail "cannot make the program's files read-only"
mount -t tmpfs -o "size=$size,mode=0700,uid=$uid,gid=$gid,nosuid,nodev" roll-sandbox "$work"
if [ -d /dev/shm ]; then mount -t tmpfs -o "size=$size,mode=1777,nosuid,nodev" roll-sandbox /dev/shm; fi
cd "$work"
printf 'roll-sandbox-ready\n'
set +e
"$setpriv" --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs --bounding-set=-all --inh-caps=-all -- "$prlimit" "$@"
status=$?
exit $status
"#;

/// The opt-in weak mode: rlimits and a process group only.
const UNCONFINED_SCRIPT: &str = r#"work=$1; shift 6
cd "$work" || exit 125
printf 'roll-sandbox-ready\n'
exec "$@"
"#;

/// How a program is isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Namespaces (mount, pid, ipc, network), a read-only file system but for a private tmpfs,
    /// its own files only, an unprivileged user, rlimits.
    Confined,
    /// rlimits and a process group only, as the current user (opt-in `allow_unconfined`).
    Unconfined,
}

impl Isolation {
    /// `confined` or `unconfined`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confined => "confined",
            Self::Unconfined => "unconfined",
        }
    }
}

/// The limits of one run.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub wall: Duration,
    pub cpu_s: u64,
    pub memory_bytes: u64,
    pub nproc: u32,
    pub disk_bytes: u64,
    pub output_bytes: usize,
}

impl Limits {
    /// The limits of `config` for a run of `cases` cases.
    pub fn for_cases(config: &CodeSandboxConfig, cases: usize) -> Self {
        let per_case = config.time_limit().unwrap_or(Duration::from_secs(5));
        let cases = u32::try_from(cases.max(1)).unwrap_or(u32::MAX);
        let wall = per_case.saturating_mul(cases);
        Self {
            wall,
            cpu_s: wall.as_secs_f64().ceil() as u64,
            memory_bytes: config.memory_limit_mb.saturating_mul(1 << 20),
            nproc: config.max_processes,
            disk_bytes: config.disk_limit_mb.saturating_mul(1 << 20),
            output_bytes: config.max_output_bytes,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// The program exited with this code (a shell's 128 + n means signal n).
    Exited(i32),
    /// The program was killed by this signal.
    Signalled(i32),
    /// Killed at the wall-clock limit.
    WallTimeout,
    /// Killed for writing more than the output limit.
    OutputLimit,
}

impl RunEnd {
    /// The signal that ended the program, if one did.
    pub fn signal(self) -> Option<i32> {
        match self {
            Self::Signalled(s) => Some(s),
            Self::Exited(c) if c > 128 && c < 160 => Some(c - 128),
            _ => None,
        }
    }
}

/// What a run left behind.
#[derive(Debug, Clone)]
pub(crate) struct RunOutcome {
    pub end: RunEnd,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Absolute paths of the tools the sandbox uses, found in the system directories (never via
/// `PATH`, which may point into a user's home).
#[derive(Debug, Clone)]
struct Tools {
    sh: PathBuf,
    unshare: Option<PathBuf>,
    setpriv: Option<PathBuf>,
    prlimit: Option<PathBuf>,
    mount: Option<PathBuf>,
    kill: Option<PathBuf>,
}

const SYSTEM_DIRS: &[&str] = &["/usr/bin", "/bin", "/usr/sbin", "/sbin"];

fn find_tool(name: &str) -> Option<PathBuf> {
    SYSTEM_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

impl Tools {
    fn find() -> Result<Self, String> {
        Ok(Self {
            sh: find_tool("sh").ok_or("no `sh` in /usr/bin or /bin")?,
            unshare: find_tool("unshare"),
            setpriv: find_tool("setpriv"),
            prlimit: find_tool("prlimit"),
            mount: find_tool("mount"),
            kill: find_tool("kill"),
        })
    }
}

/// A probed, ready sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Sandbox {
    isolation: Isolation,
    tools: Tools,
    python: PathBuf,
    uid: u32,
    gid: u32,
    network: bool,
    /// Where the mount table is read from (`/proc/self/mountinfo`; a test points it at a file
    /// with a mount that cannot be remounted).
    mountinfo: PathBuf,
    /// Why the confined mode was not used, in unconfined mode.
    pub fallback_reason: Option<String>,
}

/// The kernel's mount table of this process, which a new mount namespace copies.
const MOUNTINFO: &str = "/proc/self/mountinfo";

impl Sandbox {
    /// Finds the tools and runs a probe program: confined first, unconfined when that fails and
    /// `config.allow_unconfined`. Blocking (tens of milliseconds).
    ///
    /// # Errors
    /// Why no sandbox can run, naming what is missing.
    pub fn probe(config: &CodeSandboxConfig) -> Result<Self, String> {
        let tools = Tools::find()?;
        if !config.python.is_file() {
            return Err(format!(
                "the Python interpreter `{}` does not exist (set `python` to a Python 3 that \
                 the sandbox user can execute, e.g. /usr/bin/python3)",
                config.python.display()
            ));
        }
        let mut sandbox = Self {
            isolation: Isolation::Confined,
            tools,
            python: config.python.clone(),
            uid: config.uid,
            gid: config.gid,
            network: config.allow_network,
            mountinfo: PathBuf::from(MOUNTINFO),
            fallback_reason: None,
        };
        let confined = sandbox.check_tools().and_then(|()| sandbox.probe_run());
        match confined {
            Ok(()) => Ok(sandbox),
            Err(why) if config.allow_unconfined => {
                sandbox.isolation = Isolation::Unconfined;
                if sandbox.tools.prlimit.is_none() {
                    return Err(format!(
                        "the confined sandbox is unavailable ({why}) and the unconfined \
                         fallback needs `prlimit` (util-linux), which is missing"
                    ));
                }
                sandbox.probe_run().map_err(|e| {
                    format!("the confined sandbox is unavailable ({why}); unconfined: {e}")
                })?;
                sandbox.fallback_reason = Some(why);
                Ok(sandbox)
            }
            Err(why) => Err(format!(
                "{why}. The sandbox needs root (or CAP_SYS_ADMIN and CAP_SETUID) to create \
                 namespaces and switch to uid {}; set `allow_unconfined = true` to run code with \
                 rlimits only (no user switch, file system and network open)",
                config.uid
            )),
        }
    }

    fn check_tools(&self) -> Result<(), String> {
        let missing: Vec<&str> = [
            ("unshare", &self.tools.unshare),
            ("setpriv", &self.tools.setpriv),
            ("prlimit", &self.tools.prlimit),
            ("mount", &self.tools.mount),
        ]
        .iter()
        .filter(|(_, p)| p.is_none())
        .map(|(n, _)| *n)
        .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "missing util-linux tools: {} (looked in {})",
                missing.join(", "),
                SYSTEM_DIRS.join(", ")
            ))
        }
    }

    fn probe_run(&self) -> Result<(), String> {
        const MARK: &str = "roll-sandbox-probe-file";
        let staging = self
            .stage(&[("probe.txt", MARK.as_bytes())])
            .map_err(|e| e.to_string())?;
        let limits = Limits {
            wall: Duration::from_secs(10),
            cpu_s: 10,
            memory_bytes: 512 << 20,
            nproc: 1,
            disk_bytes: 1 << 20,
            output_bytes: 4096,
        };
        // Confined: /tmp (world-writable on the host) must be read-only, the run's own file
        // readable, and the private directory that holds it closed to the sandbox user (so
        // another run's files are too). Unconfined: only the file is read.
        let probe_file = format!("/tmp/roll-sandbox-probe-{}", std::process::id());
        let program = "import os, sys\n\
                       print(os.getuid())\n\
                       print(open(sys.argv[1]).read())\n\
                       if len(sys.argv) > 2:\n\
                       \x20   try:\n\
                       \x20       open(sys.argv[2], 'w')\n\
                       \x20       print('tmp writable')\n\
                       \x20   except OSError as e:\n\
                       \x20       print('tmp errno', e.errno)\n\
                       \x20   try:\n\
                       \x20       os.listdir(sys.argv[3])\n\
                       \x20       print('private readable')\n\
                       \x20   except OSError as e:\n\
                       \x20       print('private errno', e.errno)\n";
        let mut args = vec![
            OsString::from("-I"),
            "-B".into(),
            "-c".into(),
            program.into(),
            staging.path("probe.txt").into(),
        ];
        if let (Isolation::Confined, Some(private)) = (self.isolation, staging.private_files()) {
            args.push(probe_file.clone().into());
            args.push(private.into());
        }
        let out = self.run(&staging, &args, Vec::new(), &limits)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.end != RunEnd::Exited(0) {
            return Err(format!(
                "the probe program failed ({:?}): {}",
                out.end,
                crate::text::shorten(stderr.trim(), 300)
            ));
        }
        let lines: Vec<&str> = stdout.lines().collect();
        if lines.get(1) != Some(&MARK) {
            return Err(format!(
                "the probe could not read its own file (probe: {lines:?})"
            ));
        }
        if self.isolation == Isolation::Confined {
            if lines.first() != Some(&self.uid.to_string().as_str()) {
                return Err(format!("the probe ran as uid {lines:?}, not {}", self.uid));
            }
            if lines.get(2) != Some(&"tmp errno 30") {
                let _ = fs::remove_file(&probe_file);
                return Err(format!(
                    "the file system is not read-only inside the sandbox (probe: {lines:?})"
                ));
            }
            if lines.get(3) != Some(&"private errno 13") {
                return Err(format!(
                    "the staging directories are not private to their run (probe: {lines:?})"
                ));
            }
        }
        Ok(())
    }

    /// A staging directory for one run with `files`: private to the run when confined.
    ///
    /// # Errors
    /// Creating the directory or writing a file failed.
    pub fn stage(&self, files: &[(&str, &[u8])]) -> std::io::Result<Staging> {
        Staging::new(files, self.isolation == Isolation::Confined)
    }

    /// How programs are isolated.
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// Runs the interpreter with `args` (paths inside `staging`) and `stdin`, blocking until it
    /// ends or a limit kills it.
    ///
    /// # Errors
    /// A failure of the sandbox itself (spawning, setup), never of the program.
    pub fn run(
        &self,
        staging: &Staging,
        args: &[OsString],
        stdin: Vec<u8>,
        limits: &Limits,
    ) -> Result<RunOutcome, String> {
        let mut cmd = self.command(staging, args, limits)?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", staging.work())
            .env("TMPDIR", staging.work())
            .env("LANG", "C.UTF-8")
            .env("LC_ALL", "C.UTF-8")
            .env("OMP_NUM_THREADS", "1")
            .env("OPENBLAS_NUM_THREADS", "1")
            .env("MKL_NUM_THREADS", "1");
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the sandbox: {e}"))?;
        let mut out = supervise(child, stdin, limits, self.tools.kill.as_deref())?;
        match out.stdout.strip_prefix(READY) {
            Some(rest) => {
                out.stdout = rest.to_vec();
                Ok(out)
            }
            None => Err(format!(
                "the sandbox setup failed ({:?}): {}",
                out.end,
                crate::text::shorten(String::from_utf8_lossy(&out.stderr).trim(), 300)
            )),
        }
    }

    /// The command line of one run. Confined, it carries the remount plan read from the mount
    /// table now (what the namespace will copy).
    ///
    /// # Errors
    /// The mount table cannot be read or parsed: the run is refused rather than started with
    /// mounts left writable.
    fn command(
        &self,
        staging: &Staging,
        args: &[OsString],
        limits: &Limits,
    ) -> Result<Command, String> {
        let tool = |p: &Option<PathBuf>| p.clone().unwrap_or_default().into_os_string();
        let mut prlimit: Vec<OsString> = vec![
            format!("--nproc={}", limits.nproc).into(),
            format!("--as={}", limits.memory_bytes).into(),
            format!("--cpu={}", limits.cpu_s.max(1)).into(),
            format!("--fsize={}", limits.disk_bytes).into(),
            "--nofile=64".into(),
            "--core=0".into(),
            "--".into(),
            self.python.clone().into_os_string(),
        ];
        prlimit.extend(args.iter().cloned());
        let script_args: Vec<OsString> = vec![
            "roll-sandbox".into(),
            staging.work().into(),
            limits.disk_bytes.to_string().into(),
            self.uid.to_string().into(),
            self.gid.to_string().into(),
            tool(&self.tools.setpriv),
            tool(&self.tools.prlimit),
        ];
        match self.isolation {
            Isolation::Confined => {
                let table = fs::read_to_string(&self.mountinfo).map_err(|e| {
                    format!(
                        "cannot read the mount table {}: {e}",
                        self.mountinfo.display()
                    )
                })?;
                let plan = RemountPlan::new(&parse_mountinfo(&table)?);
                let files = staging
                    .private_files()
                    .ok_or("a confined run needs a private staging directory (Sandbox::stage)")?;
                let mut cmd = Command::new(tool(&self.tools.unshare));
                cmd.args(["--mount", "--ipc", "--pid", "--kill-child", "--mount-proc"]);
                if !self.network {
                    cmd.arg("--net");
                }
                cmd.arg("--")
                    .arg(&self.tools.sh)
                    .arg("-c")
                    .arg(CONFINED_SCRIPT)
                    .args(script_args)
                    .arg(staging.view())
                    .arg(files)
                    .arg(plan.paths.len().to_string())
                    .args(&plan.paths)
                    .arg(&plan.known)
                    .args(prlimit);
                Ok(cmd)
            }
            Isolation::Unconfined => {
                let mut cmd = Command::new(&self.tools.sh);
                cmd.arg("-c")
                    .arg(UNCONFINED_SCRIPT)
                    .args(script_args)
                    .arg(tool(&self.tools.prlimit))
                    .args(prlimit);
                Ok(cmd)
            }
        }
    }
}

/// Feeds stdin, reads capped stdout/stderr, and kills the process group at the wall-clock or
/// output limit.
fn supervise(
    mut child: Child,
    stdin: Vec<u8>,
    limits: &Limits,
    kill: Option<&Path>,
) -> Result<RunOutcome, String> {
    let start = Instant::now();
    let over = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel::<()>();
    if let Some(mut pipe) = child.stdin.take() {
        // The program may exit without reading: a broken pipe is not an error.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&stdin);
        });
    }
    let stdout = capture(child.stdout.take(), limits.output_bytes, &over, &done_tx);
    let stderr = capture(child.stderr.take(), limits.output_bytes, &over, &done_tx);
    drop(done_tx);
    let mut pause = Duration::from_millis(1);
    let mut end = loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                break match (status.code(), status.signal()) {
                    (Some(c), _) => RunEnd::Exited(c),
                    (None, Some(s)) => RunEnd::Signalled(s),
                    (None, None) => RunEnd::Signalled(0),
                };
            }
            Ok(None) => {}
            Err(e) => {
                kill_group(&mut child, kill);
                return Err(format!("cannot wait for the sandbox: {e}"));
            }
        }
        if over.load(Ordering::Relaxed) {
            kill_group(&mut child, kill);
            break RunEnd::OutputLimit;
        }
        if start.elapsed() >= limits.wall {
            kill_group(&mut child, kill);
            break RunEnd::WallTimeout;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    };
    // In confined mode the pipes close when the namespace dies; an unconfined program that
    // left its process group may hold them open, so wait only briefly for the readers.
    let grace = Instant::now() + Duration::from_millis(500);
    for _ in 0..2 {
        let left = grace.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    // The program may have exited (or been stopped by the cap) before the flag was seen.
    if over.load(Ordering::Relaxed) && end != RunEnd::WallTimeout {
        end = RunEnd::OutputLimit;
    }
    let take = |b: &Arc<Mutex<Vec<u8>>>| {
        std::mem::take(&mut *b.lock().unwrap_or_else(PoisonError::into_inner))
    };
    Ok(RunOutcome {
        end,
        stdout: take(&stdout),
        stderr: take(&stderr),
    })
}

/// Reads `pipe` into a shared buffer until EOF, keeping at most `cap` bytes and setting `over`
/// when there were more.
fn capture<R: Read + Send + 'static>(
    pipe: Option<R>,
    cap: usize,
    over: &Arc<AtomicBool>,
    done: &mpsc::Sender<()>,
) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let (b, over, done) = (buf.clone(), over.clone(), done.clone());
    std::thread::spawn(move || {
        if let Some(mut pipe) = pipe {
            let mut chunk = [0u8; 8192];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        // Past the cap, keep draining (so the program is not stopped by a broken
                        // pipe before the supervisor kills it for its output) but keep nothing.
                        let mut b = b.lock().unwrap_or_else(PoisonError::into_inner);
                        let room = cap.saturating_sub(b.len());
                        b.extend_from_slice(&chunk[..n.min(room)]);
                        if n > room {
                            over.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        let _ = done.send(());
    });
    buf
}

/// SIGKILLs the child's whole process group, then the child itself (still unreaped, so its
/// pid and group id cannot have been reused), and reaps it. In confined mode killing `unshare`
/// also kills the namespace's pid 1 (`--kill-child`), which makes the kernel kill every process
/// in the namespace, including any that left the process group.
fn kill_group(child: &mut Child, kill: Option<&Path>) {
    if let Some(kill) = kill {
        let _ = Command::new(kill)
            .args(["-s", "KILL", "--", &format!("-{}", child.id())])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A fresh host directory for one run, removed on drop:
///
/// ```text
/// roll-sandbox-<pid>-<n>-<random>/   0755 root
///   src/                            0755, empty: where the program sees its files
///   work/                           0755, empty: its working directory (a private tmpfs)
///   private/                        0700 root: no one but root passes
///     src/                          0755, the files (0644)
/// ```
///
/// A confined run bind-mounts `private/src` on `src` inside its own mount namespace, so only
/// that run sees its files; every other run, under the same uid, finds an empty `src` and a
/// `private` it may not enter. (Per-run uids would do the same, but would need a range of
/// unused uids on every host.) Unconfined (opt-in, no isolation at all), the files are
/// written to `src` directly.
#[derive(Debug)]
pub(crate) struct Staging {
    root: PathBuf,
    private: bool,
}

static NEXT_STAGING: AtomicU64 = AtomicU64::new(0);

impl Staging {
    /// Creates the directory with `files` (name, content); `private` puts them behind the
    /// root-only `private/`.
    fn new(files: &[(&str, &[u8])], private: bool) -> std::io::Result<Self> {
        let n = NEXT_STAGING.fetch_add(1, Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!(
            "roll-sandbox-{}-{n}-{}",
            std::process::id(),
            super::harness::random_hex()
        ));
        fs::create_dir(&root)?;
        let staging = Self { root, private };
        fs::set_permissions(&staging.root, fs::Permissions::from_mode(0o755))?;
        let mut dirs = vec![(staging.view(), 0o755), (staging.work(), 0o755)];
        if private {
            dirs.push((staging.root.join("private"), 0o700));
            dirs.push((staging.files_dir(), 0o755));
        }
        for (dir, mode) in dirs {
            fs::create_dir(&dir)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode))?;
        }
        for (name, content) in files {
            staging.add(name, content)?;
        }
        Ok(staging)
    }

    /// Adds a file (read-only to the program).
    pub fn add(&self, name: &str, content: &[u8]) -> std::io::Result<()> {
        let path = self.files_dir().join(name);
        fs::write(&path, content)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644))
    }

    /// Where the program finds the file `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.view().join(name)
    }

    /// The directory where the program sees its files.
    fn view(&self) -> PathBuf {
        self.root.join("src")
    }

    /// The directory that holds the files on the host.
    fn files_dir(&self) -> PathBuf {
        if self.private {
            self.root.join("private").join("src")
        } else {
            self.view()
        }
    }

    /// The directory of the files when it is behind the root-only `private/`.
    fn private_files(&self) -> Option<PathBuf> {
        self.private.then(|| self.files_dir())
    }

    /// The program's working directory.
    pub fn work(&self) -> PathBuf {
        self.root.join("work")
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A confined sandbox, or `None` (with a note) where it cannot run (not root).
    fn confined() -> Option<Sandbox> {
        match Sandbox::probe(&CodeSandboxConfig::default()) {
            Ok(s) if s.isolation() == Isolation::Confined => Some(s),
            other => {
                eprintln!(
                    "NOTE: confined sandbox unavailable, fail-closed checks skipped: {other:?}"
                );
                None
            }
        }
    }

    fn limits() -> Limits {
        Limits {
            wall: Duration::from_secs(10),
            cpu_s: 10,
            memory_bytes: 256 << 20,
            nproc: 1,
            disk_bytes: 1 << 20,
            output_bytes: 4096,
        }
    }

    /// Runs `print('ran')` with the mount table read from `mountinfo` instead of the kernel's.
    fn run_with_mountinfo(sandbox: &Sandbox, mountinfo: &str) -> Result<RunOutcome, String> {
        let dir = sandbox
            .stage(&[("mountinfo", mountinfo.as_bytes())])
            .unwrap();
        let mut sandbox = sandbox.clone();
        sandbox.mountinfo = dir.files_dir().join("mountinfo");
        let args = [OsString::from("-c"), "print('ran')".into()];
        let staging = sandbox.stage(&[]).unwrap();
        sandbox.run(&staging, &args, Vec::new(), &limits())
    }

    #[test]
    fn a_mount_that_cannot_be_remounted_read_only_refuses_the_run() {
        let Some(sandbox) = confined() else { return };
        let real = fs::read_to_string(MOUNTINFO).unwrap();
        // The real table runs the program.
        let out = run_with_mountinfo(&sandbox, &real).unwrap();
        assert_eq!(out.stdout, b"ran\n");
        // A writable mount point with an escaped space that does not exist: it cannot be
        // remounted, so the program must not start (the setup used to ignore the failure).
        let injected = format!(
            "{real}4242 1 0:4242 / /nonexistent/roll\\040sandbox\\040mount rw,relatime - tmpfs none rw\n"
        );
        let err = run_with_mountinfo(&sandbox, &injected).unwrap_err();
        assert!(
            err.contains("cannot remount '/nonexistent/roll sandbox mount' read-only"),
            "{err}"
        );
        assert!(!err.contains("ran"), "{err}");
    }

    #[test]
    fn a_writable_mount_the_plan_missed_refuses_the_run() {
        let Some(sandbox) = confined() else { return };
        let real = fs::read_to_string(MOUNTINFO).unwrap();
        // Drop a writable mount other than / and /proc from the plan: the check after the
        // remounts finds it writable in the namespace.
        let entries = parse_mountinfo(&real).unwrap();
        let Some(victim) = entries
            .iter()
            .find(|e| !e.read_only && e.escaped != "/" && e.escaped != "/proc")
        else {
            eprintln!("NOTE: no writable mount besides / and /proc here; check skipped");
            return;
        };
        let partial: String = real
            .lines()
            .filter(|l| l.split(' ').nth(4) != Some(victim.escaped.as_str()))
            .map(|l| format!("{l}\n"))
            .collect();
        let err = run_with_mountinfo(&sandbox, &partial).unwrap_err();
        assert!(
            err.contains(&format!("the mount point {} is writable", victim.escaped)),
            "{err}"
        );
    }

    #[test]
    fn an_unreadable_mount_table_refuses_the_run() {
        let Some(sandbox) = confined() else { return };
        let err = run_with_mountinfo(&sandbox, "garbage\n").unwrap_err();
        assert!(err.contains("mountinfo line 1"), "{err}");
    }
}
