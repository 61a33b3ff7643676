//! A model whose ranks hold parts of it, on Burn's autodiff path (any device, a GPU included):
//! the backward walks the layers' blocks from the top, re-running each block from its input as a
//! leaf, so that the exchanges between ranks inside and between blocks — which Burn's autodiff
//! cannot see — are made by hand.
//!
//! The forward runs without a graph and keeps each block's input (the residual stream before an
//! attention block, before a feed-forward block). The objective runs on the last layer's output
//! as a leaf; its backward gives `δ`, the gradient of the loss with respect to that output. Then,
//! block by block downwards, the block is re-run on the autodiff device from its input `x` and
//! `⟨out, δ⟩` back-propagated: that gives its parameters' gradients and `∂loss/∂x`, which the
//! residual adds to: `δ ← δ + ∂⟨out, δ⟩/∂x`. Activation recomputation at block granularity (Chen
//! et al. 2016, arXiv:1604.06174): one more forward of every block, in exchange for collectives in
//! the right places:
//!
//! - a tensor-parallel rank's block gives its partial output `p_r` (its heads or units), summed
//!   over the group both ways (Megatron's `f` and `g`): `δ ← δ + Σ_r ∂⟨p_r, δ⟩/∂x`. The norm gains
//!   and a mixture's router inside the layers, which every rank holds alike, get each rank's part
//!   of their gradient: the trainer sums them over the group once per step;
//! - an expert-parallel rank's tokens are its own: attention and dense blocks need no exchange,
//!   and a mixture's blocks send each routed token to its expert's rank and back, forward and
//!   backward ([`ExpertShard::backward`](crate::models::expert_parallel)). Every rank of the
//!   experts' group runs each micro-batch index together; a rank with fewer micro-batches serves
//!   its experts through the others' ([`idle_gradients`]).
//!
//! A pipeline stage ([`BurnStage`]) walks its own blocks the same way (the same two functions,
//! [`forward_blocks`] and [`backward_blocks`]), from the gradient of its output that the stage
//! after sends back — its blocks tensor-parallel, or its mixtures expert-parallel across the same
//! stage of several pipelines.

use super::core::Chunk;
use crate::models::{CausalLm, LayerInputs, TensorShard, rms_norm_hf};
use crate::{BackendError, Result};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use roll_algos::loss::PolicyMetrics;

/// One micro-batch's gradients (this rank's parameters, and on a tensor-parallel rank its part of
/// the layers' norm gains') and the objective's metrics, for a tensor- or expert-parallel `model`
/// on the autodiff device. `objective` maps the final norm's input — the last layer's output — to
/// the loss and metrics.
///
/// # Errors
/// A failed exchange, or the objective's error.
pub(crate) fn blockwise_gradients(
    model: &CausalLm,
    chunk: &Chunk<'_>,
    objective: impl FnOnce(Tensor<3>) -> Result<(Tensor<1>, PolicyMetrics)>,
) -> Result<(GradientsParams, PolicyMetrics)> {
    let shard = model.tensor_shard();
    let at = model.layer_inputs(&chunk.tokens);
    let plain_at = plain_inputs(&at);
    let embedded = plain_at.embedded.clone();
    let (inputs, x) = forward_blocks(&model.valid(), shard, embedded, &plain_at)?;
    let mut grads = GradientsParams::new();
    let (delta, metrics) = objective_at_top(model, x, objective, &mut grads)?;
    let delta = backward_blocks(model, shard, inputs, &at, delta, &mut grads)?;
    merge(
        &mut grads,
        embedding_gradients(model, at.embedded, delta),
        model,
    );
    Ok((grads, metrics))
}

/// This expert-parallel rank's part of a micro-batch of the other ranks when it has none of its
/// own: its experts serve theirs through every mixture's exchanges, forward then backward, in the
/// order a micro-batch of its own would run them. Returns its experts' gradients from the others'
/// tokens (`device`: the autodiff device).
///
/// # Errors
/// A failed exchange.
pub(crate) fn idle_gradients(model: &CausalLm, device: &Device) -> Result<GradientsParams> {
    let mut grads = GradientsParams::new();
    serve_forward(&model.valid(), &device.clone().inner())?;
    serve_backward(model, device, &mut grads)?;
    Ok(grads)
}

/// The forward half of [`idle_gradients`] (`plain`: the model on the plain device).
fn serve_forward(plain: &CausalLm, device: &Device) -> Result<()> {
    let hidden = plain.hidden_size();
    for l in 0..plain.held_layers() {
        if let Some((_, mixture)) = plain.expert_parallel_mixture(l) {
            mixture.serve_forward(hidden, device)?;
        }
    }
    Ok(())
}

/// The backward half of [`idle_gradients`]: the mixtures from the top, their experts' gradients
/// added to `grads`.
fn serve_backward(model: &CausalLm, device: &Device, grads: &mut GradientsParams) -> Result<()> {
    let hidden = model.hidden_size();
    for l in (0..model.held_layers()).rev() {
        if let Some((_, mixture)) = model.expert_parallel_mixture(l) {
            merge(grads, mixture.serve_backward(hidden, device)?, model);
        }
    }
    Ok(())
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
/// not the forward's own reduction — and an expert-parallel mixture exchanges with `try_forward`,
/// so that a failed collective is an error here rather than NaN.
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
            let out = match (feed_forward, plain.expert_parallel_mixture(l)) {
                (true, Some((norm, mixture))) => {
                    mixture.try_forward(rms_norm_hf(norm, x.clone()))?
                }
                _ => plain.block(l, feed_forward, x.clone(), at),
            };
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
/// over a tensor-parallel group) added to `δ`. An expert-parallel mixture's block sends each
/// routed slot to its expert's rank and back, and adds the gradients of this rank's experts over
/// every rank's tokens. Returns `δ` at the first block's input.
fn backward_blocks(
    model: &CausalLm,
    shard: Option<&TensorShard>,
    inputs: Vec<Tensor<3>>,
    at: &LayerInputs,
    mut delta: Tensor<3>,
    grads: &mut GradientsParams,
) -> Result<Tensor<3>> {
    for (i, input) in inputs.into_iter().enumerate().rev() {
        let (l, feed_forward) = (i / 2, i % 2 == 1);
        let (dims, device) = (input.dims(), input.device());
        let [b, t, h] = dims;
        let leaf = input.autodiff().require_grad();
        let (surrogate, experts) = match (feed_forward, model.expert_parallel_mixture(l)) {
            (true, Some((norm, mixture))) => {
                let x = rms_norm_hf(norm, leaf.clone()).reshape([b * t, h]);
                let (surrogate, experts) =
                    mixture.expert_parallel_backward(x, delta.clone().reshape([b * t, h]))?;
                (surrogate, Some(experts))
            }
            _ => {
                let out = model.block(l, feed_forward, leaf.clone(), at);
                ((out * delta.clone().autodiff()).sum(), None)
            }
        };
        let backward = surrogate.backward();
        // A rank's part of a mixture whose experts got none of these tokens does not depend on
        // its input: its part of the input's gradient is zero (the group still sums it).
        let mine = leaf
            .grad(&backward)
            .unwrap_or_else(|| Tensor::zeros(dims, &device));
        merge(grads, GradientsParams::from_grads(backward, model), model);
        if let Some(experts) = experts {
            merge(grads, experts, model);
        }
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
/// [`blockwise_gradients`]: the forward runs the stage's blocks without a graph and keeps
/// each block's input; the backward re-runs each block from its input as a leaf, from the top
/// down, starting from the gradient of the stage's output from the stage after — or, on the last
/// stage, the objective's. One recomputed forward per block, and only the blocks' inputs kept
/// between a micro-batch's forward and its backward. A tensor-parallel stage's blocks are summed
/// over its group both ways, so the streams passed between stages are whole.
///
/// A stage whose mixtures are expert-parallel runs as many micro-batches as the pipeline with the
/// most: micro-batch `i` past its own `chunks` is idle — it serves its experts through the other
/// pipelines' exchanges and passes an empty stream on (and an empty gradient back), so that the
/// stages of its pipeline stay in step with it.
pub(crate) struct BurnStage<'a, 'c, F> {
    pub model: &'a CausalLm,
    pub plain: CausalLm,
    pub chunks: &'a [Chunk<'c>],
    pub first: bool,
    pub last: bool,
    /// The autodiff device (an idle micro-batch's experts' gradients).
    pub device: Device,
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

    /// What this stage passes on for an idle micro-batch: an empty stream (or gradient), or
    /// nothing at the end of the pipeline (`end`: the last stage forwards, the first backwards).
    fn empty(end: bool) -> Option<Vec<f32>> {
        (!end).then(Vec::new)
    }
}

/// What a stage's forward keeps for its backward: each block's input, and on the last stage
/// the last block's output (the objective's input); nothing for an idle micro-batch.
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
        let Some(chunk) = self.chunks.get(i) else {
            serve_forward(&self.plain, &self.device.clone().inner())?;
            let nothing = StageKept {
                inputs: Vec::new(),
                top: None,
            };
            return Ok((nothing, Self::empty(self.last)));
        };
        let plain_at = plain_inputs(&self.model.layer_inputs(&chunk.tokens));
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
        let StageKept { inputs, top } = kept;
        let Some(chunk) = self.chunks.get(i) else {
            serve_backward(self.model, &self.device, &mut self.grads)?;
            return Ok(Self::empty(self.first));
        };
        let at = self.model.layer_inputs(&chunk.tokens);
        let delta = match (output_grad, top) {
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
        let delta = backward_blocks(self.model, shard, inputs, &at, delta, &mut self.grads)?;
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
