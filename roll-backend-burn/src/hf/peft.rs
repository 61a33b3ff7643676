//! LoRA adapters written in PEFT's layout, loadable with
//! `PeftModel.from_pretrained(base_model, dir)` on top of the untouched base checkpoint.
//!
//! Roll's adapters are Burn [`LoraAdapter`](burn::module::LoraAdapter)s on a `Linear` weight
//! stored `[in, out]`: the adapted weight is `W + s·A·B` with `A: [in, r]`, `B: [r, out]`,
//! `s = alpha / r`. PEFT stores the PyTorch weight `[out, in]` and computes
//! `W_pt + s·B_pt·A_pt` with `lora_A.weight = A_pt: [r, in]`, `lora_B.weight = B_pt: [out, r]`
//! and the same `s = lora_alpha / r`. Transposing roll's update,
//! `(A·B)ᵀ = Bᵀ·Aᵀ`, so `lora_A.weight = Aᵀ` and `lora_B.weight = Bᵀ`.

use super::safetensors_file::{F32Tensor, write_safetensors};
use super::save::{SaveDtype, write_json};
use crate::models::CausalLm;
use crate::train::LoraConfig;
use crate::{BackendError, Result};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use std::collections::BTreeMap;
use std::path::Path;

/// The factors of one adapted weight, row-major, in Burn's layout.
#[derive(Default)]
struct Factors {
    /// `A: [in, r]`.
    a: Option<(Vec<usize>, Vec<f32>)>,
    /// `B: [r, out]`.
    b: Option<(Vec<usize>, Vec<f32>)>,
}

/// Collects the LoRA factors of a module by the path of the `Linear` they adapt
/// (`model.layers.0.self_attn.q_proj`).
///
/// A visitor sees an adapted parameter as its base, then the adapter's own parameters inside a
/// module `lora` of container type `Reparameterization`, so `a` arrives at
/// `<linear>.weight.lora.a`. Enum variants (`CausalLm::Qwen2`) are not part of HF names.
#[derive(Default)]
struct CollectFactors {
    /// Entered modules: name (none for an enum variant) and container type.
    stack: Vec<(Option<String>, String)>,
    found: BTreeMap<String, Factors>,
    error: Option<String>,
}

impl ModuleVisitor for CollectFactors {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        let name = (!container_type.starts_with("Enum:")).then(|| name.to_string());
        self.stack.push((name, container_type.to_string()));
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let n = self.stack.len();
        if n < 3 || self.stack[n - 2].1 != "Reparameterization" {
            return;
        }
        let names: Vec<&str> = self
            .stack
            .iter()
            .filter_map(|(s, _)| s.as_deref())
            .collect();
        let [.., weight, lora, factor] = names.as_slice() else {
            return;
        };
        if (*weight, *lora) != ("weight", "lora") {
            return;
        }
        let linear = names[..names.len() - 3].join(".");
        let data = param.val().into_data();
        let shape = data.shape().as_slice().to_vec();
        let values = match data.convert::<f32>().try_into_vec::<f32>() {
            Ok(v) => v,
            Err(e) => {
                self.error = Some(format!("cannot read `{linear}` LoRA factor: {e:?}"));
                return;
            }
        };
        let entry = self.found.entry(linear).or_default();
        match *factor {
            "a" => entry.a = Some((shape, values)),
            "b" => entry.b = Some((shape, values)),
            _ => {}
        }
    }
}

/// Row-major transpose of a `[rows, cols]` matrix.
fn transpose(rows: usize, cols: usize, values: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

/// Writes the LoRA adapters of `model` (a trainer's model with adapters attached, e.g.
/// `Trainer::training_model`) to `out_dir` in PEFT's layout: `adapter_config.json`
/// (`peft_type` `LORA`, `task_type` `CAUSAL_LM`, `r`, `lora_alpha`, `target_modules` of `lora`,
/// `base_model_name_or_path`) and `adapter_model.safetensors` with PEFT's tensor names
/// (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` `[r, in]`,
/// `….lora_B.weight` `[out, r]`: PEFT stores A and B transposed from roll's layout). Returns how many
/// weights carry an adapter.
///
/// `lora` must be the config the adapters were trained with: the scale `alpha / r` is not
/// stored in the factors, so PEFT recomputes it from `lora_alpha` and `r`.
///
/// # Errors
/// [`BackendError::InvalidInput`] if the model carries no adapter, an adapter lacks a factor,
/// or a factor's rank is not `lora.rank`; [`BackendError::Io`] / [`BackendError::Save`] naming
/// a file that could not be written.
pub fn export_peft_adapter(
    model: &CausalLm,
    lora: &LoraConfig,
    base_model_name_or_path: Option<&str>,
    out_dir: impl AsRef<Path>,
    dtype: SaveDtype,
) -> Result<usize> {
    let out_dir = out_dir.as_ref();
    let mut collect = CollectFactors::default();
    model.visit(&mut collect);
    if let Some(message) = collect.error {
        return Err(BackendError::InvalidInput(message));
    }
    if collect.found.is_empty() {
        return Err(BackendError::InvalidInput(
            "the model carries no LoRA adapter (export the trainer's training model, not a \
             merged one)"
                .into(),
        ));
    }
    let mut tensors = Vec::with_capacity(2 * collect.found.len());
    for (linear, factors) in &collect.found {
        let missing = |f: &str| {
            BackendError::InvalidInput(format!("the LoRA adapter of `{linear}` has no `{f}`"))
        };
        let (a_shape, a) = factors.a.as_ref().ok_or_else(|| missing("a"))?;
        let (b_shape, b) = factors.b.as_ref().ok_or_else(|| missing("b"))?;
        let (&[d_in, r_a], &[r_b, d_out]) = (a_shape.as_slice(), b_shape.as_slice()) else {
            return Err(BackendError::InvalidInput(format!(
                "the LoRA factors of `{linear}` are not matrices: {a_shape:?}, {b_shape:?}"
            )));
        };
        if r_a != lora.rank || r_b != lora.rank {
            return Err(BackendError::InvalidInput(format!(
                "the LoRA factors of `{linear}` have rank {r_a}/{r_b}, but lora.rank is {}",
                lora.rank
            )));
        }
        let prefix = format!("base_model.model.{linear}");
        tensors.push(F32Tensor {
            name: format!("{prefix}.lora_A.weight"),
            shape: vec![lora.rank, d_in],
            values: transpose(d_in, lora.rank, a),
        });
        tensors.push(F32Tensor {
            name: format!("{prefix}.lora_B.weight"),
            shape: vec![d_out, lora.rank],
            values: transpose(lora.rank, d_out, b),
        });
    }
    std::fs::create_dir_all(out_dir).map_err(|e| BackendError::io(out_dir, e))?;
    write_safetensors(&out_dir.join("adapter_model.safetensors"), tensors, dtype)?;
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": 0.0,
        "target_modules": lora.target_modules,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "inference_mode": true,
        "modules_to_save": null,
    });
    write_json(&out_dir.join("adapter_config.json"), &config)?;
    Ok(collect.found.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_by_hand() {
        // [[1, 2, 3], [4, 5, 6]]ᵀ = [[1, 4], [2, 5], [3, 6]]
        assert_eq!(
            transpose(2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
    }
}
