//! A model's weights as buckets of little-endian `f32` bytes, and back: what a weight sync
//! sends. Every float parameter in [`Module::visit`] order (the same for every model built from
//! one config), end to end, cut into buckets of at most `bucket_floats`; a parameter may
//! straddle two buckets.
//!
//! Each side copies the weights once on the way (parameters → buckets, buckets → parameters):
//! a sync moves hundreds of megabytes, and every extra pass over them costs as much as the
//! transfer itself.

use crate::{BackendError, CausalLm, Result};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{DType, Tensor, TensorData};

/// `model`'s float parameters as buckets of at most `bucket_floats` floats each.
///
/// # Errors
/// A parameter that cannot be read as `f32`.
pub(crate) fn to_buckets(model: &CausalLm, bucket_floats: usize) -> Result<Vec<Vec<u8>>> {
    let mut collect = Collect {
        bucket_bytes: bucket_floats.clamp(1, usize::MAX / 4) * 4,
        unwritten: model.num_params() * 4,
        buckets: Vec::new(),
        failed: None,
    };
    model.visit(&mut collect);
    match collect.failed {
        Some(e) => Err(e),
        None => Ok(collect.buckets),
    }
}

/// `template` with every float parameter replaced by the next floats of `buckets` (as
/// [`to_buckets`] cut them).
///
/// # Errors
/// [`BackendError::InvalidInput`] when the buckets do not hold exactly the model's parameters
/// (another model's weights, a torn bucket).
pub(crate) fn load(template: &CausalLm, buckets: &[Vec<u8>]) -> Result<CausalLm> {
    let bytes: usize = buckets.iter().map(Vec::len).sum();
    let expected = template.num_params();
    let refuse = || {
        BackendError::InvalidInput(format!(
            "weights of {bytes} bytes for a model of {expected} f32 parameters ({} bytes)",
            expected * 4
        ))
    };
    if bytes != expected * 4 {
        return Err(refuse());
    }
    let mut assign = Assign {
        floats: Floats {
            buckets,
            bucket: 0,
            offset: 0,
        },
        short: false,
    };
    let model = template.clone().map(&mut assign);
    if assign.short {
        return Err(refuse());
    }
    Ok(model)
}

struct Collect {
    bucket_bytes: usize,
    /// Bytes still to come: a new bucket reserves no more than these.
    unwritten: usize,
    buckets: Vec<Vec<u8>>,
    failed: Option<BackendError>,
}

impl Collect {
    /// Appends `bytes`, opening a new bucket whenever the last is full.
    fn append(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = match self.buckets.last() {
                Some(b) if b.len() < self.bucket_bytes => self.bucket_bytes - b.len(),
                _ => {
                    let capacity = self.bucket_bytes.min(self.unwritten.max(bytes.len()));
                    self.buckets.push(Vec::with_capacity(capacity));
                    self.bucket_bytes
                }
            };
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.unwritten = self.unwritten.saturating_sub(now.len());
            if let Some(bucket) = self.buckets.last_mut() {
                bucket.extend_from_slice(now);
            }
            bytes = rest;
        }
    }
}

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let data = param.val().into_data();
        let data = if data.dtype() == DType::F32 {
            data
        } else {
            data.convert::<f32>()
        };
        if cfg!(target_endian = "little") {
            self.append(data.as_bytes());
            return;
        }
        match data.as_slice::<f32>() {
            Ok(values) => self.append(&super::wire::floats_to_bytes(values)),
            Err(e) => {
                self.failed
                    .get_or_insert(BackendError::InvalidInput(format!(
                        "cannot read a parameter for a weight sync: {e:?}"
                    )));
            }
        }
    }
}

/// Reads floats across bucket boundaries.
struct Floats<'a> {
    buckets: &'a [Vec<u8>],
    bucket: usize,
    offset: usize,
}

impl Floats<'_> {
    /// The next `n` floats, or `None` when fewer remain.
    fn take(&mut self, n: usize) -> Option<Vec<f32>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let bucket = self.buckets.get(self.bucket)?;
            let available = &bucket[self.offset..];
            if available.is_empty() {
                self.bucket += 1;
                self.offset = 0;
                continue;
            }
            let want = (n - out.len()) * 4;
            let now = &available[..want.min(available.len())];
            if !super::wire::extend_floats(&mut out, now) {
                return None;
            }
            self.offset += now.len();
        }
        Some(out)
    }
}

struct Assign<'a> {
    floats: Floats<'a>,
    short: bool,
}

impl ModuleMapper for Assign<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.map(|t| {
            let shape = t.shape();
            match self.floats.take(shape.num_elements()) {
                Some(values) => Tensor::from_data(TensorData::new(values, shape), &t.device()),
                None => {
                    self.short = true;
                    t
                }
            }
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::engine::test_support::{qwen3_config, random};

    fn concat(buckets: &[Vec<u8>]) -> Vec<u8> {
        buckets.concat()
    }

    #[test]
    fn a_model_survives_the_buckets_whatever_their_size_and_other_weights_are_refused() {
        let (a, b) = (random(&qwen3_config()), random(&qwen3_config()));
        let whole = concat(&to_buckets(&a, usize::MAX / 8).unwrap());
        assert_eq!(whole.len(), a.num_params() * 4);
        // 1000 floats per bucket cuts parameters across buckets; 7 is smaller than any row.
        for bucket_floats in [1000, 7] {
            let buckets = to_buckets(&a, bucket_floats).unwrap();
            assert!(buckets.iter().all(|x| x.len() <= bucket_floats * 4));
            assert_eq!(concat(&buckets), whole);
            let loaded = load(&b, &buckets).unwrap();
            assert_eq!(
                concat(&to_buckets(&loaded, 1000).unwrap()),
                whole,
                "b holds a's weights"
            );
        }
        assert_ne!(
            concat(&to_buckets(&b, 1000).unwrap()),
            whole,
            "the template is untouched"
        );
        let short = vec![whole[4..].to_vec()];
        let long = vec![whole.clone(), vec![0; 4]];
        let torn = vec![whole[..6].to_vec(), whole[6..].to_vec()];
        for wrong in [short, long] {
            let err = load(&b, &wrong).unwrap_err().to_string();
            assert!(err.contains("for a model of"), "{err}");
        }
        assert!(
            load(&b, &torn).is_err(),
            "a float split across buckets is refused"
        );
    }
}
