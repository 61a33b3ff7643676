//! What the decoders' tests share: fixtures, random models of awkward shapes, token ids, the
//! full-forward reference and its tolerance.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::backend::{CacheConfig, SeqId, StepInput};
use crate::models::TokenBatch;
use crate::{CausalLm, Device, HfConfig, load_model};
use roll_core::rng::SplitMix64;
use std::path::PathBuf;

pub(crate) fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures")
        .join(name)
}

pub(crate) fn tiny(name: &str) -> CausalLm {
    load_model(fixture(name), &Device::flex()).expect("fixture loads")
}

/// Qwen3 with head_dim 24 != hidden 64 / heads 4, GQA 4/2, tied embeddings.
pub(crate) fn qwen3_config() -> HfConfig {
    let mut c = HfConfig::new("qwen3", 97, 64, 96, 2, 4);
    c.num_key_value_heads = Some(2);
    c.head_dim = Some(24);
    c.tie_word_embeddings = true;
    c.rope_theta = Some(1_000_000.0);
    c
}

/// Qwen3 with attention biases, an untied LM head and no GQA sharing.
pub(crate) fn qwen3_bias_config() -> HfConfig {
    let mut c = HfConfig::new("qwen3", 89, 48, 80, 3, 3);
    c.num_key_value_heads = Some(3);
    c.head_dim = Some(16);
    c.attention_bias = Some(true);
    c.tie_word_embeddings = false;
    c
}

/// The benchmark's "small" Qwen2 (hidden 512, 8/4 heads, ffn 1408, vocab 8192), 2 layers: the
/// GEMM shapes whose row invariance batch invariance rests on.
pub(crate) fn small_qwen2_config() -> HfConfig {
    let mut c = HfConfig::new("qwen2", 8192, 512, 1408, 2, 8);
    c.num_key_value_heads = Some(4);
    c.tie_word_embeddings = true;
    c
}

pub(crate) fn random(config: &HfConfig) -> CausalLm {
    CausalLm::init(config, &Device::flex()).expect("valid config")
}

/// Deterministic pseudo-random token ids below `vocab`.
pub(crate) fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// GRPO-like groups as `(prompt, response)` pairs: prompts of 5, 16 (one whole cache block), 17
/// and 35 tokens, each shared by three responses of 1–6 tokens, interleaved, beside three prompts
/// of one token (too short to share) and, last, a prompt no other sequence has. Prompts draw
/// from `seed + i`, responses from `seed + 30 + r`.
pub(crate) fn grpo_groups(vocab: usize, seed: u64) -> Vec<(Vec<u32>, Vec<u32>)> {
    let prompts: Vec<Vec<u32>> = [5, 16, 17, 35, 1]
        .iter()
        .enumerate()
        .map(|(i, &n)| ids(n, vocab, seed + i as u64))
        .collect();
    let mut out = Vec::new();
    for r in 0..3 {
        for (i, p) in prompts.iter().enumerate() {
            let response = ids(1 + (i + 2 * r) % 6, vocab, seed + 30 + r as u64);
            out.push((p.clone(), response));
        }
    }
    out.push((ids(9, vocab, 99), ids(4, vocab, 98)));
    out
}

/// Logits `[len, vocab]` of a full forward of `seq` through the Burn model.
pub(crate) fn full_logits(model: &CausalLm, seq: &[u32]) -> Vec<f32> {
    let batch = TokenBatch::single(seq, model.vocab_size(), &Device::flex()).unwrap();
    model.forward(&batch).into_data().try_into_vec().unwrap()
}

pub(crate) fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The tolerance for logits `want`: 1e-4, scaled up for models whose logits exceed ±10 (float
/// round-off grows with the magnitude; the random `small-qwen2`, with N(0, 1) tied embeddings,
/// has logits near ±100).
pub(crate) fn tolerance(want: &[f32]) -> f32 {
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    1e-4 * (scale / 10.0).max(1.0)
}

pub(crate) fn cache_config(max_seqs: usize, max_cached_tokens: usize) -> CacheConfig {
    CacheConfig {
        max_seqs,
        max_cached_tokens,
    }
}

pub(crate) fn step<'a>(seq: u64, tokens: &'a [u32], start: usize) -> StepInput<'a> {
    StepInput {
        seq: SeqId(seq),
        tokens,
        start,
    }
}

pub(crate) fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The reference prompts of a fixture.
pub(crate) fn fixture_prompts(name: &str) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(fixture(name).join("reference/cases.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["input_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// Qwen3-MoE, GQA 4/2, head_dim 24: layer 0 a dense MLP, layer 1 four experts, two per token.
pub(crate) fn qwen3_moe_config() -> HfConfig {
    let mut c = HfConfig::new("qwen3_moe", 97, 64, 96, 2, 4);
    c.num_key_value_heads = Some(2);
    c.head_dim = Some(24);
    c.num_experts = Some(4);
    c.num_experts_per_tok = Some(2);
    c.moe_intermediate_size = Some(32);
    c.mlp_only_layers = Some(vec![0]);
    c
}

/// The dense models the decoders are checked on, each with its prompts: both fixtures (their
/// reference prompts and a 40-token one), and random Qwen3 and Qwen2 models of awkward shapes.
pub(crate) fn models_under_test() -> Vec<(&'static str, CausalLm, Vec<Vec<u32>>)> {
    let mut out = Vec::new();
    for name in ["tiny-qwen2", "tiny-qwen2-sft"] {
        let m = tiny(name);
        let mut seqs = fixture_prompts(name);
        seqs.push(ids(40, m.vocab_size(), 7));
        out.push((name, m, seqs));
    }
    // `small-qwen2`: inner dimensions above the GEMM's 512-step blocks, products split between threads.
    for (name, cfg) in [
        ("qwen3", qwen3_config()),
        ("qwen3-bias", qwen3_bias_config()),
        ("small-qwen2", small_qwen2_config()),
    ] {
        let m = random(&cfg);
        let v = m.vocab_size();
        out.push((name, m, vec![ids(1, v, 1), ids(17, v, 2), ids(35, v, 3)]));
    }
    out
}
