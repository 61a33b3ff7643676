//! Policy and value losses: their settings ([`config`], always built) and, with the `tensor`
//! feature, the losses themselves, written once against Burn's tensor API (any backend, any device).
//!
//! Per-token tensors are `[B, T]` over response tokens, with a `Tensor<2, Bool>` loss mask
//! (`true` = the token is trained on). A trainer calls [`policy_objective`] once per micro-batch
//! with an [`ObjectiveConfig`]; the building blocks are public for custom objectives:
//!
//! | concept | settings ([`config`]) | computation (feature `tensor`) |
//! |---|---|---|
//! | masked reductions | | [`masked`]: [`masked_sum`](masked::masked_sum), [`masked_mean`](masked::masked_mean), [`row_sum`](masked::row_sum), … |
//! | importance ratio | [`RatioLevel`] | [`ratio`]: [`token_ratio`], [`segment_ratio`] (agentic turns), [`sequence_ratio`] (GSPO), [`importance_ratio`] |
//! | PPO | [`DEFAULT_DUAL_CLIP`], [`roll_dual_clip`] | [`ppo`]: [`ppo_clip_loss`] (clip-higher, dual clip) |
//! | PG variants | | [`pg_variants`]: [`vanilla_pg_loss`], [`tis_loss`], [`topr_loss`], [`cispo_loss`], [`kimi15_loss`] |
//! | selector | [`PolicyLoss`] | [`policy_loss`]: [`PolicyLoss::token_loss`] → [`TokenLoss`] |
//! | aggregation | [`LossAggregation`], [`Denominators`] | [`aggregate`](mod@aggregate): [`aggregate()`], [`Denominators::from_mask`] |
//! | entropy | | [`entropy`]: [`entropy_from_logits`], [`entropy_bonus`] |
//! | critic | [`ValueLossConfig`] | [`critic`]: [`critic_loss`], [`value_loss_per_token`] |
//! | train–inference mismatch | [`TrainInferCorrection`] | [`correction`]: [`TrainInferCorrection::apply`], [`is_weights`], [`ratio_filter`] |
//! | the whole objective | [`ObjectiveConfig`], [`KlLoss`] | [`objective`]: [`PolicyInputs`], [`policy_objective`] |
//!
//! KL estimators live in [`crate::kl`].

pub(crate) mod check;
pub mod config;

#[cfg(feature = "tensor")]
pub mod aggregate;
#[cfg(feature = "tensor")]
pub mod correction;
#[cfg(feature = "tensor")]
pub mod critic;
#[cfg(feature = "tensor")]
pub mod entropy;
#[cfg(feature = "tensor")]
pub mod masked;
#[cfg(feature = "tensor")]
pub mod objective;
#[cfg(feature = "tensor")]
pub mod pg_variants;
#[cfg(feature = "tensor")]
pub mod policy_loss;
#[cfg(feature = "tensor")]
pub mod ppo;
#[cfg(feature = "tensor")]
pub mod ratio;
#[cfg(feature = "tensor")]
pub(crate) mod shape;
#[cfg(feature = "tensor")]
pub mod token_loss;

pub use config::{
    CorrectionLevel, DEFAULT_DUAL_CLIP, Denominators, IsWeightConfig, KlLoss, LossAggregation,
    ObjectiveConfig, PolicyLoss, RatioFilterConfig, RatioLevel, TrainInferCorrection,
    ValueLossConfig, roll_dual_clip,
};

#[cfg(feature = "tensor")]
pub use aggregate::aggregate;
#[cfg(feature = "tensor")]
pub use correction::{CorrectionMetrics, is_weights, ratio_filter};
#[cfg(feature = "tensor")]
pub use critic::{CriticLossOutput, CriticMetrics, critic_loss, value_loss_per_token};
#[cfg(feature = "tensor")]
pub use entropy::{entropy_bonus, entropy_from_logits};
#[cfg(feature = "tensor")]
pub use objective::{PolicyInputs, PolicyLossOutput, PolicyMetrics, policy_objective};
#[cfg(feature = "tensor")]
pub use pg_variants::{cispo_loss, kimi15_loss, tis_loss, topr_loss, vanilla_pg_loss};
#[cfg(feature = "tensor")]
pub use ppo::ppo_clip_loss;
#[cfg(feature = "tensor")]
pub use ratio::{importance_ratio, log_ratio, segment_ratio, sequence_ratio, token_ratio};
#[cfg(feature = "tensor")]
pub use token_loss::TokenLoss;
