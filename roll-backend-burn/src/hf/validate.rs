//! Field-by-field validation of a parsed `config.json` against what the Qwen architectures
//! implemented here can run.
//!
//! A config that parses is not yet one a model can be built from: a negative `rms_norm_eps`
//! panics inside Burn, `rope_theta = 0` turns every log-prob into NaN, zero layers or a
//! `max_position_embeddings` of 0 describe no model, and a sliding-window or scaled-RoPE config
//! would load but compute something other than transformers does. Each check below names the
//! field, the value found and what is allowed ([`BackendError::InvalidConfigField`]).

use super::config::HfConfig;
use crate::{BackendError, Result};

/// Activation names transformers maps to SiLU (`ACT2FN`), the MLP's gate activation here.
const SILU_NAMES: [&str; 2] = ["silu", "swish"];

fn invalid(field: &str, value: impl std::fmt::Display, allowed: impl Into<String>) -> BackendError {
    BackendError::InvalidConfigField {
        field: field.to_string(),
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

/// `value >= 1`.
fn positive(field: &str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(invalid(field, 0, "at least 1"));
    }
    Ok(())
}

impl HfConfig {
    /// Checks every field the model uses against what the architecture needs.
    ///
    /// Keys the file may omit are checked at the value the model will use (e.g. the RoPE base
    /// from either spelling, `num_key_value_heads` defaulting to the query heads).
    ///
    /// # Errors
    /// [`BackendError::UnknownModelType`] for an architecture other than `qwen2`, `qwen3`,
    /// `qwen3_moe`; [`BackendError::InvalidConfigField`] for the first field out of range.
    pub fn validate(&self) -> Result<()> {
        let arch = self.model_type.as_str();
        if !["qwen2", "qwen3", "qwen3_moe"].contains(&arch) {
            return Err(BackendError::UnknownModelType {
                model_type: self.model_type.clone(),
            });
        }
        positive("vocab_size", self.vocab_size)?;
        positive("hidden_size", self.hidden_size)?;
        positive("num_hidden_layers", self.num_hidden_layers)?;
        self.validate_heads()?;
        if self.has_dense_layer() {
            positive("intermediate_size", self.intermediate_size)?;
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(
                "rms_norm_eps",
                self.rms_norm_eps,
                "a positive finite number (Qwen uses 1e-6)",
            ));
        }
        self.validate_rope()?;
        if let Some(n) = self.max_position_embeddings {
            positive("max_position_embeddings", n)?;
        }
        if let Some(act) = self.extra.get("hidden_act")
            && !act.as_str().is_some_and(|a| SILU_NAMES.contains(&a))
        {
            return Err(invalid(
                "hidden_act",
                act,
                "\"silu\" (the SwiGLU gate implemented here)",
            ));
        }
        self.validate_attention_kinds()?;
        if arch == "qwen3_moe" {
            self.validate_moe()?;
        }
        self.validate_token_ids()
    }

    fn validate_heads(&self) -> Result<()> {
        positive("num_attention_heads", self.num_attention_heads)?;
        let kv = self.kv_heads();
        positive("num_key_value_heads", kv)?;
        if !self.num_attention_heads.is_multiple_of(kv) {
            return Err(invalid(
                "num_key_value_heads",
                kv,
                format!(
                    "a divisor of num_attention_heads ({}): each key/value head serves a whole \
                     group of query heads",
                    self.num_attention_heads
                ),
            ));
        }
        let head_dim = self.head_dim();
        positive("head_dim", head_dim)?;
        if !head_dim.is_multiple_of(2) {
            return Err(invalid(
                "head_dim",
                head_dim,
                "even (RoPE rotates pairs of dimensions)",
            ));
        }
        // Qwen2 has no free head width: q/k/v project hidden_size onto heads × hidden/heads.
        if self.model_type == "qwen2" && head_dim * self.num_attention_heads != self.hidden_size {
            let (field, value) = match self.head_dim {
                Some(h) => ("head_dim", h),
                None => ("num_attention_heads", self.num_attention_heads),
            };
            return Err(invalid(
                field,
                value,
                format!(
                    "such that head_dim × num_attention_heads = hidden_size ({}) for qwen2",
                    self.hidden_size
                ),
            ));
        }
        Ok(())
    }

    fn validate_rope(&self) -> Result<()> {
        let field = if self.rope_scaling.is_some() {
            "rope_scaling"
        } else {
            "rope_parameters"
        };
        if let Some(p) = self.rope_params() {
            // transformers 5 nests one dict per layer type for models that mix RoPE kinds.
            if let Some((key, _)) = p.extra.iter().find(|(_, v)| v.is_object()) {
                return Err(invalid(
                    &format!("{field}.{key}"),
                    &p.extra[key],
                    "absent: per-layer-type RoPE parameters are not implemented",
                ));
            }
            if let Some(f) = p.extra.get("partial_rotary_factor")
                && f.as_f64() != Some(1.0)
            {
                return Err(invalid(
                    &format!("{field}.partial_rotary_factor"),
                    f,
                    "1.0 (partial RoPE is not implemented)",
                ));
            }
        }
        if let Some(f) = self.extra.get("partial_rotary_factor")
            && f.as_f64() != Some(1.0)
        {
            return Err(invalid(
                "partial_rotary_factor",
                f,
                "1.0 (partial RoPE is not implemented)",
            ));
        }
        let theta = self.rope_theta()?;
        if !(theta.is_finite() && theta > 0.0) {
            let field = if self.rope_params().and_then(|p| p.rope_theta).is_some() {
                format!("{field}.rope_theta")
            } else {
                "rope_theta".to_string()
            };
            return Err(invalid(
                &field,
                theta,
                "a positive finite RoPE base (Qwen uses 10000 to 1000000)",
            ));
        }
        Ok(())
    }

    /// `layer_types` and the sliding-window keys: every layer must attend to the full causal
    /// context, since sliding-window attention is not implemented.
    fn validate_attention_kinds(&self) -> Result<()> {
        let layers = self.num_hidden_layers;
        let window = match (self.use_sliding_window, self.sliding_window) {
            (Some(true), Some(w)) => {
                positive("sliding_window", w)?;
                Some(w)
            }
            // transformers sets `sliding_window = None` unless `use_sliding_window`.
            _ => None,
        };
        if let Some(types) = &self.layer_types {
            if types.len() != layers {
                return Err(invalid(
                    "layer_types",
                    format!("a list of {} entries", types.len()),
                    format!("one entry per layer (num_hidden_layers = {layers})"),
                ));
            }
            for (i, t) in types.iter().enumerate() {
                match t.as_str() {
                    // "attention" is the legacy name transformers 5 remaps to full attention.
                    "full_attention" | "attention" => {}
                    "sliding_attention" if window.is_none() => {}
                    "sliding_attention" => {
                        return Err(invalid(
                            &format!("layer_types[{i}]"),
                            "\"sliding_attention\"",
                            "\"full_attention\" (sliding-window attention is not implemented; \
                             use_sliding_window is true)",
                        ));
                    }
                    other => {
                        return Err(invalid(
                            &format!("layer_types[{i}]"),
                            format!("\"{other}\""),
                            "\"full_attention\"",
                        ));
                    }
                }
            }
            return Ok(());
        }
        if let Some(w) = window {
            // Qwen3-MoE applies the window to every layer; Qwen2/Qwen3 from max_window_layers on.
            let first_sliding = match self.model_type.as_str() {
                "qwen3_moe" => 0,
                _ => self.max_window_layers.unwrap_or(28),
            };
            if first_sliding < layers {
                return Err(invalid(
                    "use_sliding_window",
                    "true",
                    format!(
                        "false: sliding-window attention (window {w}, layers {first_sliding}..\
                         {layers}) is not implemented"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_moe(&self) -> Result<()> {
        let layers = self.num_hidden_layers;
        let experts = self.num_experts.unwrap_or(0);
        positive("num_experts", experts)?;
        let top_k = self.num_experts_per_tok.unwrap_or(0);
        if top_k == 0 || top_k > experts {
            return Err(invalid(
                "num_experts_per_tok",
                top_k,
                format!("between 1 and num_experts ({experts})"),
            ));
        }
        positive(
            "moe_intermediate_size",
            self.moe_intermediate_size.unwrap_or(0),
        )?;
        if let Some(step) = self.decoder_sparse_step {
            positive("decoder_sparse_step", step)?;
        }
        if let Some(bad) = self
            .mlp_only_layers
            .iter()
            .flatten()
            .find(|&&l| l >= layers)
        {
            return Err(invalid(
                "mlp_only_layers",
                format!("an entry {bad}"),
                format!("layer indices below num_hidden_layers ({layers})"),
            ));
        }
        Ok(())
    }

    /// Whether any layer has a dense MLP (all of them but Qwen3-MoE's sparse ones).
    fn has_dense_layer(&self) -> bool {
        if self.model_type != "qwen3_moe" {
            return true;
        }
        let step = self.decoder_sparse_step.unwrap_or(1).max(1);
        let dense_only = self.mlp_only_layers.as_deref().unwrap_or(&[]);
        // transformers: layer i is sparse iff i ∉ mlp_only_layers and (i + 1) % step == 0.
        (0..self.num_hidden_layers)
            .any(|i| dense_only.contains(&i) || !(i + 1).is_multiple_of(step))
    }

    /// `bos_token_id`, `eos_token_id` (one id or a list) and `pad_token_id`, where given, must
    /// be token ids of the vocabulary: generation stops on them and padding embeds them.
    fn validate_token_ids(&self) -> Result<()> {
        for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
            let ids: Vec<&serde_json::Value> = match self.extra.get(key) {
                None | Some(serde_json::Value::Null) => continue,
                Some(serde_json::Value::Array(xs)) => xs.iter().collect(),
                Some(x) => vec![x],
            };
            for id in ids {
                if id.as_u64().is_none_or(|n| n >= self.vocab_size as u64) {
                    return Err(invalid(
                        key,
                        id,
                        format!("a token id below vocab_size ({})", self.vocab_size),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A valid Qwen2 config as transformers 5 writes it.
    fn qwen2() -> serde_json::Value {
        json!({
            "model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 128, "hidden_act": "silu",
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "layer_types": ["full_attention", "full_attention"], "use_sliding_window": false,
            "sliding_window": null, "max_window_layers": 28, "eos_token_id": 3
        })
    }

    fn with(mut v: serde_json::Value, key: &str, x: serde_json::Value) -> serde_json::Value {
        v[key] = x;
        v
    }

    /// The field named by the error of parsing `v`.
    fn bad_field(v: serde_json::Value) -> String {
        match HfConfig::from_json(v) {
            Err(BackendError::InvalidConfigField { field, .. }) => field,
            other => panic!("expected InvalidConfigField, got {other:?}"),
        }
    }

    #[test]
    fn a_valid_config_passes() {
        HfConfig::from_json(qwen2()).unwrap();
    }

    #[test]
    fn each_out_of_range_field_is_named() {
        let cases = [
            ("vocab_size", json!(0)),
            ("hidden_size", json!(0)),
            ("num_hidden_layers", json!(0)),
            ("num_attention_heads", json!(0)),
            ("num_key_value_heads", json!(3)),
            ("num_key_value_heads", json!(0)),
            ("intermediate_size", json!(0)),
            ("rms_norm_eps", json!(-1e-6)),
            ("rms_norm_eps", json!(0.0)),
            ("max_position_embeddings", json!(0)),
            ("hidden_act", json!("gelu")),
            ("eos_token_id", json!(64)),
            ("eos_token_id", json!([2, 99])),
            ("pad_token_id", json!(1000)),
        ];
        for (key, value) in cases {
            let err = HfConfig::from_json(with(qwen2(), key, value.clone())).unwrap_err();
            match &err {
                BackendError::InvalidConfigField { field, .. } => {
                    assert_eq!(field, key, "{key} = {value}: {err}")
                }
                other => panic!("{key} = {value}: expected InvalidConfigField, got {other}"),
            }
        }
    }

    #[test]
    fn the_message_names_field_value_and_what_is_allowed() {
        let err = HfConfig::from_json(with(qwen2(), "rms_norm_eps", json!(-0.5))).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("rms_norm_eps"), "{msg}");
        assert!(msg.contains("-0.5"), "{msg}");
        assert!(msg.contains("positive"), "{msg}");
    }

    #[test]
    fn qwen2_head_arithmetic_and_odd_head_dim() {
        // 32 / 4 = 8 per head; an explicit head_dim of 16 cannot be Qwen2.
        assert_eq!(bad_field(with(qwen2(), "head_dim", json!(16))), "head_dim");
        // hidden 34 with 4 heads: no integral head width.
        assert_eq!(
            bad_field(with(qwen2(), "hidden_size", json!(34))),
            "num_attention_heads"
        );
        let mut q3 = with(qwen2(), "model_type", json!("qwen3"));
        q3["head_dim"] = json!(7);
        assert_eq!(bad_field(q3), "head_dim");
    }

    #[test]
    fn rope_base_zero_negative_or_scaled_is_refused() {
        let v = with(
            qwen2(),
            "rope_parameters",
            json!({"rope_theta": 0.0, "rope_type": "default"}),
        );
        assert_eq!(bad_field(v), "rope_parameters.rope_theta");
        let mut v4 = qwen2();
        v4.as_object_mut().unwrap().remove("rope_parameters");
        v4["rope_theta"] = json!(-10.0);
        assert_eq!(bad_field(v4.clone()), "rope_theta");
        v4["rope_theta"] = json!(1e6);
        v4["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        assert_eq!(bad_field(v4.clone()), "rope_scaling.rope_type");
        v4["rope_scaling"] = serde_json::Value::Null;
        assert_eq!(HfConfig::from_json(v4).unwrap().rope_theta().unwrap(), 1e6);
        let v = with(
            qwen2(),
            "rope_parameters",
            json!({"rope_theta": 1e4, "rope_type": "default", "partial_rotary_factor": 0.5}),
        );
        assert_eq!(bad_field(v), "rope_parameters.partial_rotary_factor");
        let v = with(
            qwen2(),
            "rope_parameters",
            json!({"full_attention": {"rope_theta": 1e4, "rope_type": "default"}}),
        );
        assert_eq!(bad_field(v), "rope_parameters.full_attention");
    }

    #[test]
    fn layer_types_must_cover_every_layer_with_full_attention() {
        let short = with(qwen2(), "layer_types", json!(["full_attention"]));
        assert_eq!(bad_field(short), "layer_types");
        let odd = with(
            qwen2(),
            "layer_types",
            json!(["full_attention", "linear_attention"]),
        );
        assert_eq!(bad_field(odd), "layer_types[1]");
        // Legacy name, and a sliding layer whose window is off: both full attention.
        let ok = with(
            qwen2(),
            "layer_types",
            json!(["attention", "sliding_attention"]),
        );
        HfConfig::from_json(ok).unwrap();
        let mut sliding = with(
            qwen2(),
            "layer_types",
            json!(["full_attention", "sliding_attention"]),
        );
        sliding["use_sliding_window"] = json!(true);
        sliding["sliding_window"] = json!(16);
        assert_eq!(bad_field(sliding), "layer_types[1]");
    }

    #[test]
    fn sliding_window_without_layer_types_follows_max_window_layers() {
        let mut v = qwen2();
        v.as_object_mut().unwrap().remove("layer_types");
        v["use_sliding_window"] = json!(true);
        v["sliding_window"] = json!(16);
        // Sliding from layer 28 on: a 2-layer model has none.
        HfConfig::from_json(v.clone()).unwrap();
        v["max_window_layers"] = json!(1);
        assert_eq!(bad_field(v), "use_sliding_window");
    }

    fn moe() -> serde_json::Value {
        let mut v = with(qwen2(), "model_type", json!("qwen3_moe"));
        v["head_dim"] = json!(8);
        v["num_experts"] = json!(4);
        v["num_experts_per_tok"] = json!(2);
        v["moe_intermediate_size"] = json!(16);
        v
    }

    #[test]
    fn moe_fields_are_checked() {
        HfConfig::from_json(moe()).unwrap();
        assert_eq!(
            bad_field(with(moe(), "num_experts_per_tok", json!(5))),
            "num_experts_per_tok"
        );
        assert_eq!(
            bad_field(with(moe(), "num_experts_per_tok", json!(0))),
            "num_experts_per_tok"
        );
        assert_eq!(
            bad_field(with(moe(), "num_experts", json!(0))),
            "num_experts"
        );
        assert_eq!(
            bad_field(with(moe(), "moe_intermediate_size", json!(0))),
            "moe_intermediate_size"
        );
        assert_eq!(
            bad_field(with(moe(), "decoder_sparse_step", json!(0))),
            "decoder_sparse_step"
        );
        assert_eq!(
            bad_field(with(moe(), "mlp_only_layers", json!([0, 2]))),
            "mlp_only_layers"
        );
        // Every layer sparse: the dense width is unused and may be 0, as transformers allows.
        HfConfig::from_json(with(moe(), "intermediate_size", json!(0))).unwrap();
        let dense_layer = with(
            with(moe(), "intermediate_size", json!(0)),
            "mlp_only_layers",
            json!([1]),
        );
        assert_eq!(bad_field(dense_layer), "intermediate_size");
    }

    #[test]
    fn num_local_experts_is_the_transformers_5_spelling() {
        let mut v = moe();
        v.as_object_mut().unwrap().remove("num_experts");
        v["num_local_experts"] = json!(4);
        let c = HfConfig::from_json(v.clone()).unwrap();
        assert_eq!(c.num_experts, Some(4));
        assert!(!c.extra.contains_key("num_local_experts"));
        v["num_experts"] = json!(4);
        HfConfig::from_json(v.clone()).unwrap();
        v["num_experts"] = json!(8);
        assert_eq!(bad_field(v), "num_local_experts");
    }

    #[test]
    fn omitted_keys_take_transformers_defaults() {
        let mut v = with(qwen2(), "model_type", json!("qwen3"));
        let o = v.as_object_mut().unwrap();
        for k in ["num_key_value_heads", "max_position_embeddings"] {
            o.remove(k);
        }
        o.insert("num_attention_heads".into(), json!(32));
        let c = HfConfig::from_json(v).unwrap();
        assert_eq!(c.num_key_value_heads, Some(32));
        assert_eq!(c.head_dim, Some(128));
        assert_eq!(c.max_position_embeddings, Some(32_768));
        let mut m = moe();
        m.as_object_mut().unwrap().remove("num_key_value_heads");
        let c = HfConfig::from_json(m).unwrap();
        assert_eq!(c.num_key_value_heads, Some(4));
        assert_eq!(c.norm_topk_prob, Some(false));
    }
}
