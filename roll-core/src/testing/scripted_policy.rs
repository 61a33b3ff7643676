//! A policy that answers from a script.

use super::ByteTokenizer;
use crate::policy::{Generate, Generation};
use crate::{FinishReason, GenerationRequest, Result, Tokenizer, WeightVersion};
use std::sync::Mutex;

/// Answers the `k`-th request with the `k`-th text of its script (the last one again once the
/// script is used up), as [`ByteTokenizer`] tokens followed by EOS, each with log-prob −0.5: a
/// scripted agent for episodes whose every token is known in advance.
#[derive(Debug)]
pub struct ScriptedPolicy {
    script: Vec<String>,
    next: Mutex<usize>,
}

impl ScriptedPolicy {
    /// A policy that says `script`, in order.
    pub fn new<S: Into<String>>(script: impl IntoIterator<Item = S>) -> Self {
        Self {
            script: script.into_iter().map(Into::into).collect(),
            next: Mutex::new(0),
        }
    }
}

#[async_trait::async_trait]
impl Generate for ScriptedPolicy {
    async fn generate(&self, _request: GenerationRequest) -> Result<Generation> {
        let k = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            *next += 1;
            *next - 1
        };
        let text = self
            .script
            .get(k)
            .or(self.script.last())
            .cloned()
            .unwrap_or_default();
        let mut token_ids = ByteTokenizer.encode(&text)?;
        token_ids.push(ByteTokenizer::EOS);
        Ok(Generation {
            logprobs: vec![-0.5; token_ids.len()],
            token_ids,
            text,
            finish_reason: FinishReason::Stop,
            weight_version: WeightVersion(0),
        })
    }

    fn weight_version(&self) -> WeightVersion {
        WeightVersion(0)
    }
}
