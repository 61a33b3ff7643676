//! Settings of the train–inference mismatch correction (ROLL's
//! `roll/utils/train_infer_corrections.py`): a truncated importance weight and ratio filters. What
//! they compute (the log-ratio `ρ` at each [`CorrectionLevel`], the weights, the filtered mask) is
//! documented on [`TrainInferCorrection::apply`](crate::loss::TrainInferCorrection::apply) and
//! [`crate::loss::correction`] (feature `tensor`).

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::loss::check::{invalid, positive};

/// Granularity of a train–inference ratio (ROLL's `weight_type` / `agg_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionLevel {
    /// Per token: `exp(train_bt − infer_bt)`.
    #[default]
    Token,
    /// Per sequence, the product of its token ratios: `exp(Σ_t m_bt·(train_bt − infer_bt))`.
    Sequence,
    /// Per sequence, the geometric mean of its token ratios:
    /// `exp(Σ_t m_bt·(train_bt − infer_bt) / n_b)`.
    Geometric,
}

/// Truncated importance weight `w = sg(clamp(exp(ρ), 0, upper_bound))` multiplied into the
/// per-token policy loss (ROLL's `is_weight`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IsWeightConfig {
    /// Granularity of the ratio.
    pub level: CorrectionLevel,
    /// Truncation `C` of the weight (ROLL default 1.2).
    pub upper_bound: f32,
}

impl Default for IsWeightConfig {
    fn default() -> Self {
        Self {
            level: CorrectionLevel::Token,
            upper_bound: 1.2,
        }
    }
}

/// A ratio filter: tokens (or whole sequences) whose ratio `exp(ρ)` lies outside
/// `[low, high]` are removed from the loss mask (ROLL's `filters[]` with `ratio_enabled`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RatioFilterConfig {
    /// Granularity of the ratio; at sequence levels a whole sequence is kept or dropped.
    pub level: CorrectionLevel,
    /// Smallest kept ratio (ROLL default 0.8).
    pub low: f32,
    /// Largest kept ratio (ROLL default 1.2).
    pub high: f32,
}

impl Default for RatioFilterConfig {
    fn default() -> Self {
        Self {
            level: CorrectionLevel::Token,
            low: 0.8,
            high: 1.2,
        }
    }
}

/// The train–inference correction: an optional importance weight and any number of filters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainInferCorrection {
    /// The truncated importance weight; `None` = no re-weighting.
    pub is_weight: Option<IsWeightConfig>,
    /// Ratio filters, all applied (a token survives only if every filter keeps it).
    pub filters: Vec<RatioFilterConfig>,
}

impl Default for TrainInferCorrection {
    /// Token-level truncated IS with `C = 1.2` and no filter.
    fn default() -> Self {
        Self {
            is_weight: Some(IsWeightConfig::default()),
            filters: Vec::new(),
        }
    }
}

impl TrainInferCorrection {
    /// Checks the settings; keys are relative to the algorithm section
    /// (`train_infer_correction.*`).
    pub fn validate(&self) -> Result<()> {
        if let Some(w) = &self.is_weight {
            positive(
                "train_infer_correction.is_weight.upper_bound",
                w.upper_bound,
            )?;
        }
        for (i, f) in self.filters.iter().enumerate() {
            let key = |k: &str| format!("train_infer_correction.filters[{i}].{k}");
            if !(f.low.is_finite() && f.low >= 0.0) {
                return Err(invalid(key("low"), f.low, "a finite number >= 0"));
            }
            if !(f.high.is_finite() && f.high > f.low) {
                return Err(invalid(
                    key("high"),
                    f.high,
                    &format!("a finite number > low ({})", f.low),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_key() {
        let c = TrainInferCorrection {
            is_weight: None,
            filters: vec![
                RatioFilterConfig::default(),
                RatioFilterConfig {
                    low: 1.5,
                    ..Default::default()
                },
            ],
        };
        let err = c.validate().unwrap_err();
        assert!(
            matches!(err, crate::AlgoError::InvalidValue { ref key, .. } if key == "train_infer_correction.filters[1].high")
        );
        assert!(TrainInferCorrection::default().validate().is_ok());
    }
}
