//! Settings of the critic (value-function) loss. The loss is
//! [`critic_loss`](crate::loss::critic_loss) (feature `tensor`).

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::loss::check::invalid;

/// Settings of the critic loss (ROLL's `value_clip`): with clip `c` the loss is
/// `0.5·max((v − R)², (clamp(v, v_old − c, v_old + c) − R)²)`, see
/// [`value_loss_per_token`](crate::loss::value_loss_per_token).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValueLossConfig {
    /// Value clip `c`: new values may move at most `c` from the values at rollout time.
    /// `None` (ROLL's default) disables clipping.
    pub clip: Option<f32>,
}

impl ValueLossConfig {
    /// Checks the settings; keys are relative to the algorithm section (`value_loss.*`).
    pub fn validate(&self) -> Result<()> {
        match self.clip {
            Some(c) if !(c.is_finite() && c > 0.0) => Err(invalid(
                "value_loss.clip",
                c,
                "a finite number > 0, or unset",
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        for bad in [0.0, -0.2, f32::NAN, f32::INFINITY] {
            assert!(
                matches!(
                    ValueLossConfig { clip: Some(bad) }.validate(),
                    Err(crate::AlgoError::InvalidValue { ref key, .. }) if key == "value_loss.clip"
                ),
                "{bad}"
            );
        }
        assert!(ValueLossConfig { clip: Some(0.2) }.validate().is_ok());
        assert!(ValueLossConfig::default().validate().is_ok());
    }
}
