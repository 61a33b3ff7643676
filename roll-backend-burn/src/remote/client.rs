//! [`RemoteRollout`]: the controller's side of disaggregated rollout.

use super::BUCKET_FLOATS;
use super::weights;
use super::wire::{Report, Submit, ToRollout, decode, encode};
use crate::{BackendError, CausalLm, Result};
use async_trait::async_trait;
use roll_core::policy::{Generate, Generation, GenerationRequest};
use roll_core::strategy::Messenger;
use roll_core::{AbortSignal, WeightVersion};
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::oneshot;

/// How often the controller asks a rank with running requests what finished: short against a
/// request (tens of decode steps), long enough that polling costs nothing measurable.
const POLL: Duration = Duration::from_millis(2);

/// Prompt tokens that make a request's routing key: an agentic episode's turns share them (each
/// turn's prompt extends the last), and so do a GRPO group's samples.
const AFFINITY_TOKENS: usize = 64;

/// How many more running requests than the least busy rank a rank may have and still take a
/// request whose key it took last: its engine's prefix cache is worth a little imbalance, not a
/// queue.
const AFFINITY_SLACK: usize = 8;

/// Routing keys remembered before the memory starts again (a key costs ~16 bytes).
const AFFINITY_KEYS: usize = 1 << 16;

/// How long an answer may take. Rounds are answered at once; a weight sync after the rank's
/// engine has converted the weights, which for a large model takes a while.
const ANSWER_WAIT: Duration = Duration::from_secs(600);

/// Generation on rollout ranks: a [`Generate`] whose requests run on other ranks of the job
/// (each [`RolloutServer::serve`](super::RolloutServer::serve)): a request goes to the rank
/// that took its prompt's first 64 tokens last while that rank is within 8 running requests of
/// the least busy (an agentic episode's next turn then finds its earlier turns in that
/// engine's prefix cache; a GRPO group's samples stay together), else to the least busy. A request's [`AbortSignal`] reaches its rank
/// in the next round. A request the rank's engine refuses fails alone; a rank that cannot be
/// reached fails every request (and the run) with an error naming it.
///
/// One thread per controller drives every exchange (see the protocol in the
/// [module docs](super)). Dropping the last clone stops the rollout ranks.
#[derive(Clone)]
pub struct RemoteRollout {
    link: Arc<Link>,
}

impl std::fmt::Debug for RemoteRollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRollout")
            .field("ranks", &self.link.shared.ranks)
            .field("weight_version", &self.weight_version())
            .finish()
    }
}

/// Stops the driver when the last [`RemoteRollout`] goes.
struct Link {
    shared: Arc<Shared>,
    driver: Option<JoinHandle<()>>,
}

struct Shared {
    /// The rollout ranks, in the job.
    ranks: Vec<usize>,
    /// How many consecutive rollout ranks hold each mixture's experts divided among them (1:
    /// each holds the whole model).
    experts: usize,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Requests not yet sent.
    queued: Vec<Queued>,
    in_flight: BTreeMap<u64, InFlight>,
    weights: Option<WeightsJob>,
    /// The weight version each rank serves (by index in `ranks`).
    versions: Vec<u64>,
    /// The rank (index) that took each routing key last ([`route`]).
    affinity: std::collections::HashMap<u64, usize>,
    /// The failure that ended the link: every later call gets it.
    failed: Option<(usize, String)>,
    stopping: bool,
}

type Reply = oneshot::Sender<Result<Generation>>;

struct Queued {
    id: u64,
    request: GenerationRequest,
    reply: Reply,
}

struct InFlight {
    /// Index in `ranks`.
    rank: usize,
    abort: AbortSignal,
    abort_sent: bool,
    reply: Reply,
}

struct WeightsJob {
    version: u64,
    /// The weights of each position in a group of ranks dividing the experts (one: the whole
    /// model, for every rank).
    parts: Vec<WeightsPart>,
    done: mpsc::Sender<Result<()>>,
}

/// One rank's weights, as buckets.
struct WeightsPart {
    floats: u64,
    buckets: Vec<Vec<u8>>,
}

/// What one pass of the driver sends.
struct Work {
    /// Per rank: requests to start and ids to abort.
    rounds: Vec<(Vec<Submit>, Vec<u64>)>,
    /// Per rank: whether it has requests running.
    busy: Vec<bool>,
    weights: Option<WeightsJob>,
    stop: bool,
}

fn failure((rank, reason): &(usize, String)) -> BackendError {
    BackendError::RolloutRank {
        rank: *rank,
        reason: reason.clone(),
    }
}

impl RemoteRollout {
    /// Connects to the rollout `ranks` of `link` (each running
    /// [`RolloutServer::serve`](super::RolloutServer::serve) with this rank as its
    /// controller) and starts their engines on `model`'s weights as `version`. Blocks until
    /// every rank serves them; call it outside an async runtime, or on a blocking thread.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for no ranks, or this rank among them; a rank that fails
    /// to start ([`BackendError::RolloutRank`]).
    pub fn connect(
        link: Arc<dyn Messenger>,
        ranks: Vec<usize>,
        model: &CausalLm,
        version: WeightVersion,
    ) -> Result<Self> {
        Self::connect_with_experts(link, ranks, 1, model, version)
    }

    /// [`RemoteRollout::connect`] to rollout ranks that hold a mixture of experts' experts
    /// divided among groups of `experts` consecutive ranks of `ranks` (each running
    /// [`RolloutServer::with_experts`](super::RolloutServer::with_experts) over its group): a
    /// weight sync sends each rank only its block of the experts, with the rest of the model.
    ///
    /// # Errors
    /// As [`RemoteRollout::connect`]; [`BackendError::InvalidInput`] for `experts` that does not
    /// divide the ranks, or a model whose experts do not divide that way.
    pub fn connect_with_experts(
        link: Arc<dyn Messenger>,
        ranks: Vec<usize>,
        experts: usize,
        model: &CausalLm,
        version: WeightVersion,
    ) -> Result<Self> {
        if experts == 0 || !ranks.len().is_multiple_of(experts) {
            return Err(BackendError::InvalidInput(format!(
                "{} rollout ranks do not form groups of {experts} holding the experts",
                ranks.len()
            )));
        }
        if experts > 1 {
            // A model whose experts do not divide so is refused before any rank hears of it.
            model.clone().expert_block(0, experts)?;
        }
        let distinct = ranks
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == ranks.len();
        let outside = ranks.iter().any(|&r| r >= link.world_size());
        if ranks.is_empty() || ranks.contains(&link.rank()) || !distinct || outside {
            return Err(BackendError::InvalidInput(format!(
                "rollout ranks {ranks:?}: give at least one, each once, ranks of the job of {} \
                 other than this rank ({})",
                link.world_size(),
                link.rank()
            )));
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                versions: vec![0; ranks.len()],
                ..State::default()
            }),
            ranks,
            experts,
            wake: Condvar::new(),
        });
        let driver = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("roll-rollout-link".into())
                .spawn(move || {
                    if let Err(e) = drive(&shared, link.as_ref()) {
                        shared.fail(e);
                    }
                })
                .map_err(|e| BackendError::Engine(format!("cannot start the rollout link: {e}")))?
        };
        let this = Self {
            link: Arc::new(Link {
                shared,
                driver: Some(driver),
            }),
        };
        this.sync(model, version)?;
        Ok(this)
    }

    /// The rollout ranks.
    pub fn ranks(&self) -> &[usize] {
        &self.link.shared.ranks
    }

    /// Sends `model`'s weights to every rollout rank, to serve as `version` (the trainer's
    /// weight version after the step that made them); returns once every rank serves them.
    /// Requests running there continue as the engine's in-flight policy says. Blocking: call it
    /// outside an async runtime, or on a blocking thread.
    ///
    /// # Errors
    /// A parameter that cannot be read, a broken link, or a rank that does not end up serving
    /// `version` ([`BackendError::RolloutRank`]).
    pub fn sync(&self, model: &CausalLm, version: WeightVersion) -> Result<()> {
        let experts = self.link.shared.experts;
        let parts = (0..experts)
            .map(|part| {
                let buckets = if experts == 1 {
                    weights::to_buckets(model, BUCKET_FLOATS)?
                } else {
                    weights::to_buckets(&model.clone().expert_block(part, experts)?, BUCKET_FLOATS)?
                };
                let floats = buckets.iter().map(|b| b.len() as u64 / 4).sum();
                Ok(WeightsPart { floats, buckets })
            })
            .collect::<Result<Vec<_>>>()?;
        let (done, answer) = mpsc::channel();
        {
            let shared = &self.link.shared;
            let mut state = shared.lock();
            if let Some(failed) = &state.failed {
                return Err(failure(failed));
            }
            state.weights = Some(WeightsJob {
                version: version.0,
                parts,
                done,
            });
            shared.wake.notify_all();
        }
        answer.recv().map_err(|_| BackendError::RolloutRank {
            rank: self.link.shared.ranks[0],
            reason: "the rollout link stopped during a weight sync".into(),
        })?
    }

    fn submit(&self, request: GenerationRequest) -> Result<oneshot::Receiver<Result<Generation>>> {
        let shared = &self.link.shared;
        let mut state = shared.lock();
        if let Some(failed) = &state.failed {
            return Err(failure(failed));
        }
        let (reply, answer) = oneshot::channel();
        let id = state.next_id;
        state.next_id += 1;
        state.queued.push(Queued { id, request, reply });
        shared.wake.notify_all();
        Ok(answer)
    }
}

#[async_trait]
impl Generate for RemoteRollout {
    async fn generate(&self, request: GenerationRequest) -> roll_core::Result<Generation> {
        let answer = self.submit(request)?;
        let outcome = answer.await.map_err(|_| BackendError::RolloutRank {
            rank: self.link.shared.ranks[0],
            reason: "the rollout link stopped before the request finished".into(),
        })?;
        Ok(outcome?)
    }

    /// The version every rollout rank serves (the oldest, while a sync is under way).
    fn weight_version(&self) -> WeightVersion {
        let state = self.link.shared.lock();
        WeightVersion(state.versions.iter().copied().min().unwrap_or(0))
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stopping = true;
            self.shared.wake.notify_all();
        }
        if let Some(driver) = self.driver.take() {
            let _ = driver.join();
        }
    }
}

impl Shared {
    /// The state; every update completes before anything that can panic, so a poisoned lock
    /// holds consistent state.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for something to send (or, with requests running, at most [`POLL`]) and takes it.
    fn next_work(&self) -> Work {
        let mut state = self.lock();
        while !state.stopping && state.weights.is_none() && state.queued.is_empty() {
            if state.in_flight.is_empty() {
                state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            } else {
                state = self
                    .wake
                    .wait_timeout(state, POLL)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                break;
            }
        }
        let n = self.ranks.len();
        let mut load = vec![0usize; n];
        for f in state.in_flight.values() {
            load[f.rank] += 1;
        }
        let mut rounds = vec![(Vec::new(), Vec::new()); n];
        for q in std::mem::take(&mut state.queued) {
            let key = routing_key(&q.request.prompt_ids);
            let rank = route(&load, state.affinity.get(&key).copied());
            if state.affinity.len() >= AFFINITY_KEYS {
                state.affinity.clear();
            }
            state.affinity.insert(key, rank);
            load[rank] += 1;
            rounds[rank].0.push(Submit {
                id: q.id,
                prompt_ids: q.request.prompt_ids,
                params: q.request.params,
            });
            state.in_flight.insert(
                q.id,
                InFlight {
                    rank,
                    abort: q.request.abort,
                    abort_sent: false,
                    reply: q.reply,
                },
            );
        }
        for (&id, f) in &mut state.in_flight {
            if !f.abort_sent && f.abort.is_aborted() {
                f.abort_sent = true;
                rounds[f.rank].1.push(id);
            }
        }
        Work {
            rounds,
            busy: load.iter().map(|&l| l > 0).collect(),
            weights: state.weights.take(),
            stop: state.stopping,
        }
    }

    /// Hands the finished requests of `report` (from the rank at `index`) to their callers.
    fn deliver(&self, index: usize, report: Report) -> Result<()> {
        let rank = self.ranks[index];
        let mut state = self.lock();
        state.versions[index] = report.version;
        for done in report.finished {
            let Some(f) = state.in_flight.remove(&done.id) else {
                return Err(BackendError::RolloutRank {
                    rank,
                    reason: format!("finished request {} that it was not running", done.id),
                });
            };
            let outcome = done
                .outcome
                .map(Generation::from)
                .map_err(|reason| BackendError::RolloutRank { rank, reason });
            // A caller that stopped waiting (its future dropped) does not need the answer.
            let _ = f.reply.send(outcome);
        }
        Ok(())
    }

    /// The rank an error names (the first rank when it names none) and what it says.
    fn parts(&self, error: BackendError) -> (usize, String) {
        match error {
            BackendError::RolloutRank { rank, reason } => (rank, reason),
            other => (self.ranks[0], other.to_string()),
        }
    }

    /// Ends the link on `error`: every waiting caller gets it, and so does every later call.
    fn fail(&self, error: BackendError) {
        let failed = self.parts(error);
        let mut state = self.lock();
        for (_, f) in std::mem::take(&mut state.in_flight) {
            let _ = f.reply.send(Err(failure(&failed)));
        }
        for q in std::mem::take(&mut state.queued) {
            let _ = q.reply.send(Err(failure(&failed)));
        }
        if let Some(job) = state.weights.take() {
            let _ = job.done.send(Err(failure(&failed)));
        }
        state.failed = Some(failed);
    }
}

/// The key a request is routed by: its first [`AFFINITY_TOKENS`] prompt tokens.
fn routing_key(prompt: &[u32]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    prompt[..prompt.len().min(AFFINITY_TOKENS)].hash(&mut hasher);
    hasher.finish()
}

/// The rank (index) a new request goes to, given each rank's running requests and the rank
/// that took its routing key last: that rank while it is within [`AFFINITY_SLACK`] of the least
/// busy (its prefix cache may hold the shared start), else the least busy (the lowest on a
/// tie).
fn route(load: &[usize], previous: Option<usize>) -> usize {
    let least = (0..load.len()).min_by_key(|&r| (load[r], r)).unwrap_or(0);
    match previous {
        Some(r) if r < load.len() && load[r] <= load[least] + AFFINITY_SLACK => r,
        _ => least,
    }
}

/// The driver thread: one exchange at a time with each rank that has something to do.
fn drive(shared: &Shared, link: &dyn Messenger) -> Result<()> {
    loop {
        let work = shared.next_work();
        if let Some(job) = work.weights {
            if let Err(e) = push_weights(shared, link, &job) {
                let failed = shared.parts(e);
                let _ = job.done.send(Err(failure(&failed)));
                return Err(failure(&failed));
            }
            let _ = job.done.send(Ok(()));
        }
        for (index, (submit, abort)) in work.rounds.into_iter().enumerate() {
            if submit.is_empty() && abort.is_empty() && !work.busy[index] {
                continue;
            }
            let report = exchange(
                link,
                shared.ranks[index],
                &ToRollout::Round { submit, abort },
            )?;
            shared.deliver(index, report)?;
        }
        if work.stop {
            for (index, &rank) in shared.ranks.iter().enumerate() {
                let report = exchange(link, rank, &ToRollout::Stop)?;
                shared.deliver(index, report)?;
            }
            return Ok(());
        }
    }
}

/// Sends the weights to every rank, header then buckets (a rank dividing the experts its part),
/// then waits for each to serve them: the ranks rebuild their models at the same time.
fn push_weights(shared: &Shared, link: &dyn Messenger, job: &WeightsJob) -> Result<()> {
    for (index, &rank) in shared.ranks.iter().enumerate() {
        let part = &job.parts[index % job.parts.len()];
        let header = encode(&ToRollout::Weights {
            version: job.version,
            floats: part.floats,
            buckets: u32::try_from(part.buckets.len()).unwrap_or(u32::MAX),
        })?;
        send(link, rank, &header)?;
        for bucket in &part.buckets {
            send(link, rank, bucket)?;
        }
    }
    for (index, &rank) in shared.ranks.iter().enumerate() {
        let report = answer(link, rank)?;
        let served = report.version;
        shared.deliver(index, report)?;
        if served != job.version {
            return Err(BackendError::RolloutRank {
                rank,
                reason: format!(
                    "serves weight version {served} after a sync to {}",
                    job.version
                ),
            });
        }
    }
    Ok(())
}

/// Sends `message` to `rank` and returns its answer.
fn exchange(link: &dyn Messenger, rank: usize, message: &ToRollout) -> Result<Report> {
    send(link, rank, &encode(message)?)?;
    answer(link, rank)
}

/// A link failure, as the error of the rank it was talking to.
fn lost(rank: usize) -> impl Fn(roll_core::Error) -> BackendError {
    move |e| BackendError::RolloutRank {
        rank,
        reason: e.to_string(),
    }
}

fn send(link: &dyn Messenger, rank: usize, bytes: &[u8]) -> Result<()> {
    link.send(rank, bytes).map_err(lost(rank))
}

fn answer(link: &dyn Messenger, rank: usize) -> Result<Report> {
    let bytes = link
        .receive(rank, ANSWER_WAIT)
        .map_err(lost(rank))?
        .ok_or_else(|| BackendError::RolloutRank {
            rank,
            reason: format!("no answer in {} s", ANSWER_WAIT.as_secs()),
        })?;
    decode(&bytes, rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_follows_its_prefix_until_that_rank_is_too_busy() {
        assert_eq!(route(&[3, 1, 1], None), 1, "least busy, lowest on a tie");
        assert_eq!(
            route(&[3, 1, 1], Some(0)),
            0,
            "2 above the least: within the slack"
        );
        assert_eq!(route(&[9, 1, 1], Some(0)), 0, "8 above: still within");
        assert_eq!(
            route(&[10, 1, 1], Some(0)),
            1,
            "9 above: the least busy instead"
        );
        assert_eq!(route(&[0, 0], Some(7)), 0, "a rank that is gone is ignored");
    }

    #[test]
    fn the_key_is_the_prompts_start_so_later_turns_share_it() {
        let first: Vec<u32> = (0..100).collect();
        let mut later = first.clone();
        later.extend([7, 8, 9]);
        assert_eq!(routing_key(&first), routing_key(&later));
        assert_ne!(routing_key(&first[..10]), routing_key(&first[..11]));
        let other: Vec<u32> = (1..101).collect();
        assert_ne!(routing_key(&first), routing_key(&other));
    }
}
