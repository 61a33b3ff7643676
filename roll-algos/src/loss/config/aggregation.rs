//! How per-token losses are reduced to one number: the [`LossAggregation`] setting and the
//! [`Denominators`] that make data-parallel shards and gradient-accumulation micro-batches add up to
//! one big batch. The reduction itself is [`aggregate`](crate::loss::aggregate()) (feature
//! `tensor`).

use std::ops::Add;

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::loss::check::invalid;

/// How per-token losses are reduced to one number (ROLL's `loss_agg_mode`).
///
/// `m_bt` is the loss mask, `w_b` the optional per-sample weight (`1` when absent), `N` the number
/// of trained tokens and `S` the number of sequences with at least one trained token, both taken
/// from [`Denominators`] (global) or counted on the batch (local).
///
/// Serialised as `{ kind = "token_mean" }`; ROLL's spellings (`"token-mean"`, …) are accepted as
/// aliases of `kind`. Variants without settings are written `TokenMean {}` rather than as unit
/// variants so that serde rejects stray fields (it silently ignores them for unit variants of an
/// internally tagged enum).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LossAggregation {
    /// Every trained token of the batch weighs the same (DAPO, arXiv:2503.14476, §3.3):
    /// `Σ_{b,t} L_bt·m_bt·w_b / N`.
    ///
    /// Departure from ROLL: ROLL does not mask the numerator (`Σ L·w / N`) and relies on `L`
    /// being zero off the mask; here untrained tokens are always excluded.
    #[serde(alias = "token-mean")]
    TokenMean {},
    /// Sum over each sequence's tokens, mean over sequences: `Σ_b w_b·Σ_t L_bt·m_bt / S`.
    #[serde(alias = "seq-mean-token-sum")]
    SeqMeanTokenSum {},
    /// Mean over each sequence's tokens, mean over sequences (the original GRPO,
    /// arXiv:2402.03300; ROLL's default): `Σ_b w_b·(Σ_t L_bt·m_bt / max(n_b, 1)) / S`.
    #[serde(alias = "seq-mean-token-mean")]
    SeqMeanTokenMean {},
    /// Token sums divided by a constant horizon instead of each length (Dr. GRPO,
    /// arXiv:2503.20783): `Σ_b w_b·Σ_t L_bt·m_bt / H`.
    ///
    /// As in ROLL and verl there is no division by the number of sequences. `H` is `horizon`, or the
    /// padded length `T` of the batch when `None` (ROLL's behaviour). Set `horizon` (e.g. to the
    /// maximum response length) whenever micro-batches may be padded to different lengths,
    /// otherwise they do not add up to the full-batch loss.
    #[serde(alias = "seq-mean-token-sum-norm")]
    SeqMeanTokenSumNorm {
        /// The constant `H`; `None` = the padded length of each batch.
        #[serde(default)]
        horizon: Option<usize>,
    },
}

impl Default for LossAggregation {
    /// ROLL's default, seq-mean-token-mean.
    fn default() -> Self {
        Self::SeqMeanTokenMean {}
    }
}

impl LossAggregation {
    /// Checks the settings; keys are relative to the algorithm section (`loss_aggregation.*`).
    pub fn validate(&self) -> Result<()> {
        match self {
            Self::SeqMeanTokenSumNorm { horizon: Some(0) } => Err(invalid(
                "loss_aggregation.horizon",
                0,
                "an integer >= 1, or unset for the padded length",
            )),
            _ => Ok(()),
        }
    }
}

/// The denominators of [`aggregate`](crate::loss::aggregate()): `N` (trained tokens) and `S` (sequences with at least one
/// trained token), each either counted on the batch at hand (`None`, the "local" default) or
/// supplied for the whole global batch (`Some`).
///
/// For exact data-parallel / gradient-accumulation equivalence, count every micro-batch of the
/// global batch with [`Denominators::from_mask`], add them up (`+`), and pass the sum to every
/// micro-batch's loss; then sum the micro-batch losses (or their gradients).
///
/// Departure from ROLL: ROLL's local default for `S` is the number of rows `B` (empty rows
/// included), while its data-parallel path counts *valid* samples; here `S` always counts valid
/// samples, so local and global aggregation agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Denominators {
    /// Global number of trained tokens `N`; `None` = count this batch's mask.
    pub num_tokens: Option<usize>,
    /// Global number of sequences with at least one trained token `S`; `None` = count this batch.
    pub num_samples: Option<usize>,
}

impl Denominators {
    /// Count both denominators on each batch (the default).
    pub fn local() -> Self {
        Self::default()
    }

    /// Use the given global counts `N` (tokens) and `S` (samples).
    pub fn global(num_tokens: usize, num_samples: usize) -> Self {
        Self {
            num_tokens: Some(num_tokens),
            num_samples: Some(num_samples),
        }
    }
}

impl Add for Denominators {
    type Output = Denominators;

    /// Adds counts; `None` (local) stays `None` unless both sides are `Some`.
    fn add(self, rhs: Self) -> Self {
        let add = |a: Option<usize>, b: Option<usize>| Some(a? + b?);
        Self {
            num_tokens: add(self.num_tokens, rhs.num_tokens),
            num_samples: add(self.num_samples, rhs.num_samples),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn adding_counts_keeps_local_local() {
        let a = Denominators::global(6, 3);
        let b = Denominators::global(4, 2);
        assert_eq!(a + b, Denominators::global(10, 5));
        // One local side means "count each batch": the sum cannot be a global count.
        assert_eq!(a + Denominators::local(), Denominators::local());
        let half = Denominators {
            num_tokens: Some(5),
            num_samples: None,
        };
        assert_eq!(
            a + half,
            Denominators {
                num_tokens: Some(11),
                num_samples: None,
            }
        );
    }

    #[test]
    fn serde_names_and_aliases() {
        let a: LossAggregation =
            serde_json::from_str(r#"{"kind":"seq-mean-token-sum-norm","horizon":16}"#).unwrap();
        assert_eq!(
            a,
            LossAggregation::SeqMeanTokenSumNorm { horizon: Some(16) }
        );
        let a: LossAggregation = serde_json::from_str(r#"{"kind":"token_mean"}"#).unwrap();
        assert_eq!(a, LossAggregation::TokenMean {});
        assert!(
            serde_json::from_str::<LossAggregation>(r#"{"kind":"token_mean","horizon":4}"#)
                .is_err()
        );
        assert!(
            serde_json::from_str::<LossAggregation>(
                r#"{"kind":"seq_mean_token_sum_norm","horizn":16}"#
            )
            .is_err()
        );
        assert!(
            LossAggregation::SeqMeanTokenSumNorm { horizon: Some(0) }
                .validate()
                .is_err()
        );
        assert_eq!(
            LossAggregation::default(),
            LossAggregation::SeqMeanTokenMean {}
        );
    }
}
