//! Checks of config values shared by the loss and KL settings (crate-private).
//!
//! Every `validate` rejects an out-of-range setting with a key that names it, through these helpers,
//! so that the messages read the same everywhere. Tensor shape checks live in `loss::shape` (feature
//! `tensor`).

use std::fmt::Display;

use crate::{AlgoError, Result};

/// Builds [`AlgoError::InvalidValue`].
pub(crate) fn invalid(key: impl Into<String>, value: impl Display, allowed: &str) -> AlgoError {
    AlgoError::InvalidValue {
        key: key.into(),
        value: value.to_string(),
        allowed: allowed.to_string(),
    }
}

/// Requires `lo < x < hi` (NaN fails).
pub(crate) fn open_range(key: &str, x: f32, lo: f32, hi: f32) -> Result<()> {
    if x > lo && x < hi {
        Ok(())
    } else {
        Err(invalid(key, x, &format!("a number in ({lo}, {hi})")))
    }
}

/// Requires a finite `x > 0`.
pub(crate) fn positive(key: &str, x: f32) -> Result<()> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(invalid(key, x, "a finite number > 0"))
    }
}

/// Requires a finite `x >= 0`.
pub(crate) fn non_negative(key: &str, x: f32) -> Result<()> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(invalid(key, x, "a finite number >= 0"))
    }
}

/// Requires a finite `x`.
pub(crate) fn finite(key: &str, x: f32) -> Result<()> {
    if x.is_finite() {
        Ok(())
    } else {
        Err(invalid(key, x, "a finite number"))
    }
}
