//! The SFT pipeline: supervised fine-tuning on prompt/response pairs through the [`Policy`]
//! trait, with the loss on the response tokens only.

use crate::policy::{Objective, ScoreRequest, ScoreSequence};
use crate::rng::{SplitMix64, mix64};
use crate::tokenizer::{Tokenizer, encode_prompt};
use crate::{Error, Policy, Result, SampleId, TrainBatch, TrainSequence};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One supervised example: a prompt, rendered as RLVR renders its prompts (chat template,
/// generation prompt), and the response the model should learn to give.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftExample {
    /// The user message.
    pub prompt: String,
    /// The target completion; the tokenizer's end-of-sequence token is appended when trained, so
    /// the model also learns to stop.
    pub response: String,
}

impl SftExample {
    /// A pair.
    pub fn new(prompt: impl Into<String>, response: impl Into<String>) -> Self {
        Self {
            prompt: prompt.into(),
            response: response.into(),
        }
    }

    /// Reads a JSONL file of `{"prompt": ..., "response": ...}` objects (blank lines skipped).
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read; [`Error::InvalidData`] naming the line that is
    /// not such an object.
    pub fn read_jsonl(path: impl AsRef<Path>) -> Result<Vec<Self>> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            action: "cannot read the SFT dataset",
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let mut out = Vec::new();
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.map_err(io)?;
            if line.trim().is_empty() {
                continue;
            }
            let example = serde_json::from_str(&line).map_err(|e| {
                Error::invalid_data(
                    "SFT dataset",
                    format!("{} line {}: {e}", path.display(), i + 1),
                )
            })?;
            out.push(example);
        }
        Ok(out)
    }
}

/// Settings of [`SftPipeline`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftConfig {
    /// Examples per optimiser step (the trainer micro-batches them with one global denominator,
    /// so the step's loss is the mean over every response token of the batch).
    pub batch_size: usize,
    /// Passes over the dataset.
    pub epochs: u32,
    /// Reshuffle the dataset each epoch (from `seed`); `false` keeps the given order — a
    /// curriculum.
    pub shuffle: bool,
    /// Seed of the shuffles.
    pub seed: u64,
}

impl Default for SftConfig {
    fn default() -> Self {
        Self {
            batch_size: 32,
            epochs: 1,
            shuffle: true,
            seed: 0,
        }
    }
}

/// Where an [`SftPipeline`] is in its dataset: all a resumed run needs besides the weights (the
/// epoch's order is recomputed from the seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SftPosition {
    /// Steps taken.
    pub step: u64,
    /// The current epoch (0-based).
    pub epoch: u32,
    /// Examples of the current epoch already trained on.
    pub cursor: usize,
}

/// One SFT step's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct SftStepReport {
    /// The step (0-based).
    pub step: u64,
    /// The epoch it trained in.
    pub epoch: u32,
    /// Mean cross-entropy per response token of the batch, before the update.
    pub loss: f64,
    /// Response tokens trained on.
    pub tokens: usize,
    /// Wall-clock time of the step.
    pub time: Duration,
    /// The trainer's metrics (`grad_norm`, `lr`, ...).
    pub metrics: BTreeMap<String, f64>,
}

/// Supervised fine-tuning through the [`Policy`] trait: each step takes the next `batch_size`
/// examples, builds a [`TrainBatch`] whose loss mask covers the response tokens only, and trains
/// it under [`Objective::sft`] (token-mean cross-entropy with the trainer's global denominators).
/// The weights the actor publishes after each step are the ones it generates with, so SFT can
/// warm-start an RL run on the same actor.
///
/// ```no_run
/// # async fn demo(policy: std::sync::Arc<dyn roll_core::Policy>, tokenizer: std::sync::Arc<dyn roll_core::Tokenizer>) -> roll_core::Result<()> {
/// use roll_core::pipeline::{SftConfig, SftExample, SftPipeline};
/// let data = (0..100).map(|i| SftExample::new(format!("Q: {i}+1=? A:"), format!(" {}", i + 1)));
/// let held_out = [SftExample::new("Q: 7+1=? A:", " 8")];
/// let mut sft = SftPipeline::new(policy, tokenizer, data, SftConfig::default())?
///     .with_eval(held_out)?;
/// while !sft.is_done() {
///     let report = sft.step().await?;
///     println!("step {} loss {:.3}", report.step, report.loss);
/// }
/// println!("held-out loss {:.3}", sft.eval_loss().await?);
/// # Ok(()) }
/// ```
pub struct SftPipeline {
    policy: Arc<dyn Policy>,
    tokenizer: Arc<dyn Tokenizer>,
    config: SftConfig,
    /// The pairs as token ids (the response ending in EOS).
    train: Vec<ScoreSequence>,
    /// The held-out pairs, as the request that scores them (built once).
    eval: ScoreRequest,
    order: Vec<usize>,
    position: SftPosition,
}

impl SftPipeline {
    /// A pipeline over `examples`, encoded once.
    ///
    /// # Errors
    /// [`Error::InvalidData`] for an empty dataset, a zero batch size or epoch count, an example
    /// whose prompt or response encodes to no tokens (naming it), or a tokenizer without an
    /// end-of-sequence token.
    pub fn new(
        policy: Arc<dyn Policy>,
        tokenizer: Arc<dyn Tokenizer>,
        examples: impl IntoIterator<Item = SftExample>,
        config: SftConfig,
    ) -> Result<Self> {
        if config.batch_size == 0 || config.epochs == 0 {
            return Err(Error::invalid_data(
                "SFT config",
                "batch_size and epochs must be at least 1",
            ));
        }
        let train = encode_all(&*tokenizer, examples)?;
        if train.is_empty() {
            return Err(Error::invalid_data("SFT dataset", "no examples"));
        }
        let mut pipeline = Self {
            policy,
            tokenizer,
            config,
            train,
            eval: ScoreRequest::default(),
            order: Vec::new(),
            position: SftPosition::default(),
        };
        pipeline.order = pipeline.epoch_order(0);
        Ok(pipeline)
    }

    /// Sets the held-out examples of [`SftPipeline::eval_loss`].
    ///
    /// # Errors
    /// As [`SftPipeline::new`] for a bad example.
    pub fn with_eval(mut self, examples: impl IntoIterator<Item = SftExample>) -> Result<Self> {
        self.eval.sequences = encode_all(&*self.tokenizer, examples)?;
        Ok(self)
    }

    /// Optimiser steps per epoch (the last batch of an epoch may be smaller).
    pub fn steps_per_epoch(&self) -> u64 {
        self.train.len().div_ceil(self.config.batch_size) as u64
    }

    /// Steps of the whole run.
    pub fn total_steps(&self) -> u64 {
        self.steps_per_epoch() * u64::from(self.config.epochs)
    }

    /// Whether every epoch has been trained.
    pub fn is_done(&self) -> bool {
        self.position.epoch >= self.config.epochs
    }

    /// Where the pipeline is in its dataset.
    pub fn position(&self) -> SftPosition {
        self.position
    }

    /// Continues from `position` (of a checkpoint of this dataset and config).
    ///
    /// # Errors
    /// [`Error::InvalidData`] if the position lies outside the dataset.
    pub fn resume_at(&mut self, position: SftPosition) -> Result<()> {
        if position.cursor > self.train.len() || position.epoch > self.config.epochs {
            return Err(Error::invalid_data(
                "SFT position",
                format!(
                    "epoch {} example {} is outside {} epochs of {} examples",
                    position.epoch,
                    position.cursor,
                    self.config.epochs,
                    self.train.len()
                ),
            ));
        }
        self.position = position;
        self.order = self.epoch_order(position.epoch);
        Ok(())
    }

    /// Trains on the next batch.
    ///
    /// # Errors
    /// [`Error::InvalidData`] if every epoch is done; the policy's errors.
    pub async fn step(&mut self) -> Result<SftStepReport> {
        if self.is_done() {
            return Err(Error::invalid_data(
                "SFT pipeline",
                format!("all {} epochs are trained", self.config.epochs),
            ));
        }
        let start = Instant::now();
        let end = (self.position.cursor + self.config.batch_size).min(self.train.len());
        let sequences: Vec<TrainSequence> = self.order[self.position.cursor..end]
            .iter()
            .map(|&i| sequence(i, &self.train[i]))
            .collect();
        let tokens = sequences.iter().map(|s| s.response_ids.len()).sum();
        let out = self
            .policy
            .train_step(TrainBatch::new(sequences)?, &Objective::sft())
            .await?;
        let report = SftStepReport {
            step: self.position.step,
            epoch: self.position.epoch,
            loss: out.metrics.get("loss").copied().unwrap_or(f64::NAN),
            tokens,
            time: start.elapsed(),
            metrics: out
                .metrics
                .into_iter()
                .filter(|(k, _)| SFT_METRICS.contains(&k.as_str()))
                .collect(),
        };
        self.position.step += 1;
        self.position.cursor = end;
        if end == self.train.len() {
            self.position.epoch += 1;
            self.position.cursor = 0;
            self.order = self.epoch_order(self.position.epoch);
        }
        Ok(report)
    }

    /// Mean cross-entropy per response token of the held-out examples under the policy's current
    /// weights (NaN without held-out examples).
    ///
    /// # Errors
    /// The policy's scoring errors, or a non-finite log-prob.
    pub async fn eval_loss(&self) -> Result<f64> {
        if self.eval.sequences.is_empty() {
            return Ok(f64::NAN);
        }
        let scores = self.policy.score(&self.eval).await?;
        let (mut sum, mut n) = (0.0f64, 0usize);
        for s in &scores {
            for &lp in &s.logprobs {
                if !lp.is_finite() {
                    return Err(Error::invalid_data(
                        "SFT evaluation",
                        format!("the policy scored a log-prob of {lp}"),
                    ));
                }
                sum -= f64::from(lp);
                n += 1;
            }
        }
        Ok(sum / n.max(1) as f64)
    }

    /// The order of `epoch`'s examples: a seeded Fisher–Yates shuffle, or the given order.
    fn epoch_order(&self, epoch: u32) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.train.len()).collect();
        if self.config.shuffle {
            let mut rng = SplitMix64::new(mix64(self.config.seed ^ u64::from(epoch)));
            for i in (1..order.len()).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
        }
        order
    }
}

/// The trainer metrics that mean something for cross-entropy (the RL diagnostics — ratios,
/// clip fractions, approximate KL — are computed against no old policy).
const SFT_METRICS: &[&str] = &["grad_norm", "lr", "loss", "trained_tokens", "skipped"];

fn encode_all(
    tokenizer: &dyn Tokenizer,
    examples: impl IntoIterator<Item = SftExample>,
) -> Result<Vec<ScoreSequence>> {
    let eos = tokenizer.eos_token_id().ok_or_else(|| {
        Error::invalid_data(
            "SFT tokenizer",
            "no end-of-sequence token: the model could not learn to stop",
        )
    })?;
    examples
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let prompt = encode_prompt(tokenizer, None, &e.prompt)?;
            let mut response = tokenizer.encode(&e.response)?;
            if prompt.is_empty() || response.is_empty() {
                return Err(Error::invalid_data(
                    "SFT dataset",
                    format!(
                        "example {i} ({:?} → {:?}) has an empty {}",
                        e.prompt,
                        e.response,
                        if prompt.is_empty() {
                            "prompt"
                        } else {
                            "response"
                        }
                    ),
                ));
            }
            response.push(eos);
            Ok(ScoreSequence {
                prompt_ids: prompt,
                response_ids: response,
            })
        })
        .collect()
}

fn sequence(index: usize, e: &ScoreSequence) -> TrainSequence {
    let n = e.response_ids.len();
    TrainSequence {
        sample: SampleId(index as u64),
        prompt_ids: e.prompt_ids.clone(),
        response_ids: e.response_ids.clone(),
        loss_mask: vec![true; n],
        old_logprobs: vec![0.0; n],
        rollout_logprobs: vec![0.0; n],
        ref_logprobs: None,
        advantages: vec![0.0; n],
        returns: None,
        old_values: None,
        weight: 1.0,
        score: 0.0,
    }
}

#[cfg(all(test, feature = "testing"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testing::{ByteTokenizer, MockPolicy};

    fn data(n: usize) -> Vec<SftExample> {
        (0..n)
            .map(|i| SftExample::new(format!("q{i}"), format!("a{i}")))
            .collect()
    }

    #[tokio::test]
    async fn walks_the_epochs_in_batches_and_resumes() {
        let tok: Arc<dyn Tokenizer> = Arc::new(ByteTokenizer);
        let policy: Arc<dyn Policy> = Arc::new(
            MockPolicy::new(
                (0..ByteTokenizer::VOCAB).collect(),
                Some(ByteTokenizer::EOS),
            )
            .unwrap(),
        );
        let config = SftConfig {
            batch_size: 4,
            epochs: 2,
            shuffle: true,
            seed: 9,
        };
        let mut sft =
            SftPipeline::new(policy.clone(), tok.clone(), data(10), config.clone()).unwrap();
        assert_eq!(sft.total_steps(), 6);
        let mut seen = Vec::new();
        while !sft.is_done() {
            seen.push(sft.step().await.unwrap().epoch);
        }
        assert_eq!(seen, [0, 0, 0, 1, 1, 1]);
        assert!(sft.step().await.is_err());
        // The same seed gives the same order; resuming mid-epoch lands where it was.
        let mut a =
            SftPipeline::new(policy.clone(), tok.clone(), data(10), config.clone()).unwrap();
        a.step().await.unwrap();
        let mut b = SftPipeline::new(policy, tok, data(10), config).unwrap();
        b.resume_at(a.position()).unwrap();
        assert_eq!(a.order, b.order);
        assert_eq!(
            a.position(),
            SftPosition {
                step: 1,
                epoch: 0,
                cursor: 4
            }
        );
    }

    #[test]
    fn refuses_empty_examples_naming_them() {
        let tok: Arc<dyn Tokenizer> = Arc::new(ByteTokenizer);
        let policy: Arc<dyn Policy> = Arc::new(
            MockPolicy::new(
                (0..ByteTokenizer::VOCAB).collect(),
                Some(ByteTokenizer::EOS),
            )
            .unwrap(),
        );
        let bad = [SftExample::new("q", "")];
        let err = SftPipeline::new(policy, tok, bad, SftConfig::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("example 0") && err.contains("response"),
            "{err}"
        );
    }

    #[test]
    fn reads_jsonl_and_names_the_bad_line() {
        let dir = std::env::temp_dir().join(format!("roll-sft-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.jsonl");
        std::fs::write(
            &path,
            "{\"prompt\":\"a\",\"response\":\"b\"}\n\n{\"prompt\":1}\n",
        )
        .unwrap();
        let err = SftExample::read_jsonl(&path).unwrap_err().to_string();
        assert!(err.contains("line 3"), "{err}");
        std::fs::write(&path, "{\"prompt\":\"a\",\"response\":\"b\"}\n").unwrap();
        assert_eq!(
            SftExample::read_jsonl(&path).unwrap(),
            [SftExample::new("a", "b")]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
