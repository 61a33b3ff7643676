//! The policy-gradient variants of ROLL's `ActorPGWorker` (`rlvr/actor_pg_worker.py`): plain
//! REINFORCE-style losses whose importance weights, if any, are constants (`sg` = stop-gradient,
//! [`Tensor::detach`]).
//!
//! Every function returns the per-token loss `L_bt` of `[B, T]` inputs; the ratio is
//! `r_bt = exp(logp_bt − old_bt)`. Because the weights are detached, the gradient of each loss is
//! `∂L/∂logp = −w·A` (plus Kimi-1.5's penalty term): the weight scales the step, never steers it.
//! Untrained positions are left to [`aggregate`](super::aggregate()), which excludes them.

use burn::tensor::Tensor;

use super::shape::{batch_dims, expect_shape};
use super::token_loss::TokenLoss;
use crate::Result;

/// Checks that `old_logp` and `advantages` have the shape of `logp`.
fn check_inputs(logp: &Tensor<2>, old_logp: &Tensor<2>, advantages: &Tensor<2>) -> Result<()> {
    let dims = batch_dims("logp", logp)?;
    expect_shape("old_logp", old_logp.dims(), dims)?;
    expect_shape("advantages", advantages.dims(), dims)
}

/// Detached token ratio `sg(exp(logp − old))`.
fn detached_ratio(logp: &Tensor<2>, old_logp: Tensor<2>) -> Tensor<2> {
    (logp.clone().detach() - old_logp.detach()).exp()
}

/// Vanilla policy gradient (REINFORCE, Williams 1992): `L = −A·logp`.
///
/// # Shapes
/// `logp`, `advantages`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn vanilla_pg_loss(logp: Tensor<2>, advantages: Tensor<2>) -> Result<TokenLoss> {
    let dims = batch_dims("logp", &logp)?;
    expect_shape("advantages", advantages.dims(), dims)?;
    Ok(TokenLoss::unclipped((advantages * logp).neg()))
}

/// Negative log-likelihood, `L = −logp`: supervised fine-tuning's cross-entropy on the trained
/// tokens (aggregated by the objective's [`LossAggregation`](crate::loss::LossAggregation), token-mean
/// for SFT). Not a policy gradient — no advantage, no ratio — but it runs through the same
/// objective, micro-batching and global denominators as the RL losses.
///
/// # Shapes
/// `logp`: `[B, T]` → `[B, T]`.
pub fn nll_loss(logp: Tensor<2>) -> TokenLoss {
    TokenLoss::unclipped(logp.neg())
}

/// Truncated importance sampling (TIS): `L = −sg(clamp(r, lower, upper))·A·logp`.
///
/// ROLL uses `lower = 0`, `upper = 1`. Reports `clipped_low = r < lower`, `clipped_high = r > upper`.
///
/// # Shapes
/// `logp`, `old_logp`, `advantages`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn tis_loss(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    advantages: Tensor<2>,
    lower: f32,
    upper: f32,
) -> Result<TokenLoss> {
    check_inputs(&logp, &old_logp, &advantages)?;
    let ratio = detached_ratio(&logp, old_logp);
    let weight = ratio.clone().clamp(lower, upper);
    Ok(TokenLoss {
        loss: (weight * advantages * logp).neg(),
        clipped_low: Some(ratio.clone().lower_elem(lower)),
        clipped_high: Some(ratio.greater_elem(upper)),
        dual_clipped: None,
    })
}

/// TOPR, Tapered Off-Policy REINFORCE (Le Roux et al. 2025, arXiv:2503.14286):
///
/// ```text
/// score_b > 0:  L = −w_pos·A·logp                       (plain SFT-like push up)
/// score_b ≤ 0:  L = −w_neg·sg(clamp(r, 0, 1))·A·logp    (truncated IS on negatives)
/// ```
///
/// The sign is taken per sample from `scores` (the raw sequence reward, not the advantage).
/// Reports `clipped_high` = negative sample with `r > 1`.
///
/// # Shapes
/// `logp`, `old_logp`, `advantages`: `[B, T]`; `scores`: `[B]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn topr_loss(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    advantages: Tensor<2>,
    scores: Tensor<1>,
    positive_weight: f32,
    negative_weight: f32,
) -> Result<TokenLoss> {
    check_inputs(&logp, &old_logp, &advantages)?;
    let [b, t] = logp.dims();
    expect_shape("scores", scores.dims(), [b])?;
    let positive = scores
        .detach()
        .greater_elem(0.0)
        .unsqueeze_dim::<2>(1)
        .repeat_dim(1, t);
    let ratio = detached_ratio(&logp, old_logp);
    let negative_w = ratio.clone().clamp(0.0, 1.0).mul_scalar(negative_weight);
    let weight = negative_w.mask_fill(positive.clone(), positive_weight);
    Ok(TokenLoss {
        loss: (weight * advantages * logp).neg(),
        clipped_low: None,
        clipped_high: Some(positive.bool_not().bool_and(ratio.greater_elem(1.0))),
        dual_clipped: None,
    })
}

/// CISPO, Clipped IS-weight Policy Optimisation (MiniMax-M1, arXiv:2506.13585, §3.1):
/// `L = −sg(clamp(r, 1 − ε_low, 1 + ε_high))·A·logp`.
///
/// Unlike PPO, clipped tokens keep their gradient (only the weight is capped). With
/// `unified_mask` (the paper's Eq. 7 token mask `M_bt`), tokens PPO would have clipped —
/// `(A > 0 ∧ r > 1 + ε_high) ∨ (A < 0 ∧ r < 1 − ε_low)` — get `L = 0` (they stay in the
/// aggregation denominators). Reports `clipped_low = r < 1 − ε_low`, `clipped_high = r > 1 + ε_high`.
///
/// # Shapes
/// `logp`, `old_logp`, `advantages`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn cispo_loss(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    advantages: Tensor<2>,
    clip_low: f32,
    clip_high: f32,
    unified_mask: bool,
) -> Result<TokenLoss> {
    check_inputs(&logp, &old_logp, &advantages)?;
    let (lo, hi) = (1.0 - clip_low, 1.0 + clip_high);
    let ratio = detached_ratio(&logp, old_logp);
    let weight = ratio.clone().clamp(lo, hi);
    let mut loss = (weight * advantages.clone() * logp).neg();
    let above = ratio.clone().greater_elem(hi);
    let below = ratio.lower_elem(lo);
    if unified_mask {
        let drop = advantages
            .clone()
            .greater_elem(0.0)
            .bool_and(above.clone())
            .bool_or(advantages.lower_elem(0.0).bool_and(below.clone()));
        loss = loss.mask_fill(drop, 0.0);
    }
    Ok(TokenLoss {
        loss,
        clipped_low: Some(below),
        clipped_high: Some(above),
        dual_clipped: None,
    })
}

/// Kimi-1.5's policy loss (Kimi Team 2025, arXiv:2501.12599, §2.3.2, as in ROLL):
/// `L = −A·logp + τ/2·(logp − old)²`.
///
/// The squared log-ratio keeps the update close to the sampling policy; its gradient is
/// `τ·(logp − old)`.
///
/// # Shapes
/// `logp`, `old_logp`, `advantages`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn kimi15_loss(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    advantages: Tensor<2>,
    tau: f32,
) -> Result<TokenLoss> {
    check_inputs(&logp, &old_logp, &advantages)?;
    let penalty = (logp.clone() - old_logp.detach())
        .square()
        .mul_scalar(tau / 2.0);
    Ok(TokenLoss::unclipped((advantages * logp).neg() + penalty))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close as close, bools as b, floats as v};
    use burn::tensor::Device;

    /// logp − old = ln 0.5, 0, ln 1.5, ln 3 → r = 0.5, 1, 1.5, 3.
    fn case() -> (Tensor<2>, Tensor<2>, Tensor<2>) {
        let dev = Device::flex();
        let old = Tensor::<2>::from_floats([[-1.0, -2.0], [-1.0, -0.5]], &dev);
        let logp = old.clone()
            + Tensor::<2>::from_floats([[0.5f32.ln(), 0.0], [1.5f32.ln(), 3.0f32.ln()]], &dev);
        let adv = Tensor::<2>::from_floats([[2.0, -1.0], [1.0, -2.0]], &dev);
        (logp, old, adv)
    }

    fn logp_values() -> [f32; 4] {
        [
            -1.0 + 0.5f32.ln(),
            -2.0,
            -1.0 + 1.5f32.ln(),
            -0.5 + 3.0f32.ln(),
        ]
    }

    #[test]
    fn vanilla() {
        let (logp, _, adv) = case();
        let l = logp_values();
        close(
            &v(vanilla_pg_loss(logp, adv).unwrap().loss),
            &[-2.0 * l[0], l[1], -l[2], 2.0 * l[3]],
        );
    }

    #[test]
    fn nll_is_minus_logp_whatever_the_advantages() {
        let (logp, _, _) = case();
        let l = logp_values();
        close(&v(nll_loss(logp).loss), &[-l[0], -l[1], -l[2], -l[3]]);
    }

    #[test]
    fn tis() {
        let (logp, old, adv) = case();
        let l = logp_values();
        let out = tis_loss(logp, old, adv, 0.0, 1.0).unwrap();
        // Weights 0.5, 1, 1, 1.
        close(&v(out.loss), &[-2.0 * 0.5 * l[0], l[1], -l[2], 2.0 * l[3]]);
        assert_eq!(b(out.clipped_high), [false, false, true, true]);
        assert_eq!(b(out.clipped_low), [false; 4]);
    }

    #[test]
    fn topr_splits_by_score_sign() {
        let (logp, old, adv) = case();
        let l = logp_values();
        let scores = Tensor::<1>::from_floats([1.0, 0.0], &Device::flex());
        let out = topr_loss(logp, old, adv, scores, 1.5, 0.5).unwrap();
        // Row 0 positive: weight 1.5. Row 1 negative: 0.5·clamp(r, 0, 1) = 0.5, 0.5.
        close(
            &v(out.loss),
            &[-3.0 * l[0], 1.5 * l[1], -0.5 * l[2], 1.0 * l[3]],
        );
        assert_eq!(b(out.clipped_high), [false, false, true, true]);
    }

    #[test]
    fn cispo_with_and_without_unified_mask() {
        let (logp, old, adv) = case();
        let l = logp_values();
        // Weights clamp(r, 0.8, 1.2) = 0.8, 1, 1.2, 1.2.
        let out = cispo_loss(logp.clone(), old.clone(), adv.clone(), 0.2, 0.2, false).unwrap();
        close(
            &v(out.loss),
            &[-2.0 * 0.8 * l[0], l[1], -1.2 * l[2], 2.0 * 1.2 * l[3]],
        );
        assert_eq!(b(out.clipped_low), [true, false, false, false]);
        assert_eq!(b(out.clipped_high), [false, false, true, true]);
        // Unified mask drops A>0 ∧ r>1.2 (token 2); token 0 (A>0, r<0.8) and 3 (A<0, r>1.2) stay.
        let out = cispo_loss(logp, old, adv, 0.2, 0.2, true).unwrap();
        close(
            &v(out.loss),
            &[-2.0 * 0.8 * l[0], l[1], 0.0, 2.0 * 1.2 * l[3]],
        );
    }

    #[test]
    fn kimi15_adds_squared_log_ratio() {
        let (logp, old, adv) = case();
        let l = logp_values();
        let d = [0.5f32.ln(), 0.0, 1.5f32.ln(), 3.0f32.ln()];
        let out = kimi15_loss(logp, old, adv, 0.1).unwrap();
        let a = [2.0, -1.0, 1.0, -2.0];
        let expected: Vec<f32> = (0..4).map(|i| -a[i] * l[i] + 0.05 * d[i] * d[i]).collect();
        close(&v(out.loss), &expected);
    }
}
