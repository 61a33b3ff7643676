//! `config.json` and `generation_config.json` of a HuggingFace model directory.

use crate::{BackendError, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The fields of a HuggingFace `config.json` that the Qwen family uses.
///
/// One struct for all supported architectures (they share almost every field); each model file
/// turns it into its own Burn config (`Qwen2Config::from_hf`, ...). Fields this crate does not
/// read are kept in [`HfConfig::extra`], so serialising a parsed config loses no key; the exact
/// file a model was loaded from is kept by [`crate::hf::HfSource`], which is what
/// [`crate::hf::export_hf_dir`] writes back.
///
/// [`HfConfig::from_file`] reads both spellings transformers has used: 4.x (`rope_theta` and
/// `rope_scaling` at the top level, `torch_dtype`, hub Qwen3-MoE's `num_experts`) and 5.x
/// (`rope_parameters {rope_theta, rope_type}`, `dtype`, `num_local_experts`), fills keys the file
/// omits with transformers' class defaults, and validates every field
/// ([`HfConfig::validate`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HfConfig {
    /// `qwen2`, `qwen3` or `qwen3_moe`.
    pub model_type: String,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the dense SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to `num_attention_heads` for a config
    /// built in code (a `config.json` without it gets transformers' default, see
    /// [`HfConfig::from_file`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `hidden_size / num_attention_heads` (Qwen3 sets it explicitly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_rms_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base, transformers 4.x spelling (5.x writes `rope_parameters.rope_theta`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// RoPE parameters, transformers ≥ 5 (`{"rope_theta": .., "rope_type": "default"}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<RopeParameters>,
    /// RoPE scaling, transformers 4.x (`null` for plain RoPE; 5.x reads it as `rope_parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeParameters>,
    /// Longest sequence the model supports (positions `0..max_position_embeddings`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
    /// Attention kind of each layer (`full_attention`, `sliding_attention`), transformers ≥ 4.53.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Whether `sliding_window` applies at all (Qwen checkpoints ship `false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    /// Width of the sliding attention window, when used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// Qwen2/Qwen3: layers from this index on use the sliding window (when `layer_types` is
    /// absent and `use_sliding_window` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_window_layers: Option<usize>,
    /// Whether `lm_head` shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v/o projections (Qwen3 field; Qwen2 always has q/k/v bias).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// MoE: number of routed experts (`num_experts`; transformers 5 writes `num_local_experts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts: Option<usize>,
    /// MoE: experts chosen per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts_per_tok: Option<usize>,
    /// MoE: width of each expert's MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_intermediate_size: Option<usize>,
    /// MoE: renormalise the top-k routing weights to sum to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_topk_prob: Option<bool>,
    /// MoE: every `decoder_sparse_step`-th layer is sparse (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_sparse_step: Option<usize>,
    /// MoE: layers that stay dense.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_only_layers: Option<Vec<usize>>,
    /// MoE: width of the shared expert (Qwen2-MoE style, gated by a sigmoid); none when absent or 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_intermediate_size: Option<usize>,
    /// Every other field of the file, preserved for writing back.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// `rope_parameters` of a transformers-5 config (also the shape of 4.x's `rope_scaling`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeParameters {
    /// RoPE base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// `default` is the only type implemented (4.x configs may spell the key `type`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_type: Option<String>,
    /// Other fields, preserved.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn default_rms_eps() -> f64 {
    1e-6
}

impl HfConfig {
    /// Reads, completes and validates `config.json`.
    ///
    /// Both transformers spellings are accepted (see the type's docs); `num_local_experts` is
    /// folded into [`HfConfig::num_experts`]. Keys the file omits take transformers' class
    /// defaults, so a hand-written config loads as transformers would load it: Qwen2/Qwen3
    /// `num_key_value_heads` 32 (Qwen3-MoE 4), Qwen3 `head_dim` 128, `max_position_embeddings`
    /// 32768, Qwen3-MoE `num_experts` 128, `num_experts_per_tok` 8, `moe_intermediate_size` 768
    /// and `norm_topk_prob` false.
    ///
    /// # Errors
    /// [`BackendError::Io`] if the file cannot be read, [`BackendError::InvalidJson`] if it does
    /// not parse or lacks a required field, and the errors of [`HfConfig::validate`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let value: serde_json::Value = read_json(path)?;
        Self::from_json(value).map_err(|e| match e {
            BackendError::InvalidJson { message, .. } => BackendError::InvalidJson {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// [`HfConfig::from_file`] on an already parsed `config.json`.
    ///
    /// # Errors
    /// As [`HfConfig::from_file`] (an [`BackendError::InvalidJson`] names no file here).
    pub fn from_json(value: serde_json::Value) -> Result<Self> {
        let mut config: Self =
            serde_json::from_value(value).map_err(|e| BackendError::InvalidJson {
                path: PathBuf::from("config.json"),
                message: e.to_string(),
            })?;
        config.fold_num_local_experts()?;
        config.fill_transformers_defaults();
        config.validate()?;
        Ok(config)
    }

    /// Transformers 5 stores Qwen3-MoE's expert count as `num_local_experts` (its
    /// `attribute_map` aliases `num_experts` to it); hub checkpoints say `num_experts`.
    fn fold_num_local_experts(&mut self) -> Result<()> {
        let Some(value) = self.extra.remove("num_local_experts") else {
            return Ok(());
        };
        let n = value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| BackendError::InvalidConfigField {
                field: "num_local_experts".into(),
                value: value.to_string(),
                allowed: "a non-negative integer (the number of routed experts)".into(),
            })?;
        match self.num_experts {
            Some(m) if m != n => Err(BackendError::InvalidConfigField {
                field: "num_local_experts".into(),
                value: n.to_string(),
                allowed: format!(
                    "the same count as `num_experts` ({m}): both spell the number of experts"
                ),
            }),
            _ => {
                self.num_experts = Some(n);
                Ok(())
            }
        }
    }

    /// Transformers' class defaults for keys a `config.json` may omit (see
    /// [`HfConfig::from_file`]); keys the file has are left alone.
    fn fill_transformers_defaults(&mut self) {
        let moe = self.model_type == "qwen3_moe";
        self.num_key_value_heads
            .get_or_insert(if moe { 4 } else { 32 });
        self.max_position_embeddings.get_or_insert(32_768);
        if self.model_type == "qwen3" {
            self.head_dim.get_or_insert(128);
        }
        if moe {
            self.num_experts.get_or_insert(128);
            self.num_experts_per_tok.get_or_insert(8);
            self.moe_intermediate_size.get_or_insert(768);
            self.norm_topk_prob.get_or_insert(false);
        }
    }

    /// The RoPE parameters transformers 5 would use: `rope_scaling` (4.x) if set, else
    /// `rope_parameters` (5.x).
    pub(crate) fn rope_params(&self) -> Option<&RopeParameters> {
        self.rope_scaling.as_ref().or(self.rope_parameters.as_ref())
    }

    /// The RoPE type: `rope_type` (or 4.x's `type`) of [`Self::rope_params`], `default` if unset.
    pub(crate) fn rope_type(&self) -> String {
        self.rope_params()
            .and_then(|p| {
                p.rope_type
                    .clone()
                    .or_else(|| p.extra.get("type")?.as_str().map(str::to_string))
            })
            .unwrap_or_else(|| "default".to_string())
    }

    /// The RoPE base as transformers 5 resolves it: `rope_parameters.rope_theta` (or
    /// `rope_scaling.rope_theta`), else the top-level `rope_theta` of 4.x, else 10000.
    ///
    /// # Errors
    /// [`BackendError::InvalidConfigField`] for a `rope_type` other than `default` (scaled RoPE
    /// is not implemented).
    pub fn rope_theta(&self) -> Result<f64> {
        let rope_type = self.rope_type();
        if rope_type != "default" {
            let dict = if self.rope_scaling.is_some() {
                "rope_scaling"
            } else {
                "rope_parameters"
            };
            return Err(BackendError::InvalidConfigField {
                field: format!("{dict}.rope_type"),
                value: format!("\"{rope_type}\""),
                allowed: "\"default\" (scaled RoPE variants are not implemented)".into(),
            });
        }
        Ok(self
            .rope_params()
            .and_then(|p| p.rope_theta)
            .or(self.rope_theta)
            .unwrap_or(10_000.0))
    }

    /// Key/value heads (defaults to the query heads).
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width (defaults to `hidden_size / num_attention_heads`).
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// A config with the given core sizes and nothing else set: the start of a hand-written config.
    pub fn new(
        model_type: impl Into<String>,
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
    ) -> Self {
        Self {
            model_type: model_type.into(),
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: None,
            head_dim: None,
            rms_norm_eps: default_rms_eps(),
            rope_theta: None,
            rope_parameters: None,
            rope_scaling: None,
            max_position_embeddings: None,
            layer_types: None,
            use_sliding_window: None,
            sliding_window: None,
            max_window_layers: None,
            tie_word_embeddings: false,
            attention_bias: None,
            num_experts: None,
            num_experts_per_tok: None,
            moe_intermediate_size: None,
            norm_topk_prob: None,
            decoder_sparse_step: None,
            mlp_only_layers: None,
            shared_expert_intermediate_size: None,
            extra: serde_json::Map::new(),
        }
    }
}

/// The ids `generation_config.json` (or `config.json`) gives for end of sequence and padding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenerationConfig {
    /// Every id that ends a generation (HF allows one id or a list).
    pub eos_token_ids: Vec<u32>,
    /// The padding id, if any.
    pub pad_token_id: Option<u32>,
    /// The beginning-of-sequence id, if any.
    pub bos_token_id: Option<u32>,
}

impl GenerationConfig {
    /// Reads `generation_config.json`.
    ///
    /// # Errors
    /// [`BackendError::Io`] / [`BackendError::InvalidJson`] for an unreadable or malformed file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let v: serde_json::Value = read_json(path)?;
        Self::from_json(&v).map_err(|message| BackendError::InvalidJson {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Reads the eos/pad/bos ids from a parsed `generation_config.json` or `config.json`.
    fn from_json(v: &serde_json::Value) -> std::result::Result<Self, String> {
        let id = |x: &serde_json::Value, key: &str| -> std::result::Result<u32, String> {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("`{key}` must be a token id, found {x}"))
        };
        let one = |key: &str| -> std::result::Result<Option<u32>, String> {
            match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => id(x, key).map(Some),
            }
        };
        let eos_token_ids = match v.get("eos_token_id") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(xs)) => xs
                .iter()
                .map(|x| id(x, "eos_token_id"))
                .collect::<std::result::Result<_, _>>()?,
            Some(x) => vec![id(x, "eos_token_id")?],
        };
        Ok(Self {
            eos_token_ids,
            pad_token_id: one("pad_token_id")?,
            bos_token_id: one("bos_token_id")?,
        })
    }

    /// `generation_config.json` of `dir` if present, else the same ids from `config.json`, else
    /// empty.
    ///
    /// # Errors
    /// If a present file is unreadable or malformed.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let gen_path = dir.join("generation_config.json");
        if gen_path.exists() {
            return Self::from_file(gen_path);
        }
        let cfg_path = dir.join("config.json");
        if cfg_path.exists() {
            let v: serde_json::Value = read_json(&cfg_path)?;
            return Self::from_json(&v).map_err(|message| BackendError::InvalidJson {
                path: cfg_path,
                message,
            });
        }
        Ok(Self::default())
    }
}

/// Reads and parses a JSON file with errors that name it.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| BackendError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| BackendError::InvalidJson {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Reads a JSON file as an untyped value.
pub(crate) fn read_json_value(path: &Path) -> Result<serde_json::Value> {
    read_json(path)
}
