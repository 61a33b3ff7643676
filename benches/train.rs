//! Train-step throughput of the Burn trainer on the CPU: 16 sequences × 128 tokens (16 prompt +
//! 112 response tokens, all trained; PPO objective with ratios near 1), forward + backward +
//! global clipping + AdamW in one micro-batch, for the `tiny-qwen2` fixture (0.8M parameters) and
//! a ~28M-parameter config (hidden 512, 8 layers, 8/4 heads, ffn 1408, vocab 8192, tied) — the
//! shapes of `shared/baselines.md` (PyTorch: 0.114 and 1.80 s/step). Throughput counts all
//! 16 × 128 tokens, as the baseline does.
//!
//! Beside it, in the same run:
//! - `matmul_peak`: one GEMM of the 28M config's gate/up shape (`[2048, 512]·[512, 1408]`) and
//!   of 2048³, through Flex's matmul and through roll's own GEMM (what the fast paths run),
//!   whose FLOP/s is the peak the train step's model-FLOPs utilisation is measured against; and
//!   through roll's GEMM the tiny model's MLP products over ~1,000 tokens (`[1024, 128]·[128, 704]`,
//!   `[1024, 352]·[352, 128]`), the narrow shapes of a `rl_step` GRPO step;
//! - `train_step_mixed`: 16 sequences of 16, 32, …, 256 tokens (2,176 in all) on the fused path,
//!   **packed** end to end as the trainer does, and **padded** to 256 each (4,096 tokens, padding
//!   masked out of the loss) as a padded batch would be; throughput counts the 2,176 real tokens;
//! - `train_step_groups`: a GRPO batch of 8 prompts of 64 tokens × 8 responses of 16–240 tokens
//!   (10,752 tokens, all trained), under the trainer's default token budget (4,096 a
//!   micro-batch): the micro-batches keep each prompt's sequences together, and each prompt is
//!   computed once in each micro-batch that holds its sequences; throughput counts every
//!   sequence's tokens, as if each prompt were computed for each;
//! - `train_step_16x128_lora`: the same step with LoRA (rank 16 on every projection), both paths;
//! - the peak resident memory of each model's fused train steps (printed: `VmHWM`, reset before
//!   each model by writing `5` to `/proc/self/clear_refs`).
//!
//! `cargo bench --bench train` (measure with the machine otherwise idle).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;
use common::bench_models;

use burn::tensor::{Distribution, Tensor};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roll_backend_burn::train::{DataParallel, LoraConfig, TrainKernels, Trainer, TrainerConfig};
use roll_backend_burn::{CausalLm, Device, DeviceSpec, ScoringOptions, score};
use roll_core::policy::{Objective, ScoreRequest, ScoreSequence};
use roll_core::{SampleId, TrainBatch, TrainSequence};

const SEQS: usize = 16;
const PROMPT: usize = 16;
const LEN: usize = 128;

/// Token ids below `vocab` from a xorshift generator seeded with `seed`.
fn token_stream(seed: u64, vocab: usize) -> impl FnMut() -> u32 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab as u64) as u32
    }
}

/// Training sequence `i`, trained where `mask` says, with `old` as its old and rollout log-probs
/// and advantage +1 (even `i`) or −1 (odd `i`) on every token.
fn sequence(
    i: usize,
    prompt: Vec<u32>,
    response: Vec<u32>,
    mask: Vec<bool>,
    old: Vec<f32>,
) -> TrainSequence {
    let r = response.len();
    TrainSequence {
        sample: SampleId(i as u64),
        prompt_ids: prompt,
        response_ids: response,
        loss_mask: mask,
        rollout_logprobs: old.clone(),
        old_logprobs: old,
        ref_logprobs: None,
        advantages: vec![if i.is_multiple_of(2) { 1.0 } else { -1.0 }; r],
        returns: None,
        old_values: None,
        weight: 1.0,
        score: 0.0,
    }
}

/// Random sequences whose `old_logprobs` are the model's own (PPO ratio 1 at the first step).
fn batch(model: &CausalLm, device: &Device) -> TrainBatch {
    let mut next = token_stream(0x2545_f491, model.vocab_size());
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
        .map(|(i, (ids, old))| {
            let (prompt, response) = ids.split_at(PROMPT);
            sequence(
                i,
                prompt.to_vec(),
                response.to_vec(),
                vec![true; r],
                old.logprobs,
            )
        })
        .collect();
    TrainBatch::new(sequences).expect("valid batch")
}

/// Sequences of 16, 32, …, 256 tokens (8 prompt tokens each), all response tokens trained; with
/// `pad_to`, each response is extended with untrained tokens to that total length.
fn mixed_batch(vocab: usize, pad_to: Option<usize>) -> TrainBatch {
    let mut next = token_stream(0x9e37_79b9, vocab);
    let sequences = (0..SEQS)
        .map(|i| {
            let len = 16 * (i + 1);
            let trained = len - MIXED_PROMPT;
            let total = pad_to.unwrap_or(len).max(len);
            let response: Vec<u32> = (0..total - MIXED_PROMPT).map(|_| next()).collect();
            let r = response.len();
            let mask: Vec<bool> = (0..r).map(|t| t < trained).collect();
            let prompt = (0..MIXED_PROMPT).map(|_| next()).collect();
            sequence(i, prompt, response, mask, vec![-9.0; r])
        })
        .collect();
    TrainBatch::new(sequences).expect("valid batch")
}

const MIXED_PROMPT: usize = 8;

/// Every sequence's prompt and response tokens.
fn real_tokens(batch: &TrainBatch) -> u64 {
    batch
        .sequences()
        .iter()
        .map(|s| (s.prompt_ids.len() + s.response_ids.len()) as u64)
        .sum()
}

/// A trainer with the default config (its token budget among it) at a small learning rate.
fn default_trainer(model: CausalLm, device: &Device) -> Trainer {
    let config = TrainerConfig {
        lr: 1e-6,
        ..TrainerConfig::default()
    };
    Trainer::new(model, config, device).expect("trainer")
}

/// 8 prompts of 64 tokens, each with 8 responses of 16 to 240 tokens (every length, in an order
/// that differs per prompt), all trained.
fn grouped_batch(vocab: usize) -> TrainBatch {
    let mut next = token_stream(0x6a09_e667, vocab);
    let mut sequences = Vec::new();
    for g in 0..8 {
        let prompt: Vec<u32> = (0..64).map(|_| next()).collect();
        for s in 0..8 {
            let r = 16 + 32 * ((s * 5 + g * 3) % 8);
            let response = (0..r).map(|_| next()).collect();
            let i = sequences.len();
            sequences.push(sequence(
                i,
                prompt.clone(),
                response,
                vec![true; r],
                vec![-9.0; r],
            ));
        }
    }
    TrainBatch::new(sequences).expect("valid batch")
}

/// Peak resident memory of this process since the last [`reset_peak_rss`], in MiB (Linux).
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn reset_peak_rss() {
    // Linux resets VmHWM to the current RSS on "5"; elsewhere the figure is the process's peak.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn bench(c: &mut Criterion) {
    let device = Device::flex();
    let models = bench_models(&device);

    // The GEMM peak: one gate/up-shaped product (2·M·N·K FLOPs counted as elements).
    let (m, k, n) = (2048usize, 512usize, 1408usize);
    let a = Tensor::<2>::random([m, k], Distribution::Default, &device);
    let w = Tensor::<2>::random([k, n], Distribution::Default, &device);
    let mut group = c.benchmark_group("matmul_peak");
    group.sample_size(20);
    group.throughput(Throughput::Elements((2 * m * n * k) as u64));
    group.bench_function("flex_2048x512x1408", |b| {
        b.iter(|| a.clone().matmul(w.clone()))
    });
    let (a2, w2) = (
        Tensor::<2>::random([2048, 2048], Distribution::Default, &device),
        Tensor::<2>::random([2048, 2048], Distribution::Default, &device),
    );
    group.throughput(Throughput::Elements(2 * 2048u64.pow(3)));
    group.bench_function("flex_2048x2048x2048", |b| {
        b.iter(|| a2.clone().matmul(w2.clone()))
    });
    // roll's own GEMM (what the decoder and the fused training path run), same shapes; the
    // right operand packed once, as the decoder's weights are.
    use roll_backend_burn::engine::cpu::gemm::{Init, MatRef, PackedB, matmul};
    // And the tiny model's MLP products over a GRPO step's ~1,000 tokens (its fused gate|up
    // projection and its down projection): the rate at the shapes `rl_step` runs.
    for (m, k, n) in [
        (2048usize, 512usize, 1408usize),
        (2048, 2048, 2048),
        (1024, 128, 704),
        (1024, 352, 128),
    ] {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104_729) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let packed = PackedB::new(MatRef::row_major(&w, k, n));
        let mut out = vec![0.0f32; m * n];
        group.throughput(Throughput::Elements((2 * m * n * k) as u64));
        group.bench_function(format!("roll_{m}x{k}x{n}"), |b| {
            b.iter(|| {
                matmul(
                    &mut out,
                    MatRef::row_major(&a, m, k),
                    &packed,
                    Init::Overwrite,
                )
            })
        });
    }
    group.finish();

    // Full fine-tuning, and LoRA (rank 16 on every projection of the decoder layers; on the
    // fused path the adapters' gradients go through the rank-16 products, autodiff
    // differentiates through `W + scale·A·B`).
    let lora = LoraConfig {
        rank: 16,
        alpha: 32.0,
        target_modules: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
        .map(String::from)
        .to_vec(),
    };
    let objective = Objective::default();
    let batches: Vec<_> = models
        .iter()
        .map(|(name, model)| (*name, model, batch(model, &device)))
        .collect();
    for (group_name, lora) in [
        ("train_step_16x128", None),
        ("train_step_16x128_lora", Some(lora)),
    ] {
        let mut group = c.benchmark_group(group_name);
        group.sample_size(10);
        group.throughput(Throughput::Elements((SEQS * LEN) as u64));
        for (name, model, b) in &batches {
            // The fused CPU kernels (what a CPU run uses) and Burn's autodiff (the generic path).
            for (path, kernels) in [
                ("fused", TrainKernels::Auto),
                ("autodiff", TrainKernels::Autodiff),
            ] {
                let config = TrainerConfig {
                    lr: 1e-6,
                    kernels,
                    lora: lora.clone(),
                    ..TrainerConfig::default()
                };
                let mut trainer = Trainer::new((*model).clone(), config, &device).expect("trainer");
                reset_peak_rss();
                // Criterion skips benches a filter leaves out; their peak would mean nothing.
                let mut ran = false;
                group.bench_with_input(BenchmarkId::new(path, name), b, |bench, b| {
                    ran = true;
                    bench.iter(|| trainer.step(b, &objective).expect("train step"))
                });
                if let Some(mib) = peak_rss_mib().filter(|_| ran) {
                    println!("peak RSS, {group_name} {path} of {name}: {mib:.0} MiB");
                }
            }
        }
        group.finish();
    }

    // Data parallelism in one process: the same step split across 1 or 2 replicas on the CPU
    // (threads sharing the rayon pool, gradients summed through the replicas' group).
    let mut group = c.benchmark_group("train_step_16x128_data_parallel");
    group.sample_size(10);
    group.throughput(Throughput::Elements((SEQS * LEN) as u64));
    for (name, model, b) in &batches {
        for replicas in [1, 2] {
            let config = TrainerConfig {
                lr: 1e-6,
                ..TrainerConfig::default()
            };
            let mut trainers = DataParallel::new(&vec![DeviceSpec::Cpu; replicas], |device| {
                Trainer::new((*model).clone(), config.clone(), &device)
            })
            .expect("replicas");
            group.bench_with_input(
                BenchmarkId::new(format!("replicas_{replicas}"), name),
                b,
                |bench, b| bench.iter(|| trainers.step(b, &objective).expect("train step")),
            );
        }
    }
    group.finish();

    let mut group = c.benchmark_group("train_step_groups");
    group.sample_size(10);
    for (name, model) in &models {
        let b = grouped_batch(model.vocab_size());
        group.throughput(Throughput::Elements(real_tokens(&b)));
        let mut trainer = default_trainer(model.clone(), &device);
        group.bench_function(*name, |bench| {
            bench.iter(|| trainer.step(&b, &objective).expect("train step"))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("train_step_mixed");
    group.sample_size(10);
    for (name, model) in models {
        let vocab = model.vocab_size();
        let packed = mixed_batch(vocab, None);
        group.throughput(Throughput::Elements(real_tokens(&packed)));
        let mut trainer = default_trainer(model, &device);
        for (layout, b) in [
            ("packed", packed),
            ("padded", mixed_batch(vocab, Some(256))),
        ] {
            group.bench_with_input(BenchmarkId::new(layout, name), &b, |bench, b| {
                bench.iter(|| trainer.step(b, &objective).expect("train step"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
