//! From a configured [`PolicyLoss`] to its per-token loss: the dispatch from the selector to the
//! function each variant names.

use burn::tensor::{Bool, Tensor};

use super::config::policy_loss::PolicyLoss;
use super::pg_variants::{cispo_loss, kimi15_loss, nll_loss, tis_loss, topr_loss, vanilla_pg_loss};
use super::ppo::ppo_clip_loss;
use super::ratio::importance_ratio;
use super::token_loss::TokenLoss;
use crate::{AlgoError, Result};

impl PolicyLoss {
    /// The per-token loss of this variant (dispatches to the functions named in each variant's
    /// doc). `scores` (`[B]`) is needed by TOPR only; `mask` is used by the ratio (sequence-level
    /// PPO averages over trained tokens).
    ///
    /// # Shapes
    /// `logp`, `old_logp`, `advantages`, `mask`: `[B, T]`; `scores`: `[B]` → loss `[B, T]`.
    ///
    /// # Errors
    /// [`AlgoError::ShapeMismatch`] if the shapes disagree; [`AlgoError::MissingInput`] for TOPR
    /// without `scores`.
    pub fn token_loss(
        &self,
        logp: Tensor<2>,
        old_logp: Tensor<2>,
        advantages: Tensor<2>,
        mask: Tensor<2, Bool>,
        scores: Option<Tensor<1>>,
    ) -> Result<TokenLoss> {
        let old_logp = old_logp.detach();
        let advantages = advantages.detach();
        match *self {
            Self::Ppo {
                clip_low,
                clip_high,
                dual_clip,
                ratio,
            } => {
                let r = importance_ratio(ratio, logp, old_logp, mask)?;
                ppo_clip_loss(r, advantages, clip_low, clip_high, dual_clip)
            }
            Self::Vanilla {} => vanilla_pg_loss(logp, advantages),
            Self::Tis {
                lower_bound,
                upper_bound,
            } => tis_loss(logp, old_logp, advantages, lower_bound, upper_bound),
            Self::Topr {
                positive_weight,
                negative_weight,
            } => {
                let scores = scores.ok_or(AlgoError::MissingInput {
                    what: "scores",
                    needed_by: "policy_loss.kind = topr",
                })?;
                topr_loss(
                    logp,
                    old_logp,
                    advantages,
                    scores,
                    positive_weight,
                    negative_weight,
                )
            }
            Self::Cispo {
                clip_low,
                clip_high,
                unified_mask,
            } => cispo_loss(
                logp,
                old_logp,
                advantages,
                clip_low,
                clip_high,
                unified_mask,
            ),
            Self::Kimi15 { tau } => kimi15_loss(logp, old_logp, advantages, tau),
            Self::CrossEntropy {} => Ok(nll_loss(logp)),
        }
    }
}
