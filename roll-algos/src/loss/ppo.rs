//! PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), with asymmetric
//! "clip-higher" bounds (DAPO, arXiv:2503.14476) and the dual clip for negative advantages
//! (Ye et al. 2020, arXiv:1912.09729).

use burn::tensor::Tensor;

use super::shape::{batch_dims, expect_shape};
use super::token_loss::TokenLoss;
use crate::Result;

/// Per-token PPO clipped-surrogate loss:
///
/// ```text
/// s1 = r·A
/// s2 = clamp(r, 1 − ε_low, 1 + ε_high)·A
/// L  = −min(s1, s2)                            (no dual clip, or A ≥ 0)
/// L  = −max(min(s1, s2), c·A)                  (dual clip c, A < 0)
/// ```
///
/// `r` is the importance ratio (token- or sequence-level, see
/// [`importance_ratio`](super::importance_ratio)), `A` the advantage. Where a clip is active the loss is a constant in
/// `r`, so such tokens contribute exactly zero gradient. Reported clips:
/// `clipped_high = A > 0 ∧ r > 1 + ε_high`, `clipped_low = A < 0 ∧ r < 1 − ε_low`,
/// `dual_clipped = A < 0 ∧ min(s1, s2) < c·A`.
///
/// # Shapes
/// `ratio`, `advantages`: `[B, T]` → loss `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree. The
/// clip settings are validated by [`PolicyLoss::validate`](super::PolicyLoss::validate).
pub fn ppo_clip_loss(
    ratio: Tensor<2>,
    advantages: Tensor<2>,
    clip_low: f32,
    clip_high: f32,
    dual_clip: Option<f32>,
) -> Result<TokenLoss> {
    let dims = batch_dims("ratio", &ratio)?;
    expect_shape("advantages", advantages.dims(), dims)?;
    let (lo, hi) = (1.0 - clip_low, 1.0 + clip_high);
    let s1 = ratio.clone() * advantages.clone();
    let s2 = ratio.clone().clamp(lo, hi) * advantages.clone();
    // `min_pair` keeps `s1` (and its gradient) on ties, i.e. inside the clip range.
    let surrogate = s1.min_pair(s2);
    let positive = advantages.clone().greater_elem(0.0);
    let negative = advantages.clone().lower_elem(0.0);
    let clipped_high = positive.bool_and(ratio.clone().greater_elem(hi));
    let clipped_low = negative.clone().bool_and(ratio.lower_elem(lo));
    let (objective, dual_clipped) = match dual_clip {
        Some(c) => {
            let floor = advantages.mul_scalar(c);
            let active = negative.bool_and(surrogate.clone().lower(floor.clone()));
            (surrogate.mask_where(active.clone(), floor), Some(active))
        }
        None => (surrogate, None),
    };
    Ok(TokenLoss {
        loss: objective.neg(),
        clipped_low: Some(clipped_low),
        clipped_high: Some(clipped_high),
        dual_clipped,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::loss::config::policy_loss::{DEFAULT_DUAL_CLIP, roll_dual_clip};
    use crate::test_util::{assert_close as close, bools as b, floats as v};
    use burn::tensor::Device;

    /// Ratios inside and outside the range, for positive and negative advantages.
    fn case() -> (Tensor<2>, Tensor<2>) {
        let dev = Device::flex();
        let ratio = Tensor::<2>::from_floats([[1.1, 1.5, 0.5, 1.0], [0.9, 0.5, 1.5, 5.0]], &dev);
        let adv = Tensor::<2>::from_floats([[2.0, 2.0, 2.0, 0.0], [-1.0, -1.0, -1.0, -1.0]], &dev);
        (ratio, adv)
    }

    #[test]
    fn symmetric_clip() {
        let (r, a) = case();
        let out = ppo_clip_loss(r, a, 0.2, 0.2, None).unwrap();
        // A=2: r=1.1 inside → −2.2; r=1.5 → −min(3, 2.4) = −2.4; r=0.5 → −min(1, 1.6) = −1.0.
        // A=0 → 0. A=−1: r=0.9 → 0.9; r=0.5 → −min(−0.5, −0.8) = 0.8; r=1.5 → 1.5; r=5 → 5.
        close(&v(out.loss), &[-2.2, -2.4, -1.0, 0.0, 0.9, 0.8, 1.5, 5.0]);
        assert_eq!(
            b(out.clipped_high),
            [false, true, false, false, false, false, false, false]
        );
        assert_eq!(
            b(out.clipped_low),
            [false, false, false, false, false, true, false, false]
        );
        assert!(out.dual_clipped.is_none());
    }

    #[test]
    fn asymmetric_clip_higher() {
        let (r, a) = case();
        let out = ppo_clip_loss(r, a, 0.2, 0.28, None).unwrap();
        // Upper bound 1.28: A=2, r=1.5 → −2.56. Lower bound unchanged.
        close(&v(out.loss), &[-2.2, -2.56, -1.0, 0.0, 0.9, 0.8, 1.5, 5.0]);
    }

    #[test]
    fn dual_clip_caps_negative_advantage_losses() {
        let (r, a) = case();
        let out = ppo_clip_loss(r.clone(), a.clone(), 0.2, 0.2, Some(DEFAULT_DUAL_CLIP)).unwrap();
        // A=−1, r=5: −max(−5, −3) = 3; r=1.5 stays 1.5 (< c). Positive advantages untouched.
        close(&v(out.loss), &[-2.2, -2.4, -1.0, 0.0, 0.9, 0.8, 1.5, 3.0]);
        assert_eq!(
            b(out.dual_clipped),
            [false, false, false, false, false, false, false, true]
        );
        // ROLL's constant c = 1 + 2·0.2 = 1.4 also caps r = 1.5.
        let roll = ppo_clip_loss(r, a, 0.2, 0.2, Some(roll_dual_clip(0.2))).unwrap();
        close(&v(roll.loss), &[-2.2, -2.4, -1.0, 0.0, 0.9, 0.8, 1.4, 1.4]);
    }
}
