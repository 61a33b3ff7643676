#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Qwen3 and Qwen3-MoE: random tiny models written with the saver, reloaded, and checked for
//! exact round trips and padding invariance.

mod support;

use roll_backend_burn::models::qwen3_moe::FeedForward;
use roll_backend_burn::{
    CausalLm, Device, HfConfig, PaddingSide, SaveOptions, TokenBatch, load_model, save_model,
};
use support::{max_abs_diff, temp_dir};

fn qwen3_config() -> HfConfig {
    // head_dim 24 != hidden 64 / heads 4.
    let mut c = HfConfig::new("qwen3", 97, 64, 96, 2, 4);
    c.num_key_value_heads = Some(2);
    c.head_dim = Some(24);
    c.tie_word_embeddings = true;
    c.rope_theta = Some(1_000_000.0);
    c
}

fn moe_config(shared: Option<usize>) -> HfConfig {
    let mut c = qwen3_config();
    c.model_type = "qwen3_moe".into();
    c.num_hidden_layers = 3;
    c.tie_word_embeddings = false;
    c.num_experts = Some(6);
    c.num_experts_per_tok = Some(2);
    c.moe_intermediate_size = Some(32);
    c.norm_topk_prob = Some(true);
    c.mlp_only_layers = Some(vec![1]);
    c.shared_expert_intermediate_size = shared;
    c
}

fn sequences() -> Vec<Vec<u32>> {
    vec![
        vec![3, 14, 15, 92, 65, 35, 89],
        vec![7, 1],
        vec![2, 71, 82, 81],
    ]
}

/// Saves, reloads, and checks logits equal exactly and padding changes nothing.
fn round_trip_and_padding(config: HfConfig, name: &str) -> CausalLm {
    let device = Device::flex();
    let model = CausalLm::init(&config, &device).unwrap();
    let dir = temp_dir(name);
    save_model(&model, &dir, &SaveOptions::default()).unwrap();
    let reloaded = load_model(&dir, &device).unwrap();
    let v = config.vocab_size;
    for seq in sequences() {
        let b = TokenBatch::single(&seq, v, &device).unwrap();
        let a: Vec<f32> = model.forward(&b).into_data().try_into_vec().unwrap();
        let r: Vec<f32> = reloaded.forward(&b).into_data().try_into_vec().unwrap();
        assert_eq!(a, r, "{name}: reloaded logits differ");
        assert!(a.iter().all(|x| x.is_finite()));
    }
    let seqs = sequences();
    let width = seqs.iter().map(Vec::len).max().unwrap();
    for padding in [PaddingSide::Left, PaddingSide::Right] {
        let batch = TokenBatch::new(&seqs, padding, 0, v, &device).unwrap();
        let all: Vec<f32> = reloaded.forward(&batch).into_data().try_into_vec().unwrap();
        for (r, seq) in seqs.iter().enumerate() {
            let alone = TokenBatch::single(seq, v, &device).unwrap();
            let want: Vec<f32> = reloaded.forward(&alone).into_data().try_into_vec().unwrap();
            for t in 0..seq.len() {
                let c = batch.column(r, t);
                let got = &all[(r * width + c) * v..(r * width + c + 1) * v];
                let d = max_abs_diff(got, &want[t * v..(t + 1) * v]);
                // Randomly initialised (unseeded) weights: padding changes the GEMM shapes, so
                // rows may differ by f32 round-off (seen up to 1.1e-5); a padding bug would
                // differ by orders of magnitude more. HF agreement is checked on the fixtures.
                assert!(d <= 1e-4, "{name} {padding:?} row {r} t {t}: {d}");
            }
        }
    }
    reloaded
}

#[test]
fn qwen3_has_qk_norm_free_head_dim_and_round_trips() {
    let model = round_trip_and_padding(qwen3_config(), "qwen3");
    let CausalLm::Qwen3(m) = &model else {
        panic!("not qwen3")
    };
    let attn = &m.model.layers[0].self_attn;
    assert!(attn.q_norm.is_some() && attn.k_norm.is_some());
    assert!(attn.q_proj.bias.is_none());
    assert_eq!(attn.q_proj.weight.dims(), [64, 4 * 24]);
    assert_eq!(model.hf_config().head_dim, Some(24));
}

#[test]
fn qwen3_checkpoint_keys_are_hf_names() {
    let device = Device::flex();
    let model = CausalLm::init(&qwen3_config(), &device).unwrap();
    let dir = temp_dir("qwen3keys");
    save_model(&model, &dir, &SaveOptions::default()).unwrap();
    let tensors = support::read_safetensors(&dir.join("model.safetensors"));
    for key in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.1.self_attn.k_norm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.norm.weight",
    ] {
        assert!(
            tensors.contains_key(key),
            "{key} missing: {:?}",
            tensors.keys()
        );
    }
    assert_eq!(
        tensors["model.layers.0.self_attn.q_proj.weight"].1,
        vec![96, 64]
    );
    assert!(
        !tensors.contains_key("lm_head.weight"),
        "tied head is not saved"
    );
}

#[test]
fn qwen3_moe_routes_and_round_trips() {
    let model = round_trip_and_padding(moe_config(None), "moe");
    let CausalLm::Qwen3Moe(m) = &model else {
        panic!("not moe")
    };
    assert!(matches!(m.model.layers[0].mlp, FeedForward::Sparse(_)));
    assert!(
        matches!(m.model.layers[1].mlp, FeedForward::Dense(_)),
        "mlp_only_layers"
    );
    assert!(matches!(m.model.layers[2].mlp, FeedForward::Sparse(_)));
}

#[test]
fn qwen3_moe_with_shared_expert_round_trips_with_hf_keys() {
    let device = Device::flex();
    round_trip_and_padding(moe_config(Some(40)), "moe_shared");
    let model = CausalLm::init(&moe_config(Some(40)), &device).unwrap();
    let dir = temp_dir("moe_keys");
    save_model(&model, &dir, &SaveOptions::default()).unwrap();
    let tensors = support::read_safetensors(&dir.join("model.safetensors"));
    for key in [
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.mlp.experts.5.down_proj.weight",
        "model.layers.0.mlp.shared_expert.up_proj.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
        "model.layers.1.mlp.gate_proj.weight",
        "lm_head.weight",
    ] {
        assert!(
            tensors.contains_key(key),
            "{key} missing: {:?}",
            tensors.keys()
        );
    }
    assert_eq!(tensors["model.layers.0.mlp.gate.weight"].1, vec![6, 64]);
    assert_eq!(
        tensors["model.layers.0.mlp.shared_expert_gate.weight"].1,
        vec![1, 64]
    );
}

#[test]
fn moe_output_is_the_weighted_sum_of_the_chosen_experts() {
    use burn::tensor::{Tensor, TensorData, activation::softmax};
    let device = Device::flex();
    let model = CausalLm::init(&moe_config(None), &device).unwrap();
    let CausalLm::Qwen3Moe(m) = &model else {
        panic!()
    };
    let FeedForward::Sparse(moe) = &m.model.layers[0].mlp else {
        panic!()
    };
    let x = Tensor::<3>::from_data(
        TensorData::new(
            (0..3 * 64)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect(),
            [1, 3, 64],
        ),
        &device,
    );
    let got: Vec<f32> = moe.forward(x.clone()).into_data().try_into_vec().unwrap();
    // Dense reference: every expert on every token, weights zero outside the top 2.
    let x2 = x.reshape([3, 64]);
    let probs: Vec<f32> = softmax(moe.gate.forward(x2.clone()), 1)
        .into_data()
        .try_into_vec()
        .unwrap();
    let outs: Vec<Vec<f32>> = moe
        .experts
        .iter()
        .map(|e| e.forward(x2.clone()).into_data().try_into_vec().unwrap())
        .collect();
    for t in 0..3 {
        let p = &probs[t * 6..(t + 1) * 6];
        let mut idx: Vec<usize> = (0..6).collect();
        idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let norm = p[idx[0]] + p[idx[1]];
        for h in 0..64 {
            let want: f32 = idx[..2]
                .iter()
                .map(|&e| p[e] / norm * outs[e][t * 64 + h])
                .sum();
            assert!((got[t * 64 + h] - want).abs() < 1e-5, "token {t} dim {h}");
        }
    }
}
