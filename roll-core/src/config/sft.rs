//! `[sft]`: a supervised warm start before reinforcement learning.

use serde::{Deserialize, Serialize};

use super::check::Checker;
use super::train::LrSchedule;
use crate::Result;

/// `[sft]`: fine-tune the actor on prompt/response pairs (the run's SFT dataset) before RL, with
/// its own optimiser settings; the RL stage then starts from the exported SFT model (with a
/// fresh optimiser, as ROLL's RL stage starts from an SFT checkpoint). Absent: RL starts from
/// `model.source`. AdamW's betas, epsilon and weight decay, the gradient clip and the
/// micro-batch token budget are `[train]`'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SftSection {
    /// Passes over the SFT dataset. Default `1`. ROLL: `num_train_epochs`.
    pub epochs: u32,
    /// Examples per optimiser step. Default `32`. ROLL: `per_device_train_batch_size ×
    /// gradient_accumulation_steps`.
    pub batch_size: u32,
    /// Peak learning rate. Default `1e-4`.
    pub learning_rate: f64,
    /// Linear warm-up steps. Default `0`.
    pub warmup_steps: u64,
    /// The curve after warm-up (over the whole SFT stage). Default `constant`.
    pub lr_schedule: LrSchedule,
    /// Reshuffle the dataset each epoch; `false` keeps the order the dataset was given in (a
    /// curriculum). Default `true`.
    pub shuffle: bool,
    /// Compute the held-out loss every this many steps (0: only at the end). Default `0`.
    pub eval_every: u64,
    /// Save a checkpoint of the run every this many SFT steps (0: never during SFT; see
    /// `run.save_every` for what one holds and `run.resume` for continuing). Default `0`.
    pub save_every: u64,
}

impl Default for SftSection {
    fn default() -> Self {
        Self {
            epochs: 1,
            batch_size: 32,
            learning_rate: 1e-4,
            warmup_steps: 0,
            lr_schedule: LrSchedule::Constant {},
            shuffle: true,
            eval_every: 0,
            save_every: 0,
        }
    }
}

impl SftSection {
    pub(crate) fn validate(&self) -> Result<()> {
        let c = Checker::new("sft");
        c.at_least("epochs", self.epochs.into(), 1)?;
        c.at_least("batch_size", self.batch_size.into(), 1)?;
        c.positive("learning_rate", self.learning_rate)?;
        self.lr_schedule.validate_at("sft.lr_schedule")
    }
}
