#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Saving and loading HF directories: exact round trips, shards, and named errors.

mod support;

use roll_backend_burn::{
    BackendError, CausalLm, Device, HfConfig, SaveDtype, SaveOptions, TokenBatch, load_model,
    save_model,
};
use support::{fixture, read_safetensors, safetensors_metadata, temp_dir};

const IDS: [u32; 8] = [51, 28, 223, 19, 20, 13, 21, 23];

fn logits(model: &CausalLm, device: &Device) -> Vec<f32> {
    let batch = TokenBatch::single(&IDS, model.vocab_size(), device).unwrap();
    model.forward(&batch).into_data().try_into_vec().unwrap()
}

#[test]
fn f32_save_is_byte_identical_to_the_hf_checkpoint_and_reloads_exactly() {
    let device = Device::flex();
    let src = fixture("tiny-qwen2-sft");
    let model = load_model(&src, &device).unwrap();
    let dir = temp_dir("f32");
    save_model(&model, &dir, &SaveOptions::default()).unwrap();
    let original = read_safetensors(&src.join("model.safetensors"));
    let saved = read_safetensors(&dir.join("model.safetensors"));
    assert_eq!(
        original.keys().collect::<Vec<_>>(),
        saved.keys().collect::<Vec<_>>()
    );
    assert_eq!(original, saved, "tensors differ from the HF file");
    assert_eq!(
        safetensors_metadata(&dir.join("model.safetensors"))["format"],
        "pt"
    );
    let reloaded = load_model(&dir, &device).unwrap();
    assert_eq!(logits(&model, &device), logits(&reloaded, &device));
}

#[test]
fn bf16_round_trip_is_exact() {
    let device = Device::flex();
    let model = load_model(fixture("tiny-qwen2"), &device).unwrap();
    let bf16 = SaveOptions::default().with_dtype(SaveDtype::Bf16);
    let a = temp_dir("bf16a");
    save_model(&model, &a, &bf16).unwrap();
    let first = read_safetensors(&a.join("model.safetensors"));
    assert!(first.values().all(|(dtype, _, _)| dtype == "BF16"));
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(a.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["dtype"], "bfloat16");
    // bf16 -> f32 params -> bf16 again loses nothing.
    let reloaded = load_model(&a, &device).unwrap();
    let b = temp_dir("bf16b");
    save_model(&reloaded, &b, &bf16).unwrap();
    assert_eq!(first, read_safetensors(&b.join("model.safetensors")));
    // And the bf16 model is still close to the f32 one.
    let d = support::max_abs_diff(&logits(&model, &device), &logits(&reloaded, &device));
    assert!(d < 5e-2, "bf16 logits off by {d}");
}

#[test]
fn sharded_save_writes_an_index_and_loads() {
    let device = Device::flex();
    let model = load_model(fixture("tiny-qwen2-sft"), &device).unwrap();
    let dir = temp_dir("shards");
    save_model(&model, &dir, &SaveOptions::default()).unwrap(); // a stale single file
    save_model(
        &model,
        &dir,
        &SaveOptions::default().with_max_shard_bytes(1_000_000),
    )
    .unwrap();
    assert!(!dir.join("model.safetensors").exists());
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let files: std::collections::BTreeSet<_> = map.values().map(|v| v.as_str().unwrap()).collect();
    assert!(files.len() >= 3, "{files:?}");
    assert!(files.contains("model-00001-of-00004.safetensors") || files.len() != 4);
    let total: usize = files
        .iter()
        .map(|f| {
            read_safetensors(&dir.join(f))
                .values()
                .map(|t| t.2.len())
                .sum::<usize>()
        })
        .sum();
    assert_eq!(
        index["metadata"]["total_size"].as_u64().unwrap() as usize,
        total
    );
    let reloaded = load_model(&dir, &device).unwrap();
    assert_eq!(logits(&model, &device), logits(&reloaded, &device));
}

/// A copy of the SFT fixture in a temp dir, to break.
fn broken_copy(name: &str) -> support::TempDir {
    let dir = temp_dir(name);
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("tiny-qwen2-sft").join(f), dir.join(f)).unwrap();
    }
    dir
}

fn edit_config(dir: &std::path::Path, key: &str, value: serde_json::Value) {
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg[key] = value;
    std::fs::write(&path, cfg.to_string()).unwrap();
}

#[test]
fn bad_directories_give_named_errors() {
    let device = Device::flex();

    let dir = temp_dir("empty");
    let err = load_model(&dir, &device).unwrap_err();
    assert!(
        matches!(&err, BackendError::Io { path, .. } if path.ends_with("config.json")),
        "{err}"
    );

    let dir = broken_copy("unknown");
    edit_config(&dir, "model_type", "llama".into());
    let err = load_model(&dir, &device).unwrap_err();
    assert!(
        matches!(&err, BackendError::UnknownModelType { model_type } if model_type == "llama"),
        "{err}"
    );

    let dir = broken_copy("shape");
    edit_config(&dir, "intermediate_size", 300.into());
    let err = load_model(&dir, &device).unwrap_err();
    match &err {
        BackendError::ShapeMismatch {
            name,
            expected,
            found,
        } => {
            assert!(name.contains(".mlp."), "{err}");
            assert!(expected.contains(&300) && found.contains(&352), "{err}");
        }
        other => panic!("expected ShapeMismatch, got {other}"),
    }

    let dir = broken_copy("missing");
    edit_config(&dir, "num_hidden_layers", 5.into());
    edit_config(
        &dir,
        "layer_types",
        serde_json::json!(vec!["full_attention"; 5]),
    );
    let err = load_model(&dir, &device).unwrap_err();
    assert!(
        matches!(&err, BackendError::MissingTensor { name, .. } if name.starts_with("model.layers.4.")),
        "{err}"
    );

    let dir = broken_copy("corrupt");
    std::fs::write(
        dir.join("model.safetensors"),
        b"\x10\0\0\0\0\0\0\0{garbage}",
    )
    .unwrap();
    let err = load_model(&dir, &device).unwrap_err();
    assert!(matches!(&err, BackendError::Safetensors { .. }), "{err}");

    let dir = broken_copy("truncated");
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let err = load_model(&dir, &device).unwrap_err();
    assert!(matches!(&err, BackendError::Safetensors { .. }), "{err}");

    let dir = broken_copy("noweights");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let err = load_model(&dir, &device).unwrap_err();
    assert!(
        matches!(&err, BackendError::Io { path, .. } if path.ends_with("model.safetensors")),
        "{err}"
    );
}

#[test]
fn rope_theta_is_read_from_either_place() {
    let device = Device::flex();
    let model = load_model(fixture("tiny-qwen2"), &device).unwrap();
    let dir = broken_copy("theta");
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("rope_parameters");
    cfg["rope_theta"] = 10000.0.into();
    std::fs::write(&path, cfg.to_string()).unwrap();
    std::fs::copy(
        fixture("tiny-qwen2").join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let old_style = load_model(&dir, &device).unwrap();
    assert_eq!(logits(&model, &device), logits(&old_style, &device));
}

/// `config.json` of the test model as transformers 4.57 writes it, with the `torch_dtype` key of
/// 4.x before 4.56 (hub checkpoints).
const QWEN2_V4: &str = r#"{"attention_dropout": 0.0, "bos_token_id": 2, "eos_token_id": 1, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 256, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "float32", "transformers_version": "4.57.6", "use_cache": true, "use_sliding_window": false, "vocab_size": 97}"#;

/// `config.json` of the test model as transformers 4.57 writes it, with the `torch_dtype` key of
/// 4.x before 4.56 (hub checkpoints).
const QWEN3_V4: &str = r#"{"attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 2, "eos_token_id": 1, "head_dim": 24, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 256, "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "float32", "transformers_version": "4.57.6", "use_cache": true, "use_sliding_window": false, "vocab_size": 97}"#;

/// `config.json` of the test model as transformers 4.57 writes it, with the `torch_dtype` key of
/// 4.x before 4.56 (hub checkpoints).
const QWEN3_MOE_V4: &str = r#"{"attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 2, "decoder_sparse_step": 1, "eos_token_id": 1, "head_dim": 24, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 256, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 32, "norm_topk_prob": true, "num_attention_heads": 4, "num_experts": 6, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2, "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "float32", "transformers_version": "4.57.6", "use_cache": true, "use_sliding_window": false, "vocab_size": 97}"#;

/// `config.json` of the test model as transformers 5.23 writes it.
const QWEN2_V5: &str = r#"{"attention_dropout": 0.0, "bos_token_id": 2, "dtype": "float32", "eos_token_id": 1, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 256, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": null, "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "5.23.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 97}"#;

/// `config.json` of the test model as transformers 5.23 writes it.
const QWEN3_V5: &str = r#"{"attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 2, "dtype": "float32", "eos_token_id": 1, "head_dim": 24, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 256, "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": null, "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "5.23.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 97}"#;

/// `config.json` of the test model as transformers 5.23 writes it.
const QWEN3_MOE_V5: &str = r#"{"attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 2, "decoder_sparse_step": 1, "dtype": "float32", "eos_token_id": 1, "head_dim": 24, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 256, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 32, "norm_topk_prob": true, "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 6, "output_router_logits": false, "pad_token_id": null, "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "5.23.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 97}"#;

/// The random test model the configs above describe: vocab 97, hidden 64, 2 layers, 4 heads /
/// 2 kv heads, RoPE base 1e6, eps 1e-5, untied; Qwen3 head_dim 24; MoE 6 experts, top 2.
fn spelled_model(model_type: &str, device: &Device) -> CausalLm {
    let mut c = HfConfig::new(model_type, 97, 64, 96, 2, 4);
    c.num_key_value_heads = Some(2);
    c.rope_theta = Some(1e6);
    c.rms_norm_eps = 1e-5;
    if model_type != "qwen2" {
        c.head_dim = Some(24);
        c.attention_bias = Some(false);
    }
    if model_type == "qwen3_moe" {
        c.num_experts = Some(6);
        c.num_experts_per_tok = Some(2);
        c.moe_intermediate_size = Some(32);
        c.norm_topk_prob = Some(true);
    }
    CausalLm::init(&c, device).unwrap()
}

fn logits_of(model: &CausalLm, ids: &[u32], device: &Device) -> Vec<f32> {
    let batch = TokenBatch::single(ids, model.vocab_size(), device).unwrap();
    model.forward(&batch).into_data().try_into_vec().unwrap()
}

#[test]
fn configs_written_by_transformers_4_and_5_load_alike_for_every_architecture() {
    let device = Device::flex();
    let ids = [5u32, 17, 3, 96, 40, 41, 8];
    for (arch, v4, v5) in [
        ("qwen2", QWEN2_V4, QWEN2_V5),
        ("qwen3", QWEN3_V4, QWEN3_V5),
        ("qwen3_moe", QWEN3_MOE_V4, QWEN3_MOE_V5),
    ] {
        let model = spelled_model(arch, &device);
        let expected = logits_of(&model, &ids, &device);
        let dir = temp_dir(&format!("spell-{arch}"));
        save_model(&model, &dir, &SaveOptions::default()).unwrap();
        for (version, text) in [("4", v4), ("5", v5)] {
            std::fs::write(dir.join("config.json"), text).unwrap();
            let cfg = HfConfig::from_file(dir.join("config.json"))
                .unwrap_or_else(|e| panic!("{arch} v{version}: {e}"));
            assert_eq!(cfg.rope_theta().unwrap(), 1e6, "{arch} v{version}");
            assert_eq!(cfg.max_position_embeddings, Some(256), "{arch} v{version}");
            if arch == "qwen3_moe" {
                // `num_experts` (4.x, hub) or `num_local_experts` (5.x).
                assert_eq!(cfg.num_experts, Some(6), "{arch} v{version}");
            }
            let loaded =
                load_model(&dir, &device).unwrap_or_else(|e| panic!("{arch} v{version}: {e}"));
            assert_eq!(
                logits_of(&loaded, &ids, &device),
                expected,
                "{arch}: transformers {version}.x config loads another model"
            );
        }
    }
}

#[test]
fn a_transformers_5_moe_config_with_a_wrong_expert_count_is_refused() {
    let device = Device::flex();
    let dir = temp_dir("moe-experts");
    save_model(
        &spelled_model("qwen3_moe", &device),
        &dir,
        &SaveOptions::default(),
    )
    .unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(QWEN3_MOE_V5).unwrap();
    cfg["num_local_experts"] = 8.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    // 8 experts against a checkpoint of 6: the loader reads the 5.x key, so the shapes disagree.
    let err = load_model(&dir, &device).unwrap_err();
    assert!(
        matches!(&err, BackendError::ShapeMismatch { name, .. } | BackendError::MissingTensor { name, .. } if name.contains("mlp")),
        "{err}"
    );
    // Both spellings, disagreeing.
    cfg["num_experts"] = 6.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let err = load_model(&dir, &device).unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidConfigField { field, .. } if field == "num_local_experts"),
        "{err}"
    );
}

#[test]
fn configs_a_model_cannot_run_with_are_refused_by_name() {
    let device = Device::flex();
    let cases: [(&str, serde_json::Value, &str); 6] = [
        ("rms_norm_eps", (-1e-6).into(), "rms_norm_eps"),
        ("num_hidden_layers", 0.into(), "num_hidden_layers"),
        (
            "rope_parameters",
            serde_json::json!({"rope_theta": 0.0, "rope_type": "default"}),
            "rope_parameters.rope_theta",
        ),
        (
            "max_position_embeddings",
            0.into(),
            "max_position_embeddings",
        ),
        (
            "layer_types",
            serde_json::json!(["full_attention", "full_attention"]),
            "layer_types",
        ),
        (
            "rope_parameters",
            serde_json::json!({"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}),
            "rope_parameters.rope_type",
        ),
    ];
    for (key, value, expected_field) in cases {
        let dir = broken_copy("refuse");
        edit_config(&dir, key, value.clone());
        let err = load_model(&dir, &device).unwrap_err();
        match &err {
            BackendError::InvalidConfigField { field, .. } => {
                assert_eq!(field, expected_field, "{key} = {value}: {err}")
            }
            other => panic!("{key} = {value}: expected InvalidConfigField, got {other}"),
        }
    }
}
