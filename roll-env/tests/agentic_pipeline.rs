//! The agentic loop end to end: the environment manager plays multi-turn episodes with the actor,
//! the same pipeline as RLVR turns the trajectories into a train batch, and the actor learns.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use roll_algos::AlgorithmConfig;
use roll_core::episode::EpisodeConfig;
use roll_core::pipeline::{RlvrPipeline, RlvrPipelineConfig};
use roll_core::scheduler::Scheduler;
use roll_core::testing::{ByteTokenizer, MockPolicy};
use roll_core::{Env, Observation, Policy, SamplingParams, StepResult};
use roll_env::{AgenticScheduler, EnvFactory, EnvManager, EnvManagerConfig};
use std::sync::Arc;

/// Three turns; each turn whose answer contains a 7 earns 1/3.
struct SayTheNumber {
    turn: u32,
}

impl Env for SayTheNumber {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.turn = 0;
        Ok(Observation::new(format!("Episode {seed}: say 7.")))
    }

    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        self.turn += 1;
        let reward = if action.contains('7') { 1.0 / 3.0 } else { 0.0 };
        let observation = format!("turn {} done", self.turn);
        Ok(if self.turn >= 3 {
            StepResult::truncated(observation, reward)
        } else {
            StepResult::running(observation, reward)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentic_grpo_through_the_env_manager_learns() {
    let mock = Arc::new(MockPolicy::digits().with_learning_rate(3.0));
    let actor: Arc<dyn Policy> = mock.clone();
    let factory = EnvFactory::new("say_the_number", || Ok(SayTheNumber { turn: 0 }));
    let config = EnvManagerConfig {
        group_size: 6,
        episode: EpisodeConfig {
            max_turns: 5,
            max_tokens_per_turn: 4,
            sampling: SamplingParams {
                seed: Some(3),
                ..Default::default()
            },
            domain: "say_the_number".into(),
            ..Default::default()
        },
        num_threads: 4,
        ..Default::default()
    };
    let scheduler = move |generator| -> roll_core::Result<Box<dyn Scheduler>> {
        let manager = EnvManager::new(config, factory, generator, Arc::new(ByteTokenizer))?;
        Ok(Box::new(AgenticScheduler::new(manager, 4)?))
    };
    let mut pipeline = RlvrPipeline::new(
        actor,
        scheduler,
        AlgorithmConfig::default(),
        RlvrPipelineConfig {
            max_turn_tokens: 64,
            ..Default::default()
        },
    )
    .unwrap();

    let first = pipeline.step().await.unwrap();
    assert_eq!(first.groups, 4);
    assert_eq!(first.samples, 24);
    let mut last = first.clone();
    for _ in 0..12 {
        last = pipeline.step().await.unwrap();
    }
    assert!(
        last.reward_mean > first.reward_mean + 0.2,
        "episode reward should rise: {} -> {}",
        first.reward_mean,
        last.reward_mean
    );
    assert_eq!(mock.steps(), 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_agentic_scheduler_plays_the_batch_the_saved_one_would_have() {
    let factory = || EnvFactory::new("say_the_number", || Ok(SayTheNumber { turn: 0 }));
    let config = EnvManagerConfig {
        // No redundancy: which of a group's redundant episodes finish first is a matter of
        // timing, not of the checkpoint.
        group_size: 3,
        episode: EpisodeConfig {
            max_turns: 3,
            max_tokens_per_turn: 4,
            sampling: SamplingParams {
                seed: Some(5),
                ..Default::default()
            },
            ..Default::default()
        },
        num_threads: 4,
        seed: 17,
        ..Default::default()
    };
    let scheduler = || {
        let manager = EnvManager::new(
            config.clone(),
            factory(),
            Arc::new(MockPolicy::digits()),
            Arc::new(ByteTokenizer),
        )
        .unwrap();
        AgenticScheduler::new(manager, 2).unwrap()
    };
    let fingerprint = |batch: &roll_core::RolloutBatch| -> Vec<(u64, u64, u64, Vec<u32>)> {
        batch
            .groups
            .iter()
            .flat_map(|g| g.samples())
            .map(|s| {
                (
                    s.group.0,
                    s.id.0,
                    s.prompt.id.0,
                    s.response().ids().to_vec(),
                )
            })
            .collect()
    };
    let mut original = scheduler();
    original.next_batch(Default::default()).await.unwrap();
    let state = original.save_state().unwrap();
    assert!(state.pending.is_empty());
    assert!(state.next_group >= 2, "{state:?}");
    let expected = fingerprint(&original.next_batch(Default::default()).await.unwrap());

    let mut restored = scheduler();
    restored.restore_state(state.clone()).unwrap();
    let replayed = fingerprint(&restored.next_batch(Default::default()).await.unwrap());
    assert_eq!(replayed, expected);
    // A fresh scheduler would have played other groups (other seeds).
    let fresh = fingerprint(&scheduler().next_batch(Default::default()).await.unwrap());
    assert_ne!(fresh, expected);
    // Restoring is for a scheduler that has not started, and a state with pending prompts is
    // not an agentic one.
    assert!(original.restore_state(state.clone()).is_err());
    let mut foreign = state;
    foreign
        .pending
        .push(roll_core::Prompt::new(roll_core::PromptId(1), "q", "t"));
    assert!(scheduler().restore_state(foreign).is_err());
}
