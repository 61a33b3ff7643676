//! The messages between the controller and a rollout rank: JSON, except the weight buckets.

use crate::{BackendError, Result};
use roll_core::policy::{Generation, SamplingParams};
use roll_core::{FinishReason, WeightVersion};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Controller → rollout rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum ToRollout {
    /// New requests and aborts of earlier ones; answered with a [`Report`].
    Round {
        /// Requests to start.
        submit: Vec<Submit>,
        /// Ids of running requests to abort (they finish with [`FinishReason::Abort`]).
        abort: Vec<u64>,
    },
    /// Weights follow in `buckets` messages of little-endian `f32`, `floats` in all; answered
    /// with a [`Report`] once the engine serves them as `version`.
    Weights {
        /// The version the rank must serve them as.
        version: u64,
        /// Floats in all buckets.
        floats: u64,
        /// Messages that follow.
        buckets: u32,
    },
    /// The run ended: abort what runs, answer with a last [`Report`], stop serving.
    Stop,
}

/// One request to start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Submit {
    /// The controller's id of the request.
    pub id: u64,
    /// The context.
    pub prompt_ids: Vec<u32>,
    /// How to sample.
    pub params: SamplingParams,
}

/// Rollout rank → controller: what finished since the last report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Report {
    /// Requests that ended.
    pub finished: Vec<Finished>,
    /// The version of the weights the rank's engine serves.
    pub version: u64,
}

/// One request that ended: its generation, or why it failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Finished {
    /// The controller's id of the request.
    pub id: u64,
    /// The generation, or the engine's error.
    pub outcome: std::result::Result<WireGeneration, String>,
}

/// A [`Generation`] on the wire. Log-probs travel as their bits: exact, and a non-finite value
/// (which JSON cannot carry) reaches the controller's checks instead of breaking the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct WireGeneration {
    token_ids: Vec<u32>,
    logprob_bits: Vec<u32>,
    text: String,
    finish_reason: FinishReason,
    weight_version: u64,
}

impl From<Generation> for WireGeneration {
    fn from(g: Generation) -> Self {
        Self {
            token_ids: g.token_ids,
            logprob_bits: g.logprobs.iter().map(|l| l.to_bits()).collect(),
            text: g.text,
            finish_reason: g.finish_reason,
            weight_version: g.weight_version.0,
        }
    }
}

impl From<WireGeneration> for Generation {
    fn from(g: WireGeneration) -> Self {
        Self {
            token_ids: g.token_ids,
            logprobs: g.logprob_bits.into_iter().map(f32::from_bits).collect(),
            text: g.text,
            finish_reason: g.finish_reason,
            weight_version: WeightVersion(g.weight_version),
        }
    }
}

/// `message` as bytes.
pub(crate) fn encode(message: &impl Serialize) -> Result<Vec<u8>> {
    serde_json::to_vec(message)
        .map_err(|e| BackendError::InvalidInput(format!("cannot encode a rollout message: {e}")))
}

/// The message in `bytes` from `rank`.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], rank: usize) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| BackendError::RolloutRank {
        rank,
        reason: format!("a message that does not parse ({} bytes): {e}", bytes.len()),
    })
}

/// `values` as little-endian bytes.
pub(crate) fn floats_to_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Appends the little-endian floats of `bytes` to `out`; `false` if the length is not a whole
/// number of floats.
pub(crate) fn extend_floats(out: &mut Vec<f32>, bytes: &[u8]) -> bool {
    let floats = bytes.chunks_exact(4);
    if !floats.remainder().is_empty() {
        return false;
    }
    out.extend(floats.map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn generations_cross_the_wire_bit_for_bit_even_when_not_finite() {
        let g = Generation {
            token_ids: vec![5, 9],
            logprobs: vec![-0.125, f32::NAN],
            text: "42".into(),
            finish_reason: FinishReason::Length,
            weight_version: WeightVersion(3),
        };
        let report = Report {
            finished: vec![Finished {
                id: 7,
                outcome: Ok(g.clone().into()),
            }],
            version: 3,
        };
        let back: Report = decode(&encode(&report).unwrap(), 1).unwrap();
        let Ok(wire) = back.finished[0].outcome.clone() else {
            panic!("the outcome changed");
        };
        let got = Generation::from(wire);
        assert_eq!(got.token_ids, g.token_ids);
        assert_eq!(got.logprobs[0], -0.125);
        assert!(got.logprobs[1].is_nan());
        assert_eq!(
            (got.text, got.weight_version),
            ("42".into(), WeightVersion(3))
        );
    }

    #[test]
    fn floats_round_trip_and_a_torn_buffer_is_refused() {
        let values = [1.5f32, -0.0, f32::MIN_POSITIVE];
        let bytes = floats_to_bytes(&values);
        let mut out = vec![9.0];
        assert!(extend_floats(&mut out, &bytes));
        assert_eq!(out, [9.0, 1.5, -0.0, f32::MIN_POSITIVE]);
        assert!(!extend_floats(&mut out, &bytes[..5]));
    }

    #[test]
    fn a_garbled_message_names_the_rank() {
        let err = decode::<Report>(b"{not json", 4).unwrap_err().to_string();
        assert!(
            err.starts_with("rollout rank 4: a message that does not parse"),
            "{err}"
        );
    }
}
