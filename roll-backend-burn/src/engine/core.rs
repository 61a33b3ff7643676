//! The engine thread: admission, continuous batching, sampling, finishing.
//!
//! Each iteration (a *step*) the loop
//! 1. takes new commands (requests, weight syncs) without blocking, or blocks when idle;
//! 2. finishes aborted requests (queued or running) with the tokens they have;
//! 3. admits queued requests in arrival order while a sequence slot and their cache reservation
//!    (`prompt + max_new_tokens`) are free;
//! 4. builds one batch under the token budget — one token for every decoding sequence, then
//!    prompt chunks — and runs it, one forward per weight version in use;
//! 5. samples a token for every sequence whose pending tokens are all fed, streams it, and
//!    retires sequences that hit a stop token, a stop string or their length limit.
//!
//! Requests therefore join and leave the running batch one by one, between any two steps.
//!
//! Where the weights exchange with other ranks' engines ([`DecodeBackend::peers`]), the ranks
//! agree before each step and step together: see [`lockstep`](super::lockstep).

use super::backend::{CacheConfig, Continuation, DecodeBackend, SeqId, StepInput};
use super::config::{EngineConfig, InFlightPolicy};
use super::lockstep::{Local, Lockstep};
use super::prefix::{PrefixMatch, PrefixPark};
use super::request::GenerationEvent;
use super::sampler::{SampledToken, SplitMix64, TokenSampler};
use crate::{BackendError, Result};
use roll_core::policy::{Generation, GenerationRequest};
use roll_core::{FinishReason, Tokenizer, WeightVersion};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

/// A message to the engine thread.
pub(super) enum Command<B> {
    /// A new request.
    Submit(Box<Submission>),
    /// New weights; the reply carries the new version.
    Sync {
        weights: Arc<B>,
        reply: oneshot::Sender<Result<WeightVersion>>,
    },
}

/// A request as the engine thread receives it.
pub(super) struct Submission {
    pub request: GenerationRequest,
    pub events: UnboundedSender<GenerationEvent>,
    pub cancelled: Arc<AtomicBool>,
    pub arrival: u64,
}

/// Counters the engine publishes.
#[derive(Debug, Default)]
pub(super) struct SharedStats {
    pub version: AtomicU64,
    pub steps: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prefill_tokens: AtomicU64,
    pub reused_tokens: AtomicU64,
    pub running: AtomicU64,
    pub queued: AtomicU64,
    /// Why the engine thread stopped on its own, when it did (its peers were gone).
    pub stopped: std::sync::Mutex<Option<String>>,
}

impl SharedStats {
    /// Why the engine stopped, for an error to a caller.
    pub(super) fn stop_reason(&self) -> String {
        match self.stopped.lock().ok().and_then(|r| r.clone()) {
            Some(reason) => format!("the engine thread has stopped: {reason}"),
            None => "the engine thread has stopped".to_string(),
        }
    }
}

struct Sequence<B> {
    id: SeqId,
    sub: Submission,
    seed: u64,
    sampler: TokenSampler,
    weights: Arc<B>,
    version: WeightVersion,
    /// Prompt followed by generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    logprobs: Vec<f32>,
    /// Tokens of `tokens` already in the cache.
    cached: usize,
    /// Cache tokens reserved for this sequence.
    reserved: usize,
}

impl<B> Sequence<B> {
    fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
    fn is_aborted(&self) -> bool {
        aborted(&self.sub)
    }
}

fn aborted(sub: &Submission) -> bool {
    sub.cancelled.load(Ordering::Acquire)
        || sub.request.abort.is_aborted()
        || sub.events.is_closed()
}

/// Sequences that share weights, and how many tokens each feeds this step.
struct Group<B> {
    weights: Arc<B>,
    version: WeightVersion,
    members: Vec<(usize, usize)>,
}

/// Where a prompt's opening positions come from when another sequence has them: copied from
/// its cache entry before the step, or from the keys and values it writes in the step.
enum Share {
    /// `from`'s first `len` cached positions.
    Cached { from: usize, len: usize },
    /// The first `len` positions `from` has cached or computes in this step.
    Computed { from: usize, len: usize },
}

/// How a sequence leaves the running batch.
enum Outcome {
    /// Finished, with its text when a stop string cut it.
    Done(FinishReason, Option<String>),
    /// Failed with this message.
    Failed(String),
}

pub(super) struct EngineLoop<B: DecodeBackend> {
    config: EngineConfig,
    tokenizer: Option<Arc<dyn Tokenizer>>,
    weights: Arc<B>,
    version: WeightVersion,
    cache: B::Cache,
    queue: VecDeque<Submission>,
    running: Vec<Sequence<B>>,
    /// Cache tokens reserved by running sequences.
    reserved: usize,
    /// Finished sequences' entries kept for prefix reuse (their tokens are not in `reserved`).
    park: PrefixPark,
    next_seq: u64,
    /// Where the next step starts serving decode tokens (round robin under a tight budget).
    decode_cursor: usize,
    stats: Arc<SharedStats>,
    /// The peers this engine steps with, when its weights exchange with theirs.
    lockstep: Option<Lockstep<B>>,
}

impl<B: DecodeBackend> EngineLoop<B> {
    pub(super) fn new(
        weights: B,
        config: EngineConfig,
        tokenizer: Option<Arc<dyn Tokenizer>>,
        stats: Arc<SharedStats>,
    ) -> Result<Self> {
        let cache = weights.new_cache(&CacheConfig {
            max_seqs: config.max_seqs,
            max_cached_tokens: config.max_cached_tokens,
        })?;
        let version = WeightVersion(config.start_version);
        stats.version.store(version.0, Ordering::Release);
        let lockstep = weights.peers().map(Lockstep::new);
        Ok(Self {
            config,
            tokenizer,
            weights: Arc::new(weights),
            version,
            cache,
            queue: VecDeque::new(),
            running: Vec::new(),
            reserved: 0,
            park: PrefixPark::default(),
            next_seq: 0,
            decode_cursor: 0,
            stats,
            lockstep,
        })
    }

    /// Serves until every sender of `commands` is gone and no work is left (on every peer's
    /// engine too, when it steps with peers).
    pub(super) fn run(mut self, commands: Receiver<Command<B>>) {
        if self.lockstep.is_some() {
            return self.run_with_peers(commands);
        }
        let mut open = true;
        loop {
            open &= self.take_commands(&commands);
            if !open && self.queue.is_empty() && self.running.is_empty() {
                return;
            }
            self.retire_aborted();
            self.admit();
            if self.running.is_empty() {
                continue;
            }
            self.step(None);
            self.publish();
        }
    }

    /// [`EngineLoop::run`] for an engine that steps with its peers (see
    /// [`lockstep`](super::lockstep)): one agreement per iteration, a step on every rank when
    /// any has sequences running, syncs applied together.
    fn run_with_peers(mut self, commands: Receiver<Command<B>>) {
        let mut open = true;
        loop {
            open &= self.take_commands(&commands);
            self.retire_aborted();
            self.admit();
            let current = self.version;
            let local = Local {
                alive: open || !self.queue.is_empty() || !self.running.is_empty(),
                running: !self.running.is_empty(),
                oldest: self
                    .running
                    .iter()
                    .map(|s| s.version)
                    .min()
                    .unwrap_or(current),
                current,
            };
            let Some(lockstep) = self.lockstep.as_mut() else {
                return;
            };
            let agreed = match lockstep.agree(local) {
                Ok(agreed) => agreed,
                Err(e) => return self.fail_all(&e.to_string()),
            };
            if !agreed.alive {
                // Syncs not every rank received: their callers hear that the engine stopped.
                return;
            }
            if agreed.running {
                self.step(Some(agreed.oldest));
            }
            for _ in 0..agreed.syncs {
                let Some((weights, reply)) = self.lockstep.as_mut().and_then(Lockstep::next_sync)
                else {
                    break;
                };
                let _ = reply.send(self.sync(weights));
            }
            if let Some(lockstep) = self.lockstep.as_mut() {
                lockstep.release_before(agreed.oldest);
            }
            self.publish();
        }
    }

    /// Fails every request, queued or running, and every held weight sync with `message`: the
    /// engine stops (its peers are gone).
    fn fail_all(&mut self, message: &str) {
        tracing::error!("inference engine stopped: {message}");
        if let Ok(mut stopped) = self.stats.stopped.lock() {
            *stopped = Some(message.to_string());
        }
        for sub in self.queue.drain(..) {
            let _ = sub
                .events
                .send(GenerationEvent::Failed(message.to_string()));
        }
        for seq in std::mem::take(&mut self.running) {
            self.weights.release(&mut self.cache, seq.id);
            let _ = seq
                .sub
                .events
                .send(GenerationEvent::Failed(message.to_string()));
        }
        self.reserved = 0;
        if let Some(lockstep) = self.lockstep.as_mut() {
            for (_, reply) in lockstep.drain_syncs() {
                let _ = reply.send(Err(BackendError::Engine(message.to_string())));
            }
        }
        self.publish();
    }

    /// Drains pending commands; blocks briefly when there is nothing to do (here, and at the
    /// peers stepping with this engine). Returns whether the channel is still open.
    fn take_commands(&mut self, commands: &Receiver<Command<B>>) -> bool {
        let peers_running = self.lockstep.as_ref().is_some_and(Lockstep::peers_running);
        if self.running.is_empty() && !peers_running {
            // Idle (or only blocked queue heads, which an abort may unblock): wait, but wake up
            // now and then to look at abort flags.
            match commands.recv_timeout(Duration::from_millis(20)) {
                Ok(cmd) => self.handle(cmd),
                Err(RecvTimeoutError::Timeout) => return true,
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(cmd) => self.handle(cmd),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn handle(&mut self, cmd: Command<B>) {
        match cmd {
            Command::Submit(sub) => self.queue.push_back(*sub),
            Command::Sync { weights, reply } => {
                if let Err(e) = self.check_sync(&weights) {
                    let _ = reply.send(Err(e));
                    return;
                }
                match self.lockstep.as_mut() {
                    // Applied when every peer has received its own (see `run_with_peers`).
                    Some(lockstep) => lockstep.hold((weights, reply)),
                    None => {
                        let _ = reply.send(self.sync(weights));
                    }
                }
            }
        }
    }

    /// Whether `weights` can replace the running ones: the same architecture, divided among the
    /// same ranks (an expert-parallel model's place in its group).
    fn check_sync(&self, weights: &B) -> Result<()> {
        if !weights.fits(&self.cache) {
            return Err(BackendError::Engine(
                "new weights have another architecture than the running model".into(),
            ));
        }
        let place = |w: &B| w.peers().map(|p| (p.rank(), p.world_size()));
        let (new, old) = (place(weights), place(&self.weights));
        if new != old {
            let say = |p: Option<(usize, usize)>| match p {
                Some((rank, size)) => format!("rank {rank} of {size} expert-parallel ranks"),
                None => "a whole model".to_string(),
            };
            return Err(BackendError::Engine(format!(
                "new weights are {} but the engine serves {}: sync each rank with its own part \
                 of the same group",
                say(new),
                say(old)
            )));
        }
        Ok(())
    }

    /// Switches to `weights` (checked by [`EngineLoop::check_sync`]).
    fn sync(&mut self, weights: Arc<B>) -> Result<WeightVersion> {
        self.check_sync(&weights)?;
        let old = std::mem::replace(&mut self.weights, weights);
        if let Some(lockstep) = self.lockstep.as_mut() {
            lockstep.retain(self.version, old);
        }
        self.version = self.version.next();
        // Parked prefixes were computed by the old weights.
        for seq in self.park.clear() {
            self.weights.release(&mut self.cache, seq);
        }
        self.stats.version.store(self.version.0, Ordering::Release);
        if self.config.on_weight_sync == InFlightPolicy::Requeue {
            for seq in &mut self.running {
                self.weights.release(&mut self.cache, seq.id);
                seq.tokens.truncate(seq.prompt_len);
                seq.logprobs.clear();
                seq.cached = 0;
                seq.weights = self.weights.clone();
                seq.version = self.version;
                // Same parameters and seed were accepted before; cannot fail.
                if let Ok(sampler) = TokenSampler::new(&seq.sub.request.params, seq.seed) {
                    seq.sampler = sampler;
                }
                let _ = seq.sub.events.send(GenerationEvent::Restarted);
            }
        }
        Ok(self.version)
    }

    fn retire_aborted(&mut self) {
        self.queue.retain(|sub| {
            if aborted(sub) {
                let _ = sub.events.send(GenerationEvent::Finished(Generation {
                    token_ids: Vec::new(),
                    logprobs: Vec::new(),
                    text: String::new(),
                    finish_reason: FinishReason::Abort,
                    weight_version: WeightVersion::default(),
                }));
                false
            } else {
                true
            }
        });
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].is_aborted() {
                let seq = self.running.swap_remove(i);
                self.finish(seq, FinishReason::Abort, None);
            } else {
                i += 1;
            }
        }
    }

    /// Admits queued requests in order while they fit, each taking over the parked entry that
    /// holds the longest prefix of its prompt, if any.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_seqs {
            let Some(sub) = self.queue.front() else {
                return;
            };
            let need = sub.request.prompt_ids.len() + sub.request.params.max_new_tokens as usize;
            let found = if self.config.prefix_cache {
                self.park.best_match(&sub.request.prompt_ids)
            } else {
                None
            };
            if !self.make_room(need, found.as_ref()) {
                return;
            }
            let Some(sub) = self.queue.pop_front() else {
                return;
            };
            let seed = sub
                .request
                .params
                .seed
                .unwrap_or_else(|| SplitMix64::new(self.config.seed ^ sub.arrival).next_u64());
            let sampler = match TokenSampler::new(&sub.request.params, seed) {
                Ok(s) => s,
                Err(e) => {
                    let _ = sub.events.send(GenerationEvent::Failed(e.to_string()));
                    continue;
                }
            };
            self.reserved += need;
            let (id, cached) = match found {
                Some(found) => {
                    self.park.take(found.seq);
                    self.weights
                        .truncate(&mut self.cache, found.seq, found.reused);
                    self.count_reused(found.reused as u64);
                    (found.seq, found.reused)
                }
                None => {
                    self.next_seq += 1;
                    (SeqId(self.next_seq), 0)
                }
            };
            let tokens = sub.request.prompt_ids.clone();
            self.running.push(Sequence {
                id,
                prompt_len: tokens.len(),
                tokens,
                logprobs: Vec::new(),
                cached,
                reserved: need,
                seed,
                sampler,
                weights: self.weights.clone(),
                version: self.version,
                sub,
            });
        }
    }

    /// The longest run of opening tokens that sequence `i`'s prompt (all of it but its last
    /// token, whose logits it samples from) shares with another sequence on the same weights,
    /// where that is more than `i` has cached: positions the other has cached ([`Share::Cached`]),
    /// or computes in this step (`fed`: the tokens each sequence is fed in it, `None` for one
    /// not fed or continuing another; [`Share::Computed`]). `None` where nothing longer is
    /// shared, or the weights cannot take positions from another sequence.
    fn longest_share(&self, i: usize, fed: &[Option<usize>]) -> Option<Share> {
        let seq = &self.running[i];
        if seq.cached + 1 >= seq.prompt_len || !seq.weights.continues_prompts() {
            return None;
        }
        let prompt = &seq.tokens[..seq.prompt_len - 1];
        let (from, len, cached) = self
            .running
            .iter()
            .enumerate()
            .filter(|&(j, r)| j != i && r.version == seq.version)
            .map(|(j, r)| {
                let known = r.cached + fed[j].unwrap_or(0);
                let len = prompt
                    .iter()
                    .zip(&r.tokens[..known])
                    .take_while(|(a, b)| a == b)
                    .count();
                (j, len, r.cached)
            })
            .max_by_key(|&(j, len, _)| (len, std::cmp::Reverse(j)))?;
        let share = if len <= cached {
            Share::Cached { from, len }
        } else {
            Share::Computed { from, len }
        };
        (len > seq.cached).then_some(share)
    }

    /// Gives sequence `i` a copy of the first `len` positions sequence `from` has cached, in
    /// place of what it had cached (a shorter run); if the copy fails, `i` computes its prompt
    /// whole.
    fn copy_cached(&mut self, i: usize, from: usize, len: usize) {
        let had = self.drop_cached(i);
        let (to, from) = (self.running[i].id, self.running[from].id);
        let weights = self.running[i].weights.clone();
        match weights.fork(&mut self.cache, from, to, len) {
            Ok(()) => {
                self.running[i].cached = len;
                self.count_reused(len.saturating_sub(had) as u64);
            }
            Err(e) => {
                // It computes its prompt whole, the positions it had included.
                self.stats
                    .reused_tokens
                    .fetch_sub(had as u64, Ordering::Relaxed);
                tracing::warn!("cannot copy a cached prefix: {e}");
            }
        }
    }

    /// Forgets what sequence `i` has cached (a prefix it will take from another sequence, which
    /// shares more), returning how many positions that was.
    fn drop_cached(&mut self, i: usize) -> usize {
        let seq = &mut self.running[i];
        let had = std::mem::take(&mut seq.cached);
        if had > 0 {
            seq.weights.release(&mut self.cache, seq.id);
        }
        had
    }

    /// Counts `tokens` prompt tokens not computed.
    fn count_reused(&self, tokens: u64) {
        self.stats
            .reused_tokens
            .fetch_add(tokens, Ordering::Relaxed);
        metrics::counter!("roll_engine_prompt_tokens_reused_total").increment(tokens);
    }

    /// Evicts parked entries, least recently parked first and never `keep` (the entry the
    /// request will adopt, whose positions become part of its reservation), until a request
    /// reserving `need` tokens fits beside the running requests and the parked entries left, in
    /// tokens and in sequence slots. False if it does not fit even with nothing parked.
    fn make_room(&mut self, need: usize, keep: Option<&PrefixMatch>) -> bool {
        loop {
            let parked_tokens = self.park.tokens() - keep.map_or(0, |k| k.held);
            let parked_seqs = self.park.len() - usize::from(keep.is_some());
            if self.reserved + need + parked_tokens <= self.config.max_cached_tokens
                && self.running.len() + 1 + parked_seqs <= self.config.max_seqs
            {
                return true;
            }
            match self.park.evict_oldest(keep.map(|k| k.seq)) {
                Some(seq) => self.weights.release(&mut self.cache, seq),
                None => return false,
            }
        }
    }

    /// One batched forward (per weight version) and one sampling round. With peers, `oldest` is
    /// the oldest version any of them decodes on: one call per version from it to the current,
    /// in order, with no inputs where this engine has none on it (see
    /// [`lockstep`](super::lockstep)).
    fn step(&mut self, oldest: Option<WeightVersion>) {
        // Decode tokens first (one each, oldest first), then prompt chunks.
        let mut budget = self.config.max_batch_tokens;
        let mut plan: Vec<(usize, usize)> = Vec::new(); // (running index, tokens fed)
        // When the budget is smaller than the decoding batch, start where the last step stopped,
        // so every sequence advances in turn.
        let n = self.running.len();
        let start = self.decode_cursor;
        for k in 0..n {
            let i = (start + k) % n;
            if self.running[i].tokens.len() - self.running[i].cached == 1 && budget > 0 {
                plan.push((i, 1));
                budget -= 1;
                self.decode_cursor = i + 1;
            }
        }
        // A prompt that opens with tokens another sequence has cached or computes in this step
        // (the samples of one prompt, a common system prompt) takes them from it instead of
        // computing them: copied now, or continued in the call (`(continuing, continued,
        // shared positions)`).
        let mut fed: Vec<Option<usize>> = vec![None; n];
        for &(i, k) in &plan {
            fed[i] = Some(k);
        }
        let mut continuations: Vec<(usize, usize, usize)> = Vec::new();
        for i in 0..n {
            let pending = self.running[i].tokens.len() - self.running[i].cached;
            if pending <= 1 || budget == 0 {
                continue;
            }
            let share = if self.config.prefix_cache {
                self.longest_share(i, &fed)
            } else {
                None
            };
            let continued = match share {
                Some(Share::Cached { from, len }) => {
                    self.copy_cached(i, from, len);
                    None
                }
                Some(Share::Computed { from, len }) => {
                    let had = self.drop_cached(i);
                    self.count_reused((len - had) as u64);
                    Some((from, len))
                }
                None => None,
            };
            let seq = &self.running[i];
            let start = continued.map_or(seq.cached, |(_, len)| len);
            let k = (seq.tokens.len() - start).min(budget);
            match continued {
                Some((from, len)) => continuations.push((i, from, len)),
                None => fed[i] = Some(k),
            }
            plan.push((i, k));
            budget -= k;
        }
        for &(i, _, len) in &continuations {
            self.running[i].cached = len;
        }
        let mut prefill = 0u64;
        let mut failed: Vec<(usize, String)> = Vec::new();
        // Group by weight version, oldest first; usually there is one group.
        let mut groups: Vec<Group<B>> = Vec::new();
        for &(i, n) in &plan {
            let seq = &self.running[i];
            match groups.iter_mut().find(|g| g.version == seq.version) {
                Some(g) => g.members.push((i, n)),
                None => groups.push(Group {
                    weights: seq.weights.clone(),
                    version: seq.version,
                    members: vec![(i, n)],
                }),
            }
        }
        if let Some(oldest) = oldest {
            self.add_empty_groups(&mut groups, oldest);
        }
        groups.sort_by_key(|g| g.version);
        // A call with no inputs of this engine's serves its peers' tokens: a step too.
        let ran = !groups.is_empty();
        // Each group's call, sampling every sequence whose pending tokens it feeds to the end.
        let mut sampled: Vec<(usize, Result<SampledToken>)> = Vec::new();
        for Group {
            weights, members, ..
        } in groups
        {
            let draws: Vec<_> = members
                .iter()
                .map(|&(i, n)| {
                    let seq = &mut self.running[i];
                    (seq.cached + n == seq.tokens.len()).then(|| seq.sampler.next_draw())
                })
                .collect();
            let inputs: Vec<StepInput<'_>> = members
                .iter()
                .map(|&(i, n)| {
                    let seq = &self.running[i];
                    StepInput {
                        seq: seq.id,
                        tokens: &seq.tokens[seq.cached..seq.cached + n],
                        start: seq.cached,
                    }
                })
                .collect();
            let continuing: Vec<Continuation> = continuations
                .iter()
                .filter(|c| members.iter().any(|m| m.0 == c.0))
                .map(|&(i, head, len)| Continuation {
                    from: self.running[head].id,
                    to: self.running[i].id,
                    len,
                })
                .collect();
            let result =
                weights.forward_sample_continuing(&mut self.cache, &inputs, &continuing, &draws);
            match result {
                Ok(picked) => {
                    for (&(i, n), token) in members.iter().zip(picked) {
                        let seq = &mut self.running[i];
                        let before = seq.cached.min(seq.prompt_len);
                        seq.cached += n;
                        prefill += (seq.cached.min(seq.prompt_len) - before) as u64;
                        if let Some(token) = token {
                            sampled.push((i, token));
                        }
                    }
                }
                Err(e) => {
                    // The whole call failed: its sequences fail, the engine goes on.
                    failed.extend(members.iter().map(|&(i, _)| (i, e.to_string())));
                }
            }
        }
        if ran {
            self.stats.steps.fetch_add(1, Ordering::Relaxed);
        }
        self.stats
            .prefill_tokens
            .fetch_add(prefill, Ordering::Relaxed);
        metrics::counter!("roll_engine_prompt_tokens_computed_total").increment(prefill);

        let mut outcomes: Vec<(usize, Outcome)> = failed
            .into_iter()
            .map(|(i, e)| (i, Outcome::Failed(e)))
            .collect();
        let mut generated = 0u64;
        for (i, token) in sampled {
            let seq = &mut self.running[i];
            let token = match token {
                Ok(t) => t,
                Err(e) => {
                    outcomes.push((i, Outcome::Failed(e.to_string())));
                    continue;
                }
            };
            seq.tokens.push(token.id);
            seq.logprobs.push(token.logprob);
            generated += 1;
            let _ = seq.sub.events.send(GenerationEvent::Token(token));
            if let Some((reason, text)) = self.finish_reason(i, token.id) {
                outcomes.push((i, Outcome::Done(reason, text)));
            }
        }
        self.stats
            .generated_tokens
            .fetch_add(generated, Ordering::Relaxed);
        metrics::counter!("roll_engine_generated_tokens_total").increment(generated);
        // Remove from the highest index down so indices stay valid.
        outcomes.sort_by_key(|o| std::cmp::Reverse(o.0));
        outcomes.dedup_by_key(|o| o.0);
        for (i, outcome) in outcomes {
            let seq = self.running.swap_remove(i);
            match outcome {
                Outcome::Done(reason, text) => self.finish(seq, reason, text),
                Outcome::Failed(message) => {
                    self.weights.release(&mut self.cache, seq.id);
                    self.reserved -= seq.reserved;
                    let _ = seq.sub.events.send(GenerationEvent::Failed(message));
                }
            }
        }
    }

    /// A group with no members for every version from `oldest` to the current that `groups`
    /// lacks: a call with no inputs, so that this engine's weights of that version serve its
    /// peers' tokens.
    fn add_empty_groups(&self, groups: &mut Vec<Group<B>>, oldest: WeightVersion) {
        let Some(lockstep) = self.lockstep.as_ref() else {
            return;
        };
        for v in oldest.0..=self.version.0 {
            let version = WeightVersion(v);
            if groups.iter().any(|g| g.version == version) {
                continue;
            }
            let weights = if version == self.version {
                Some(&self.weights)
            } else {
                lockstep.weights_of(version)
            };
            // Every version from the group's oldest in use is kept (`Lockstep::release_before`).
            if let Some(weights) = weights {
                groups.push(Group {
                    weights: weights.clone(),
                    version,
                    members: Vec::new(),
                });
            }
        }
    }

    /// Why sequence `i` ends after sampling `token`, with its final text when a stop string cut it.
    fn finish_reason(&self, i: usize, token: u32) -> Option<(FinishReason, Option<String>)> {
        let seq = &self.running[i];
        let params = &seq.sub.request.params;
        if params.stop_token_ids.contains(&token) || self.config.eos_token_ids.contains(&token) {
            // The stop token stays in `token_ids` (it was sampled and has a log-prob) but not in
            // the text, as vLLM does for EOS.
            let generated = seq.generated();
            let text = self
                .tokenizer
                .as_ref()
                .and_then(|tok| tok.decode(&generated[..generated.len() - 1]).ok());
            return Some((FinishReason::Stop, text));
        }
        if !params.stop.is_empty()
            && let Some(tok) = &self.tokenizer
            && let Ok(text) = tok.decode(seq.generated())
            && let Some(cut) = params
                .stop
                .iter()
                .filter(|s| !s.is_empty())
                .filter_map(|s| text.find(s.as_str()))
                .min()
        {
            return Some((FinishReason::Stop, Some(text[..cut].to_string())));
        }
        if seq.generated().len() >= params.max_new_tokens as usize {
            return Some((FinishReason::Length, None));
        }
        None
    }

    fn finish(&mut self, seq: Sequence<B>, reason: FinishReason, text: Option<String>) {
        self.reserved -= seq.reserved;
        let text = match (text, &self.tokenizer) {
            (Some(t), _) => t,
            (None, Some(tok)) => tok.decode(seq.generated()).unwrap_or_default(),
            (None, None) => String::new(),
        };
        let generation = Generation {
            token_ids: seq.generated().to_vec(),
            logprobs: seq.logprobs,
            text,
            finish_reason: reason,
            weight_version: seq.version,
        };
        let _ = seq.sub.events.send(GenerationEvent::Finished(generation));
        // A finished sequence's entry is kept for a request that extends it (the next turn of
        // a conversation) if the current weights computed it; an aborted one has no next turn.
        if self.config.prefix_cache
            && reason != FinishReason::Abort
            && seq.cached > 0
            && Arc::ptr_eq(&seq.weights, &self.weights)
        {
            let mut tokens = seq.tokens;
            tokens.truncate(seq.cached);
            self.park.park(seq.id, tokens);
        } else {
            seq.weights.release(&mut self.cache, seq.id);
        }
    }

    fn publish(&self) {
        self.stats
            .running
            .store(self.running.len() as u64, Ordering::Relaxed);
        self.stats
            .queued
            .store(self.queue.len() as u64, Ordering::Relaxed);
    }
}
