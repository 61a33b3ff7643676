//! Atomic trainer checkpoints.
//!
//! Layout of a checkpoint directory `dir`:
//!
//! ```text
//! dir/LATEST                      name of the current checkpoint (one line)
//! dir/ckpt-<step>-<nonce>/
//!     trainer.json                step, weight version, RNG state, trainer and model configs
//!     model.bpk                   every parameter (base, LoRA A/B, value head) with its ParamId
//!     optimizer.bpk               AdamW moments and step counts, keyed by ParamId
//! ```
//!
//! Saving writes a fresh `dir/.tmp-<nonce>/`, fsyncs every file and the directory, renames it to
//! `ckpt-…` (atomic), then replaces `LATEST` by writing `.LATEST-<nonce>` and renaming it over
//! (atomic), and finally deletes older `ckpt-…` directories and leftovers of interrupted saves. A
//! crash at any point leaves `LATEST` naming a complete checkpoint; loading reads only what
//! `LATEST` names, so leftovers never matter. One writer per directory at a time.
//!
//! Files are Burn's burnpack records (`Module::into_record`, `ModuleOptimizer::to_record`): raw
//! little-endian tensor bytes plus each parameter's `ParamId`, so a loaded model and optimiser
//! line up exactly and the next step is bit-for-bit the uninterrupted one.

use super::config::TrainerConfig;
use super::lora::TrainerRng;
use crate::hf::HfConfig;
use crate::{BackendError, Result};
use burn::module::Module;
use burn::optim::{ModuleOptimizer, OptimizerRecord};
use burn::store::ModuleRecord;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

const FORMAT_VERSION: u32 = 1;
const LATEST: &str = "LATEST";
const META_FILE: &str = "trainer.json";
const MODEL_FILE: &str = "model.bpk";
const OPTIMIZER_FILE: &str = "optimizer.bpk";
const CKPT_PREFIX: &str = "ckpt-";
const TMP_PREFIX: &str = ".tmp-";
const LATEST_TMP_PREFIX: &str = ".LATEST-";

/// Which trainer wrote a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TrainedRole {
    /// [`super::Trainer`].
    Actor,
    /// [`super::CriticTrainer`].
    Critic,
}

/// `trainer.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointMeta {
    pub format_version: u32,
    pub role: TrainedRole,
    pub step: u64,
    pub weight_version: u64,
    pub rng: TrainerRng,
    pub config: TrainerConfig,
    pub model_config: HfConfig,
}

impl CheckpointMeta {
    pub(crate) fn new(
        role: TrainedRole,
        step: u64,
        weight_version: u64,
        rng: TrainerRng,
        config: TrainerConfig,
        model_config: HfConfig,
    ) -> Self {
        Self {
            format_version: FORMAT_VERSION,
            role,
            step,
            weight_version,
            rng,
            config,
            model_config,
        }
    }
}

/// A checkpoint read back.
pub(crate) struct Loaded {
    pub meta: CheckpointMeta,
    pub model: ModuleRecord,
    pub optimizer: OptimizerRecord,
    /// The model file (for error messages).
    pub file: PathBuf,
}

fn err(path: &Path, message: impl std::fmt::Display) -> BackendError {
    BackendError::Checkpoint {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

fn sync_path(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| err(path, format!("fsync failed: {e}")))
}

fn nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

/// Writes `module`, `optim` and `meta` as the new current checkpoint of `dir`; returns the
/// checkpoint's own directory.
pub(crate) fn save<M: Module>(
    dir: &Path,
    module: &M,
    optim: &ModuleOptimizer,
    meta: &CheckpointMeta,
) -> Result<PathBuf> {
    fs::create_dir_all(dir).map_err(|e| err(dir, format!("cannot create: {e}")))?;
    let nonce = nonce();
    let tmp = dir.join(format!("{TMP_PREFIX}{nonce}"));
    let result = write_files(&tmp, module, optim, meta).and_then(|()| {
        let name = format!("{CKPT_PREFIX}{:010}-{nonce}", meta.step);
        let target = dir.join(&name);
        fs::rename(&tmp, &target).map_err(|e| {
            err(
                &target,
                format!("cannot rename the finished save into place: {e}"),
            )
        })?;
        sync_path(dir)?;
        point_latest(dir, &name, &nonce)?;
        Ok((name, target))
    });
    match result {
        Ok((name, target)) => {
            remove_stale(dir, &name);
            Ok(target)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

fn write_files<M: Module>(
    tmp: &Path,
    module: &M,
    optim: &ModuleOptimizer,
    meta: &CheckpointMeta,
) -> Result<()> {
    fs::create_dir(tmp).map_err(|e| err(tmp, format!("cannot create: {e}")))?;
    let model_file = tmp.join(MODEL_FILE);
    module
        .clone()
        .into_record()
        .save(&model_file)
        .map_err(|e| err(&model_file, e))?;
    let optim_file = tmp.join(OPTIMIZER_FILE);
    optim
        .to_record()
        .save(&optim_file)
        .map_err(|e| err(&optim_file, e))?;
    let meta_file = tmp.join(META_FILE);
    let json = serde_json::to_vec_pretty(meta).map_err(|e| err(&meta_file, e))?;
    fs::write(&meta_file, json).map_err(|e| err(&meta_file, e))?;
    for f in [&model_file, &optim_file, &meta_file] {
        sync_path(f)?;
    }
    sync_path(tmp)
}

/// Atomically replaces `dir/LATEST` with `name`.
fn point_latest(dir: &Path, name: &str, nonce: &str) -> Result<()> {
    let tmp = dir.join(format!("{LATEST_TMP_PREFIX}{nonce}"));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(name.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()
    };
    write().map_err(|e| err(&tmp, e))?;
    let latest = dir.join(LATEST);
    fs::rename(&tmp, &latest).map_err(|e| err(&latest, e))?;
    sync_path(dir)
}

/// Deletes older checkpoints and leftovers of interrupted saves (best effort).
fn remove_stale(dir: &Path, keep: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        if (name.starts_with(CKPT_PREFIX) && name != keep) || name.starts_with(TMP_PREFIX) {
            let _ = fs::remove_dir_all(&path);
        } else if name.starts_with(LATEST_TMP_PREFIX) {
            let _ = fs::remove_file(&path);
        }
    }
}

/// Reads the current checkpoint of `dir`, which must have been written by a trainer of `role`.
pub(crate) fn load(dir: &Path, role: TrainedRole) -> Result<Loaded> {
    let latest = dir.join(LATEST);
    let name = fs::read_to_string(&latest).map_err(|e| {
        err(
            &latest,
            format!("cannot read ({e}): not a checkpoint directory, or no save completed"),
        )
    })?;
    let name = name.trim();
    if !name.starts_with(CKPT_PREFIX) || name.contains(['/', '\\']) || name.contains("..") {
        return Err(err(&latest, format!("names `{name}`, not a checkpoint")));
    }
    let ckpt = dir.join(name);
    let meta_file = ckpt.join(META_FILE);
    let text = fs::read_to_string(&meta_file).map_err(|e| err(&meta_file, e))?;
    let meta: CheckpointMeta = serde_json::from_str(&text).map_err(|e| err(&meta_file, e))?;
    if meta.format_version != FORMAT_VERSION {
        return Err(err(
            &meta_file,
            format!(
                "format version {} (this build reads {FORMAT_VERSION})",
                meta.format_version
            ),
        ));
    }
    if meta.role != role {
        return Err(err(
            &meta_file,
            format!("written by a {:?} trainer, loaded as {role:?}", meta.role),
        ));
    }
    let model_file = ckpt.join(MODEL_FILE);
    let model = ModuleRecord::load(&model_file).map_err(|e| err(&model_file, e))?;
    let optim_file = ckpt.join(OPTIMIZER_FILE);
    let optimizer = OptimizerRecord::load(&optim_file).map_err(|e| err(&optim_file, e))?;
    Ok(Loaded {
        meta,
        model,
        optimizer,
        file: model_file,
    })
}

/// Applies a model record (values and `ParamId`s); `allow_unused` lets a record with LoRA
/// factors fill a model without adapters (its base).
pub(crate) fn apply_record<M: Module>(
    module: M,
    record: ModuleRecord,
    allow_unused: bool,
    file: &Path,
) -> Result<M> {
    module
        .try_load_record(record.allow_unused(allow_unused))
        .map_err(|e| err(file, e))
}
