//! The trainer: optimisation steps on a [`roll_core::TrainBatch`] with a roll-algos objective.
//!
//! - [`Trainer`] trains the actor (a [`crate::CausalLm`]) on
//!   [`roll_algos::loss::policy_objective`]; [`CriticTrainer`] trains a [`CriticModel`] (trunk +
//!   [`crate::ValueHead`]) on [`roll_algos::loss::critic_loss`].
//! - A step packs the batch into micro-batches ([`TrainerConfig::micro_batch_tokens`],
//!   `micro_batch_size`), computes each micro-batch's loss with the **whole batch's**
//!   denominators and sums the gradients, so the result does not depend on the split; then it
//!   clips the global gradient norm (as [`clip_grad_norm`] and `torch.nn.utils.clip_grad_norm_`)
//!   and applies AdamW with PyTorch's semantics and defaults at the learning rate of [`lr_at`] —
//!   the clip and the update in one pass over each parameter (bit-for-bit Burn's `AdamW`).
//! - LoRA ([`LoraConfig`]) attaches adapters to named linear layers with Burn's parameter
//!   reparameterisation; the frozen base is the reference policy, and
//!   [`Trainer::inference_model`] merges the adapters for the inference engine.
//! - Checkpoints ([`Trainer::save_checkpoint`]) are written atomically and resume bit-for-bit.
//!
//! ```no_run
//! use roll_backend_burn::train::{LoraConfig, Trainer, TrainerConfig};
//! use roll_core::{SampleId, TrainBatch, TrainSequence};
//! let device = roll_backend_burn::Device::flex();
//! let model = roll_backend_burn::load_model("tiny-qwen2", &device)?;
//! let config = TrainerConfig {
//!     lr: 1e-4,
//!     lora: Some(LoraConfig { rank: 8, alpha: 16.0, target_modules: vec!["q_proj".into(), "v_proj".into()] }),
//!     ..TrainerConfig::default()
//! };
//! let batch = TrainBatch::new(vec![TrainSequence {
//!     sample: SampleId(0),
//!     prompt_ids: vec![1, 2, 3],
//!     response_ids: vec![4, 5],
//!     loss_mask: vec![true; 2],
//!     old_logprobs: vec![-1.0; 2],
//!     rollout_logprobs: vec![-1.0; 2],
//!     ref_logprobs: None,
//!     advantages: vec![1.0; 2],
//!     returns: None,
//!     old_values: None,
//!     weight: 1.0,
//!     score: 1.0,
//! }])?;
//! let mut trainer = Trainer::new(model, config, &device)?;
//! let report = trainer.step(&batch, &roll_core::policy::Objective::default())?;
//! trainer.save_checkpoint("ckpt", 1)?;
//! let (resumed, weight_version) = Trainer::load_checkpoint("ckpt", &device)?;
//! # let _ = (report, resumed, weight_version);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod adamw;
mod blockwise;
mod checkpoint;
mod clip;
mod config;
mod core;
mod critic;
mod follow;
mod fused;
mod group;
mod lora;
mod parallel;
mod schedule;
mod trainer;

pub use clip::{clip_grad_norm, global_grad_norm};
pub use config::{LoraConfig, LrSchedule, TrainKernels, TrainerConfig};
pub use core::{BatchGradients, TrainStepReport};
pub use critic::{CriticModel, CriticTrainer};
pub use follow::{follow, follow_in, follow_serving};
pub use lora::TrainerRng;
pub use parallel::{DataParallel, Replica};
pub use schedule::lr_at;
pub use trainer::{Trainer, part_dir};
