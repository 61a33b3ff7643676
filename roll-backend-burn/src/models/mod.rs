//! The Qwen-family decoders, one file per architecture, and [`CausalLm`], which holds any of them.

pub mod common;
mod logprobs;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_moe;
mod value_head;

pub use common::{PaddingSide, TokenBatch};
pub use logprobs::{token_logprobs_and_entropy, token_logprobs_from_logits};
pub use value_head::ValueHead;

use crate::hf::HfConfig;
use crate::{BackendError, Result};
use burn::module::Module;
use burn::tensor::{Device, Tensor};
use qwen2::{Qwen2Config, Qwen2ForCausalLM};
use qwen3::{Qwen3Config, Qwen3ForCausalLM};
use qwen3_moe::{Qwen3MoeConfig, Qwen3MoeForCausalLM};

/// A causal language model of any supported architecture, chosen by `config.json`'s `model_type`.
///
/// Scoring, saving and (in part 2) generation and training work on this type, so they are written
/// once for every architecture.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum CausalLm {
    /// `qwen2`.
    Qwen2(Qwen2ForCausalLM),
    /// `qwen3`.
    Qwen3(Qwen3ForCausalLM),
    /// `qwen3_moe`.
    Qwen3Moe(Qwen3MoeForCausalLM),
}

impl CausalLm {
    /// A randomly initialised model for `config` (by its `model_type`).
    ///
    /// # Errors
    /// [`BackendError::UnknownModelType`] or [`BackendError::InvalidConfig`].
    pub fn init(config: &HfConfig, device: &Device) -> Result<Self> {
        Ok(match config.model_type.as_str() {
            "qwen2" => Self::Qwen2(Qwen2Config::from_hf(config)?.init(device)),
            "qwen3" => Self::Qwen3(Qwen3Config::from_hf(config)?.init(device)),
            "qwen3_moe" => Self::Qwen3Moe(Qwen3MoeConfig::from_hf(config)?.init(device)),
            other => {
                return Err(BackendError::UnknownModelType {
                    model_type: other.to_string(),
                });
            }
        })
    }

    /// The HF `config.json` content of this model.
    pub fn hf_config(&self) -> HfConfig {
        match self {
            Self::Qwen2(m) => m.config.to_hf(),
            Self::Qwen3(m) => m.config.to_hf(),
            Self::Qwen3Moe(m) => m.config.to_hf(),
        }
    }

    /// Vocabulary size (valid token ids are `0..vocab_size`).
    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Qwen2(m) => m.config.vocab_size,
            Self::Qwen3(m) => m.config.vocab_size,
            Self::Qwen3Moe(m) => m.config.vocab_size,
        }
    }

    /// Width of the hidden states ([`CausalLm::forward_hidden`]'s last dimension).
    pub fn hidden_size(&self) -> usize {
        match self {
            Self::Qwen2(m) => m.config.hidden_size,
            Self::Qwen3(m) => m.config.hidden_size,
            Self::Qwen3Moe(m) => m.config.hidden_size,
        }
    }

    /// Final-norm hidden states (the trunk without the LM head).
    ///
    /// # Shapes
    /// - `batch.input_ids`: `[batch, seq]`
    /// - output: `[batch, seq, hidden]`
    pub fn forward_hidden(&self, batch: &TokenBatch) -> Tensor<3> {
        match self {
            Self::Qwen2(m) => m.forward_hidden(batch),
            Self::Qwen3(m) => m.forward_hidden(batch),
            Self::Qwen3Moe(m) => m.forward_hidden(batch),
        }
    }

    /// LM-head logits of hidden states.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, hidden]`
    /// - output: `[batch, seq, vocab]`
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        match self {
            Self::Qwen2(m) => m.logits(hidden),
            Self::Qwen3(m) => m.logits(hidden),
            Self::Qwen3Moe(m) => m.logits(hidden),
        }
    }

    /// Next-token logits at every position.
    ///
    /// # Shapes
    /// - `batch.input_ids`: `[batch, seq]`
    /// - output: `[batch, seq, vocab]`
    pub fn forward(&self, batch: &TokenBatch) -> Tensor<3> {
        self.logits(self.forward_hidden(batch))
    }
}
