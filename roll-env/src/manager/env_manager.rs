//! [`EnvManager`]: many episodes at once, in groups, surviving environments that panic or hang.

mod health;
mod threads;

use super::EnvManagerConfig;
use super::activity::{SlotShared, Watchdog};
use super::book::{Book, Landed};
use super::incident::{Incident, IncidentKind};
use super::slot::{Event, Job, Outcome};
use crate::{EnvError, EnvFactory};
use roll_core::scheduler::{GroupFilter, RolloutBatch, RolloutStats};
use roll_core::tokenizer::Tokenizer;
use roll_core::{Generate, Group, GroupId};
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;
use tokio::runtime::Handle;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Incidents kept for [`EnvManager::incidents`]; older ones are dropped.
const INCIDENT_LOG: usize = 1024;

/// Counts over the manager's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ManagerTotals {
    /// Episodes that finished (including redundant ones whose group was already complete, which
    /// are ignored).
    pub episodes_finished: u64,
    /// Episodes dropped because they failed, panicked or timed out.
    pub episodes_failed: u64,
    /// Episodes aborted because their group completed without them.
    pub episodes_aborted: u64,
    /// Environments rebuilt after a panic, an environment error or a timeout.
    pub restarts: u64,
    /// Resets, steps or constructions that exceeded the step timeout (threads abandoned).
    pub timeouts: u64,
    /// Stalls the watchdog reported.
    pub stalls: u64,
}

/// A callback that sees every [`Incident`] as it happens (e.g. to log it).
pub type IncidentHook = Arc<dyn Fn(&Incident) + Send + Sync>;

enum SlotState {
    Starting,
    Idle,
    Busy(u64),
    /// The thread could not be spawned; retried at the next dispatch.
    Dead,
}

struct Slot {
    epoch: u64,
    jobs: Option<mpsc::Sender<Job>>,
    state: SlotState,
    shared: Arc<SlotShared>,
    stall_reported: Option<Instant>,
}

/// Plays episodes of one environment kind for the agentic pipeline.
///
/// # Design
/// * **Threads.** Each environment lives on an OS thread of its own (`roll-env-<i>`, as many as
///   [`EnvManagerConfig::num_threads`] says) that plays one episode at a time with
///   [`play_episode`](roll_core::episode::play_episode), driving the policy's futures with the
///   runtime handle's `block_on`. Environment code is synchronous and may be slow; on its own
///   thread it never blocks the async runtime. [`collect`](Self::collect) only awaits events.
/// * **Groups.** A group's `group_size + group_size_redundancy` episodes share one seed (the
///   same puzzle) so that group-relative advantages compare like with like. Redundant episodes
///   start only when no primary episode is waiting; the group completes with its first
///   `group_size` finished trajectories and its other episodes are aborted (their results, if any
///   arrive, are ignored).
/// * **Failures.** An episode that panics (environment or policy), returns an error, or whose
///   environment exceeds [`step_timeout`](EnvManagerConfig::step_timeout) in a reset or step is
///   dropped and counted (`samples_failed`), its group gets a replacement episode on the same seed
///   if it still needs one, and the environment is rebuilt from the factory. A panicking thread
///   ends cleanly; a hung thread cannot be killed in Rust, so it is *abandoned*: its reports are
///   ignored, it exits if it ever returns, and a new thread takes its place. A group that fails
///   more episodes than it started is replaced by a new group; only failures in a row past
///   [`max_consecutive_failures`](EnvManagerConfig::max_consecutive_failures) fail the call.
/// * **Watchdog.** A watchdog thread (`roll-env-watchdog`) wakes the manager every quarter of
///   the shorter timeout (5 ms – 1 s), without tokio's timer, so any runtime works. The manager
///   then checks each thread's phase: one in environment code past the step timeout is
///   abandoned as above; a busy one without progress for
///   [`hung_timeout`](EnvManagerConfig::hung_timeout) is reported once as an
///   [`IncidentKind::Stalled`] incident (ROLL's `EnvActivityMonitor`).
///   [`watchdog`](Self::watchdog) gives a view that other tasks can poll at any time.
///
/// Every incident is kept ([`incidents`](Self::incidents)), passed to the hook, and counted in
/// the `metrics` facade (`roll_env_incidents_total{env, kind}`).
///
/// # Example
/// ```
/// use roll_core::config::ComponentSpec;
/// use roll_core::testing::{ByteTokenizer, MockPolicy};
/// use roll_env::{EnvManager, EnvManagerConfig, EnvRegistry};
/// use std::sync::Arc;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let factory = EnvRegistry::with_builtins()
///     .factory(&ComponentSpec::new("sokoban").with_option("format_penalty", -0.15))
///     .unwrap();
/// let config = EnvManagerConfig { group_size: 2, group_size_redundancy: 1, ..Default::default() };
/// let mut manager =
///     EnvManager::new(config, factory, Arc::new(MockPolicy::digits()), Arc::new(ByteTokenizer))
///         .unwrap();
/// let batch = manager.collect(3).await.unwrap();
/// assert_eq!((batch.groups.len(), batch.num_samples()), (3, 6));
/// // Digits are no Sokoban moves: every turn is a penalised no-op.
/// let t = &batch.groups[0].samples()[0];
/// assert!(t.turns().iter().all(|turn| (turn.reward + 0.25).abs() < 1e-6));
/// # });
/// ```
pub struct EnvManager {
    config: EnvManagerConfig,
    factory: EnvFactory,
    policy: Arc<dyn Generate>,
    tokenizer: Arc<dyn Tokenizer>,
    episode: Arc<roll_core::episode::EpisodeConfig>,
    book: Book,
    slots: Vec<Slot>,
    table: Arc<Mutex<Vec<Arc<SlotShared>>>>,
    events_tx: UnboundedSender<Event>,
    events: UnboundedReceiver<Event>,
    runtime: Option<Handle>,
    tick_pending: Option<Arc<AtomicBool>>,
    next_epoch: u64,
    consecutive_failures: u64,
    last_error: Option<String>,
    incidents: VecDeque<Incident>,
    hook: Option<IncidentHook>,
    totals: ManagerTotals,
}

impl fmt::Debug for EnvManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvManager")
            .field("env", &self.factory.kind())
            .field("config", &self.config)
            .field("threads", &self.slots.len())
            .field("totals", &self.totals)
            .finish()
    }
}

impl EnvManager {
    /// A manager that plays environments from `factory` with `policy`. Threads start on the
    /// first [`collect`](Self::collect).
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] if the config is invalid.
    pub fn new(
        config: EnvManagerConfig,
        factory: EnvFactory,
        policy: Arc<dyn Generate>,
        tokenizer: Arc<dyn Tokenizer>,
    ) -> Result<Self, EnvError> {
        config.validate()?;
        let (events_tx, events) = unbounded_channel();
        let mut episode = config.episode.clone();
        episode.sampling.seed.get_or_insert(config.seed);
        Ok(Self {
            book: Book::new(config.group_size, config.group_size_redundancy, config.seed),
            episode: Arc::new(episode),
            config,
            factory,
            policy,
            tokenizer,
            slots: Vec::new(),
            table: Arc::new(Mutex::new(Vec::new())),
            events_tx,
            events,
            runtime: None,
            tick_pending: None,
            next_epoch: 0,
            consecutive_failures: 0,
            last_error: None,
            incidents: VecDeque::new(),
            hook: None,
            totals: ManagerTotals::default(),
        })
    }

    /// Calls `hook` with every incident as it is recorded.
    #[must_use]
    pub fn with_incident_hook(mut self, hook: IncidentHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// The settings.
    pub fn config(&self) -> &EnvManagerConfig {
        &self.config
    }

    /// The environment kind.
    pub fn env_kind(&self) -> &str {
        self.factory.kind()
    }

    /// Recent incidents, oldest first (the last 1024).
    pub fn incidents(&self) -> impl ExactSizeIterator<Item = &Incident> {
        self.incidents.iter()
    }

    /// Counts over the manager's life.
    pub fn totals(&self) -> ManagerTotals {
        self.totals
    }

    /// Where the manager is in its stream of groups: the next group id (group `g` plays the seed
    /// derived from the manager's seed and `g`) and the next sample id. Between two
    /// [`collect`](Self::collect)s nothing is open, so this is all a checkpoint needs.
    pub fn position(&self) -> (u64, u64) {
        self.book.position()
    }

    /// Continues the stream at `position` (from [`position`](Self::position) of a manager built
    /// with the same settings): the next groups get the ids, seeds and sampling seeds they would
    /// have had.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] once groups were started.
    pub fn resume_at(&mut self, position: (u64, u64)) -> Result<(), EnvError> {
        if self.book.position() != (0, 0) {
            return Err(EnvError::InvalidOption {
                key: "position",
                value: format!("{position:?}"),
                allowed: "a position restored before the first batch".into(),
            });
        }
        self.book.resume_at(position);
        Ok(())
    }

    /// A view of the environment threads for polling from elsewhere.
    pub fn watchdog(&self) -> Watchdog {
        Watchdog {
            env: self.factory.kind().into(),
            slots: self.table.clone(),
        }
    }

    /// Plays until `num_groups` groups are complete and returns them, ordered by group id, each
    /// with `group_size` trajectories ordered by sample id.
    ///
    /// # Errors
    /// [`EnvError::NoRuntime`] outside a tokio runtime, [`EnvError::Spawn`] if no thread can be
    /// started, [`EnvError::TooManyFailures`] if episodes keep failing. Individual failures are
    /// counted in the batch's stats and in [`incidents`](Self::incidents), not returned.
    pub async fn collect(&mut self, num_groups: usize) -> Result<RolloutBatch, EnvError> {
        self.collect_inner(num_groups, None).await
    }

    /// As [`collect`](Self::collect), but each group that completes is first shown to `filter`
    /// (e.g. roll-algos' `DynamicFilter`, which drops groups whose rewards are all equal): a
    /// rejected group is dropped, counted in the stats' `groups_filtered`, and a new group (a new
    /// seed) starts in its place at once. A filter error counts as a rejection.
    ///
    /// # Errors
    /// As [`collect`](Self::collect), and [`EnvError::TooManyFiltered`] once more than
    /// `max_rejected` groups were rejected in this call (everything still running is aborted).
    pub async fn collect_filtered(
        &mut self,
        num_groups: usize,
        filter: &dyn GroupFilter,
        max_rejected: u64,
    ) -> Result<RolloutBatch, EnvError> {
        self.collect_inner(num_groups, Some((filter, max_rejected)))
            .await
    }

    async fn collect_inner(
        &mut self,
        num_groups: usize,
        filter: Option<(&dyn GroupFilter, u64)>,
    ) -> Result<RolloutBatch, EnvError> {
        let mut stats = RolloutStats::default();
        if num_groups == 0 {
            return Ok(RolloutBatch {
                groups: Vec::new(),
                stats,
            });
        }
        self.runtime = Some(Handle::try_current().map_err(|_| EnvError::NoRuntime)?);
        let episodes = num_groups.saturating_mul(self.config.episodes_per_group());
        self.ensure_threads(self.config.threads_for(episodes))?;
        let limit = self.config.failure_limit(episodes);
        // Results of the previous batch's aborted episodes free their threads.
        while let Ok(event) = self.events.try_recv() {
            self.on_event(event, &mut stats)?;
        }
        // Asynchronous: groups started when the last batch was handed over count toward this one
        // (whether they are still playing or already complete).
        let open = self.book.open_groups().len() + self.book.ready_len();
        for _ in open..num_groups {
            self.book.start_group();
            stats.prompts_started += 1;
        }
        let current = self.policy.weight_version();
        let max_staleness = self.config.max_staleness;
        let mut kept: Vec<Group> = Vec::with_capacity(num_groups);
        let mut last_filter_error = None;
        while kept.len() < num_groups {
            self.dispatch()?;
            if self.consecutive_failures >= limit {
                self.book.abort_all();
                self.book.take_ready();
                return Err(EnvError::TooManyFailures {
                    kind: self.factory.kind().to_string(),
                    failures: self.consecutive_failures,
                    last: self.last_error.clone().unwrap_or_default(),
                });
            }
            if self.book.ready_len() == 0 {
                // The manager holds a sender itself, so the channel never closes.
                let event = self.events.recv().await.ok_or(EnvError::Closed)?;
                self.on_event(event, &mut stats)?;
            }
            while let Ok(event) = self.events.try_recv() {
                self.on_event(event, &mut stats)?;
            }
            self.check_threads(&mut stats)?;
            // One group at a time: complete groups beyond this batch's stay for the next.
            while kept.len() < num_groups {
                let Some(group) = self.book.pop_ready() else {
                    break;
                };
                if max_staleness > 0
                    && group
                        .oldest_version()
                        .is_some_and(|v| v.staleness(current) > max_staleness)
                {
                    // Played too long ago (it waited through several trainings): replaced.
                    stats.groups_stale += 1;
                    stats.samples_wasted += group.len() as u64;
                    self.book.start_group();
                    stats.prompts_started += 1;
                    continue;
                }
                let Some((f, allowed)) = filter else {
                    kept.push(group);
                    continue;
                };
                let keep = f.keep(&group).unwrap_or_else(|e| {
                    last_filter_error = Some(e.to_string());
                    false
                });
                if keep {
                    kept.push(group);
                    continue;
                }
                stats.groups_filtered += 1;
                stats.samples_filtered += group.len() as u64;
                if stats.groups_filtered > allowed {
                    self.book.abort_all();
                    self.book.take_ready();
                    return Err(EnvError::TooManyFiltered {
                        kind: self.factory.kind().to_string(),
                        rejected: stats.groups_filtered,
                        allowed,
                        wanted: num_groups,
                        last_error: last_filter_error,
                    });
                }
                self.book.start_group();
                stats.prompts_started += 1;
            }
        }
        if max_staleness == 0 {
            // Replacement groups the batch did not need: a synchronous batch leaves nothing
            // open, so the manager's whole position is its counters (see `position`).
            self.book.abort_all();
            self.book.take_ready();
        } else {
            // The next batch starts now, on the threads this one freed, and plays while the
            // batch trains; replacement groups still open or complete count toward it.
            let open = self.book.open_groups().len() + self.book.ready_len();
            for _ in open..num_groups {
                self.book.start_group();
                stats.prompts_started += 1;
            }
            self.dispatch()?;
        }
        kept.sort_by_key(Group::id);
        stats.record_staleness(&kept, self.policy.weight_version());
        Ok(RolloutBatch {
            groups: kept,
            stats,
        })
    }

    /// Groups started and not yet handed over (asynchronous mode: the next batch, playing or
    /// complete), to be started again by a manager restored from a checkpoint
    /// ([`reopen`](Self::reopen)).
    pub fn open_groups(&self) -> Vec<GroupId> {
        let mut open = self.book.open_groups();
        open.extend(self.book.ready_ids());
        open.sort();
        open
    }

    /// Starts `groups` again (the open groups of a checkpoint), before the first batch: the same
    /// ids and seeds, played on the current weights.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] if a group id is not below the position's next group id.
    pub fn reopen(&mut self, groups: &[GroupId]) -> Result<(), EnvError> {
        let (next_group, _) = self.book.position();
        for &g in groups {
            if g.0 >= next_group {
                return Err(EnvError::InvalidOption {
                    key: "open group",
                    value: g.to_string(),
                    allowed: format!("a group id below the next one ({next_group})"),
                });
            }
            self.book.reopen_group(g);
        }
        Ok(())
    }

    fn on_event(&mut self, event: Event, stats: &mut RolloutStats) -> Result<(), EnvError> {
        match event {
            Event::Tick => {
                if let Some(p) = &self.tick_pending {
                    p.store(false, Ordering::Release);
                }
            }
            Event::Ready { slot, epoch } => {
                if let Some(s) = self.slots.get_mut(slot).filter(|s| s.epoch == epoch) {
                    s.state = SlotState::Idle;
                }
            }
            Event::BuildFailed { slot, epoch, error } => {
                if self.slots.get(slot).is_some_and(|s| s.epoch == epoch) {
                    self.fail(stats, false);
                    self.last_error = Some(error.clone());
                    self.record(slot, None, IncidentKind::BuildFailed { error });
                    self.start_thread(slot, true)?;
                }
            }
            Event::Done {
                slot,
                epoch,
                job,
                outcome,
            } => {
                if self.slots.get(slot).is_none_or(|s| s.epoch != epoch) {
                    return Ok(()); // An abandoned thread: its episode was already written off.
                }
                let episode = self.book.job(job).map(|j| j.ids);
                let restart = match outcome {
                    Outcome::Finished(t) if t.finish_reason == roll_core::FinishReason::Abort => {
                        stats.samples_aborted += 1;
                        if !t.response().is_empty() {
                            stats.samples_wasted += 1;
                        }
                        self.totals.episodes_aborted += 1;
                        self.book.lost(job, false);
                        false
                    }
                    Outcome::Finished(t) => {
                        self.totals.episodes_finished += 1;
                        match self.book.finished(job, *t).map_err(EnvError::Episode)? {
                            Landed::Late => {
                                stats.samples_aborted += 1;
                                stats.samples_wasted += 1;
                            }
                            Landed::Counted | Landed::Completed => {
                                stats.samples_finished += 1;
                                self.consecutive_failures = 0;
                            }
                        }
                        false
                    }
                    Outcome::Failed(e) => {
                        let restart = matches!(e, roll_core::Error::Env(_));
                        self.lose(
                            slot,
                            job,
                            episode,
                            IncidentKind::Failed {
                                error: e.to_string(),
                            },
                            stats,
                        );
                        restart
                    }
                    Outcome::Panicked(message) => {
                        self.lose(
                            slot,
                            job,
                            episode,
                            IncidentKind::Panicked { message },
                            stats,
                        );
                        true
                    }
                };
                if restart {
                    self.start_thread(slot, true)?;
                } else if let Some(s) = self.slots.get_mut(slot) {
                    s.state = SlotState::Idle;
                }
            }
        }
        Ok(())
    }
}

impl Drop for EnvManager {
    /// Aborts open episodes and lets the threads go: each exits after its current episode
    /// (a hung one never does; it is abandoned, not joined).
    fn drop(&mut self) {
        self.book.abort_all();
        for s in &mut self.slots {
            s.shared.abandon();
            s.jobs = None;
        }
    }
}
