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
//! which every rank holds alike, get each rank's part of their gradient: the trainer sums them over the group
//! them once per step.
//!
//! A pipeline stage ([`BurnStage`]) walks its own blocks the same way (the same two functions,
//! [`forward_blocks`] and [`backward_blocks`], with or without a tensor-parallel group), from the
//! gradient of its output that the stage after sends back.
//!
//! An expert-parallel model ([`expert_parallel_gradients`]) walks its blocks the same way, with
//! the ranks' own tokens: only a mixture's blocks exchange, sending each routed token to its
//! expert's rank and back, forward and backward.

use super::core::Chunk;
use crate::models::{CausalLm, LayerInputs, TensorShard, rms_norm_hf};
use crate::{BackendError, Result};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData};
use roll_algos::loss::PolicyMetrics;

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
    let plain_at = plain_inputs(&at);
    let embedded = plain_at.embedded.clone();
    let (inputs, x) = forward_blocks(&model.valid(), Some(shard), embedded, &plain_at)?;
    let mut grads = GradientsParams::new();
    let (delta, metrics) = objective_at_top(model, x, objective, &mut grads)?;
    let delta = backward_blocks(model, Some(shard), inputs, &at, delta, &mut grads)?;
    merge(
        &mut grads,
        embedding_gradients(model, at.embedded, delta),
        model,
    );
    Ok((grads, metrics))
}

/// The layers' inputs on the plain device (no graph).
fn plain_inputs(at: &LayerInputs) -> LayerInputs {
    LayerInputs {
        embedded: at.embedded.clone().inner(),
        cos: at.cos.clone().inner(),
        sin: at.sin.clone().inner(),
        mask: at.mask.clone().inner(),
    }
}

/// The forward of the held layers' blocks from `x` without a graph (`plain` is the model on the
/// plain device, `at` its layers' inputs there): each block's input, in order, and the last
/// block's output. A tensor-parallel rank's blocks are summed over its group — with `summed`,
/// not the forward's own reduction, so that a failed collective is an error here.
fn forward_blocks(
    plain: &CausalLm,
    shard: Option<&TensorShard>,
    mut x: Tensor<3>,
    at: &LayerInputs,
) -> Result<(Vec<Tensor<3>>, Tensor<3>)> {
    let mut inputs = Vec::with_capacity(2 * plain.held_layers());
    for l in 0..plain.held_layers() {
        for feed_forward in [false, true] {
            inputs.push(x.clone());
            let out = plain.block(l, feed_forward, x.clone(), at);
            x = x + match shard {
                Some(shard) => shard.summed(out)?,
                None => out,
            };
        }
    }
    Ok((inputs, x))
}

/// The backward of the blocks whose inputs are `inputs` ([`forward_blocks`]) from `δ`, the
/// gradient of the loss with respect to the last block's output: each block re-run from its
/// input as a leaf, its parameters' gradients added to `grads`, its input's gradient (summed
/// over a tensor-parallel group) added to `δ`. Returns `δ` at the first block's input.
fn backward_blocks(
    model: &CausalLm,
    shard: Option<&TensorShard>,
    inputs: Vec<Tensor<3>>,
    at: &LayerInputs,
    mut delta: Tensor<3>,
    grads: &mut GradientsParams,
) -> Result<Tensor<3>> {
    for (i, input) in inputs.into_iter().enumerate().rev() {
        let (dims, device) = (input.dims(), input.device());
        let leaf = input.autodiff().require_grad();
        let out = model.block(i / 2, i % 2 == 1, leaf.clone(), at);
        let backward = (out * delta.clone().autodiff()).sum().backward();
        // A rank's part of a mixture whose experts got none of these tokens does not depend on
        // its input: its part of the input's gradient is zero (the group still sums it).
        let mine = leaf
            .grad(&backward)
            .unwrap_or_else(|| Tensor::zeros(dims, &device));
        merge(grads, GradientsParams::from_grads(backward, model), model);
        delta = delta
            + match shard {
                Some(shard) => shard.summed(mine)?,
                None => mine,
            };
    }
    Ok(delta)
}

/// The objective on the last layer's output `x` as a leaf of the autodiff graph: `δ`, the
/// gradient of the loss with respect to `x`, and what else the objective returns (its metrics);
/// the gradients of what the objective reads (final norm, LM head, a tied embedding) are added
/// to `grads`.
fn objective_at_top<T>(
    model: &CausalLm,
    x: Tensor<3>,
    objective: impl FnOnce(Tensor<3>) -> Result<(Tensor<1>, T)>,
    grads: &mut GradientsParams,
) -> Result<(Tensor<3>, T)> {
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
    let plain_at = plain_inputs(&at);
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

/// A pipeline stage on Burn's autodiff path (any device), block by block as
/// [`tensor_parallel_gradients`]: the forward runs the stage's blocks without a graph and keeps
/// each block's input; the backward re-runs each block from its input as a leaf, from the top
/// down, starting from the gradient of the stage's output from the stage after — or, on the last
/// stage, the objective's. One recomputed forward per block, and only the blocks' inputs kept
/// between a micro-batch's forward and its backward. A tensor-parallel stage's blocks are summed
/// over its group both ways, so the streams passed between stages are whole.
pub(crate) struct BurnStage<'a, 'c, F> {
    pub model: &'a CausalLm,
    pub plain: CausalLm,
    pub chunks: &'a [Chunk<'c>],
    pub first: bool,
    pub last: bool,
    /// The loss of micro-batch `i` from the last layer's output (the last stage).
    pub objective: F,
    pub grads: GradientsParams,
}

impl<F> BurnStage<'_, '_, F> {
    /// `[rows, seq, hidden]` of micro-batch `i`'s stream.
    fn dims(&self, i: usize) -> [usize; 3] {
        let [rows, seq] = self.chunks[i].tokens.input_ids.dims();
        [rows, seq, self.model.hidden_size()]
    }
}

/// What a stage's forward keeps for its backward: each block's input, and on the last stage
/// the last block's output (the objective's input).
pub(crate) struct StageKept {
    inputs: Vec<Tensor<3>>,
    top: Option<Tensor<3>>,
}

impl<F> crate::models::StageCompute for BurnStage<'_, '_, F>
where
    F: FnMut(usize, Tensor<3>) -> Result<Tensor<1>>,
{
    type Kept = StageKept;

    fn forward(
        &mut self,
        i: usize,
        input: Option<Vec<f32>>,
    ) -> Result<(StageKept, Option<Vec<f32>>)> {
        let plain_at = plain_inputs(&self.model.layer_inputs(&self.chunks[i].tokens));
        let x = match input {
            Some(v) => {
                let device = plain_at.embedded.device();
                Tensor::from_data(TensorData::new(v, self.dims(i)), &device)
            }
            None => plain_at.embedded.clone(),
        };
        let shard = self.model.tensor_shard();
        let (inputs, out) = forward_blocks(&self.plain, shard, x, &plain_at)?;
        if self.last {
            let top = Some(out);
            return Ok((StageKept { inputs, top }, None));
        }
        Ok((StageKept { inputs, top: None }, Some(values(out)?)))
    }

    fn backward(
        &mut self,
        i: usize,
        kept: StageKept,
        output_grad: Option<Vec<f32>>,
    ) -> Result<Option<Vec<f32>>> {
        let at = self.model.layer_inputs(&self.chunks[i].tokens);
        let delta = match (output_grad, kept.top) {
            (Some(d), _) => {
                let device = at.embedded.device().inner();
                Tensor::from_data(TensorData::new(d, self.dims(i)), &device)
            }
            (None, Some(top)) => {
                let objective = |top| Ok(((self.objective)(i, top)?, ()));
                objective_at_top(self.model, top, objective, &mut self.grads)?.0
            }
            (None, None) => {
                return Err(BackendError::Train(
                    "pipeline: a stage before the last got no gradient for its output".into(),
                ));
            }
        };
        let shard = self.model.tensor_shard();
        let delta = backward_blocks(self.model, shard, kept.inputs, &at, delta, &mut self.grads)?;
        if !self.first {
            return Ok(Some(values(delta)?));
        }
        let embedding = embedding_gradients(self.model, at.embedded, delta);
        merge(&mut self.grads, embedding, self.model);
        Ok(None)
    }
}

/// A tensor's values as `f32`s.
fn values<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| BackendError::Train(format!("cannot read a stage's stream: {e:?}")))
}
