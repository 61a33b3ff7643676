//! A policy without a model that nevertheless learns.

use super::{ByteTokenizer, SplitMix64};
use crate::policy::{
    Generate, Generation, GenerationRequest, Objective, Score, ScoreRequest, TokenScores, Train,
    TrainOutput,
};
use crate::tokenizer::Tokenizer;
use crate::{Error, FinishReason, Result, TrainBatch, WeightVersion};
use async_trait::async_trait;
use std::sync::Mutex;
use std::time::Duration;

/// A unigram softmax policy over a small alphabet of token ids (by default the ASCII digits and
/// [`ByteTokenizer::EOS`]), with real sampling, exact log-probs and a real gradient step.
///
/// Every position draws from the same distribution `softmax(logits / T)`, independent of the
/// context. Training applies the plain policy-gradient step on the logits,
/// `logits ← logits + lr · Σ_t w·A_t·(onehot(y_t) − p) / N`, over trained tokens (`N` = their
/// count) — whatever `objective` says: the mock records how many steps it took but does not
/// interpret the objective. Small enough to reason about, real enough that a reward which
/// prefers some tokens is learned in a few steps.
///
/// `with_token_delay` makes each token take wall-clock time, so tests can abort requests mid-way.
pub struct MockPolicy {
    alphabet: Vec<u32>,
    eos: Option<u32>,
    learning_rate: f32,
    token_delay: Option<Duration>,
    state: Mutex<State>,
}

struct State {
    logits: Vec<f32>,
    version: WeightVersion,
    steps: u64,
}

impl MockPolicy {
    /// A policy over `alphabet` with uniform initial logits; `eos` (if in the alphabet) ends
    /// generation.
    ///
    /// # Errors
    /// [`Error::InvalidData`] if the alphabet is empty.
    pub fn new(alphabet: Vec<u32>, eos: Option<u32>) -> Result<Self> {
        if alphabet.is_empty() {
            return Err(Error::invalid_data("mock policy", "empty alphabet"));
        }
        Ok(Self::uniform(alphabet, eos))
    }

    fn uniform(alphabet: Vec<u32>, eos: Option<u32>) -> Self {
        let n = alphabet.len();
        Self {
            alphabet,
            eos,
            learning_rate: 1.0,
            token_delay: None,
            state: Mutex::new(State {
                logits: vec![0.0; n],
                version: WeightVersion(0),
                steps: 0,
            }),
        }
    }

    /// The digits `0`–`9` and EOS of [`ByteTokenizer`], EOS slightly disfavoured so responses have
    /// a few tokens.
    pub fn digits() -> Self {
        let mut alphabet: Vec<u32> = (b'0'..=b'9').map(u32::from).collect();
        alphabet.push(ByteTokenizer::EOS);
        let n = alphabet.len();
        let policy = Self::uniform(alphabet, Some(ByteTokenizer::EOS));
        if let Ok(mut s) = policy.state.lock() {
            s.logits[n - 1] = -1.5;
        }
        policy
    }

    /// Sets the learning rate of the gradient step (default 1).
    #[must_use]
    pub fn with_learning_rate(mut self, lr: f32) -> Self {
        self.learning_rate = lr;
        self
    }

    /// Makes every generated token take `delay` of wall-clock time.
    #[must_use]
    pub fn with_token_delay(mut self, delay: Duration) -> Self {
        self.token_delay = Some(delay);
        self
    }

    /// The current probability of each alphabet token, in alphabet order.
    pub fn probabilities(&self) -> Vec<f32> {
        self.with_state(|s| softmax(&s.logits, 1.0))
            .unwrap_or_default()
    }

    /// Number of train steps taken.
    pub fn steps(&self) -> u64 {
        self.with_state(|s| s.steps).unwrap_or(0)
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> Result<T> {
        let mut guard = self
            .state
            .lock()
            .map_err(|_| Error::policy("mock policy state poisoned by a panic"))?;
        Ok(f(&mut guard))
    }

    fn index_of(&self, token: u32) -> Result<usize> {
        self.alphabet
            .iter()
            .position(|&t| t == token)
            .ok_or_else(|| {
                Error::invalid_data(
                    "token id",
                    format!("{token} is not in the mock policy's alphabet"),
                )
            })
    }
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f32> {
    let scaled: Vec<f32> = logits.iter().map(|l| l / temperature).collect();
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = scaled.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

#[async_trait]
impl Generate for MockPolicy {
    async fn generate(&self, request: GenerationRequest) -> Result<Generation> {
        let params = &request.params;
        let mut rng = SplitMix64::new(params.seed.unwrap_or(0));
        let mut token_ids = Vec::new();
        let mut logprobs = Vec::new();
        let mut finish_reason = FinishReason::Length;
        let version = self.weight_version();
        for _ in 0..params.max_new_tokens {
            if let Some(delay) = self.token_delay {
                tokio::time::sleep(delay).await;
            }
            if request.abort.is_aborted() {
                finish_reason = FinishReason::Abort;
                break;
            }
            let logits = self.with_state(|s| s.logits.clone())?;
            let probs = if params.temperature <= 0.0 {
                let best = logits
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(i, _)| i);
                (0..logits.len())
                    .map(|i| if i == best { 1.0 } else { 0.0 })
                    .collect()
            } else {
                softmax(&logits, params.temperature)
            };
            let u = rng.next_f64() as f32;
            let mut acc = 0.0;
            let mut pick = probs.len() - 1;
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if u < acc {
                    pick = i;
                    break;
                }
            }
            let token = self.alphabet[pick];
            token_ids.push(token);
            logprobs.push(softmax(&logits, 1.0)[pick].ln());
            if Some(token) == self.eos || params.stop_token_ids.contains(&token) {
                finish_reason = FinishReason::Stop;
                break;
            }
        }
        let text = ByteTokenizer.decode(&token_ids)?;
        Ok(Generation {
            token_ids,
            logprobs,
            text,
            finish_reason,
            weight_version: version,
        })
    }

    fn weight_version(&self) -> WeightVersion {
        self.with_state(|s| s.version).unwrap_or_default()
    }
}

/// One set of arithmetic: both kernel choices give the same numbers.
#[async_trait]
impl Score for MockPolicy {
    async fn score(&self, request: &ScoreRequest) -> Result<Vec<TokenScores>> {
        let logits = self.with_state(|s| s.logits.clone())?;
        let probs = softmax(&logits, 1.0);
        let entropy: f32 = -probs.iter().map(|p| p * p.ln()).sum::<f32>();
        request
            .sequences
            .iter()
            .map(|seq| {
                let logprobs = seq
                    .response_ids
                    .iter()
                    .map(|&t| Ok(probs[self.index_of(t)?].ln()))
                    .collect::<Result<Vec<f32>>>()?;
                let n = logprobs.len();
                Ok(TokenScores {
                    logprobs,
                    entropy: request.with_entropy.then(|| vec![entropy; n]),
                    values: None,
                })
            })
            .collect()
    }
}

#[async_trait]
impl Train for MockPolicy {
    async fn train_step(&self, batch: TrainBatch, _objective: &Objective) -> Result<TrainOutput> {
        let mut grad = vec![0.0f32; self.alphabet.len()];
        let probs = self.with_state(|s| softmax(&s.logits, 1.0))?;
        let n = batch.num_trained_tokens().max(1) as f32;
        for seq in batch.sequences() {
            for ((&tok, &m), &a) in seq
                .response_ids
                .iter()
                .zip(&seq.loss_mask)
                .zip(&seq.advantages)
            {
                if !m {
                    continue;
                }
                let y = self.index_of(tok)?;
                for (i, g) in grad.iter_mut().enumerate() {
                    let onehot = if i == y { 1.0 } else { 0.0 };
                    *g += seq.weight * a * (onehot - probs[i]) / n;
                }
            }
        }
        let lr = self.learning_rate;
        let (version, grad_norm) = self.with_state(|s| {
            for (l, g) in s.logits.iter_mut().zip(&grad) {
                *l += lr * g;
            }
            s.steps += 1;
            s.version = s.version.next();
            (s.version, grad.iter().map(|g| g * g).sum::<f32>().sqrt())
        })?;
        let mut out = TrainOutput {
            weight_version: version,
            ..Default::default()
        };
        out.metrics.insert("grad_norm".into(), f64::from(grad_norm));
        out.metrics
            .insert("trained_tokens".into(), batch.num_trained_tokens() as f64);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{SamplingParams, ScoreSequence};
    use crate::{AbortHandle, SampleId, TrainSequence};

    fn request(seed: u64, max: u32) -> GenerationRequest {
        GenerationRequest::new(
            vec![1],
            SamplingParams {
                seed: Some(seed),
                max_new_tokens: max,
                ..Default::default()
            },
        )
    }

    #[tokio::test]
    async fn seeded_generation_is_reproducible_and_logprobs_match_scoring() {
        let p = MockPolicy::digits();
        let a = p.generate(request(3, 16)).await.unwrap();
        let b = p.generate(request(3, 16)).await.unwrap();
        assert_eq!(a, b);
        let scored = p
            .score(&ScoreRequest {
                sequences: vec![ScoreSequence {
                    prompt_ids: vec![1],
                    response_ids: a.token_ids.clone(),
                }],
                with_entropy: true,
                ..Default::default()
            })
            .await
            .unwrap();
        for (x, y) in scored[0].logprobs.iter().zip(&a.logprobs) {
            assert!((x - y).abs() < 1e-6);
        }
    }

    #[tokio::test]
    async fn abort_stops_generation_with_partial_tokens() {
        let p = MockPolicy::new(vec![b'a'.into()], None)
            .unwrap()
            .with_token_delay(Duration::from_millis(2));
        let (handle, signal) = AbortHandle::new();
        let mut req = request(1, 10_000);
        req.abort = signal;
        let task = tokio::spawn(async move { p.generate(req).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        handle.abort();
        let out = task.await.unwrap().unwrap();
        assert_eq!(out.finish_reason, FinishReason::Abort);
        assert!(!out.token_ids.is_empty() && out.token_ids.len() < 10_000);
    }

    #[tokio::test]
    async fn positive_advantage_raises_the_probability_of_the_token() {
        let p = MockPolicy::digits();
        let seven = u32::from(b'7');
        let before = p.probabilities()[7];
        let seq = TrainSequence {
            sample: SampleId(0),
            prompt_ids: vec![],
            response_ids: vec![seven, seven],
            loss_mask: vec![true, true],
            old_logprobs: vec![0.0; 2],
            rollout_logprobs: vec![0.0; 2],
            ref_logprobs: None,
            advantages: vec![1.0, 1.0],
            returns: None,
            old_values: None,
            weight: 1.0,
            score: 1.0,
        };
        let batch = TrainBatch::new(vec![seq]).unwrap();
        let out = p.train_step(batch, &Objective::default()).await.unwrap();
        assert_eq!(out.weight_version, WeightVersion(1));
        assert!(p.probabilities()[7] > before);
    }
}
