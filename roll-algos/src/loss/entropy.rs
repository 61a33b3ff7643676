//! Token entropy of the policy and the entropy bonus that is subtracted from the loss.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Tensor};

use super::aggregate::aggregate;
use super::config::aggregation::{Denominators, LossAggregation};
use crate::Result;

/// Entropy of each position's next-token distribution: `H_bt = −Σ_v p_btv·log p_btv` with
/// `p = softmax(logits)` (computed through `log_softmax`, stable for large logits). Terms with
/// `p = 0` count as `0`, so `−∞` logits (masked vocabulary entries) are allowed.
///
/// # Shapes
/// `logits`: `[B, T, V]` → `[B, T]`.
pub fn entropy_from_logits(logits: Tensor<3>) -> Tensor<2> {
    let logp = log_softmax(logits, 2);
    let p = logp.clone().exp();
    let zero = p.clone().equal_elem(0.0);
    (p * logp)
        .mask_fill(zero, 0.0)
        .sum_dim(2)
        .squeeze_dim::<2>(2)
        .neg()
}

/// The entropy bonus `coef·agg(H, m)`, reduced like the policy loss. Subtract it from the loss
/// (`total = … − entropy_bonus(…)`) to reward exploration.
///
/// # Shapes
/// `entropy`, `mask`: `[B, T]` → `[1]`.
///
/// # Errors
/// As [`aggregate`].
pub fn entropy_bonus(
    entropy: Tensor<2>,
    mask: Tensor<2, Bool>,
    coef: f32,
    mode: LossAggregation,
    denominators: &Denominators,
) -> Result<Tensor<1>> {
    Ok(aggregate(entropy, mask, mode, None, denominators)?.mul_scalar(coef))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    #[test]
    fn entropy_of_uniform_and_peaked_distributions() {
        let dev = Device::flex();
        // Uniform over 4 → ln 4; logits (0, ln 3, −∞, −∞) → p = (1/4, 3/4, 0, 0).
        let logits = Tensor::<3>::from_floats(
            [[
                [0.0, 0.0, 0.0, 0.0],
                [0.0, 3.0f32.ln(), f32::NEG_INFINITY, f32::NEG_INFINITY],
            ]],
            &dev,
        );
        let h: Vec<f32> = entropy_from_logits(logits)
            .into_data()
            .try_into_vec()
            .unwrap();
        let expected = -(0.25 * 0.25f32.ln() + 0.75 * 0.75f32.ln());
        assert!((h[0] - 4.0f32.ln()).abs() < 1e-5, "{h:?}");
        assert!((h[1] - expected).abs() < 1e-5, "{h:?}");
    }

    #[test]
    fn bonus_is_coef_times_aggregate() {
        let dev = Device::flex();
        let h = Tensor::<2>::from_floats([[1.0, 3.0], [2.0, 100.0]], &dev);
        let m = Tensor::<2, Bool>::from_bool([[true, true], [true, false]], &dev);
        let b = entropy_bonus(
            h,
            m,
            0.01,
            LossAggregation::TokenMean {},
            &Denominators::local(),
        )
        .unwrap();
        assert!((b.into_scalar::<f32>() - 0.02).abs() < 1e-6);
    }
}
