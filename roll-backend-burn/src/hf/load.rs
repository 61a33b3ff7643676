//! Loading HuggingFace safetensors checkpoints into the models.

use super::config::{HfConfig, read_json};
use crate::models::CausalLm;
use crate::{BackendError, Result};
use burn::store::{
    ApplyError, FloatCastAdapter, ModuleAdapter, ModuleSnapshot, PyTorchToBurnAdapter,
    SafetensorsStore,
};
use burn::tensor::{DType, Device};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Loads a HuggingFace model directory: `config.json` picks the architecture, the weights come
/// from `model.safetensors` or from the shards listed in `model.safetensors.index.json`.
/// f32, bf16 and f16 checkpoints all load as f32 parameters. To export the trained model back
/// as a HF directory later, load with [`super::load_model_and_source`] instead.
///
/// # Errors
/// [`BackendError::Io`] for a missing or unreadable file, [`BackendError::InvalidJson`],
/// [`BackendError::UnknownModelType`], [`BackendError::InvalidConfigField`] (see
/// [`HfConfig::validate`]), [`BackendError::InvalidConfig`],
/// [`BackendError::MissingTensor`], [`BackendError::ShapeMismatch`] and
/// [`BackendError::Safetensors`] (truncated or corrupt file), each naming the file or tensor.
///
/// # Example
/// ```no_run
/// let device = roll_backend_burn::Device::flex();
/// let model = roll_backend_burn::load_model("path/to/Qwen2.5-0.5B", &device)?;
/// # Ok::<(), roll_backend_burn::BackendError>(())
/// ```
pub fn load_model(dir: impl AsRef<Path>, device: &Device) -> Result<CausalLm> {
    let dir = dir.as_ref();
    // Parsed in either transformers spelling and validated field by field.
    let config = HfConfig::from_file(dir.join("config.json"))?;
    let mut model = CausalLm::init(&config, device)?;
    match &mut model {
        CausalLm::Qwen2(m) => load_weights(m, dir)?,
        CausalLm::Qwen3(m) => load_weights(m, dir)?,
        CausalLm::Qwen3Moe(m) => load_weights(m, dir)?,
    }
    Ok(model)
}

/// Fills every parameter of `module` from the safetensors of `dir`, whose tensor names must be the
/// module's field paths in HF layout (what HF `*ForCausalLM` checkpoints hold for this crate's
/// models). Tensors the module does not use are ignored (e.g. a tied `lm_head.weight`).
///
/// # Errors
/// As [`load_model`].
pub fn load_weights<M: ModuleSnapshot>(module: &mut M, dir: &Path) -> Result<()> {
    let files = weight_files(dir)?;
    // A tensor is missing if no shard provided it.
    let mut missing: Option<BTreeSet<String>> = None;
    for file in &files {
        std::fs::metadata(file).map_err(|e| BackendError::io(file, e))?;
        let adapter = PyTorchToBurnAdapter.chain(FloatCastAdapter::to(DType::F32));
        let mut store = SafetensorsStore::from_file(file)
            .with_from_adapter(adapter)
            .allow_partial(true)
            .validate(false)
            .skip_enum_variants(true);
        let result = module
            .load_from(&mut store)
            .map_err(|e| BackendError::Safetensors {
                path: file.clone(),
                message: e.to_string(),
            })?;
        if let Some(err) = result.errors.first() {
            return Err(apply_error(err, file));
        }
        let here: BTreeSet<String> = result.missing.iter().map(|(p, _)| p.clone()).collect();
        missing = Some(match missing {
            None => here,
            Some(before) => before.intersection(&here).cloned().collect(),
        });
    }
    if let Some(name) = missing.and_then(|m| m.into_iter().next()) {
        return Err(BackendError::MissingTensor {
            name: hf_name(&name),
            dir: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// The safetensors files of `dir`: the shards of the index if there is one, else
/// `model.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let v: serde_json::Value = read_json(&index)?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| BackendError::InvalidJson {
                path: index.clone(),
                message: "no `weight_map` object".into(),
            })?;
        let mut files = BTreeSet::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| BackendError::InvalidJson {
                path: index.clone(),
                message: format!("`weight_map.{name}` is not a file name"),
            })?;
            files.insert(dir.join(file));
        }
        return Ok(files.into_iter().collect());
    }
    let single = dir.join("model.safetensors");
    std::fs::metadata(&single).map_err(|e| BackendError::io(&single, e))?;
    Ok(vec![single])
}

/// The HF name of a Burn parameter path (`gamma` is RMSNorm's `weight`).
pub(crate) fn hf_name(path: &str) -> String {
    match path.strip_suffix(".gamma") {
        Some(stem) => format!("{stem}.weight"),
        None => path.to_string(),
    }
}

/// A shape in HF layout: Burn's `Linear` weights are `[in, out]`, HF's `[out, in]`.
fn hf_shape(name: &str, shape: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    if s.len() == 2 && name.ends_with(".weight") && !name.contains("embed_tokens") {
        s.reverse();
    }
    s
}

fn apply_error(err: &ApplyError, file: &Path) -> BackendError {
    match err {
        ApplyError::ShapeMismatch {
            path,
            expected,
            found,
        } => {
            let name = hf_name(path);
            BackendError::ShapeMismatch {
                expected: hf_shape(&name, expected.as_slice()),
                found: hf_shape(&name, found.as_slice()),
                name,
            }
        }
        other => BackendError::Safetensors {
            path: file.to_path_buf(),
            message: other.to_string(),
        },
    }
}
