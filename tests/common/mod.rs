#![allow(dead_code)] // each test crate uses its own part of these helpers
//! What the facade's integration tests share: the fixture, a fresh output directory, and the
//! toy verifiable reward.

use roll::core::rng::SplitMix64;
use roll::prelude::*;
use std::path::PathBuf;

/// The arithmetic-tuned tiny Qwen2 fixture.
pub const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/tiny-qwen2-sft"
);

/// The `[model]` of a run on a new 1-layer Qwen2 (hidden size 32) with the byte tokenizer and
/// plain prompts: SFT from scratch in seconds.
pub const TINY_NEW_MODEL: &str = r#"
[model]
prompt_format = "plain"
[model.source]
kind = "new"
model_type = "qwen2"
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
max_position_embeddings = 32
"#;

/// An empty temporary run directory, unique to this test process and `name`.
pub fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("roll-tests-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// 1 when the answer starts with the sum's first digit.
pub fn first_digit(s: &Sample) -> f32 {
    let truth = s.prompt.ground_truth.as_deref().unwrap_or_default();
    let answer = s.text.trim_start();
    f32::from(u8::from(
        !truth.is_empty() && answer.starts_with(&truth[..1]),
    ))
}

/// 1 when the bytes of the answer sum to an even number: a reward that about half of a random
/// model's samples collect, so that a run of a random model (the mixtures of experts below) has
/// advantages and its steps move the weights — runs that must train alike then check training,
/// not a step that changed nothing. Select it with `domains.arithmetic.reward.kind=even_bytes`
/// (register it as `even_bytes`).
pub fn even_bytes(s: &Sample) -> f32 {
    let sum: u32 = s.text.bytes().map(u32::from).sum();
    f32::from(u8::from(!s.text.is_empty() && sum.is_multiple_of(2)))
}

/// A two-step RLVR run of the fixture on `out`: 2 prompts × 4 samples × 4 new tokens, rewarded by
/// the `first_digit` closure (register it as `first_digit`).
pub fn tiny_rlvr_toml(out: &std::path::Path) -> String {
    format!(
        r#"
        pipeline = "rlvr"
        [run]
        max_steps = 2
        output_dir = "{out}"
        [model]
        source = {{ kind = "hf_dir", path = "{FIXTURE}" }}
        prompt_format = "plain"
        [rollout]
        prompts_per_step = 2
        group_size = 4
        max_new_tokens = 4
        [train]
        learning_rate = 1e-4
        [domains.arithmetic]
        reward = {{ kind = "first_digit" }}
        "#,
        out = out.display()
    )
}

/// `Q: a+b=? A:` prompts tagged `arithmetic`, with their sums as ground truth.
pub fn sums() -> impl Iterator<Item = Prompt> + Send {
    (0..64).map(|i: u64| {
        let (a, b) = (10 + i % 37, 20 + (i * 7) % 29);
        Prompt::new(PromptId(i), format!("Q: {a}+{b}=? A:"), "arithmetic")
            .with_ground_truth((a + b).to_string())
    })
}

/// A random Qwen3-MoE (a dense first layer, then four experts of width 32, two per token, and a
/// shared expert) with the tiny fixture's tokenizer, written as a HF directory under `out`.
pub fn moe_model_dir(out: &std::path::Path) -> std::path::PathBuf {
    moe_model_dir_with(out, "moe-model", &[false, true])
}

/// As [`moe_model_dir`], with a layer per entry of `sparse`: a mixture where it is `true`, the
/// dense MLP where it is `false`; in `out/name`.
pub fn moe_model_dir_with(
    out: &std::path::Path,
    name: &str,
    sparse: &[bool],
) -> std::path::PathBuf {
    use roll::backend::{CausalLm, Device, HfConfig, SaveOptions, save_model};
    let fixture = std::path::Path::new(FIXTURE);
    let mut c = HfConfig::new("qwen3_moe", 512, 64, 96, sparse.len(), 4);
    c.num_key_value_heads = Some(2);
    c.head_dim = Some(16);
    c.num_experts = Some(4);
    c.num_experts_per_tok = Some(2);
    c.moe_intermediate_size = Some(32);
    c.shared_expert_intermediate_size = Some(32);
    c.mlp_only_layers = Some((0..sparse.len()).filter(|&l| !sparse[l]).collect());
    c.tie_word_embeddings = true;
    let model = CausalLm::init(&c, &Device::flex()).expect("model");
    // Every matrix drawn from N(0, 0.02²) as transformers initialises, from a fixed seed: the
    // same model every run, whose next-token distribution is near uniform, so that its samples
    // differ. (Burn's own init draws the tied embedding from N(0, 1): the residual stream then
    // points at the input token, which such a model repeats forever.)
    let model = burn::module::Module::map(model, &mut SeededInit(SplitMix64::new(17)));
    let dir = out.join(name);
    save_model(&model, &dir, &SaveOptions::default()).expect("saved");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture.join(file), dir.join(file)).expect("tokenizer");
    }
    dir
}

/// Draws every matrix of a model from N(0, 0.02²) (see [`moe_model_dir_with`]); vectors (the
/// norms' gains) stay as they are.
struct SeededInit(SplitMix64);

impl burn::module::ModuleMapper for SeededInit {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::tensor::Tensor<D>>,
    ) -> burn::module::Param<burn::tensor::Tensor<D>> {
        if D < 2 {
            return param;
        }
        param.map(|t| {
            let shape = t.shape();
            let values: Vec<f32> = (0..shape.num_elements())
                .map(|_| {
                    // Box–Muller.
                    let (u, v) = (1.0 - self.0.next_f64(), self.0.next_f64());
                    (0.02 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
                })
                .collect();
            burn::tensor::Tensor::from_data(
                burn::tensor::TensorData::new(values, shape),
                &t.device(),
            )
        })
    }
}
