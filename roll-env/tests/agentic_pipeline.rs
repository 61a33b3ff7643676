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
