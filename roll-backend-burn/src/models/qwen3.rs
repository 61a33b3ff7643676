//! Qwen3 (`model_type: "qwen3"`, HF `Qwen3ForCausalLM`): the [`Decoder`] with **QK-RMSNorm** (an
//! RMSNorm over each query and key head, before RoPE), **no attention bias** by default
//! (`attention_bias` switches bias on q/k/v/o together), a `head_dim` that need not equal
//! `hidden_size / num_attention_heads`, and a dense SwiGLU MLP in every layer.
//!
//! Qwen3-MoE shares this attention and the `head_dim`/`attention_bias` config fields.

use super::attention::AttentionSpec;
use super::decoder::{Architecture, Decoder, DecoderConfig, expect_model_type};
use super::mlp::Mlp;
use crate::Result;
use crate::hf::HfConfig;
use burn::config::Config;
use burn::tensor::Device;

/// A Qwen3 model with its LM head.
pub type Qwen3ForCausalLM = Decoder<Qwen3Config>;

/// Hyper-parameters of a Qwen3 model (the subset of HF `config.json` it uses).
#[derive(Config, Debug, PartialEq)]
pub struct Qwen3Config {
    /// Sizes.
    pub decoder: DecoderConfig,
    /// Bias on q/k/v/o.
    #[config(default = false)]
    pub attention_bias: bool,
}

impl Architecture for Qwen3Config {
    type FeedForward = Mlp;

    /// # Errors
    /// [`BackendError::UnknownModelType`](crate::BackendError::UnknownModelType) if `model_type`
    /// is not `qwen3`, [`BackendError::InvalidConfig`](crate::BackendError::InvalidConfig) for
    /// inconsistent sizes.
    fn from_hf(hf: &HfConfig) -> Result<Self> {
        expect_model_type(hf, "qwen3")?;
        Ok(Self::new(DecoderConfig::from_hf(hf)?)
            .with_attention_bias(hf.attention_bias.unwrap_or(false)))
    }

    fn to_hf(&self) -> HfConfig {
        qwen3_hf(
            &self.decoder,
            self.attention_bias,
            "qwen3",
            "Qwen3ForCausalLM",
        )
    }

    fn decoder(&self) -> &DecoderConfig {
        &self.decoder
    }

    fn attention(&self) -> AttentionSpec {
        qwen3_attention(&self.decoder, self.attention_bias)
    }

    fn init_feed_forward(&self, _layer: usize, device: &Device) -> Mlp {
        self.decoder.init_mlp(device)
    }
}

/// Qwen3's attention: QK-RMSNorm with the model's epsilon, and bias on all four projections or
/// on none.
pub(crate) fn qwen3_attention(decoder: &DecoderConfig, attention_bias: bool) -> AttentionSpec {
    decoder.attention(attention_bias, attention_bias, true)
}

/// The HF config of a Qwen3-style model: the shared fields plus the explicit `head_dim` and
/// `attention_bias` Qwen3 configs carry.
pub(crate) fn qwen3_hf(
    decoder: &DecoderConfig,
    attention_bias: bool,
    model_type: &str,
    architecture: &str,
) -> HfConfig {
    let mut hf = decoder.to_hf(model_type, architecture);
    hf.head_dim = Some(decoder.head_dim);
    hf.attention_bias = Some(attention_bias);
    hf
}
