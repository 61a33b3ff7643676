//! The RLVR scheduler: sample-level rollout of single-turn prompts.

use super::{
    GroupFilter, RolloutBatch, RolloutStats, Scheduler, SchedulerState, Watchdog, sample_seed,
};
use crate::policy::Generate;
use crate::tokenizer::{Tokenizer, encode_prompt};
use crate::{
    AbortHandle, Error, FinishReason, GenerationRequest, Group, GroupId, Prompt, Result,
    RewardWorker, Sample, SampleId, SamplingParams, WeightVersion,
};
use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Groups dropped in a row, with none kept, after which a batch gives up (at least; 50 batches'
/// worth for large batches). Even a hard task where 95% of groups carry no signal drops a run
/// of 1,000 about once in 10²² batches.
const DROPPED_IN_A_ROW: u64 = 1000;

/// Settings of [`RlvrScheduler`].
#[derive(Debug, Clone, PartialEq)]
pub struct RlvrSchedulerConfig {
    /// Groups per batch (ROLL's `rollout_batch_size`).
    pub prompts_per_step: usize,
    /// Samples per prompt (ROLL's `num_return_sequences_in_group`).
    pub group_size: usize,
    /// Extra prompts kept in flight beyond what the batch needs, so that filtered or slow groups do
    /// not stall the step (ROLL's `max_additional_running_prompts`).
    pub oversample_prompts: usize,
    /// How many weight versions generation may run ahead of training. 0 = synchronous: whatever is
    /// still generating when the batch is full is aborted. k > 0: generation continues across
    /// steps and groups older than k versions are dropped (ROLL's `async_generation_ratio`).
    pub max_staleness: u64,
    /// Sampling parameters of every request (the seed is set per sample).
    pub sampling: SamplingParams,
    /// Run seed; each sample's sampling seed derives from it, the prompt id and the sample index.
    pub seed: u64,
    /// Log a warning naming each generation or reward call that waits longer than this
    /// ([`Watchdog`]); `None`: no watchdog.
    pub hang_warning: Option<std::time::Duration>,
}

impl Default for RlvrSchedulerConfig {
    fn default() -> Self {
        Self {
            prompts_per_step: 8,
            group_size: 8,
            oversample_prompts: 0,
            max_staleness: 0,
            sampling: SamplingParams::default(),
            seed: 42,
            hang_warning: None,
        }
    }
}

impl RlvrSchedulerConfig {
    /// The scheduler a run config describes: `[rollout]` (prompts per step, group size,
    /// oversampling, staleness bound, sampling and `max_new_tokens`) with the sampling seeds
    /// derived from `run.seed`.
    pub fn from_config(config: &crate::config::Config) -> Self {
        let rollout = &config.rollout;
        Self {
            prompts_per_step: rollout.prompts_per_step as usize,
            group_size: rollout.group_size as usize,
            oversample_prompts: rollout.oversample_prompts as usize,
            max_staleness: u64::from(rollout.max_staleness),
            sampling: rollout.sampling_params(),
            seed: crate::rng::derive_seed(config.run.seed, "rollout"),
            hang_warning: (rollout.hang_warning_s > 0)
                .then(|| std::time::Duration::from_secs(rollout.hang_warning_s)),
        }
    }
}

enum Outcome {
    Done(Box<Sample>),
    /// Aborted after generating this many tokens.
    Aborted(usize),
    Failed(Error),
}

struct OpenGroup {
    prompt: Arc<Prompt>,
    expected: usize,
    done: Vec<Sample>,
    failed: usize,
    aborted: usize,
    handles: Vec<AbortHandle>,
}

/// Issues `group_size` requests per prompt, scores each sample the moment it finishes (overlapping
/// reward computation with generation), closes groups as their last sample arrives, drops groups
/// the [`GroupFilter`] rejects and pulls new prompts in their place, and aborts what is left once
/// the batch is full (or, with `max_staleness > 0`, lets it run on into the next step).
///
/// A failing request or reward worker costs one sample; the scheduler only returns an error when
/// nothing succeeds at all, or when the prompt source runs dry.
pub struct RlvrScheduler {
    config: RlvrSchedulerConfig,
    policy: Arc<dyn Generate>,
    tokenizer: Arc<dyn Tokenizer>,
    reward: Arc<dyn RewardWorker>,
    prompts: Box<dyn Iterator<Item = Prompt> + Send>,
    /// Prompts taken from `prompts` so far.
    prompts_drawn: u64,
    /// Prompts whose groups were aborted when a synchronous batch closed: started again, before
    /// any new prompt, so no prompt of the dataset is skipped.
    requeued: VecDeque<Arc<Prompt>>,
    filter: Option<Box<dyn GroupFilter>>,
    /// Each task's group, outcome, and time spent in the reward call.
    tasks: JoinSet<(GroupId, Outcome, Duration)>,
    task_groups: HashMap<tokio::task::Id, GroupId>,
    open: BTreeMap<GroupId, OpenGroup>,
    /// Completed groups not yet taken into a batch, by issue order; the group filter judges
    /// them when they are taken.
    ready: BTreeMap<GroupId, Group>,
    next_group: u64,
    next_sample: u64,
    consecutive_failures: usize,
    last_error: Option<Error>,
    watchdog: Option<Arc<Watchdog>>,
}

impl RlvrScheduler {
    /// A scheduler drawing prompts from `prompts`, generating with `policy` and scoring with
    /// `reward` (typically a router that dispatches on the prompt's domain).
    ///
    /// # Errors
    /// [`Error::InvalidValue`] if `prompts_per_step` or `group_size` is 0.
    pub fn new(
        config: RlvrSchedulerConfig,
        policy: Arc<dyn Generate>,
        tokenizer: Arc<dyn Tokenizer>,
        reward: Arc<dyn RewardWorker>,
        prompts: impl Iterator<Item = Prompt> + Send + 'static,
    ) -> Result<Self> {
        for (key, v) in [
            ("rollout.prompts_per_step", config.prompts_per_step),
            ("rollout.group_size", config.group_size),
        ] {
            if v == 0 {
                return Err(Error::InvalidValue {
                    key: key.into(),
                    value: "0".into(),
                    allowed: "an integer ≥ 1".into(),
                    origin: None,
                });
            }
        }
        let watchdog = config.hang_warning.map(Watchdog::new);
        Ok(Self {
            config,
            policy,
            tokenizer,
            reward,
            prompts: Box::new(prompts),
            prompts_drawn: 0,
            requeued: VecDeque::new(),
            filter: None,
            tasks: JoinSet::new(),
            task_groups: HashMap::new(),
            open: BTreeMap::new(),
            ready: BTreeMap::new(),
            next_group: 0,
            next_sample: 0,
            consecutive_failures: 0,
            last_error: None,
            watchdog,
        })
    }

    /// Drops finished groups that `filter` rejects (and replaces them with new prompts).
    #[must_use]
    pub fn with_filter(mut self, filter: impl GroupFilter + 'static) -> Self {
        self.filter = Some(Box::new(filter));
        self
    }

    fn target_in_flight(&self) -> usize {
        let ahead = usize::try_from(self.config.max_staleness).unwrap_or(usize::MAX);
        self.config
            .prompts_per_step
            .saturating_mul(ahead.saturating_add(1))
            .saturating_add(self.config.oversample_prompts)
    }

    fn render(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        encode_prompt(&*self.tokenizer, prompt.system.as_deref(), &prompt.text)
    }

    /// Starts one prompt's group; `false` when the source is exhausted.
    fn start_prompt(&mut self, stats: &mut RolloutStats) -> bool {
        let prompt = match self.requeued.pop_front() {
            Some(p) => p,
            None => match self.prompts.next() {
                Some(p) => {
                    self.prompts_drawn += 1;
                    Arc::new(p)
                }
                None => return false,
            },
        };
        let group = GroupId(self.next_group);
        self.next_group += 1;
        stats.prompts_started += 1;
        let n = self.config.group_size;
        let prompt_ids = match self.render(&prompt) {
            Ok(ids) => ids,
            Err(e) => {
                stats.samples_failed += n as u64;
                self.record_failure(e, n);
                return true;
            }
        };
        let mut open = OpenGroup {
            prompt: prompt.clone(),
            expected: n,
            done: Vec::with_capacity(n),
            failed: 0,
            aborted: 0,
            handles: Vec::with_capacity(n),
        };
        for index in 0..n {
            let (handle, signal) = AbortHandle::new();
            open.handles.push(handle);
            let mut params = self.config.sampling.clone();
            params.seed = Some(sample_seed(self.config.seed, prompt.id.0, index as u64));
            let request = GenerationRequest {
                prompt_ids: prompt_ids.clone(),
                params,
                abort: signal,
            };
            let id = SampleId(self.next_sample);
            self.next_sample += 1;
            let (policy, reward, prompt) =
                (self.policy.clone(), self.reward.clone(), prompt.clone());
            let watchdog = self.watchdog.clone();
            let task = self.tasks.spawn(async move {
                let sample = SampleTask {
                    prompt,
                    group,
                    id,
                    watchdog,
                };
                let (outcome, reward_time) = sample.run(&*policy, &*reward, request).await;
                (group, outcome, reward_time)
            });
            self.task_groups.insert(task.id(), group);
        }
        self.open.insert(group, open);
        true
    }

    fn record_failure(&mut self, e: Error, samples: usize) {
        self.consecutive_failures += samples;
        self.last_error = Some(e);
    }

    fn on_outcome(&mut self, group: GroupId, outcome: Outcome, stats: &mut RolloutStats) {
        let Some(open) = self.open.get_mut(&group) else {
            return;
        };
        match outcome {
            Outcome::Done(sample) => {
                stats.samples_finished += 1;
                self.consecutive_failures = 0;
                open.done.push(*sample);
            }
            Outcome::Aborted(tokens) => {
                stats.samples_aborted += 1;
                if tokens > 0 {
                    stats.samples_wasted += 1;
                }
                open.aborted += 1;
            }
            Outcome::Failed(e) => {
                stats.samples_failed += 1;
                open.failed += 1;
                self.consecutive_failures += 1;
                self.last_error = Some(e);
            }
        }
        if open.done.len() + open.failed + open.aborted < open.expected {
            return;
        }
        let Some(open) = self.open.remove(&group) else {
            return;
        };
        if open.aborted > 0 {
            // Aborted when a batch closed: the group cannot complete, and its prompt must not be
            // lost (the dataset position counts it as drawn). It starts again, on new weights.
            self.requeue(open.prompt, open.done.len(), stats);
            return;
        }
        if open.done.is_empty() {
            return;
        }
        let mut done = open.done;
        // In sample order, not completion order: a rerun trains on the same batch.
        done.sort_by_key(|s| s.id);
        match Group::new(group, open.prompt, done) {
            Ok(g) => {
                self.ready.insert(group, g);
            }
            Err(e) => self.last_error = Some(e),
        }
    }

    /// The next completed group a batch may take. Asynchronous mode takes any, oldest first;
    /// synchronous mode takes groups in issue order only — a group waits while one issued
    /// before it is still generating — so that which groups form a batch (and which prompts are
    /// asked again after it) does not depend on how fast each request happened to finish: a
    /// rerun, or a run resumed from a checkpoint, trains on the same batches.
    fn next_ready(&mut self) -> Option<Group> {
        let (&first, _) = self.ready.first_key_value()?;
        let blocked = self.config.max_staleness == 0
            && self
                .open
                .first_key_value()
                .is_some_and(|(&open, _)| open < first);
        if blocked {
            return None;
        }
        self.ready.pop_first().map(|(_, g)| g)
    }

    /// Whether the group filter keeps `g` (a filter error drops it and is remembered).
    fn passes_filter(&mut self, g: &Group, stats: &mut RolloutStats) -> bool {
        let keep = match &self.filter {
            Some(f) => f.keep(g),
            None => Ok(true),
        };
        let keep = keep.unwrap_or_else(|e| {
            self.last_error = Some(e);
            false
        });
        if !keep {
            stats.groups_filtered += 1;
            stats.samples_filtered += g.len() as u64;
        }
        keep
    }

    async fn wait_one(&mut self, stats: &mut RolloutStats) {
        let joined = loop {
            let Some(watchdog) = &self.watchdog else {
                break self.tasks.join_next_with_id().await;
            };
            // `join_next` is cancel-safe: a timeout loses no finished task.
            let wait =
                tokio::time::timeout(watchdog.poll_interval(), self.tasks.join_next_with_id());
            match wait.await {
                Ok(joined) => break joined,
                Err(_) => stats.calls_overdue += watchdog.overdue().len() as u64,
            }
        };
        let Some(joined) = joined else {
            return;
        };
        match joined {
            Ok((task, (group, outcome, reward_time))) => {
                self.task_groups.remove(&task);
                stats.reward_time += reward_time;
                self.on_outcome(group, outcome, stats);
            }
            Err(join_error) => {
                // A panicking policy or reward worker costs its sample.
                let group = self.task_groups.remove(&join_error.id());
                if let Some(group) = group {
                    let e = Error::policy(format!("sample task failed: {join_error}"));
                    self.on_outcome(group, Outcome::Failed(e), stats);
                }
            }
        }
    }

    /// Aborts every request in flight, waits for them to finish, and re-queues the prompts of
    /// the groups that could not complete (they start again next step, on the new weights).
    async fn abort_all(&mut self, stats: &mut RolloutStats) {
        for open in self.open.values() {
            for h in &open.handles {
                h.abort();
            }
        }
        while !self.tasks.is_empty() {
            self.wait_one(stats).await;
        }
        // Every aborted group has closed and re-queued its prompt (`on_outcome`); a group that
        // completed while the others were aborting is in `ready` and is handled with it. One
        // still open lost a sample's outcome: its prompt is asked again too.
        for (_, open) in std::mem::take(&mut self.open) {
            self.requeue(open.prompt, open.done.len(), stats);
        }
    }

    /// Asks `prompt` again later, discarding the `finished` samples its group had generated.
    fn requeue(&mut self, prompt: Arc<Prompt>, finished: usize, stats: &mut RolloutStats) {
        stats.samples_aborted += finished as u64;
        stats.samples_wasted += finished as u64;
        stats.prompts_requeued += 1;
        self.requeued.push_back(prompt);
    }
}

/// One sample's generation and reward, watched.
struct SampleTask {
    prompt: Arc<Prompt>,
    group: GroupId,
    id: SampleId,
    watchdog: Option<Arc<Watchdog>>,
}

impl SampleTask {
    fn watch(&self, call: &str) -> Option<super::WatchGuard> {
        self.watchdog.as_ref().map(|w| {
            w.watch(format!(
                "{call} of sample {} (prompt {}, domain {})",
                self.id.0, self.prompt.id.0, self.prompt.domain
            ))
        })
    }

    /// Generates the sample and scores it: its outcome, and the reward call's wall time (zero
    /// when there was none).
    async fn run(
        self,
        policy: &dyn Generate,
        reward: &dyn RewardWorker,
        request: GenerationRequest,
    ) -> (Outcome, Duration) {
        // Ended before the reward call.
        let untimed = |o| (o, Duration::ZERO);
        let watch = self.watch("generation");
        let prompt_ids = request.prompt_ids.clone();
        let generation = policy.generate(request).await;
        drop(watch);
        let generation = match generation {
            Ok(g) => g,
            Err(e) => return untimed(Outcome::Failed(e)),
        };
        if generation.finish_reason == FinishReason::Abort {
            return untimed(Outcome::Aborted(generation.token_ids.len()));
        }
        let watch = self.watch("reward");
        let mut sample = Sample::new(self.id, self.group, self.prompt, prompt_ids);
        if let Err(e) = sample.push_turn(
            &generation.token_ids,
            &generation.logprobs,
            &generation.text,
            generation.weight_version,
            generation.finish_reason,
        ) {
            return untimed(Outcome::Failed(e));
        }
        let started = Instant::now();
        let scored = reward.score(&sample).await;
        let reward_time = started.elapsed();
        drop(watch);
        let outcome = match scored {
            Ok(r) => {
                sample.reward = Some(r);
                Outcome::Done(Box::new(sample))
            }
            Err(e) => Outcome::Failed(e),
        };
        (outcome, reward_time)
    }
}

#[async_trait]
impl Scheduler for RlvrScheduler {
    async fn next_batch(&mut self, current: WeightVersion) -> Result<RolloutBatch> {
        let mut stats = RolloutStats::default();
        let want = self.config.prompts_per_step;
        let give_up_after = want
            .saturating_mul(self.config.group_size)
            .saturating_mul(2)
            .max(8);
        let mut groups = Vec::with_capacity(want);
        let mut exhausted = false;
        // Groups dropped (filtered or stale) when the batch last grew: a batch that keeps none of
        // a very long run of groups would otherwise wait forever, and no call is slow enough for
        // the watchdog to see it.
        let drop_limit = DROPPED_IN_A_ROW.max(want.saturating_mul(50) as u64);
        let mut dropped_at_last_keep = 0;
        loop {
            while groups.len() < want {
                let Some(g) = self.next_ready() else {
                    break;
                };
                if !self.passes_filter(&g, &mut stats) {
                    continue;
                }
                let oldest = g.oldest_version().unwrap_or(current);
                if oldest.staleness(current) > self.config.max_staleness {
                    stats.groups_stale += 1;
                } else {
                    groups.push(g);
                    dropped_at_last_keep = stats.groups_filtered + stats.groups_stale;
                }
            }
            if groups.len() == want {
                break;
            }
            let dropped = stats.groups_filtered + stats.groups_stale - dropped_at_last_keep;
            if dropped >= drop_limit {
                return Err(Error::invalid_data(
                    "rollout",
                    format!(
                        "{dropped} groups in a row were dropped and none kept ({} by the group \
                         filter, e.g. every sample of the group scored the same; {} as older \
                         than rollout.max_staleness): the reward gives this policy no learning \
                         signal on these prompts",
                        stats.groups_filtered, stats.groups_stale
                    ),
                ));
            }
            if self.consecutive_failures >= give_up_after {
                let cause = self
                    .last_error
                    .take()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                return Err(Error::policy(format!(
                    "{} samples in a row failed; last error: {cause}",
                    self.consecutive_failures
                )));
            }
            // Synchronous mode aborts whatever is in flight when the batch closes, so it starts
            // only what this batch still needs (plus the oversampling slack); asynchronous mode
            // keeps the next batches' prompts in flight as well.
            let collected = if self.config.max_staleness == 0 {
                groups.len()
            } else {
                0
            };
            while !exhausted
                && collected + self.open.len() + self.ready.len() < self.target_in_flight()
            {
                exhausted = !self.start_prompt(&mut stats);
            }
            if self.tasks.is_empty() {
                if self.ready.is_empty() {
                    return Err(Error::invalid_data(
                        "prompt source",
                        format!(
                            "exhausted with {} of {want} groups collected (last error: {})",
                            groups.len(),
                            self.last_error
                                .as_ref()
                                .map_or_else(|| "none".to_string(), ToString::to_string)
                        ),
                    ));
                }
                continue;
            }
            self.wait_one(&mut stats).await;
        }
        if self.config.max_staleness > 0 {
            // Refill before returning: the engine generates the next batches' rollouts (on the
            // weights of this step, one version behind the next) while the trainer trains on
            // this one. Starting them only at the next call would leave the engine idle during
            // training.
            while !exhausted && self.open.len() + self.ready.len() < self.target_in_flight() {
                exhausted = !self.start_prompt(&mut stats);
            }
        } else {
            self.abort_all(&mut stats).await;
            // Groups that finished beyond the batch are off-policy after this step's update:
            // synchronous training discards their samples and asks their prompts again.
            for g in std::mem::take(&mut self.ready).into_values() {
                self.requeue(g.prompt().clone(), g.len(), &mut stats);
            }
            // Asked again in dataset order, whatever order the aborts completed in.
            self.requeued.make_contiguous().sort_by_key(|p| p.id);
        }
        // Completion order depends on timing; the batch's order does not, so that the same
        // groups train the same way (summation order included) in a rerun or a resumed run.
        groups.sort_by_key(Group::id);
        stats.record_staleness(&groups, current);
        Ok(RolloutBatch { groups, stats })
    }

    fn save_state(&self) -> Result<SchedulerState> {
        let mut in_flight: Vec<(GroupId, &Arc<Prompt>)> = self
            .open
            .iter()
            .map(|(id, g)| (*id, &g.prompt))
            .chain(self.ready.iter().map(|(&id, g)| (id, g.prompt())))
            .collect();
        in_flight.sort_by_key(|(id, _)| *id);
        let pending = self
            .requeued
            .iter()
            .chain(in_flight.into_iter().map(|(_, p)| p))
            .map(|p| Prompt::clone(p))
            .collect();
        Ok(SchedulerState {
            prompts_drawn: self.prompts_drawn,
            pending,
            next_group: self.next_group,
            next_sample: self.next_sample,
            open_groups: Vec::new(),
        })
    }

    fn restore_state(&mut self, state: SchedulerState) -> Result<()> {
        if self.prompts_drawn != 0 || self.next_group != 0 || !self.tasks.is_empty() {
            return Err(Error::invalid_data(
                "checkpoint",
                "a scheduler state is restored before the first batch",
            ));
        }
        for drawn in 0..state.prompts_drawn {
            if self.prompts.next().is_none() {
                return Err(Error::invalid_data(
                    "checkpoint",
                    format!(
                        "the prompt source ends after {drawn} prompts; the saved run had drawn {}",
                        state.prompts_drawn
                    ),
                ));
            }
        }
        self.prompts_drawn = state.prompts_drawn;
        self.requeued = state.pending.into_iter().map(Arc::new).collect();
        self.next_group = state.next_group;
        self.next_sample = state.next_sample;
        Ok(())
    }
}
