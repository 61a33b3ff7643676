//! Groups: the samples that answer one prompt.

use super::{GroupId, Prompt, Sample};
use crate::{Error, Result};
use std::sync::Arc;

/// The `n` samples of one prompt (or `n` episodes of one environment seed).
///
/// Group-relative estimators (GRPO, RLOO, GiGPO) compare samples within a group, so a group is
/// never empty and all its samples answer the same prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    id: GroupId,
    prompt: Arc<Prompt>,
    samples: Vec<Sample>,
}

impl Group {
    /// Builds a group.
    ///
    /// # Errors
    /// [`Error::InvalidData`] if `samples` is empty or a sample belongs to another group or prompt.
    pub fn new(id: GroupId, prompt: Arc<Prompt>, samples: Vec<Sample>) -> Result<Self> {
        if samples.is_empty() {
            return Err(Error::invalid_data("group", format!("{id} has no samples")));
        }
        if let Some(s) = samples
            .iter()
            .find(|s| s.group != id || s.prompt.id != prompt.id)
        {
            return Err(Error::invalid_data(
                "group",
                format!(
                    "{} ({}, {}) does not belong to {id} ({})",
                    s.id, s.group, s.prompt.id, prompt.id
                ),
            ));
        }
        Ok(Self {
            id,
            prompt,
            samples,
        })
    }

    /// The group's id.
    pub fn id(&self) -> GroupId {
        self.id
    }

    /// The prompt all samples answer.
    pub fn prompt(&self) -> &Arc<Prompt> {
        &self.prompt
    }

    /// The samples, in completion order.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Gives the samples back.
    pub fn into_samples(self) -> Vec<Sample> {
        self.samples
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// The oldest weight version that generated any token of the group (what its staleness is
    /// measured by); `None` when no sample records one.
    pub fn oldest_version(&self) -> Option<super::WeightVersion> {
        self.samples
            .iter()
            .filter_map(|s| s.weight_version().ok())
            .min()
    }

    /// Always `false`: a group has at least one sample.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The reward values, in sample order.
    ///
    /// # Errors
    /// [`Error::InvalidData`] naming the first sample that has no reward.
    pub fn rewards(&self) -> Result<Vec<f32>> {
        self.samples.iter().map(Sample::reward_value).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{PromptId, Reward, SampleId};

    fn sample(id: u64, group: u64, prompt: &Arc<Prompt>, reward: Option<f32>) -> Sample {
        let mut s = Sample::new(SampleId(id), GroupId(group), prompt.clone(), vec![]);
        s.reward = reward.map(Reward::new);
        s
    }

    #[test]
    fn groups_reject_empty_and_foreign_samples() {
        let p = Arc::new(Prompt::new(PromptId(1), "q", "math"));
        assert!(Group::new(GroupId(0), p.clone(), vec![]).is_err());
        let foreign = sample(1, 9, &p, None);
        let err = Group::new(GroupId(0), p.clone(), vec![foreign]).unwrap_err();
        assert!(err.to_string().contains("group#9"), "{err}");
    }

    #[test]
    fn rewards_name_the_unscored_sample() {
        let p = Arc::new(Prompt::new(PromptId(1), "q", "math"));
        let g = Group::new(
            GroupId(0),
            p.clone(),
            vec![sample(1, 0, &p, Some(1.0)), sample(2, 0, &p, None)],
        )
        .unwrap();
        assert!(g.rewards().unwrap_err().to_string().contains("sample#2"));
    }
}
