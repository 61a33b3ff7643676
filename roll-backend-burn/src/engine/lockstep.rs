//! Engines that step together: the ranks of an expert-parallel model
//! ([`CausalLm::shard_experts`](crate::CausalLm::shard_experts)) each run an engine with requests
//! of their own, and every mixture layer of every forward sends tokens to the ranks holding their
//! experts and waits for the answers — so no rank may step, or skip a step, alone.
//!
//! Each iteration of the engine loop, after taking commands, retiring aborted requests and
//! admitting queued ones, the ranks agree in one all-reduce on:
//! - whether any rank still has work or callers (when none has, all stop together — an engine
//!   whose handle is dropped keeps serving its peers' tokens until they are done);
//! - whether any rank has sequences running: then **every** rank steps, a rank with none of its
//!   own serving the others' tokens with its experts;
//! - the oldest weight version any rank's running sequences use: a step makes one forward call
//!   per version from that one to the current, in order, on every rank (with no inputs where a
//!   rank has none on that version), so that each call's exchanges meet the same weights on
//!   every rank — which is why an engine keeps the weights of older versions while a peer may
//!   still decode on them;
//! - how many weight syncs every rank has received: a sync is applied on all ranks in the same
//!   iteration, after that iteration's step, and answered then. A caller's sync therefore
//!   returns once every rank's has arrived; each rank must sync (the same weights, divided
//!   among the same ranks) for any of them to switch.
//!
//! The forward calls themselves are the backend's business ([`DecodeBackend::peers`] says what
//! it owes): the device decoder runs a call's inputs through the layers together and exchanges
//! all their tokens at a mixture at once, so every rank meets every other at each mixture layer
//! once per call, a rank with no inputs serving the others' tokens.
//! A failed agreement (a peer gone) fails every request of the engine and stops it: a group
//! missing a rank cannot compute a mixture.

use super::backend::DecodeBackend;
use crate::{BackendError, Result};
use roll_core::WeightVersion;
use roll_core::strategy::{ReduceOp, Strategy};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A weight sync received and not yet applied, with its caller's answer.
pub(super) type PendingSync<B> = (Arc<B>, oneshot::Sender<Result<WeightVersion>>);

/// What one rank brings to an agreement.
#[derive(Debug, Clone, Copy)]
pub(super) struct Local {
    /// Requests queued or running, or callers still able to submit.
    pub alive: bool,
    /// Sequences running.
    pub running: bool,
    /// The oldest weight version its running sequences use (the current one when none run).
    pub oldest: WeightVersion,
    /// The version new requests use.
    pub current: WeightVersion,
}

/// What the ranks agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Agreed {
    /// Some rank has work or callers left.
    pub alive: bool,
    /// Some rank has sequences running: every rank steps.
    pub running: bool,
    /// The oldest version any rank's running sequences use.
    pub oldest: WeightVersion,
    /// Weight syncs every rank has received, to apply now.
    pub syncs: usize,
}

/// An engine's side of stepping with its peers.
pub(super) struct Lockstep<B> {
    peers: Arc<dyn Strategy>,
    /// Weight syncs received, in order, applied when every peer has received them.
    pending: VecDeque<PendingSync<B>>,
    /// Weights of versions before the current one that a peer may still decode on.
    retained: Vec<(WeightVersion, Arc<B>)>,
    /// Whether some rank had sequences running at the last agreement: an idle rank then does
    /// not wait for commands before the next one.
    peers_running: bool,
}

impl<B: DecodeBackend> Lockstep<B> {
    pub(super) fn new(peers: Arc<dyn Strategy>) -> Self {
        Self {
            peers,
            pending: VecDeque::new(),
            retained: Vec::new(),
            peers_running: false,
        }
    }

    /// Whether some rank had sequences running at the last agreement.
    pub(super) fn peers_running(&self) -> bool {
        self.peers_running
    }

    /// Queues a weight sync until every peer has received its own.
    pub(super) fn hold(&mut self, sync: PendingSync<B>) {
        self.pending.push_back(sync);
    }

    /// The oldest held sync (to apply, once agreed).
    pub(super) fn next_sync(&mut self) -> Option<PendingSync<B>> {
        self.pending.pop_front()
    }

    /// Every held sync, when the engine stops.
    pub(super) fn drain_syncs(&mut self) -> impl Iterator<Item = PendingSync<B>> + '_ {
        self.pending.drain(..)
    }

    /// One all-reduce (the maximum; minima as negated maxima). Versions travel as `f32`, exact
    /// below 2²⁴ syncs.
    ///
    /// # Errors
    /// A failed collective, or peers whose engines are at other weight versions (started at
    /// another version, or synced apart).
    pub(super) fn agree(&mut self, local: Local) -> Result<Agreed> {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        let mut values = [
            flag(local.alive),
            flag(local.running),
            -(local.oldest.0 as f32),
            -(self.pending.len() as f32),
            local.current.0 as f32,
            -(local.current.0 as f32),
        ];
        self.peers
            .all_reduce(&mut values, ReduceOp::Max)
            .map_err(|e| BackendError::Collective(Box::new(e)))?;
        let (newest, oldest_current) = (values[4], -values[5]);
        if newest != oldest_current {
            return Err(BackendError::Engine(format!(
                "the engines stepping together serve different weight versions ({oldest_current} \
                 to {newest}): every rank must start at the same version and receive every sync"
            )));
        }
        self.peers_running = values[1] > 0.0;
        Ok(Agreed {
            alive: values[0] > 0.0,
            running: self.peers_running,
            oldest: WeightVersion((-values[2]) as u64),
            syncs: (-values[3]) as usize,
        })
    }

    /// Keeps `weights` of `version`, replaced by a sync, while a peer may decode on them.
    pub(super) fn retain(&mut self, version: WeightVersion, weights: Arc<B>) {
        self.retained.push((version, weights));
    }

    /// The kept weights of `version`.
    pub(super) fn weights_of(&self, version: WeightVersion) -> Option<&Arc<B>> {
        self.retained
            .iter()
            .find_map(|(v, w)| (*v == version).then_some(w))
    }

    /// Drops the weights of versions no rank decodes on any more (older than `oldest`: new
    /// sequences only ever take the current version).
    pub(super) fn release_before(&mut self, oldest: WeightVersion) {
        self.retained.retain(|(v, _)| *v >= oldest);
    }
}
