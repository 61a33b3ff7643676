#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Exporting a trained model as the HF directory it was loaded from: every file and every
//! `config.json` key of the source survives, only the weights change, and the reloaded model
//! scores exactly as the trained one; LoRA adapters in PEFT's layout.
//!
//! `write_transformers_roundtrip_reference` (ignored) writes the input of
//! `tools/hf_roundtrip.py`, which checks the export against HF transformers.

mod support;

use roll_backend_burn::hf::{HfSource, export_hf_dir, export_peft_adapter, load_model_and_source};
use roll_backend_burn::train::{LoraConfig, Trainer, TrainerConfig};
use roll_backend_burn::{
    BackendError, CausalLm, Device, GenerationConfig, HfConfig, HfTokenizer, SaveDtype,
    SaveOptions, ScoringOptions, TokenBatch, load_model, save_model, score,
};
use roll_core::policy::{Objective, ScoreRequest, ScoreSequence};
use roll_core::{SampleId, TrainBatch, TrainSequence};
use std::collections::BTreeMap;
use std::path::Path;
use support::{fixture, read_safetensors, temp_dir};

const FIXTURE: &str = "tiny-qwen2-sft";

fn dev() -> Device {
    Device::flex()
}

/// Three arithmetic prompts with answers, as the fixture was fine-tuned on.
fn sequences(tok: &HfTokenizer) -> Vec<ScoreSequence> {
    [
        ("Q: 12+35=? A:", " 47"),
        ("Q: 7+8=? A:", " 15"),
        ("What is 20 plus 22? Answer:", " 42"),
    ]
    .iter()
    .map(|(p, r)| ScoreSequence {
        prompt_ids: tok.encode_ids(p).unwrap(),
        response_ids: tok.encode_ids(r).unwrap(),
    })
    .collect()
}

fn logprobs(model: &CausalLm, seqs: &[ScoreSequence]) -> Vec<Vec<f32>> {
    let request = ScoreRequest {
        sequences: seqs.to_vec(),
        with_entropy: false,
        ..Default::default()
    };
    score(model, None, &request, &ScoringOptions::default(), &dev())
        .unwrap()
        .into_iter()
        .map(|s| s.logprobs)
        .collect()
}

/// One optimiser step on `seqs` with positive advantages (so the weights surely move).
fn train_one_step(model: CausalLm, seqs: &[ScoreSequence], lora: Option<LoraConfig>) -> Trainer {
    let old = logprobs(&model, seqs);
    let batch = TrainBatch::new(
        seqs.iter()
            .zip(old)
            .enumerate()
            .map(|(i, (s, old))| TrainSequence {
                sample: SampleId(i as u64),
                prompt_ids: s.prompt_ids.clone(),
                response_ids: s.response_ids.clone(),
                loss_mask: vec![true; s.response_ids.len()],
                advantages: vec![1.0; s.response_ids.len()],
                rollout_logprobs: old.clone(),
                old_logprobs: old,
                ref_logprobs: None,
                returns: None,
                old_values: None,
                weight: 1.0,
                score: 1.0,
            })
            .collect(),
    )
    .unwrap();
    let config = TrainerConfig {
        lr: 1e-3,
        lora,
        ..TrainerConfig::default()
    };
    let mut trainer = Trainer::new(model, config, &dev()).unwrap();
    trainer.step(&batch, &Objective::default()).unwrap();
    assert_eq!(trainer.step_count(), 1);
    trainer
}

/// Top-level files of `dir` by name (what an export must reproduce).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_str().unwrap().to_string(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

#[test]
fn a_trained_model_exports_losslessly_and_reloads_identically() {
    let src = fixture(FIXTURE);
    let (model, source) = load_model_and_source(&src, &dev()).unwrap();
    let tok = HfTokenizer::from_dir(&src).unwrap();
    let seqs = sequences(&tok);
    let before = logprobs(&model, &seqs);
    let trainer = train_one_step(model, &seqs, None);
    let trained = trainer.inference_model().unwrap();
    let trained_logprobs = logprobs(&trained, &seqs);
    assert_ne!(before, trained_logprobs, "the step changed nothing");

    let out = temp_dir("export");
    export_hf_dir(&trained, &source, &out, &SaveOptions::default()).unwrap();

    // Every file of the source: weights changed, everything else byte for byte.
    let (src_files, out_files) = (files(&src), files(&out));
    assert_eq!(
        src_files.keys().collect::<Vec<_>>(),
        out_files.keys().collect::<Vec<_>>(),
        "the export has other files than the source"
    );
    for (name, bytes) in &src_files {
        if name == "model.safetensors" {
            let (a, b) = (
                read_safetensors(&src.join(name)),
                read_safetensors(&out.join(name)),
            );
            assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
            assert_ne!(a, b, "the exported weights are the untrained ones");
        } else {
            assert!(
                out_files[name] == *bytes,
                "`{name}` differs from the source"
            );
        }
    }
    // config.json: every key and value, including the ones `save_model` used to drop.
    let (a, b) = (
        json(&src_files["config.json"]),
        json(&out_files["config.json"]),
    );
    assert_eq!(a, b);
    for key in [
        "max_position_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "layer_types",
        "sliding_window",
        "initializer_range",
        "use_cache",
        "rope_parameters",
        "transformers_version",
    ] {
        assert!(b.get(key).is_some(), "`{key}` was dropped");
    }

    // The exported weights are the trained model's own.
    let plain = temp_dir("export-plain");
    save_model(&trained, &plain, &SaveOptions::default()).unwrap();
    assert_eq!(
        read_safetensors(&plain.join("model.safetensors")),
        read_safetensors(&out.join("model.safetensors"))
    );

    // Reloaded with roll: same config, same EOS, same log-probs to the bit.
    let reloaded = load_model(&out, &dev()).unwrap();
    assert_eq!(logprobs(&reloaded, &seqs), trained_logprobs);
    assert_eq!(
        HfConfig::from_file(out.join("config.json")).unwrap(),
        *source.config()
    );
    assert_eq!(
        GenerationConfig::from_dir(&out).unwrap(),
        GenerationConfig::from_dir(&src).unwrap()
    );
    let out_tok = HfTokenizer::from_dir(&out).unwrap();
    assert_eq!(out_tok.eos_token_ids(), tok.eos_token_ids());
    assert_eq!(out_tok.pad_token_id(), tok.pad_token_id());
    assert_eq!(
        out_tok.encode_ids("Q: 3+4=? A: 7").unwrap(),
        tok.encode_ids("Q: 3+4=? A: 7").unwrap()
    );
}

#[test]
fn a_bf16_export_changes_the_dtype_key_and_nothing_else() {
    let src = fixture(FIXTURE);
    let (model, source) = load_model_and_source(&src, &dev()).unwrap();
    let out = temp_dir("export-bf16");
    let bf16 = SaveOptions::default().with_dtype(SaveDtype::Bf16);
    export_hf_dir(&model, &source, &out, &bf16).unwrap();
    let mut expected = json(source.config_bytes());
    expected["dtype"] = "bfloat16".into();
    assert_eq!(
        json(&std::fs::read(out.join("config.json")).unwrap()),
        expected
    );
    let weights = read_safetensors(&out.join("model.safetensors"));
    assert!(weights.values().all(|(dtype, _, _)| dtype == "BF16"));
    // The 4.x spelling is kept as it is spelled.
    let v4 = temp_dir("export-v4-src");
    for (name, bytes) in files(&src) {
        std::fs::write(v4.join(&name), bytes).unwrap();
    }
    let mut cfg = json(source.config_bytes());
    let o = cfg.as_object_mut().unwrap();
    o.remove("dtype");
    o.insert("torch_dtype".into(), "float32".into());
    std::fs::write(v4.join("config.json"), cfg.to_string()).unwrap();
    let source4 = HfSource::open(&v4).unwrap();
    let out4 = temp_dir("export-v4");
    export_hf_dir(&model, &source4, &out4, &bf16).unwrap();
    cfg["torch_dtype"] = "bfloat16".into();
    assert_eq!(json(&std::fs::read(out4.join("config.json")).unwrap()), cfg);
}

#[test]
fn exports_that_would_mislabel_or_overwrite_are_refused() {
    let src = fixture(FIXTURE);
    let source = HfSource::open(&src).unwrap();
    // A model of another size under this config.
    let mut other = source.config().clone();
    other.intermediate_size = 64;
    let small = CausalLm::init(&other, &dev()).unwrap();
    let out = temp_dir("export-mismatch");
    let err = export_hf_dir(&small, &source, &out, &SaveOptions::default()).unwrap_err();
    assert!(
        matches!(&err, BackendError::ExportMismatch { field, model, source_value }
            if field == "intermediate_size" && model == "64" && source_value == "352"),
        "{err}"
    );
    assert!(
        !out.join("model.safetensors").exists(),
        "wrote before failing"
    );
    // Into the directory it was loaded from (a copy, to keep the fixture safe if this broke).
    let copy = temp_dir("export-self");
    for (name, bytes) in files(&src) {
        std::fs::write(copy.join(&name), bytes).unwrap();
    }
    let (model, source) = load_model_and_source(&copy, &dev()).unwrap();
    let err = export_hf_dir(&model, &source, &copy, &SaveOptions::default()).unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidInput(m) if m.contains("loaded from")),
        "{err}"
    );
}

#[test]
fn the_source_keeps_tokenizer_files_and_skips_weights_of_every_format() {
    let dir = temp_dir("source-files");
    for (name, bytes) in files(&fixture(FIXTURE)) {
        std::fs::write(dir.join(&name), bytes).unwrap();
    }
    for name in ["vocab.json", "merges.txt", "chat_template.jinja", "LICENSE"] {
        std::fs::write(dir.join(name), format!("{name} content")).unwrap();
    }
    for name in [
        "pytorch_model.bin",
        "model.safetensors.index.json",
        ".gitattributes",
    ] {
        std::fs::write(dir.join(name), "stale").unwrap();
    }
    std::fs::create_dir(dir.join("original")).unwrap();
    let source = HfSource::open(&dir).unwrap();
    let names: Vec<&str> = source.files().keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "LICENSE",
            "chat_template.jinja",
            "generation_config.json",
            "merges.txt",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.json"
        ]
    );
    assert_eq!(source.files()["merges.txt"], b"merges.txt content");
    // A generation config whose eos is not a token of the model.
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [0, 600]}"#,
    )
    .unwrap();
    let err = HfSource::open(&dir).unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidConfigField { field, value, .. }
            if field == "generation_config.eos_token_id" && value == "600"),
        "{err}"
    );
}

/// `(name → (shape, f32 values))` of an f32 safetensors file.
fn f32_tensors(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    read_safetensors(path)
        .into_iter()
        .map(|(name, (dtype, shape, bytes))| {
            assert_eq!(dtype, "F32", "{name}");
            let v = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (name, (shape, v))
        })
        .collect()
}

#[test]
fn lora_adapters_export_in_peft_layout_and_rebuild_the_merged_weights() {
    let src = fixture(FIXTURE);
    let model = load_model(&src, &dev()).unwrap();
    let seqs = sequences(&HfTokenizer::from_dir(&src).unwrap());
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        target_modules: vec!["q_proj".into(), "down_proj".into()],
    };
    let trainer = train_one_step(model, &seqs, Some(lora.clone()));
    let out = temp_dir("peft");
    let n = export_peft_adapter(
        trainer.training_model().unwrap(),
        &lora,
        Some("tiny-qwen2-sft"),
        &out,
        SaveDtype::F32,
    )
    .unwrap();
    assert_eq!(n, 8, "4 layers × (q_proj, down_proj)");

    let config = json(&std::fs::read(out.join("adapter_config.json")).unwrap());
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["task_type"], "CAUSAL_LM");
    assert_eq!(config["r"], 4);
    assert_eq!(config["lora_alpha"], 8.0);
    assert_eq!(
        config["target_modules"],
        serde_json::json!(["q_proj", "down_proj"])
    );
    assert_eq!(config["base_model_name_or_path"], "tiny-qwen2-sft");

    let adapter = f32_tensors(&out.join("adapter_model.safetensors"));
    assert_eq!(adapter.len(), 16);
    let (a_shape, _) = &adapter["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"];
    let (b_shape, _) = &adapter["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"];
    assert_eq!(
        (a_shape.as_slice(), b_shape.as_slice()),
        (&[4, 128][..], &[128, 4][..])
    );
    let (a_shape, _) = &adapter["base_model.model.model.layers.3.mlp.down_proj.lora_A.weight"];
    let (b_shape, _) = &adapter["base_model.model.model.layers.3.mlp.down_proj.lora_B.weight"];
    assert_eq!(
        (a_shape.as_slice(), b_shape.as_slice()),
        (&[4, 352][..], &[128, 4][..])
    );

    // PEFT's merge, W + (alpha / r)·B·A in HF layout, equals roll's merged model.
    let merged_dir = temp_dir("peft-merged");
    save_model(
        &trainer.merged_model().unwrap(),
        &merged_dir,
        &SaveOptions::default(),
    )
    .unwrap();
    let merged = f32_tensors(&merged_dir.join("model.safetensors"));
    let base = f32_tensors(&src.join("model.safetensors"));
    let scale = lora.alpha as f32 / lora.rank as f32;
    let mut moved = 0.0f32;
    for layer in 0..4 {
        for linear in ["self_attn.q_proj", "mlp.down_proj"] {
            let stem = format!("model.layers.{layer}.{linear}");
            let (shape, w) = &base[&format!("{stem}.weight")];
            let (_, a) = &adapter[&format!("base_model.model.{stem}.lora_A.weight")];
            let (_, b) = &adapter[&format!("base_model.model.{stem}.lora_B.weight")];
            let (rows, cols, r) = (shape[0], shape[1], lora.rank);
            let (_, expected) = &merged[&format!("{stem}.weight")];
            for i in 0..rows {
                for j in 0..cols {
                    let delta: f32 = (0..r).map(|k| b[i * r + k] * a[k * cols + j]).sum();
                    let peft = w[i * cols + j] + scale * delta;
                    let d = (peft - expected[i * cols + j]).abs();
                    assert!(
                        d < 1e-5,
                        "{stem}[{i},{j}]: PEFT {peft} vs roll {}",
                        expected[i * cols + j]
                    );
                    moved = moved.max((scale * delta).abs());
                }
            }
        }
    }
    assert!(
        moved > 1e-5,
        "the adapters are still zero: the test checks nothing"
    );

    // A model without adapters has nothing to export.
    let err = export_peft_adapter(
        &trainer.merged_model().unwrap(),
        &lora,
        None,
        temp_dir("peft-none"),
        SaveDtype::F32,
    )
    .unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidInput(m) if m.contains("no LoRA")),
        "{err}"
    );
}

/// Greedy continuation of `prompt` (argmax of the last position's logits, `n` tokens).
fn greedy(model: &CausalLm, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut ids = prompt.to_vec();
    for _ in 0..n {
        let batch = TokenBatch::single(&ids, model.vocab_size(), &dev()).unwrap();
        let logits: Vec<f32> = model.forward(&batch).into_data().try_into_vec().unwrap();
        let vocab = model.vocab_size();
        let last = &logits[logits.len() - vocab..];
        let (best, _) = last
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |acc, (i, &x)| if x > acc.1 { (i, x) } else { acc },
            );
        ids.push(best as u32);
    }
    ids[prompt.len()..].to_vec()
}

/// Writes the input of `tools/hf_roundtrip.py` into `$ROLL_HF_ROUNDTRIP_DIR` (default
/// `target/hf_roundtrip`): `model/`, the fixture after one train step exported with
/// [`export_hf_dir`], and `reference.json` with, per prompt, its text, token ids, roll's
/// per-token log-probs (`token_logprobs[t] = log p(ids[t+1] | ids[..=t])`) and 12 greedy tokens;
/// and `adapter/`, LoRA adapters after one step in PEFT's layout ([`export_peft_adapter`]), with
/// `lora.cases`, roll's log-probs of the adapted policy, for PEFT to reproduce on the base.
///
/// `cargo test -p roll-backend-burn --test hf_export_tests -- --ignored write_transformers`
#[test]
#[ignore = "writes files for tools/hf_roundtrip.py"]
fn write_transformers_roundtrip_reference() {
    let out = std::env::var_os("ROLL_HF_ROUNDTRIP_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/hf_roundtrip"));
    let src = fixture(FIXTURE);
    let (model, source) = load_model_and_source(&src, &dev()).unwrap();
    let tok = HfTokenizer::from_dir(&src).unwrap();
    let trained = train_one_step(model, &sequences(&tok), None)
        .inference_model()
        .unwrap();
    let model_dir = out.join("model");
    let _ = std::fs::remove_dir_all(&model_dir);
    export_hf_dir(&trained, &source, &model_dir, &SaveOptions::default()).unwrap();
    let prompts = [
        "Q: 12+35=? A: 47",
        "Q: 9+9=? A:",
        "What is 31 plus 4? Answer: 35",
        "<|im_start|>user\nQ: 2+2=?<|im_end|>\n<|im_start|>assistant\n",
    ];
    let cases: Vec<serde_json::Value> = prompts
        .iter()
        .map(|text| {
            let ids = tok.encode_ids(text).unwrap();
            let seq = ScoreSequence {
                prompt_ids: ids[..1].to_vec(),
                response_ids: ids[1..].to_vec(),
            };
            let lp = logprobs(&trained, &[seq]).remove(0);
            serde_json::json!({
                "prompt": text,
                "input_ids": ids,
                "token_logprobs": lp,
                "greedy_tokens": greedy(&trained, &ids, 12),
            })
        })
        .collect();
    // LoRA: one step on the base, adapters in PEFT's layout, roll's log-probs of the adapted
    // policy (adapters merged) for PEFT to reproduce on top of the untouched base.
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
    };
    let base = load_model(&src, &dev()).unwrap();
    let lora_trainer = train_one_step(base, &sequences(&tok), Some(lora.clone()));
    let adapter_dir = out.join("adapter");
    let _ = std::fs::remove_dir_all(&adapter_dir);
    export_peft_adapter(
        lora_trainer.training_model().unwrap(),
        &lora,
        src.canonicalize().unwrap().to_str(),
        &adapter_dir,
        SaveDtype::F32,
    )
    .unwrap();
    let merged = lora_trainer.merged_model().unwrap();
    let lora_cases: Vec<serde_json::Value> = prompts
        .iter()
        .map(|text| {
            let ids = tok.encode_ids(text).unwrap();
            let seq = ScoreSequence {
                prompt_ids: ids[..1].to_vec(),
                response_ids: ids[1..].to_vec(),
            };
            serde_json::json!({
                "input_ids": ids,
                "token_logprobs": logprobs(&merged, &[seq]).remove(0),
            })
        })
        .collect();
    let reference = serde_json::json!({
        "model_dir": "model",
        "cases": cases,
        "lora": {
            "base_dir": src.canonicalize().unwrap(),
            "adapter_dir": "adapter",
            "cases": lora_cases,
        },
    });
    std::fs::write(
        out.join("reference.json"),
        serde_json::to_string_pretty(&reference).unwrap(),
    )
    .unwrap();
    println!("wrote {}", out.display());
}
