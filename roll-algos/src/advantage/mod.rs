//! Advantage estimators and returns on plain `f32` slices (ROLL §2.2).
//!
//! * Per-sequence baselines, `[B]` rewards in, `[B]` advantages out: [`grpo`] (GRPO and Dr.GRPO),
//!   [`reinforce_pp`] (REINFORCE++), [`rloo`], [`raft`] (RAFT++).
//! * Per step-sample advantages `[N]` of multi-turn episodes, one row per environment step, laid
//!   out by [`steps`] ([`StepInfo`], discounted step returns) and normalised by a key per sample
//!   ([`step_norm`]): [`gigpo`] (episode and anchor-state groups), [`step_reinforce`].
//! * Per-token returns over one response `[T]` with its loss mask: [`mod@gae`], [`reinforce`],
//!   [`agentic`] (turn-level returns over a multi-segment trajectory).
//! * [`estimator`] — the serde-typed [`AdvantageEstimator`] selector and
//!   [`AdvantageEstimator::compute`], which runs both steps over a padded batch `[B, T]`.
//!
//! Masked-off tokens are never read by any function here, so padding and environment tokens cannot
//! leak into trained tokens; their outputs are 0.

pub mod agentic;
pub mod estimator;
pub mod gae;
pub mod gigpo;
pub mod grpo;
pub mod raft;
pub mod reinforce;
pub mod reinforce_pp;
pub mod rloo;
pub mod step_norm;
pub mod step_reinforce;
pub mod steps;

pub use agentic::{agentic_reinforce_returns, place_step_rewards, segments};
pub use estimator::{AdvantageEstimator, AdvantageInput, AdvantageOutput};
pub use gae::{AdvantageReturns, gae};
pub use gigpo::{GigpoAdvantages, gigpo_advantages};
pub use grpo::grpo_advantages;
pub use raft::raft_pp_advantages;
pub use reinforce::{last_valid_index, place_at_last_valid, reinforce_returns};
pub use reinforce_pp::reinforce_pp_advantages;
pub use rloo::rloo_advantages;
pub use step_norm::{EpisodeNormScope, EpisodeNormalization, NormScope, StepNormalization};
pub use step_reinforce::step_reinforce_advantages;
pub use steps::{Episode, StepInfo, StepReturns, step_returns};
