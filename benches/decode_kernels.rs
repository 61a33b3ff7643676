//! One decode step of the CPU decoder (`CpuDecoder` over its paged cache): every sequence of the
//! batch appends one token at context 48, for batch 1, 8, 32 and 64, on the `tiny-qwen2` fixture
//! (0.8M parameters) and a ~28M-parameter Qwen2 (hidden 512, 8 layers, 8/4 heads, ffn 1408,
//! vocab 8192, tied). Throughput is new tokens per second (= batch / step time).
//!
//! `cargo bench --bench decode_kernels` (measure with the machine otherwise idle).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;
use common::bench_models;

use burn::tensor::{Tensor, TensorData};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roll_backend_burn::Device;
use roll_backend_burn::engine::cpu::CpuDecoder;
use roll_backend_burn::engine::{CacheConfig, DecodeBackend, SeqId, StepInput};
use std::time::Duration;

/// Tokens cached before the timed step; the step appends the 48th.
const CONTEXT: usize = 47;
const BATCHES: [usize; 4] = [1, 8, 32, 64];

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = 0x2545_f491_u64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as u32
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let device = Device::flex();
    let models = bench_models(&device);
    for (name, model) in &models {
        let decoder = CpuDecoder::from_model(model).expect("dense qwen");
        let vocab = decoder.vocab_size();
        let mut group = c.benchmark_group(format!("decode_step_ctx48/{name}"));
        group.sample_size(30);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(4));
        for batch in BATCHES {
            let config = CacheConfig {
                max_seqs: batch,
                max_cached_tokens: batch * 64,
            };
            let mut cache = decoder.new_cache(&config).expect("cache");
            let prompts: Vec<Vec<u32>> = (0..batch)
                .map(|i| tokens(CONTEXT, vocab, i as u64))
                .collect();
            let prefill: Vec<StepInput<'_>> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| StepInput {
                    seq: SeqId(i as u64),
                    tokens: p,
                    start: 0,
                })
                .collect();
            decoder.forward(&mut cache, &prefill).expect("prefill");
            let next: Vec<[u32; 1]> = (0..batch).map(|i| [(i * 31 % vocab) as u32]).collect();
            let step: Vec<StepInput<'_>> = next
                .iter()
                .enumerate()
                .map(|(i, t)| StepInput {
                    seq: SeqId(i as u64),
                    tokens: t,
                    start: CONTEXT,
                })
                .collect();
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_function(BenchmarkId::from_parameter(batch), |b| {
                b.iter(|| {
                    let logits = decoder.forward(&mut cache, &step).expect("decode");
                    // Roll the step back so every iteration decodes at the same context.
                    for s in &step {
                        decoder.truncate(&mut cache, s.seq, CONTEXT);
                    }
                    logits
                })
            });
        }
        group.finish();
    }
}

/// The small config's GEMMs at 32 tokens (`GEMM_SHAPES=MxKxN,...` to choose others), three ways:
/// `x_w` = `X · W` with Burn's `[d_in, d_out]` weight layout; `wt_xt` = `Wᵀ · Xᵀ`, the decoder's
/// formulation, on prebuilt tensors; `wt_xt_vec` = the decoder's full round trip, from a
/// `Vec<f32>` into a tensor, the GEMM, and back into a `Vec<f32>`.
fn gemm(c: &mut Criterion) {
    let device = Device::flex();
    let mut group = c.benchmark_group("gemm");
    group.sample_size(30);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));
    let shapes: Vec<(usize, usize, usize)> = std::env::var("GEMM_SHAPES")
        .ok()
        .map(|s| {
            s.split(',')
                .map(|t| {
                    let v: Vec<usize> = t.split('x').map(|x| x.parse().expect("int")).collect();
                    (v[0], v[1], v[2])
                })
                .collect()
        })
        .unwrap_or_else(|| {
            vec![
                (32, 512, 1024),
                (32, 512, 512),
                (32, 512, 2816),
                (32, 1408, 512),
                (32, 512, 8192),
            ]
        });
    let vals = |len: usize, seed: u64| -> Vec<f32> {
        tokens(len, 2000, seed)
            .into_iter()
            .map(|t| t as f32 / 1000.0 - 1.0)
            .collect()
    };
    for (m, k, n) in shapes {
        let w = Tensor::<2>::from_data(TensorData::new(vals(k * n, 1), [k, n]), &device);
        let wt = Tensor::<2>::from_data(TensorData::new(vals(k * n, 1), [n, k]), &device);
        let x = Tensor::<2>::from_data(TensorData::new(vals(m * k, 2), [m, k]), &device);
        let xt_vec = vals(m * k, 2);
        let xt = Tensor::<2>::from_data(TensorData::new(xt_vec.clone(), [k, m]), &device);
        group.throughput(Throughput::Elements((2 * m * k * n) as u64));
        let id = format!("{m}x{k}x{n}");
        group.bench_function(BenchmarkId::new("x_w", &id), |b| {
            b.iter(|| x.clone().matmul(w.clone()))
        });
        group.bench_function(BenchmarkId::new("wt_xt", &id), |b| {
            b.iter(|| wt.clone().matmul(xt.clone()))
        });
        group.bench_function(BenchmarkId::new("wt_xt_vec", &id), |b| {
            b.iter(|| {
                wt.clone()
                    .matmul(Tensor::<2>::from_data(
                        TensorData::new(xt_vec.clone(), [k, m]),
                        &device,
                    ))
                    .into_data()
                    .try_into_vec::<f32>()
                    .expect("f32")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, gemm, bench);
criterion_main!(benches);
