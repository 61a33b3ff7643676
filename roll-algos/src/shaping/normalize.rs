//! Sequence-reward normalisation with a mean type and a std type (ROLL's `norm_mean_type` /
//! `norm_std_type`).

use std::hash::Hash;

use serde::{Deserialize, Serialize};

use super::running::RunningMoments;
use super::stats::{Moments, check_len, group_count, moments_by_key, standardize_value};
use crate::Result;

/// Where a normalisation statistic comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// Not used: the mean is 0, or there is no division by a std.
    #[default]
    None,
    /// The statistic of the sample's own group: the `group_size` contiguous samples of one prompt
    /// in [`normalize_rewards`], the samples with an equal key in [`normalize_by_key`].
    Group,
    /// The statistic of the whole batch handed in (ROLL normalises one domain's batch at a time).
    Batch,
    /// The running statistic of every batch of the domain seen so far, this one included.
    Running,
}

/// How sequence rewards are normalised before the advantage estimator sees them.
///
/// `y = (r − μ) / (σ + 1e-6)` when `std` is not [`NormKind::None`], else `y = r − μ`, where `μ` is
/// chosen by `mean` (0 for `None`) and `σ` by `std`. A σ of at most 1e-6 (a group of one, an
/// all-equal group) gives `y = 0` (see [`standardize`](super::stats::standardize)).
///
/// Recipes in ROLL's terms: GRPO = group/group (the GRPO estimator here does this itself),
/// REINFORCE++ = batch/batch, LitePPO = group mean with batch std. Serialised as
/// `{ mean = "group", std = "batch" }`; both default to `"none"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardNormalization {
    /// Which mean is subtracted.
    pub mean: NormKind,
    /// Which standard deviation is divided by.
    pub std: NormKind,
}

impl RewardNormalization {
    /// No normalisation: `y = r`.
    pub fn none() -> Self {
        Self::default()
    }

    /// `y = r` whatever the input.
    pub fn is_identity(&self) -> bool {
        self.mean == NormKind::None && self.std == NormKind::None
    }

    /// Whether either statistic comes from [`NormKind::Running`], i.e. whether
    /// [`normalize_rewards`] updates the running moments.
    pub fn uses_running(&self) -> bool {
        self.mean == NormKind::Running || self.std == NormKind::Running
    }

    fn uses_group(&self) -> bool {
        self.mean == NormKind::Group || self.std == NormKind::Group
    }
}

/// Normalises one domain's sequence rewards in place (formula on [`RewardNormalization`]).
///
/// * Group statistics use contiguous groups of `group_size` samples (samples `[k·n, (k+1)·n)` are the
///   answers to prompt `k`); `group_size` is only checked when a group statistic is used. This is
///   [`normalize_by_key`] with the keys `⌊i / n⌋`.
/// * Batch statistics use every reward in `rewards`.
/// * Running statistics: `running` is first updated with `rewards`, then its mean and std are used
///   (as ROLL does). Pass the moments of the domain being normalised
///   ([`DomainMoments::get_mut`](super::DomainMoments::get_mut)); they are untouched unless a running
///   statistic is configured.
///
/// All standard deviations are unbiased. Fails with
/// [`AlgoError::GroupSize`](crate::AlgoError::GroupSize) when a group statistic is used and
/// `group_size` does not divide the batch.
pub fn normalize_rewards(
    rewards: &mut [f32],
    group_size: usize,
    norm: RewardNormalization,
    running: &mut RunningMoments,
) -> Result<()> {
    let n = if norm.uses_group() {
        group_count(rewards.len(), group_size)?;
        group_size
    } else {
        rewards.len().max(1)
    };
    let keys: Vec<usize> = (0..rewards.len()).map(|i| i / n).collect();
    normalize_by_key(rewards, &keys, norm, running)
}

/// Normalises rewards in place where a group is every sample with an equal key: not necessarily
/// contiguous, not necessarily of equal sizes (ROLL's agentic `agentic_reward_norm`, which groups
/// by `reward_normalization.grouping`: `traj_group_id`, `tags`, `state_group_id`, ...).
///
/// ```text
/// y_i = (r_i − μ_i) / (σ_i + 1e-6)   or   y_i = r_i − μ_i  (std = none)
/// ```
///
/// with `μ_i`, `σ_i` the moments of `{r_j : keys_j = keys_i}` for [`NormKind::Group`], of every
/// reward for [`NormKind::Batch`], and of the running moments (updated with `rewards` first) for
/// [`NormKind::Running`]; `σ_i ≤ 1e-6` (a key met once, an all-equal set) gives `y_i = 0` (see
/// [`standardize`](super::stats::standardize)). Keys are only read by group statistics.
///
/// # Shapes
/// `rewards`, `keys`: `[N]`. Fails with
/// [`AlgoError::LengthMismatch`](crate::AlgoError::LengthMismatch) when the lengths differ.
pub fn normalize_by_key<K: Eq + Hash>(
    rewards: &mut [f32],
    keys: &[K],
    norm: RewardNormalization,
    running: &mut RunningMoments,
) -> Result<()> {
    check_len("keys", rewards.len(), keys.len())?;
    if norm.is_identity() {
        return Ok(());
    }
    if norm.uses_running() {
        running.update(rewards);
    }
    let batch = Moments::of(rewards);
    let own = if norm.uses_group() {
        moments_by_key(rewards, keys)?
    } else {
        Vec::new()
    };
    for (i, r) in rewards.iter_mut().enumerate() {
        let pick = |kind: NormKind| match kind {
            NormKind::None => None,
            NormKind::Group => own.get(i).map(|m| (m.mean, m.std)),
            NormKind::Batch => Some((batch.mean, batch.std)),
            NormKind::Running => Some((running.mean(), running.std())),
        };
        let mean = pick(norm.mean).map_or(0.0, |(m, _)| m);
        let std = pick(norm.std).map(|(_, s)| s);
        *r = standardize_value(*r, mean, std);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::AlgoError;

    use crate::test_util::assert_close;

    fn norm(mean: NormKind, std: NormKind) -> RewardNormalization {
        RewardNormalization { mean, std }
    }

    #[test]
    fn identity_leaves_rewards_alone() {
        let mut r = [1.0, 2.0, 3.0];
        normalize_rewards(
            &mut r,
            0,
            RewardNormalization::none(),
            &mut RunningMoments::new(),
        )
        .unwrap();
        assert_eq!(r, [1.0, 2.0, 3.0]);
    }

    #[test]
    fn group_mean_and_std() {
        // Groups [1, 0] and [3, 3]: group 1 mean 0.5, std sqrt(0.5) = 0.7071068 → ±0.7071058;
        // group 2 has std 0 → zeros.
        let mut r = [1.0, 0.0, 3.0, 3.0];
        normalize_rewards(
            &mut r,
            2,
            norm(NormKind::Group, NormKind::Group),
            &mut RunningMoments::new(),
        )
        .unwrap();
        assert_close(&r, &[0.707_105_8, -0.707_105_8, 0.0, 0.0]);
    }

    #[test]
    fn group_mean_only() {
        let mut r = [1.0, 0.0, 3.0, 5.0];
        normalize_rewards(
            &mut r,
            2,
            norm(NormKind::Group, NormKind::None),
            &mut RunningMoments::new(),
        )
        .unwrap();
        assert_close(&r, &[0.5, -0.5, -1.0, 1.0]);
    }

    #[test]
    fn batch_mean_and_std() {
        // mean 2.5, std 1.2909944 → (x − 2.5) / 1.2909954.
        let mut r = [1.0, 2.0, 3.0, 4.0];
        normalize_rewards(
            &mut r,
            0,
            norm(NormKind::Batch, NormKind::Batch),
            &mut RunningMoments::new(),
        )
        .unwrap();
        assert_close(&r, &[-1.161_894, -0.387_298, 0.387_298, 1.161_894]);
    }

    #[test]
    fn group_mean_batch_std_lite_ppo() {
        // Groups [1, 0], [1, 1]: group means 0.5, 1; batch std of [1,0,1,1] = 0.5.
        let mut r = [1.0, 0.0, 1.0, 1.0];
        normalize_rewards(
            &mut r,
            2,
            norm(NormKind::Group, NormKind::Batch),
            &mut RunningMoments::new(),
        )
        .unwrap();
        assert_close(&r, &[0.999_998, -0.999_998, 0.0, 0.0]);
    }

    #[test]
    fn running_moments_are_updated_then_used() {
        let mut running = RunningMoments::new();
        running.update(&[0.0, 4.0]);
        // After the update the running set is {0, 4, 1, 3}: mean 2, std sqrt(10/3) = 1.8257419.
        let mut r = [1.0, 3.0];
        normalize_rewards(
            &mut r,
            0,
            norm(NormKind::Running, NormKind::Running),
            &mut running,
        )
        .unwrap();
        assert_eq!(running.count(), 4);
        assert_close(&r, &[-0.547_722_2, 0.547_722_2]);
    }

    #[test]
    fn bad_group_size_is_an_error() {
        let mut r = [1.0, 2.0, 3.0];
        assert_eq!(
            normalize_rewards(
                &mut r,
                2,
                norm(NormKind::Group, NormKind::None),
                &mut RunningMoments::new()
            ),
            Err(AlgoError::GroupSize {
                group_size: 2,
                batch: 3
            })
        );
    }

    #[test]
    fn keyed_groups_need_not_be_contiguous_nor_equal() {
        // Keys 0, 1, 0, 1, 1, 2: set 0 = {1, 3} (mean 2, std 1.4142136 → ±1/1.4142146 = ±0.7071063),
        // set 1 = {0, 2, 4} (mean 2, std 2 → (x − 2)/2.000001 = ∓0.9999995, 0), set 2 = {9}
        // (met once → 0).
        let mut r = [1.0, 0.0, 3.0, 2.0, 4.0, 9.0];
        normalize_by_key(
            &mut r,
            &[0, 1, 0, 1, 1, 2],
            norm(NormKind::Group, NormKind::Group),
            &mut RunningMoments::new(),
        )
        .unwrap();
        assert_close(
            &r,
            &[
                -0.707_106_3,
                -0.999_999_5,
                0.707_106_3,
                0.0,
                0.999_999_5,
                0.0,
            ],
        );
    }

    #[test]
    fn keyed_group_mean_with_batch_std() {
        // ROLL's sokoban example (group mean, batch std). Keys "a", "b", "a": means 2 (a) and 5
        // (b); batch {1, 5, 3}: std 2 → [(1 − 2)/2.000001, 0, (3 − 2)/2.000001].
        let mut r = [1.0, 5.0, 3.0];
        normalize_by_key(
            &mut r,
            &["a", "b", "a"],
            norm(NormKind::Group, NormKind::Batch),
            &mut RunningMoments::new(),
        )
        .unwrap();
        assert_close(&r, &[-0.499_999_75, 0.0, 0.499_999_75]);
    }

    #[test]
    fn keyed_matches_contiguous_groups() {
        // Keys ⌊i / 2⌋ are the contiguous groups of two of `group_mean_and_std`.
        let mut a = [1.0, 0.0, 3.0, 3.0];
        let mut b = a;
        let n = norm(NormKind::Group, NormKind::Group);
        normalize_rewards(&mut a, 2, n, &mut RunningMoments::new()).unwrap();
        normalize_by_key(&mut b, &[0, 0, 1, 1], n, &mut RunningMoments::new()).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn keyed_length_mismatch_is_an_error() {
        let mut r = [1.0, 2.0];
        // Even an identity normalisation checks the keys.
        assert_eq!(
            normalize_by_key(
                &mut r,
                &[0],
                RewardNormalization::none(),
                &mut RunningMoments::new()
            ),
            Err(AlgoError::LengthMismatch {
                what: "keys",
                expected: 2,
                actual: 1
            })
        );
    }

    #[test]
    fn serde_names() {
        let n: RewardNormalization =
            serde_json::from_str(r#"{"mean":"group","std":"batch"}"#).unwrap();
        assert_eq!(n, norm(NormKind::Group, NormKind::Batch));
        let n: RewardNormalization = serde_json::from_str(r#"{"std":"running"}"#).unwrap();
        assert_eq!(n, norm(NormKind::None, NormKind::Running));
        assert!(serde_json::from_str::<RewardNormalization>(r#"{"mean":"grp"}"#).is_err());
        assert!(serde_json::from_str::<RewardNormalization>(r#"{"avg":"group"}"#).is_err());
    }
}
