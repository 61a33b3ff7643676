//! Per-token log-probs, entropy and values of given sequences, in micro-batches — the reference
//! and old-policy passes of RL.

use crate::models::{CausalLm, PaddingSide, TokenBatch, ValueHead, token_logprobs_and_entropy};
use crate::{BackendError, Result};
use burn::tensor::{Device, Int, Tensor, TensorData};
use roll_core::policy::{ScoreRequest, TokenScores};

/// How [`score`] batches its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoringOptions {
    /// Upper bound on `rows × padded length` of one forward pass (a longer sequence runs alone).
    /// Bounds memory: the logits of a micro-batch take `4 × this × vocab` bytes.
    pub max_tokens_per_micro_batch: usize,
    /// Which side padding goes (results do not depend on it).
    pub padding: PaddingSide,
    /// Id written into padding slots (never attended to).
    pub pad_id: u32,
}

impl Default for ScoringOptions {
    fn default() -> Self {
        Self {
            max_tokens_per_micro_batch: 4096,
            padding: PaddingSide::Right,
            pad_id: 0,
        }
    }
}

impl ScoringOptions {
    /// Sets the token budget of a micro-batch.
    pub fn with_max_tokens_per_micro_batch(mut self, tokens: usize) -> Self {
        self.max_tokens_per_micro_batch = tokens;
        self
    }

    /// Sets the padding side.
    pub fn with_padding(mut self, padding: PaddingSide) -> Self {
        self.padding = padding;
        self
    }
}

/// Scores every sequence of `request`: `logprobs[t] = log p(response[t] | prompt, response[..t])`,
/// with `entropy[t]` of that next-token distribution when `request.with_entropy`, and
/// `values[t]` = the value head at the position that predicts `response[t]` when a head is
/// given.
///
/// Sequences are sorted by length and packed into micro-batches of at most
/// `options.max_tokens_per_micro_batch` padded tokens; padding is masked, so each result equals
/// scoring that sequence alone (to float round-off). Results come back in request order.
///
/// # Errors
/// [`BackendError::InvalidInput`] for a sequence with a response but an empty prompt (its first
/// token has no context), [`BackendError::TokenOutOfVocab`] for an id outside the model's
/// vocabulary.
pub fn score(
    model: &CausalLm,
    value_head: Option<&ValueHead>,
    request: &ScoreRequest,
    options: &ScoringOptions,
    device: &Device,
) -> Result<Vec<TokenScores>> {
    model.check_lengths(
        request
            .sequences
            .iter()
            .map(|s| s.prompt_ids.len() + s.response_ids.len()),
    )?;
    let mut results = vec![TokenScores::default(); request.sequences.len()];
    let mut order = Vec::new();
    for (i, s) in request.sequences.iter().enumerate() {
        if s.response_ids.is_empty() {
            results[i].entropy = request.with_entropy.then(Vec::new);
            results[i].values = value_head.map(|_| Vec::new());
            continue;
        }
        if s.prompt_ids.is_empty() {
            return Err(BackendError::InvalidInput(format!(
                "sequence {i} has an empty prompt: its first response token has no context"
            )));
        }
        order.push(i);
    }
    let len = |i: usize| {
        let s = &request.sequences[i];
        s.prompt_ids.len() + s.response_ids.len()
    };
    order.sort_by_key(|&i| std::cmp::Reverse(len(i)));

    let budget = options.max_tokens_per_micro_batch.max(1);
    let mut start = 0;
    while start < order.len() {
        let width = len(order[start]); // longest first
        let mut end = start + 1;
        while end < order.len() && (end - start + 1) * width <= budget {
            end += 1;
        }
        let chunk = &order[start..end];
        let seqs: Vec<Vec<u32>> = chunk
            .iter()
            .map(|&i| {
                let s = &request.sequences[i];
                [s.prompt_ids.as_slice(), s.response_ids.as_slice()].concat()
            })
            .collect();
        let batch = TokenBatch::new(
            &seqs,
            options.padding,
            options.pad_id,
            model.vocab_size(),
            device,
        )?;
        let scored = score_batch(model, value_head, &batch, &seqs, request.with_entropy)?;
        for (k, &i) in chunk.iter().enumerate() {
            let prompt = request.sequences[i].prompt_ids.len();
            let cols: Vec<usize> = (0..request.sequences[i].response_ids.len())
                .map(|t| batch.column(k, prompt + t - 1))
                .collect();
            let pick = |m: &[f32]| cols.iter().map(|&c| m[k * scored.width + c]).collect();
            results[i] = TokenScores {
                logprobs: pick(&scored.logprobs),
                entropy: scored.entropy.as_deref().map(pick),
                values: scored.values.as_deref().map(pick),
            };
        }
        start = end;
    }
    Ok(results)
}

/// Row-major `[batch, width]` results of one micro-batch, at every column.
struct Scored {
    width: usize,
    logprobs: Vec<f32>,
    entropy: Option<Vec<f32>>,
    values: Option<Vec<f32>>,
}

fn score_batch(
    model: &CausalLm,
    value_head: Option<&ValueHead>,
    batch: &TokenBatch,
    seqs: &[Vec<u32>],
    with_entropy: bool,
) -> Result<Scored> {
    let [rows, width] = batch.input_ids.dims();
    // targets[r, c] = the token after column c (0 where there is none).
    let mut targets = vec![0i32; rows * width];
    for (r, seq) in seqs.iter().enumerate() {
        for t in 0..seq.len() - 1 {
            targets[r * width + batch.column(r, t)] = seq[t + 1] as i32;
        }
    }
    let device = batch.input_ids.device();
    let targets = Tensor::<2, Int>::from_data(TensorData::new(targets, [rows, width]), &device);
    let hidden = model.forward_hidden(batch);
    let values = value_head.map(|h| h.forward(hidden.clone()));
    let (logprobs, entropy) =
        token_logprobs_and_entropy(model.logits(hidden), targets, with_entropy);
    Ok(Scored {
        width,
        logprobs: read(logprobs)?,
        entropy: entropy.map(read).transpose()?,
        values: values.map(read).transpose()?,
    })
}

/// Gathers `log p(target)` from log-probabilities (or logits already normalised).
///
/// To go from raw logits, [`crate::models::token_logprobs_from_logits`] is faster and equal to
/// round-off.
///
/// # Shapes
/// - `logp`: `[batch, seq, vocab]`, `targets`: `[batch, seq]`
/// - output: `[batch, seq]`
pub fn token_logprobs(logp: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<2> {
    logp.gather(2, targets.unsqueeze_dim::<3>(2))
        .squeeze_dim::<2>(2)
}

fn read(t: Tensor<2>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| BackendError::InvalidInput(format!("cannot read scores back: {e:?}")))
}
