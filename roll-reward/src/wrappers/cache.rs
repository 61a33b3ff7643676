//! [`Cache`]: computes the reward of a repeated response once.

use crate::error::RewardError;
use async_trait::async_trait;
use roll_core::{Reward, RewardWorker, Sample};
use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Remembers the rewards of up to `capacity` (prompt, response) pairs and answers repeats from
/// memory — useful when a group holds identical responses, or for slow workers (a judge, a
/// sandbox).
///
/// The key is a 64-bit hash of the prompt's domain, text and ground truth and the response text
/// (a collision is as likely as 2⁻⁶⁴ per pair). The domain, not the dataset tag: the domain is
/// what decides the worker and so the reward, and it is resolved before scoring, so the same
/// question in two datasets of one domain is scored once. Only successes are cached; errors are retried.
/// When full, the oldest entry is evicted. Two concurrent misses on the same key both compute
/// (no request coalescing). A hit carries the detail `cache = hit`.
pub struct Cache<W> {
    inner: W,
    capacity: usize,
    state: Mutex<State>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Default)]
struct State {
    map: HashMap<u64, Reward>,
    order: VecDeque<u64>,
}

impl<W> Cache<W> {
    /// Wraps `inner` with room for `capacity` rewards.
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] if `capacity` is 0.
    pub fn new(inner: W, capacity: usize) -> Result<Self, RewardError> {
        if capacity == 0 {
            return Err(RewardError::invalid_config(
                "cache",
                "a capacity of 0 entries (leave the cache out instead)",
            ));
        }
        Ok(Self {
            inner,
            capacity,
            state: Mutex::new(State::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// How many scores were answered from memory.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// How many scores went to the inner worker.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// Number of cached rewards.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is consistent after every statement, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The cache key: what the reward depends on (see [`Cache`]).
fn key(sample: &Sample) -> u64 {
    let mut h = DefaultHasher::new();
    sample.prompt.domain.hash(&mut h);
    sample.prompt.text.hash(&mut h);
    sample.prompt.ground_truth.hash(&mut h);
    sample.text.hash(&mut h);
    h.finish()
}

#[async_trait]
impl<W: RewardWorker> RewardWorker for Cache<W> {
    async fn score(&self, sample: &Sample) -> roll_core::Result<Reward> {
        let k = key(sample);
        if let Some(r) = self.lock().map.get(&k) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(r.clone().with_detail("cache", "hit"));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.score(sample).await?;
        let mut state = self.lock();
        if state.map.insert(k, r.clone()).is_none() {
            state.order.push_back(k);
            while state.order.len() > self.capacity {
                if let Some(old) = state.order.pop_front() {
                    state.map.remove(&old);
                }
            }
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrappers::RewardWorkerExt;
    use crate::wrappers::test_support::sample;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test]
    async fn repeats_are_served_from_memory_and_old_entries_evicted() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let w = (move |s: &Sample| {
            c.fetch_add(1, Ordering::SeqCst);
            s.text.len() as f32
        })
        .cached(2)
        .unwrap();
        assert_eq!(w.score(&sample("aa")).await.unwrap().value, 2.0);
        let hit = w.score(&sample("aa")).await.unwrap();
        assert_eq!((hit.value, hit.details["cache"].as_str()), (2.0, "hit"));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        w.score(&sample("b")).await.unwrap();
        w.score(&sample("ccc")).await.unwrap(); // evicts "aa"
        assert_eq!(w.len(), 2);
        w.score(&sample("aa")).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!((w.hits(), w.misses()), (1, 4));
    }

    #[tokio::test]
    async fn entries_are_keyed_by_domain_not_by_tag() {
        use roll_core::{GroupId, Prompt, PromptId, SampleId};
        let of = |tag: &str, domain: &str| {
            let p = Prompt::new(PromptId(0), "2+2?", tag)
                .with_domain(domain)
                .with_ground_truth("4");
            let mut s = Sample::new(SampleId(0), GroupId(0), Arc::new(p), vec![]);
            s.text = "4".into();
            s
        };
        let w = (|s: &Sample| s.text.len() as f32).cached(8).unwrap();
        w.score(&of("gsm8k", "math")).await.unwrap();
        let hit = w.score(&of("math500", "math")).await.unwrap();
        assert_eq!(hit.details["cache"].as_str(), "hit");
        w.score(&of("gsm8k", "arith")).await.unwrap();
        assert_eq!((w.hits(), w.misses()), (1, 2));
    }

    #[tokio::test]
    async fn errors_are_not_cached() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let w = (move |_: &Sample| -> Result<f32, String> {
            c.fetch_add(1, Ordering::SeqCst);
            Err("boom".into())
        })
        .cached(4)
        .unwrap();
        assert!(w.score(&sample("a")).await.is_err());
        assert!(w.score(&sample("a")).await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(w.is_empty());
        assert!((|_: &Sample| 1.0f32).cached(0).is_err());
    }
}
