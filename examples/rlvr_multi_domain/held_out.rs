//! The held-out prompts' right answers, checked against the reward workers before anything
//! trains (the run's own evaluation then reports accuracy per domain).

use roll::core::config::DomainMap;
use roll::core::{GroupId, SampleId};
use roll::prelude::*;
use std::sync::Arc;

/// The held-out prompts, resolved to their domains, and the reward router that scores them.
pub struct HeldOut {
    prompts: Vec<Prompt>,
    reward: RewardRouter,
}

impl HeldOut {
    /// `prompts` resolved to their domains by the config's tags, as the run resolves its own,
    /// and a router built from the same `[domains]`: the workers the run will score with.
    pub fn new(config: &Config, mut prompts: Vec<Prompt>) -> anyhow::Result<Self> {
        let map = DomainMap::from_config(&config.domains)?;
        for p in &mut prompts {
            map.resolve_prompt(p)?;
        }
        let registry = RewardRegistry::with_builtins();
        let reward = RewardRouter::from_config(&config.domains, &registry)?;
        Ok(Self { prompts, reward })
    }

    /// Scores the right `answers` (one per held-out prompt) and fails unless every one scores 1:
    /// a task its own verifier disagrees with would train toward nothing, and a worker that
    /// cannot run (the sandbox without root) would fail its domain's every sample mid-run.
    pub async fn check(&self, answers: &[String]) -> anyhow::Result<()> {
        let samples: Vec<Sample> = (self.prompts.iter().zip(answers).enumerate())
            .map(|(i, (p, answer))| {
                let i = i as u64;
                let mut s = Sample::new(SampleId(i), GroupId(i), Arc::new(p.clone()), Vec::new());
                s.text = answer.clone();
                s
            })
            .collect();
        for (s, scored) in samples.iter().zip(self.reward.score_batch(&samples).await) {
            let (domain, id) = (&s.prompt.domain, s.prompt.id);
            let reward = scored.map_err(|e| {
                anyhow::anyhow!("the {domain} worker cannot score held-out {id}: {e}")
            })?;
            anyhow::ensure!(
                reward.score.unwrap_or(reward.value) >= 1.0,
                "the {domain} worker scores the right answer {:?} to held-out {id} \
                 ({:?}) {}: the task and the worker disagree",
                s.text,
                s.prompt.text,
                reward.value
            );
        }
        Ok(())
    }
}
