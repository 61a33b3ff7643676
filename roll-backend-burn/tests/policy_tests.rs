//! The Burn roles: `BurnPolicy` as roll-core's `Policy` (generation → train step → one weight
//! sync → the next generation uses the new weights; the train–inference gap metric; PPO epochs
//! inside one step; the two scoring kernels), `BurnFrozen`, `BurnReference`, `BurnCritic`;
//! checkpoint and resume through the policy. (That a reference cannot train or a critic generate
//! is checked by the compiler: see the `compile_fail` examples on `roll_backend_burn::policy`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use roll_backend_burn::train::{LoraConfig, TrainKernels, TrainerConfig};
use roll_backend_burn::{
    BurnCritic, BurnFrozen, BurnPolicy, BurnReference, Device, HfTokenizer, Placement,
    PolicyOptions, load_model,
};
use roll_core::policy::{
    Generate, GenerationRequest, Objective, SamplingParams, Score, ScoreKernels, ScoreRequest,
    ScoreSequence, Train,
};
use roll_core::{SampleId, Tokenizer, TrainBatch, TrainSequence, WeightVersion};
use std::sync::Arc;
use support::fixture;

fn tokenizer(name: &str) -> Arc<dyn Tokenizer> {
    Arc::new(HfTokenizer::from_dir(fixture(name)).unwrap())
}

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
        rollout_logprobs: logprobs.to_vec(),
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
        ..Default::default()
    }
}

fn actor(name: &str, trainer: TrainerConfig, options: PolicyOptions) -> BurnPolicy {
    let model = load_model(fixture(name), &Device::flex()).unwrap();
    BurnPolicy::new(model, tokenizer(name), trainer, options).unwrap()
}

#[test]
fn an_actor_step_syncs_weights_and_the_gap_is_zero() {
    let policy = actor("tiny-qwen2-sft", trainer_config(), PolicyOptions::default());
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
                reinforce(&prompt, &g.token_ids, &g.logprobs),
                &Objective::default(),
            )
            .await
            .unwrap();
        assert_eq!(out.weight_version, WeightVersion(1));
        assert_eq!(policy.weight_version(), WeightVersion(1));
        assert_eq!(out.metrics["train_infer_logprob_gap"], 0.0);
        assert!(out.metrics["grad_norm"] > 0.0);
        // Where the step's time went: the update (its optimiser part within it), publishing
        // the weights, the gap probe.
        let time = |k: &str| out.metrics.get(k).copied().unwrap_or(f64::NAN);
        let (update, optimizer) = (time("time/update_s"), time("time/optimizer_s"));
        assert!(
            update > 0.0 && optimizer > 0.0 && optimizer < update,
            "{out:?}"
        );
        assert!(time("time/weight_sync_s") > 0.0, "{out:?}");
        assert!(time("time/gap_probe_s") > 0.0, "{out:?}");
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

/// A GRPO batch from groups of samples of the same prompt: reward = the share of even token
/// ids in the response, advantage = the reward normalised within its group.
fn grpo_batch(groups: &[(Vec<u32>, Vec<roll_core::policy::Generation>)]) -> TrainBatch {
    let mut seqs = Vec::new();
    for (prompt, samples) in groups {
        let rewards: Vec<f32> = samples
            .iter()
            .map(|g| {
                let even = g.token_ids.iter().filter(|&&t| t % 2 == 0).count();
                even as f32 / g.token_ids.len().max(1) as f32
            })
            .collect();
        let mean = rewards.iter().sum::<f32>() / rewards.len() as f32;
        let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f32>() / rewards.len() as f32;
        for (g, r) in samples.iter().zip(&rewards) {
            let n = g.token_ids.len();
            seqs.push(TrainSequence {
                sample: SampleId(seqs.len() as u64),
                prompt_ids: prompt.clone(),
                response_ids: g.token_ids.clone(),
                loss_mask: vec![true; n],
                old_logprobs: g.logprobs.clone(),
                rollout_logprobs: g.logprobs.clone(),
                ref_logprobs: None,
                advantages: vec![(r - mean) / (var.sqrt() + 1e-6); n],
                returns: None,
                old_values: None,
                weight: 1.0,
                score: *r,
            });
        }
    }
    TrainBatch::new(seqs).unwrap()
}

/// Four seeded samples of each of three prompts (the seeds depend on `round`).
fn sample_all(
    policy: &BurnPolicy,
    round: u64,
) -> Vec<(Vec<u32>, Vec<roll_core::policy::Generation>)> {
    let prompts = [
        vec![10u32, 11, 12, 13],
        vec![40u32, 41, 42],
        vec![7u32, 8, 9, 10, 11],
    ];
    prompts
        .iter()
        .map(|p| {
            let samples: Vec<_> = (0..4)
                .map(|i| {
                    let params = SamplingParams {
                        max_new_tokens: 24,
                        seed: Some(round * 100 + i),
                        ..SamplingParams::default()
                    };
                    rt().block_on(policy.generate(GenerationRequest::new(p.clone(), params)))
                        .unwrap()
                })
                .collect();
            (p.clone(), samples)
        })
        .collect()
}

/// The training forward *is* the engine's forward on the CPU: before and after a real GRPO step,
/// the log-probs the trainer computes for fresh rollouts are the bits the engine sampled them
/// with, and the probe gap reads exactly 0.
#[test]
fn after_a_grpo_step_the_trainer_computes_the_sampled_logprobs_bit_for_bit() {
    // Full fine-tuning, and LoRA (the engine serves the merged weights).
    let lora = TrainerConfig {
        lr: 1e-3,
        lora: Some(LoraConfig {
            rank: 4,
            alpha: 8.0,
            target_modules: vec!["q_proj".into(), "v_proj".into(), "up_proj".into()],
        }),
        ..trainer_config()
    };
    for config in [trainer_config(), lora] {
        let policy = actor("tiny-qwen2-sft", config, PolicyOptions::default());
        for round in 0..2 {
            let groups = sample_all(&policy, round);
            for (_, samples) in &groups {
                assert!(
                    samples
                        .iter()
                        .all(|g| g.weight_version == WeightVersion(round))
                );
            }
            let out = rt()
                .block_on(policy.train_step(grpo_batch(&groups), &Objective::default()))
                .unwrap();
            assert_eq!(out.weight_version, WeightVersion(round + 1));
            // The batch's old log-probs are the sampled ones, so `approx_kl` (the mean of
            // ½·(logp − old)² over the trained tokens) is 0 only if every log-prob of the training
            // forward has the sampled bits; every ratio is then exactly 1.
            let m = &out.metrics;
            assert_eq!(m["approx_kl"], 0.0, "round {round}: {m:?}");
            assert_eq!(m["ratio_mean"], 1.0, "round {round}");
            assert_eq!(m["train_infer_logprob_gap"], 0.0, "round {round}");
            assert!(m["grad_norm"] > 0.0);
        }
    }
    // The metrics do measure: Burn's autodiff forward (another summation order) is off in the
    // last bits.
    let autodiff = TrainerConfig {
        kernels: TrainKernels::Autodiff,
        ..trainer_config()
    };
    let policy = actor("tiny-qwen2-sft", autodiff, PolicyOptions::default());
    let groups = sample_all(&policy, 0);
    let out = rt()
        .block_on(policy.train_step(grpo_batch(&groups), &Objective::default()))
        .unwrap();
    assert!(out.metrics["approx_kl"] > 0.0);
    assert!(out.metrics["train_infer_logprob_gap"] > 0.0);
}

/// `devices = [cpu, cpu]`: the step is split across two trainer replicas and gives the one-device
/// step's weights; the served weights are still the engine's kernels' bits (gap 0, ratio 1).
#[test]
fn a_data_parallel_actor_steps_as_a_one_device_actor() {
    let config = TrainerConfig {
        lr: 1e-3,
        eps: 1e-3,
        ..trainer_config()
    };
    let one = actor("tiny-qwen2-sft", config.clone(), PolicyOptions::default());
    let two = actor(
        "tiny-qwen2-sft",
        config,
        PolicyOptions {
            placement: Placement::Devices(vec![roll_backend_burn::DeviceSpec::Cpu; 2]),
            ..PolicyOptions::default()
        },
    );
    let before = support::params(&two.model().unwrap());
    let groups = sample_all(&one, 0);
    let batch = grpo_batch(&groups);
    let a = rt()
        .block_on(one.train_step(batch.clone(), &Objective::default()))
        .unwrap();
    let b = rt()
        .block_on(two.train_step(batch, &Objective::default()))
        .unwrap();
    assert_eq!(b.weight_version, WeightVersion(1));
    assert_eq!(a.metrics["trained_tokens"], b.metrics["trained_tokens"]);
    assert!((a.metrics["loss"] - b.metrics["loss"]).abs() < 1e-5);
    let m = &b.metrics;
    assert_eq!(m["approx_kl"], 0.0, "{m:?}");
    assert_eq!(m["ratio_mean"], 1.0);
    assert_eq!(m["train_infer_logprob_gap"], 0.0);
    let (pa, pb) = (
        support::params(&one.model().unwrap()),
        support::params(&two.model().unwrap()),
    );
    let mut moved = 0.0f32;
    for (k, v) in &pa {
        let d = support::max_abs_diff(v, &pb[k]);
        assert!(d <= 1e-5, "{k} differs by {d}");
        moved = moved.max(support::max_abs_diff(v, &before[k]));
    }
    assert!(moved > 1e-4, "the step changed nothing");
    assert!(
        BurnPolicy::new(
            load_model(fixture("tiny-qwen2-sft"), &Device::flex()).unwrap(),
            tokenizer("tiny-qwen2-sft"),
            trainer_config(),
            PolicyOptions {
                placement: Placement::Devices(Vec::new()),
                ..PolicyOptions::default()
            },
        )
        .is_err()
    );
}

#[test]
fn ppo_epochs_run_inside_one_step_and_sync_the_weights_once() {
    let config = TrainerConfig {
        epochs: 3,
        ..trainer_config()
    };
    let policy = actor("tiny-qwen2-sft", config, PolicyOptions::default());
    rt().block_on(async {
        let prompt = vec![10u32, 11, 12];
        let g = policy
            .generate(GenerationRequest::new(prompt.clone(), sampled(2)))
            .await
            .unwrap();
        let out = policy
            .train_step(
                reinforce(&prompt, &g.token_ids, &g.logprobs),
                &Objective::default(),
            )
            .await
            .unwrap();
        assert_eq!(out.metrics["epochs"], 3.0);
        // Three optimiser updates, one weight version.
        assert_eq!(out.metrics["step"], 3.0);
        assert_eq!(policy.weight_version(), WeightVersion(1));
        assert_eq!(policy.engine().stats().weight_version, WeightVersion(1));
    });
}

#[test]
fn both_scoring_kernels_reproduce_the_sampled_logprobs_on_the_cpu() {
    let policy = actor("tiny-qwen2-sft", trainer_config(), PolicyOptions::default());
    rt().block_on(async {
        let prompt = vec![30u32, 31, 32, 33];
        let g = policy
            .generate(GenerationRequest::new(prompt.clone(), sampled(5)))
            .await
            .unwrap();
        let mut request = score_request(&prompt, &g.token_ids);
        request.kernels = ScoreKernels::Inference;
        let inference = policy.score(&request).await.unwrap();
        request.kernels = ScoreKernels::Training;
        let training = policy.score(&request).await.unwrap();
        // The engine's kernels give back exactly what the rollout was sampled with, and the
        // training forward on the CPU is the engine's forward.
        assert_eq!(inference[0].logprobs, g.logprobs);
        assert_eq!(training[0].logprobs, g.logprobs);
    });
}

#[test]
fn frozen_roles_generate_and_score_with_the_weights_they_were_given() {
    let device = Device::flex();
    let model = load_model(fixture("tiny-qwen2"), &device).unwrap();
    let judge = BurnFrozen::new(
        model.clone(),
        tokenizer("tiny-qwen2"),
        PolicyOptions::default(),
    )
    .unwrap();
    let reference = BurnReference::new(model, PolicyOptions::default()).unwrap();
    rt().block_on(async {
        let g = judge
            .generate(GenerationRequest::new(vec![1, 2, 3], sampled(0)))
            .await
            .unwrap();
        assert_eq!(judge.weight_version(), WeightVersion(0));
        let request = score_request(&[1, 2, 3], &g.token_ids);
        let a = judge.score(&request).await.unwrap();
        let b = reference.score(&request).await.unwrap();
        assert_eq!(a, b);
        assert_eq!(a[0].logprobs, g.logprobs);
    });
}

#[test]
fn a_critic_learns_values() {
    let device = Device::flex();
    let trunk = load_model(fixture("tiny-qwen2"), &device).unwrap();
    let config = TrainerConfig {
        lr: 1e-2,
        ..TrainerConfig::default()
    };
    let critic = BurnCritic::new(trunk, None, config, PolicyOptions::default()).unwrap();
    rt().block_on(async {
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
        let mut version = WeightVersion(0);
        for _ in 0..5 {
            version = critic
                .train_step(batch.clone(), &objective)
                .await
                .unwrap()
                .weight_version;
        }
        let last = error(
            &critic
                .score(&score_request(&prompt, &response))
                .await
                .unwrap(),
        );
        assert!(last < first * 0.9, "value error {first} -> {last}");
        assert_eq!(version, WeightVersion(5));
    });
}

#[test]
fn checkpoint_and_resume_through_the_policy_continue_exactly() {
    let dir = std::env::temp_dir().join(format!("roll-policy-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = || PolicyOptions {
        gap_probe_tokens: 0,
        ..PolicyOptions::default()
    };
    let policy = actor("tiny-qwen2-sft", trainer_config(), options());
    rt().block_on(async {
        let prompt = vec![20u32, 21, 22];
        let g = policy
            .generate(GenerationRequest::new(prompt.clone(), sampled(4)))
            .await
            .unwrap();
        let batch = reinforce(&prompt, &g.token_ids, &g.logprobs);
        policy
            .train_step(batch.clone(), &Objective::default())
            .await
            .unwrap();
        policy.save_checkpoint(&dir).unwrap();
        let resumed = BurnPolicy::resume(&dir, tokenizer("tiny-qwen2-sft"), options()).unwrap();
        assert_eq!(resumed.weight_version(), WeightVersion(1));
        let a = policy
            .train_step(batch.clone(), &Objective::default())
            .await
            .unwrap();
        let b = resumed
            .train_step(batch, &Objective::default())
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

/// `tiny-qwen2` with its context cut to `max_positions` tokens, in a fresh directory.
fn short_context_copy(max_positions: usize) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("roll-short-context-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture("tiny-qwen2")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let config = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    json["max_position_embeddings"] = max_positions.into();
    std::fs::write(&config, json.to_string()).unwrap();
    dir
}

#[test]
fn sequences_longer_than_the_context_are_refused_by_name_everywhere() {
    let dir = short_context_copy(16);
    let model = load_model(&dir, &Device::flex()).unwrap();
    assert_eq!(model.max_position_embeddings(), Some(16));
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(HfTokenizer::from_dir(&dir).unwrap());
    let policy =
        BurnPolicy::new(model, tokenizer, trainer_config(), PolicyOptions::default()).unwrap();
    let rt = rt();
    let too_long = |e: roll_core::Error| {
        let text = e.to_string();
        assert!(
            text.contains("max_position_embeddings (16)"),
            "not a named length error: {text}"
        );
    };
    // Generation: prompt 10 + up to 12 new tokens does not fit 16; prompt 4 + 12 does.
    let request = |n: usize| GenerationRequest::new((1..=n as u32).collect(), sampled(1));
    too_long(rt.block_on(policy.generate(request(10))).unwrap_err());
    let fits = rt.block_on(policy.generate(request(4))).unwrap();
    assert!(!fits.token_ids.is_empty());
    // Scoring, with either kernels.
    let (prompt, response): (Vec<u32>, Vec<u32>) = ((1..=10).collect(), (20..28).collect());
    for kernels in [ScoreKernels::Inference, ScoreKernels::Training] {
        let mut req = score_request(&prompt, &response);
        req.kernels = kernels;
        too_long(rt.block_on(policy.score(&req)).unwrap_err());
    }
    // Training.
    let batch = reinforce(&prompt, &response, &[-1.0; 8]);
    too_long(
        rt.block_on(policy.train_step(batch, &Objective::default()))
            .unwrap_err(),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
