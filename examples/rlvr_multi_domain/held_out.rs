//! The held-out prompts' per-domain side: the right answers checked against the reward workers
//! before anything trains, and greedy accuracy by domain.
//!
//! The run's own evaluation scores the same prompts with the same workers, and reports one
//! figure for all domains; this splits it by domain until the run's summary does.

use crate::task::DOMAINS;
use roll::core::config::DomainMap;
use roll::core::pipeline::evaluate;
use roll::core::{GroupId, SampleId};
use roll::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Held-out accuracy by domain.
pub type Accuracy = BTreeMap<String, f64>;

/// `math 38.0%, code 63.0%, ifeval 20.0%`.
pub fn line(accuracy: &Accuracy) -> String {
    let parts: Vec<String> = (DOMAINS.iter())
        .filter_map(|d| accuracy.get(*d).map(|a| format!("{d} {:.1}%", 100.0 * a)))
        .collect();
    parts.join(", ")
}

/// The held-out prompts, resolved to their domains, and the reward router that scores them.
pub struct HeldOut {
    prompts: Vec<Prompt>,
    reward: RewardRouter,
}

impl HeldOut {
    /// `prompts` resolved to their domains by the config's tags, as the run resolves its own,
    /// and a router built from the same `[domains]`: the figures are the run's, split.
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

    /// Prints the per-domain accuracy before and after RL (`-`: not measured).
    pub fn print_table(&self, before: Option<&Accuracy>, after: &Accuracy) {
        println!("held-out accuracy by domain (greedy):");
        println!(
            "  {:<8} {:>8} {:>10} {:>9}",
            "domain", "prompts", "before RL", "after RL"
        );
        let percent = |a: Option<&f64>| a.map_or("-".into(), |a| format!("{:.1}%", 100.0 * a));
        for domain in DOMAINS {
            let count = self.prompts.iter().filter(|p| p.domain == domain).count();
            let first = percent(before.and_then(|b| b.get(domain)));
            let last = percent(after.get(domain));
            println!("  {domain:<8} {count:>8} {first:>10} {last:>9}");
        }
    }

    /// The share of each domain's held-out prompts the run's current model answers right,
    /// greedily: the run's own held-out evaluation, split by domain.
    pub async fn accuracy(&self, run: &Run) -> anyhow::Result<Accuracy> {
        let plan = run.plan();
        let mut tokenizer = HfTokenizer::from_dir(&plan.model.dir)?;
        if plan.model.plain_prompts {
            tokenizer = tokenizer.with_chat_template(ChatTemplate::Plain);
        }
        let greedy = SamplingParams {
            temperature: 0.0,
            max_new_tokens: plan.run.eval_max_new_tokens,
            ..SamplingParams::default()
        };
        let actor: Arc<dyn Generate> = run.actor().clone();
        let reward: Arc<dyn RewardWorker> = Arc::new(self.reward.clone());
        let report = evaluate(actor, &tokenizer, reward, &self.prompts, &greedy).await?;
        let mut tally: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for o in &report.outcomes {
            let (solved, all) = tally.entry(o.prompt.domain.clone()).or_default();
            *solved += usize::from(o.solved);
            *all += 1;
        }
        Ok(tally
            .into_iter()
            .map(|(d, (solved, all))| (d, solved as f64 / all as f64))
            .collect())
    }
}
