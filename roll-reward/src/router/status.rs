//! [`MixerStatus`]: what a prompt mixer did and why it stopped, readable after the mixer has
//! moved into a scheduler.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Why a [`PromptMixer`](super::PromptMixer) stopped yielding prompts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MixerEnd {
    /// The source of `domain` could not fill its share of a batch. The prompts already drawn for
    /// that batch (`dropped`, of every domain) were not yielded: a batch is all or nothing, so
    /// the ratios hold in every batch that was (like a data loader's `drop_last`).
    Exhausted {
        /// The domain that ran dry.
        domain: String,
        /// Prompts drawn for the unfinished batch and dropped.
        dropped: usize,
    },
}

impl fmt::Display for MixerEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exhausted { domain, dropped } => write!(
                f,
                "the prompts of domain `{domain}` ran out ({dropped} prompts drawn for the \
                 unfinished batch were dropped)"
            ),
        }
    }
}

/// A handle on a mixer's counters and end, shared with the mixer: take it
/// ([`PromptMixer::status`](super::PromptMixer::status)) before handing the mixer to a
/// scheduler, and read it when the scheduler reports that its prompt source ran dry, to learn
/// which domain ran out.
#[derive(Debug, Clone, Default)]
pub struct MixerStatus {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    yielded: AtomicU64,
    skipped: AtomicU64,
    end: Mutex<Option<MixerEnd>>,
}

impl MixerStatus {
    /// Prompts the mixer has yielded.
    pub fn yielded(&self) -> u64 {
        self.inner.yielded.load(Ordering::Relaxed)
    }

    /// Prompts of a dataset passed over because their domain has ratio 0.
    pub fn skipped(&self) -> u64 {
        self.inner.skipped.load(Ordering::Relaxed)
    }

    /// Why the mixer stopped; `None` while it still yields.
    pub fn end(&self) -> Option<MixerEnd> {
        self.lock().clone()
    }

    pub(super) fn has_ended(&self) -> bool {
        self.lock().is_some()
    }

    pub(super) fn count_yielded(&self) {
        self.inner.yielded.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn count_skipped(&self, n: usize) {
        self.inner.skipped.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records why the mixer stopped (the first reason wins).
    pub(super) fn set_end(&self, end: MixerEnd) {
        let mut slot = self.lock();
        if slot.is_none() {
            *slot = Some(end);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<MixerEnd>> {
        // Every write is a single assignment, so a poisoned lock still holds a valid value.
        self.inner
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
