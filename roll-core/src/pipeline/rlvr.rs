//! The RLVR pipeline: rollout, rewards, advantages, train, publish — one step at a time.

use super::{BatchInputs, StepReport, build_train_batch};
use crate::policy::{
    Critic, Generate, Objective, Score, ScoreKernels, ScoreRequest, ScoreSequence,
};
use crate::scheduler::SchedulerState;
use crate::{Error, Group, Policy, Result, Sample, SampleId, Scheduler, WeightVersion};
use roll_algos::AlgorithmConfig;
use roll_algos::kl::KlControllerState;
use roll_algos::shaping::DomainMoments;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// Settings of [`RlvrPipeline`] beyond the algorithm. (How many passes a train step makes over
/// its batch is the trainer's setting, `train.ppo_epochs`: the actor syncs its weights once per
/// step, after the last pass.)
#[derive(Debug, Clone, PartialEq)]
pub struct RlvrPipelineConfig {
    /// The most tokens one generation (a single-turn response, or one turn of a trajectory) may
    /// have: the max-length sample mask drops samples with a turn cut at this limit.
    pub max_turn_tokens: usize,
    /// Recompute old log-probs with the actor's training kernels ([`ScoreKernels::Training`])
    /// instead of using the rollout's (ROLL's `enable_old_logprobs_recompute`).
    pub recompute_old_logprobs: bool,
    /// Steps during which only the critic trains; the actor trains once `step >= critic_warmup`
    /// (ROLL's `critic_warmup`).
    pub critic_warmup: u64,
}

impl Default for RlvrPipelineConfig {
    fn default() -> Self {
        Self {
            max_turn_tokens: 256,
            recompute_old_logprobs: false,
            critic_warmup: 0,
        }
    }
}

impl RlvrPipelineConfig {
    /// The pipeline settings of a run config: the generation limit (`rollout.max_new_tokens`,
    /// or `agentic.max_tokens_per_turn` — a trajectory's length also counts its observations, so
    /// truncation is judged per turn), `train.recompute_old_logprobs` and
    /// `train.critic_warmup`.
    pub fn from_config(config: &crate::config::Config) -> Self {
        let max_turn_tokens = match (&config.pipeline, &config.agentic) {
            (crate::config::Pipeline::Agentic, Some(a)) => a.max_tokens_per_turn as usize,
            _ => config.rollout.max_new_tokens as usize,
        };
        Self {
            max_turn_tokens,
            recompute_old_logprobs: config.train.recompute_old_logprobs,
            critic_warmup: config.train.critic_warmup,
        }
    }
}

/// Everything of an [`RlvrPipeline`] a resumed run needs besides the policies' own checkpoints:
/// the step counter, the adaptive KL controller, the running reward moments and the
/// scheduler's position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineState {
    /// Steps taken.
    pub step: u64,
    /// The KL controller's coefficient and history.
    pub kl: KlControllerState,
    /// Running reward moments per domain (reward normalisation).
    pub moments: DomainMoments,
    /// Where the scheduler is in its prompts.
    pub scheduler: SchedulerState,
}

/// One RL step after another: the scheduler delivers rewarded groups; reference log-probs and
/// critic values are scored if the algorithm needs them; [`build_train_batch`] computes
/// advantages; the actor trains and publishes its weights; metrics are reported.
///
/// The pipeline holds only trait objects: the same code trains a Burn model or the mock policy,
/// on prompts (RLVR) or environments (agentic), with any reward.
pub struct RlvrPipeline {
    scheduler: Box<dyn Scheduler>,
    actor: Arc<dyn Policy>,
    reference: Option<Arc<dyn Score>>,
    critic: Option<Arc<dyn Critic>>,
    algorithm: AlgorithmConfig,
    config: RlvrPipelineConfig,
    moments: DomainMoments,
    kl: KlControllerState,
    step: u64,
}

impl RlvrPipeline {
    /// A pipeline training `actor` on what the scheduler delivers. The actor is handed over once:
    /// `scheduler` receives its generating side and builds the scheduler around it (an
    /// [`RlvrScheduler`](crate::scheduler::RlvrScheduler), an environment manager, ...).
    ///
    /// # Errors
    /// If the algorithm is invalid (keys prefixed `algorithm.`) or the scheduler cannot be built.
    pub fn new(
        actor: Arc<dyn Policy>,
        scheduler: impl FnOnce(Arc<dyn Generate>) -> Result<Box<dyn Scheduler>>,
        algorithm: AlgorithmConfig,
        config: RlvrPipelineConfig,
    ) -> Result<Self> {
        let algo = |e| Error::from_algo(e, "algorithm.");
        algorithm.validate().map_err(algo)?;
        let scheduler = scheduler(actor.clone())?;
        let kl = algorithm.kl_controller.init().map_err(algo)?;
        Ok(Self {
            scheduler,
            actor,
            reference: None,
            critic: None,
            algorithm,
            config,
            moments: DomainMoments::new(),
            kl,
            step: 0,
        })
    }

    /// Sets the reference policy (needed by a KL loss or a token KL penalty).
    #[must_use]
    pub fn with_reference(mut self, reference: Arc<dyn Score>) -> Self {
        self.reference = Some(reference);
        self
    }

    /// Sets the critic (needed by GAE); it is trained after the actor on the same batch.
    #[must_use]
    pub fn with_critic(mut self, critic: Arc<dyn Critic>) -> Self {
        self.critic = Some(critic);
        self
    }

    /// The actor's objective.
    pub fn objective(&self) -> &Objective {
        &self.algorithm.objective
    }

    /// The number of steps taken.
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// The pipeline's state between two steps, for a checkpoint (the actor saves its own).
    ///
    /// # Errors
    /// If the scheduler cannot be checkpointed.
    pub fn state(&self) -> Result<PipelineState> {
        Ok(PipelineState {
            step: self.step,
            kl: self.kl,
            moments: self.moments.clone(),
            scheduler: self.scheduler.save_state()?,
        })
    }

    /// Continues from `state` (of a pipeline built the same way), before the first step.
    ///
    /// # Errors
    /// If the scheduler cannot restore its part.
    pub fn restore(&mut self, state: PipelineState) -> Result<()> {
        self.scheduler.restore_state(state.scheduler)?;
        self.step = state.step;
        self.kl = state.kl;
        self.moments = state.moments;
        Ok(())
    }

    /// Runs one step.
    ///
    /// # Errors
    /// If the scheduler fails, a needed role is missing, or a policy fails to score or train.
    pub async fn step(&mut self) -> Result<StepReport> {
        let started = Instant::now();
        let batch = self
            .scheduler
            .next_batch(self.actor.weight_version())
            .await?;
        let rollout_time = started.elapsed();
        let train_started = Instant::now();
        let samples: Vec<&Sample> = batch.groups.iter().flat_map(Group::samples).collect();

        let scoring_started = Instant::now();
        let mut inputs = BatchInputs {
            max_turn_tokens: self.config.max_turn_tokens,
            kl_coef: self.kl.value(),
            ..Default::default()
        };
        if self.algorithm.uses_reference() {
            let reference = self
                .reference
                .as_ref()
                .ok_or_else(|| missing_role("reference", "a KL loss or token KL penalty"))?;
            inputs.ref_logprobs = score_all(&**reference, &samples, ScoreKernels::Inference, |s| {
                s.logprobs
            })
            .await?;
        }
        if self.algorithm.uses_critic() {
            let critic = self
                .critic
                .as_ref()
                .ok_or_else(|| missing_role("critic", "GAE"))?;
            inputs.values = score_all(&**critic, &samples, ScoreKernels::Training, |s| {
                s.values.unwrap_or_default()
            })
            .await?;
        }
        if self.config.recompute_old_logprobs {
            inputs.old_logprobs = score_all(&*self.actor, &samples, ScoreKernels::Training, |s| {
                s.logprobs
            })
            .await?;
        }
        let scoring_time = scoring_started.elapsed();
        let (mut train_batch, batch_stats) =
            build_train_batch(&batch.groups, &self.algorithm, &inputs, &mut self.moments)?;
        if let Some(kl) = batch_stats.token_kl_mean {
            self.kl
                .update(kl, samples.len())
                .map_err(|e| Error::from_algo(e, "algorithm."))?;
        }

        let mut metrics = BTreeMap::new();
        let mut version = self.actor.weight_version();
        let trained_tokens = train_batch.num_trained_tokens();
        if !train_batch.is_empty() && trained_tokens > 0 {
            let actor_trains = self.step >= self.config.critic_warmup;
            // The critic trains first so that the batch can then move into the actor's step.
            if let Some(critic) = &self.critic {
                let batch = if actor_trains {
                    train_batch.clone()
                } else {
                    std::mem::take(&mut train_batch)
                };
                let out = critic.train_step(batch, &self.algorithm.objective).await?;
                for (k, v) in out.metrics {
                    metrics.insert(format!("critic/{k}"), v);
                }
            }
            if actor_trains {
                let batch = std::mem::take(&mut train_batch);
                let out = self
                    .actor
                    .train_step(batch, &self.algorithm.objective)
                    .await?;
                version = out.weight_version;
                for (k, v) in out.metrics {
                    metrics.insert(format!("actor/{k}"), v);
                }
            }
        }

        let n = samples.len().max(1) as f32;
        let reward_mean = samples
            .iter()
            .filter_map(|s| s.reward.as_ref().map(|r| r.value))
            .sum::<f32>()
            / n;
        let score_mean = samples
            .iter()
            .filter_map(|s| s.reward.as_ref().map(|r| r.score_or_value()))
            .sum::<f32>()
            / n;
        let response_len_mean = samples
            .iter()
            .map(|s| s.response().len() as f32)
            .sum::<f32>()
            / n;
        let stats = batch.stats;
        let mut add = |k: &str, v: f64| {
            metrics.insert(k.to_string(), v);
        };
        add("reward/mean", f64::from(reward_mean));
        add("score/mean", f64::from(score_mean));
        add("response/length_mean", f64::from(response_len_mean));
        add("rollout/groups_filtered", stats.groups_filtered as f64);
        add("rollout/groups_stale", stats.groups_stale as f64);
        add("rollout/samples_failed", stats.samples_failed as f64);
        add("rollout/samples_aborted", stats.samples_aborted as f64);
        add("rollout/prompts_requeued", stats.prompts_requeued as f64);
        add("rollout/calls_overdue", stats.calls_overdue as f64);
        // Generation spent per sample trained on: kept samples plus those discarded after
        // generating (aborted at batch close, or finished in an incomplete group). Groups the
        // dynamic filter drops are the algorithm's choice, counted apart.
        add(
            "rollout/generated_per_kept",
            (f64::from(n) + stats.samples_wasted as f64) / f64::from(n),
        );
        add(
            "rollout/filtered_per_kept",
            stats.samples_filtered as f64 / f64::from(n),
        );
        add("rollout/reward_s", stats.reward_time.as_secs_f64());
        // Reference, critic and old log-probs before training (0 when none is needed); the
        // roles' own step times are `actor/time/…` and `critic/time/…`.
        add("time/score_s", scoring_time.as_secs_f64());
        add("rollout/max_staleness", stats.max_staleness as f64);
        for (lag, count) in stats.staleness_counts.iter().enumerate() {
            add(&format!("rollout/staleness_{lag}"), *count as f64);
        }
        add(
            "rollout/mean_staleness",
            stats.total_staleness as f64 / f64::from(n),
        );
        add("batch/samples_masked", batch_stats.samples_masked as f64);
        add("batch/rewards_clipped", batch_stats.rewards_clipped as f64);
        add(
            "batch/advantages_clipped",
            batch_stats.advantages_clipped as f64,
        );
        add("batch/kl_coef", f64::from(self.kl.value()));
        if let Some(kl) = batch_stats.token_kl_mean {
            add("batch/token_kl_mean", f64::from(kl));
        }
        // Episodes (trajectories that record their turns): turns per episode, the share
        // whose environment reported a success (an episode that never said counts as not
        // solved, as in the held-out evaluation).
        let episodes: Vec<&&Sample> = samples
            .iter()
            .filter(|s| s.info.contains_key("turns"))
            .collect();
        if !episodes.is_empty() {
            let n = episodes.len() as f64;
            let turns: f64 = episodes
                .iter()
                .filter_map(|s| s.info.get("turns").and_then(serde_json::Value::as_f64))
                .sum();
            let solved = episodes
                .iter()
                .filter(|s| {
                    s.info.get("success").and_then(serde_json::Value::as_bool) == Some(true)
                })
                .count();
            add("episode/turns_mean", turns / n);
            add("episode/success_rate", solved as f64 / n);
            // The environments' reset and step calls, summed over the batch's episodes (they
            // run concurrently, like the reward calls of `rollout/reward_s`).
            let env_time: f64 = episodes
                .iter()
                .filter_map(|s| s.info.get("env_s").and_then(serde_json::Value::as_f64))
                .sum();
            add("rollout/env_s", env_time);
        }
        for (domain, d) in domain_metrics(&batch.groups) {
            add(&format!("domain/{domain}/prompts"), d.groups as f64);
            add(
                &format!("domain/{domain}/reward_mean"),
                d.reward / d.samples as f64,
            );
            add(
                &format!("domain/{domain}/score_mean"),
                d.score / d.samples as f64,
            );
        }

        let report = StepReport {
            step: self.step,
            weight_version: version,
            groups: batch.groups.len(),
            samples: samples.len(),
            trained_tokens,
            reward_mean,
            score_mean,
            response_len_mean,
            rollout: stats,
            metrics,
            rollout_time,
            train_time: train_started.elapsed(),
        };
        self.step += 1;
        Ok(report)
    }

    /// The actor's current weight version.
    pub fn weight_version(&self) -> WeightVersion {
        self.actor.weight_version()
    }
}

/// One domain's share of a batch.
#[derive(Default)]
struct DomainTotals {
    groups: usize,
    samples: usize,
    reward: f64,
    score: f64,
}

/// The groups, samples, reward and task-score sums of each domain in `groups` (the prompt's
/// domain: the RLVR domain, or the environment of an agentic run). A sample without a reward
/// counts as 0, as in the batch-wide means; a group is never empty, so no domain has 0 samples.
fn domain_metrics(groups: &[Group]) -> BTreeMap<&str, DomainTotals> {
    let mut by_domain: BTreeMap<&str, DomainTotals> = BTreeMap::new();
    for g in groups {
        let d = by_domain.entry(g.prompt().domain.as_str()).or_default();
        d.groups += 1;
        for s in g.samples() {
            d.samples += 1;
            if let Some(r) = &s.reward {
                d.reward += f64::from(r.value);
                d.score += f64::from(r.score_or_value());
            }
        }
    }
    by_domain
}

fn missing_role(role: &str, needed_by: &str) -> Error {
    Error::invalid_data(
        "pipeline",
        format!("{needed_by} needs a {role} policy; add one with with_{role}()"),
    )
}

async fn score_all(
    policy: &dyn Score,
    samples: &[&Sample],
    kernels: ScoreKernels,
    take: impl Fn(crate::TokenScores) -> Vec<f32>,
) -> Result<HashMap<SampleId, Vec<f32>>> {
    let request = ScoreRequest {
        sequences: samples
            .iter()
            .map(|s| ScoreSequence {
                prompt_ids: s.prompt_ids.clone(),
                response_ids: s.response().ids().to_vec(),
            })
            .collect(),
        with_entropy: false,
        kernels,
    };
    let scores = policy.score(&request).await?;
    if scores.len() != samples.len() {
        return Err(Error::policy(format!(
            "scored {} sequences, asked for {}",
            scores.len(),
            samples.len()
        )));
    }
    Ok(samples
        .iter()
        .zip(scores)
        .map(|(s, sc)| (s.id, take(sc)))
        .collect())
}
