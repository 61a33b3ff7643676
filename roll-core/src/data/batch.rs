//! What a train step consumes.

use super::SampleId;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// One sequence ready for a train step: the tokens, which of them are trained on, and the
/// per-token quantities the objective needs, all aligned to the response tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSequence {
    /// The sample this sequence came from.
    pub sample: SampleId,
    /// Prompt tokens (context only).
    pub prompt_ids: Vec<u32>,
    /// Response tokens.
    pub response_ids: Vec<u32>,
    /// `true` where the token is trained on.
    pub loss_mask: Vec<bool>,
    /// Log-probs under the policy that generated the data (the "old" policy of PPO), as the
    /// training forward computes them when old log-probs are recomputed, else the rollout's.
    pub old_logprobs: Vec<f32>,
    /// Log-probs the inference engine reported when it sampled the tokens: what the
    /// train–inference correction (TIS, masking) compares `old_logprobs` against.
    pub rollout_logprobs: Vec<f32>,
    /// Log-probs under the reference policy, for a KL term.
    pub ref_logprobs: Option<Vec<f32>>,
    /// Per-token advantages.
    pub advantages: Vec<f32>,
    /// Per-token returns (critic targets), for PPO with a critic.
    pub returns: Option<Vec<f32>>,
    /// Per-token values under the critic that generated the data, for value clipping.
    pub old_values: Option<Vec<f32>>,
    /// Sample weight in the loss (1 = plain).
    pub weight: f32,
    /// The sample's task score (some objectives, e.g. TOPR, split on its sign).
    pub score: f32,
}

impl TrainSequence {
    /// A sequence for supervised training (SFT): trained where `loss_mask` says, with no
    /// advantage, no log-probs and no values, weight 1.
    pub fn supervised(
        sample: SampleId,
        prompt_ids: Vec<u32>,
        response_ids: Vec<u32>,
        loss_mask: Vec<bool>,
    ) -> Self {
        let n = response_ids.len();
        Self {
            sample,
            prompt_ids,
            response_ids,
            loss_mask,
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

    fn check(&self) -> Result<()> {
        let n = self.response_ids.len();
        let check = |what: &str, len: usize| {
            if len == n {
                Ok(())
            } else {
                Err(Error::invalid_data(
                    "train sequence",
                    format!(
                        "{}: {what} has {len} entries for {n} response tokens",
                        self.sample
                    ),
                ))
            }
        };
        check("loss_mask", self.loss_mask.len())?;
        check("old_logprobs", self.old_logprobs.len())?;
        check("rollout_logprobs", self.rollout_logprobs.len())?;
        check("advantages", self.advantages.len())?;
        for (what, v) in [
            ("ref_logprobs", &self.ref_logprobs),
            ("returns", &self.returns),
            ("old_values", &self.old_values),
        ] {
            if let Some(v) = v {
                check(what, v.len())?;
            }
        }
        if !self.weight.is_finite() || self.weight < 0.0 {
            return Err(Error::invalid_data(
                "train sequence",
                format!(
                    "{}: weight {} is not a finite number ≥ 0",
                    self.sample, self.weight
                ),
            ));
        }
        Ok(())
    }

    /// Number of trained tokens.
    pub fn num_trained_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m).count()
    }
}

/// A validated batch of [`TrainSequence`]s: every per-token vector lines up with its response,
/// and optional quantities are present for all sequences or for none.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct TrainBatch {
    sequences: Vec<TrainSequence>,
}

impl TrainBatch {
    /// Validates and wraps the sequences.
    ///
    /// # Errors
    /// [`Error::InvalidData`] naming the sample and the field that does not line up, or an optional
    /// field present on some sequences only.
    pub fn new(sequences: Vec<TrainSequence>) -> Result<Self> {
        for s in &sequences {
            s.check()?;
        }
        if let Some(first) = sequences.first() {
            let shape = |s: &TrainSequence| {
                [
                    s.ref_logprobs.is_some(),
                    s.returns.is_some(),
                    s.old_values.is_some(),
                ]
            };
            let want = shape(first);
            if let Some(s) = sequences.iter().find(|s| shape(s) != want) {
                return Err(Error::invalid_data(
                    "train batch",
                    format!(
                        "{} and {} disagree on which of ref_logprobs/returns/old_values they carry",
                        first.sample, s.sample
                    ),
                ));
            }
        }
        Ok(Self { sequences })
    }

    /// The sequences.
    pub fn sequences(&self) -> &[TrainSequence] {
        &self.sequences
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.sequences.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    /// Total trained tokens over all sequences.
    pub fn num_trained_tokens(&self) -> usize {
        self.sequences
            .iter()
            .map(TrainSequence::num_trained_tokens)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn seq(id: u64, n: usize) -> TrainSequence {
        TrainSequence {
            sample: SampleId(id),
            prompt_ids: vec![1],
            response_ids: vec![2; n],
            loss_mask: vec![true; n],
            old_logprobs: vec![-1.0; n],
            rollout_logprobs: vec![-1.0; n],
            ref_logprobs: None,
            advantages: vec![0.5; n],
            returns: None,
            old_values: None,
            weight: 1.0,
            score: 1.0,
        }
    }

    #[test]
    fn misaligned_fields_are_rejected_with_the_sample_and_field() {
        let mut s = seq(3, 4);
        s.advantages.pop();
        let err = TrainBatch::new(vec![seq(1, 2), s]).unwrap_err().to_string();
        assert!(
            err.contains("sample#3") && err.contains("advantages"),
            "{err}"
        );
    }

    #[test]
    fn optional_fields_must_be_uniform() {
        let mut s = seq(2, 2);
        s.ref_logprobs = Some(vec![0.0; 2]);
        assert!(TrainBatch::new(vec![seq(1, 2), s]).is_err());
        let b = TrainBatch::new(vec![seq(1, 2), seq(2, 3)]).unwrap();
        assert_eq!(b.num_trained_tokens(), 5);
    }
}
