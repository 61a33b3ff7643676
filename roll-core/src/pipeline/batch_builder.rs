//! From rewarded groups to a train batch: masks, reward shaping, KL penalty, advantages.

use crate::{Error, Group, Result, Sample, SampleId, TrainBatch, TrainSequence};
use roll_algos::AlgorithmConfig;
use roll_algos::advantage::{AdvantageEstimator, AdvantageInput, StepInfo};
use roll_algos::kl::kl_slice;
use roll_algos::shaping::DomainMoments;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// Per-sample inputs that come from other policies: reference log-probs (for a KL term), critic
/// values (for GAE) and recomputed old log-probs. Keyed by sample id; each vector covers the
/// sample's response tokens.
#[derive(Debug, Clone, Default)]
pub struct BatchInputs {
    /// Reference policy log-probs.
    pub ref_logprobs: HashMap<SampleId, Vec<f32>>,
    /// Critic values.
    pub values: HashMap<SampleId, Vec<f32>>,
    /// Old-policy log-probs recomputed by the training engine (else the rollout's are used).
    pub old_logprobs: HashMap<SampleId, Vec<f32>>,
    /// The most tokens one generation (a response or a turn) may have, for the max-length sample
    /// mask.
    pub max_turn_tokens: usize,
    /// β of the token KL penalty.
    pub kl_coef: f32,
}

/// What building the batch measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchStats {
    /// Samples whose loss mask a sample mask cleared.
    pub samples_masked: usize,
    /// Rewards clipped by reward shaping.
    pub rewards_clipped: usize,
    /// Advantages clipped by advantage shaping.
    pub advantages_clipped: usize,
    /// Mean token KL(old ‖ ref) over trained tokens, when a penalty is on.
    pub token_kl_mean: Option<f32>,
}

/// Builds the train batch of `groups` under `algorithm`.
///
/// Groups are processed per bucket of equal domain and group size (so that group statistics see
/// whole groups and batch statistics one domain — ROLL normalises per domain too; a group that
/// lost samples to failures forms its own bucket). Within a bucket, in order:
/// 1. the sample mask (`algorithm.sample_mask`) and sample weights;
/// 2. reward shaping of the sequence rewards (running moments per domain in `moments`);
/// 3. the token KL penalty `−β·KL(old ‖ ref)` when `algorithm.token_kl_penalty` is set;
/// 4. the advantage estimator on the padded `[B, T]` layout.
///
/// For agentic REINFORCE the per-turn rewards are placed on each turn's last token and the
/// sequence reward is 0; the step-level estimators (GiGPO, step REINFORCE) take each turn as a
/// step-sample with the turn's reward (see `step_level_advantages`); every other estimator takes
/// the sample's reward as its sequence reward.
///
/// # Errors
/// If a sample has no reward, a needed input (reference log-probs, values) is missing, or an
/// algorithm rejects its inputs; keys in algorithm errors are prefixed with `algorithm.`.
pub fn build_train_batch(
    groups: &[Group],
    algorithm: &AlgorithmConfig,
    inputs: &BatchInputs,
    moments: &mut DomainMoments,
) -> Result<(TrainBatch, BatchStats)> {
    let algo = |e: roll_algos::AlgoError| Error::from_algo(e, "algorithm.");
    let mut buckets: BTreeMap<(&str, usize), Vec<&Group>> = BTreeMap::new();
    for g in groups {
        buckets
            .entry((g.prompt().domain.as_str(), g.len()))
            .or_default()
            .push(g);
    }
    let mut stats = BatchStats::default();
    let mut kl_sum = 0.0f64;
    let mut kl_tokens = 0usize;
    let mut sequences = Vec::new();
    for ((domain, group_size), bucket) in buckets {
        let samples: Vec<&Sample> = bucket.iter().flat_map(|g| g.samples()).collect();
        let rows = samples.len();
        let width = samples
            .iter()
            .map(|s| s.response().len())
            .max()
            .unwrap_or(0);
        let lengths: Vec<usize> = samples.iter().map(|s| s.response().len()).collect();
        let mut rewards = samples
            .iter()
            .map(|s| s.reward_value())
            .collect::<Result<Vec<f32>>>()?;
        let scores: Vec<f32> = samples
            .iter()
            .map(|s| s.reward.as_ref().map_or(0.0, |r| r.score_or_value()))
            .collect();
        // The length masks judge each generation against its own limit: the longest turn (the
        // whole response of a single-turn sample; a trajectory's length also counts observations).
        let turn_lengths: Vec<usize> = samples
            .iter()
            .map(|s| s.turns().iter().map(|t| t.span.len()).max().unwrap_or(0))
            .collect();
        let keep = algorithm
            .sample_mask
            .sample_mask(&scores, &turn_lengths, inputs.max_turn_tokens, group_size)
            .map_err(algo)?;
        let difficulty: Vec<f32> = samples
            .iter()
            .map(|s| {
                s.prompt
                    .metadata
                    .get("difficulty")
                    .and_then(serde_json::Value::as_f64)
                    .map_or(0.5, |d| d as f32)
            })
            .collect();
        let weights = algorithm
            .sample_weights
            .sample_weights(&difficulty, &lengths)
            .map_err(algo)?;
        stats.rewards_clipped += algorithm
            .reward_shaping
            .apply(&mut rewards, group_size, moments.get_mut(domain))
            .map_err(algo)?;

        // Padded [rows, width] layout.
        let mut mask = vec![false; rows * width];
        let mut token_rewards = vec![0.0f32; rows * width];
        let mut values = algorithm.uses_critic().then(|| vec![0.0f32; rows * width]);
        let agentic = matches!(
            algorithm.advantage,
            AdvantageEstimator::AgenticReinforce { .. }
        );
        let mut olds: Vec<Vec<f32>> = Vec::with_capacity(rows);
        let mut refs: Vec<Option<Vec<f32>>> = Vec::with_capacity(rows);
        for (row, s) in samples.iter().enumerate() {
            let base = row * width;
            let n = s.response().len();
            if keep[row] {
                mask[base..base + n].copy_from_slice(s.response().loss_mask());
            } else {
                stats.samples_masked += 1;
            }
            let old = inputs
                .old_logprobs
                .get(&s.id)
                .cloned()
                .unwrap_or_else(|| s.response().logprobs().to_vec());
            let reference = inputs.ref_logprobs.get(&s.id).cloned();
            for (what, v) in [
                ("old log-probs", Some(&old)),
                ("reference log-probs", reference.as_ref()),
            ] {
                if let Some(v) = v
                    && v.len() != n
                {
                    return Err(Error::invalid_data(
                        "batch input",
                        format!(
                            "{}: {what} cover {} tokens, the response has {n}",
                            s.id,
                            v.len()
                        ),
                    ));
                }
            }
            if let Some(estimator) = algorithm.token_kl_penalty {
                let r = reference.as_ref().ok_or_else(|| {
                    Error::invalid_data(
                        "batch input",
                        format!("{}: the token KL penalty needs reference log-probs", s.id),
                    )
                })?;
                let kl = kl_slice(estimator, &old, r).map_err(algo)?;
                for (t, k) in kl.iter().enumerate() {
                    if s.response().loss_mask()[t] {
                        token_rewards[base + t] -= inputs.kl_coef * k;
                        kl_sum += f64::from(*k);
                        kl_tokens += 1;
                    }
                }
            }
            if agentic {
                for turn in s.turns() {
                    if turn.span.end > turn.span.start {
                        token_rewards[base + turn.span.end - 1] += turn.reward;
                    }
                }
            }
            if let Some(values) = values.as_mut() {
                let v = inputs.values.get(&s.id).ok_or_else(|| {
                    Error::invalid_data("batch input", format!("{}: GAE needs critic values", s.id))
                })?;
                if v.len() != n {
                    return Err(Error::invalid_data(
                        "batch input",
                        format!(
                            "{}: values cover {} tokens, the response has {n}",
                            s.id,
                            v.len()
                        ),
                    ));
                }
                values[base..base + n].copy_from_slice(v);
            }
            olds.push(old);
            refs.push(reference);
        }
        if agentic {
            rewards.iter_mut().for_each(|r| *r = 0.0);
        }
        let out = if algorithm.advantage.is_step_level() {
            step_level_advantages(algorithm, &samples, &mask, width, domain)?
        } else {
            let mut input = AdvantageInput::new(&rewards, &mask, width)
                .with_group_size(group_size)
                .with_token_rewards(&token_rewards);
            if let Some(v) = values.as_deref() {
                input = input.with_values(v);
            }
            algorithm
                .advantage
                .compute(&input, &algorithm.advantage_shaping)
                .map_err(algo)?
        };
        stats.advantages_clipped += out.clipped;
        for (row, s) in samples.iter().enumerate() {
            let base = row * width;
            let n = s.response().len();
            sequences.push(TrainSequence {
                sample: s.id,
                prompt_ids: s.prompt_ids.clone(),
                response_ids: s.response().ids().to_vec(),
                loss_mask: mask[base..base + n].to_vec(),
                old_logprobs: std::mem::take(&mut olds[row]),
                rollout_logprobs: s.response().logprobs().to_vec(),
                ref_logprobs: refs[row].take(),
                advantages: out.advantages[base..base + n].to_vec(),
                returns: algorithm
                    .uses_critic()
                    .then(|| out.returns[base..base + n].to_vec()),
                old_values: values.as_ref().map(|v| v[base..base + n].to_vec()),
                weight: weights[row],
                score: scores[row],
            });
        }
    }
    if kl_tokens > 0 {
        stats.token_kl_mean = Some((kl_sum / kl_tokens as f64) as f32);
    }
    Ok((TrainBatch::new(sequences)?, stats))
}

/// A step-level estimator (GiGPO, step REINFORCE) on whole trajectories: every assistant turn is
/// one step-sample (its group, its episode within the group, its index, the key of the state it
/// acted on, the domain as its tag, the environment's reward for it), the estimator computes the
/// step-sample advantages over a `[turns, longest turn]` layout, and each turn's token advantages
/// are written back onto its span of the trajectory. Training the trajectory as one sequence then
/// equals training each step as its own sequence (ROLL's step env manager) — without splitting
/// the context.
fn step_level_advantages(
    algorithm: &AlgorithmConfig,
    samples: &[&Sample],
    mask: &[bool],
    width: usize,
    domain: &str,
) -> Result<roll_algos::advantage::AdvantageOutput> {
    let algo = |e: roll_algos::AlgoError| Error::from_algo(e, "algorithm.");
    let estimator = &algorithm.advantage;
    let tag = {
        let mut h = std::hash::DefaultHasher::new();
        domain.hash(&mut h);
        h.finish()
    };
    let mut steps = Vec::new();
    let mut step_rewards = Vec::new();
    let mut spans = Vec::new();
    for (row, s) in samples.iter().enumerate() {
        for (index, turn) in s.turns().iter().enumerate() {
            let state = match turn.state_key {
                Some(state) => state,
                None if !estimator.uses_states() => 0,
                None => {
                    return Err(Error::InvalidValue {
                        key: "algorithm.advantage.kind".into(),
                        value: format!("\"{}\"", estimator.name()),
                        allowed: format!(
                            "an estimator that needs no state keys: turn {index} of {} has none \
                             (GiGPO, and a step normalisation over `state`, group steps by the \
                             observation they acted on, which the agentic pipeline records)",
                            s.id
                        ),
                        origin: None,
                    });
                }
            };
            steps.push(StepInfo {
                group: s.group.0,
                episode: s.id.0,
                step: u32::try_from(index).unwrap_or(u32::MAX),
                state,
                tag,
            });
            step_rewards.push(turn.reward);
            spans.push((row, turn.span.clone()));
        }
    }
    let step_width = spans.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
    let mut step_mask = vec![false; spans.len() * step_width];
    for (i, (row, span)) in spans.iter().enumerate() {
        let from = &mask[row * width + span.start..row * width + span.end];
        step_mask[i * step_width..i * step_width + span.len()].copy_from_slice(from);
    }
    let input = AdvantageInput::new(&step_rewards, &step_mask, step_width).with_steps(&steps);
    let out = algorithm
        .advantage
        .compute(&input, &algorithm.advantage_shaping)
        .map_err(algo)?;
    let mut advantages = vec![0.0f32; samples.len() * width];
    let mut returns = vec![0.0f32; samples.len() * width];
    for (i, (row, span)) in spans.iter().enumerate() {
        let (from, to) = (i * step_width, row * width + span.start);
        advantages[to..to + span.len()].copy_from_slice(&out.advantages[from..from + span.len()]);
        returns[to..to + span.len()].copy_from_slice(&out.returns[from..from + span.len()]);
    }
    let mut sequence_advantages = vec![0.0f32; samples.len()];
    for (i, (row, _)) in spans.iter().enumerate() {
        sequence_advantages[*row] += out.sequence_advantages[i];
    }
    Ok(roll_algos::advantage::AdvantageOutput {
        advantages,
        returns,
        sequence_advantages,
        clipped: out.clipped,
    })
}
