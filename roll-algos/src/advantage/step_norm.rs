//! Normalisation of step-sample scores by a key per sample (ROLL's agentic `reward_normalization`
//! with its `grouping`, `norm_mean_type` and `norm_std_type`), used by the step-level estimators.

use serde::{Deserialize, Serialize};

use super::steps::StepInfo;
use crate::Result;
use crate::shaping::stats::{Moments, check_len, moments_by_key, standardize_value};

/// Which step-samples a normalisation statistic is taken over (ROLL's `grouping`, one per
/// statistic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormScope {
    /// Not used: the mean is 0, or there is no division by a std.
    #[default]
    None,
    /// Every step-sample handed in (ROLL's `batch`).
    Batch,
    /// The step-samples of the same episode group (ROLL's `traj_group_id`).
    #[serde(alias = "traj_group_id")]
    Group,
    /// The step-samples of the same environment tag (ROLL's `tags`).
    #[serde(alias = "tags")]
    Tag,
    /// The step-samples of the same group that acted on the same state (ROLL's
    /// `state_group_id`, GiGPO's anchor states).
    #[serde(alias = "state_group_id")]
    State,
}

/// The scopes an episode-level statistic can be taken over: an episode acts on many states, so
/// [`NormScope::State`] is not one of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpisodeNormScope {
    /// Not used.
    #[default]
    None,
    /// Every episode handed in.
    Batch,
    /// The episodes of the same group.
    #[serde(alias = "traj_group_id")]
    Group,
    /// The episodes of the same environment tag.
    #[serde(alias = "tags")]
    Tag,
}

impl From<EpisodeNormScope> for NormScope {
    fn from(scope: EpisodeNormScope) -> Self {
        match scope {
            EpisodeNormScope::None => Self::None,
            EpisodeNormScope::Batch => Self::Batch,
            EpisodeNormScope::Group => Self::Group,
            EpisodeNormScope::Tag => Self::Tag,
        }
    }
}

/// How step-sample scores are normalised: each statistic over its own scope,
///
/// ```text
/// y_i = (x_i − μ_i) / (σ_i + 1e-6)     μ_i = mean of x over the `mean` scope of i (0 for none)
/// y_i = x_i − μ_i      (std = none)    σ_i = unbiased std of x over the `std` scope of i
/// ```
///
/// and `y_i = 0` when `σ_i ≤ 1e-6` (a scope met once, all-equal scores), as ROLL's
/// `agentic_reward_norm` does. A scope is a set of samples with an equal key
/// ([`moments_by_key`]), not necessarily contiguous nor of equal sizes.
///
/// ROLL's `{grouping = G, norm_mean_type = M, norm_std_type = S}` is `{mean = M', std = S'}`
/// with `X' = G` for `X = group`, `batch` for `batch`, `none` for none; naming the scope per
/// statistic leaves no key that is not read. One difference: ROLL zeroes a sample whose `G`-group
/// has one member whatever the statistics; here that only happens when the std's scope has one
/// member (e.g. `{mean = "batch", std = "batch"}` still normalises it).
///
/// Serialised as `{ mean = "group", std = "batch" }` (ROLL's spellings `traj_group_id`, `tags`,
/// `state_group_id` are accepted); a statistic left out is `"none"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StepNormalization {
    /// The scope of the mean subtracted.
    pub mean: NormScope,
    /// The scope of the standard deviation divided by.
    pub std: NormScope,
}

impl StepNormalization {
    /// Mean and std of the episode group, GRPO's normalisation.
    pub fn group() -> Self {
        Self {
            mean: NormScope::Group,
            std: NormScope::Group,
        }
    }

    /// Whether a statistic is taken over anchor states, i.e. whether [`StepInfo::state`] is read.
    pub fn uses_states(&self) -> bool {
        self.mean == NormScope::State || self.std == NormScope::State
    }

    /// Normalises `values[i]`, the score of step-sample `steps[i]`, in place (formula on the
    /// type).
    ///
    /// # Shapes
    /// `values`, `steps`: `[N]`. Fails with
    /// [`AlgoError::LengthMismatch`](crate::AlgoError::LengthMismatch) when the lengths differ.
    pub fn apply(&self, values: &mut [f32], steps: &[StepInfo]) -> Result<()> {
        check_len("steps", values.len(), steps.len())?;
        let mean = scope_moments(self.mean, values, steps)?;
        let std = scope_moments(self.std, values, steps)?;
        for (i, x) in values.iter_mut().enumerate() {
            let mu = mean.as_ref().map_or(0.0, |m| m[i].mean);
            let sigma = std.as_ref().map(|s| s[i].std);
            *x = standardize_value(*x, mu, sigma);
        }
        Ok(())
    }
}

/// How GiGPO's episode scores are normalised: [`StepNormalization`] over episodes, each episode
/// counted once, with the scopes an episode has. Serialised as `{ mean = "group", std = "group" }`;
/// a statistic left out is `"none"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EpisodeNormalization {
    /// The scope of the mean subtracted.
    pub mean: EpisodeNormScope,
    /// The scope of the standard deviation divided by.
    pub std: EpisodeNormScope,
}

impl EpisodeNormalization {
    /// Mean and std of the episode group (the GiGPO paper's episode advantage).
    pub fn group() -> Self {
        Self {
            mean: EpisodeNormScope::Group,
            std: EpisodeNormScope::Group,
        }
    }
}

impl From<EpisodeNormalization> for StepNormalization {
    fn from(n: EpisodeNormalization) -> Self {
        Self {
            mean: n.mean.into(),
            std: n.std.into(),
        }
    }
}

/// The moments of each sample's scope, `None` for [`NormScope::None`].
fn scope_moments(
    scope: NormScope,
    values: &[f32],
    steps: &[StepInfo],
) -> Result<Option<Vec<Moments>>> {
    let key = |s: &StepInfo| match scope {
        NormScope::None | NormScope::Batch => (0, 0),
        NormScope::Group => (s.group, 0),
        NormScope::Tag => (s.tag, 0),
        NormScope::State => (s.group, s.state),
    };
    if scope == NormScope::None {
        return Ok(None);
    }
    let keys: Vec<(u64, u64)> = steps.iter().map(key).collect();
    moments_by_key(values, &keys).map(Some)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::test_util::assert_close;

    fn step(group: u64, state: u64, tag: u64) -> StepInfo {
        StepInfo {
            group,
            state,
            tag,
            ..StepInfo::default()
        }
    }

    /// Rows: (group, state, tag) and score.
    /// 0: (0, 1, 0) 1 | 1: (1, 1, 1) 0 | 2: (0, 2, 0) 3 | 3: (1, 1, 1) 2 | 4: (0, 1, 1) 5
    fn batch() -> (Vec<f32>, Vec<StepInfo>) {
        (
            vec![1.0, 0.0, 3.0, 2.0, 5.0],
            vec![
                step(0, 1, 0),
                step(1, 1, 1),
                step(0, 2, 0),
                step(1, 1, 1),
                step(0, 1, 1),
            ],
        )
    }

    fn normalised(mean: NormScope, std: NormScope) -> Vec<f32> {
        let (mut x, steps) = batch();
        StepNormalization { mean, std }
            .apply(&mut x, &steps)
            .unwrap();
        x
    }

    #[test]
    fn group_scope() {
        // Group 0 = rows 0, 2, 4 = {1, 3, 5}: mean 3, std 2 → (x − 3)/2.000001 = −1, 0, 1
        // (×0.9999995). Group 1 = rows 1, 3 = {0, 2}: mean 1, std 1.4142136 → ∓0.7071063.
        let (a, b) = (0.999_999_5, 0.707_106_3);
        assert_close(
            &normalised(NormScope::Group, NormScope::Group),
            &[-a, -b, 0.0, b, a],
        );
        // Mean only.
        assert_close(
            &normalised(NormScope::Group, NormScope::None),
            &[-2.0, -1.0, 0.0, 1.0, 2.0],
        );
    }

    #[test]
    fn state_scope_is_per_group() {
        // (0, 1) = rows 0, 4 = {1, 5}: mean 3, std 2.8284271 → ∓2/2.8284281 = ∓0.7071065.
        // (1, 1) = rows 1, 3 = {0, 2} → ∓0.7071063. (0, 2) = row 2 alone → 0.
        let x = normalised(NormScope::State, NormScope::State);
        assert_close(
            &x,
            &[-0.707_106_5, -0.707_106_3, 0.0, 0.707_106_3, 0.707_106_5],
        );
    }

    #[test]
    fn tag_mean_with_batch_std() {
        // Tag 0 = rows 0, 2 = {1, 3}, mean 2; tag 1 = rows 1, 3, 4 = {0, 2, 5}, mean 7/3.
        // Batch {1, 0, 3, 2, 5}: mean 2.2, Σ(x − 2.2)² = 1.44 + 4.84 + 0.64 + 0.04 + 7.84 = 14.8,
        // std sqrt(14.8/4) = 1.9235384 → y = (x − μ_tag)/1.9235394.
        let s = 1.923_539_4f32;
        let t1 = 7.0 / 3.0;
        let want = [
            -1.0 / s,
            (0.0 - t1) / s,
            1.0 / s,
            (2.0 - t1) / s,
            (5.0 - t1) / s,
        ];
        assert_close(&normalised(NormScope::Tag, NormScope::Batch), &want);
    }

    #[test]
    fn none_is_identity_and_batch_is_everything() {
        let (x, _) = batch();
        assert_eq!(normalised(NormScope::None, NormScope::None), x);
        // Batch mean 2.2, batch std 1.9235384.
        let s = 1.923_539_4f32;
        let want: Vec<f32> = x.iter().map(|v| (v - 2.2) / s).collect();
        assert_close(&normalised(NormScope::Batch, NormScope::Batch), &want);
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let mut x = [1.0, 2.0];
        assert!(
            StepNormalization::group()
                .apply(&mut x, &[StepInfo::default()])
                .is_err()
        );
    }

    #[test]
    fn serde_scopes_and_roll_spellings() {
        let n: StepNormalization =
            serde_json::from_str(r#"{"mean":"traj_group_id","std":"batch"}"#).unwrap();
        assert_eq!(
            n,
            StepNormalization {
                mean: NormScope::Group,
                std: NormScope::Batch
            }
        );
        let n: StepNormalization = serde_json::from_str(r#"{"mean":"state_group_id"}"#).unwrap();
        assert!(n.uses_states() && n.std == NormScope::None);
        let n: StepNormalization = serde_json::from_str(r#"{"std":"tags"}"#).unwrap();
        assert_eq!(n.std, NormScope::Tag);
        assert!(serde_json::from_str::<StepNormalization>(r#"{"grouping":"batch"}"#).is_err());
        // An episode has no single state: the scope cannot be written.
        assert!(serde_json::from_str::<EpisodeNormalization>(r#"{"mean":"state"}"#).is_err());
        let e: EpisodeNormalization = serde_json::from_str(r#"{"mean":"tags"}"#).unwrap();
        assert_eq!(
            StepNormalization::from(e),
            StepNormalization {
                mean: NormScope::Tag,
                std: NormScope::None
            }
        );
    }
}
