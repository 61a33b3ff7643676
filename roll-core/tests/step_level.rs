//! GiGPO through the batch builder: every assistant turn of a trajectory is a step-sample grouped
//! with the turns of the same group that acted on the same state; each turn's advantage lands on
//! its own tokens, observations get none. Numbers worked out by hand below.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use roll_algos::AlgorithmConfig;
use roll_algos::shaping::DomainMoments;
use roll_core::pipeline::{BatchInputs, build_train_batch};
use roll_core::{
    FinishReason, Group, GroupId, Prompt, PromptId, Reward, Sample, SampleId, WeightVersion,
};
use std::sync::Arc;

/// Two turns of two tokens each, an observation of three tokens between them.
fn trajectory(id: u64, prompt: &Arc<Prompt>, turns: [(u64, f32); 2]) -> Sample {
    let mut s = Sample::new(SampleId(id), GroupId(0), prompt.clone(), vec![1, 2]);
    for (i, (state, reward)) in turns.into_iter().enumerate() {
        if i > 0 {
            s.push_context(&[7, 7, 7]);
        }
        let turn = s
            .push_turn(
                &[3, 4],
                &[-0.5, -0.25],
                "ab",
                WeightVersion(0),
                FinishReason::Stop,
            )
            .unwrap();
        turn.state_key = Some(state);
        turn.reward = reward;
    }
    s.reward = Some(Reward::new(turns.iter().map(|t| t.1).sum()));
    s
}

#[test]
fn gigpo_gives_each_turn_its_episode_plus_anchor_state_advantage() {
    let prompt = Arc::new(Prompt::new(PromptId(0), "play", "env"));
    // Episode A: state 1 (reward 0), then state 2 (reward 1). Episode B: state 1 (0), state 3 (0).
    let a = trajectory(0, &prompt, [(1, 0.0), (2, 1.0)]);
    let b = trajectory(1, &prompt, [(1, 0.0), (3, 0.0)]);
    let group = Group::new(GroupId(0), prompt, vec![a, b]).unwrap();
    let algorithm: AlgorithmConfig = serde_json::from_value(serde_json::json!({
        "advantage": {"kind": "gigpo", "step_reward_gamma": 0.5, "std_normalize": false}
    }))
    .unwrap();
    let inputs = BatchInputs {
        max_turn_tokens: 16,
        ..Default::default()
    };
    let (batch, _) =
        build_train_batch(&[group], &algorithm, &inputs, &mut DomainMoments::new()).unwrap();
    // Step returns G (γ_s = 0.5): A = [0 + 0.5·1, 1] = [0.5, 1], B = [0, 0].
    // Episode scores: A 1, B 0 → A_ep = +0.5 / −0.5 (mean-centred).
    // Anchor state 1 holds A's 0.5 and B's 0 → A_step = +0.25 / −0.25; states 2 and 3 are met
    // once → 0.
    // Combined: A = [0.75, 0.5], B = [−0.75, −0.5], on every token of the turn (γ = 1).
    let expected: [[f32; 2]; 2] = [[0.75, 0.5], [-0.75, -0.5]];
    for (seq, turns) in batch.sequences().iter().zip(expected) {
        let want = [turns[0], turns[0], 0.0, 0.0, 0.0, turns[1], turns[1]];
        for (got, want) in seq.advantages.iter().zip(want) {
            assert!(
                (got - want).abs() < 1e-6,
                "{:?} vs {want:?}",
                seq.advantages
            );
        }
        assert_eq!(seq.loss_mask, [true, true, false, false, false, true, true]);
        assert_eq!(seq.rollout_logprobs.len(), 7);
        assert_eq!(seq.rollout_logprobs[..2], [-0.5, -0.25]);
    }
}

#[test]
fn gigpo_without_state_keys_is_a_named_error() {
    let prompt = Arc::new(Prompt::new(PromptId(0), "q", "math"));
    let mut s = Sample::new(SampleId(0), GroupId(0), prompt.clone(), vec![1]);
    s.push_turn(&[3], &[-0.1], "a", WeightVersion(0), FinishReason::Stop)
        .unwrap();
    s.reward = Some(Reward::new(1.0));
    let group = Group::new(GroupId(0), prompt, vec![s]).unwrap();
    let algorithm: AlgorithmConfig =
        serde_json::from_value(serde_json::json!({"advantage": {"kind": "gigpo"}})).unwrap();
    let err = build_train_batch(
        &[group],
        &algorithm,
        &BatchInputs::default(),
        &mut DomainMoments::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("algorithm.advantage.kind") && err.contains("state"),
        "{err}"
    );
}
