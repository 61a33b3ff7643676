//! `[train]`: the optimiser, its learning-rate schedule and how a rollout batch is consumed.

use serde::{Deserialize, Serialize};

use super::check::Checker;
use crate::Result;

/// `[train]`: optimisation of the actor (and critic). ROLL: `actor_train.training_args` and the
/// PPO keys of `PPOConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Peak learning rate (> 0). Default `1e-6`. ROLL: `training_args.learning_rate`.
    pub learning_rate: f64,
    /// Steps of linear warm-up from 0 to `learning_rate`, in optimiser steps. Default `0`.
    /// ROLL: `training_args.warmup_steps`. Without warm-up, AdamW's first step moves every
    /// weight by about `learning_rate` whatever its gradient (the bias-corrected `m / √v` is
    /// ±1): right after SFT, one such step at 1e-4 took the main job's held-out accuracy from
    /// 64.2% to 34.4%; its config warms up over 20 steps. A run with `[sft]` and no warm-up
    /// logs a warning ([`Config::cautions`](super::Config::cautions)).
    pub warmup_steps: u64,
    /// The learning rate after warm-up. Default `constant`. ROLL: `training_args.lr_scheduler_type`.
    pub lr_schedule: LrSchedule,
    /// The optimiser. Default `adam_w` with PyTorch's defaults.
    pub optimizer: Optimizer,
    /// Clip the global gradient norm to this value (> 0); unset = no clipping. Default unset.
    /// ROLL: `training_args.max_grad_norm` (ROLL/HF default 1.0 — set it explicitly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_grad_norm: Option<f64>,
    /// Passes over each rollout batch. Default `1`. ROLL: `ppo_epochs`.
    pub ppo_epochs: u32,
    /// Token budget of one micro-batch (prompt + response tokens); sequences are packed into
    /// micro-batches under it and gradients accumulated. Default `4096`.
    /// ROLL: `max_tokens_per_microbatch_in_train`.
    pub max_tokens_per_micro_batch: u32,
    /// Steps during which only the critic trains; the actor trains once `step >= critic_warmup`.
    /// Default `0`. ROLL: `critic_warmup`.
    pub critic_warmup: u64,
    /// Recompute the old log-probs of PPO's ratio with the training kernels before the update,
    /// instead of taking the rollout's (the inference engine's) log-probs. Needed by
    /// `algorithm.objective.train_infer_correction`. Default `false`.
    /// ROLL: `enable_old_logprobs_recompute`.
    pub recompute_old_logprobs: bool,
    /// Tokens of the greedy probe that checks, after each update, that inference and training
    /// agree: the inference engine generates them from the batch's first prompt, the training
    /// kernels score the same tokens, and the largest log-prob difference is logged
    /// (`actor/train_infer_logprob_gap`). `0`: no probe. With the experts divided among
    /// training ranks that generate together (colocated `rollout.expert_parallel`) the probe
    /// gathers the whole model after each step, which generation itself no longer needs
    /// (~0.15 s a step for a 13.5M-parameter Qwen3-MoE over two processes on the project's 2
    /// cores). Default `8`. ROLL has no such probe; the nearest is the train–inference ratio
    /// its `enable_old_logprobs_recompute` makes visible.
    pub gap_probe_tokens: u32,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-6,
            warmup_steps: 0,
            lr_schedule: LrSchedule::Constant {},
            optimizer: Optimizer::default(),
            max_grad_norm: None,
            ppo_epochs: 1,
            max_tokens_per_micro_batch: 4096,
            critic_warmup: 0,
            recompute_old_logprobs: false,
            gap_probe_tokens: 8,
        }
    }
}

impl TrainConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        let c = Checker::new("train");
        c.positive("learning_rate", self.learning_rate)?;
        if let Some(norm) = self.max_grad_norm {
            c.positive("max_grad_norm", norm)?;
        }
        c.at_least("ppo_epochs", self.ppo_epochs.into(), 1)?;
        c.at_least(
            "max_tokens_per_micro_batch",
            self.max_tokens_per_micro_batch.into(),
            1,
        )?;
        self.lr_schedule.validate()?;
        self.optimizer.validate()
    }
}

/// The learning rate after warm-up; `kind` selects the variant. The trainer of
/// roll-backend-burn computes it with these same types (`lr_at`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LrSchedule {
    /// Stay at `learning_rate`. (A struct variant so that stray keys are rejected.)
    Constant {},
    /// Cosine decay from `learning_rate` to `min_lr_ratio * learning_rate` at `run.max_steps`.
    Cosine {
        /// Final learning rate as a fraction of the peak, in [0, 1]. Default `0.0`.
        #[serde(default)]
        min_lr_ratio: f64,
    },
}

impl Default for LrSchedule {
    fn default() -> Self {
        Self::Constant {}
    }
}

impl LrSchedule {
    fn validate(&self) -> Result<()> {
        self.validate_at("train.lr_schedule")
    }

    /// Checks the settings, naming keys under `prefix`.
    pub(crate) fn validate_at(&self, prefix: &str) -> Result<()> {
        let c = Checker::new(prefix);
        match *self {
            Self::Constant {} => Ok(()),
            Self::Cosine { min_lr_ratio } => c.require(
                (0.0..=1.0).contains(&min_lr_ratio),
                "min_lr_ratio",
                min_lr_ratio,
                "a number in [0, 1]",
            ),
        }
    }
}

/// The optimiser; `kind` selects the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Optimizer {
    /// AdamW (Loshchilov & Hutter, 2019, "Decoupled Weight Decay Regularization"): Adam with
    /// weight decay applied to the weights directly, not through the gradient.
    #[serde(alias = "adamw")]
    AdamW {
        /// Decay of the first-moment estimate, in [0, 1). Default `0.9`.
        #[serde(default = "default_beta1")]
        beta1: f64,
        /// Decay of the second-moment estimate, in [0, 1). Default `0.999`.
        #[serde(default = "default_beta2")]
        beta2: f64,
        /// Added to the denominator for numerical stability (> 0). Default `1e-8`.
        #[serde(default = "default_eps")]
        eps: f64,
        /// Decoupled weight decay (>= 0). Default `0.01`. ROLL: `training_args.weight_decay`.
        #[serde(default = "default_weight_decay")]
        weight_decay: f64,
    },
}

fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}
fn default_weight_decay() -> f64 {
    0.01
}

impl Default for Optimizer {
    fn default() -> Self {
        Self::AdamW {
            beta1: default_beta1(),
            beta2: default_beta2(),
            eps: default_eps(),
            weight_decay: default_weight_decay(),
        }
    }
}

impl Optimizer {
    fn validate(&self) -> Result<()> {
        let c = Checker::new("train.optimizer");
        match *self {
            Self::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let beta = "a number in [0, 1)";
                c.require((0.0..1.0).contains(&beta1), "beta1", beta1, beta)?;
                c.require((0.0..1.0).contains(&beta2), "beta2", beta2, beta)?;
                c.positive("eps", eps)?;
                c.non_negative("weight_decay", weight_decay)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_pytorch_like() {
        let train = TrainConfig::default();
        assert!(train.validate().is_ok());
        assert_eq!(
            train.optimizer,
            Optimizer::AdamW {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01
            }
        );
    }

    #[test]
    fn bad_values_name_their_keys() {
        let mut train = TrainConfig {
            learning_rate: -1e-5,
            ..TrainConfig::default()
        };
        let err = train.validate().expect_err("lr").to_string();
        assert!(err.contains("train.learning_rate"), "{err}");
        train.learning_rate = 1e-5;
        train.lr_schedule = LrSchedule::Cosine { min_lr_ratio: 2.0 };
        let err = train.validate().expect_err("ratio").to_string();
        assert!(err.contains("train.lr_schedule.min_lr_ratio"), "{err}");
        train.lr_schedule = LrSchedule::Constant {};
        train.optimizer = Optimizer::AdamW {
            beta1: 1.0,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        };
        let err = train.validate().expect_err("beta1").to_string();
        assert!(err.contains("train.optimizer.beta1"), "{err}");
    }
}
