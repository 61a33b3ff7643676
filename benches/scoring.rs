//! Scoring throughput (tokens/s) of the Burn Qwen2 on the CPU: 16 sequences × 128 tokens, for the
//! `tiny-qwen2` fixture (0.8M parameters) and a ~28M-parameter config (hidden 512, 8 layers,
//! 8/4 heads, ffn 1408, vocab 8192, tied), the shapes of `shared/baselines.md`.
//!
//! Each model runs through the Burn path ([`score`]) and, as `<model>/cpu-decoder`, through
//! [`CpuDecoder::score`].
//!
//! `cargo bench --bench scoring` (measure with the machine otherwise idle).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;
use common::bench_models;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roll_backend_burn::engine::cpu::CpuDecoder;
use roll_backend_burn::{Device, ScoringOptions, score};
use roll_core::policy::{ScoreRequest, ScoreSequence};

const SEQS: usize = 16;
const LEN: usize = 128;

fn request(vocab: usize) -> ScoreRequest {
    let mut state = 0x2545_f491_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab as u64) as u32
    };
    ScoreRequest {
        sequences: (0..SEQS)
            .map(|_| {
                let ids: Vec<u32> = (0..LEN).map(|_| next()).collect();
                ScoreSequence {
                    prompt_ids: ids[..16].to_vec(),
                    response_ids: ids[16..].to_vec(),
                }
            })
            .collect(),
        with_entropy: false,
        ..Default::default()
    }
}

fn bench(c: &mut Criterion) {
    let device = Device::flex();
    let models = bench_models(&device);
    let mut group = c.benchmark_group("score_16x128");
    group.sample_size(10);
    group.throughput(Throughput::Elements((SEQS * LEN) as u64));
    let options = ScoringOptions::default();
    for (name, model) in &models {
        let req = request(model.vocab_size());
        group.bench_with_input(BenchmarkId::from_parameter(name), &req, |b, req| {
            b.iter(|| score(model, None, req, &options, &device).expect("score"))
        });
        let decoder = CpuDecoder::from_model(model).expect("dense model");
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{name}/cpu-decoder")),
            &req,
            |b, req| b.iter(|| decoder.score(req).expect("score")),
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
