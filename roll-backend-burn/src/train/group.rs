//! What a trainer does differently as one replica of a data-parallel group: the loss
//! denominators of the whole group's batch, and the group's summed gradients and metrics.
//!
//! Each replica runs forward and backward on its own shard with the **group's** denominators
//! (`N` trained tokens, `S` sequences, the longest response), so the sum of the replicas'
//! gradients is the gradient of the union batch — the identity roll-algos' global denominators
//! exist for (ROLL reduces the same counts across its data-parallel ranks). The replicas then
//! sum their gradients with [`Strategy::all_reduce`] and apply the same AdamW update to the same
//! weights: they stay identical without ever sending weights.

use super::core::{MetricSums, Plan};
use crate::{BackendError, Result};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use roll_algos::loss::Denominators;
use roll_core::strategy::{ReduceOp, Strategy};
use std::collections::HashSet;
use std::sync::Arc;

/// Counts travel as `f32`: exact below 2²⁴.
const EXACT_COUNT: usize = 1 << 24;

/// The group a trainer is one replica of.
#[derive(Clone)]
pub(crate) struct Group {
    strategy: Arc<dyn Strategy>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.strategy.name())
    }
}

/// A failed collective, as the backend reports it.
pub(crate) fn collective(e: roll_core::Error) -> BackendError {
    BackendError::Collective(Box::new(e))
}

impl Group {
    pub(crate) fn new(strategy: Arc<dyn Strategy>) -> Self {
        Self { strategy }
    }

    /// This replica's rank.
    pub(crate) fn rank(&self) -> usize {
        self.strategy.rank()
    }

    pub(crate) fn world_size(&self) -> usize {
        self.strategy.world_size()
    }

    /// Whether there are other replicas to agree with.
    fn shared(&self) -> bool {
        self.strategy.world_size() > 1
    }

    /// Runs `step` and, when it fails on this replica, tells the others (who would otherwise
    /// wait in the next collective for ever).
    pub(crate) fn or_abort<T>(&self, step: impl FnOnce() -> Result<T>) -> Result<T> {
        let out = step();
        if let Err(e) = &out {
            self.abort(e);
        }
        out
    }

    /// Tells the other replicas that this one failed with `error`.
    pub(crate) fn abort(&self, error: &BackendError) {
        if self.shared() {
            self.strategy.abort(&error.to_string());
        }
    }

    /// Replaces the shard's counts in `plan` by the group's: `N` and `S` summed, the longest
    /// response the maximum.
    pub(crate) fn globalise(&self, plan: &mut Plan) -> Result<()> {
        if !self.shared() {
            return Ok(());
        }
        if plan.trained_tokens >= EXACT_COUNT {
            return Err(BackendError::InvalidInput(format!(
                "{} trained tokens on one replica: data-parallel counts are exact below {EXACT_COUNT}",
                plan.trained_tokens
            )));
        }
        let mut counts = [plan.trained_tokens as f32, plan.sequences as f32];
        self.strategy
            .all_reduce(&mut counts, ReduceOp::Sum)
            .map_err(collective)?;
        let mut longest = [plan.max_response as f32];
        self.strategy
            .all_reduce(&mut longest, ReduceOp::Max)
            .map_err(collective)?;
        if counts[0] >= EXACT_COUNT as f32 {
            return Err(BackendError::InvalidInput(format!(
                "{} trained tokens in the group's batch: data-parallel counts are exact below {EXACT_COUNT}",
                counts[0]
            )));
        }
        plan.trained_tokens = counts[0] as usize;
        plan.sequences = counts[1] as usize;
        plan.max_response = longest[0] as usize;
        plan.denominators = Denominators::global(plan.trained_tokens, plan.sequences);
        Ok(())
    }

    /// The group's summed gradients of `module`'s trainable parameters. A parameter that has a
    /// gradient on no replica gets none (as in a single process: AdamW leaves it alone); one that
    /// has a gradient on some replica counts zeros for the others. Only the parameters
    /// `summed` selects are summed; the others keep this replica's gradients (an
    /// expert-parallel replica's experts, which the group's other ranks do not hold).
    pub(crate) fn sum_gradients<M: Module>(
        &self,
        module: &M,
        grads: GradientsParams,
        summed: Summed<'_>,
        device: &Device,
    ) -> Result<GradientsParams> {
        if !self.shared() {
            return Ok(grads);
        }
        let mut flat = Flatten {
            grads: &grads,
            summed,
            present: Vec::new(),
            values: Vec::new(),
            failed: None,
        };
        module.visit(&mut flat);
        if let Some(e) = flat.failed {
            return Err(e);
        }
        let (mut present, mut values) = (flat.present, flat.values);
        self.strategy
            .all_reduce(&mut present, ReduceOp::Max)
            .map_err(collective)?;
        self.strategy
            .all_reduce(&mut values, ReduceOp::Sum)
            .map_err(collective)?;
        let mut unflatten = Unflatten {
            grads: GradientsParams::new(),
            local: &grads,
            summed,
            present: &present,
            values: &values,
            param: 0,
            offset: 0,
            device,
        };
        module.visit(&mut unflatten);
        Ok(unflatten.grads)
    }

    /// Sums the loss and the metrics over the group (see [`MetricSums::all_reduce`]).
    pub(crate) fn sum_metrics(&self, loss: &mut f64, sums: &mut MetricSums) -> Result<()> {
        if !self.shared() {
            return Ok(());
        }
        sums.all_reduce(self.strategy.as_ref(), loss)
            .map_err(collective)
    }
}

/// Trainable parameters, in visiting order (the same on every replica of one model).
fn trainable<const D: usize>(param: &Param<Tensor<D>>) -> Option<Tensor<D>> {
    let value = param.val();
    value.is_require_grad().then_some(value)
}

/// Which parameters' gradients a sum over the group takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Summed<'a> {
    /// Every parameter's but these.
    AllBut(&'a HashSet<ParamId>),
    /// These parameters' only.
    Only(&'a HashSet<ParamId>),
}

impl Summed<'_> {
    fn takes(self, id: &ParamId) -> bool {
        match self {
            Self::AllBut(ids) => !ids.contains(id),
            Self::Only(ids) => ids.contains(id),
        }
    }
}

/// Every trainable parameter's gradient (zeros where it has none) end to end, and a presence
/// flag per parameter.
struct Flatten<'a> {
    grads: &'a GradientsParams,
    summed: Summed<'a>,
    present: Vec<f32>,
    values: Vec<f32>,
    failed: Option<BackendError>,
}

impl ModuleVisitor for Flatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(value) = trainable(param) else {
            return;
        };
        if !self.summed.takes(&param.id) {
            return;
        }
        match self.grads.get::<D>(param.id) {
            Some(g) => match g.into_data().convert::<f32>().try_into_vec::<f32>() {
                Ok(v) => {
                    self.present.push(1.0);
                    self.values.extend(v);
                }
                Err(e) => {
                    self.failed.get_or_insert(BackendError::Train(format!(
                        "cannot read a gradient for the all-reduce: {e:?}"
                    )));
                }
            },
            None => {
                self.present.push(0.0);
                let n: usize = value.dims().iter().product();
                self.values.resize(self.values.len() + n, 0.0);
            }
        }
    }
}

/// Registers the summed gradients of the parameters that have one somewhere in the group.
struct Unflatten<'a> {
    grads: GradientsParams,
    /// This replica's gradients: those the sum does not take are kept as they are.
    local: &'a GradientsParams,
    summed: Summed<'a>,
    present: &'a [f32],
    values: &'a [f32],
    param: usize,
    offset: usize,
    device: &'a Device,
}

impl ModuleVisitor for Unflatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(value) = trainable(param) else {
            return;
        };
        if !self.summed.takes(&param.id) {
            if let Some(g) = self.local.get::<D>(param.id) {
                self.grads.register::<D>(param.id, g);
            }
            return;
        }
        let shape = value.dims();
        let n: usize = shape.iter().product();
        let slice = &self.values[self.offset..self.offset + n];
        if self.present[self.param] > 0.0 {
            let g = Tensor::<D>::from_data(TensorData::new(slice.to_vec(), shape), self.device);
            self.grads.register::<D>(param.id, g);
        }
        self.param += 1;
        self.offset += n;
    }
}
