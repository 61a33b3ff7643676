//! `[model]`: which weights the actor starts from, in which precision, on which device.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::check::Checker;
use crate::Result;
use crate::strategy::DeviceSpec;

/// `[model]`: the policy model. `model.source` is the one key every config must set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Where the weights, model config and tokenizer come from. Required.
    /// ROLL: `pretrain` / `model_args.model_name_or_path`.
    pub source: ModelSource,
    /// How prompts and turns become model input: `chat` renders them through the tokenizer's
    /// chat template (instruct models), `plain` concatenates the message texts (base models
    /// trained on raw text). Default `chat`.
    #[serde(default)]
    pub prompt_format: PromptFormat,
    /// Device the model runs on: `cpu`, `cuda` or `cuda:N`. Default `cpu`.
    /// ROLL: `device_mapping` (a list of GPU ids per role).
    #[serde(default)]
    pub device: DeviceSpec,
}

impl ModelConfig {
    /// A model config for `source` with default dtype and device.
    pub fn new(source: ModelSource) -> Self {
        Self {
            source,
            prompt_format: PromptFormat::default(),
            device: DeviceSpec::default(),
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let c = Checker::new("model.source");
        match &self.source {
            ModelSource::HfDir { path } => c.require(
                !path.as_os_str().is_empty(),
                "path",
                "\"\"",
                "the path of a HuggingFace model directory",
            ),
        }
    }
}

/// Where a model's files come from; `kind` selects the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSource {
    /// A local HuggingFace model directory (`config.json`, `*.safetensors`, `tokenizer.json`).
    HfDir {
        /// The directory.
        path: PathBuf,
    },
}

/// How messages become model input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptFormat {
    /// The tokenizer's chat template (Qwen's ChatML for Qwen models).
    #[default]
    Chat,
    /// The message texts concatenated, no template: for base models.
    Plain,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_model_path_is_rejected() {
        let model = ModelConfig::new(ModelSource::HfDir { path: "".into() });
        let err = model.validate().expect_err("empty path").to_string();
        assert!(err.contains("model.source.path"), "{err}");
    }
}
