//! The loss section of the algorithm config: serde types and their validation. Everything here
//! builds without the `tensor` feature, so that roll-core can parse and check a config (and hand
//! an [`ObjectiveConfig`] to a `Policy`) without compiling Burn.
//!
//! | setting | module | types |
//! |---|---|---|
//! | the whole objective | [`objective`] | [`ObjectiveConfig`], [`KlLoss`] |
//! | policy loss | [`policy_loss`] | [`PolicyLoss`], [`RatioLevel`], [`DEFAULT_DUAL_CLIP`], [`roll_dual_clip`] |
//! | aggregation | [`aggregation`] | [`LossAggregation`], [`Denominators`] |
//! | critic | [`value_loss`] | [`ValueLossConfig`] |
//! | train–inference mismatch | [`correction`] | [`TrainInferCorrection`], [`IsWeightConfig`], [`RatioFilterConfig`], [`CorrectionLevel`] |
//!
//! All of them are re-exported from [`crate::loss`], which is where callers name them.

pub mod aggregation;
pub mod correction;
pub mod objective;
pub mod policy_loss;
pub mod value_loss;

pub use aggregation::{Denominators, LossAggregation};
pub use correction::{CorrectionLevel, IsWeightConfig, RatioFilterConfig, TrainInferCorrection};
pub use objective::{KlLoss, ObjectiveConfig};
pub use policy_loss::{DEFAULT_DUAL_CLIP, PolicyLoss, RatioLevel, roll_dual_clip};
pub use value_loss::ValueLossConfig;
