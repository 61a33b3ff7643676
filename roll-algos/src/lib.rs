//! # roll-algos — the math of RL post-training
//!
//! Small, exactly specified functions: every estimator, loss and shaping step carries its formula in
//! its doc comment and is tested against hand-computed numbers. A researcher reads this crate to know
//! precisely what a config does.
//!
//! * Per-sample and per-token quantities that need no gradient (advantages, returns, reward shaping,
//!   sample masks, dynamic-filter predicates) work on plain `f32` slices: [`advantage`], [`shaping`],
//!   [`masks`], [`filter`].
//! * Losses that need gradients are written once against Burn's tensor API, so every backend runs the
//!   same code (feature `tensor`): [`loss`], and the KL estimators in [`kl`] (also available on
//!   slices for KL-in-reward).
//!
//! # Cargo feature `tensor` (default)
//!
//! Only the tensor code needs Burn: the loss functions ([`loss::policy_objective`],
//! [`loss::critic_loss`] and their building blocks) and [`kl::kl_tensor`]. Without the feature the
//! crate is the config types ([`AlgorithmConfig`], [`loss::ObjectiveConfig`] and every loss and KL
//! setting, with their validation) and the slice math (advantages, shaping, masks, filters,
//! [`kl::kl_slice`]), and it does not depend on Burn. roll-core depends on it that way, so a crate
//! that only implements an environment or a reward never compiles Burn; the Burn backend turns the
//! feature on.
//!
//! Sequences are `[prompt | response]`; per-token quantities cover the response tokens and come with a
//! loss mask (`true` = the token is trained on).
#![warn(missing_docs)]
// The settings' docs link to the tensor functions that compute them; without `tensor` those links
// have no target, which is expected, not a broken doc.
#![cfg_attr(not(feature = "tensor"), allow(rustdoc::broken_intra_doc_links))]

pub mod advantage;
pub mod config;
pub mod error;
pub mod filter;
pub mod kl;
pub mod loss;
pub mod masks;
pub mod shaping;
#[cfg(test)]
mod test_util;

pub use config::AlgorithmConfig;
pub use error::{AlgoError, Result};
