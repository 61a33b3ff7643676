//! The environment manager: groups, redundancy, determinism, and surviving environments that
//! panic or hang.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use roll_core::config::{AgenticConfig, ComponentSpec};
use roll_core::episode::{EpisodeConfig, EpisodeIds};
use roll_core::scheduler::GroupFilter;
use roll_core::testing::{ByteTokenizer, MockPolicy};
use roll_core::{
    Env, Generate, Generation, GenerationRequest, Group, Observation, Scheduler, StepResult,
    WeightVersion,
};
use roll_env::manager::{IncidentKind, Phase};
use roll_env::{AgenticScheduler, EnvFactory, EnvManager, EnvManagerConfig, EnvRegistry};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the first instance a factory builds does wrong.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    PanicOnStep(u32),
    HangOnStep(u32),
    SlowSteps(Duration),
    PanicOnReset,
}

/// Terminates after `len` steps with reward 1 per step; the first instance built misbehaves.
struct Walk {
    len: u32,
    steps: u32,
    fault: Fault,
}

impl Env for Walk {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        if self.fault == Fault::PanicOnReset {
            panic!("reset exploded");
        }
        self.steps = 0;
        Ok(Observation::new(format!("walk {seed}")))
    }

    fn step(&mut self, _action: &str) -> roll_core::Result<StepResult> {
        self.steps += 1;
        match self.fault {
            Fault::PanicOnStep(n) if self.steps == n => panic!("boom on step {n}"),
            Fault::HangOnStep(n) if self.steps == n => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            Fault::SlowSteps(d) => std::thread::sleep(d),
            _ => {}
        }
        let observation = format!("at {}", self.steps);
        Ok(if self.steps >= self.len {
            StepResult::terminated(observation, 1.0)
        } else {
            StepResult::running(observation, 1.0)
        })
    }
}

/// A factory whose first instance has `fault` (every instance when `always`).
fn walk(len: u32, fault: Fault, always: bool) -> EnvFactory {
    let built = Arc::new(AtomicUsize::new(0));
    EnvFactory::new("walk", move || {
        let first = built.fetch_add(1, Ordering::SeqCst) == 0;
        let fault = if first || always { fault } else { Fault::None };
        Ok(Walk {
            len,
            steps: 0,
            fault,
        })
    })
}

fn policy() -> Arc<MockPolicy> {
    let alphabet = b"LRUD".iter().map(|&b| u32::from(b)).collect();
    Arc::new(MockPolicy::new(alphabet, Some(ByteTokenizer::EOS)).unwrap())
}

fn config(group_size: usize, redundancy: usize, threads: usize) -> EnvManagerConfig {
    let mut episode = EpisodeConfig {
        max_turns: 10,
        max_tokens_per_turn: 4,
        ..EpisodeConfig::default()
    };
    episode.sampling.seed = Some(5);
    EnvManagerConfig {
        group_size,
        group_size_redundancy: redundancy,
        episode,
        num_threads: threads,
        seed: 5,
        ..EnvManagerConfig::default()
    }
}

fn manager(config: EnvManagerConfig, factory: EnvFactory) -> EnvManager {
    EnvManager::new(config, factory, policy(), Arc::new(ByteTokenizer)).unwrap()
}

#[tokio::test]
async fn groups_share_a_seed_and_batches_are_reproducible() {
    let mut m = manager(config(3, 0, 4), walk(4, Fault::None, false));
    let batch = m.collect(4).await.unwrap();
    assert_eq!(batch.groups.len(), 4);
    assert_eq!(batch.num_samples(), 12);
    assert_eq!(
        (batch.stats.samples_finished, batch.stats.samples_failed),
        (12, 0)
    );
    let mut seeds = Vec::new();
    for g in &batch.groups {
        assert_eq!(g.len(), 3);
        assert!(g.samples().iter().all(|s| s.prompt.id == g.prompt().id));
        seeds.push(g.prompt().id);
        for t in g.samples() {
            assert_eq!(t.turns().len(), 4);
            assert_eq!(
                t.response().segments().len(),
                4,
                "one trained segment per turn"
            );
            assert!(t.turns().iter().all(|turn| turn.reward == 1.0));
            assert!(
                t.turns()
                    .iter()
                    .all(|turn| turn.weight_version == WeightVersion(0))
            );
            assert!(t.turns().iter().all(|turn| turn.state_key.is_some()));
            assert_eq!(t.reward_value().unwrap(), 4.0);
            assert_eq!(t.info["episode_end"], "terminated");
        }
    }
    seeds.dedup();
    assert_eq!(seeds.len(), 4, "each group its own seed");

    let mut again = manager(config(3, 0, 2), walk(4, Fault::None, false));
    let other = again.collect(4).await.unwrap();
    for (a, b) in batch.groups.iter().zip(&other.groups) {
        for (x, y) in a.samples().iter().zip(b.samples()) {
            assert_eq!((x.id, x.response().ids()), (y.id, y.response().ids()));
        }
    }
    let next = m.collect(2).await.unwrap();
    assert_eq!(
        next.groups[0].id().0,
        4,
        "group ids continue across batches"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redundancy_lets_a_group_finish_without_its_slowest_episode() {
    let slow = Fault::SlowSteps(Duration::from_secs(2));
    let mut m = manager(config(2, 1, 3), walk(3, slow, false));
    let start = Instant::now();
    let batch = m.collect(1).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(batch.groups[0].len(), 2);
    assert_eq!(batch.stats.samples_finished, 2);
    assert_eq!(batch.stats.samples_failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_an_env_that_panics_on_step_3_and_reports_it() {
    let mut m = manager(config(2, 0, 2), walk(5, Fault::PanicOnStep(3), false));
    let batch = m.collect(2).await.unwrap();
    assert_eq!(batch.num_samples(), 4);
    assert_eq!(batch.stats.samples_failed, 1);
    assert_eq!(batch.stats.samples_finished, 4);
    assert_eq!(m.totals().restarts, 1);
    let panics: Vec<_> = m
        .incidents()
        .filter(
            |i| matches!(&i.kind, IncidentKind::Panicked { message } if message.contains("step 3")),
        )
        .collect();
    assert_eq!(panics.len(), 1);
    let text = panics[0].to_string();
    assert!(
        text.contains("walk") && text.contains("panicked: boom on step 3"),
        "{text}"
    );
    assert!(panics[0].episode.is_some());
}

#[tokio::test]
async fn survives_an_env_that_hangs_and_reports_it() {
    let mut cfg = config(2, 0, 2);
    cfg.step_timeout = Duration::from_millis(200);
    cfg.hung_timeout = Duration::from_millis(50);
    let seen = Arc::new(AtomicUsize::new(0));
    let hook_seen = seen.clone();
    let mut m = manager(cfg, walk(3, Fault::HangOnStep(2), false)).with_incident_hook(Arc::new(
        move |_| {
            hook_seen.fetch_add(1, Ordering::SeqCst);
        },
    ));
    let start = Instant::now();
    let batch = m.collect(2).await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(batch.num_samples(), 4);
    assert_eq!(batch.stats.samples_failed, 1);
    let stalled = m
        .incidents()
        .find(|i| {
            matches!(
                i.kind,
                IncidentKind::Stalled {
                    phase: Phase::Stepping,
                    ..
                }
            )
        })
        .expect("the watchdog reports the hung step");
    let timed_out = m
        .incidents()
        .find(|i| {
            matches!(
                i.kind,
                IncidentKind::TimedOut {
                    phase: Phase::Stepping,
                    ..
                }
            )
        })
        .expect("the step timeout fires");
    assert_eq!(stalled.slot, timed_out.slot);
    assert!(
        timed_out
            .to_string()
            .contains("did not finish its step within 200ms")
    );
    assert_eq!((m.totals().timeouts, m.totals().restarts), (1, 1));
    assert!(seen.load(Ordering::SeqCst) >= 2);
    // The hung thread was replaced: no thread of the watchdog's view is stuck.
    let view = m.watchdog().snapshot();
    assert_eq!(view.len(), 2);
    assert!(view.iter().any(|s| s.restarts == 1));
    assert!(m.watchdog().stalled(Duration::from_millis(150)).is_empty());
}

#[tokio::test]
async fn gives_up_when_every_episode_fails() {
    let mut cfg = config(1, 0, 2);
    cfg.max_consecutive_failures = 5;
    let mut m = manager(cfg, walk(3, Fault::PanicOnReset, true));
    let err = m.collect(1).await.unwrap_err().to_string();
    assert!(
        err.contains("in a row") && err.contains("reset exploded"),
        "{err}"
    );
}

#[tokio::test]
async fn the_agentic_scheduler_plays_a_builtin_env_from_config() {
    let mut agentic = AgenticConfig::new(ComponentSpec::new("frozen_lake"));
    agentic.num_groups = 2;
    agentic.group_size = 2;
    agentic.max_turns = 3;
    agentic.max_tokens_per_turn = 4;
    agentic.format_penalty = -0.01;
    let registry = EnvRegistry::with_builtins();
    let mut scheduler =
        AgenticScheduler::from_config(&agentic, &registry, policy(), Arc::new(ByteTokenizer), 1)
            .unwrap();
    let s: &mut dyn Scheduler = &mut scheduler;
    let batch = s.next_batch(roll_core::WeightVersion(0)).await.unwrap();
    assert_eq!((batch.groups.len(), batch.num_samples()), (2, 4));
    for t in batch.groups.iter().flat_map(|g| g.samples()) {
        // "LRUD" soup never parses: three penalised no-op turns.
        assert_eq!(t.turns().len(), 3);
        assert!((t.reward_value().unwrap() + 0.03).abs() < 1e-6);
        assert_eq!(t.prompt.domain, "frozen_lake");
        assert!(t.prompt.text.contains("FrozenLake"));
    }
}

#[test]
fn works_on_a_runtime_without_timers() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut cfg = config(2, 0, 2);
    cfg.step_timeout = Duration::from_millis(100);
    let mut m = manager(cfg, walk(3, Fault::HangOnStep(1), false));
    let batch = runtime.block_on(m.collect(1)).unwrap();
    assert_eq!(batch.num_samples(), 2);
    assert_eq!(m.totals().timeouts, 1);
}

/// The mock policy, recording the sampling seed of every request.
struct SeedLog {
    inner: MockPolicy,
    seeds: std::sync::Mutex<Vec<Option<u64>>>,
}

impl SeedLog {
    fn new() -> Arc<Self> {
        let alphabet = b"LRUD".iter().map(|&b| u32::from(b)).collect();
        Arc::new(Self {
            inner: MockPolicy::new(alphabet, Some(ByteTokenizer::EOS)).unwrap(),
            seeds: std::sync::Mutex::new(Vec::new()),
        })
    }

    fn seeds(&self) -> Vec<Option<u64>> {
        self.seeds.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Generate for SeedLog {
    async fn generate(&self, request: GenerationRequest) -> roll_core::Result<Generation> {
        self.seeds.lock().unwrap().push(request.params.seed);
        self.inner.generate(request).await
    }

    fn weight_version(&self) -> WeightVersion {
        self.inner.weight_version()
    }
}

/// Responses of a batch, group by group, sample by sample.
fn responses(batch: &roll_core::RolloutBatch) -> Vec<Vec<Vec<u32>>> {
    batch
        .groups
        .iter()
        .map(|g| {
            g.samples()
                .iter()
                .map(|s| s.response().ids().to_vec())
                .collect()
        })
        .collect()
}

/// A config that leaves `episode.sampling.seed` unset: the manager's run seed must reach sampling.
fn seeded(seed: u64, threads: usize) -> EnvManagerConfig {
    EnvManagerConfig {
        group_size: 3,
        episode: EpisodeConfig {
            max_turns: 10,
            max_tokens_per_turn: 4,
            ..EpisodeConfig::default()
        },
        num_threads: threads,
        seed,
        ..EnvManagerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_seed_reaches_every_turn_of_every_episode() {
    let log = SeedLog::new();
    let mut m = EnvManager::new(
        seeded(11, 3),
        walk(4, Fault::None, false),
        log.clone(),
        Arc::new(ByteTokenizer),
    )
    .unwrap();
    let batch = m.collect(2).await.unwrap();
    // 2 groups × 3 episodes × 4 turns, each request seeded, no two alike.
    let seeds = log.seeds();
    assert_eq!(seeds.len(), 24);
    let distinct: std::collections::BTreeSet<u64> = seeds.iter().map(|s| s.unwrap()).collect();
    assert_eq!(distinct.len(), 24, "{seeds:?}");
    // Exactly the seeds the formula gives for these episodes (group, sample id, turn 0..4).
    let mut expected = std::collections::BTreeSet::new();
    for g in &batch.groups {
        for s in g.samples() {
            let ids = EpisodeIds {
                sample: s.id,
                group: g.id(),
                seed: g.prompt().id.0,
            };
            expected.extend((0..4).map(|turn| ids.turn_seed(11, turn)));
        }
    }
    assert_eq!(distinct, expected);
    // Episodes of one group play the same level but sample differently.
    let texts = responses(&batch);
    assert!(
        texts.iter().all(|g| g[0] != g[1] || g[1] != g[2]),
        "{texts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_run_seed_replays_the_rollout_and_another_seed_does_not() {
    let run = |seed: u64, threads: usize| async move {
        let mut m = manager(seeded(seed, threads), walk(4, Fault::None, false));
        let first = m.collect(2).await.unwrap();
        let second = m.collect(2).await.unwrap();
        (responses(&first), responses(&second))
    };
    let a = run(7, 4).await;
    // Another thread count changes the timing, not the rollout.
    assert_eq!(a, run(7, 1).await);
    let b = run(8, 4).await;
    assert_ne!(a.0, b.0);
    assert_ne!(a.1, b.1);
    // Batches of one run differ from each other too.
    assert_ne!(a.0, a.1);
}

#[tokio::test]
async fn a_filter_replaces_rejected_groups_with_new_ones() {
    let m = manager(config(2, 0, 2), walk(3, Fault::None, false));
    // Keeps even group ids only: group 1 is rejected and group 2 takes its place.
    let mut scheduler = AgenticScheduler::new(m, 2)
        .unwrap()
        .with_filter(|g: &Group| g.id().0.is_multiple_of(2));
    let batch = scheduler
        .next_batch(roll_core::WeightVersion(0))
        .await
        .unwrap();
    let ids: Vec<u64> = batch.groups.iter().map(|g| g.id().0).collect();
    assert_eq!(ids, [0, 2]);
    assert_eq!(
        (batch.stats.groups_filtered, batch.stats.prompts_started),
        (1, 3)
    );
    // Samples of the rejected group were played (and counted) all the same.
    assert_eq!(batch.stats.samples_finished, 6);
    let next = scheduler
        .next_batch(roll_core::WeightVersion(0))
        .await
        .unwrap();
    let ids: Vec<u64> = next.groups.iter().map(|g| g.id().0).collect();
    assert_eq!((ids, next.stats.groups_filtered), (vec![4, 6], 2));
}

#[tokio::test]
async fn the_dynamic_filter_applies_and_a_hopeless_filter_fails_the_batch() {
    // Every walk earns 3: no group has any spread, so DAPO's `min_std = 0` rejects them all.
    let m = manager(config(2, 0, 2), walk(3, Fault::None, false));
    let filter = roll_algos::filter::DynamicFilter {
        min_std: Some(0.0),
        ..Default::default()
    };
    let mut scheduler = AgenticScheduler::new(m, 2)
        .unwrap()
        .with_filter(filter)
        .with_max_filtered(3);
    assert_eq!(scheduler.max_filtered(), 3);
    let err = scheduler
        .next_batch(roll_core::WeightVersion(0))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rejected 4 groups of `walk`") && err.contains("at most 3"),
        "{err}"
    );
    // The default budget is ten groups per group of the batch.
    let m = manager(config(2, 0, 2), walk(3, Fault::None, false));
    assert_eq!(AgenticScheduler::new(m, 3).unwrap().max_filtered(), 30);
}

/// A filter that cannot judge any group.
struct Broken;

impl GroupFilter for Broken {
    fn keep(&self, _: &Group) -> roll_core::Result<bool> {
        Err(roll_core::Error::invalid_data("group", "no verdict"))
    }
}

#[tokio::test]
async fn a_filter_error_counts_as_a_rejection_and_is_reported() {
    let m = manager(config(1, 0, 1), walk(2, Fault::None, false));
    let mut scheduler = AgenticScheduler::new(m, 1)
        .unwrap()
        .with_filter(Broken)
        .with_max_filtered(0);
    let err = scheduler
        .next_batch(roll_core::WeightVersion(0))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rejected 1 groups") && err.contains("no verdict"),
        "{err}"
    );
}

/// Bumps the policy's weight version, as a training step does.
async fn train(policy: &MockPolicy) {
    use roll_core::Train;
    let objective = roll_core::policy::Objective::default();
    policy
        .train_step(roll_core::TrainBatch::default(), &objective)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_batches_play_during_training_and_drop_groups_past_the_staleness_bound() {
    let mut cfg = config(2, 0, 8);
    cfg.max_staleness = 1;
    let policy = policy();
    let mut m = EnvManager::new(
        cfg,
        walk(3, Fault::None, false),
        policy.clone(),
        Arc::new(ByteTokenizer),
    )
    .unwrap();
    let first = m.collect(2).await.unwrap();
    assert_eq!(first.groups.len(), 2);
    // The next batch was started when this one was handed over: it plays while "training".
    let next: Vec<u64> = m.open_groups().iter().map(|g| g.0).collect();
    assert_eq!(next, [2, 3]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    train(&policy).await;
    let second = m.collect(2).await.unwrap();
    let ids: Vec<u64> = second.groups.iter().map(|g| g.id().0).collect();
    assert_eq!(ids, [2, 3], "the groups started ahead make the next batch");
    assert_eq!(second.stats.groups_stale, 0);
    // Played on version 0 and trained on at version 1: one version stale, within the bound.
    assert_eq!(second.stats.max_staleness, 1);
    // Two trainings before the next collect: the groups started ahead (played on version 1)
    // are then two versions old, so both are replaced by new groups played on version 3.
    tokio::time::sleep(Duration::from_millis(300)).await;
    train(&policy).await;
    train(&policy).await;
    let third = m.collect(2).await.unwrap();
    assert_eq!(third.stats.groups_stale, 2, "{:?}", third.stats);
    let ids: Vec<u64> = third.groups.iter().map(|g| g.id().0).collect();
    assert_eq!(ids, [6, 7]);
    assert_eq!(third.stats.max_staleness, 0);
    let current = policy.weight_version();
    for s in third.groups.iter().flat_map(Group::samples) {
        assert!(s.weight_version().unwrap().staleness(current) <= 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_scheduler_checkpoints_its_open_groups_and_restarts_them() {
    let mut cfg = config(2, 0, 8);
    cfg.max_staleness = 1;
    let mut a =
        AgenticScheduler::new(manager(cfg.clone(), walk(3, Fault::None, false)), 2).unwrap();
    a.next_batch(WeightVersion(0)).await.unwrap();
    let state = a.save_state().unwrap();
    assert_eq!(state.open_groups, [2, 3]);
    assert_eq!(state.next_group, 4);
    // A scheduler restored from it plays those groups first, on their own seeds (with new
    // sample ids: they are played again, as an asynchronous RLVR run's pending prompts are).
    let mut b =
        AgenticScheduler::new(manager(cfg.clone(), walk(3, Fault::None, false)), 2).unwrap();
    b.restore_state(state).unwrap();
    let resumed = b.next_batch(WeightVersion(0)).await.unwrap();
    let continued = a.next_batch(WeightVersion(0)).await.unwrap();
    let key = |batch: &roll_core::RolloutBatch| -> Vec<(u64, u64)> {
        batch
            .groups
            .iter()
            .map(|g| (g.id().0, g.prompt().id.0))
            .collect()
    };
    assert_eq!(key(&resumed), key(&continued));
    assert_eq!(
        key(&resumed).iter().map(|k| k.0).collect::<Vec<_>>(),
        [2, 3]
    );
}
