//! [`HfSource`]: everything of a HuggingFace model directory except its weights, kept with a
//! loaded model so that an export writes back what was read.

use super::config::{GenerationConfig, HfConfig};
use super::load::load_weights;
use crate::models::CausalLm;
use crate::{BackendError, Result};
use burn::tensor::Device;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Extensions of weight files, in any framework's format: an export writes new weights, so
/// copying one of these would ship stale ones next to them.
const WEIGHT_EXTENSIONS: [&str; 9] = [
    "safetensors",
    "bin",
    "pt",
    "pth",
    "ckpt",
    "h5",
    "msgpack",
    "gguf",
    "onnx",
];

/// What a model was loaded from, without the weights: `config.json` exactly as written (every
/// key, unknown ones included, and its bytes), the parsed [`HfConfig`], the ids of
/// `generation_config.json`, and every other file of the directory — tokenizer files
/// (`tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`, `vocab.json`,
/// `merges.txt`, `added_tokens.json`, ...), chat templates, `generation_config.json`, README,
/// LICENSE.
///
/// The files are read into memory when the source is opened (a few MB for a Qwen tokenizer),
/// so an export works even after the source directory is gone, and writes what was loaded
/// rather than what the directory holds by then. Only top-level regular files are kept
/// (symlinks are followed, as in a HF cache snapshot); hidden files, subdirectories, weight
/// files of any format (`*.safetensors`, `*.bin`, `*.pt`, `*.gguf`, ... and `*.index.json`)
/// are not.
#[derive(Debug, Clone)]
pub struct HfSource {
    dir: PathBuf,
    config_bytes: Vec<u8>,
    raw_config: serde_json::Map<String, serde_json::Value>,
    config: HfConfig,
    generation: GenerationConfig,
    files: BTreeMap<String, Vec<u8>>,
}

impl HfSource {
    /// Reads and validates `dir/config.json`, reads the generation ids and every other
    /// non-weight file (see the type's docs).
    ///
    /// # Errors
    /// [`BackendError::Io`] for an unreadable directory or file, [`BackendError::InvalidJson`]
    /// for a malformed `config.json` or `generation_config.json`, the errors of
    /// [`HfConfig::validate`], and [`BackendError::InvalidConfigField`] for a
    /// `generation_config.json` token id outside the vocabulary.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let config_path = dir.join("config.json");
        let config_bytes =
            std::fs::read(&config_path).map_err(|e| BackendError::io(&config_path, e))?;
        let json_error = |message: String| BackendError::InvalidJson {
            path: config_path.clone(),
            message,
        };
        let value: serde_json::Value =
            serde_json::from_slice(&config_bytes).map_err(|e| json_error(e.to_string()))?;
        let raw_config = value
            .as_object()
            .cloned()
            .ok_or_else(|| json_error("the top level is not an object".into()))?;
        let config = HfConfig::from_json(value).map_err(|e| match e {
            BackendError::InvalidJson { message, .. } => json_error(message),
            other => other,
        })?;
        let generation = GenerationConfig::from_dir(dir)?;
        check_generation_ids(&generation, config.vocab_size)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            config_bytes,
            raw_config,
            config,
            generation,
            files: read_other_files(dir)?,
        })
    }

    /// The directory the source was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed, validated config.
    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// `config.json` as written, every key included.
    pub fn raw_config(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.raw_config
    }

    /// The bytes of `config.json`.
    pub fn config_bytes(&self) -> &[u8] {
        &self.config_bytes
    }

    /// End-of-sequence, padding and beginning-of-sequence ids (`generation_config.json`, else
    /// `config.json`).
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// The other files, by name: tokenizer files, chat templates, `generation_config.json`, ...
    pub fn files(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.files
    }

    /// Builds the model of [`Self::config`] and loads its weights from [`Self::dir`].
    ///
    /// # Errors
    /// As [`crate::load_model`].
    pub fn load_model(&self, device: &Device) -> Result<CausalLm> {
        let mut model = CausalLm::init(&self.config, device)?;
        match &mut model {
            CausalLm::Qwen2(m) => load_weights(m, &self.dir)?,
            CausalLm::Qwen3(m) => load_weights(m, &self.dir)?,
            CausalLm::Qwen3Moe(m) => load_weights(m, &self.dir)?,
        }
        Ok(model)
    }
}

/// The model of `dir` and the [`HfSource`] to export it under later: what a trainer that will
/// write its result back as a HF directory loads with.
///
/// # Errors
/// As [`HfSource::open`] and [`crate::load_model`].
///
/// # Example
/// ```no_run
/// use roll_backend_burn::hf::{export_hf_dir, load_model_and_source};
/// let device = roll_backend_burn::Device::flex();
/// let (model, source) = load_model_and_source("path/to/Qwen2.5-0.5B", &device)?;
/// // ... train ...
/// export_hf_dir(&model, &source, "out/step-100", &Default::default())?;
/// # Ok::<(), roll_backend_burn::BackendError>(())
/// ```
pub fn load_model_and_source(
    dir: impl AsRef<Path>,
    device: &Device,
) -> Result<(CausalLm, HfSource)> {
    let source = HfSource::open(dir)?;
    let model = source.load_model(device)?;
    Ok((model, source))
}

/// Whether `name` is a weight file or a weight index (never copied by an export).
pub(crate) fn is_weight_file(name: &str) -> bool {
    name.ends_with(".index.json")
        || Path::new(name)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| WEIGHT_EXTENSIONS.contains(&e))
}

/// Every top-level regular non-weight file of `dir` but `config.json`, by name.
fn read_other_files(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(|e| BackendError::io(dir, e))? {
        let entry = entry.map_err(|e| BackendError::io(dir, e))?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue; // not UTF-8: no HF file is named so
        };
        if name.starts_with('.') || name == "config.json" || is_weight_file(&name) {
            continue;
        }
        // `metadata` follows symlinks: HF cache snapshots link every file to a blob.
        let meta = std::fs::metadata(&path).map_err(|e| BackendError::io(&path, e))?;
        if !meta.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| BackendError::io(&path, e))?;
        files.insert(name, bytes);
    }
    Ok(files)
}

/// Generation stops on the eos ids and pads with the pad id: each must be a token of the model.
fn check_generation_ids(generation: &GenerationConfig, vocab_size: usize) -> Result<()> {
    let ids = generation
        .eos_token_ids
        .iter()
        .map(|&id| ("eos_token_id", id))
        .chain(generation.pad_token_id.map(|id| ("pad_token_id", id)))
        .chain(generation.bos_token_id.map(|id| ("bos_token_id", id)));
    for (key, id) in ids {
        if id as usize >= vocab_size {
            return Err(BackendError::InvalidConfigField {
                field: format!("generation_config.{key}"),
                value: id.to_string(),
                allowed: format!("a token id below vocab_size ({vocab_size})"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_files_of_every_format_are_recognised() {
        for name in [
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "pytorch_model.bin.index.json",
            "training_args.bin",
            "consolidated.pth",
            "model.gguf",
        ] {
            assert!(is_weight_file(name), "{name}");
        }
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "merges.txt",
            "vocab.json",
            "chat_template.jinja",
            "README.md",
            "LICENSE",
        ] {
            assert!(!is_weight_file(name), "{name}");
        }
    }
}
