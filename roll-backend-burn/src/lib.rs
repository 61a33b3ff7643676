//! # roll-backend-burn — roll's `Policy` on Burn
//!
//! This crate holds the Qwen-family models on Burn, everything that connects them to HuggingFace
//! files, and [`BurnPolicy`], roll-core's `Policy` on top of them.
//!
//! - **Policy** ([`BurnPolicy`]): actor, critic, reference or judge; `generate` through the
//!   inference engine, `score` in micro-batches, `train_step` through the trainer, then a weight
//!   sync to the engine and a measured train–inference log-prob gap.
//! - **Inference engine** ([`engine`]): continuous batching on its own thread over a paged
//!   key/value cache; per-request temperature, top-k, top-p, stop ids and strings, seeds
//!   (reproducible whatever shares the batch), abort, streaming, weight sync.
//! - **Trainer** ([`train`]): roll-algos objectives with token-exact gradient accumulation,
//!   PyTorch-default AdamW, global-norm clipping, warmup/cosine schedules, LoRA, a critic, and
//!   atomic checkpoints that resume bit for bit.
//! - **Models** ([`models`]): one decoder parameterised by an architecture config — Qwen2, Qwen3 and Qwen3-MoE — behind the
//!   [`CausalLm`] enum; a [`ValueHead`] for critics; [`TokenBatch`] carries padding (left or
//!   right) as an attention mask plus position ids, so padding never changes a result.
//! - **HuggingFace in and out** ([`hf`]): [`load_model`] reads `config.json` and one or many
//!   safetensors (f32/bf16/f16, computed in f32); [`save_model`] writes the same layout, sharded
//!   above a threshold, loadable by transformers.
//! - **Tokenizer** ([`HfTokenizer`]): `tokenizer.json` through the `tokenizers` crate, eos/pad from
//!   `generation_config.json`, Qwen's ChatML template ([`ChatTemplate`]); implements
//!   [`roll_core::Tokenizer`].
//! - **Scoring** ([`score`]): per-token log-probs, entropy and values of many sequences in
//!   micro-batches bounded by a token budget, equal to scoring each sequence alone — what
//!   `Policy::score` returns.
//!
//! Numerics follow HF transformers term by term (HF's `rotate_half` RoPE, not Burn's
//! interleaved one; HF's `x * rsqrt(mean(x²) + eps)` RMSNorm): on the reference fixtures logits
//! agree with transformers to ≤ 2.2e-5 and per-token log-probs to ≤ 7.7e-6 in f32.
//!
//! Every tensor this crate creates is placed on a device from [`device`], so all code paths stay
//! device-agnostic and the CPU (Flex) backend is the default.
//!
//! ```no_run
//! use roll_backend_burn::{HfTokenizer, ScoringOptions, load_model, score};
//! use roll_core::policy::{ScoreRequest, ScoreSequence};
//! use roll_core::Tokenizer;
//!
//! let device = roll_backend_burn::Device::flex();
//! let model = load_model("tiny-qwen2", &device)?;
//! let tok = HfTokenizer::from_dir("tiny-qwen2")?;
//! let request = ScoreRequest {
//!     sequences: vec![ScoreSequence {
//!         prompt_ids: tok.encode("Q: 1+1=? A:")?,
//!         response_ids: tok.encode(" 2")?,
//!     }],
//!     with_entropy: true,
//!     ..Default::default()
//! };
//! let scores = score(&model, None, &request, &ScoringOptions::default(), &device)?;
//! println!("{:?}", scores[0].logprobs);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod chat_template;
mod device;
pub mod engine;
mod error;
#[cfg(feature = "gpu-kernels")]
pub mod gpu;
pub mod hf;
pub mod models;
pub mod policy;
pub mod remote;
mod scoring;
mod tokenizer;
pub mod train;

pub use chat_template::ChatTemplate;
pub use device::device;
pub use error::{BackendError, Result};
pub use hf::{GenerationConfig, HfConfig, SaveDtype, SaveOptions, load_model, save_model};
pub use models::{
    CausalLm, ExpertSplit, PaddingSide, TokenBatch, ValueHead, tensor_pipeline_groups,
    token_logprobs_and_entropy, token_logprobs_from_logits,
};
pub use policy::{
    BurnCritic, BurnFrozen, BurnPolicy, BurnReference, ModelParts, PartKind, Placement,
    PolicyOptions,
};
pub use scoring::{ScoringOptions, score, token_logprobs};
pub use tokenizer::HfTokenizer;

pub use burn::tensor::Device;
pub use roll_core::strategy::DeviceSpec;
