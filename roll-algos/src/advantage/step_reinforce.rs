//! Step-level REINFORCE (ROLL's agentic `adv_estimator = "step_reinforce"`): every environment
//! step is a sample whose advantage is its normalised discounted step return.

use super::step_norm::StepNormalization;
use super::steps::{StepInfo, step_returns};
use crate::Result;

/// Step REINFORCE advantages of a batch of step-samples, `step_rewards[i]` being the
/// environment's reward for step-sample `i`:
///
/// ```text
/// G_t = r_t + γ_s·G_{t+1}          within each episode, steps ordered by `step`
/// A_i = normalise(G)_i             over the step-samples, by `normalization`
/// ```
///
/// (ROLL: `compute_discounted_returns`, then `agentic_reward_norm` of the step returns with the
/// configured `reward_normalization`, in `compute_response_level_rewards`). Every step-sample
/// counts once in the statistics. The token-level advantage is the REINFORCE return of `A_i` on
/// the step-sample's response.
///
/// # Shapes
/// `step_rewards`, `steps`: `[N]`; output `[N]`. Fails with
/// [`AlgoError::LengthMismatch`](crate::AlgoError::LengthMismatch) when the lengths differ.
pub fn step_reinforce_advantages(
    step_rewards: &[f32],
    steps: &[StepInfo],
    step_reward_gamma: f32,
    normalization: StepNormalization,
) -> Result<Vec<f32>> {
    let mut g = step_returns(step_rewards, steps, step_reward_gamma)?.returns;
    normalization.apply(&mut g, steps)?;
    Ok(g)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::advantage::NormScope;
    use crate::test_util::assert_close;

    fn step(group: u64, episode: u64, step: u32) -> StepInfo {
        StepInfo {
            group,
            episode,
            step,
            ..StepInfo::default()
        }
    }

    /// Group 0: episode 0 with rewards [0, 1] and episode 1 with rewards [0, 0, 0], given out of
    /// order (the layout of GiGPO's two-trajectory example).
    fn two_trajectories() -> (Vec<f32>, Vec<StepInfo>) {
        let steps = vec![
            step(0, 1, 1),
            step(0, 0, 0),
            step(0, 1, 0),
            step(0, 0, 1),
            step(0, 1, 2),
        ];
        (vec![0.0, 0.0, 0.0, 1.0, 0.0], steps)
    }

    #[test]
    fn group_normalised_step_returns() {
        let (rewards, steps) = two_trajectories();
        // γ_s = 0.5: G = [0, 0.5, 0, 1, 0]. Group {0, 0.5, 0, 1, 0}: mean 0.3,
        // Σ(G − 0.3)² = 0.09 + 0.04 + 0.09 + 0.49 + 0.09 = 0.8, std sqrt(0.2) = 0.4472136
        // → (G − 0.3)/0.4472146.
        let a =
            step_reinforce_advantages(&rewards, &steps, 0.5, StepNormalization::group()).unwrap();
        let s = 0.447_214_6f32;
        assert_close(&a, &[-0.3 / s, 0.2 / s, -0.3 / s, 0.7 / s, -0.3 / s]);
    }

    #[test]
    fn no_normalisation_is_the_discounted_return() {
        let (rewards, steps) = two_trajectories();
        // γ_s = 1: episode 0 → [1, 1]; episode 1 → [0, 0, 0].
        let a =
            step_reinforce_advantages(&rewards, &steps, 1.0, StepNormalization::default()).unwrap();
        assert_eq!(a, [0.0, 1.0, 0.0, 1.0, 0.0]);
        // Mean over the batch only: mean 0.4 → G − 0.4.
        let mean_only = StepNormalization {
            mean: NormScope::Batch,
            std: NormScope::None,
        };
        let a = step_reinforce_advantages(&rewards, &steps, 1.0, mean_only).unwrap();
        assert_close(&a, &[-0.4, 0.6, -0.4, 0.6, -0.4]);
    }

    #[test]
    fn length_mismatch_is_an_error() {
        assert!(step_reinforce_advantages(&[1.0], &[], 1.0, StepNormalization::group()).is_err());
    }
}
