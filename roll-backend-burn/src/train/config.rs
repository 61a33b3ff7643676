//! [`TrainerConfig`]: optimiser, schedule, clipping, micro-batching and LoRA settings.

use crate::{BackendError, Result};
use serde::{Deserialize, Serialize};

/// Everything that defines how the trainer optimises, as found in a config file.
///
/// Defaults are PyTorch's `torch.optim.AdamW` (β = (0.9, 0.999), ε = 1e-8, weight decay 0.01 —
/// not Burn's `AdamWConfig` defaults, ε = 1e-5 and 1e-4) with ROLL's learning rate 1e-6 and global
/// gradient clipping at 1.0, a constant schedule without warmup, micro-batches of at most 4096
/// padded tokens and no LoRA.
///
/// ```
/// use roll_backend_burn::train::{LrSchedule, TrainerConfig};
/// let cfg: TrainerConfig = serde_json::from_str(
///     r#"{"lr": 1e-5, "warmup_steps": 10, "total_steps": 100,
///         "schedule": {"kind": "cosine", "min_lr_ratio": 0.1}}"#,
/// ).unwrap();
/// cfg.validate().unwrap();
/// assert_eq!(cfg.schedule, LrSchedule::Cosine { min_lr_ratio: 0.1 });
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    /// Peak learning rate (reached after warmup).
    pub lr: f64,
    /// AdamW's `(β₁, β₂)`.
    pub betas: (f32, f32),
    /// AdamW's ε, added to `sqrt(v̂)`.
    pub eps: f32,
    /// Decoupled weight decay: every step multiplies each trained parameter by `1 − lr·wd`.
    pub weight_decay: f32,
    /// Clip the global L2 norm of all gradients to this value (`torch.nn.utils.clip_grad_norm_`);
    /// `None` = no clipping (the norm is still reported).
    pub max_grad_norm: Option<f32>,
    /// Upper bound on the tokens of one micro-batch (a longer sequence runs alone): the tokens
    /// computed on the fused path, which packs sequences end to end and a shared prompt once;
    /// `rows × padded length` on Burn's autodiff path. `None` = no token bound.
    pub micro_batch_tokens: Option<usize>,
    /// Upper bound on the sequences of one micro-batch; `None` = no count bound.
    pub micro_batch_size: Option<usize>,
    /// Shape of the learning rate after warmup.
    pub schedule: LrSchedule,
    /// Linear warmup from 0 over this many optimiser steps (HF `get_*_schedule_with_warmup`).
    pub warmup_steps: u64,
    /// Length of the schedule in optimiser steps; required by [`LrSchedule::Cosine`].
    pub total_steps: Option<u64>,
    /// Train low-rank adapters instead of the full model; `None` = full fine-tuning.
    pub lora: Option<LoraConfig>,
    /// Seed of the trainer's random numbers (LoRA and value-head initialisation).
    pub seed: u64,
    /// Passes over the batch in one train step (PPO epochs); each pass is one optimiser update,
    /// and the inference side receives the weights once, after the last.
    pub epochs: u32,
    /// Which kernels compute the actor's gradients. Default [`TrainKernels::Auto`].
    pub kernels: TrainKernels,
}

/// Which kernels compute the actor's gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainKernels {
    /// The fused CPU kernels where they cover the model — a dense Qwen2/Qwen3 on the CPU (Flex)
    /// device, LoRA included unless it adapts the embedding or the LM head — and Burn's autodiff
    /// everywhere else.
    #[default]
    Auto,
    /// Burn's autodiff always: the generic path, and the reference the fused one is tested
    /// against.
    Autodiff,
}

impl TrainKernels {
    /// How these kernels lay out a micro-batch (what its token budget counts). `Auto` here is the
    /// resolved choice ([`Trainer::kernels`](super::Trainer::kernels)): the fused path.
    pub(crate) fn layout(self) -> super::core::Layout {
        match self {
            Self::Auto => super::core::Layout::Packed,
            Self::Autodiff => super::core::Layout::Padded,
        }
    }
}

impl Default for TrainerConfig {
    fn default() -> Self {
        Self {
            lr: 1e-6,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            micro_batch_tokens: Some(4096),
            micro_batch_size: None,
            schedule: LrSchedule::default(),
            warmup_steps: 0,
            total_steps: None,
            lora: None,
            seed: 0,
            epochs: 1,
            kernels: TrainKernels::Auto,
        }
    }
}

impl TrainerConfig {
    /// The trainer a run config describes: `[train]` (learning rate, warm-up, schedule over
    /// `run.max_steps × train.ppo_epochs` optimiser steps, AdamW, clipping, micro-batch token
    /// budget, epochs) with its seed derived from `run.seed`.
    pub fn from_config(config: &roll_core::config::Config) -> Self {
        let train = &config.train;
        let roll_core::config::Optimizer::AdamW {
            beta1,
            beta2,
            eps,
            weight_decay,
        } = train.optimizer;
        Self {
            lr: train.learning_rate,
            betas: (beta1 as f32, beta2 as f32),
            eps: eps as f32,
            weight_decay: weight_decay as f32,
            max_grad_norm: train.max_grad_norm.map(|n| n as f32),
            micro_batch_tokens: Some(train.max_tokens_per_micro_batch as usize),
            micro_batch_size: None,
            schedule: train.lr_schedule,
            warmup_steps: train.warmup_steps,
            total_steps: Some(
                config
                    .run
                    .max_steps
                    .saturating_mul(u64::from(train.ppo_epochs.max(1))),
            ),
            lora: None,
            seed: roll_core::rng::derive_seed(config.run.seed, "trainer"),
            epochs: train.ppo_epochs.max(1),
            kernels: TrainKernels::Auto,
        }
    }
}

/// The learning-rate curve after warmup: the run config's type (see [`lr_at`](super::lr_at) for
/// the formulas), so the schedule is defined once.
pub use roll_core::config::LrSchedule;

/// Low-rank adapters (LoRA, arXiv:2106.09685) on chosen linear layers:
/// `W' = W + (alpha / rank)·A·B` with `A` random and `B = 0` at initialisation, so the adapted
/// model starts equal to the base.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// Rank `r` of the adapters.
    pub rank: usize,
    /// Scale numerator: the update is multiplied by `alpha / rank`.
    pub alpha: f64,
    /// Names of the linear layers to adapt, as in PEFT's `target_modules` (e.g. `q_proj`,
    /// `v_proj`, `gate_proj`); every layer of that name in every decoder layer is adapted.
    pub target_modules: Vec<String>,
}

impl LoraConfig {
    /// `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank.max(1) as f64
    }
}

fn invalid(key: &str, message: impl Into<String>) -> BackendError {
    BackendError::InvalidTrainConfig {
        key: key.to_string(),
        message: message.into(),
    }
}

impl TrainerConfig {
    /// Checks every setting.
    ///
    /// # Errors
    /// [`BackendError::InvalidTrainConfig`] naming the first bad key (`lr`, `betas`, `eps`,
    /// `weight_decay`, `max_grad_norm`, `micro_batch_tokens`, `micro_batch_size`,
    /// `schedule.min_lr_ratio`, `total_steps`, `warmup_steps`, `lora.rank`, `lora.alpha`,
    /// `lora.target_modules`) and what would be accepted.
    pub fn validate(&self) -> Result<()> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(invalid(
                "lr",
                format!("{} is not a finite number > 0", self.lr),
            ));
        }
        let (b1, b2) = self.betas;
        for (i, b) in [b1, b2].into_iter().enumerate() {
            if !(0.0..1.0).contains(&b) {
                return Err(invalid(
                    "betas",
                    format!("beta{} = {b} is outside [0, 1)", i + 1),
                ));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(invalid(
                "eps",
                format!("{} is not a finite number > 0", self.eps),
            ));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(invalid(
                "weight_decay",
                format!("{} is not a finite number >= 0", self.weight_decay),
            ));
        }
        if let Some(n) = self.max_grad_norm
            && !(n.is_finite() && n > 0.0)
        {
            return Err(invalid(
                "max_grad_norm",
                format!("{n} is not a finite number > 0 (leave it unset to disable clipping)"),
            ));
        }
        if self.micro_batch_tokens == Some(0) {
            return Err(invalid(
                "micro_batch_tokens",
                "0 is not a token budget (>= 1, or unset)",
            ));
        }
        if self.micro_batch_size == Some(0) {
            return Err(invalid(
                "micro_batch_size",
                "0 sequences per micro-batch (>= 1, or unset)",
            ));
        }
        match self.schedule {
            LrSchedule::Constant {} => {}
            LrSchedule::Cosine { min_lr_ratio } => {
                if !(0.0..=1.0).contains(&min_lr_ratio) {
                    return Err(invalid(
                        "schedule.min_lr_ratio",
                        format!("{min_lr_ratio} is outside [0, 1]"),
                    ));
                }
                match self.total_steps {
                    None => {
                        return Err(invalid(
                            "total_steps",
                            "the cosine schedule needs the number of optimiser steps",
                        ));
                    }
                    Some(t) if t <= self.warmup_steps => {
                        return Err(invalid(
                            "total_steps",
                            format!(
                                "{t} leaves no step after warmup_steps = {}",
                                self.warmup_steps
                            ),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        if let Some(t) = self.total_steps
            && t == 0
        {
            return Err(invalid("total_steps", "0 optimiser steps (>= 1, or unset)"));
        }
        if let Some(lora) = &self.lora {
            lora.validate()?;
        }
        if self.epochs == 0 {
            return Err(invalid("epochs", "0 passes over the batch (>= 1)"));
        }
        Ok(())
    }
}

impl LoraConfig {
    /// Checks the adapter settings; keys are prefixed with `lora.`.
    ///
    /// # Errors
    /// [`BackendError::InvalidTrainConfig`] naming the bad key.
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(invalid("lora.rank", "0 (the rank must be >= 1)"));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(invalid(
                "lora.alpha",
                format!("{} is not a finite number > 0", self.alpha),
            ));
        }
        if self.target_modules.is_empty() {
            return Err(invalid(
                "lora.target_modules",
                "empty (name at least one linear layer, e.g. \"q_proj\")",
            ));
        }
        if let Some(bad) = self
            .target_modules
            .iter()
            .find(|m| m.is_empty() || m.contains('.') || m.contains(char::is_whitespace))
        {
            return Err(invalid(
                "lora.target_modules",
                format!("`{bad}` is not a layer name (like \"q_proj\", without dots or spaces)"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key_of(cfg: &TrainerConfig) -> String {
        match cfg.validate() {
            Err(BackendError::InvalidTrainConfig { key, .. }) => key,
            other => panic!("expected InvalidTrainConfig, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_pytorch_adamw_and_valid() {
        let c = TrainerConfig::default();
        assert_eq!(c.betas, (0.9, 0.999));
        assert_eq!(c.eps, 1e-8);
        assert_eq!(c.weight_decay, 0.01);
        c.validate().unwrap();
    }

    #[test]
    fn bad_values_name_their_key() {
        let base = TrainerConfig::default;
        let cases: Vec<(TrainerConfig, &str)> = vec![
            (TrainerConfig { lr: -1.0, ..base() }, "lr"),
            (
                TrainerConfig {
                    betas: (0.9, 1.0),
                    ..base()
                },
                "betas",
            ),
            (TrainerConfig { eps: 0.0, ..base() }, "eps"),
            (
                TrainerConfig {
                    weight_decay: f32::NAN,
                    ..base()
                },
                "weight_decay",
            ),
            (
                TrainerConfig {
                    max_grad_norm: Some(0.0),
                    ..base()
                },
                "max_grad_norm",
            ),
            (
                TrainerConfig {
                    micro_batch_tokens: Some(0),
                    ..base()
                },
                "micro_batch_tokens",
            ),
            (
                TrainerConfig {
                    micro_batch_size: Some(0),
                    ..base()
                },
                "micro_batch_size",
            ),
            (
                TrainerConfig {
                    schedule: LrSchedule::Cosine { min_lr_ratio: 0.1 },
                    ..base()
                },
                "total_steps",
            ),
            (
                TrainerConfig {
                    schedule: LrSchedule::Cosine { min_lr_ratio: 1.5 },
                    total_steps: Some(10),
                    ..base()
                },
                "schedule.min_lr_ratio",
            ),
            (
                TrainerConfig {
                    lora: Some(LoraConfig {
                        rank: 0,
                        alpha: 16.0,
                        target_modules: vec!["q_proj".into()],
                    }),
                    ..base()
                },
                "lora.rank",
            ),
            (
                TrainerConfig {
                    lora: Some(LoraConfig {
                        rank: 4,
                        alpha: 16.0,
                        target_modules: vec![],
                    }),
                    ..base()
                },
                "lora.target_modules",
            ),
        ];
        for (cfg, key) in cases {
            assert_eq!(key_of(&cfg), key);
            let msg = cfg.validate().unwrap_err().to_string();
            assert!(msg.contains(key), "{msg}");
        }
    }

    #[test]
    fn serde_rejects_unknown_keys() {
        let err = serde_json::from_str::<TrainerConfig>(r#"{"learning_rate": 1e-5}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("learning_rate"), "{err}");
        let err = serde_json::from_str::<TrainerConfig>(
            r#"{"lora": {"rank": 8, "alpha": 16, "target_modules": ["q_proj"], "dropout": 0.1}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("dropout"), "{err}");
        let c: TrainerConfig = serde_json::from_str(
            r#"{"betas": [0.9, 0.95], "max_grad_norm": null, "schedule": {"kind": "constant"}}"#,
        )
        .unwrap();
        assert_eq!(c.betas, (0.9, 0.95));
        assert_eq!(c.max_grad_norm, None);
    }
}
