//! Reward and advantage shaping on plain `f32` slices (ROLL §2.2, §2.6).
//!
//! * [`stats`] — the shared statistics every estimator uses (moments, standardisation, groups).
//! * [`normalize`] — sequence-reward normalisation with a mean type and a std type
//!   (none / group / batch / running), by contiguous groups or by a key per sample
//!   ([`normalize_by_key`]), and [`running`] — running moments keyed by domain.
//! * [`whiten`] — token-level masked whitening.
//! * [`clip`] — symmetric clipping and scale/shift.
//! * [`config`] — the typed settings: [`RewardShaping`] (before the estimator) and
//!   [`AdvantageShaping`] (around it).
//!
//! Shaping functions transform their input **in place** (`&mut [f32]`); estimators in
//! [`advantage`](crate::advantage) return new vectors.

pub mod clip;
pub mod config;
pub mod normalize;
pub mod running;
pub mod stats;
pub mod whiten;

pub use clip::{clip_symmetric, scale_shift};
pub use config::{AdvantageShaping, RewardShaping};
pub use normalize::{NormKind, RewardNormalization, normalize_by_key, normalize_rewards};
pub use running::{DomainMoments, RunningMoments};
pub use stats::{Moments, STD_EPS, VAR_EPS, moments_by_key};
pub use whiten::masked_whiten;
