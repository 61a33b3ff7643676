//! Held-out evaluation: greedy answers to fixed prompts, scored by the run's reward workers.

use crate::policy::{Generate, GenerationRequest, SamplingParams};
use crate::rng::mix64;
use crate::tokenizer::{Tokenizer, encode_prompt};
use crate::{GroupId, Prompt, Result, RewardWorker, Sample, SampleId};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// One held-out prompt's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalOutcome {
    /// The prompt.
    pub prompt: Arc<Prompt>,
    /// The greedy answer.
    pub text: String,
    /// Its reward value (0 when the worker failed).
    pub reward: f32,
    /// Whether it solved the prompt: task score (the reward's `score`, else its value) ≥ 1 —
    /// the verifier's "exactly right".
    pub solved: bool,
    /// The generation or reward error, if one cost this prompt.
    pub error: Option<String>,
}

/// The result of [`evaluate`].
#[derive(Debug, Clone, PartialEq)]
pub struct EvalReport {
    /// Every prompt's outcome, in the order given.
    pub outcomes: Vec<EvalOutcome>,
    /// Wall-clock time.
    pub time: Duration,
}

impl EvalReport {
    /// Fraction of prompts solved (0 for no prompts).
    pub fn accuracy(&self) -> f64 {
        let solved = self.outcomes.iter().filter(|o| o.solved).count();
        solved as f64 / self.outcomes.len().max(1) as f64
    }

    /// Mean reward value.
    pub fn reward_mean(&self) -> f64 {
        let sum: f64 = self.outcomes.iter().map(|o| f64::from(o.reward)).sum();
        sum / self.outcomes.len().max(1) as f64
    }

    /// Fraction solved per domain (the prompts' domains, resolved when the run was built), for
    /// a run that mixes domains; one entry per domain present.
    pub fn accuracy_by_domain(&self) -> BTreeMap<String, f64> {
        let mut counts: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for o in &self.outcomes {
            let (solved, total) = counts.entry(o.prompt.domain.as_str()).or_default();
            *solved += usize::from(o.solved);
            *total += 1;
        }
        counts
            .into_iter()
            .map(|(d, (solved, total))| (d.to_owned(), solved as f64 / total as f64))
            .collect()
    }

    /// Prompts whose generation or reward failed (they count as unsolved).
    pub fn failed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.error.is_some()).count()
    }
}

/// Answers each of `prompts` with `policy` under `params` — greedy (`temperature: 0`) for
/// accuracy, or sampled, in which case prompt `i` is sampled with seed `mix64(seed + i)` so a
/// prompt listed twice gets two samples and the result is reproducible — all requests in flight
/// at once so the engine batches them, and scores the answers with `reward` (a router
/// dispatches by the prompts' domains). A prompt whose generation or reward fails counts as
/// unsolved with its error recorded; it does not stop the evaluation.
///
/// # Errors
/// Only if a prompt cannot be encoded (bad data, not a model failure).
pub async fn evaluate(
    policy: Arc<dyn Generate>,
    tokenizer: &dyn Tokenizer,
    reward: Arc<dyn RewardWorker>,
    prompts: &[Prompt],
    params: &SamplingParams,
) -> Result<EvalReport> {
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let ids = encode_prompt(tokenizer, prompt.system.as_deref(), &prompt.text)?;
        let (policy, reward) = (policy.clone(), reward.clone());
        let prompt = Arc::new(prompt.clone());
        let mut params = params.clone();
        params.seed = params.seed.map(|s| mix64(s.wrapping_add(i as u64)));
        let request = GenerationRequest::new(ids.clone(), params);
        tasks.spawn(async move {
            let mut sample =
                Sample::new(SampleId(i as u64), GroupId(i as u64), prompt.clone(), ids);
            let scored = async {
                let g = policy.generate(request).await?;
                sample.push_turn(
                    &g.token_ids,
                    &g.logprobs,
                    &g.text,
                    g.weight_version,
                    g.finish_reason,
                )?;
                reward.score(&sample).await
            }
            .await;
            let outcome = match scored {
                Ok(r) => EvalOutcome {
                    prompt,
                    text: sample.text.clone(),
                    reward: r.value,
                    solved: r.score.unwrap_or(r.value) >= 1.0,
                    error: None,
                },
                Err(e) => EvalOutcome {
                    prompt,
                    text: sample.text.clone(),
                    reward: 0.0,
                    solved: false,
                    error: Some(e.to_string()),
                },
            };
            (i, outcome)
        });
    }
    let mut outcomes: Vec<Option<EvalOutcome>> = vec![None; prompts.len()];
    while let Some(joined) = tasks.join_next().await {
        // A task that panicked leaves its slot empty: counted below as a failed prompt.
        if let Ok((i, outcome)) = joined {
            outcomes[i] = Some(outcome);
        }
    }
    let outcomes = outcomes
        .into_iter()
        .zip(prompts)
        .map(|(o, p)| {
            o.unwrap_or_else(|| EvalOutcome {
                prompt: Arc::new(p.clone()),
                text: String::new(),
                reward: 0.0,
                solved: false,
                error: Some("the evaluation task panicked".into()),
            })
        })
        .collect();
    Ok(EvalReport {
        outcomes,
        time: start.elapsed(),
    })
}

#[cfg(all(test, feature = "testing"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testing::{ByteTokenizer, MockPolicy};
    use crate::{Reward, RewardWorker};
    use async_trait::async_trait;

    /// Solved when the answer starts with the ground truth; panics on prompt "boom".
    struct Prefix;

    #[async_trait]
    impl RewardWorker for Prefix {
        async fn score(&self, s: &Sample) -> Result<Reward> {
            if s.prompt.text == "boom" {
                return Err(crate::Error::invalid_data("reward", "boom"));
            }
            let truth = s.prompt.ground_truth.as_deref().unwrap_or("");
            Ok(Reward::new(if s.text.starts_with(truth) {
                1.0
            } else {
                0.0
            }))
        }
    }

    #[tokio::test]
    async fn greedy_answers_are_scored_and_failures_cost_one_prompt() {
        // A policy that can only say 'a'.
        let policy = Arc::new(MockPolicy::new(vec![u32::from(b'a')], None).unwrap());
        let prompts: Vec<Prompt> = [("x", "a", "d"), ("y", "b", "e"), ("boom", "a", "d")]
            .iter()
            .enumerate()
            .map(|(i, (t, g, tag))| {
                Prompt::new(crate::PromptId(i as u64), *t, *tag).with_ground_truth(*g)
            })
            .collect();
        let greedy = SamplingParams {
            temperature: 0.0,
            max_new_tokens: 3,
            ..SamplingParams::default()
        };
        let report = evaluate(policy, &ByteTokenizer, Arc::new(Prefix), &prompts, &greedy)
            .await
            .unwrap();
        let solved: Vec<bool> = report.outcomes.iter().map(|o| o.solved).collect();
        assert_eq!(solved, [true, false, false]);
        assert_eq!(report.failed(), 1);
        assert!(
            report.outcomes[2]
                .error
                .as_deref()
                .unwrap()
                .contains("boom")
        );
        assert!((report.accuracy() - 1.0 / 3.0).abs() < 1e-9);
        // Per domain: `d` has the solved prompt and the failed one, `e` the wrong answer.
        let by_domain: Vec<(String, f64)> = report.accuracy_by_domain().into_iter().collect();
        assert_eq!(by_domain, [("d".into(), 0.5), ("e".into(), 0.0)]);
    }
}
