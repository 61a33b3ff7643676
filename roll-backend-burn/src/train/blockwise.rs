//! A tensor-parallel model on Burn's autodiff path (any device, a GPU included): the backward
//! walks the layers' blocks from the top, re-running each block from its input as a leaf, so that
//! the group's all-reduce between two blocks — which Burn's autodiff cannot see — is made by hand.
//!
//! The forward runs without a graph and keeps each block's input (the residual stream before an
//! attention block, before a feed-forward block). The objective runs on the last layer's output
//! as a leaf; its backward gives `δ`, the gradient of the loss with respect to that output. Then,
//! block by block downwards, the block's partial output `p_r` (this rank's heads or units) is
//! re-run on the autodiff device from its input `x` and `Σ p_r ⊙ δ` back-propagated: that gives
//! this rank's parameters' gradients and its part of `∂loss/∂x`, which the group sums (Megatron's
//! `f`) and the residual adds to: `δ ← δ + Σ_r ∂(p_r·δ)/∂x`. Activation recomputation at block
//! granularity (Chen et al. 2016, arXiv:1604.06174): one more forward of every block, in exchange
//! for collectives in the right places. The norm gains and a mixture's router inside the layers,
//! which every rank holds alike, get each rank's part of their gradient: [`sum_over`] completes
//! them once per step.
//!
//! An expert-parallel model ([`expert_parallel_gradients`]) walks its blocks the same way, with
//! the ranks' own tokens: only a mixture's blocks exchange, sending each routed token to its
//! expert's rank and back, forward and backward.

use super::core::Chunk;
use crate::models::{CausalLm, LayerInputs, TensorShard, rms_norm_hf};
use crate::{BackendError, Result};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData};
use roll_algos::loss::PolicyMetrics;
use roll_core::strategy::{ReduceOp, Strategy};
use std::collections::HashSet;

/// One micro-batch's gradients (this rank's parameters, and its part of the layers' norm gains')
/// and the objective's metrics, for a tensor-parallel `model` on the autodiff device.
/// `objective` maps the final norm's input — the last layer's output — to the loss and metrics.
///
/// # Errors
/// A failed all-reduce, or the objective's error.
pub(crate) fn tensor_parallel_gradients(
    model: &CausalLm,
    shard: &TensorShard,
    chunk: &Chunk<'_>,
    objective: impl FnOnce(Tensor<3>) -> Result<(Tensor<1>, PolicyMetrics)>,
) -> Result<(GradientsParams, PolicyMetrics)> {
    let at = model.layer_inputs(&chunk.tokens);
    let plain = model.valid();
    let plain_at = LayerInputs {
        embedded: at.embedded.clone().inner(),
        cos: at.cos.clone().inner(),
        sin: at.sin.clone().inner(),
        mask: at.mask.clone().inner(),
    };
    // The forward without a graph: each block's input, in order.
    let mut inputs = Vec::with_capacity(2 * plain.held_layers());
    let mut x = plain_at.embedded.clone();
    for l in 0..plain.held_layers() {
        for feed_forward in [false, true] {
            inputs.push(x.clone());
            // `summed`, not the forward's own reduction: a failed collective is an error here.
            x = x.clone() + shard.summed(plain.block(l, feed_forward, x, &plain_at))?;
        }
    }
    let mut grads = GradientsParams::new();
    let (mut delta, metrics) = objective_at_top(model, x, objective, &mut grads)?;
    let mut add = |g: GradientsParams| merge(&mut grads, g, model);
    for (i, input) in inputs.into_iter().enumerate().rev() {
        let (dims, device) = (input.dims(), input.device());
        let leaf = input.autodiff().require_grad();
        let out = model.block(i / 2, i % 2 == 1, leaf.clone(), &at);
        let backward = (out * delta.clone().autodiff()).sum().backward();
        // A rank's part of a mixture whose experts got none of these tokens does not depend on
        // its input: its part of the input's gradient is zero (the group still sums it).
        let mine = leaf
            .grad(&backward)
            .unwrap_or_else(|| Tensor::zeros(dims, &device));
        add(GradientsParams::from_grads(backward, model));
        delta = delta + shard.summed(mine)?;
    }
    add(embedding_gradients(model, at.embedded, delta));
    Ok((grads, metrics))
}

/// The objective on the last layer's output `x` as a leaf of the autodiff graph: `δ`, the
/// gradient of the loss with respect to `x`, and the metrics; the gradients of what the
/// objective reads (final norm, LM head, a tied embedding) are added to `grads`.
fn objective_at_top(
    model: &CausalLm,
    x: Tensor<3>,
    objective: impl FnOnce(Tensor<3>) -> Result<(Tensor<1>, PolicyMetrics)>,
    grads: &mut GradientsParams,
) -> Result<(Tensor<3>, PolicyMetrics)> {
    let top = x.autodiff().require_grad();
    let (loss, metrics) = objective(top.clone())?;
    let backward = loss.backward();
    let delta = top.grad(&backward).ok_or_else(no_gradient)?;
    merge(grads, GradientsParams::from_grads(backward, model), model);
    Ok((delta, metrics))
}

/// The embedding's gradients from `δ` at the first layer's input.
fn embedding_gradients(model: &CausalLm, embedded: Tensor<3>, delta: Tensor<3>) -> GradientsParams {
    GradientsParams::from_grads((embedded * delta.autodiff()).sum().backward(), model)
}

/// One micro-batch's gradients and metrics for an expert-parallel model on the autodiff device
/// (`device`), or, with `chunk` `None`, this rank's part of another rank's micro-batch: every
/// rank of the experts' group runs each micro-batch index together (the exchanges require it),
/// and a rank whose shard of the step had fewer micro-batches serves its experts with none of
/// its own. The gradients are this rank's parameters' for its own tokens, and its experts' for
/// every rank's tokens routed to them.
///
/// As [`tensor_parallel_gradients`], block by block from the top, but a rank's tokens are its
/// own: attention and dense blocks need no exchange, and a mixture's backward sends each slot
/// to its expert's rank and back ([`ExpertShard::backward`](crate::models::expert_parallel)).
///
/// # Errors
/// A failed exchange, or the objective's error.
pub(crate) fn expert_parallel_gradients(
    model: &CausalLm,
    chunk: Option<&Chunk<'_>>,
    device: &burn::tensor::Device,
    objective: impl FnOnce(Tensor<3>) -> Result<(Tensor<1>, PolicyMetrics)>,
) -> Result<(GradientsParams, Option<PolicyMetrics>)> {
    let plain = model.valid();
    let layers = plain.held_layers();
    let hidden = model.hidden_size();
    let mut grads = GradientsParams::new();
    let Some(chunk) = chunk else {
        let plain_device = device.clone().inner();
        for l in 0..layers {
            if let Some((_, mixture)) = plain.expert_parallel_mixture(l) {
                mixture.serve_forward(hidden, &plain_device)?;
            }
        }
        for l in (0..layers).rev() {
            if let Some((_, mixture)) = model.expert_parallel_mixture(l) {
                merge(&mut grads, mixture.serve_backward(hidden, device)?, model);
            }
        }
        return Ok((grads, None));
    };
    let at = model.layer_inputs(&chunk.tokens);
    let plain_at = LayerInputs {
        embedded: at.embedded.clone().inner(),
        cos: at.cos.clone().inner(),
        sin: at.sin.clone().inner(),
        mask: at.mask.clone().inner(),
    };
    // The forward without a graph, each block's input kept; a mixture's exchange fails here
    // with an error rather than NaN.
    let mut inputs = Vec::with_capacity(2 * layers);
    let mut x = plain_at.embedded.clone();
    for l in 0..layers {
        for feed_forward in [false, true] {
            inputs.push(x.clone());
            let out = match (feed_forward, plain.expert_parallel_mixture(l)) {
                (true, Some((norm, mixture))) => {
                    mixture.try_forward(rms_norm_hf(norm, x.clone()))?
                }
                _ => plain.block(l, feed_forward, x.clone(), &plain_at),
            };
            x = x + out;
        }
    }
    let (mut delta, metrics) = objective_at_top(model, x, objective, &mut grads)?;
    let mut add = |g: GradientsParams| merge(&mut grads, g, model);
    for (i, input) in inputs.into_iter().enumerate().rev() {
        let (l, feed_forward) = (i / 2, i % 2 == 1);
        let [b, t, h] = input.dims();
        let leaf = input.autodiff().require_grad();
        let (surrogate, experts) = match (feed_forward, model.expert_parallel_mixture(l)) {
            (true, Some((norm, mixture))) => {
                let x = rms_norm_hf(norm, leaf.clone()).reshape([b * t, h]);
                let (surrogate, experts) =
                    mixture.expert_parallel_backward(x, delta.clone().reshape([b * t, h]))?;
                (surrogate, Some(experts))
            }
            _ => {
                let out = model.block(l, feed_forward, leaf.clone(), &at);
                ((out * delta.clone().autodiff()).sum(), None)
            }
        };
        let backward = surrogate.backward();
        let mine = leaf.grad(&backward).ok_or_else(no_gradient)?;
        add(GradientsParams::from_grads(backward, model));
        if let Some(experts) = experts {
            add(experts);
        }
        delta = delta + mine;
    }
    add(embedding_gradients(model, at.embedded, delta));
    Ok((grads, Some(metrics)))
}

fn no_gradient() -> BackendError {
    BackendError::Train("block-wise backward: a block's input got no gradient".into())
}

/// Adds `more` into `into`, parameter by parameter (`model`'s).
fn merge(into: &mut GradientsParams, mut more: GradientsParams, model: &CausalLm) {
    struct Merge<'a> {
        into: &'a mut GradientsParams,
        more: &'a mut GradientsParams,
    }
    impl ModuleVisitor for Merge<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(g) = self.more.remove::<D>(p.id) {
                let sum = match self.into.remove::<D>(p.id) {
                    Some(sum) => sum + g,
                    None => g,
                };
                self.into.register::<D>(p.id, sum);
            }
        }
    }
    model.visit(&mut Merge {
        into,
        more: &mut more,
    });
}

/// Sums over `group` the gradients of `model`'s parameters in `ids` (zeros where a rank has
/// none), in the model's order on every rank: one all-reduce.
///
/// # Errors
/// A gradient that cannot be read, or a failed all-reduce.
pub(crate) fn sum_over(
    group: &dyn Strategy,
    grads: &mut GradientsParams,
    model: &CausalLm,
    ids: &HashSet<ParamId>,
) -> Result<()> {
    /// Takes the listed gradients out, flattened, with each one's shape.
    struct Take<'a> {
        grads: &'a mut GradientsParams,
        ids: &'a HashSet<ParamId>,
        taken: Vec<(ParamId, Vec<usize>, usize)>,
        flat: Vec<f32>,
        failed: Option<String>,
    }
    impl ModuleVisitor for Take<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if !self.ids.contains(&p.id) {
                return;
            }
            let shape = p.val().dims().to_vec();
            let n: usize = shape.iter().product();
            match self.grads.remove::<D>(p.id) {
                Some(g) => match g.into_data().convert::<f32>().try_into_vec::<f32>() {
                    Ok(v) => self.flat.extend(v),
                    Err(e) => {
                        self.failed.get_or_insert(format!("{e:?}"));
                        self.flat.extend(std::iter::repeat_n(0.0, n));
                    }
                },
                None => self.flat.extend(std::iter::repeat_n(0.0, n)),
            }
            self.taken.push((p.id, shape, n));
        }
    }
    /// Puts the summed gradients back.
    struct Put<'a> {
        grads: &'a mut GradientsParams,
        taken: std::collections::HashMap<ParamId, (Vec<usize>, usize)>,
        flat: &'a [f32],
        device: burn::tensor::Device,
    }
    impl ModuleVisitor for Put<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some((shape, at)) = self.taken.get(&p.id) {
                let n: usize = shape.iter().product();
                let data = TensorData::new(self.flat[*at..at + n].to_vec(), shape.clone());
                self.grads
                    .register::<D>(p.id, Tensor::from_data(data, &self.device));
            }
        }
    }
    let mut take = Take {
        grads,
        ids,
        taken: Vec::new(),
        flat: Vec::new(),
        failed: None,
    };
    model.visit(&mut take);
    if let Some(why) = take.failed {
        return Err(BackendError::Train(format!(
            "cannot read a gradient: {why}"
        )));
    }
    let Take {
        taken, mut flat, ..
    } = take;
    group
        .all_reduce(&mut flat, ReduceOp::Sum)
        .map_err(|e| BackendError::Collective(Box::new(e)))?;
    let mut offsets = std::collections::HashMap::new();
    let mut at = 0;
    for (id, shape, n) in taken {
        offsets.insert(id, (shape, at));
        at += n;
    }
    let device = model_device(model);
    model.visit(&mut Put {
        grads,
        taken: offsets,
        flat: &flat,
        device,
    });
    Ok(())
}

/// The plain device of `model`'s parameters (gradients live there).
fn model_device(model: &CausalLm) -> burn::tensor::Device {
    model
        .devices()
        .first()
        .cloned()
        .map_or_else(burn::tensor::Device::flex, |d| d.inner())
}

/// A pipeline stage on Burn's autodiff path (any device): the forward runs the stage's layers
/// without a graph and keeps only the stage's input; the backward re-runs the stage on the
/// autodiff device from that input as a leaf (the first stage from the tokens, through the
/// embedding) and back-propagates the gradient of its output from the stage after — or, on the
/// last stage, the objective's loss. One recomputed forward per stage and micro-batch, and only
/// the stage inputs kept between a micro-batch's forward and its backward.
pub(crate) struct BurnStage<'a, 'c, F> {
    pub model: &'a CausalLm,
    pub plain: CausalLm,
    pub chunks: &'a [Chunk<'c>],
    pub last: bool,
    /// The loss and metrics of micro-batch `i` from the last layer's output (the last stage).
    pub objective: F,
    pub grads: GradientsParams,
}

impl<F> BurnStage<'_, '_, F> {
    /// `[rows, seq, hidden]` of micro-batch `i`'s stream.
    fn dims(&self, i: usize) -> [usize; 3] {
        let [rows, seq] = self.chunks[i].tokens.input_ids.dims();
        [rows, seq, self.model.hidden_size()]
    }

    /// The stage's layers over `x`.
    fn layers(model: &CausalLm, mut x: Tensor<3>, at: &LayerInputs) -> Tensor<3> {
        for l in 0..model.held_layers() {
            for feed_forward in [false, true] {
                x = x.clone() + model.block(l, feed_forward, x, at);
            }
        }
        x
    }
}

impl<F> crate::models::StageCompute for BurnStage<'_, '_, F>
where
    F: FnMut(usize, Tensor<3>) -> Result<Tensor<1>>,
{
    type Kept = Option<Tensor<3>>;

    fn forward(
        &mut self,
        i: usize,
        input: Option<Vec<f32>>,
    ) -> Result<(Option<Tensor<3>>, Option<Vec<f32>>)> {
        let at = self.model.layer_inputs(&self.chunks[i].tokens);
        let device = at.embedded.device().inner();
        let input = input.map(|v| Tensor::from_data(TensorData::new(v, self.dims(i)), &device));
        if self.last {
            // The backward runs the whole stage with its graph: nothing to run now.
            return Ok((input, None));
        }
        let plain_at = LayerInputs {
            embedded: at.embedded.inner(),
            cos: at.cos.inner(),
            sin: at.sin.inner(),
            mask: at.mask.inner(),
        };
        let x = input.clone().unwrap_or_else(|| plain_at.embedded.clone());
        let out = Self::layers(&self.plain, x, &plain_at);
        Ok((input, Some(values(out)?)))
    }

    fn backward(
        &mut self,
        i: usize,
        input: Option<Tensor<3>>,
        output_grad: Option<Vec<f32>>,
    ) -> Result<Option<Vec<f32>>> {
        let at = self.model.layer_inputs(&self.chunks[i].tokens);
        let leaf = input.map(|x| x.autodiff().require_grad());
        let x = leaf.clone().unwrap_or_else(|| at.embedded.clone());
        let out = Self::layers(self.model, x, &at);
        let loss = match output_grad {
            Some(d) => {
                let device = out.device();
                (out * Tensor::from_data(TensorData::new(d, self.dims(i)), &device)).sum()
            }
            None => (self.objective)(i, out)?,
        };
        let backward = loss.backward();
        let input_grad = match &leaf {
            Some(leaf) => Some(values(leaf.grad(&backward).ok_or_else(no_gradient)?)?),
            None => None,
        };
        merge(
            &mut self.grads,
            GradientsParams::from_grads(backward, self.model),
            self.model,
        );
        Ok(input_grad)
    }
}

/// A tensor's values as `f32`s.
fn values<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| BackendError::Train(format!("cannot read a stage's stream: {e:?}")))
}
