#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The fused CPU training path against Burn's autodiff: every parameter's gradient on both
//! Qwen2 fixtures and on Qwen3 (QK-norm, untied head, free head width), for objectives that use
//! the log-probs, the entropy and a KL term; micro-batch splits; a whole step.

mod support;
use support::{grads_of, params};

use roll_algos::loss::{KlLoss, ValueLossConfig};
use roll_backend_burn::train::{CriticTrainer, LoraConfig, TrainKernels, Trainer, TrainerConfig};
use roll_backend_burn::{CausalLm, Device, HfConfig, ScoringOptions, load_model, score};
use roll_core::policy::{Objective, ScoreRequest, ScoreSequence};
use roll_core::rng::SplitMix64;
use roll_core::{SampleId, TrainBatch, TrainSequence};
use std::collections::BTreeMap;

fn dev() -> Device {
    Device::flex()
}

/// `‖a − b‖ / ‖b‖`.
fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm.max(1e-30)).sqrt()
}

fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// Sequences of mixed lengths with untrained tokens, advantages of both signs and reference
/// log-probs near the model's own.
fn batch(model: &CausalLm, n: usize, seed: u64) -> TrainBatch {
    batch_of(model, n, seed, 12, 14)
}

/// [`batch`] with prompts of 1 to `prompt` tokens and responses of 1 to `response`.
fn batch_of(model: &CausalLm, n: usize, seed: u64, prompt: usize, response: usize) -> TrainBatch {
    let vocab = model.vocab_size();
    let mut rng = SplitMix64::new(seed);
    let mut seqs: Vec<TrainSequence> = (0..n)
        .map(|i| {
            let p = 1 + below(&mut rng, prompt);
            let r = 1 + below(&mut rng, response);
            TrainSequence {
                sample: SampleId(i as u64),
                prompt_ids: (0..p).map(|_| below(&mut rng, vocab) as u32).collect(),
                response_ids: (0..r).map(|_| below(&mut rng, vocab) as u32).collect(),
                loss_mask: (0..r).map(|t| t == 0 || below(&mut rng, 5) != 0).collect(),
                old_logprobs: vec![0.0; r],
                rollout_logprobs: vec![0.0; r],
                ref_logprobs: None,
                advantages: (0..r).map(|_| rng.next_f64() as f32 * 2.0 - 0.8).collect(),
                returns: None,
                old_values: None,
                weight: 0.5 + rng.next_f64() as f32,
                score: rng.next_f64() as f32 - 0.5,
            }
        })
        .collect();
    let request = ScoreRequest {
        sequences: seqs
            .iter()
            .map(|s| ScoreSequence {
                prompt_ids: s.prompt_ids.clone(),
                response_ids: s.response_ids.clone(),
            })
            .collect(),
        ..Default::default()
    };
    let scores = score(model, None, &request, &ScoringOptions::default(), &dev()).unwrap();
    for (s, sc) in seqs.iter_mut().zip(scores) {
        // Old log-probs slightly off the model's, so the PPO ratio is not 1 and clipping acts.
        s.old_logprobs = sc
            .logprobs
            .iter()
            .enumerate()
            .map(|(t, l)| l + 0.1 * ((t % 3) as f32 - 1.0))
            .collect();
        s.ref_logprobs = Some(sc.logprobs.iter().map(|l| l - 0.05).collect());
    }
    TrainBatch::new(seqs).unwrap()
}

fn objective() -> Objective {
    Objective {
        entropy_coef: 0.01,
        kl_loss: Some(KlLoss {
            coef: 0.1,
            estimator: Default::default(),
        }),
        ..Objective::default()
    }
}

/// A trainer at an RL learning rate. AdamW's first update moves each weight by about
/// `lr·g/(|g| + ε)`, whatever the gradient's scale, so a weight whose gradient is near zero
/// carries the gradient's rounding differences into the update at the scale of `lr`.
fn trainer(model: &CausalLm, kernels: TrainKernels, micro_batch_size: Option<usize>) -> Trainer {
    let config = TrainerConfig {
        lr: 1e-4,
        kernels,
        micro_batch_size,
        ..TrainerConfig::default()
    };
    Trainer::new(model.clone(), config, &dev()).unwrap()
}

/// Gradients of one batch on `kernels`.
fn gradients(
    model: &CausalLm,
    batch: &TrainBatch,
    kernels: TrainKernels,
    micro_batch_size: Option<usize>,
) -> (BTreeMap<String, Vec<f32>>, f64) {
    let t = trainer(model, kernels, micro_batch_size);
    assert_eq!(
        t.kernels(),
        kernels,
        "the trainer runs the kernels asked for"
    );
    let g = t.accumulate_gradients(batch, &objective()).unwrap();
    let loss = g.loss;
    (grads_of(t.training_model().unwrap(), g.grads), loss)
}

fn assert_same_gradients(model: &CausalLm, name: &str) {
    assert_same_gradients_on(model, &batch(model, 6, 7), name);
}

fn assert_same_gradients_on(model: &CausalLm, b: &TrainBatch, name: &str) {
    let b = b.clone();
    let (fused, fused_loss) = gradients(model, &b, TrainKernels::Auto, None);
    let (reference, reference_loss) = gradients(model, &b, TrainKernels::Autodiff, None);
    assert!(
        (fused_loss - reference_loss).abs() <= 1e-5 * reference_loss.abs().max(1.0),
        "{name}: loss {fused_loss} vs {reference_loss}"
    );
    assert_eq!(
        fused.keys().collect::<Vec<_>>(),
        reference.keys().collect::<Vec<_>>()
    );
    for (k, g) in &fused {
        let err = relative_error(g, &reference[k]);
        assert!(err <= 1e-4, "{name}: {k}: relative error {err:e}");
    }
}

fn random(config: HfConfig) -> CausalLm {
    let m = CausalLm::init(&config, &dev()).unwrap();
    let _ = params(&m); // every lazy parameter takes its value before the clones
    m
}

#[test]
fn fused_gradients_match_autodiff_on_the_qwen2_fixtures() {
    for name in ["tiny-qwen2", "tiny-qwen2-sft"] {
        let model = load_model(support::fixture(name), &dev()).unwrap();
        assert_same_gradients(&model, name);
    }
}

/// A batch whose activations are large enough (≥ 256 KiB, 512 tokens of the fixture's 128
/// features; this one has 1,625) that the CPU kernels take their buffers from the pool of recycled ones, and
/// after a first step, from buffers holding that step's values: a kernel that read a buffer it
/// was given before writing all of it would compute something else the second time.
#[test]
fn fused_gradients_on_recycled_buffers_match_autodiff_and_the_first_step_bit_for_bit() {
    let model = load_model(support::fixture("tiny-qwen2"), &dev()).unwrap();
    let b = batch_of(&model, 14, 11, 100, 160);
    let tokens: usize = b
        .sequences()
        .iter()
        .map(|s| s.prompt_ids.len() + s.response_ids.len())
        .sum();
    assert!(tokens * 128 >= 1 << 16, "{tokens} tokens: too few to pool");
    let first = gradients(&model, &b, TrainKernels::Auto, None);
    assert_same_gradients_on(&model, &b, "tiny-qwen2, recycled buffers");
    let again = gradients(&model, &b, TrainKernels::Auto, None);
    assert_eq!(first.1.to_bits(), again.1.to_bits(), "the loss");
    for (k, g) in &first.0 {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(g), bits(&again.0[k]), "{k}");
    }
}

#[test]
fn fused_gradients_match_autodiff_on_qwen3_with_an_untied_head() {
    let mut c = HfConfig::new("qwen3", 96, 24, 40, 2, 4);
    c.num_key_value_heads = Some(2);
    c.head_dim = Some(8); // heads·head_dim = 32 ≠ hidden 24
    c.tie_word_embeddings = false;
    assert_same_gradients(&random(c), "qwen3");
}

/// LoRA on the fused path: the forward multiplies by `W + scale·A·B`, the backward turns each
/// adapted weight's gradient into the adapters' (`dA = scale·dW·Bᵀ`, `dB = scale·Aᵀ·dW`) and
/// leaves every frozen parameter without one. Checked after a step, so that `B ≠ 0` and both
/// factors have a gradient.
#[test]
fn fused_lora_gradients_match_autodiff() {
    let model = load_model(support::fixture("tiny-qwen2-sft"), &dev()).unwrap();
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        target_modules: ["q_proj", "v_proj", "gate_proj", "down_proj"]
            .map(String::from)
            .to_vec(),
    };
    let mut trainers: Vec<Trainer> = [TrainKernels::Auto, TrainKernels::Autodiff]
        .into_iter()
        .map(|kernels| {
            let config = TrainerConfig {
                lr: 1e-3,
                kernels,
                lora: Some(lora.clone()),
                ..TrainerConfig::default()
            };
            let t = Trainer::new(model.clone(), config, &dev()).unwrap();
            assert_eq!(t.kernels(), kernels);
            t
        })
        .collect();
    for t in &mut trainers {
        assert!(!t.step(&batch(&model, 6, 5), &objective()).unwrap().skipped);
    }
    let b = batch(&model, 6, 9);
    let grads: Vec<_> = trainers
        .iter()
        .map(|t| {
            let g = t.accumulate_gradients(&b, &objective()).unwrap();
            grads_of(t.training_model().unwrap(), g.grads)
        })
        .collect();
    let (fused, reference) = (&grads[0], &grads[1]);
    assert_eq!(
        fused.keys().collect::<Vec<_>>(),
        reference.keys().collect::<Vec<_>>(),
        "the same parameters train"
    );
    // Two factors per adapted weight (4 layer kinds in every layer), nothing else.
    assert!(
        fused.keys().all(|k| k.ends_with(".a") || k.ends_with(".b")),
        "{:?}",
        fused.keys()
    );
    assert_eq!(fused.len(), 2 * trainers[0].num_adapters());
    for (k, g) in fused {
        assert!(g.iter().any(|v| *v != 0.0), "{k}: a zero gradient");
        let err = relative_error(g, &reference[k]);
        assert!(err <= 1e-4, "{k}: relative error {err:e}");
    }
}

/// The critic on the fused path: the trunk's forward and backward are the fused kernels, the
/// value head and the (clipped) value loss sit on top; every gradient — head and trunk — matches
/// autodiff's, full fine-tuning and LoRA on the trunk.
#[test]
fn fused_critic_gradients_match_autodiff() {
    let model = load_model(support::fixture("tiny-qwen2-sft"), &dev()).unwrap();
    let mut b = batch(&model, 6, 13).sequences().to_vec();
    for s in &mut b {
        let n = s.response_ids.len();
        s.returns = Some((0..n).map(|t| 0.3 * (t % 4) as f32 - 0.4).collect());
        s.old_values = Some((0..n).map(|t| 0.02 * t as f32 - 0.1).collect());
    }
    let b = TrainBatch::new(b).unwrap();
    let objective = Objective {
        value_loss: ValueLossConfig { clip: Some(0.2) },
        ..Objective::default()
    };
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        target_modules: ["k_proj", "o_proj", "up_proj"].map(String::from).to_vec(),
    };
    for lora in [None, Some(lora)] {
        let mut grads = Vec::new();
        let mut losses = Vec::new();
        for kernels in [TrainKernels::Auto, TrainKernels::Autodiff] {
            let config = TrainerConfig {
                lr: 1e-3,
                kernels,
                lora: lora.clone(),
                ..TrainerConfig::default()
            };
            let mut t = CriticTrainer::new(model.clone(), None, config, &dev()).unwrap();
            assert_eq!(t.kernels(), kernels);
            // A first step moves the head (and, under LoRA, makes `B ≠ 0`).
            assert!(!t.step(&b, &objective).unwrap().skipped);
            let g = t.accumulate_gradients(&b, &objective).unwrap();
            losses.push(g.loss);
            grads.push(grads_of(t.training_model().unwrap(), g.grads));
        }
        let name = if lora.is_some() { "lora" } else { "full" };
        assert!(
            (losses[0] - losses[1]).abs() <= 1e-5 * losses[1].abs().max(1.0),
            "{name}: loss {} vs {}",
            losses[0],
            losses[1]
        );
        let (fused, reference) = (&grads[0], &grads[1]);
        assert_eq!(
            fused.keys().collect::<Vec<_>>(),
            reference.keys().collect::<Vec<_>>(),
            "{name}"
        );
        assert!(fused.keys().any(|k| k.starts_with("head.")));
        for (k, g) in fused {
            let err = relative_error(g, &reference[k]);
            assert!(err <= 1e-4, "{name}: {k}: relative error {err:e}");
        }
    }
}

#[test]
fn packed_micro_batches_sum_to_the_whole_batch() {
    let model = load_model(support::fixture("tiny-qwen2-sft"), &dev()).unwrap();
    let b = batch(&model, 5, 11);
    let (whole, _) = gradients(&model, &b, TrainKernels::Auto, None);
    let (one_by_one, _) = gradients(&model, &b, TrainKernels::Auto, Some(1));
    for (k, g) in &whole {
        let err = relative_error(g, &one_by_one[k]);
        assert!(err <= 1e-5, "{k}: relative error {err:e}");
    }
}

#[test]
fn a_fused_step_updates_the_weights_as_the_autodiff_step_does() {
    let model = load_model(support::fixture("tiny-qwen2-sft"), &dev()).unwrap();
    let b = batch(&model, 6, 3);
    let mut after = Vec::new();
    for kernels in [TrainKernels::Auto, TrainKernels::Autodiff] {
        let mut t = trainer(&model, kernels, None);
        let report = t.step(&b, &objective()).unwrap();
        assert!(!report.skipped);
        after.push((params(t.training_model().unwrap()), report));
    }
    let (fused, reference) = (&after[0], &after[1]);
    assert!((fused.1.grad_norm - reference.1.grad_norm).abs() <= 1e-4 * reference.1.grad_norm);
    for (k, w) in &fused.0 {
        let worst = support::max_abs_diff(w, &reference.0[k]);
        assert!(
            worst <= 1e-5,
            "{k}: weights differ by {worst:e} after one step"
        );
    }
}

/// GRPO's layout: groups of samples sharing a prompt, interleaved, which the fused path packs so
/// that each prompt is computed once (the samples continue it). The gradients are those of
/// Burn's autodiff over the whole sequences, and of the same samples one micro-batch each (no
/// sharing): the shared prompt's keys gather every sample's gradient.
#[test]
fn fused_gradients_with_shared_prompts_match_autodiff_and_unshared_micro_batches() {
    let model = load_model(support::fixture("tiny-qwen2-sft"), &dev()).unwrap();
    let b = batch_of(&model, 12, 5, 4, 9);
    let mut seqs = b.sequences().to_vec();
    // Three prompts of 2, 17 (a cache block and one more) and 9 tokens, four samples each.
    let prompts: Vec<Vec<u32>> = [2u32, 17, 9]
        .iter()
        .map(|&n| (0..n).map(|t| (t * 37 + n) % 500).collect())
        .collect();
    for (i, s) in seqs.iter_mut().enumerate() {
        s.prompt_ids = prompts[i % 3].clone();
    }
    let b = TrainBatch::new(seqs).unwrap();
    assert_same_gradients_on(&model, &b, "tiny-qwen2-sft, shared prompts");
    let (shared, _) = gradients(&model, &b, TrainKernels::Auto, None);
    let (one_by_one, _) = gradients(&model, &b, TrainKernels::Auto, Some(1));
    for (k, g) in &shared {
        let err = relative_error(g, &one_by_one[k]);
        assert!(err <= 1e-5, "{k}: relative error {err:e}");
    }
}
