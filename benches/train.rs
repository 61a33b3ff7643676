//! Train-step throughput of the Burn trainer on the CPU: 16 sequences × 128 tokens (16 prompt +
//! 112 response tokens, all trained; PPO objective with ratios near 1), forward + backward +
//! global clipping + AdamW in one micro-batch, for the `tiny-qwen2` fixture (0.8M parameters) and
//! a ~28M-parameter config (hidden 512, 8 layers, 8/4 heads, ffn 1408, vocab 8192, tied) — the
//! shapes of `shared/baselines.md` (PyTorch: 0.114 and 1.80 s/step). Throughput counts all
//! 16 × 128 tokens, as the baseline does.
//!
//! `cargo bench --bench train` (measure with the machine otherwise idle).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;
use common::bench_models;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roll_backend_burn::train::{TrainKernels, Trainer, TrainerConfig};
use roll_backend_burn::{CausalLm, Device, ScoringOptions, score};
use roll_core::policy::{Objective, ScoreRequest, ScoreSequence};
use roll_core::{SampleId, TrainBatch, TrainSequence};

const SEQS: usize = 16;
const PROMPT: usize = 16;
const LEN: usize = 128;

/// Random sequences whose `old_logprobs` are the model's own (PPO ratio 1 at the first step).
fn batch(model: &CausalLm, device: &Device) -> TrainBatch {
    let vocab = model.vocab_size();
    let mut state = 0x2545_f491_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab as u64) as u32
    };
    let r = LEN - PROMPT;
    let ids: Vec<Vec<u32>> = (0..SEQS)
        .map(|_| (0..LEN).map(|_| next()).collect())
        .collect();
    let request = ScoreRequest {
        sequences: ids
            .iter()
            .map(|s| ScoreSequence {
                prompt_ids: s[..PROMPT].to_vec(),
                response_ids: s[PROMPT..].to_vec(),
            })
            .collect(),
        with_entropy: false,
        ..Default::default()
    };
    let old = score(model, None, &request, &ScoringOptions::default(), device).expect("score");
    let sequences = ids
        .iter()
        .zip(old)
        .enumerate()
        .map(|(i, (ids, old))| TrainSequence {
            sample: SampleId(i as u64),
            prompt_ids: ids[..PROMPT].to_vec(),
            response_ids: ids[PROMPT..].to_vec(),
            loss_mask: vec![true; r],
            rollout_logprobs: old.logprobs.clone(),
            old_logprobs: old.logprobs,
            ref_logprobs: None,
            advantages: vec![if i % 2 == 0 { 1.0 } else { -1.0 }; r],
            returns: None,
            old_values: None,
            weight: 1.0,
            score: 0.0,
        })
        .collect();
    TrainBatch::new(sequences).expect("valid batch")
}

fn bench(c: &mut Criterion) {
    let device = Device::flex();
    let models = bench_models(&device);
    let mut group = c.benchmark_group("train_step_16x128");
    group.sample_size(10);
    group.throughput(Throughput::Elements((SEQS * LEN) as u64));
    let objective = Objective::default();
    for (name, model) in models {
        let b = batch(&model, &device);
        // The fused CPU kernels (what a CPU run uses) and Burn's autodiff (the generic path).
        for (path, kernels) in [
            ("fused", TrainKernels::Auto),
            ("autodiff", TrainKernels::Autodiff),
        ] {
            let config = TrainerConfig {
                lr: 1e-6,
                kernels,
                ..TrainerConfig::default()
            };
            let mut trainer = Trainer::new(model.clone(), config, &device).expect("trainer");
            group.bench_with_input(BenchmarkId::new(path, name), &b, |bench, b| {
                bench.iter(|| trainer.step(b, &objective).expect("train step"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
