//! Generation throughput (new tokens/s) of the inference engine on the CPU: `batch` requests of a
//! 16-token prompt, 64 new tokens each (sampling at temperature 1, no stop), submitted at once, for
//! the `tiny-qwen2` fixture and the ~28M config of `shared/baselines.md` (hidden 512, 8 layers,
//! 8/4 heads, ffn 1408, vocab 8192, tied). Throughput counts new tokens only; the time includes
//! prefill, as in the PyTorch baseline.
//!
//! A second group, `multi_turn_*`, plays 16 conversations of 6 turns side by side as an agentic
//! rollout does (a 64-token first prompt; each turn 8 new tokens, then 16 observation tokens
//! appended), with the engine's prefix cache on (each turn prefills only its new tokens) and off
//! (each turn prefills the whole conversation so far).
//!
//! `cargo bench --bench generate` (measure with the machine otherwise idle).
//! `ROLL_BENCH_DECODER=device` measures the device decoder (a paged cache in Burn tensors, on the
//! CPU here) and `ROLL_BENCH_DECODER=burn` the recomputing oracle instead of the automatic choice.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;
use common::bench_models;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roll_backend_burn::Device;
use roll_backend_burn::engine::{DecoderKind, Engine, EngineConfig};
use roll_core::policy::{GenerationRequest, SamplingParams};

const PROMPT: usize = 16;
const NEW: u32 = 64;

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

const CONVERSATIONS: usize = 16;
const TURNS: usize = 6;
const FIRST_PROMPT: usize = 64;
const TURN_NEW: u32 = 8;
const OBSERVATION: usize = 16;

/// Plays the multi-turn workload once; returns the tokens generated.
fn converse(engine: &Engine, vocab: usize, round: u64) -> usize {
    // Conversations differ from round to round: no round reuses a prefix a previous one left.
    let token = |c: usize, t: usize| ((c * 131 + t * 17 + round as usize * 7919) % vocab) as u32;
    let mut prompts: Vec<Vec<u32>> = (0..CONVERSATIONS)
        .map(|c| (0..FIRST_PROMPT).map(|t| token(c, t)).collect())
        .collect();
    let mut generated = 0;
    for turn in 0..TURNS {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(c, prompt)| {
                let params = SamplingParams {
                    temperature: 1.0,
                    max_new_tokens: TURN_NEW,
                    seed: Some(round * 1000 + (c * TURNS + turn) as u64),
                    ..SamplingParams::default()
                };
                engine
                    .submit(GenerationRequest::new(prompt.clone(), params))
                    .expect("submit")
            })
            .collect();
        for (c, h) in handles.into_iter().enumerate() {
            let ids = h.wait().expect("generation").token_ids;
            generated += ids.len();
            prompts[c].extend_from_slice(&ids);
            prompts[c].extend((0..OBSERVATION).map(|t| token(c + turn, t + 7)));
        }
    }
    generated
}

fn bench_multi_turn(c: &mut Criterion) {
    let device = Device::flex();
    for (name, model) in &bench_models(&device) {
        let kind = DecoderKind::auto(model, &device);
        let mut group = c.benchmark_group(format!("multi_turn_{name}_16x6"));
        group.sample_size(10);
        group.throughput(Throughput::Elements(
            (CONVERSATIONS * TURNS) as u64 * u64::from(TURN_NEW),
        ));
        for prefix_cache in [true, false] {
            let config = EngineConfig {
                max_seqs: CONVERSATIONS,
                prefix_cache,
                ..EngineConfig::default()
            };
            let engine = Engine::with_decoder(kind, model, &device, config, None).expect("engine");
            let label = if prefix_cache {
                "prefix_cache"
            } else {
                "no_prefix_cache"
            };
            let mut round = 0;
            group.bench_function(label, |b| {
                b.iter(|| {
                    round += 1;
                    converse(&engine, model.vocab_size(), round)
                })
            });
        }
        group.finish();
    }
}

fn bench(c: &mut Criterion) {
    let device = Device::flex();
    let models = bench_models(&device);
    let forced = match std::env::var("ROLL_BENCH_DECODER").as_deref() {
        Ok("burn") => Some(DecoderKind::Burn),
        Ok("device") => Some(DecoderKind::Device),
        _ => None,
    };
    for (name, model) in &models {
        let kind = forced.unwrap_or_else(|| DecoderKind::auto(model, &device));
        let mut group = c.benchmark_group(format!("generate_{name}_p16_n64"));
        group.sample_size(10);
        for batch in [1usize, 8, 32, 64] {
            let config = EngineConfig {
                max_seqs: batch,
                max_cached_tokens: batch * (PROMPT + NEW as usize),
                ..EngineConfig::default()
            };
            let engine = Engine::with_decoder(kind, model, &device, config, None).expect("engine");
            group.throughput(Throughput::Elements(batch as u64 * NEW as u64));
            let mut round = 0;
            group.bench_function(BenchmarkId::from_parameter(batch), |b| {
                b.iter(|| {
                    round += 1;
                    generate(&engine, batch, model.vocab_size(), round)
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench, bench_multi_turn);
criterion_main!(benches);
