//! [`LlmJudge`]: a policy grades each response.

use super::parse::parse_judge_score;
use super::template::JudgeTemplate;
use crate::error::RewardError;
use crate::join::join_all;
use crate::text::{after_think, shorten, strip_special_tokens};
use async_trait::async_trait;
use roll_core::tokenizer::{ChatMessage, Role, Tokenizer};
use roll_core::{Generate, GenerationRequest, Reward, RewardWorker, Sample, SamplingParams};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The built-in 0–10 rubric (ROLL's fallback when no `judge_prompt` is given).
pub const DEFAULT_TEMPLATE: &str =
    "You are grading a response to a question against a reference answer.

Question:
{question}

Reference answer:
{reference}

Response:
{response}

Judge whether the response reaches the same final answer as the reference and how sound its \
reasoning is. Rate it on a scale from 0 (wrong) to 10 (fully correct). End with a line \
\"Score: N/10\".";

/// Options of [`LlmJudge`] (registry kind `llm_judge`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmJudgeConfig {
    /// The judge prompt, with `{question}`, `{reference}` and `{response}` slots (see
    /// [`JudgeTemplate`]). Default [`DEFAULT_TEMPLATE`].
    pub template: String,
    /// An optional system message for the judge.
    pub system: Option<String>,
    /// Judge calls in flight at once, across all samples. Default `8`.
    pub max_concurrency: usize,
    /// Token budget of one judgement. Default `512`.
    pub max_new_tokens: u32,
    /// Sampling temperature of the judge (0 = greedy). Default `0.0`.
    pub temperature: f32,
    /// Base seed of the judge's sampler (mixed with the sample id). Default none.
    pub seed: Option<u64>,
    /// Top of the scale the template asks for: labelled and bare scores are divided by it.
    /// Default `10`.
    pub max_score: f32,
    /// The reward of a judgement with no recognisable score; unset makes it an error (the sample
    /// is dropped rather than trained on a guess). Default unset.
    pub unparsable_score: Option<f32>,
    /// Show the judge the whole response, `<think>` block included, instead of only the part
    /// after `</think>`. Default `false`.
    pub include_thinking: bool,
}

impl Default for LlmJudgeConfig {
    fn default() -> Self {
        Self {
            template: DEFAULT_TEMPLATE.to_owned(),
            system: None,
            max_concurrency: 8,
            max_new_tokens: 512,
            temperature: 0.0,
            seed: None,
            max_score: 10.0,
            unparsable_score: None,
            include_thinking: false,
        }
    }
}

/// Scores a response by asking a judge ([`Generate`]) to grade it, like ROLL's
/// `LLMJudgeRewardWorker` in `inference` mode — with any generator: a local Burn model, a remote
/// one, or a scripted one in tests.
///
/// For each sample the [template](JudgeTemplate) is filled with the prompt, the reference (the
/// ground truth) and the response, rendered with the judge tokenizer's chat template and
/// generated; [`parse_judge_score`] reads the output. The reward `value` and `score` are the
/// judgement in `[0, 1]`; details hold `judge_output` (shortened) and `judge_form`.
///
/// An empty response (nothing after `</think>`, or a `<think>` block never closed) scores 0
/// without asking the judge (`judge_form` = `empty`): a lenient judge must not be able to
/// reward saying nothing.
///
/// A semaphore bounds the judge calls in flight (`max_concurrency`) however many samples are
/// scored at once; [`score_batch`](Self::score_batch) submits a whole batch together so a
/// continuously batching engine can serve it in few forward passes.
pub struct LlmJudge {
    policy: Arc<dyn Generate>,
    tokenizer: Arc<dyn Tokenizer>,
    template: JudgeTemplate,
    config: LlmJudgeConfig,
    permits: Arc<Semaphore>,
}

impl fmt::Debug for LlmJudge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmJudge")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LlmJudge {
    /// A judge that asks `policy`, rendering prompts with `tokenizer`.
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] for a bad template, a concurrency of 0, or a
    /// non-positive `max_score`.
    pub fn new(
        policy: Arc<dyn Generate>,
        tokenizer: Arc<dyn Tokenizer>,
        config: LlmJudgeConfig,
    ) -> Result<Self, RewardError> {
        let template = JudgeTemplate::parse(&config.template)?;
        if config.max_concurrency == 0 {
            return Err(RewardError::invalid_config(
                "llm_judge.max_concurrency",
                "0 (at least one judge call must be allowed)",
            ));
        }
        if !(config.max_score.is_finite() && config.max_score > 0.0) {
            return Err(RewardError::invalid_config(
                "llm_judge.max_score",
                format!("{} is not a positive number", config.max_score),
            ));
        }
        if let Some(s) = config.unparsable_score
            && !s.is_finite()
        {
            return Err(RewardError::invalid_config(
                "llm_judge.unparsable_score",
                format!("{s} is not a finite number"),
            ));
        }
        Ok(Self {
            policy,
            tokenizer,
            template,
            permits: Arc::new(Semaphore::new(config.max_concurrency)),
            config,
        })
    }

    /// The config.
    pub fn config(&self) -> &LlmJudgeConfig {
        &self.config
    }

    /// Scores every sample, with all judge calls submitted at once (at most `max_concurrency` in
    /// flight); results are in the order of `samples`.
    pub async fn score_batch(&self, samples: &[Sample]) -> Vec<roll_core::Result<Reward>> {
        join_all(samples.iter().map(|s| self.score(s)).collect()).await
    }

    fn judge_prompt(&self, sample: &Sample, response: &str) -> Result<Vec<u32>, roll_core::Error> {
        let text = strip_special_tokens(&sample.text);
        let shown = if self.config.include_thinking {
            text.trim()
        } else {
            response
        };
        let user = self.template.render(
            &sample.prompt.text,
            sample.prompt.ground_truth.as_deref(),
            shown,
        )?;
        let mut messages = Vec::with_capacity(2);
        if let Some(system) = &self.config.system {
            messages.push(ChatMessage::new(Role::System, system.clone()));
        }
        messages.push(ChatMessage::new(Role::User, user));
        let rendered = self.tokenizer.render_chat(&messages, true)?;
        self.tokenizer.encode(&rendered)
    }
}

#[async_trait]
impl RewardWorker for LlmJudge {
    async fn score(&self, sample: &Sample) -> roll_core::Result<Reward> {
        let text = strip_special_tokens(&sample.text);
        let answer = after_think(&text).unwrap_or("").trim();
        if answer.is_empty() {
            return Ok(Reward::new(0.0)
                .with_score(0.0)
                .with_detail("judge_output", "")
                .with_detail("judge_form", "empty"));
        }
        let prompt_ids = self.judge_prompt(sample, answer)?;
        let params = SamplingParams {
            temperature: self.config.temperature,
            max_new_tokens: self.config.max_new_tokens,
            seed: self.config.seed.map(|s| s ^ sample.id.0),
            ..SamplingParams::default()
        };
        let generation = {
            let _permit = self
                .permits
                .acquire()
                .await
                .map_err(|_| roll_core::Error::Closed("the judge's semaphore"))?;
            self.policy
                .generate(GenerationRequest::new(prompt_ids, params))
                .await?
        };
        let output = shorten(&generation.text, 300);
        let (value, form) = match parse_judge_score(&generation.text, self.config.max_score) {
            Some(s) => (s.value, s.form.name()),
            None => match self.config.unparsable_score {
                Some(v) => (v, "unparsable"),
                None => return Err(RewardError::UnparsableJudgeOutput { output }.into()),
            },
        };
        Ok(Reward::new(value)
            .with_score(value)
            .with_detail("judge_output", output)
            .with_detail("judge_form", form))
    }
}
