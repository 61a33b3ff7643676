//! What one pipeline step reports.

use crate::WeightVersion;
use crate::scheduler::RolloutStats;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// The outcome of one step: what was generated, how it scored, what training did.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct StepReport {
    /// Step index, from 0.
    pub step: u64,
    /// The actor's weight version after the step.
    pub weight_version: WeightVersion,
    /// Groups trained on.
    pub groups: usize,
    /// Samples trained on.
    pub samples: usize,
    /// Trained tokens.
    pub trained_tokens: usize,
    /// Mean raw reward of the samples.
    pub reward_mean: f32,
    /// Mean task score (accuracy for 0/1 verifiers).
    pub score_mean: f32,
    /// Mean response length in tokens.
    pub response_len_mean: f32,
    /// Rollout counters.
    pub rollout: RolloutStats,
    /// Every scalar metric of the step, by name (`reward/mean`, `train/pg_loss`, ...). In JSON
    /// a NaN is `null` (JSON has no NaN) and reads back as NaN.
    #[serde(deserialize_with = "nan_from_null")]
    pub metrics: BTreeMap<String, f64>,
    /// Wall-clock time spent waiting for the rollout.
    pub rollout_time: Duration,
    /// Wall-clock time of scoring and training.
    pub train_time: Duration,
}

impl fmt::Display for StepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {:>3} {} | reward {:+.3} score {:.3} len {:.1} | {} groups {} samples | filtered {} failed {} aborted {} | rollout {:.2?} train {:.2?}",
            self.step,
            self.weight_version,
            self.reward_mean,
            self.score_mean,
            self.response_len_mean,
            self.groups,
            self.samples,
            self.rollout.groups_filtered,
            self.rollout.samples_failed,
            self.rollout.samples_aborted,
            self.rollout_time,
            self.train_time,
        )
    }
}

/// Reads a metrics map whose NaNs were written as `null`.
fn nan_from_null<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, f64>, D::Error> {
    let map: BTreeMap<String, Option<f64>> = serde::Deserialize::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}
