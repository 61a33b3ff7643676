//! [`export_hf_dir`]: a trained model written back as the HuggingFace directory it was loaded
//! from, with new weights and nothing else changed.

use super::config::HfConfig;
use super::save::{SaveDtype, SaveOptions, save_model_weights, write_json};
use super::source::HfSource;
use crate::models::CausalLm;
use crate::{BackendError, Result};
use std::path::Path;

/// Writes `model` to `out_dir` as a HF directory that transformers and roll load as the trained
/// model: the weights (as [`super::save_weights`], in `options.dtype`, sharded above
/// `options.max_shard_bytes`), the source's `config.json` with every key kept, and every other
/// file of the source (tokenizer files, chat templates, `generation_config.json`, ...), byte for
/// byte — so a reloaded model has the same EOS ids and chat template, and generates and stops
/// as the trained one.
///
/// The only `config.json` change is the one saving legitimately makes: `dtype` (and
/// `torch_dtype`, where the file spells it so) becomes `options.dtype`; a config without either
/// key gets `dtype` only when the weights are not float32 (what transformers assumes without
/// it). An unchanged config is written with its original bytes.
///
/// Files already in `out_dir` that the export does not write are left alone.
///
/// # Errors
/// [`BackendError::ExportMismatch`] if the model's architecture (sizes, heads, RoPE base, norm
/// epsilon, tied embeddings, MoE layout) differs from the source config — the config would
/// describe other weights; [`BackendError::InvalidInput`] if `out_dir` is the source directory
/// (the export would overwrite the base model it reads from); [`BackendError::Io`] /
/// [`BackendError::Save`] naming a file that could not be written.
pub fn export_hf_dir(
    model: &CausalLm,
    source: &HfSource,
    out_dir: impl AsRef<Path>,
    options: &SaveOptions,
) -> Result<()> {
    let out_dir = out_dir.as_ref();
    check_same_architecture(&model.hf_config(), source.config())?;
    if let (Ok(a), Ok(b)) = (out_dir.canonicalize(), source.dir().canonicalize())
        && a == b
    {
        return Err(BackendError::InvalidInput(format!(
            "export directory `{}` is the directory the model was loaded from; export to a new \
             directory",
            out_dir.display()
        )));
    }
    std::fs::create_dir_all(out_dir).map_err(|e| BackendError::io(out_dir, e))?;
    for (name, bytes) in source.files() {
        let path = out_dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| BackendError::io(&path, e))?;
    }
    save_model_weights(model, out_dir, options)?;
    // config.json last: a directory with a config is a complete one.
    let config = exported_config(source.raw_config(), options.dtype);
    let path = out_dir.join("config.json");
    if &config == source.raw_config() {
        std::fs::write(&path, source.config_bytes()).map_err(|e| BackendError::io(&path, e))
    } else {
        write_json(&path, &config)
    }
}

/// `raw` with its dtype key(s) set to `dtype` (see [`export_hf_dir`]).
pub(crate) fn exported_config(
    raw: &serde_json::Map<String, serde_json::Value>,
    dtype: SaveDtype,
) -> serde_json::Map<String, serde_json::Value> {
    let mut config = raw.clone();
    let mut spelled = false;
    for key in ["dtype", "torch_dtype"] {
        if let Some(v) = config.get_mut(key) {
            *v = dtype.hf_name().into();
            spelled = true;
        }
    }
    if !spelled && dtype != SaveDtype::F32 {
        config.insert("dtype".into(), dtype.hf_name().into());
    }
    config
}

/// Fails unless `model` (a model's own [`HfConfig`]) describes the same network as `source`.
fn check_same_architecture(model: &HfConfig, source: &HfConfig) -> Result<()> {
    let theta = |c: &HfConfig| c.rope_theta().map(|t| t.to_string()).unwrap_or_default();
    let moe = |c: &HfConfig| {
        format!(
            "{:?}/{:?}/{:?}/{}/{}/{:?}/{}",
            c.num_experts,
            c.num_experts_per_tok,
            c.moe_intermediate_size,
            c.norm_topk_prob.unwrap_or(false),
            c.decoder_sparse_step.unwrap_or(1),
            c.mlp_only_layers.clone().unwrap_or_default(),
            c.shared_expert_intermediate_size.unwrap_or(0),
        )
    };
    let is_moe = source.model_type == "qwen3_moe";
    let fields: [(&str, String, String, bool); 12] = [
        (
            "model_type",
            model.model_type.clone(),
            source.model_type.clone(),
            true,
        ),
        (
            "vocab_size",
            model.vocab_size.to_string(),
            source.vocab_size.to_string(),
            true,
        ),
        (
            "hidden_size",
            model.hidden_size.to_string(),
            source.hidden_size.to_string(),
            true,
        ),
        (
            "intermediate_size",
            model.intermediate_size.to_string(),
            source.intermediate_size.to_string(),
            true,
        ),
        (
            "num_hidden_layers",
            model.num_hidden_layers.to_string(),
            source.num_hidden_layers.to_string(),
            true,
        ),
        (
            "num_attention_heads",
            model.num_attention_heads.to_string(),
            source.num_attention_heads.to_string(),
            true,
        ),
        (
            "num_key_value_heads",
            model.kv_heads().to_string(),
            source.kv_heads().to_string(),
            true,
        ),
        (
            "head_dim",
            model.head_dim().to_string(),
            source.head_dim().to_string(),
            true,
        ),
        (
            "rms_norm_eps",
            model.rms_norm_eps.to_string(),
            source.rms_norm_eps.to_string(),
            true,
        ),
        ("rope_theta", theta(model), theta(source), true),
        (
            "tie_word_embeddings",
            model.tie_word_embeddings.to_string(),
            source.tie_word_embeddings.to_string(),
            true,
        ),
        (
            "num_experts/num_experts_per_tok/moe_intermediate_size/norm_topk_prob/\
             decoder_sparse_step/mlp_only_layers/shared_expert_intermediate_size",
            moe(model),
            moe(source),
            is_moe,
        ),
    ];
    for (field, m, s, applies) in fields {
        if applies && m != s {
            return Err(BackendError::ExportMismatch {
                field: field.to_string(),
                model: m,
                source_value: s,
            });
        }
    }
    // Qwen2 always has q/k/v bias; Qwen3 and Qwen3-MoE switch it with `attention_bias`.
    if source.model_type != "qwen2"
        && model.attention_bias.unwrap_or(false) != source.attention_bias.unwrap_or(false)
    {
        return Err(BackendError::ExportMismatch {
            field: "attention_bias".into(),
            model: model.attention_bias.unwrap_or(false).to_string(),
            source_value: source.attention_bias.unwrap_or(false).to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn only_the_dtype_keys_change() {
        let raw = map(json!({"torch_dtype": "bfloat16", "x": 1, "eos_token_id": [1, 2]}));
        let f32 = exported_config(&raw, SaveDtype::F32);
        assert_eq!(
            f32,
            map(json!({"torch_dtype": "float32", "x": 1, "eos_token_id": [1, 2]}))
        );
        let both = map(json!({"torch_dtype": "float32", "dtype": "float32"}));
        assert_eq!(
            exported_config(&both, SaveDtype::Bf16),
            map(json!({"torch_dtype": "bfloat16", "dtype": "bfloat16"}))
        );
        let none = map(json!({"x": null}));
        assert_eq!(exported_config(&none, SaveDtype::F32), none);
        assert_eq!(
            exported_config(&none, SaveDtype::F16),
            map(json!({"x": null, "dtype": "float16"}))
        );
    }

    #[test]
    fn an_architecture_difference_is_named() {
        let mut a = HfConfig::new("qwen2", 64, 32, 48, 2, 4);
        a.num_key_value_heads = Some(2);
        let mut b = a.clone();
        check_same_architecture(&a, &b).unwrap();
        // Spelling differences that describe the same model are not differences.
        b.rope_parameters = Some(crate::hf::RopeParameters {
            rope_theta: Some(10_000.0),
            rope_type: Some("default".into()),
            extra: Default::default(),
        });
        check_same_architecture(&a, &b).unwrap();
        b.num_key_value_heads = Some(4);
        match check_same_architecture(&a, &b).unwrap_err() {
            BackendError::ExportMismatch {
                field,
                model,
                source_value,
            } => {
                assert_eq!(field, "num_key_value_heads");
                assert_eq!((model.as_str(), source_value.as_str()), ("2", "4"));
            }
            other => panic!("{other}"),
        }
    }
}
