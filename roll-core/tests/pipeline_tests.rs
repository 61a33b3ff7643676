//! The traits wired together: mock policy, rewards and the echo environment through the scheduler,
//! the batch builder and the pipeline, all as trait objects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use roll_algos::AlgorithmConfig;
use roll_algos::filter::DynamicFilter;
use roll_core::episode::{EpisodeConfig, EpisodeIds, play_episode};
use roll_core::pipeline::RlvrPipeline;
use roll_core::scheduler::{RlvrScheduler, RlvrSchedulerConfig};
use roll_core::testing::{ByteTokenizer, ConstantReward, EchoEnv, FailingReward, MockPolicy};
use roll_core::{
    AbortSignal, Env, Generate, GroupId, Policy, Prompt, PromptId, RewardWorker, Sample, SampleId,
    SamplingParams, Scheduler, Tokenizer, WeightVersion,
};
use std::sync::Arc;
use std::time::Duration;

fn prompts(domain: &'static str) -> impl Iterator<Item = Prompt> + Send + 'static {
    (0..).map(move |i| Prompt::new(PromptId(i), format!("Say digits #{i}"), domain))
}

fn scheduler_config(prompts_per_step: usize, group_size: usize) -> RlvrSchedulerConfig {
    RlvrSchedulerConfig {
        prompts_per_step,
        group_size,
        sampling: SamplingParams {
            max_new_tokens: 8,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn scheduler(
    policy: Arc<dyn Generate>,
    reward: Arc<dyn RewardWorker>,
    config: RlvrSchedulerConfig,
) -> RlvrScheduler {
    RlvrScheduler::new(
        config,
        policy,
        Arc::new(ByteTokenizer),
        reward,
        prompts("digits"),
    )
    .unwrap()
}

/// A pipeline whose scheduler draws `config` prompts scored by `reward`.
fn pipeline(
    policy: Arc<dyn Policy>,
    reward: Arc<dyn RewardWorker>,
    config: RlvrSchedulerConfig,
) -> RlvrPipeline {
    RlvrPipeline::new(
        policy,
        move |generator| Ok(Box::new(scheduler(generator, reward, config)) as Box<dyn Scheduler>),
        AlgorithmConfig::default(),
        Default::default(),
    )
    .unwrap()
}

/// Fraction of the response's characters that are `7`.
fn sevens(s: &Sample) -> f32 {
    let digits = s.text.chars().filter(char::is_ascii_digit).count();
    if digits == 0 {
        0.0
    } else {
        s.text.chars().filter(|c| *c == '7').count() as f32 / digits as f32
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_policy_constant_reward_pipeline_runs_steps_and_versions_advance() {
    let policy: Arc<dyn Policy> = Arc::new(MockPolicy::digits());
    let reward: Arc<dyn RewardWorker> = Arc::new(ConstantReward(0.5));
    let mut pipeline = pipeline(policy.clone(), reward, scheduler_config(3, 4));
    for step in 0..3u64 {
        let report = pipeline.step().await.unwrap();
        assert_eq!(report.step, step);
        assert_eq!(report.groups, 3);
        assert_eq!(report.samples, 12);
        assert!((report.reward_mean - 0.5).abs() < 1e-6);
        assert_eq!(report.weight_version, WeightVersion(step + 1));
        assert_eq!(
            report.rollout.max_staleness, 0,
            "synchronous rollout is on-policy"
        );
    }
    assert_eq!(policy.weight_version(), WeightVersion(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpo_on_a_closure_reward_learns_to_say_seven() {
    let mock = Arc::new(MockPolicy::digits().with_learning_rate(4.0));
    let policy: Arc<dyn Policy> = mock.clone();
    let reward: Arc<dyn RewardWorker> = Arc::new(sevens);
    let mut pipeline = pipeline(policy, reward, scheduler_config(4, 8));
    let first = pipeline.step().await.unwrap().reward_mean;
    let mut last = first;
    for _ in 0..14 {
        last = pipeline.step().await.unwrap().reward_mean;
    }
    assert!(
        first < 0.3,
        "an untrained policy says 7 about a tenth of the time: {first}"
    );
    assert!(last > first + 0.3, "reward should rise: {first} -> {last}");
    assert!(mock.probabilities()[7] > 0.4, "{:?}", mock.probabilities());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_filter_drops_groups_without_signal_and_pulls_new_prompts() {
    let policy: Arc<dyn Policy> = Arc::new(MockPolicy::digits());
    // Every group of a constant reward has zero spread: all filtered, the source runs dry.
    let filter = DynamicFilter {
        min_std: Some(0.0),
        ..Default::default()
    };
    let mut s = RlvrScheduler::new(
        scheduler_config(2, 4),
        policy.clone(),
        Arc::new(ByteTokenizer),
        Arc::new(ConstantReward(1.0)),
        prompts("digits").take(5),
    )
    .unwrap()
    .with_filter(filter);
    let err = s
        .next_batch(WeightVersion(0))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("exhausted with 0 of 2 groups"), "{err}");

    // With a reward that varies, groups pass and the filter counts nothing... mostly: a group
    // whose samples happen to tie is dropped and replaced.
    let mut s = scheduler(policy, Arc::new(sevens), scheduler_config(2, 8)).with_filter(filter);
    let batch = s.next_batch(WeightVersion(0)).await.unwrap();
    assert_eq!(batch.groups.len(), 2);
    for g in &batch.groups {
        let r = g.rewards().unwrap();
        assert!(r.iter().any(|x| *x != r[0]), "kept group has spread: {r:?}");
    }
    assert!(
        batch.stats.prompts_started >= 2 + batch.stats.groups_filtered,
        "every kept or filtered group was started: {:?}",
        batch.stats
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_reward_costs_its_samples_not_the_run() {
    let policy: Arc<dyn Policy> = Arc::new(MockPolicy::digits());
    let reward = FailingReward {
        trigger: "3".into(),
        otherwise: 1.0,
    };
    let mut s = scheduler(policy, Arc::new(reward), scheduler_config(4, 6));
    let batch = s.next_batch(WeightVersion(0)).await.unwrap();
    assert_eq!(batch.groups.len(), 4);
    assert!(batch.stats.samples_failed > 0, "some responses contain a 3");
    for g in &batch.groups {
        assert!(g.samples().iter().all(|s| !s.text.contains('3')));
        assert!(g.len() <= 6);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_reward_costs_its_samples_not_the_run() {
    let policy: Arc<dyn Policy> = Arc::new(MockPolicy::digits());
    let reward = |s: &Sample| -> f32 {
        assert!(!s.text.contains('5'), "reward worker bug on {}", s.id);
        1.0
    };
    let mut s = scheduler(policy, Arc::new(reward), scheduler_config(3, 6));
    let batch = s.next_batch(WeightVersion(0)).await.unwrap();
    assert_eq!(batch.groups.len(), 3);
    assert!(batch.stats.samples_failed > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_mode_aborts_leftovers_and_async_mode_keeps_them_within_staleness() {
    let slow = || {
        Arc::new(
            MockPolicy::new(vec![u32::from(b'x')], None)
                .unwrap()
                .with_token_delay(Duration::from_millis(1)),
        )
    };
    // Oversampling leaves requests in flight when the batch is full; sync mode aborts them.
    let policy: Arc<dyn Policy> = slow();
    let mut config = scheduler_config(2, 2);
    config.oversample_prompts = 4;
    let mut s = scheduler(policy, Arc::new(ConstantReward(1.0)), config.clone());
    let batch = s.next_batch(WeightVersion(0)).await.unwrap();
    assert_eq!(batch.groups.len(), 2);
    assert!(batch.stats.samples_aborted > 0, "{:?}", batch.stats);

    // Async: max_staleness 1 keeps generating into the next step; data is at most 1 version old.
    let mock = slow();
    let policy: Arc<dyn Policy> = mock.clone();
    config.max_staleness = 1;
    let mut pipeline = pipeline(policy, Arc::new(ConstantReward(1.0)), config);
    for _ in 0..4 {
        let report = pipeline.step().await.unwrap();
        assert!(report.rollout.max_staleness <= 1, "{:?}", report.rollout);
    }
    assert_eq!(mock.steps(), 4);
}

/// The mock policy, with each request held back by a delay that depends on `jitter` and the
/// request's seed: two runs with different `jitter` finish the same requests in different orders.
struct Jittery {
    inner: MockPolicy,
    jitter: u64,
}

#[async_trait::async_trait]
impl Generate for Jittery {
    async fn generate(
        &self,
        request: roll_core::GenerationRequest,
    ) -> roll_core::Result<roll_core::Generation> {
        let seed = request.params.seed.unwrap_or(0);
        let mixed = (seed ^ self.jitter).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        tokio::time::sleep(Duration::from_micros(mixed % 4000)).await;
        self.inner.generate(request).await
    }

    fn weight_version(&self) -> WeightVersion {
        self.inner.weight_version()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_batches_do_not_depend_on_which_request_finishes_first() {
    // Oversampling and the filter make the batch a choice among more groups than it keeps; in
    // synchronous mode that choice follows issue order, so reruns (and resumed runs) agree.
    let filter = DynamicFilter {
        min_std: Some(0.0),
        ..Default::default()
    };
    let mut config = scheduler_config(3, 4);
    config.oversample_prompts = 6;
    let mut runs = Vec::new();
    for jitter in [1, 2, 3] {
        let policy = Arc::new(Jittery {
            inner: MockPolicy::digits(),
            jitter,
        });
        let mut s = scheduler(policy, Arc::new(sevens), config.clone()).with_filter(filter);
        let mut batches = Vec::new();
        for _ in 0..3 {
            let batch = s.next_batch(WeightVersion(0)).await.unwrap();
            let groups: Vec<(PromptId, Vec<String>)> = batch
                .groups
                .iter()
                .map(|g| {
                    let texts = g.samples().iter().map(|s| s.text.clone()).collect();
                    (g.prompt().id, texts)
                })
                .collect();
            batches.push(groups);
        }
        runs.push(batches);
    }
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_env_episode_records_turns_masks_and_rewards() {
    let policy: Box<dyn Generate> = Box::new(MockPolicy::digits());
    let tokenizer: Box<dyn Tokenizer> = Box::new(ByteTokenizer);
    let mut env: Box<dyn Env> = Box::new(EchoEnv::new(3));
    let config = EpisodeConfig {
        max_turns: 5,
        max_tokens_per_turn: 4,
        sampling: SamplingParams {
            seed: Some(11),
            ..Default::default()
        },
        ..Default::default()
    };
    let ids = EpisodeIds {
        sample: SampleId(1),
        group: GroupId(2),
        seed: 9,
    };
    let traj = play_episode(
        &*policy,
        &*tokenizer,
        &mut *env,
        ids,
        &config,
        &AbortSignal::never(),
    )
    .await
    .unwrap();
    // EchoEnv truncates after 3 steps.
    assert_eq!(traj.turns().len(), 3);
    assert_eq!(traj.info["episode_end"], "truncated");
    let segments = traj.response().segments();
    assert_eq!(segments.len(), 3, "one trained segment per turn");
    for (turn, seg) in traj.turns().iter().zip(&segments) {
        assert_eq!(&turn.span, seg);
        assert_eq!(turn.weight_version, WeightVersion(0));
        assert!(turn.state_key.is_some());
    }
    // Between turns: the echoed observation in ChatML, not trained on.
    let between = &traj.response().ids()[segments[0].end..segments[1].start];
    let glue = ByteTokenizer.decode(between).unwrap();
    assert!(
        glue.contains("<|im_start|>user\n") && glue.ends_with("<|im_start|>assistant\n"),
        "{glue:?}"
    );
    let total: f32 = traj.turns().iter().map(|t| t.reward).sum();
    assert_eq!(traj.reward.as_ref().unwrap().value, total);
    assert!(
        ByteTokenizer
            .decode(&traj.prompt_ids)
            .unwrap()
            .contains("echo #9")
    );
    // Same seeds, same episode.
    let again = play_episode(
        &*policy,
        &*tokenizer,
        &mut *env,
        ids,
        &config,
        &AbortSignal::never(),
    )
    .await
    .unwrap();
    assert_eq!(again.response(), traj.response());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_state_accounts_for_every_drawn_prompt_and_restores_the_position() {
    let policy = || -> Arc<dyn Generate> {
        Arc::new(
            MockPolicy::new(vec![u32::from(b'x')], None)
                .unwrap()
                .with_token_delay(Duration::from_millis(1)),
        )
    };
    let mut config = scheduler_config(2, 2);
    config.oversample_prompts = 4;
    let reward = Arc::new(ConstantReward(1.0));
    let mut a = scheduler(policy(), reward.clone(), config.clone());
    let first = a.next_batch(WeightVersion(0)).await.unwrap();
    let state = a.save_state().unwrap();
    // Every prompt drawn so far was trained on or waits to be asked again; none is lost.
    let trained: Vec<u64> = first.groups.iter().map(|g| g.prompt().id.0).collect();
    let pending: Vec<u64> = state.pending.iter().map(|p| p.id.0).collect();
    assert!(!pending.is_empty(), "oversampled prompts were re-queued");
    let mut all: Vec<u64> = trained.iter().chain(&pending).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..state.prompts_drawn).collect::<Vec<_>>());

    // A scheduler restored from the state is at the same position: it saves the same state,
    // and asks pending or new prompts, never a trained one again.
    let mut b = scheduler(policy(), reward, config);
    b.restore_state(state.clone()).unwrap();
    assert_eq!(b.save_state().unwrap(), state);
    let second = b.next_batch(WeightVersion(0)).await.unwrap();
    let ids: Vec<u64> = second.groups.iter().map(|g| g.prompt().id.0).collect();
    assert!(
        ids.iter()
            .all(|id| pending.contains(id) || *id >= state.prompts_drawn),
        "{ids:?}: trained {trained:?}, pending {pending:?}"
    );
    // Restoring twice, or after a batch, is refused.
    assert!(b.restore_state(state).is_err());
}

/// Answers after `delay`: a reward worker that hangs for a while.
struct SlowReward(Duration);

#[async_trait::async_trait]
impl RewardWorker for SlowReward {
    async fn score(&self, _sample: &Sample) -> roll_core::Result<roll_core::Reward> {
        tokio::time::sleep(self.0).await;
        Ok(roll_core::Reward::new(1.0))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_reports_the_time_its_reward_calls_took() {
    let policy: Arc<dyn Policy> = Arc::new(MockPolicy::digits());
    let slow = Arc::new(SlowReward(Duration::from_millis(60)));
    let mut pipeline = pipeline(policy, slow, scheduler_config(2, 2));
    let report = pipeline.step().await.unwrap();
    assert_eq!(report.samples, 4);
    // Four calls of at least 60 ms each, summed (they ran concurrently).
    let reward_s = report.metrics["rollout/reward_s"];
    assert!(reward_s >= 0.24, "{reward_s}");
    assert_eq!(report.rollout.reward_time.as_secs_f64(), reward_s);
    // No reference, critic or recomputed log-probs to score: nothing timed there.
    assert!(report.metrics["time/score_s"] < 0.05, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_reports_reward_calls_waiting_past_its_bound() {
    let policy: Arc<dyn Generate> = Arc::new(MockPolicy::digits());
    let mut config = scheduler_config(1, 2);
    config.hang_warning = Some(Duration::from_millis(20));
    let slow = Arc::new(SlowReward(Duration::from_millis(150)));
    let mut s = scheduler(policy.clone(), slow.clone(), config.clone());
    let batch = s.next_batch(WeightVersion(0)).await.unwrap();
    assert_eq!(
        batch.groups.len(),
        1,
        "a slow call is reported, not dropped"
    );
    assert!(
        batch.stats.calls_overdue >= 2,
        "both rewards waited past 20 ms: {:?}",
        batch.stats
    );
    // Fast calls, or no watchdog: nothing reported.
    let mut s = scheduler(
        policy.clone(),
        Arc::new(ConstantReward(1.0)),
        config.clone(),
    );
    assert_eq!(
        s.next_batch(WeightVersion(0))
            .await
            .unwrap()
            .stats
            .calls_overdue,
        0
    );
    config.hang_warning = None;
    let mut s = scheduler(policy, slow, config);
    assert_eq!(
        s.next_batch(WeightVersion(0))
            .await
            .unwrap()
            .stats
            .calls_overdue,
        0
    );
}

/// An episode of `env` played by the digits mock with the byte tokenizer, never aborted.
async fn play_digits(
    env: &mut dyn Env,
    ids: EpisodeIds,
    config: &EpisodeConfig,
) -> roll_core::Trajectory {
    let policy = MockPolicy::digits();
    play_episode(
        &policy,
        &ByteTokenizer,
        env,
        ids,
        config,
        &AbortSignal::never(),
    )
    .await
    .unwrap()
}

/// An [`EchoEnv`] whose `reset` and `step` each take `delay`.
struct SlowEnv {
    inner: EchoEnv,
    delay: Duration,
}

impl Env for SlowEnv {
    fn reset(&mut self, seed: u64) -> roll_core::Result<roll_core::Observation> {
        std::thread::sleep(self.delay);
        self.inner.reset(seed)
    }

    fn step(&mut self, action: &str) -> roll_core::Result<roll_core::StepResult> {
        std::thread::sleep(self.delay);
        self.inner.step(action)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_episode_records_the_time_its_environment_took() {
    let mut env = SlowEnv {
        inner: EchoEnv::new(3),
        delay: Duration::from_millis(40),
    };
    let ids = EpisodeIds {
        sample: SampleId(0),
        group: GroupId(0),
        seed: 1,
    };
    let config = EpisodeConfig {
        max_turns: 5,
        max_tokens_per_turn: 4,
        ..Default::default()
    };
    let traj = play_digits(&mut env, ids, &config).await;
    // A reset and three steps of 40 ms each; generation (the mock's) is not counted, so the
    // recorded time stays well under what a fifth call would add.
    let env_s = traj.info["env_s"].as_f64().unwrap();
    assert_eq!(traj.turns().len(), 3);
    assert!((0.16..0.4).contains(&env_s), "env_s {env_s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_episode_ends_before_its_trajectory_outgrows_the_context() {
    let mut env = EchoEnv::new(50);
    let ids = EpisodeIds {
        sample: SampleId(1),
        group: GroupId(2),
        seed: 9,
    };
    let long = EpisodeConfig {
        max_turns: 50,
        max_tokens_per_turn: 4,
        ..Default::default()
    };
    let unbounded = play_digits(&mut env, ids, &long).await;
    let length = |t: &roll_core::Trajectory| t.prompt_ids.len() + t.response().len();
    let context = length(&unbounded) / 2;
    let short = EpisodeConfig {
        max_context_tokens: context,
        ..long
    };
    let traj = play_digits(&mut env, ids, &short).await;
    assert_eq!(traj.info["episode_end"], "context_full");
    assert!(length(&traj) <= context, "{} > {context}", length(&traj));
    assert!(traj.turns().len() > 1 && traj.turns().len() < unbounded.turns().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_gives_up_when_the_filter_drops_every_group_for_a_long_run() {
    let policy: Arc<dyn Generate> = Arc::new(MockPolicy::digits());
    let filter = DynamicFilter {
        min_std: Some(0.0),
        ..Default::default()
    };
    // An endless source and a constant reward: every group is filtered, forever.
    let mut s = scheduler(
        policy,
        Arc::new(ConstantReward(1.0)),
        scheduler_config(2, 2),
    )
    .with_filter(filter);
    let err = s
        .next_batch(WeightVersion(0))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("groups in a row were dropped") && err.contains("no learning signal"),
        "{err}"
    );
}
