//! The caller's side of one generation request: await it, stream it, or abort it.

use super::sampler::SampledToken;
use crate::{BackendError, Result};
use roll_core::policy::Generation;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::mpsc::error::TryRecvError;

/// What the engine reports about a request, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// One new token.
    Token(SampledToken),
    /// The request was restarted from its prompt on new weights
    /// ([`InFlightPolicy::Requeue`](super::InFlightPolicy::Requeue)); tokens streamed before this
    /// event are void.
    Restarted,
    /// The request ended; nothing follows.
    Finished(Generation),
    /// The request failed; nothing follows.
    Failed(String),
}

/// A submitted request. Dropping it aborts the request.
#[derive(Debug)]
pub struct RequestHandle {
    pub(super) events: UnboundedReceiver<GenerationEvent>,
    pub(super) cancelled: Arc<AtomicBool>,
}

impl RequestHandle {
    /// Asks the engine to stop the request; it finishes with
    /// [`FinishReason::Abort`](roll_core::FinishReason::Abort) and the tokens produced so far.
    pub fn abort(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    /// A handle that can abort the request after `self` has been moved into an await.
    pub fn aborter(&self) -> Aborter {
        Aborter(self.cancelled.clone())
    }

    /// The next event, or `None` after the last one.
    pub async fn next_event(&mut self) -> Option<GenerationEvent> {
        self.events.recv().await
    }

    /// Blocking version of [`RequestHandle::next_event`] for code outside an async runtime.
    ///
    /// # Panics
    /// If called from within an async runtime (tokio forbids blocking there).
    pub fn next_event_blocking(&mut self) -> Option<GenerationEvent> {
        self.events.blocking_recv()
    }

    /// Waits for the end of the request.
    ///
    /// # Errors
    /// [`BackendError::Engine`] if the request failed or the engine stopped.
    pub async fn finish(mut self) -> Result<Generation> {
        while let Some(event) = self.events.recv().await {
            if let Some(done) = final_result(event) {
                return done;
            }
        }
        Err(engine_gone())
    }

    /// The end of the request if it has come, without waiting: `None` while it runs.
    /// Consumes the events that arrived so far (do not mix with [`RequestHandle::next_event`]).
    pub fn try_finish(&mut self) -> Option<Result<Generation>> {
        loop {
            match self.events.try_recv() {
                Ok(event) => {
                    if let Some(done) = final_result(event) {
                        return Some(done);
                    }
                }
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => return Some(Err(engine_gone())),
            }
        }
    }

    /// Blocking version of [`RequestHandle::finish`] for code outside an async runtime.
    ///
    /// # Errors
    /// As [`RequestHandle::finish`].
    ///
    /// # Panics
    /// If called from within an async runtime (tokio forbids blocking there).
    pub fn wait(mut self) -> Result<Generation> {
        while let Some(event) = self.events.blocking_recv() {
            if let Some(done) = final_result(event) {
                return done;
            }
        }
        Err(engine_gone())
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Aborts a request from anywhere.
#[derive(Debug, Clone)]
pub struct Aborter(Arc<AtomicBool>);

impl Aborter {
    /// See [`RequestHandle::abort`].
    pub fn abort(&self) {
        self.0.store(true, Ordering::Release);
    }
}

fn final_result(event: GenerationEvent) -> Option<Result<Generation>> {
    match event {
        GenerationEvent::Finished(g) => Some(Ok(g)),
        GenerationEvent::Failed(message) => Some(Err(BackendError::Engine(message))),
        GenerationEvent::Token(_) | GenerationEvent::Restarted => None,
    }
}

fn engine_gone() -> BackendError {
    BackendError::Engine("the inference engine stopped before the request finished".into())
}
