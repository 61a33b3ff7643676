//! The Qwen-family models: one [`Decoder`] parameterised by an [`Architecture`] (Qwen2, Qwen3,
//! Qwen3-MoE, each a config plus only what is its own), its building blocks one file each, and
//! [`CausalLm`], which holds any of them.

mod attention;
mod batch;
mod causal_lm;
mod decoder;
pub mod expert_parallel;
mod gather;
mod linear;
mod logprobs;
mod mlp;
mod norm;
pub mod pipeline_parallel;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_moe;
mod rope;
pub mod tensor_parallel;
mod value_head;

pub use attention::{Attention, AttentionSpec, causal_padding_mask};
pub(crate) use batch::check_id;
pub use batch::{PaddingSide, TokenBatch};
pub use causal_lm::CausalLm;
pub(crate) use causal_lm::{LayerInputs, PartLevel, check_length, with_decoder};
pub use decoder::{
    Architecture, Decoder, DecoderConfig, DecoderLayer, DecoderModel, FeedForwardBlock,
};
pub use linear::linear_rows;
pub use logprobs::{token_logprobs_and_entropy, token_logprobs_from_logits};
pub use mlp::Mlp;
pub use norm::rms_norm_hf;
pub(crate) use pipeline_parallel::StageCompute;
pub use pipeline_parallel::{PipelineOp, PipelineStage, tensor_pipeline_groups};
pub use qwen2::{Qwen2Config, Qwen2ForCausalLM};
pub use qwen3::{Qwen3Config, Qwen3ForCausalLM};
pub use qwen3_moe::{Qwen3MoeConfig, Qwen3MoeForCausalLM};
pub use rope::Rope;
pub use tensor_parallel::{ExpertSplit, TensorShard};
pub use value_head::ValueHead;
