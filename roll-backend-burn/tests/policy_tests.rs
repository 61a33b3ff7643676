//! `BurnPolicy` as roll-core's `Policy`: generation → train step → weight sync → the next
//! generation uses the new weights; the train–inference gap metric; frozen and critic roles;
//! checkpoint and resume through the policy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use roll_backend_burn::train::TrainerConfig;
use roll_backend_burn::{BurnPolicy, Device, PolicyOptions, load_model};
use roll_core::policy::{
    GenerationRequest, Objective, Policy, SamplingParams, ScoreRequest, ScoreSequence,
};
use roll_core::{SampleId, TrainBatch, TrainSequence, WeightVersion};
use support::fixture;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

fn trainer_config() -> TrainerConfig {
    TrainerConfig {
        lr: 1e-4,
        ..TrainerConfig::default()
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        max_new_tokens: 12,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

/// A batch that rewards exactly the generated tokens (advantage +1 everywhere).
fn reinforce(prompt: &[u32], response: &[u32], logprobs: &[f32]) -> TrainBatch {
    let n = response.len();
    TrainBatch::new(vec![TrainSequence {
        sample: SampleId(0),
        prompt_ids: prompt.to_vec(),
        response_ids: response.to_vec(),
        loss_mask: vec![true; n],
        old_logprobs: logprobs.to_vec(),
        ref_logprobs: None,
        advantages: vec![1.0; n],
        returns: Some(vec![0.5; n]),
        old_values: None,
        weight: 1.0,
        score: 1.0,
    }])
    .unwrap()
}

fn score_request(prompt: &[u32], response: &[u32]) -> ScoreRequest {
    ScoreRequest {
        sequences: vec![ScoreSequence {
            prompt_ids: prompt.to_vec(),
            response_ids: response.to_vec(),
        }],
        with_entropy: false,
    }
}

#[test]
fn an_actor_step_syncs_weights_and_keeps_the_gap_small() {
    let device = Device::flex();
    let model = load_model(fixture("tiny-qwen2-sft"), &device).unwrap();
    let policy = BurnPolicy::actor(model, trainer_config(), PolicyOptions::default()).unwrap();
    rt().block_on(async {
        let prompt = vec![10u32, 11, 12, 13];
        assert_eq!(policy.weight_version(), WeightVersion(0));
        let g = policy
            .generate(GenerationRequest::new(prompt.clone(), sampled(1)))
            .await
            .unwrap();
        assert_eq!(g.weight_version, WeightVersion(0));
        let before = policy
            .score(&score_request(&prompt, &g.token_ids))
            .await
            .unwrap();
        let out = policy
            .train_step(
                &reinforce(&prompt, &g.token_ids, &g.logprobs),
                &Objective::default(),
            )
            .await
            .unwrap();
        assert_eq!(out.weight_version, WeightVersion(1));
        assert_eq!(policy.weight_version(), WeightVersion(1));
        let gap = out.metrics["train_infer_logprob_gap"];
        assert!(gap <= 1e-4, "train-inference gap {gap}");
        assert!(out.metrics["grad_norm"] > 0.0);
        // Scoring and generation now use the new weights.
        let after = policy
            .score(&score_request(&prompt, &g.token_ids))
            .await
            .unwrap();
        let sum = |s: &[f32]| s.iter().sum::<f32>();
        let (b, a) = (sum(&before[0].logprobs), sum(&after[0].logprobs));
        assert!(a > b, "reinforced tokens became more likely: {b} -> {a}");
        let g2 = policy
            .generate(GenerationRequest::new(prompt.clone(), sampled(1)))
            .await
            .unwrap();
        assert_eq!(g2.weight_version, WeightVersion(1));
    });
}

#[test]
fn frozen_policies_generate_but_refuse_to_train() {
    let device = Device::flex();
    let model = load_model(fixture("tiny-qwen2"), &device).unwrap();
    let policy = BurnPolicy::frozen(model, PolicyOptions::default()).unwrap();
    rt().block_on(async {
        let g = policy
            .generate(GenerationRequest::new(vec![1, 2, 3], sampled(0)))
            .await
            .unwrap();
        let err = policy
            .train_step(
                &reinforce(&[1, 2, 3], &g.token_ids, &g.logprobs),
                &Objective::default(),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("frozen"), "{err}");
        assert_eq!(policy.weight_version(), WeightVersion(0));
    });
}

#[test]
fn a_critic_learns_values_and_does_not_generate() {
    let device = Device::flex();
    let trunk = load_model(fixture("tiny-qwen2"), &device).unwrap();
    let config = TrainerConfig {
        lr: 1e-2,
        ..TrainerConfig::default()
    };
    let critic = BurnPolicy::critic(trunk, None, config, PolicyOptions::default()).unwrap();
    rt().block_on(async {
        assert!(
            critic
                .generate(GenerationRequest::new(vec![1, 2], sampled(0)))
                .await
                .is_err()
        );
        let (prompt, response) = (vec![5u32, 6, 7], vec![8u32, 9, 10, 11]);
        let batch = reinforce(&prompt, &response, &[0.0; 4]); // returns 0.5 everywhere
        let error = |scores: &[roll_core::policy::TokenScores]| {
            let v = scores[0].values.as_ref().expect("values");
            v.iter().map(|x| (x - 0.5).abs()).sum::<f32>()
        };
        let first = error(
            &critic
                .score(&score_request(&prompt, &response))
                .await
                .unwrap(),
        );
        let objective = Objective::default();
        for _ in 0..5 {
            critic.train_step(&batch, &objective).await.unwrap();
        }
        let last = error(
            &critic
                .score(&score_request(&prompt, &response))
                .await
                .unwrap(),
        );
        assert!(last < first * 0.9, "value error {first} -> {last}");
        assert_eq!(critic.weight_version(), WeightVersion(5));
    });
}

#[test]
fn checkpoint_and_resume_through_the_policy_continue_exactly() {
    let device = Device::flex();
    let model = load_model(fixture("tiny-qwen2-sft"), &device).unwrap();
    let dir = std::env::temp_dir().join(format!("roll-policy-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = || PolicyOptions {
        gap_probe_tokens: 0,
        ..PolicyOptions::default()
    };
    let policy = BurnPolicy::actor(model, trainer_config(), options()).unwrap();
    rt().block_on(async {
        let prompt = vec![20u32, 21, 22];
        let g = policy
            .generate(GenerationRequest::new(prompt.clone(), sampled(4)))
            .await
            .unwrap();
        let batch = reinforce(&prompt, &g.token_ids, &g.logprobs);
        policy
            .train_step(&batch, &Objective::default())
            .await
            .unwrap();
        policy.save_checkpoint(&dir).unwrap();
        let resumed = BurnPolicy::resume_actor(&dir, options()).unwrap();
        assert_eq!(resumed.weight_version(), WeightVersion(1));
        let a = policy
            .train_step(&batch, &Objective::default())
            .await
            .unwrap();
        let b = resumed
            .train_step(&batch, &Objective::default())
            .await
            .unwrap();
        assert_eq!(a.metrics["loss"], b.metrics["loss"]);
        assert_eq!(a.weight_version, b.weight_version);
        let sa = policy
            .score(&score_request(&prompt, &g.token_ids))
            .await
            .unwrap();
        let sb = resumed
            .score(&score_request(&prompt, &g.token_ids))
            .await
            .unwrap();
        assert_eq!(sa, sb, "resumed weights equal uninterrupted weights");
        // Generation after resume uses the same weights too.
        let ga = policy
            .generate(GenerationRequest::new(prompt.clone(), sampled(9)))
            .await
            .unwrap();
        let gb = resumed
            .generate(GenerationRequest::new(prompt.clone(), sampled(9)))
            .await
            .unwrap();
        assert_eq!(ga, gb);
    });
    let _ = std::fs::remove_dir_all(&dir);
}
