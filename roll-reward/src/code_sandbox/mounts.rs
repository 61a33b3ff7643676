//! Reading `/proc/self/mountinfo` to plan the read-only remounts of a confined run.
//!
//! The sandbox makes the whole file system read-only inside its mount namespace by remounting
//! every writable mount point. The list comes from the kernel's `mountinfo` (see `proc(5)`),
//! parsed here in Rust rather than by the shell: a mount point is written with its spaces,
//! tabs, newlines and backslashes escaped as octal (`/mnt/my\040disk`), which a shell `read`
//! would pass on verbatim — `mount` would then fail on a path that does not exist, and a
//! setup that ignored the failure left the real `/mnt/my disk` writable.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// One line of `mountinfo`: the fields the plan needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// The mount point, unescaped.
    pub mount_point: PathBuf,
    /// The mount point as the kernel writes it (escaped: no whitespace).
    pub escaped: String,
    /// Whether the per-mount options include `ro`.
    pub read_only: bool,
}

/// Parses `mountinfo` text: `id parent major:minor root mount-point options [optional…] -
/// fstype source super-options` per line.
///
/// # Errors
/// The line number and what is wrong with it (too few fields, no `-` separator, a bad escape):
/// a line that cannot be read is a mount that cannot be made read-only, so the run is refused.
pub(crate) fn parse_mountinfo(text: &str) -> Result<Vec<MountEntry>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |what: &str| format!("mountinfo line {}: {what}: {line:?}", n + 1);
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 10 || !fields[6..].contains(&"-") {
            return Err(bad(
                "not `id parent dev root mount-point options … - type source …`",
            ));
        }
        let escaped = fields[4];
        let mount_point = unescape(escaped).ok_or_else(|| bad("a bad octal escape"))?;
        if !mount_point.is_absolute() {
            return Err(bad("a mount point that is not an absolute path"));
        }
        out.push(MountEntry {
            mount_point,
            escaped: escaped.to_owned(),
            read_only: fields[5].split(',').any(|o| o == "ro"),
        });
    }
    Ok(out)
}

/// `\ooo` (three octal digits) → that byte; any other backslash is an error.
fn unescape(field: &str) -> Option<PathBuf> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let digits = bytes.get(i + 1..i + 4)?;
            if !digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                return None;
            }
            let value = digits
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            out.push(u8::try_from(value).ok()?);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(OsString::from_vec(out)))
}

/// What the setup script remounts read-only, and how it checks that nothing was missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemountPlan {
    /// Each writable mount point once (remounting a path affects the topmost mount there; a
    /// mount stacked under it is hidden), in `mountinfo` order, and always `/proc` (the
    /// namespace's own, mounted by `unshare --mount-proc`).
    pub paths: Vec<PathBuf>,
    /// The same mount points as `mountinfo` writes them, space-separated: after remounting,
    /// the script refuses to go on if a writable mount is not one of these (a mount that
    /// appeared between the plan and the namespace, or a line the plan did not see).
    pub known: String,
}

impl RemountPlan {
    /// The plan for `entries` (from [`parse_mountinfo`]).
    pub(crate) fn new(entries: &[MountEntry]) -> Self {
        let mut paths: Vec<PathBuf> = Vec::new();
        let mut escaped: Vec<&str> = Vec::new();
        let proc_entry = MountEntry {
            mount_point: PathBuf::from("/proc"),
            escaped: "/proc".to_owned(),
            read_only: false,
        };
        for e in entries.iter().chain(std::iter::once(&proc_entry)) {
            if e.read_only || escaped.contains(&e.escaped.as_str()) {
                continue;
            }
            paths.push(e.mount_point.clone());
            escaped.push(&e.escaped);
        }
        Self {
            paths,
            known: escaped.join(" "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:5 / /proc rw,nosuid - proc proc rw
24 22 0:21 / /sys ro,nosuid master:2 - sysfs sysfs rw
25 22 8:2 / /mnt/my\\040disk rw - ext4 /dev/sdb1 rw
26 22 8:3 / /mnt/tab\\011new\\012line\\134back rw - ext4 /dev/sdc1 rw
27 22 0:30 / /dev/shm rw - tmpfs tmpfs rw
28 27 0:31 / /dev/shm rw - tmpfs tmpfs rw
";

    #[test]
    fn escaped_mount_points_are_unescaped() {
        let entries = parse_mountinfo(SAMPLE).unwrap();
        assert_eq!(entries.len(), 7);
        assert_eq!(entries[3].mount_point, PathBuf::from("/mnt/my disk"));
        assert_eq!(entries[3].escaped, "/mnt/my\\040disk");
        assert_eq!(
            entries[4].mount_point,
            PathBuf::from("/mnt/tab\tnew\nline\\back")
        );
        assert!(entries[2].read_only && !entries[0].read_only);
    }

    #[test]
    fn the_plan_remounts_each_writable_mount_point_once() {
        let plan = RemountPlan::new(&parse_mountinfo(SAMPLE).unwrap());
        let paths: Vec<&str> = plan.paths.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/",
                "/proc",
                "/mnt/my disk",
                "/mnt/tab\tnew\nline\\back",
                "/dev/shm"
            ]
        );
        assert_eq!(
            plan.known,
            "/ /proc /mnt/my\\040disk /mnt/tab\\011new\\012line\\134back /dev/shm"
        );
        // `/proc` is always planned: the namespace mounts its own, writable.
        let plan = RemountPlan::new(&[]);
        assert_eq!(plan.paths, [PathBuf::from("/proc")]);
    }

    #[test]
    fn unreadable_lines_are_errors_naming_the_line() {
        for (bad, why) in [
            ("22 1 8:1 / / rw - ext4", "not `id"),
            ("22 1 8:1 / / rw shared:1 ext4 /dev/sda1 rw x", "not `id"),
            ("22 1 8:1 / /mnt/a\\04 rw - ext4 /dev/sda1 rw", "bad octal"),
            (
                "22 1 8:1 / /mnt/a\\x41b rw - ext4 /dev/sda1 rw",
                "bad octal",
            ),
            ("22 1 8:1 / relative rw - ext4 /dev/sda1 rw", "absolute"),
        ] {
            let err = parse_mountinfo(&format!("{SAMPLE}{bad}\n")).unwrap_err();
            assert!(err.contains("line 8") && err.contains(why), "{bad}: {err}");
        }
    }
}
