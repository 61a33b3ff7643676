//! The SFT pipeline: supervised fine-tuning on prompt/response pairs through the [`Policy`]
//! trait, with the loss on the response tokens only.

use crate::episode::Transcript;
use crate::policy::{Objective, ScoreRequest, ScoreSequence};
use crate::rng::{SplitMix64, mix64};
use crate::tokenizer::{ChatMessage, Role, Tokenizer, encode_prompt};
use crate::{Error, Policy, Result, SampleId, TrainBatch, TrainSequence};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One supervised example: a prompt and its response, or a whole conversation.
///
/// In JSONL, one object per line: `{"prompt": ..., "response": ...}` or
/// `{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SftExample {
    /// A single-turn pair.
    Pair(SftPair),
    /// A multi-turn conversation (an agent's episode, a chat).
    Conversation(SftConversation),
}

/// A prompt, rendered as RLVR renders its prompts (chat template, generation prompt), and the
/// response the model should learn to give.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftPair {
    /// The user message.
    pub prompt: String,
    /// The target completion; the tokenizer's end-of-sequence token is appended when trained, so
    /// the model also learns to stop.
    pub response: String,
}

/// A conversation: an optional system message, then user and assistant messages alternating,
/// first a user message, last an assistant message. Every assistant message is trained on (its
/// tokens and an end-of-sequence token); everything else is context. The token stream is the
/// one [`play_episode`](crate::episode::play_episode) builds for an agent that answered the same
/// way (both go through [`Transcript`]), so a warm start on an environment's episodes trains on
/// exactly the sequences RL will later see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftConversation {
    /// The messages in order.
    pub messages: Vec<ChatMessage>,
}

impl SftExample {
    /// A single-turn pair.
    pub fn new(prompt: impl Into<String>, response: impl Into<String>) -> Self {
        Self::Pair(SftPair {
            prompt: prompt.into(),
            response: response.into(),
        })
    }

    /// A conversation (checked when the SFT pipeline encodes it).
    pub fn conversation(messages: impl IntoIterator<Item = ChatMessage>) -> Self {
        Self::Conversation(SftConversation {
            messages: messages.into_iter().collect(),
        })
    }

    /// Every text of the example, in order (a tokenizer's training corpus).
    pub fn texts(&self) -> Vec<&str> {
        match self {
            Self::Pair(p) => vec![p.prompt.as_str(), p.response.as_str()],
            Self::Conversation(c) => c.messages.iter().map(|m| m.content.as_str()).collect(),
        }
    }

    /// Reads a JSONL file of examples (see [`SftExample`]; blank lines skipped).
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
            // Parsed by shape, so that an error names the fields of the form the line meant.
            let parsed = serde_json::from_str::<serde_json::Value>(&line).and_then(|v| {
                if v.get("messages").is_some() {
                    serde_json::from_value(v).map(Self::Conversation)
                } else {
                    serde_json::from_value(v).map(Self::Pair)
                }
            });
            let example = parsed.map_err(|e| {
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
    /// The examples as token ids, with the tokens trained on.
    train: Vec<Encoded>,
    /// The held-out examples, as the request that scores them (built once).
    eval: ScoreRequest,
    /// Which response tokens of each held-out example count in its loss.
    eval_masks: Vec<Vec<bool>>,
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
            eval_masks: Vec::new(),
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
        let (sequences, masks) = encode_all(&*self.tokenizer, examples)?
            .into_iter()
            .map(|e| (e.sequence, e.loss_mask))
            .unzip();
        self.eval.sequences = sequences;
        self.eval_masks = masks;
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
        let tokens = sequences
            .iter()
            .map(TrainSequence::num_trained_tokens)
            .sum();
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
        for (s, mask) in scores.iter().zip(&self.eval_masks) {
            for (&lp, _) in s.logprobs.iter().zip(mask).filter(|(_, m)| **m) {
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

/// One example as token ids: the sequence and which of its response tokens are trained on.
struct Encoded {
    sequence: ScoreSequence,
    loss_mask: Vec<bool>,
}

fn encode_all(
    tokenizer: &dyn Tokenizer,
    examples: impl IntoIterator<Item = SftExample>,
) -> Result<Vec<Encoded>> {
    let eos = tokenizer.eos_token_id().ok_or_else(|| {
        Error::invalid_data(
            "SFT tokenizer",
            "no end-of-sequence token: the model could not learn to stop",
        )
    })?;
    examples
        .into_iter()
        .enumerate()
        .map(|(i, e)| match e {
            SftExample::Pair(p) => encode_pair(tokenizer, eos, i, &p),
            SftExample::Conversation(c) => encode_conversation(tokenizer, eos, i, &c.messages),
        })
        .collect()
}

fn encode_pair(tokenizer: &dyn Tokenizer, eos: u32, i: usize, p: &SftPair) -> Result<Encoded> {
    let prompt = encode_prompt(tokenizer, None, &p.prompt)?;
    let mut response = tokenizer.encode(&p.response)?;
    if prompt.is_empty() || response.is_empty() {
        return Err(Error::invalid_data(
            "SFT dataset",
            format!(
                "example {i} ({:?} → {:?}) has an empty {}",
                p.prompt,
                p.response,
                if prompt.is_empty() {
                    "prompt"
                } else {
                    "response"
                }
            ),
        ));
    }
    response.push(eos);
    let loss_mask = vec![true; response.len()];
    Ok(Encoded {
        sequence: ScoreSequence {
            prompt_ids: prompt,
            response_ids: response,
        },
        loss_mask,
    })
}

/// A conversation's tokens, built by [`Transcript`] as an episode builds them: each assistant
/// message is its tokens and EOS (trained on), each following user message the template's glue
/// (context).
fn encode_conversation(
    tokenizer: &dyn Tokenizer,
    eos: u32,
    i: usize,
    messages: &[ChatMessage],
) -> Result<Encoded> {
    let bad = |why: String| Error::invalid_data("SFT dataset", format!("conversation {i}: {why}"));
    let (system, rest) = match messages.split_first() {
        Some((first, rest)) if first.role == Role::System => (Some(first.content.as_str()), rest),
        _ => (None, messages),
    };
    for (k, m) in rest.iter().enumerate() {
        let expected = if k % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        if m.role != expected {
            return Err(bad(format!(
                "message {} is from {:?} where {expected:?} was expected (after an optional \
                 system message, user and assistant messages alternate)",
                k + usize::from(system.is_some()),
                m.role
            )));
        }
        if m.role == Role::Assistant && m.content.is_empty() {
            return Err(bad(format!(
                "message {} is an empty assistant message",
                k + usize::from(system.is_some())
            )));
        }
    }
    if rest.len() < 2 || rest.len() % 2 == 1 {
        return Err(bad(format!(
            "{} user/assistant messages; a conversation needs at least one exchange and must \
             end with the assistant's message",
            rest.len()
        )));
    }
    let (mut transcript, prompt_ids) = Transcript::start(tokenizer, system, &rest[0].content)?;
    let mut response_ids = Vec::new();
    let mut loss_mask = Vec::new();
    for pair in rest[1..].chunks(2) {
        let action = &pair[0].content;
        let mut ids = tokenizer.encode(action)?;
        ids.push(eos);
        let generated_text = tokenizer.decode(&ids)?;
        response_ids.extend_from_slice(&ids);
        loss_mask.extend(std::iter::repeat_n(true, ids.len()));
        if let Some(next) = pair.get(1) {
            let glue = transcript.next_turn(action, &generated_text, &next.content)?;
            response_ids.extend_from_slice(&glue);
            loss_mask.extend(std::iter::repeat_n(false, glue.len()));
        }
    }
    Ok(Encoded {
        sequence: ScoreSequence {
            prompt_ids,
            response_ids,
        },
        loss_mask,
    })
}

fn sequence(index: usize, e: &Encoded) -> TrainSequence {
    TrainSequence::supervised(
        SampleId(index as u64),
        e.sequence.prompt_ids.clone(),
        e.sequence.response_ids.clone(),
        e.loss_mask.clone(),
    )
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

    #[tokio::test]
    async fn a_conversation_encodes_as_the_episode_that_answered_the_same() {
        // An echo environment played by a scripted agent, then the same exchange as an SFT
        // conversation: the tokens and the trained positions must be the episode's, token by
        // token (ChatML, with the template's <|im_end|> closing each answer after EOS).
        let answers = ["left", "up", "stop"];
        let agent = crate::testing::ScriptedPolicy::new(answers);
        let mut env = crate::testing::EchoEnv::new(5);
        let ids = crate::episode::EpisodeIds {
            sample: SampleId(0),
            group: crate::GroupId(0),
            seed: 7,
        };
        let config = crate::episode::EpisodeConfig {
            system_prompt: Some("be brief".into()),
            ..Default::default()
        };
        let traj = crate::episode::play_episode(
            &agent,
            &ByteTokenizer,
            &mut env,
            ids,
            &config,
            &crate::AbortSignal::never(),
        )
        .await
        .unwrap();
        assert_eq!(traj.turns().len(), 3);
        let mut messages = vec![
            ChatMessage::new(Role::System, "be brief"),
            ChatMessage::new(Role::User, traj.prompt.text.clone()),
        ];
        for (k, answer) in answers.iter().enumerate() {
            messages.push(ChatMessage::new(Role::Assistant, *answer));
            if k + 1 < answers.len() {
                // EchoEnv's observation is the action.
                messages.push(ChatMessage::new(Role::User, *answer));
            }
        }
        let encoded = encode_all(&ByteTokenizer, [SftExample::conversation(messages)]).unwrap();
        let e = &encoded[0];
        assert_eq!(e.sequence.prompt_ids, traj.prompt_ids);
        assert_eq!(e.sequence.response_ids, traj.response().ids());
        assert_eq!(e.loss_mask, traj.response().loss_mask());
        // Spelled out: the first answer, trained, then the glue, not trained.
        let first = ByteTokenizer.encode("left").unwrap();
        assert_eq!(e.sequence.response_ids[..4], first[..]);
        assert_eq!(e.sequence.response_ids[4], ByteTokenizer::EOS);
        assert!(e.loss_mask[..5].iter().all(|m| *m));
        let glue = ByteTokenizer
            .encode("<|im_end|>\n<|im_start|>user\nleft<|im_end|>\n<|im_start|>assistant\n")
            .unwrap();
        assert_eq!(e.sequence.response_ids[5..5 + glue.len()], glue[..]);
        assert!(e.loss_mask[5..5 + glue.len()].iter().all(|m| !*m));
    }

    #[test]
    fn malformed_conversations_are_refused_naming_the_message() {
        let user = |t: &str| ChatMessage::new(Role::User, t);
        let assistant = |t: &str| ChatMessage::new(Role::Assistant, t);
        for (messages, says) in [
            (vec![user("a"), user("b")], "message 1 is from User"),
            (vec![assistant("a")], "message 0 is from Assistant"),
            (
                vec![user("a"), assistant("b"), user("c")],
                "must end with the assistant",
            ),
            (vec![user("a")], "at least one exchange"),
            (vec![user("a"), assistant("")], "empty assistant message"),
        ] {
            let err = encode_all(&ByteTokenizer, [SftExample::conversation(messages)])
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains("conversation 0") && err.contains(says),
                "{err}"
            );
        }
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
        std::fs::write(
            &path,
            "{\"prompt\":\"a\",\"response\":\"b\"}\n\
             {\"messages\":[{\"role\":\"user\",\"content\":\"q\"},\
             {\"role\":\"assistant\",\"content\":\"r\"}]}\n",
        )
        .unwrap();
        assert_eq!(
            SftExample::read_jsonl(&path).unwrap(),
            [
                SftExample::new("a", "b"),
                SftExample::conversation([
                    ChatMessage::new(Role::User, "q"),
                    ChatMessage::new(Role::Assistant, "r")
                ])
            ]
        );
        // A conversation line with a stray key names it.
        std::fs::write(&path, "{\"messages\":[],\"prompt\":\"x\"}\n").unwrap();
        let err = SftExample::read_jsonl(&path).unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("prompt"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
