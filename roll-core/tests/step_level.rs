//! The step-level estimators through the batch builder. GiGPO: every assistant turn of a
//! trajectory is a step-sample grouped with the turns of the same group that acted on the same
//! state; step REINFORCE: every turn gets its normalised discounted step return. Each turn's
//! advantage lands on its own tokens, observations get none. Numbers worked out by hand below.

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
        "advantage": {
            "kind": "gigpo",
            "step_reward_gamma": 0.5,
            "episode_normalization": {"mean": "group"},
            "step_std_normalize": false
        }
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

/// Runs the batch builder on episodes A (state 1 → 0, state 2 → 1) and B (state 1 → 0,
/// state 3 → 0) and returns each trajectory's two turn advantages, checking that every token of
/// a turn got the same one and that observations got none.
fn turn_advantages(advantage: serde_json::Value) -> Vec<[f32; 2]> {
    let prompt = Arc::new(Prompt::new(PromptId(0), "play", "env"));
    let a = trajectory(0, &prompt, [(1, 0.0), (2, 1.0)]);
    let b = trajectory(1, &prompt, [(1, 0.0), (3, 0.0)]);
    let group = Group::new(GroupId(0), prompt, vec![a, b]).unwrap();
    let algorithm: AlgorithmConfig =
        serde_json::from_value(serde_json::json!({ "advantage": advantage })).unwrap();
    let inputs = BatchInputs {
        max_turn_tokens: 16,
        ..Default::default()
    };
    let (batch, _) =
        build_train_batch(&[group], &algorithm, &inputs, &mut DomainMoments::new()).unwrap();
    batch
        .sequences()
        .iter()
        .map(|seq| {
            let a = &seq.advantages;
            assert_eq!(a.len(), 7);
            assert!(a[0] == a[1] && a[5] == a[6], "{a:?}");
            assert_eq!(a[2..5], [0.0; 3]);
            [a[0], a[5]]
        })
        .collect()
}

fn assert_turns(got: &[[f32; 2]], want: &[[f32; 2]]) {
    for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
        assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
    }
}

#[test]
fn step_reinforce_normalises_discounted_step_returns_over_the_group() {
    // γ_s = 0.5: G_A = [0 + 0.5·1, 1] = [0.5, 1], G_B = [0, 0]. Default normalisation, group mean
    // and std: mean 0.375, std sqrt(0.6875/3) = 0.4787136 → (G − 0.375)/0.4787146.
    let got =
        turn_advantages(serde_json::json!({"kind": "step_reinforce", "step_reward_gamma": 0.5}));
    let (a0, a1, b) = (0.261_115_9, 1.305_579_7, -0.783_347_8);
    assert_turns(&got, &[[a0, a1], [b, b]]);
}

#[test]
fn step_reinforce_over_anchor_states() {
    // Mean over (group, state) only: state 1 holds G = 0.5 (A) and 0 (B), mean 0.25 → ±0.25;
    // states 2 and 3 are met once → G − G = 0.
    let got = turn_advantages(serde_json::json!({
        "kind": "step_reinforce",
        "step_reward_gamma": 0.5,
        "normalization": {"mean": "state_group_id"}
    }));
    assert_turns(&got, &[[0.25, 0.0], [-0.25, 0.0]]);
}

#[test]
fn step_reinforce_needs_state_keys_only_to_group_by_state() {
    let prompt = Arc::new(Prompt::new(PromptId(0), "q", "env"));
    let mut s = Sample::new(SampleId(0), GroupId(0), prompt.clone(), vec![1]);
    s.push_turn(&[3], &[-0.1], "a", WeightVersion(0), FinishReason::Stop)
        .unwrap()
        .reward = 1.0;
    s.reward = Some(Reward::new(1.0));
    let group = Group::new(GroupId(0), prompt, vec![s]).unwrap();
    let run = |normalization: serde_json::Value| {
        let algorithm: AlgorithmConfig = serde_json::from_value(serde_json::json!({
            "advantage": {"kind": "step_reinforce", "normalization": normalization}
        }))
        .unwrap();
        build_train_batch(
            std::slice::from_ref(&group),
            &algorithm,
            &BatchInputs::default(),
            &mut DomainMoments::new(),
        )
    };
    // No normalisation: the advantage is the step's return, 1.
    let (batch, _) = run(serde_json::json!({})).unwrap();
    assert_eq!(batch.sequences()[0].advantages, [1.0]);
    let err = run(serde_json::json!({"std": "state"}))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"step_reinforce\"") && err.contains("state"),
        "{err}"
    );
}
