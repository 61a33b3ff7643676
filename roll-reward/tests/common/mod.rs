//! Helpers shared by the integration tests.
#![allow(dead_code)]

use async_trait::async_trait;
use roll_core::config::DomainMap;
use roll_core::policy::{Generate, Generation, GenerationRequest};
use roll_core::testing::ByteTokenizer;
use roll_core::tokenizer::Tokenizer;
use roll_core::{Error, FinishReason, GroupId, Prompt, PromptId, Sample, SampleId, WeightVersion};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A sample of `domain` answering with `text` (its prompt's tag is `domain` too).
pub fn sample(domain: &str, text: &str, truth: Option<&str>) -> Sample {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut p = Prompt::new(PromptId(id), format!("question {id}"), domain);
    p.ground_truth = truth.map(str::to_owned);
    let mut s = Sample::new(SampleId(id), GroupId(id), Arc::new(p), vec![]);
    s.text = text.to_owned();
    s
}

/// `s` with its prompt's domain resolved from its tag by `map`, as the prompt mixer does when a
/// prompt enters a run.
pub fn resolved(map: &DomainMap, mut s: Sample) -> Sample {
    map.resolve_prompt(Arc::make_mut(&mut s.prompt))
        .expect("the test's tag is in the map");
    s
}

/// A judge that answers from a script: `reply(prompt_text)` gives each output. It records the
/// prompts it saw and the most calls it had in flight at once.
type Reply = Box<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

pub struct ScriptedPolicy {
    reply: Reply,
    delay: Duration,
    in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub calls: AtomicUsize,
    pub prompts: Mutex<Vec<String>>,
}

impl ScriptedPolicy {
    pub fn new(reply: impl Fn(&str) -> Result<String, String> + Send + Sync + 'static) -> Self {
        Self {
            reply: Box::new(reply),
            delay: Duration::ZERO,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
            prompts: Mutex::new(Vec::new()),
        }
    }

    /// Always answers `text`.
    pub fn fixed(text: &str) -> Self {
        let text = text.to_owned();
        Self::new(move |_| Ok(text.clone()))
    }

    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

#[async_trait]
impl Generate for ScriptedPolicy {
    async fn generate(&self, request: GenerationRequest) -> roll_core::Result<Generation> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        let prompt = ByteTokenizer.decode(&request.prompt_ids)?;
        self.prompts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(prompt.clone());
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let text = (self.reply)(&prompt).map_err(Error::policy)?;
        Ok(Generation {
            token_ids: ByteTokenizer.encode(&text)?,
            logprobs: vec![],
            text,
            finish_reason: FinishReason::Stop,
            weight_version: WeightVersion(0),
        })
    }

    fn weight_version(&self) -> WeightVersion {
        WeightVersion(0)
    }
}
