//! The [`Policy`] trait: a model role.

use crate::{AbortSignal, FinishReason, Result, TrainBatch, WeightVersion};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How to sample one completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens (`None` = all).
    pub top_k: Option<u32>,
    /// Maximum number of new tokens.
    pub max_new_tokens: u32,
    /// Token ids that end the completion (the model's EOS is added by the engine).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end the completion (the stop string is kept in the output).
    pub stop: Vec<String>,
    /// Seed of this request's sampler: a seeded request gives the same tokens whatever else shares
    /// the batch.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: 256,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            seed: None,
        }
    }
}

/// A request for one completion.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// The context, already rendered and tokenised.
    pub prompt_ids: Vec<u32>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Raised to abort this request alone.
    pub abort: AbortSignal,
}

impl GenerationRequest {
    /// A request that nobody will abort.
    pub fn new(prompt_ids: Vec<u32>, params: SamplingParams) -> Self {
        Self {
            prompt_ids,
            params,
            abort: AbortSignal::never(),
        }
    }
}

/// One finished (or aborted) completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The new tokens.
    pub token_ids: Vec<u32>,
    /// Log-prob of each new token under the policy at temperature 1 (the distribution training
    /// optimises), whatever temperature it was sampled at.
    pub logprobs: Vec<f32>,
    /// The decoded new tokens.
    pub text: String,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// The weights that produced the tokens.
    pub weight_version: WeightVersion,
}

/// One sequence to score: per-token quantities are returned for the response tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreSequence {
    /// Context tokens.
    pub prompt_ids: Vec<u32>,
    /// Tokens to score.
    pub response_ids: Vec<u32>,
}

/// Which code path computes a score: the numbers of the two can differ in the last bits (the
/// train–inference gap), so the caller says which one it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreKernels {
    /// The kernels that generate: the log-probs a rollout was sampled with. Usually the fastest;
    /// right for reference log-probs and evaluation.
    #[default]
    Inference,
    /// The forward of the training step: the "old" log-probs of PPO's ratio must come from the
    /// same arithmetic as the log-probs being trained (ROLL's `enable_old_logprobs_recompute`).
    Training,
}

/// Sequences to score in one call (the reference and old-policy passes of RL).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScoreRequest {
    /// The sequences; they may differ in length.
    pub sequences: Vec<ScoreSequence>,
    /// Also compute the entropy of the next-token distribution at each response position.
    pub with_entropy: bool,
    /// Which kernels compute the scores.
    pub kernels: ScoreKernels,
}

/// Per-response-token results of scoring one sequence.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenScores {
    /// `log p(response[t] | prompt, response[..t])`.
    pub logprobs: Vec<f32>,
    /// Entropy of the distribution at each position, when requested.
    pub entropy: Option<Vec<f32>>,
    /// Value estimates, when the policy has a value head (the critic role).
    pub values: Option<Vec<f32>>,
}

/// The result of a train step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrainOutput {
    /// The weight version after the step (published to the inference side).
    pub weight_version: WeightVersion,
    /// Scalar metrics of the step: losses, gradient norm, clip fractions, learning rate, ...
    /// Wall times in seconds go under `time/` (roll's policies report `time/update_s`, the
    /// optimiser steps, and `time/weight_sync_s`, publishing the new weights to the inference
    /// side); the pipeline prefixes each with the role (`actor/time/update_s`).
    pub metrics: BTreeMap<String, f64>,
}

/// What a train step optimises: the policy objective and value loss from roll-algos.
pub type Objective = roll_algos::loss::ObjectiveConfig;

/// Generates completions: what a rollout needs from the actor, and what a judge is.
///
/// Each request is independent — many can be in flight at once and each can be aborted through
/// its [`AbortSignal`] — so a scheduler can treat rollouts sample by sample.
/// Implementations must not block the async runtime: long work runs on the implementation's own
/// threads and the futures only wait.
#[async_trait]
pub trait Generate: Send + Sync {
    /// Generates one completion. An aborted request returns the tokens produced so far with
    /// [`FinishReason::Abort`].
    ///
    /// # Errors
    /// If the backend fails or the prompt is invalid (e.g. token ids outside the vocabulary).
    async fn generate(&self, request: GenerationRequest) -> Result<Generation>;

    /// The version of the weights new generations will use.
    fn weight_version(&self) -> WeightVersion;
}

/// Scores given sequences: per-token log-probs, entropy and (for a critic) values. All a
/// reference model does.
#[async_trait]
pub trait Score: Send + Sync {
    /// Per-token log-probs (and optionally entropy and values) of given sequences, computed by
    /// the kernels the request names.
    ///
    /// # Errors
    /// If the backend fails or a sequence is invalid.
    async fn score(&self, request: &ScoreRequest) -> Result<Vec<TokenScores>>;
}

/// Learns: one optimisation step on a batch. The actor and the critic train; a reference or a
/// judge does not implement this trait, so asking one to train does not compile.
#[async_trait]
pub trait Train: Send + Sync {
    /// One training step on `batch` under `objective` — as many passes over the batch as the
    /// trainer is configured for (PPO epochs) — after which the new weights are published to the
    /// policy's own inference side, once.
    ///
    /// The batch is taken by value: the trainer may move it to its own thread without a copy.
    ///
    /// # Errors
    /// If the backend fails or the batch lacks an input the objective needs.
    async fn train_step(&self, batch: TrainBatch, objective: &Objective) -> Result<TrainOutput>;
}

/// The actor: a model that generates rollouts, scores them and learns from them. Implemented
/// for every type that can do the three ([`Generate`], [`Score`], [`Train`]).
///
/// The roles of a pipeline are capabilities, not run-time flags: the pipeline takes the actor as
/// `Arc<dyn Policy>`, the reference as `Arc<dyn Score>`, the critic as `Arc<dyn Critic>`, a judge
/// as `Arc<dyn Generate>`. A reference cannot be asked to train and a critic cannot be asked to
/// generate, because the types have no such method.
///
/// # Example
/// A policy that always answers "42" (the `testing` feature has a more useful mock):
/// ```
/// use async_trait::async_trait;
/// use roll_core::policy::*;
/// use roll_core::{FinishReason, TrainBatch, WeightVersion};
///
/// struct FortyTwo;
///
/// #[async_trait]
/// impl Generate for FortyTwo {
///     async fn generate(&self, _req: GenerationRequest) -> roll_core::Result<Generation> {
///         Ok(Generation {
///             token_ids: vec![52, 50],
///             logprobs: vec![0.0, 0.0],
///             text: "42".into(),
///             finish_reason: FinishReason::Stop,
///             weight_version: WeightVersion(0),
///         })
///     }
///     fn weight_version(&self) -> WeightVersion { WeightVersion(0) }
/// }
///
/// #[async_trait]
/// impl Score for FortyTwo {
///     async fn score(&self, req: &ScoreRequest) -> roll_core::Result<Vec<TokenScores>> {
///         Ok(req.sequences.iter().map(|s| TokenScores {
///             logprobs: vec![0.0; s.response_ids.len()],
///             ..Default::default()
///         }).collect())
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let judge: &dyn Generate = &FortyTwo; // generates and scores, cannot train: not a Policy
/// let out = judge.generate(GenerationRequest::new(vec![1], SamplingParams::default())).await.unwrap();
/// assert_eq!(out.text, "42");
/// # });
/// ```
pub trait Policy: Generate + Score + Train {}

impl<T: Generate + Score + Train + ?Sized> Policy for T {}

/// The critic: scores values with its value head and trains on the value loss.
pub trait Critic: Score + Train {}

impl<T: Score + Train + ?Sized> Critic for T {}
