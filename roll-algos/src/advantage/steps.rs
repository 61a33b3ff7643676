//! The step-sample layout the step-level agentic estimators share ([`gigpo`](super::gigpo),
//! [`step_reinforce`](super::step_reinforce)): where each step sits, and the discounted step
//! returns within each episode.

use std::collections::BTreeMap;

use crate::Result;
use crate::shaping::stats::check_len;

/// Where one step-sample (one environment step of one episode, trained as its own sequence) sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StepInfo {
    /// The episode group: the episodes rolled out from the same initial state (same env seed;
    /// ROLL's `traj_group_id`).
    pub group: u64,
    /// The episode (trajectory) within its group (ROLL's `traj_id`).
    pub episode: u64,
    /// The step's position within its episode (0-based; only the order matters).
    pub step: u32,
    /// A hash of the observation the step acted on; equal hashes within a group are the same
    /// anchor state (ROLL's `state_group_id` is the pair `(group, state)`).
    pub state: u64,
    /// The environment tag or domain the episode ran in (ROLL's `tags`); only read by a
    /// normalisation over [`NormScope::Tag`](super::NormScope::Tag).
    pub tag: u64,
}

/// One episode of a batch of step-samples: its rows in step order and its score.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// The rows of the episode's step-samples, ordered by [`StepInfo::step`].
    pub rows: Vec<usize>,
    /// `R(τ) = Σ_t r_t`, the undiscounted sum of the episode's step rewards present in the batch.
    pub score: f32,
}

/// The discounted returns of every step-sample and the episodes they belong to.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepReturns {
    /// `[N]`: `G_t` of each step-sample.
    pub returns: Vec<f32>,
    /// The episodes, ordered by `(group, episode)`.
    pub episodes: Vec<Episode>,
}

/// Discounted step returns within each episode (ROLL's `compute_discounted_returns`): with the
/// step-samples of an episode ordered by [`StepInfo::step`],
///
/// ```text
/// G_t  = r_t + γ_s·G_{t+1}        (G past the last step = 0)
/// R(τ) = Σ_t r_t
/// ```
///
/// Episodes are keyed by `(group, episode)`; the rows of a batch may come in any order.
///
/// # Shapes
/// `step_rewards`, `steps`: `[N]`; `returns`: `[N]`. Fails with
/// [`AlgoError::LengthMismatch`](crate::AlgoError::LengthMismatch) when the lengths differ.
pub fn step_returns(step_rewards: &[f32], steps: &[StepInfo], gamma: f32) -> Result<StepReturns> {
    check_len("steps", step_rewards.len(), steps.len())?;
    let mut by_episode: BTreeMap<(u64, u64), Vec<usize>> = BTreeMap::new();
    for (i, s) in steps.iter().enumerate() {
        by_episode.entry((s.group, s.episode)).or_default().push(i);
    }
    let mut returns = vec![0.0f32; steps.len()];
    let mut episodes = Vec::with_capacity(by_episode.len());
    for mut rows in by_episode.into_values() {
        rows.sort_by_key(|&i| steps[i].step);
        let mut g = 0.0f32;
        for &i in rows.iter().rev() {
            g = step_rewards[i] + gamma * g;
            returns[i] = g;
        }
        let score = rows.iter().map(|&i| step_rewards[i]).sum();
        episodes.push(Episode { rows, score });
    }
    Ok(StepReturns { returns, episodes })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::test_util::assert_close;

    fn at(group: u64, episode: u64, step: u32) -> StepInfo {
        StepInfo {
            group,
            episode,
            step,
            ..StepInfo::default()
        }
    }

    #[test]
    fn returns_follow_step_order_not_row_order() {
        // Episode (0, 0) given as steps 2, 0, 1 with rewards 1, 0.5, 0; γ_s = 0.5:
        // G₂ = 1, G₁ = 0 + 0.5·1 = 0.5, G₀ = 0.5 + 0.5·0.5 = 0.75; score 1.5.
        // Episode (1, 0) (another group, same episode id) has one step: G = −1, score −1.
        let steps = [at(0, 0, 2), at(0, 0, 0), at(1, 0, 0), at(0, 0, 1)];
        let out = step_returns(&[1.0, 0.5, -1.0, 0.0], &steps, 0.5).unwrap();
        assert_close(&out.returns, &[1.0, 0.75, -1.0, 0.5]);
        assert_eq!(
            out.episodes,
            [
                Episode {
                    rows: vec![1, 3, 0],
                    score: 1.5
                },
                Episode {
                    rows: vec![2],
                    score: -1.0
                }
            ]
        );
    }

    #[test]
    fn length_mismatch_is_an_error() {
        assert!(step_returns(&[1.0], &[], 1.0).is_err());
        assert_eq!(step_returns(&[], &[], 1.0).unwrap(), StepReturns::default());
    }
}
