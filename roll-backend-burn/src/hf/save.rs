//! Saving models as HuggingFace directories (`config.json` + safetensors, sharded with an index
//! above a size threshold), loadable by HF transformers.

use crate::models::CausalLm;
use crate::{BackendError, Result};
use burn::store::{
    BurnToPyTorchAdapter, FloatCastAdapter, IdentityAdapter, ModuleAdapter, ModuleSnapshot,
    SafetensorsStore,
};
use burn::tensor::DType;
use std::path::Path;

/// The dtype of saved weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaveDtype {
    /// 32-bit floats (exact for f32 models).
    #[default]
    F32,
    /// bfloat16 (what most Qwen checkpoints ship in).
    Bf16,
    /// IEEE half precision.
    F16,
}

impl SaveDtype {
    fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
        }
    }

    /// The name HF `config.json` uses (`dtype`).
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }

    fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }
}

/// How to save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveOptions {
    /// Dtype of the written weights.
    pub dtype: SaveDtype,
    /// Above this many bytes of weights, write `model-0000i-of-0000n.safetensors` shards (no
    /// shard exceeds it unless one tensor does) and `model.safetensors.index.json`.
    /// Default 5 GB, as HF's `save_pretrained`.
    pub max_shard_bytes: usize,
}

impl Default for SaveOptions {
    fn default() -> Self {
        Self {
            dtype: SaveDtype::F32,
            max_shard_bytes: 5_000_000_000,
        }
    }
}

impl SaveOptions {
    /// Saves in `dtype`.
    pub fn with_dtype(mut self, dtype: SaveDtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Shards above `bytes`.
    pub fn with_max_shard_bytes(mut self, bytes: usize) -> Self {
        self.max_shard_bytes = bytes;
        self
    }
}

/// Writes `model` to `dir` as a HF model directory: the weights (see [`save_weights`]) and a
/// `config.json` rebuilt from the architecture alone ([`CausalLm::hf_config`]).
///
/// For a model that was loaded from a HF directory use [`super::export_hf_dir`] instead: it
/// writes back the loaded `config.json` with every key (`max_position_embeddings`, token ids,
/// `layer_types`, ...) and the tokenizer and generation files, which this function cannot know.
///
/// # Errors
/// [`BackendError::Io`] / [`BackendError::Save`] naming the file that could not be written.
pub fn save_model(model: &CausalLm, dir: impl AsRef<Path>, options: &SaveOptions) -> Result<()> {
    model.require_whole("be saved")?;
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| BackendError::io(dir, e))?;
    let mut config = model.hf_config();
    config
        .extra
        .insert("dtype".into(), options.dtype.hf_name().into());
    write_json(&dir.join("config.json"), &config)?;
    save_model_weights(model, dir, options)
}

/// [`save_weights`] of whichever architecture `model` is.
pub(crate) fn save_model_weights(
    model: &CausalLm,
    dir: &Path,
    options: &SaveOptions,
) -> Result<()> {
    match model {
        CausalLm::Qwen2(m) => save_weights(m, dir, options),
        CausalLm::Qwen3(m) => save_weights(m, dir, options),
        CausalLm::Qwen3Moe(m) => save_weights(m, dir, options),
    }
}

/// Writes the parameters of `module` to `dir` in HF layout (`Linear` weights `[out, in]`,
/// RMSNorm `weight`), as `model.safetensors` or, above `options.max_shard_bytes`, as shards plus
/// `model.safetensors.index.json`. Files carry the `{"format": "pt"}` metadata transformers
/// requires. A stale single file or index of the other layout is removed.
///
/// # Errors
/// [`BackendError::Io`] / [`BackendError::Save`] naming the file that could not be written.
pub fn save_weights<M: ModuleSnapshot>(
    module: &M,
    dir: &Path,
    options: &SaveOptions,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| BackendError::io(dir, e))?;
    let tensors = module.collect(None, Some(adapter(options)), true);
    let sized: Vec<(String, usize)> = tensors
        .iter()
        .map(|t| {
            let numel: usize = t.shape.as_slice().iter().product();
            (t.name.clone(), numel * options.dtype.bytes())
        })
        .collect();
    let total: usize = sized.iter().map(|(_, b)| b).sum();
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if total <= options.max_shard_bytes {
        remove_if_exists(&index)?;
        return write_file(module, &single, None, options);
    }
    // Greedy sharding in module order, as transformers does.
    let mut shards: Vec<Vec<String>> = vec![Vec::new()];
    let mut current = 0usize;
    for (name, bytes) in sized {
        if current > 0 && current + bytes > options.max_shard_bytes {
            shards.push(Vec::new());
            current = 0;
        }
        current += bytes;
        if let Some(last) = shards.last_mut() {
            last.push(name);
        }
    }
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (i, names) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        write_file(module, &dir.join(&file), Some(names), options)?;
        for name in names {
            weight_map.insert(name.clone(), file.clone().into());
        }
    }
    remove_if_exists(&single)?;
    let json = serde_json::json!({
        "metadata": { "total_size": total },
        "weight_map": weight_map,
    });
    write_json(&index, &json)
}

fn adapter(options: &SaveOptions) -> Box<dyn ModuleAdapter> {
    match options.dtype {
        SaveDtype::F32 => Box::new(BurnToPyTorchAdapter.chain(IdentityAdapter)),
        other => Box::new(BurnToPyTorchAdapter.chain(FloatCastAdapter::to(other.dtype()))),
    }
}

fn write_file<M: ModuleSnapshot>(
    module: &M,
    path: &Path,
    names: Option<&Vec<String>>,
    options: &SaveOptions,
) -> Result<()> {
    let mut store = SafetensorsStore::from_file(path)
        .clear_metadata()
        .metadata("format", "pt")
        .skip_enum_variants(true)
        .overwrite(true);
    store = match options.dtype {
        SaveDtype::F32 => store.with_to_adapter(BurnToPyTorchAdapter),
        other => {
            store.with_to_adapter(BurnToPyTorchAdapter.chain(FloatCastAdapter::to(other.dtype())))
        }
    };
    if let Some(names) = names {
        store = store.with_full_paths(names.iter().cloned());
    }
    module
        .save_into(&mut store)
        .map_err(|e| BackendError::Save {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(BackendError::io(path, e)),
        _ => Ok(()),
    }
}

pub(crate) fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| BackendError::Save {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    std::fs::write(path, text + "\n").map_err(|e| BackendError::io(path, e))
}
