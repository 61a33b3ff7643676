//! A model's weights as one flat list of floats, and back: what a weight sync sends.

use crate::{BackendError, CausalLm, Result};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Tensor, TensorData};

/// Every float parameter of `model` end to end, in [`Module::visit`] order (the same for every
/// model built from one config).
///
/// # Errors
/// A parameter that cannot be read as `f32`.
pub(crate) fn flatten(model: &CausalLm) -> Result<Vec<f32>> {
    let mut collect = Collect {
        values: Vec::new(),
        failed: None,
    };
    model.visit(&mut collect);
    match collect.failed {
        Some(e) => Err(e),
        None => Ok(collect.values),
    }
}

/// `template` with every float parameter replaced by the next floats of `values`
/// (as [`flatten`] wrote them).
///
/// # Errors
/// [`BackendError::InvalidInput`] when `values` does not hold exactly the model's parameters
/// (another model's weights).
pub(crate) fn load(template: &CausalLm, values: &[f32]) -> Result<CausalLm> {
    let mut assign = Assign {
        values,
        offset: 0,
        short: false,
    };
    let model = template.clone().map(&mut assign);
    let expected = template.num_params();
    if assign.short || assign.offset != values.len() {
        return Err(BackendError::InvalidInput(format!(
            "weights of {} floats for a model of {expected} parameters",
            values.len()
        )));
    }
    Ok(model)
}

struct Collect {
    values: Vec<f32>,
    failed: Option<BackendError>,
}

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        match param
            .val()
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
        {
            Ok(v) => self.values.extend(v),
            Err(e) => {
                self.failed
                    .get_or_insert(BackendError::InvalidInput(format!(
                        "cannot read a parameter for a weight sync: {e:?}"
                    )));
            }
        }
    }
}

struct Assign<'a> {
    values: &'a [f32],
    offset: usize,
    short: bool,
}

impl ModuleMapper for Assign<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.map(|t| {
            let shape = t.shape();
            let n = shape.num_elements();
            let Some(slice) = self.values.get(self.offset..self.offset + n) else {
                self.short = true;
                return t;
            };
            self.offset += n;
            Tensor::from_data(TensorData::new(slice.to_vec(), shape), &t.device())
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::engine::test_support::{qwen3_config, random};

    #[test]
    fn a_model_survives_flatten_and_load_and_other_weights_are_refused() {
        let (a, b) = (random(&qwen3_config()), random(&qwen3_config()));
        let flat_a = flatten(&a).unwrap();
        assert_eq!(flat_a.len(), a.num_params());
        let loaded = load(&b, &flat_a).unwrap();
        assert_eq!(flatten(&loaded).unwrap(), flat_a, "b now holds a's weights");
        assert_ne!(flatten(&b).unwrap(), flat_a, "the template is untouched");
        for wrong in [&flat_a[1..], &[flat_a.as_slice(), &[0.0]].concat()[..]] {
            let err = load(&b, wrong).unwrap_err().to_string();
            assert!(err.contains("for a model of"), "{err}");
        }
    }
}
