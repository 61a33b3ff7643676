//! GiGPO, Group-in-Group Policy Optimization (Feng et al. 2025, arXiv:2505.10978): episode-level
//! group advantages plus step-level advantages grouped by anchor state.

use std::collections::BTreeMap;

use super::step_norm::{EpisodeNormalization, StepNormalization};
use super::steps::{StepInfo, step_returns};
use crate::Result;
use crate::shaping::stats::normalize_in_place;

/// The two GiGPO components of every step-sample, and the discounted step returns they came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GigpoAdvantages {
    /// `A_ep`, the episode-level advantage of the sample's episode (equal for its steps).
    pub episode: Vec<f32>,
    /// `A_step`, the step-level advantage of the sample within its anchor-state group.
    pub step: Vec<f32>,
    /// `G_t`, the discounted return of the step within its episode.
    pub step_returns: Vec<f32>,
}

impl GigpoAdvantages {
    /// The per-sample GiGPO advantage `A = episode_weight·A_ep + step_weight·A_step` (ROLL's
    /// `episode_reward_weight` / `step_reward_weight`).
    pub fn combined(&self, episode_weight: f32, step_weight: f32) -> Vec<f32> {
        self.episode
            .iter()
            .zip(&self.step)
            .map(|(e, s)| episode_weight * e + step_weight * s)
            .collect()
    }
}

/// GiGPO advantages of a batch of step-samples, `step_rewards[i]` being the environment's reward for
/// step-sample `i`.
///
/// ```text
/// G_t    = r_t + γ_s·G_{t+1}                       within each episode, steps ordered by `step`
/// R(τ)   = Σ_t r_t                                 episode score (undiscounted)
/// A_ep   = normalise(R)(τ)                         over episodes, by `episode_normalization`
///                                                  (the paper: (R − mean_group R) / (std_group R + 1e-6))
/// A_step = (G_t − mean_anchor G) / (std_anchor G + 1e-6)     over the steps of a group that acted
///                                                            on the same state
/// ```
///
/// with unbiased standard deviations (see [`StepNormalization`] for the episode part); with
/// `step_std_normalize = false` the step part is `G_t − mean_anchor G` only (the paper's "mean"
/// normalisation, `F_norm = 1`). An anchor state met once gets 0 (see [`normalize_in_place`]), and
/// so does an episode alone in its std scope. Combine the components with
/// [`GigpoAdvantages::combined`]; the token-level advantage is the REINFORCE return of the
/// combination on the step-sample's response.
///
/// Episodes are keyed by `(group, episode)`, anchor states by `(group, state)` (see
/// [`step_returns`]); an episode's tag is that of its first step. The episode score is the sum of
/// the episode's step rewards present in the batch (ROLL's `episode_scores` when every step is
/// present).
///
/// Differences from ROLL: ROLL normalises the episode score over step-samples (an episode counts
/// once per step, so long episodes weigh more in the mean and std); here, as in the paper, each
/// episode counts once. ROLL's step part follows the configured `method` (identity, mean or
/// mean-std); here it always subtracts the anchor mean.
///
/// # Shapes
/// `step_rewards`, `steps`: `[N]`; every output `[N]`. Fails with
/// [`AlgoError::LengthMismatch`](crate::AlgoError::LengthMismatch) when the lengths differ.
pub fn gigpo_advantages(
    step_rewards: &[f32],
    steps: &[StepInfo],
    step_reward_gamma: f32,
    episode_normalization: EpisodeNormalization,
    step_std_normalize: bool,
) -> Result<GigpoAdvantages> {
    let n = steps.len();
    let layout = step_returns(step_rewards, steps, step_reward_gamma)?;

    let mut scores: Vec<f32> = layout.episodes.iter().map(|e| e.score).collect();
    let first: Vec<StepInfo> = layout
        .episodes
        .iter()
        .map(|e| e.rows.first().map_or_else(StepInfo::default, |&i| steps[i]))
        .collect();
    StepNormalization::from(episode_normalization).apply(&mut scores, &first)?;
    let mut episode = vec![0.0f32; n];
    for (e, a) in layout.episodes.iter().zip(scores) {
        e.rows.iter().for_each(|&i| episode[i] = a);
    }

    let mut anchors: BTreeMap<(u64, u64), Vec<usize>> = BTreeMap::new();
    for (i, s) in steps.iter().enumerate() {
        anchors.entry((s.group, s.state)).or_default().push(i);
    }
    let mut step = vec![0.0f32; n];
    for rows in anchors.values() {
        let mut returns: Vec<f32> = rows.iter().map(|&i| layout.returns[i]).collect();
        normalize_in_place(&mut returns, step_std_normalize);
        for (&i, a) in rows.iter().zip(returns) {
            step[i] = a;
        }
    }

    Ok(GigpoAdvantages {
        episode,
        step,
        step_returns: layout.returns,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::advantage::EpisodeNormScope;
    use crate::test_util::assert_close;

    fn step(group: u64, episode: u64, step: u32, state: u64) -> StepInfo {
        StepInfo {
            group,
            episode,
            step,
            state,
            tag: 0,
        }
    }

    /// Group 0 holds two episodes, given out of order:
    /// episode 0 (score 1): state 10 → state 20, rewards [0, 1];
    /// episode 1 (score 0): state 10 → state 20 → state 30, rewards [0, 0, 0].
    /// Group 1 holds one episode whose single step is also at state 10.
    fn two_trajectories() -> (Vec<f32>, Vec<StepInfo>) {
        let steps = vec![
            step(0, 1, 1, 20),
            step(0, 0, 0, 10),
            step(0, 1, 0, 10),
            step(0, 0, 1, 20),
            step(0, 1, 2, 30),
            step(1, 0, 0, 10),
        ];
        (vec![0.0, 0.0, 0.0, 1.0, 0.0, 1.0], steps)
    }

    #[test]
    fn two_trajectory_example() {
        let (rewards, steps) = two_trajectories();
        let out =
            gigpo_advantages(&rewards, &steps, 0.5, EpisodeNormalization::group(), true).unwrap();
        // Step returns (γ_s = 0.5): episode 0 → [0.5, 1]; episode 1 → [0, 0, 0]; group 1 → [1].
        assert_close(&out.step_returns, &[0.0, 0.5, 0.0, 1.0, 0.0, 1.0]);
        // Episode scores {1, 0}: mean 0.5, std 0.7071068 → ±0.7071058; group 1 has one episode → 0.
        let e = 0.707_105_8;
        assert_close(&out.episode, &[-e, e, -e, e, -e, 0.0]);
        // Anchor (0, 10): returns {0.5, 0} → ±0.25 / 0.3535544 = ±0.7071048.
        // Anchor (0, 20): returns {1, 0} → ±0.7071058. Anchors (0, 30) and (1, 10): single → 0.
        assert_close(&out.step, &[-e, 0.707_104_8, -0.707_104_8, e, 0.0, 0.0]);
        // A = 1·A_ep + 0.5·A_step.
        assert_close(
            &out.combined(1.0, 0.5),
            &[
                -1.060_658_7,
                1.060_658_2,
                -1.060_658_2,
                1.060_658_7,
                -e,
                0.0,
            ],
        );
    }

    #[test]
    fn mean_only_normalisation() {
        let (rewards, steps) = two_trajectories();
        let mean = EpisodeNormalization {
            mean: EpisodeNormScope::Group,
            std: EpisodeNormScope::None,
        };
        let out = gigpo_advantages(&rewards, &steps, 0.5, mean, false).unwrap();
        assert_close(&out.episode, &[-0.5, 0.5, -0.5, 0.5, -0.5, 0.0]);
        assert_close(&out.step, &[-0.5, 0.25, -0.25, 0.5, 0.0, 0.0]);
    }

    #[test]
    fn episode_statistics_over_tags_across_groups() {
        // Tag 7: group 0's episodes (scores 1, 0) and group 1's episode (score 1); tag 8: none.
        // Episode scores over tag 7 {1, 0, 1}: mean 2/3, std sqrt(1/3) = 0.5773503
        // → (1 − 2/3)/0.5773513 = 0.5773493, (0 − 2/3)/0.5773513 = −1.1546986.
        let (rewards, mut steps) = two_trajectories();
        steps.iter_mut().for_each(|s| s.tag = 7);
        let by_tag = EpisodeNormalization {
            mean: EpisodeNormScope::Tag,
            std: EpisodeNormScope::Tag,
        };
        let out = gigpo_advantages(&rewards, &steps, 0.5, by_tag, true).unwrap();
        let (p, m) = (0.577_349_3, -1.154_698_6);
        assert_close(&out.episode, &[m, p, m, p, m, p]);
        // Over the group instead, group 1's lone episode gets 0 (see `two_trajectory_example`).
        let by_group =
            gigpo_advantages(&rewards, &steps, 0.5, EpisodeNormalization::group(), true).unwrap();
        assert_eq!(by_group.episode[5], 0.0);
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let g = EpisodeNormalization::group();
        assert!(gigpo_advantages(&[1.0], &[], 0.95, g, true).is_err());
        let empty = gigpo_advantages(&[], &[], 0.95, g, true).unwrap();
        assert_eq!(empty, GigpoAdvantages::default());
    }
}
