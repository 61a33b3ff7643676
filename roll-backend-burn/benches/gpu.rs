//! The GPU path's throughput (features `wgpu` or `cuda`), on the device `ROLL_BENCH_DEVICE` names
//! (default `vulkan:0`, the machine's best Vulkan adapter): the shapes of the CPU benches in the
//! workspace's `benches/` and of `shared/baselines.md`, so that `benches/pytorch_baseline.py
//! <tiny|small> cuda` on the same machine is the comparison.
//!
//! - `gpu_matmul`: one f32 product through Burn's matmul on the device (the 28M config's gate/up
//!   shape and 4096³): the peak the other figures' model-FLOPs utilisation is read against;
//! - `gpu_train_step_16x128`: 16 sequences × 128 tokens (16 prompt + 112 trained response tokens,
//!   PPO objective with ratios near 1), forward + backward on Burn's autodiff + global clip + the
//!   fused AdamW kernel, one micro-batch;
//! - `gpu_score_16x128`: the log-probs of the same shape (Burn's forward on the device);
//! - `gpu_generate_p16_n64`: 1 and 32 requests of a 16-token prompt, 64 new tokens each, sampled
//!   at temperature 1 by the engine's device decoder (paged cache and sampling kernels on the
//!   device).
//!
//! Models: the `tiny-qwen2` fixture (skipped when `../shared` is absent) and the ~28M config
//! (hidden 512, 8 layers, 8/4 heads, ffn 1408, vocab 8192, tied). Every measured call ends in a
//! read back to the host (a report, log-probs, tokens), so the time is the device's work.
//!
//! `ROLL_BENCH_DEVICE=vulkan:0 cargo bench -p roll-backend-burn --features wgpu --bench gpu`

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use burn::module::Module;
use burn::tensor::{Distribution, Tensor};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roll_backend_burn::engine::{DecoderKind, Engine, EngineConfig};
use roll_backend_burn::train::{Trainer, TrainerConfig};
use roll_backend_burn::{
    CausalLm, Device, DeviceSpec, HfConfig, ScoringOptions, load_model, score,
};
use roll_core::policy::{
    GenerationRequest, Objective, SamplingParams, ScoreRequest, ScoreSequence,
};
use roll_core::{SampleId, TrainBatch, TrainSequence};
use std::path::PathBuf;

const SEQS: usize = 16;
const PROMPT: usize = 16;
const LEN: usize = 128;
const BATCH: usize = 32;
const NEW: u32 = 64;

fn bench_device() -> Device {
    let spec = std::env::var("ROLL_BENCH_DEVICE").unwrap_or_else(|_| "vulkan:0".into());
    let spec: DeviceSpec = spec
        .parse()
        .unwrap_or_else(|e| panic!("ROLL_BENCH_DEVICE={spec}: {e}"));
    roll_backend_burn::device(spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// The tiny fixture (when `../shared` is there) and the 28M config, on `device`.
fn models(device: &Device) -> Vec<(&'static str, CausalLm)> {
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/tiny-qwen2");
    let mut models = Vec::new();
    match load_model(&fixture, &Device::flex()) {
        Ok(m) => models.push(("tiny", m.to_device(device))),
        Err(e) => eprintln!("skipping tiny fixture: {e}"),
    }
    let mut cfg = HfConfig::new("qwen2", 8192, 512, 1408, 8, 8);
    cfg.num_key_value_heads = Some(4);
    cfg.tie_word_embeddings = true;
    models.push((
        "small-28M",
        CausalLm::init(&cfg, device).expect("valid config"),
    ));
    models
}

/// Token ids below `vocab` from a xorshift generator.
fn token_stream(vocab: usize) -> impl FnMut() -> u32 {
    let mut state = 0x2545_f491_u64;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab as u64) as u32
    }
}

fn score_request(vocab: usize) -> ScoreRequest {
    let mut next = token_stream(vocab);
    ScoreRequest {
        sequences: (0..SEQS)
            .map(|_| {
                let ids: Vec<u32> = (0..LEN).map(|_| next()).collect();
                ScoreSequence {
                    prompt_ids: ids[..PROMPT].to_vec(),
                    response_ids: ids[PROMPT..].to_vec(),
                }
            })
            .collect(),
        with_entropy: false,
        ..Default::default()
    }
}

/// The scored sequences as a training batch whose old log-probs are the model's own, advantage
/// +1 (even) or −1 (odd) on every response token.
fn train_batch(model: &CausalLm, device: &Device) -> TrainBatch {
    let request = score_request(model.vocab_size());
    let old = score(model, None, &request, &ScoringOptions::default(), device).expect("score");
    let sequences = request
        .sequences
        .into_iter()
        .zip(old)
        .enumerate()
        .map(|(i, (s, old))| {
            let r = s.response_ids.len();
            TrainSequence {
                sample: SampleId(i as u64),
                prompt_ids: s.prompt_ids,
                response_ids: s.response_ids,
                loss_mask: vec![true; r],
                rollout_logprobs: old.logprobs.clone(),
                old_logprobs: old.logprobs,
                ref_logprobs: None,
                advantages: vec![if i % 2 == 0 { 1.0 } else { -1.0 }; r],
                returns: None,
                old_values: None,
                weight: 1.0,
                score: 0.0,
            }
        })
        .collect();
    TrainBatch::new(sequences).expect("valid batch")
}

fn generate(engine: &Engine, batch: usize, vocab: usize, round: u64) -> usize {
    let handles: Vec<_> = (0..batch)
        .map(|i| {
            let prompt = (0..PROMPT)
                .map(|t| ((i * 131 + t * 17 + 3) % vocab) as u32)
                .collect();
            let params = SamplingParams {
                temperature: 1.0,
                max_new_tokens: NEW,
                seed: Some(round * 1000 + i as u64),
                ..SamplingParams::default()
            };
            engine
                .submit(GenerationRequest::new(prompt, params))
                .expect("submit")
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.wait().expect("generation").token_ids.len())
        .sum()
}

fn bench(c: &mut Criterion) {
    let device = bench_device();
    let models = models(&device);

    let mut group = c.benchmark_group("gpu_matmul");
    group.sample_size(20);
    for (m, k, n) in [(2048usize, 512usize, 1408usize), (4096, 4096, 4096)] {
        let a = Tensor::<2>::random([m, k], Distribution::Default, &device);
        let w = Tensor::<2>::random([k, n], Distribution::Default, &device);
        group.throughput(Throughput::Elements((2 * m * n * k) as u64));
        // Reading its sum back waits for the product without timing a large copy (the sum
        // reads `m·n` values once: under 1% of the product's time at these shapes).
        group.bench_function(format!("{m}x{k}x{n}"), |b| {
            b.iter(|| a.clone().matmul(w.clone()).sum().into_data())
        });
    }
    group.finish();

    let objective = Objective::default();
    let mut group = c.benchmark_group("gpu_train_step_16x128");
    group.sample_size(10);
    group.throughput(Throughput::Elements((SEQS * LEN) as u64));
    for (name, model) in &models {
        let batch = train_batch(model, &device);
        let config = TrainerConfig {
            lr: 1e-6,
            ..TrainerConfig::default()
        };
        let mut trainer = Trainer::new(model.clone(), config, &device).expect("trainer");
        group.bench_with_input(BenchmarkId::from_parameter(name), &batch, |b, batch| {
            b.iter(|| trainer.step(batch, &objective).expect("train step"))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("gpu_score_16x128");
    group.sample_size(10);
    group.throughput(Throughput::Elements((SEQS * LEN) as u64));
    let options = ScoringOptions::default();
    for (name, model) in &models {
        let request = score_request(model.vocab_size());
        group.bench_with_input(BenchmarkId::from_parameter(name), &request, |b, r| {
            b.iter(|| score(model, None, r, &options, &device).expect("score"))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("gpu_generate_p16_n64");
    group.sample_size(10);
    for (name, model) in &models {
        for batch in [1, BATCH] {
            let config = EngineConfig {
                max_seqs: batch,
                max_cached_tokens: batch * (PROMPT + NEW as usize),
                ..EngineConfig::default()
            };
            let engine = Engine::with_decoder(DecoderKind::Device, model, &device, config, None)
                .expect("engine");
            group.throughput(Throughput::Elements(batch as u64 * u64::from(NEW)));
            let mut round = 0;
            group.bench_function(BenchmarkId::new(*name, batch), |b| {
                b.iter(|| {
                    round += 1;
                    generate(&engine, batch, model.vocab_size(), round)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
