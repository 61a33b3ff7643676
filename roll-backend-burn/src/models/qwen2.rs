//! Qwen2 (`model_type: "qwen2"`, HF `Qwen2ForCausalLM`): the [`Decoder`] with **bias on q/k/v**
//! (none on `o_proj`), no QK-norm, a dense SwiGLU MLP in every layer, and
//! `head_dim = hidden_size / num_attention_heads`.
//!
//! Sliding-window attention is not implemented (Qwen2 checkpoints ship with it disabled).

use super::attention::AttentionSpec;
use super::decoder::{Architecture, Decoder, DecoderConfig, expect_model_type};
use super::mlp::Mlp;
use crate::hf::HfConfig;
use crate::{BackendError, Result};
use burn::config::Config;
use burn::tensor::Device;

/// A Qwen2 model with its LM head.
pub type Qwen2ForCausalLM = Decoder<Qwen2Config>;

/// Hyper-parameters of a Qwen2 model (the subset of HF `config.json` it uses).
#[derive(Config, Debug, PartialEq)]
pub struct Qwen2Config {
    /// Sizes; `head_dim` is `hidden_size / num_attention_heads`.
    pub decoder: DecoderConfig,
}

impl Architecture for Qwen2Config {
    type FeedForward = Mlp;

    /// # Errors
    /// [`BackendError::UnknownModelType`] if `model_type` is not `qwen2`,
    /// [`BackendError::InvalidConfig`] for inconsistent sizes (including a `head_dim` other than
    /// `hidden_size / num_attention_heads`).
    fn from_hf(hf: &HfConfig) -> Result<Self> {
        expect_model_type(hf, "qwen2")?;
        if hf.head_dim() * hf.num_attention_heads != hf.hidden_size {
            return Err(BackendError::InvalidConfig(format!(
                "qwen2 needs hidden_size {} divisible by num_attention_heads {}",
                hf.hidden_size, hf.num_attention_heads
            )));
        }
        Ok(Self::new(DecoderConfig::from_hf(hf)?))
    }

    fn to_hf(&self) -> HfConfig {
        self.decoder.to_hf("qwen2", "Qwen2ForCausalLM")
    }

    fn decoder(&self) -> &DecoderConfig {
        &self.decoder
    }

    fn attention(&self) -> AttentionSpec {
        self.decoder.attention(true, false, false)
    }

    fn init_feed_forward(&self, _layer: usize, device: &Device) -> Mlp {
        self.decoder.init_mlp(device)
    }
}
