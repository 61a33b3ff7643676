//! The whole model from the parts its ranks hold ([`CausalLm::gather`]): what a weight sync, an
//! evaluation or an export of a tensor- or pipeline-parallel actor needs.
//!
//! Every rank writes what it holds into a zeroed buffer laid out as the whole model's parameters
//! (in [`Module::visit`] order) — a slice at its offset, a stage's layers (a block of whole
//! experts) at their indices, a parameter every rank holds alike by one rank only — and one
//! all-reduce (a sum) over the parts' group completes the buffer on every rank (a pipeline of
//! tensor-parallel stages: one over the stage's group, then one over the link between stages).
//! Each value is written by one rank and added to zeros, so the gather is exact. One pass over
//! the weights; each rank briefly holds the whole model, which is what the rank that serves it
//! needs anyway.

use super::{CausalLm, with_decoder};
use crate::{BackendError, Result};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Tensor, TensorData};
use std::collections::HashMap;

/// A float parameter: its path (`model.layers.3.mlp.up_proj.weight`), shape and, when asked
/// for, values.
struct Entry {
    path: String,
    shape: Vec<usize>,
    values: Vec<f32>,
}

/// Every float parameter of a module, in visit order.
#[derive(Default)]
struct Entries {
    path: Vec<String>,
    with_values: bool,
    out: Vec<Entry>,
    failed: Option<String>,
}

impl ModuleVisitor for Entries {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        let t = p.val();
        let shape = t.dims().to_vec();
        let values = if self.with_values {
            match t.into_data().convert::<f32>().try_into_vec::<f32>() {
                Ok(v) => v,
                Err(e) => {
                    self.failed.get_or_insert(format!("{e:?}"));
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        self.out.push(Entry {
            path: self.path.join("."),
            shape,
            values,
        });
    }
}

fn entries(model: &CausalLm, with_values: bool) -> Result<Vec<Entry>> {
    let mut e = Entries {
        with_values,
        ..Default::default()
    };
    model.visit(&mut e);
    match e.failed {
        Some(why) => Err(BackendError::Train(format!(
            "cannot read a parameter: {why}"
        ))),
        None => Ok(e.out),
    }
}

/// Whose a part's parameter is: a parameter every rank holds alike is written by one.
enum Place {
    /// The same values on every rank: the first rank writes them.
    Shared,
    /// This rank's own: all of it, or its slice.
    Own,
}

/// `template` with every float parameter replaced by the next values of `flat`.
struct Assign<'a> {
    flat: &'a [f32],
}

impl ModuleMapper for Assign<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.map(|t| {
            let shape = t.shape();
            let (now, rest) = self
                .flat
                .split_at(shape.num_elements().min(self.flat.len()));
            self.flat = rest;
            Tensor::from_data(TensorData::new(now.to_vec(), shape), &t.device())
        })
    }
}

/// Whether `part` is `rank`'s equal slice of `full` along one axis.
fn fits(full: &[usize], part: &[usize], rank: usize) -> bool {
    let differing: Vec<(usize, usize)> = full
        .iter()
        .zip(part)
        .filter(|(f, p)| f != p)
        .map(|(&f, &p)| (f, p))
        .collect();
    full.len() == part.len()
        && matches!(differing.as_slice(), [(f, p)] if *p > 0 && f % p == 0 && (rank + 1) * p <= *f)
}

/// Copies a part `values` of shape `part` into `whole` (of shape `full`), which is `rank`'s
/// equal slice along the one axis on which the shapes differ (all of it when they do not).
fn place_slice(whole: &mut [f32], full: &[usize], values: &[f32], part: &[usize], rank: usize) {
    match (full, part) {
        ([rows, cols], [r, c]) if rows == r && cols != c => {
            for (row, src) in whole.chunks_exact_mut(*cols).zip(values.chunks_exact(*c)) {
                row[rank * c..(rank + 1) * c].copy_from_slice(src);
            }
        }
        ([_, cols], [r, _]) => {
            whole[rank * r * cols..(rank + 1) * r * cols].copy_from_slice(values);
        }
        _ => {
            let n = values.len();
            whole[rank * n..(rank + 1) * n].copy_from_slice(values);
        }
    }
}

impl CausalLm {
    /// The whole model from the parts the ranks of a tensor-parallel model
    /// ([`CausalLm::shard_tensors`]), of a pipeline ([`CausalLm::split_stages`]) or of an
    /// expert-parallel model ([`CausalLm::shard_experts`]) hold: a collective, every rank of
    /// the parts' group calls it and gets the whole model (a whole model is returned as it is).
    /// The parameters get new ids.
    ///
    /// # Errors
    /// A parameter that cannot be read, a part that does not fit the whole model's layout, or a
    /// failed all-reduce.
    pub fn gather(&self) -> Result<CausalLm> {
        // The groups to sum over, innermost first: a tensor-parallel group (or the experts'),
        // then a pipeline's link.
        let groups: Vec<_> = self.part_levels().into_iter().map(|l| l.group).collect();
        if groups.is_empty() {
            return Ok(self.clone());
        }
        // This rank's slice (or block of experts), and its stage.
        let rank = match (self.tensor_shard(), self.expert_group()) {
            (Some(shard), _) => shard.rank(),
            (None, Some(group)) => group.rank(),
            (None, None) => 0,
        };
        let stage = self.pipeline_stage().map_or(0, |s| s.stage());
        let stage_layers = self.pipeline_stage().map(|s| s.layers());
        let first_expert = self.first_held_expert();
        let device = with_decoder!(self, m => m.model.embed_tokens.weight.val().device());
        let template = CausalLm::init(&self.hf_config(), &device)?;
        let mut layout = HashMap::new();
        let mut total = 0;
        for Entry { path, shape, .. } in entries(&template, false)? {
            let n: usize = shape.iter().product();
            layout.insert(path, (total, shape));
            total += n;
        }
        let mut flat = vec![0.0f32; total];
        for Entry {
            path,
            shape,
            values,
        } in entries(self, true)?
        {
            // Where the part's parameter sits in the whole model, and whether it is this stage's
            // own (a layer's) and this rank's own (one of its experts).
            let (path, stage_own) = match &stage_layers {
                Some(layers) => {
                    let (path, place) = stage_path(&path, layers.start);
                    (path, matches!(place, Place::Own))
                }
                None => (path, true),
            };
            let (path, own_expert) = match first_expert.and_then(|f| expert_path(&path, f)) {
                Some(path) => (path, true),
                None => (path, false),
            };
            let (offset, full) = layout.get(&path).ok_or_else(|| {
                BackendError::InvalidInput(format!("gather: `{path}` is not in the whole model"))
            })?;
            let n: usize = full.iter().product();
            let whole = &mut flat[*offset..offset + n];
            // A parameter several ranks hold alike is written by the first: what is not in a
            // layer by the first stage, a tensor-parallel rank's whole parameters (but its own
            // experts) by its group's first rank.
            let mine = (stage_own || stage == 0) && (own_expert || rank == 0);
            if &shape == full {
                if mine {
                    whole.copy_from_slice(&values);
                }
            } else if self.tensor_shard().is_some() && fits(full, &shape, rank) {
                place_slice(whole, full, &values, &shape, rank);
            } else {
                return Err(BackendError::InvalidInput(format!(
                    "gather: `{path}` has shape {shape:?}, which is no rank-{rank} slice of \
                     {full:?}"
                )));
            }
        }
        for group in groups {
            group
                .all_reduce(&mut flat, roll_core::strategy::ReduceOp::Sum)
                .map_err(|e| BackendError::Collective(Box::new(e)))?;
        }
        Ok(template.map(&mut Assign { flat: &flat }))
    }
}

/// A tensor-parallel rank's expert `j` (of a block starting at `first`) is the whole model's
/// `first + j`; `None` for a path outside the experts.
fn expert_path(path: &str, first: usize) -> Option<String> {
    let mut parts: Vec<String> = path.split('.').map(str::to_string).collect();
    let i = parts.iter().position(|p| p == "experts")?;
    let j: usize = parts.get(i + 1)?.parse().ok()?;
    parts[i + 1] = (first + j).to_string();
    Some(parts.join("."))
}

/// A stage's parameter path in the whole model: its layer `j` is the whole model's
/// `first + j`; what is not in a layer is every stage's.
fn stage_path(path: &str, first: usize) -> (String, Place) {
    let parts: Vec<&str> = path.split('.').collect();
    if let Some(i) = parts.iter().position(|p| *p == "layers")
        && let Some(j) = parts.get(i + 1).and_then(|j| j.parse::<usize>().ok())
    {
        let mut whole: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        whole[i + 1] = (first + j).to_string();
        return (whole.join("."), Place::Own);
    }
    (path.to_string(), Place::Shared)
}
