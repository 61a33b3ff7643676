//! Checkpoints of a whole run, and finding the newest one that reads back.
//!
//! Layout of `<run.output_dir>/checkpoints/`:
//!
//! ```text
//! sft-00000250/          a checkpoint taken after SFT step 250 (`rl-00000003`: after RL step 3)
//!     actor/             the actor's trainer checkpoint: weights, AdamW moments, RNG, step, weight version
//!     state.json         RunState: the stage's position (SFT dataset position, or the RL pipeline's
//!                        step, KL controller, reward moments and prompt position), the summary so far,
//!                        how many lines of metrics.jsonl belong to it, the time spent
//!     MANIFEST.json      size and CRC-32 of every other file; written last
//! .tmp-<nonce>/          a save in progress (or interrupted: deleted by the next save)
//! ```
//!
//! A save writes `.tmp-<nonce>/`, fsyncs every file and directory, renames it to its name (an
//! atomic step: a crash leaves either the previous set of checkpoints or the new one), then
//! deletes all but the newest `run.keep_checkpoints`. A checkpoint counts only if its manifest
//! is there and every file matches it, so a directory truncated or altered after the save (a
//! full disk, a bad copy) is skipped on resume for the previous one, with a warning naming
//! what did not match.

use super::io;
use super::summary::RunSummary;
pub(crate) use super::summary::SftProgress;
use roll_core::pipeline::{PipelineState, SftPosition};
use roll_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The directory of a run's checkpoints, inside `run.output_dir`.
pub(crate) const CHECKPOINTS: &str = "checkpoints";
/// The actor's trainer checkpoint, inside a checkpoint.
pub(crate) const ACTOR: &str = "actor";
const STATE: &str = "state.json";
const MANIFEST: &str = "MANIFEST.json";
const TMP_PREFIX: &str = ".tmp-";
const FORMAT_VERSION: u32 = 1;

/// Which stage a checkpoint was taken in; SFT checkpoints come before RL ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum StageKind {
    Sft,
    Rl,
}

/// A checkpoint's name: its stage and the steps taken in that stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct CheckpointId {
    pub stage: StageKind,
    pub step: u64,
}

impl CheckpointId {
    fn name(self) -> String {
        let stage = match self.stage {
            StageKind::Sft => "sft",
            StageKind::Rl => "rl",
        };
        format!("{stage}-{:08}", self.step)
    }

    fn parse(name: &str) -> Option<Self> {
        let (stage, step) = name.split_once('-')?;
        let stage = match stage {
            "sft" => StageKind::Sft,
            "rl" => StageKind::Rl,
            _ => return None,
        };
        Some(Self {
            stage,
            step: step.parse().ok()?,
        })
    }
}

/// The stage a checkpoint resumes into.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StageState {
    /// Supervised fine-tuning, at this position of its dataset.
    Sft {
        position: SftPosition,
        progress: SftProgress,
    },
    /// Reinforcement learning, with the pipeline's state.
    Rl { pipeline: PipelineState },
}

/// `state.json`: everything of a run besides the actor's own checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunState {
    pub format_version: u32,
    pub stage: StageState,
    pub summary: RunSummary,
    /// Lines of `metrics.jsonl` written when the checkpoint was taken.
    pub metrics_lines: u64,
    /// Time since the run started, resumes included.
    pub elapsed: Duration,
}

impl RunState {
    pub(crate) fn new(
        stage: StageState,
        summary: RunSummary,
        metrics_lines: u64,
        elapsed: Duration,
    ) -> Self {
        Self {
            format_version: FORMAT_VERSION,
            stage,
            summary,
            metrics_lines,
            elapsed,
        }
    }
}

/// A checkpoint that read back: its directory and state.
pub(crate) type Found = (PathBuf, RunState);

/// A checkpoint that did not read back, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedCheckpoint {
    /// Its directory.
    pub path: PathBuf,
    /// What was wrong with it.
    pub reason: String,
}

/// How a resumed run started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resumed {
    /// The checkpoint it continued from.
    pub checkpoint: PathBuf,
    /// Newer checkpoints that were skipped because they did not read back.
    pub skipped: Vec<SkippedCheckpoint>,
    /// Lines of `metrics.jsonl` that could not be parsed (a line cut short by a crash) and were
    /// dropped.
    pub metrics_lines_dropped: u64,
}

fn bad(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::invalid_data("checkpoint", format!("{}: {message}", path.display()))
}

fn fsync(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io("cannot fsync", path))
}

/// Every file under `dir` (relative paths with `/`, sorted), excluding the manifest.
fn files_under(dir: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
        for entry in fs::read_dir(dir).map_err(io("cannot list", dir))? {
            let entry = entry.map_err(io("cannot list", dir))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(io("cannot stat", &path))?;
            if kind.is_dir() {
                walk(root, &path, out)?;
            } else if let Ok(rel) = path.strip_prefix(root) {
                let rel: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(rel.join("/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.retain(|f| f != MANIFEST);
    out.sort();
    Ok(out)
}

/// Size and CRC-32 of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileSum {
    bytes: u64,
    crc32: u32,
}

fn checksum(path: &Path) -> Result<FileSum> {
    let mut file = File::open(path).map_err(io("cannot read", path))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io("cannot read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(FileSum {
        bytes,
        crc32: hasher.finalize(),
    })
}

/// Fsyncs every file and directory under `dir`, then writes its manifest.
fn seal(dir: &Path) -> Result<()> {
    let mut manifest = BTreeMap::new();
    for rel in files_under(dir)? {
        let path = dir.join(&rel);
        fsync(&path)?;
        manifest.insert(rel, checksum(&path)?);
    }
    let path = dir.join(MANIFEST);
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| bad(&path, e))?;
    let mut file = File::create(&path).map_err(io("cannot write", &path))?;
    file.write_all(&json)
        .and_then(|()| file.sync_all())
        .map_err(io("cannot write", &path))?;
    fsync_dirs(dir)
}

fn fsync_dirs(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(io("cannot list", dir))?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            fsync_dirs(&entry.path())?;
        }
    }
    fsync(dir)
}

/// Checks `dir` against its manifest and reads its state.
fn verify(dir: &Path) -> Result<RunState> {
    let path = dir.join(MANIFEST);
    let text = fs::read(&path).map_err(|e| bad(dir, format!("no readable manifest ({e})")))?;
    let manifest: BTreeMap<String, FileSum> =
        serde_json::from_slice(&text).map_err(|e| bad(&path, format!("unreadable: {e}")))?;
    let present = files_under(dir)?;
    let listed: Vec<&String> = manifest.keys().collect();
    if present.iter().collect::<Vec<_>>() != listed {
        return Err(bad(
            dir,
            format!("holds files {present:?}, its manifest lists {listed:?}"),
        ));
    }
    for (rel, want) in &manifest {
        let got = checksum(&dir.join(rel))?;
        if got != *want {
            return Err(bad(
                dir,
                format!(
                    "{rel} has {} bytes with CRC-32 {:08x}; the manifest says {} bytes, {:08x}",
                    got.bytes, got.crc32, want.bytes, want.crc32
                ),
            ));
        }
    }
    let path = dir.join(STATE);
    let text = fs::read(&path).map_err(io("cannot read", &path))?;
    let state: RunState = serde_json::from_slice(&text).map_err(|e| bad(&path, e))?;
    if state.format_version != FORMAT_VERSION {
        return Err(bad(
            &path,
            format!(
                "format version {} (this build reads {FORMAT_VERSION})",
                state.format_version
            ),
        ));
    }
    Ok(state)
}

/// The named checkpoints under `root`, newest first.
fn listed(root: &Path) -> Result<Vec<(CheckpointId, PathBuf)>> {
    let mut found = Vec::new();
    if !root.exists() {
        return Ok(found);
    }
    for entry in fs::read_dir(root).map_err(io("cannot list", root))? {
        let entry = entry.map_err(io("cannot list", root))?;
        if let Some(id) = CheckpointId::parse(&entry.file_name().to_string_lossy()) {
            found.push((id, entry.path()));
        }
    }
    found.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
    Ok(found)
}

/// Saves a checkpoint `id` under `root`: the actor through `write_actor` (given the directory
/// to write into), then `state`; keeps the newest `keep` checkpoints.
pub(crate) fn save(
    root: &Path,
    id: CheckpointId,
    state: &RunState,
    keep: u32,
    write_actor: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    fs::create_dir_all(root).map_err(io("cannot create", root))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = root.join(format!("{TMP_PREFIX}{}-{nanos}", std::process::id()));
    let written = (|| {
        fs::create_dir(&tmp).map_err(io("cannot create", &tmp))?;
        write_actor(&tmp.join(ACTOR))?;
        let path = tmp.join(STATE);
        let json = serde_json::to_vec_pretty(state).map_err(|e| bad(&path, e))?;
        fs::write(&path, json).map_err(io("cannot write", &path))?;
        seal(&tmp)
    })();
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let target = root.join(id.name());
    if target.exists() {
        // An earlier checkpoint of the same step: one a resume skipped as unreadable, or the
        // same step saved again. The new one replaces it.
        fs::remove_dir_all(&target).map_err(io("cannot replace", &target))?;
    }
    fs::rename(&tmp, &target).map_err(io("cannot move the finished checkpoint to", &target))?;
    fsync(root)?;
    prune(root, keep);
    Ok(target)
}

/// Deletes all but the newest `keep` checkpoints, and leftovers of interrupted saves (best
/// effort: a checkpoint that cannot be deleted is only disk space).
fn prune(root: &Path, keep: u32) {
    if let Ok(found) = listed(root) {
        for (_, path) in found.into_iter().skip(keep as usize) {
            let _ = fs::remove_dir_all(path);
        }
    }
    if let Ok(entries) = fs::read_dir(root) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// The newest checkpoint under `root` that reads back, with its state; the newer ones that did
/// not, each with a warning in the log.
pub(crate) fn newest(root: &Path) -> Result<(Option<Found>, Vec<SkippedCheckpoint>)> {
    let mut skipped = Vec::new();
    for (_, path) in listed(root)? {
        match verify(&path) {
            Ok(state) => return Ok((Some((path, state)), skipped)),
            Err(e) => {
                tracing::warn!(
                    checkpoint = %path.display(),
                    "skipping a checkpoint that does not read back: {e}"
                );
                skipped.push(SkippedCheckpoint {
                    path,
                    reason: e.to_string(),
                });
            }
        }
    }
    Ok((None, skipped))
}

/// Deletes the checkpoints of an earlier run in the same directory (a fresh start must never
/// resume from them later), saying so in the log.
pub(crate) fn clear(root: &Path) -> Result<()> {
    if root.exists() {
        tracing::warn!(
            dir = %root.display(),
            "`run.resume` is off: deleting the checkpoints of an earlier run in this directory"
        );
        fs::remove_dir_all(root).map_err(io("cannot delete the old checkpoints in", root))?;
    }
    Ok(())
}

/// Keeps the first `lines` lines of the metrics file that parse as JSON (a line cut short by a
/// crash does not), rewriting the file atomically; returns how many unparsable lines were
/// dropped. Lines past `lines` belong to steps after the checkpoint, which run again.
pub(crate) fn truncate_metrics(path: &Path, lines: u64) -> Result<u64> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && lines == 0 => return Ok(0),
        Err(e) => return Err(io("cannot read the metrics file", path)(e)),
    };
    let mut kept = String::new();
    let (mut count, mut dropped) = (0u64, 0u64);
    for line in BufReader::new(file).split(b'\n') {
        if count == lines {
            break;
        }
        let line = line.map_err(io("cannot read the metrics file", path))?;
        match serde_json::from_slice::<serde_json::Value>(&line) {
            Ok(serde_json::Value::Object(_)) => {
                kept.push_str(&String::from_utf8_lossy(&line));
                kept.push('\n');
                count += 1;
            }
            _ => {
                tracing::warn!(
                    file = %path.display(),
                    "dropping a metrics line that does not parse (cut short by a crash?)"
                );
                dropped += 1;
            }
        }
    }
    let tmp = path.with_extension("jsonl.tmp");
    fs::write(&tmp, kept).map_err(io("cannot write the metrics file", &tmp))?;
    fsync(&tmp)?;
    fs::rename(&tmp, path).map_err(io("cannot replace the metrics file", path))?;
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: u64) -> RunState {
        RunState::new(
            StageState::Sft {
                position: SftPosition {
                    step,
                    epoch: 0,
                    cursor: step as usize * 4,
                },
                progress: SftProgress::default(),
            },
            RunSummary::default(),
            step,
            Duration::from_secs(step),
        )
    }

    fn save_sft(root: &Path, step: u64, keep: u32) -> PathBuf {
        let id = CheckpointId {
            stage: StageKind::Sft,
            step,
        };
        save(root, id, &state(step), keep, |dir| {
            fs::create_dir_all(dir).map_err(io("create", dir))?;
            fs::write(dir.join("weights.bin"), vec![step as u8; 1000]).map_err(io("write", dir))
        })
        .expect("save")
    }

    fn fresh_root(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("roll-ckpt-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        root
    }

    #[test]
    fn a_state_with_nan_numbers_reads_back() {
        let root = fresh_root("nan");
        let mut state = state(1);
        let mut report = roll_core::pipeline::StepReport::default();
        report
            .metrics
            .insert("batch/token_kl_mean".into(), f64::NAN);
        report.metrics.insert("reward/mean".into(), 0.5);
        state.summary.rl.push(report);
        state.summary.sft = Some(super::super::SftSummary {
            steps: 3,
            loss_first: 1.0,
            loss_last: 0.5,
            eval_loss_start: f64::NAN,
            eval_loss: f64::NAN,
            time: Duration::from_secs(1),
        });
        let id = CheckpointId {
            stage: StageKind::Sft,
            step: 1,
        };
        save(&root, id, &state, 1, |dir| {
            fs::create_dir_all(dir).map_err(io("create", dir))
        })
        .expect("save");
        let (found, skipped) = newest(&root).expect("newest");
        assert!(skipped.is_empty(), "{skipped:?}");
        let summary = found.expect("reads back").1.summary;
        assert!(summary.rl[0].metrics["batch/token_kl_mean"].is_nan());
        assert_eq!(summary.rl[0].metrics["reward/mean"], 0.5);
        assert!(summary.sft.expect("sft").eval_loss.is_nan());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn names_order_sft_before_rl_and_by_step() {
        let sft9 = CheckpointId::parse("sft-00000009").expect("parses");
        let rl0 = CheckpointId::parse("rl-00000000").expect("parses");
        assert!(rl0 > sft9);
        assert_eq!(CheckpointId::parse(&rl0.name()), Some(rl0));
        assert_eq!(CheckpointId::parse(".tmp-1-2"), None);
        assert_eq!(CheckpointId::parse("rl-x"), None);
    }

    #[test]
    fn newest_complete_checkpoint_wins_and_retention_is_kept() {
        let root = fresh_root("retention");
        for step in 1..=4 {
            save_sft(&root, step, 2);
        }
        let names: Vec<_> = listed(&root)
            .expect("list")
            .into_iter()
            .map(|(id, _)| id.step)
            .collect();
        assert_eq!(names, vec![4, 3]);
        // A save that died half-way leaves a temp dir, which is ignored.
        fs::create_dir_all(root.join(".tmp-999-1/actor")).expect("tmp");
        let (found, skipped) = newest(&root).expect("newest");
        let (path, state) = found.expect("a checkpoint");
        assert!(path.ends_with("sft-00000004"));
        assert_eq!(state.metrics_lines, 4);
        assert!(skipped.is_empty());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn corrupted_or_truncated_newest_is_skipped_for_the_previous() {
        let root = fresh_root("corrupt");
        save_sft(&root, 1, 3);
        let second = save_sft(&root, 2, 3);
        let third = save_sft(&root, 3, 3);
        // The newest: one byte flipped. The one before: a file cut short.
        let weights = third.join(ACTOR).join("weights.bin");
        let mut bytes = fs::read(&weights).expect("read");
        bytes[10] ^= 0xff;
        fs::write(&weights, bytes).expect("write");
        let weights = second.join(ACTOR).join("weights.bin");
        fs::write(&weights, vec![2u8; 10]).expect("truncate");
        let (found, skipped) = newest(&root).expect("newest");
        assert!(found.expect("falls back").0.ends_with("sft-00000001"));
        assert_eq!(skipped.len(), 2);
        assert!(
            skipped[0].reason.contains("CRC-32"),
            "{}",
            skipped[0].reason
        );
        assert!(
            skipped[1].reason.contains("10 bytes"),
            "{}",
            skipped[1].reason
        );
        // No manifest at all (the state written, the seal not): skipped too.
        fs::remove_file(root.join("sft-00000001").join(MANIFEST)).expect("rm");
        let (found, skipped) = newest(&root).expect("newest");
        assert!(found.is_none());
        assert!(
            skipped[2].reason.contains("manifest"),
            "{}",
            skipped[2].reason
        );
        // Saving the same step again replaces the bad copy.
        save_sft(&root, 3, 3);
        assert!(
            newest(&root)
                .expect("newest")
                .0
                .expect("ok")
                .0
                .ends_with("sft-00000003")
        );
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn metrics_keep_the_checkpoint_lines_and_drop_a_cut_line() {
        let root = fresh_root("metrics");
        fs::create_dir_all(&root).expect("dir");
        let path = root.join("metrics.jsonl");
        fs::write(
            &path,
            "{\"step\":0}\n{\"step\":1}\n{\"step\":2,\"los\n{\"step\":2}\n{\"step\":3}\n",
        )
        .expect("write");
        let dropped = truncate_metrics(&path, 3).expect("truncate");
        assert_eq!(dropped, 1);
        let text = fs::read_to_string(&path).expect("read");
        assert_eq!(text, "{\"step\":0}\n{\"step\":1}\n{\"step\":2}\n");
        let _ = fs::remove_dir_all(&root);
    }
}
