#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The trainer: learning, gradient accumulation, global clipping, AdamW against PyTorch's
//! formula, LoRA, checkpoints, the critic and config errors.

mod support;
use support::{grads_of, params};

use burn::module::Module;
use burn::optim::GradientsParams;

use roll_algos::loss::{KlLoss, LossAggregation, ValueLossConfig};
use roll_backend_burn::train::{
    CriticTrainer, DataParallel, LoraConfig, Trainer, TrainerConfig, clip_grad_norm, follow,
    global_grad_norm,
};
use roll_backend_burn::{
    BackendError, CausalLm, Device, HfConfig, PaddingSide, ScoringOptions, TokenBatch, load_model,
    score,
};
use roll_core::policy::{Objective, ScoreRequest, ScoreSequence};
use roll_core::rng::SplitMix64;
use roll_core::{SampleId, TrainBatch, TrainSequence};
use std::collections::BTreeMap;
use std::sync::Arc;

fn dev() -> Device {
    Device::flex()
}

fn fixture_model() -> CausalLm {
    load_model(support::fixture("tiny-qwen2-sft"), &dev()).unwrap()
}

/// A random 2-layer Qwen2 (vocab 64, hidden 32), fully initialised.
fn random_model() -> CausalLm {
    let mut cfg = HfConfig::new("qwen2", 64, 32, 64, 2, 4);
    cfg.num_key_value_heads = Some(2);
    cfg.tie_word_embeddings = true;
    let m = CausalLm::init(&cfg, &dev()).unwrap();
    // Give every lazy parameter its value before the model is cloned.
    let _ = params(&m);
    m
}

/// A uniform index below `n`.
fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// `n` sequences of varied lengths, some tokens untrained, advantages of both signs, per-sample
/// weights and scores; `old_logprobs` are the model's own (ratio 1), `ref_logprobs` perturbed.
fn batch(model: &CausalLm, n: usize, seed: u64) -> TrainBatch {
    let vocab = model.vocab_size();
    let mut rng = SplitMix64::new(seed);
    let mut seqs: Vec<TrainSequence> = (0..n)
        .map(|i| {
            let p = 2 + below(&mut rng, 6);
            let r = 3 + below(&mut rng, 9);
            let prompt_ids: Vec<u32> = (0..p).map(|_| below(&mut rng, vocab) as u32).collect();
            let response_ids: Vec<u32> = (0..r).map(|_| below(&mut rng, vocab) as u32).collect();
            let loss_mask: Vec<bool> = (0..r).map(|t| t == 0 || below(&mut rng, 5) != 0).collect();
            let advantages: Vec<f32> = (0..r).map(|_| rng.next_f64() as f32 * 2.0 - 0.8).collect();
            TrainSequence {
                sample: SampleId(i as u64),
                prompt_ids,
                response_ids,
                loss_mask,
                old_logprobs: vec![0.0; r],
                rollout_logprobs: vec![0.0; r],
                ref_logprobs: None,
                advantages,
                returns: None,
                old_values: None,
                weight: 0.5 + rng.next_f64() as f32,
                score: rng.next_f64() as f32 - 0.5,
            }
        })
        .collect();
    let request = score_request(&seqs);
    let scores =
        roll_backend_burn::score(model, None, &request, &ScoringOptions::default(), &dev())
            .unwrap();
    for (s, sc) in seqs.iter_mut().zip(scores) {
        s.ref_logprobs = Some(sc.logprobs.iter().map(|l| l - 0.05).collect());
        s.old_logprobs = sc.logprobs;
    }
    TrainBatch::new(seqs).unwrap()
}

fn max_diff(a: &BTreeMap<String, Vec<f32>>, b: &BTreeMap<String, Vec<f32>>) -> (f32, String) {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "same parameters"
    );
    let mut worst = (0.0f32, String::new());
    for (k, x) in a {
        let d = support::max_abs_diff(x, &b[k]);
        if d > worst.0 || d.is_nan() {
            worst = (d, k.clone());
        }
    }
    worst
}

fn mean_trained_logprob(trainer: &Trainer, batch: &TrainBatch) -> f64 {
    let request = score_request(batch.sequences());
    let model = trainer.inference_model().unwrap();
    let scores = score(
        &model,
        None,
        &request,
        &ScoringOptions::default(),
        &Device::flex(),
    )
    .unwrap();
    let (mut sum, mut n) = (0.0, 0.0);
    for (s, sc) in batch.sequences().iter().zip(scores) {
        for (l, m) in sc.logprobs.iter().zip(&s.loss_mask) {
            if *m {
                sum += f64::from(*l);
                n += 1.0;
            }
        }
    }
    sum / n
}

fn logits(model: &CausalLm, batch: &TrainBatch) -> Vec<f32> {
    let seqs: Vec<Vec<u32>> = batch
        .sequences()
        .iter()
        .map(|s| [s.prompt_ids.clone(), s.response_ids.clone()].concat())
        .collect();
    let tb = TokenBatch::new(&seqs, PaddingSide::Right, 0, model.vocab_size(), &dev()).unwrap();
    model.forward(&tb).into_data().try_into_vec().unwrap()
}

#[test]
fn steps_raise_the_logprob_of_positively_advantaged_tokens() {
    let model = fixture_model();
    let mut b = batch(&model, 4, 1);
    let seqs: Vec<TrainSequence> = b
        .sequences()
        .iter()
        .cloned()
        .map(|mut s| {
            s.advantages = vec![1.0; s.advantages.len()];
            s.weight = 1.0;
            s
        })
        .collect();
    b = TrainBatch::new(seqs).unwrap();
    // Small enough that three AdamW steps climb without overshooting (AdamW's first steps move
    // every weight by about `lr`, whatever the gradient's scale).
    let cfg = TrainerConfig {
        lr: 3e-5,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(model, cfg, &dev()).unwrap();
    let before = mean_trained_logprob(&t, &b);
    let snapshot = t.inference_model().unwrap();
    let snapshot_params = params(&snapshot);
    let mut losses = Vec::new();
    for _ in 0..3 {
        let r = t.step(&b, &Objective::default()).unwrap();
        assert!(!r.skipped);
        assert!(r.grad_norm > 0.0 && r.grad_norm.is_finite());
        assert_eq!(r.lr, 3e-5);
        assert_eq!(r.trained_tokens, b.num_trained_tokens());
        let m = r.to_metrics();
        for k in [
            "loss",
            "pg_loss",
            "clip_frac_high",
            "approx_kl",
            "entropy",
            "ratio_mean",
        ] {
            assert!(m[k].is_finite(), "{k}");
        }
        losses.push(r.loss);
    }
    let after = mean_trained_logprob(&t, &b);
    assert_eq!(t.step_count(), 3);
    // A copy handed to inference is not changed by later steps.
    assert_eq!(params(&snapshot), snapshot_params);
    assert_ne!(params(&t.inference_model().unwrap()), snapshot_params);
    // PPO with A = 1: loss = −mean(min(ratio, 1.2)) starts at −1 and falls as the ratio grows.
    assert!((losses[0] + 1.0).abs() < 1e-4, "{losses:?}");
    assert!(
        losses[1] < losses[0] && losses[2] < losses[1],
        "{losses:?} {before} -> {after}"
    );
    assert!(after > before + 0.05, "mean logprob {before} -> {after}");
}

#[test]
fn four_micro_batches_equal_one_batch() {
    let model = fixture_model();
    let b = batch(&model, 4, 2);
    let objectives = [
        Objective::default(),
        Objective {
            loss_aggregation: LossAggregation::TokenMean {},
            kl_loss: Some(KlLoss {
                coef: 0.1,
                estimator: Default::default(),
            }),
            entropy_coef: 0.01,
            ..Objective::default()
        },
        Objective {
            loss_aggregation: LossAggregation::SeqMeanTokenSumNorm { horizon: None },
            ..Objective::default()
        },
    ];
    // eps = 1e-3 keeps Adam's first update (≈ lr·sign(g) when eps ≪ |g|) a smooth function of the
    // gradient, so equal gradients give equal parameters at float round-off.
    let cfg = |size| TrainerConfig {
        lr: 1e-3,
        eps: 1e-3,
        micro_batch_size: Some(size),
        micro_batch_tokens: None,
        ..TrainerConfig::default()
    };
    for objective in &objectives {
        let mut split = Trainer::new(model.clone(), cfg(1), &dev()).unwrap();
        let mut whole = Trainer::new(model.clone(), cfg(4), &dev()).unwrap();
        let gs = split.accumulate_gradients(&b, objective).unwrap();
        let gw = whole.accumulate_gradients(&b, objective).unwrap();
        assert_eq!((gs.micro_batches, gw.micro_batches), (4, 1));
        assert!(
            (gs.loss - gw.loss).abs() < 1e-5,
            "{} vs {}",
            gs.loss,
            gw.loss
        );
        for (k, v) in &gw.metrics {
            assert!(
                (gs.metrics[k] - v).abs() < 1e-5,
                "{k}: {} vs {v}",
                gs.metrics[k]
            );
        }
        let a = grads_of(split.training_model().unwrap(), gs.grads);
        let c = grads_of(whole.training_model().unwrap(), gw.grads);
        let (d, at) = max_diff(&a, &c);
        assert!(d < 1e-5, "{objective:?}: gradients differ by {d} at {at}");

        let rs = split.step(&b, objective).unwrap();
        let rw = whole.step(&b, objective).unwrap();
        assert!((rs.grad_norm - rw.grad_norm).abs() < 1e-5 * rw.grad_norm.max(1.0));
        let (d, at) = max_diff(
            &params(&split.inference_model().unwrap()),
            &params(&whole.inference_model().unwrap()),
        );
        assert!(d < 1e-5, "{objective:?}: parameters differ by {d} at {at}");
    }
}

#[test]
fn global_clipping_matches_a_hand_computed_norm() {
    let model = fixture_model();
    let b = batch(&model, 3, 3);
    let cfg = TrainerConfig {
        lr: 1e-3,
        max_grad_norm: Some(0.05),
        ..TrainerConfig::default()
    };
    let t = Trainer::new(model.clone(), cfg.clone(), &dev()).unwrap();
    let m = t.training_model().unwrap();
    let hand = |g: GradientsParams| -> f64 {
        grads_of(m, g)
            .values()
            .flatten()
            .map(|x| f64::from(*x).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let g = t.accumulate_gradients(&b, &Objective::default()).unwrap();
    let expected = hand(g.grads);
    assert!(
        expected > 0.05,
        "the test needs a norm above the threshold: {expected}"
    );
    let mut grads = t
        .accumulate_gradients(&b, &Objective::default())
        .unwrap()
        .grads;
    let pre = clip_grad_norm(m, &mut grads, 0.05).unwrap();
    // Each parameter's Σg² is summed in f64 on the CPU, the reference by hand in another order.
    assert!(
        (pre - expected).abs() < 1e-5 * expected,
        "{pre} vs {expected}"
    );
    let post = global_grad_norm(m, &mut grads).unwrap();
    assert!(post <= 0.05 + 1e-4 && post > 0.049, "{post}");
    assert!((hand(grads) - post).abs() < 1e-5 * post);

    // The trainer reports the same pre-clip norm.
    let mut t2 = Trainer::new(model, cfg, &dev()).unwrap();
    let r = t2.step(&b, &Objective::default()).unwrap();
    assert!((r.grad_norm - expected).abs() < 1e-5 * expected);
    assert_eq!(r.grad_norm, pre);
}

/// PyTorch's `torch.optim.AdamW` (decoupled decay, bias correction), in f64.
struct TorchAdamW {
    lr: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    wd: f64,
    m: Vec<f64>,
    v: Vec<f64>,
    t: i32,
}

impl TorchAdamW {
    fn step(&mut self, p: &mut [f64], g: &[f32]) {
        if self.m.is_empty() {
            self.m = vec![0.0; p.len()];
            self.v = vec![0.0; p.len()];
        }
        self.t += 1;
        let bc1 = 1.0 - self.b1.powi(self.t);
        let bc2 = 1.0 - self.b2.powi(self.t);
        for i in 0..p.len() {
            let g = f64::from(g[i]);
            p[i] *= 1.0 - self.lr * self.wd;
            self.m[i] = self.b1 * self.m[i] + (1.0 - self.b1) * g;
            self.v[i] = self.b2 * self.v[i] + (1.0 - self.b2) * g * g;
            let denom = (self.v[i] / bc2).sqrt() + self.eps;
            p[i] -= self.lr * (self.m[i] / bc1) / denom;
        }
    }
}

#[test]
fn adamw_matches_pytorch_for_two_steps() {
    let model = random_model();
    let b1 = batch(&model, 3, 4);
    let b2 = batch(&model, 3, 5);
    let cfg = TrainerConfig {
        lr: 1e-2,
        betas: (0.8, 0.95),
        eps: 1e-8,
        weight_decay: 0.1,
        max_grad_norm: None,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(model, cfg, &dev()).unwrap();
    let start = params(t.training_model().unwrap());
    let mut expected: BTreeMap<String, Vec<f64>> = start
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().map(|x| f64::from(*x)).collect()))
        .collect();
    let mut torch: BTreeMap<String, TorchAdamW> = start
        .keys()
        .map(|k| {
            let o = TorchAdamW {
                lr: 1e-2,
                b1: 0.8,
                b2: 0.95,
                eps: 1e-8,
                wd: 0.1,
                m: vec![],
                v: vec![],
                t: 0,
            };
            (k.clone(), o)
        })
        .collect();
    for b in [&b1, &b2] {
        let g = t.accumulate_gradients(b, &Objective::default()).unwrap();
        let grads = grads_of(t.training_model().unwrap(), g.grads);
        assert_eq!(grads.len(), start.len(), "every parameter has a gradient");
        for (k, p) in expected.iter_mut() {
            torch.get_mut(k).unwrap().step(p, &grads[k]);
        }
        // The same gradients again, applied by the trainer.
        t.step(b, &Objective::default()).unwrap();
        let got = params(t.training_model().unwrap());
        for (k, want) in &expected {
            for (x, y) in got[k].iter().zip(want) {
                assert!(
                    (f64::from(*x) - y).abs() < 2e-6,
                    "{k}: burn {x} vs pytorch {y} at step {}",
                    t.step_count()
                );
            }
        }
    }
}

#[test]
fn lora_trains_adapters_only_and_merges_exactly() {
    let model = fixture_model();
    let b = batch(&model, 3, 6);
    let base_logits = logits(&model, &b);
    let base_params = params(&model);
    let cfg = TrainerConfig {
        lr: 1e-2,
        lora: Some(LoraConfig {
            rank: 4,
            alpha: 8.0,
            target_modules: vec!["q_proj".into(), "v_proj".into()],
        }),
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(model, cfg, &dev()).unwrap();
    assert!(t.has_lora());
    assert_eq!(t.num_adapters(), 8, "q_proj and v_proj of 4 layers");
    // Before training: B = 0, so every view of the model is the base model, exactly.
    let reference = t.reference_model().unwrap();
    assert_eq!(logits(&reference, &b), base_logits);
    assert_eq!(logits(&t.inference_model().unwrap(), &b), base_logits);

    for _ in 0..2 {
        t.step(&b, &Objective::default()).unwrap();
    }
    let merged = t.merged_model().unwrap();
    let after = params(&merged);
    let mut changed = Vec::new();
    for (k, v) in &after {
        if *v != base_params[k] {
            changed.push(k.clone());
        }
    }
    assert_eq!(changed.len(), 8, "{changed:?}");
    assert!(
        changed
            .iter()
            .all(|k| k.ends_with("q_proj.weight") || k.ends_with("v_proj.weight")),
        "{changed:?}"
    );
    // The reference (adapters disabled) is still the base model.
    assert_eq!(logits(&t.reference_model().unwrap(), &b), base_logits);
    assert_eq!(params(&t.reference_model().unwrap()), base_params);
    // Merged weights compute what base + adapter computes.
    let unmerged = t.training_model().unwrap().valid();
    let d = support::max_abs_diff(&logits(&unmerged, &b), &logits(&merged, &b));
    assert!(d <= 1e-5, "merged vs adapter forward: {d}");
    assert_ne!(logits(&merged, &b), base_logits);
    // Reference scores = scoring the base.
    let request = ScoreRequest {
        sequences: vec![ScoreSequence {
            prompt_ids: vec![1, 2, 3],
            response_ids: vec![4, 5],
        }],
        with_entropy: false,
        ..Default::default()
    };
    let opts = ScoringOptions::default();
    let r = t.reference_scores(&request, &opts).unwrap();
    let want = roll_backend_burn::score(&fixture_model(), None, &request, &opts, &dev()).unwrap();
    assert_eq!(r, want);
}

fn assert_bitwise_equal(a: &CausalLm, b: &CausalLm) {
    let (pa, pb) = (params(a), params(b));
    for (k, v) in &pa {
        let same = v
            .iter()
            .zip(&pb[k])
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{k} differs");
    }
}

fn resume_case(name: &str, lora: Option<LoraConfig>) {
    let model = fixture_model();
    let (b1, b2, b3) = (
        batch(&model, 3, 7),
        batch(&model, 3, 8),
        batch(&model, 2, 9),
    );
    let cfg = TrainerConfig {
        lr: 1e-3,
        warmup_steps: 1,
        total_steps: Some(10),
        schedule: roll_backend_burn::train::LrSchedule::Cosine { min_lr_ratio: 0.1 },
        lora,
        ..TrainerConfig::default()
    };
    let dir = support::temp_dir(name);
    let ckpt = dir.join("ckpt");
    let mut t = Trainer::new(model, cfg, &dev()).unwrap();
    t.step(&b1, &Objective::default()).unwrap();
    t.step(&b2, &Objective::default()).unwrap();
    t.save_checkpoint(&ckpt, 7).unwrap();
    let r_a = t.step(&b3, &Objective::default()).unwrap();
    let uninterrupted = t.inference_model().unwrap();

    let (mut resumed, version) = Trainer::load_checkpoint(&ckpt, &dev()).unwrap();
    assert_eq!(version, 7);
    assert_eq!(resumed.step_count(), 2);
    assert_eq!(resumed.config(), t.config());
    let r_b = resumed.step(&b3, &Objective::default()).unwrap();
    assert_eq!(r_a.lr, r_b.lr);
    assert_eq!(r_a.loss.to_bits(), r_b.loss.to_bits());
    assert_eq!(r_a.grad_norm.to_bits(), r_b.grad_norm.to_bits());
    assert_bitwise_equal(&uninterrupted, &resumed.inference_model().unwrap());
    if resumed.has_lora() {
        assert_bitwise_equal(
            &t.reference_model().unwrap(),
            &resumed.reference_model().unwrap(),
        );
    }
}

#[test]
fn checkpoint_resume_is_bit_for_bit() {
    resume_case("resume-full", None);
}

#[test]
fn checkpoint_resume_is_bit_for_bit_with_lora() {
    resume_case(
        "resume-lora",
        Some(LoraConfig {
            rank: 2,
            alpha: 4.0,
            target_modules: vec!["v_proj".into(), "down_proj".into()],
        }),
    );
}

#[test]
fn interrupted_saves_leave_the_previous_checkpoint_intact() {
    let model = random_model();
    let b = batch(&model, 2, 10);
    let dir = support::temp_dir("ckpt-atomic");
    let ckpt = dir.join("ckpt");
    assert!(matches!(
        Trainer::load_checkpoint(&ckpt, &dev()),
        Err(BackendError::Checkpoint { .. })
    ));
    let mut t = Trainer::new(model, TrainerConfig::default(), &dev()).unwrap();
    t.step(&b, &Objective::default()).unwrap();
    let first = t.save_checkpoint(&ckpt, 1).unwrap();
    let saved = t.inference_model().unwrap();
    // Leftovers of saves that died: a half-written temp dir, a renamed but never published
    // checkpoint with a corrupt model, a half-written LATEST.
    std::fs::create_dir_all(ckpt.join(".tmp-123-456")).unwrap();
    std::fs::write(ckpt.join(".tmp-123-456/model.bpk"), b"garbage").unwrap();
    let orphan = ckpt.join("ckpt-0000000009-999-1");
    std::fs::create_dir_all(&orphan).unwrap();
    std::fs::write(orphan.join("model.bpk"), b"garbage").unwrap();
    std::fs::write(ckpt.join(".LATEST-999-1"), b"ckpt-0000000009-999-1").unwrap();
    let (loaded, v) = Trainer::load_checkpoint(&ckpt, &dev()).unwrap();
    assert_eq!(v, 1);
    assert_bitwise_equal(&saved, &loaded.inference_model().unwrap());

    // A new save replaces the old checkpoint and clears the leftovers.
    t.step(&b, &Objective::default()).unwrap();
    let second = t.save_checkpoint(&ckpt, 2).unwrap();
    assert_ne!(first, second);
    let mut names: Vec<String> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    assert_eq!(names[0], "LATEST");
    assert_eq!(ckpt.join(&names[1]), second);
    let (loaded, v) = Trainer::load_checkpoint(&ckpt, &dev()).unwrap();
    assert_eq!((v, loaded.step_count()), (2, 2));

    // A corrupt current checkpoint is an error naming the file, not a panic.
    std::fs::write(second.join("model.bpk"), b"garbage").unwrap();
    let err = Trainer::load_checkpoint(&ckpt, &dev()).unwrap_err();
    assert!(
        matches!(&err, BackendError::Checkpoint { path, .. } if path.ends_with("model.bpk")),
        "{err}"
    );
    // A directory without a checkpoint.
    let err = CriticTrainer::load_checkpoint(dir.join("nowhere"), &dev()).unwrap_err();
    assert!(err.to_string().contains("LATEST"), "{err}");
}

#[test]
fn critic_loss_decreases_toward_the_returns() {
    let model = random_model();
    let mut b = batch(&model, 4, 11);
    let seqs: Vec<TrainSequence> = b
        .sequences()
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, mut s)| {
            let n = s.response_ids.len();
            s.returns = Some(
                (0..n)
                    .map(|t| (i as f32 - 1.5) * 0.5 + t as f32 * 0.05)
                    .collect(),
            );
            s.old_values = Some(vec![0.0; n]);
            s
        })
        .collect();
    b = TrainBatch::new(seqs).unwrap();
    let cfg = TrainerConfig {
        lr: 1e-2,
        micro_batch_size: Some(2),
        ..TrainerConfig::default()
    };
    let mut t = CriticTrainer::new(model, None, cfg, &dev()).unwrap();
    let mut losses = Vec::new();
    for _ in 0..8 {
        let r = t.step(&b, &Objective::default()).unwrap();
        assert_eq!(r.micro_batches, 2);
        assert!(r.metrics["vf_loss"].is_finite() && r.metrics["value_mean"].is_finite());
        losses.push(r.loss);
    }
    assert!(
        losses[7] < 0.3 * losses[0],
        "value loss did not fall: {losses:?}"
    );
    // Values scored by the inference copy match the returns better than at the start.
    let request = score_request(b.sequences());
    let scored = t
        .value_scores(&request, &ScoringOptions::default())
        .unwrap();
    let mut sq = 0.0;
    let mut n = 0.0;
    for (s, sc) in b.sequences().iter().zip(&scored) {
        let values = sc.values.as_ref().unwrap();
        for ((v, r), m) in values
            .iter()
            .zip(s.returns.as_ref().unwrap())
            .zip(&s.loss_mask)
        {
            if *m {
                sq += f64::from(v - r).powi(2);
                n += 1.0;
            }
        }
    }
    assert!(
        sq / n / 2.0 < losses[0],
        "{} vs {}",
        sq / n / 2.0,
        losses[0]
    );

    // Value clipping needs old values; a batch without returns is refused.
    let clipped = Objective {
        value_loss: ValueLossConfig { clip: Some(0.2) },
        ..Objective::default()
    };
    assert!(t.step(&b, &clipped).is_ok());
    let no_returns = TrainBatch::new(
        b.sequences()
            .iter()
            .cloned()
            .map(|mut s| {
                s.returns = None;
                s
            })
            .collect(),
    )
    .unwrap();
    let err = t.step(&no_returns, &Objective::default()).unwrap_err();
    assert!(err.to_string().contains("returns"), "{err}");

    // Critic checkpoints round-trip.
    let dir = support::temp_dir("critic-ckpt");
    t.save_checkpoint(dir.join("c"), 3).unwrap();
    let (mut c2, v) = CriticTrainer::load_checkpoint(dir.join("c"), &dev()).unwrap();
    assert_eq!((v, c2.step_count()), (3, t.step_count()));
    let ra = t.step(&b, &Objective::default()).unwrap();
    let rb = c2.step(&b, &Objective::default()).unwrap();
    assert_eq!(ra.loss.to_bits(), rb.loss.to_bits());
    let err = Trainer::load_checkpoint(dir.join("c"), &dev()).unwrap_err();
    assert!(err.to_string().contains("Critic"), "{err}");
}

#[test]
fn bad_configs_and_inputs_are_errors_naming_the_cause() {
    let model = random_model();
    let key_of = |cfg: TrainerConfig| match Trainer::new(model.clone(), cfg, &dev()) {
        Err(BackendError::InvalidTrainConfig { key, message }) => {
            assert!(!message.is_empty());
            key
        }
        other => panic!("expected InvalidTrainConfig, got {other:?}"),
    };
    assert_eq!(
        key_of(TrainerConfig {
            lr: 0.0,
            ..TrainerConfig::default()
        }),
        "lr"
    );
    assert_eq!(
        key_of(TrainerConfig {
            warmup_steps: 10,
            total_steps: Some(5),
            schedule: roll_backend_burn::train::LrSchedule::Cosine { min_lr_ratio: 0.0 },
            ..TrainerConfig::default()
        }),
        "total_steps"
    );
    assert_eq!(
        key_of(TrainerConfig {
            lora: Some(LoraConfig {
                rank: 4,
                alpha: 8.0,
                target_modules: vec!["q_proj".into(), "qkv_proj".into()],
            }),
            ..TrainerConfig::default()
        }),
        "lora.target_modules"
    );
    let err = Trainer::new(
        model.clone(),
        TrainerConfig {
            lora: Some(LoraConfig {
                rank: 4,
                alpha: 8.0,
                target_modules: vec!["qkv_proj".into()],
            }),
            ..TrainerConfig::default()
        },
        &dev(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("qkv_proj") && err.contains("lora.target_modules"),
        "{err}"
    );

    let mut t = Trainer::new(model.clone(), TrainerConfig::default(), &dev()).unwrap();
    // Nothing trained: no update.
    let b = batch(&model, 2, 12);
    let untrained = TrainBatch::new(
        b.sequences()
            .iter()
            .cloned()
            .map(|mut s| {
                s.loss_mask = vec![false; s.loss_mask.len()];
                s
            })
            .collect(),
    )
    .unwrap();
    let r = t.step(&untrained, &Objective::default()).unwrap();
    assert!(r.skipped && r.micro_batches == 0);
    assert_eq!(t.step_count(), 0);
    // A KL loss needs reference log-probs.
    let no_ref = TrainBatch::new(
        b.sequences()
            .iter()
            .cloned()
            .map(|mut s| {
                s.ref_logprobs = None;
                s
            })
            .collect(),
    )
    .unwrap();
    let kl = Objective {
        kl_loss: Some(KlLoss {
            coef: 0.1,
            estimator: Default::default(),
        }),
        ..Objective::default()
    };
    let err = t.step(&no_ref, &kl).unwrap_err().to_string();
    assert!(err.contains("ref_logp"), "{err}");
    // A token outside the vocabulary.
    let mut s = b.sequences()[0].clone();
    s.response_ids[0] = 10_000;
    let err = t
        .step(&TrainBatch::new(vec![s]).unwrap(), &Objective::default())
        .unwrap_err();
    assert!(
        matches!(err, BackendError::TokenOutOfVocab { id: 10_000, .. }),
        "{err}"
    );
    assert_eq!(t.step_count(), 0);
}

#[test]
fn trainers_can_live_on_a_worker_thread() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Trainer>();
    send_sync::<CriticTrainer>();
}

/// A score request for the prompts and responses of `seqs`.
fn score_request(seqs: &[TrainSequence]) -> ScoreRequest {
    ScoreRequest {
        sequences: seqs
            .iter()
            .map(|s| ScoreSequence {
                prompt_ids: s.prompt_ids.clone(),
                response_ids: s.response_ids.clone(),
            })
            .collect(),
        with_entropy: false,
        ..Default::default()
    }
}

/// Adds per-token returns and old values to every sequence (for the critic).
fn with_returns(b: &TrainBatch) -> TrainBatch {
    let seqs = b.sequences().iter().cloned().enumerate().map(|(i, mut s)| {
        let n = s.response_ids.len();
        s.returns = Some(
            (0..n)
                .map(|t| (i as f32 - 1.5) * 0.5 + t as f32 * 0.05)
                .collect(),
        );
        s.old_values = Some(vec![0.1; n]);
        s
    });
    TrainBatch::new(seqs.collect()).unwrap()
}

#[test]
fn data_parallel_replicas_train_like_one_trainer_on_the_union_batch() {
    let model = fixture_model();
    let objective = Objective {
        loss_aggregation: LossAggregation::SeqMeanTokenSumNorm { horizon: None },
        kl_loss: Some(KlLoss {
            coef: 0.1,
            estimator: Default::default(),
        }),
        entropy_coef: 0.01,
        ..Objective::default()
    };
    // eps = 1e-3: see `four_micro_batches_equal_one_batch`.
    let full = TrainerConfig {
        lr: 1e-3,
        eps: 1e-3,
        micro_batch_tokens: Some(48),
        ..TrainerConfig::default()
    };
    let lora = TrainerConfig {
        lora: Some(LoraConfig {
            rank: 4,
            alpha: 8.0,
            target_modules: vec!["q_proj".into(), "down_proj".into()],
        }),
        ..full.clone()
    };
    let cpu = roll_backend_burn::DeviceSpec::Cpu;
    for config in [full, lora] {
        let mut alone = Trainer::new(model.clone(), config.clone(), &dev()).unwrap();
        let mut group = DataParallel::new(&[cpu; 3], |device| {
            Trainer::new(model.clone(), config.clone(), &device)
        })
        .unwrap();
        let before = params(&alone.inference_model().unwrap());
        // Three steps on three batches; seven sequences split 3 ways by tokens.
        for seed in [5, 6, 7] {
            let b = batch(&model, 7, seed);
            let shards = group.shards(&b).unwrap();
            assert_eq!(shards.len(), 3);
            assert!(shards.iter().all(|s| !s.sequences().is_empty()));
            let one = alone.step(&b, &objective).unwrap();
            let dp = group.step(&b, &objective).unwrap();
            assert_eq!(
                (dp.trained_tokens, dp.sequences, dp.skipped),
                (one.trained_tokens, one.sequences, false)
            );
            assert!(
                (dp.loss - one.loss).abs() < 1e-5,
                "{} vs {}",
                dp.loss,
                one.loss
            );
            assert!((dp.grad_norm - one.grad_norm).abs() < 1e-5 * one.grad_norm.max(1.0));
            for (k, v) in &one.metrics {
                assert!(
                    (dp.metrics[k] - v).abs() < 1e-4,
                    "{k}: {} vs {v}",
                    dp.metrics[k]
                );
            }
        }
        let after = params(&alone.inference_model().unwrap());
        let (moved, _) = max_diff(&before, &after);
        assert!(moved > 1e-3, "the steps changed nothing ({moved})");
        let (d, at) = max_diff(&after, &params(&group.first().inference_model().unwrap()));
        assert!(
            d <= 1e-5,
            "data parallel differs from one trainer by {d} at {at}"
        );
        for replica in &group.replicas()[1..] {
            assert_bitwise_equal(
                &group.first().inference_model().unwrap(),
                &replica.inference_model().unwrap(),
            );
        }
    }
}

#[test]
fn data_parallel_critic_trains_like_one_critic() {
    let model = random_model();
    let config = TrainerConfig {
        lr: 1e-2,
        eps: 1e-3,
        micro_batch_size: Some(2),
        ..TrainerConfig::default()
    };
    let objective = Objective::default();
    let cpu = roll_backend_burn::DeviceSpec::Cpu;
    let mut alone = CriticTrainer::new(model.clone(), None, config.clone(), &dev()).unwrap();
    let mut group = DataParallel::new(&[cpu; 2], |device| {
        CriticTrainer::new(model.clone(), None, config.clone(), &device)
    })
    .unwrap();
    for seed in [3, 4] {
        let b = with_returns(&batch(&model, 5, seed));
        let one = alone.step(&b, &objective).unwrap();
        let dp = group.step(&b, &objective).unwrap();
        assert!(
            (dp.loss - one.loss).abs() < 1e-5,
            "{} vs {}",
            dp.loss,
            one.loss
        );
    }
    let (trunk, head) = alone.inference_model().unwrap();
    let (dp_trunk, dp_head) = group.first().inference_model().unwrap();
    let (d, at) = max_diff(&params(&trunk), &params(&dp_trunk));
    assert!(d <= 1e-5, "trunks differ by {d} at {at}");
    let (d, at) = max_diff(&params(&head), &params(&dp_head));
    assert!(d <= 1e-5, "value heads differ by {d} at {at}");
}

#[test]
fn a_replica_that_fails_stops_the_group_with_its_own_error() {
    let model = fixture_model();
    let cpu = roll_backend_burn::DeviceSpec::Cpu;
    let mut group = DataParallel::new(&[cpu; 2], |device| {
        Trainer::new(model.clone(), TrainerConfig::default(), &device)
    })
    .unwrap();
    let good = batch(&model, 4, 9);
    let mut seqs = good.sequences().to_vec();
    seqs[2].response_ids[0] = 1_000_000;
    let bad = TrainBatch::new(seqs).unwrap();
    let err = group.step(&bad, &Objective::default()).unwrap_err();
    assert!(
        !matches!(err, BackendError::Collective(_)) && err.to_string().contains("1000000"),
        "{err}"
    );
    // The group is broken for good: the next step says which replica failed, and does not hang.
    let err = group.step(&good, &Objective::default()).unwrap_err();
    assert!(matches!(err, BackendError::Collective(_)), "{err}");
    assert!(err.to_string().contains("failed"), "{err}");
}

/// The topology of data parallelism across processes, on threads: rank 0 leads (it has the
/// batches), rank 1 follows the steps it announces, and both end where one trainer on the union
/// batch ends.
#[test]
fn a_follower_trains_the_steps_its_leader_announces() {
    let model = fixture_model();
    let config = TrainerConfig {
        lr: 1e-3,
        eps: 1e-3,
        ..TrainerConfig::default()
    };
    let objective = Objective::default();
    let ranks =
        roll_core::strategy::LocalGroup::replicas(vec![roll_backend_burn::DeviceSpec::Cpu; 2])
            .unwrap();
    let [leader_rank, follower_rank]: [Arc<dyn roll_core::Strategy>; 2] =
        [Arc::new(ranks[0].clone()), Arc::new(ranks[1].clone())];
    let batches: Vec<TrainBatch> = (0..3).map(|seed| batch(&model, 6, 20 + seed)).collect();
    let follower = {
        let (model, config) = (model.clone(), config.clone());
        std::thread::spawn(move || {
            let mut replica = Trainer::new(model, config, &dev())
                .unwrap()
                .with_strategy(follower_rank.clone());
            let reports = follow(&mut replica, follower_rank.as_ref()).unwrap();
            (reports.len(), replica.inference_model().unwrap())
        })
    };
    let first = Trainer::new(model.clone(), config.clone(), &dev()).unwrap();
    let mut leader = DataParallel::leader(first, leader_rank).unwrap();
    let mut alone = Trainer::new(model.clone(), config, &dev()).unwrap();
    for b in &batches {
        let led = leader.step(b, &objective).unwrap();
        let one = alone.step(b, &objective).unwrap();
        assert_eq!(led.trained_tokens, one.trained_tokens);
        assert!((led.loss - one.loss).abs() < 1e-5);
    }
    let led = leader.first().inference_model().unwrap();
    // Released before the drop (a run's SFT stage, before its RL stage leads the same ranks):
    // the follower returns, and the group refuses a step rather than wait for it.
    leader.release().unwrap();
    let (steps, followed) = follower.join().unwrap();
    assert_eq!(steps, 3);
    let err = leader
        .step(&batches[0], &objective)
        .unwrap_err()
        .to_string();
    assert!(err.contains("were released"), "{err}");
    drop(leader);
    assert_bitwise_equal(&led, &followed);
    let (d, at) = max_diff(&params(&led), &params(&alone.inference_model().unwrap()));
    assert!(
        d <= 1e-5,
        "leader and follower differ from one trainer by {d} at {at}"
    );
    // Rank 1 cannot lead.
    let ranks =
        roll_core::strategy::LocalGroup::replicas(vec![roll_backend_burn::DeviceSpec::Cpu; 2])
            .unwrap();
    let t = Trainer::new(model, TrainerConfig::default(), &dev()).unwrap();
    assert!(DataParallel::leader(t, Arc::new(ranks[1].clone())).is_err());
}
