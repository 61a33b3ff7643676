//! Pipeline parallelism for Qwen2, Qwen3 and Qwen3-MoE (GPipe: Huang et al. 2019, arXiv:1811.06965;
//! the one-forward-one-backward schedule of PipeDream-Flush: Narayanan et al. 2021,
//! arXiv:2006.09503, as Megatron-LM runs it; ROLL's `pipeline_model_parallel_size`).
//!
//! Stage `s` of `P` holds decoder layers `⌊s·L/P⌋ .. ⌊(s+1)·L/P⌋`. A micro-batch's residual
//! stream leaves one stage and enters the next as a message (point to point, over a
//! [`Messenger`]); its gradient travels back the same way. The first stage embeds the tokens, the
//! last runs the final norm, the LM head and the objective. The embedding, the final norm and the
//! LM head stay on every stage (so a tied head needs no extra exchange): their gradients, made on
//! the first and the last stage, are summed over the stages before the update, which keeps them
//! equal everywhere.
//!
//! With tensor parallelism too (Megatron's "3D" layout without the third), a copy of the model
//! is `P` stages of `T` ranks: rank `s·T + t` holds slice `t` of stage `s`'s layers
//! ([`tensor_pipeline_groups`] forms the groups). Each stage's ranks run its layers together as a
//! tensor-parallel group, whose blocks end in an all-reduce, so every rank of a stage has the
//! whole stream: rank `t` of one stage sends it to rank `t` of the next, and the gradient back.
//!
//! Which micro-batch a stage runs when is [`one_forward_one_backward`]: each stage runs as many
//! forwards as there are stages after it before its first backward, then alternates, so at most
//! `P − s` micro-batches' activations are alive on stage `s` at once (GPipe keeps all of them).
//!
//! A stage model trains ([`Trainer`](crate::train::Trainer)) on the fused CPU path (dense), or on
//! Burn's autodiff path (a GPU, a mixture of experts) block by block, re-running each block with
//! its graph in the backward from the input it kept; every stage takes each step together on the
//! same batch. It does not run a whole forward
//! (scoring, an inference engine, saving need every layer and are refused; gather first,
//! [`CausalLm::gather`](crate::CausalLm::gather)).

use crate::{BackendError, Result};
use roll_core::strategy::Messenger;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a stage waits for a neighbour's message before it reports the neighbour as stuck.
const NEIGHBOUR_TIMEOUT: Duration = Duration::from_secs(600);

/// This process's stage of a pipeline-parallel model, and the link to the other stages (stage
/// `s` is rank `s` of the link).
#[derive(Clone)]
pub struct PipelineStage {
    link: Arc<dyn Messenger>,
    layers: Range<usize>,
}

impl std::fmt::Debug for PipelineStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineStage")
            .field("stage", &self.stage())
            .field("stages", &self.stages())
            .field("layers", &self.layers)
            .finish()
    }
}

/// The groups of one copy of a model divided both ways, `copy.world_size() / tensor` pipeline
/// stages of `tensor` tensor-parallel ranks each, rank `s·tensor + t` of `copy` holding slice `t`
/// of stage `s` (Megatron's order, the slices of a stage on neighbouring ranks): this rank's
/// stage's tensor-parallel group, and its link to the ranks holding the same slice of the other
/// stages. For [`CausalLm::split_stages`](crate::CausalLm::split_stages) (the link) and
/// [`CausalLm::shard_tensors`](crate::CausalLm::shard_tensors) (the group), in either order — or
/// [`CausalLm::shard_experts`](crate::CausalLm::shard_experts) after the split, where the
/// `tensor` ranks of a stage are as many pipelines dividing the stage's experts.
/// A collective: every rank of `copy` calls it.
///
/// # Errors
/// [`BackendError::InvalidInput`] when `tensor` is 0 or does not divide the copy's ranks, and a
/// failed collective.
pub fn tensor_pipeline_groups(
    copy: &Arc<dyn Messenger>,
    tensor: usize,
) -> Result<(Arc<dyn Messenger>, Arc<dyn Messenger>)> {
    let ranks = copy.world_size();
    if tensor == 0 || !ranks.is_multiple_of(tensor) {
        return Err(BackendError::InvalidInput(format!(
            "{ranks} ranks cannot form pipeline stages of {tensor} ranks each"
        )));
    }
    let stages = ranks / tensor;
    let subgroup = |members: Vec<usize>| {
        copy.subgroup(&members)
            .map_err(|e| BackendError::Collective(Box::new(e)))
    };
    // Every rank forms every group, in the same order; each keeps its own.
    let mut slices = None;
    for s in 0..stages {
        slices = slices.or(subgroup((s * tensor..(s + 1) * tensor).collect())?);
    }
    let mut link = None;
    for t in 0..tensor {
        link = link.or(subgroup((t..ranks).step_by(tensor).collect())?);
    }
    slices.zip(link).ok_or_else(|| {
        BackendError::InvalidInput(format!(
            "rank {} is in no group of its copy of {ranks} ranks",
            copy.rank()
        ))
    })
}

/// The layers stage `stage` of `stages` holds of a model of `num_layers` layers:
/// `⌊s·L/P⌋ .. ⌊(s+1)·L/P⌋` (the larger blocks last).
pub(crate) fn stage_layers(stage: usize, stages: usize, num_layers: usize) -> Range<usize> {
    stage * num_layers / stages..(stage + 1) * num_layers / stages
}

/// Refuses more stages than `num_layers` (or none): each stage needs at least one layer.
pub(crate) fn check_stages(stages: usize, num_layers: usize) -> Result<()> {
    if stages == 0 || stages > num_layers {
        return Err(BackendError::InvalidInput(format!(
            "{stages} pipeline stages for {num_layers} layers: each stage needs at least one"
        )));
    }
    Ok(())
}

/// One step of a stage's schedule: the forward or the backward of a micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipelineOp {
    /// The forward of micro-batch `i`.
    Forward(usize),
    /// The backward of micro-batch `i`.
    Backward(usize),
}

/// Stage `stage` of `stages`'s order of work over `micro_batches` micro-batches, one forward one
/// backward: `min(stages − stage − 1, micro_batches)` forwards (warm-up), then forward and
/// backward in turn, then the remaining backwards (cool-down). Every micro-batch's forward comes
/// before its backward, and each stage runs the micro-batches in order both ways.
pub fn one_forward_one_backward(
    stage: usize,
    stages: usize,
    micro_batches: usize,
) -> Vec<PipelineOp> {
    let warmup = (stages.saturating_sub(stage + 1)).min(micro_batches);
    let mut ops: Vec<PipelineOp> = (0..warmup).map(PipelineOp::Forward).collect();
    for i in 0..micro_batches - warmup {
        ops.push(PipelineOp::Forward(warmup + i));
        ops.push(PipelineOp::Backward(i));
    }
    ops.extend((micro_batches - warmup..micro_batches).map(PipelineOp::Backward));
    ops
}

/// What a stage computes for one micro-batch, on whichever kernels: the forward from its input
/// (the stage before's output; `None` on the first stage) to its output (`None` on the last),
/// keeping what its backward reads; the backward from the gradient of its output (`None` on the
/// last stage, which runs the objective) to the gradient of its input (`None` on the first).
/// Streams and their gradients travel as flat `f32`s.
pub(crate) trait StageCompute {
    /// What a forward keeps for its backward.
    type Kept;

    /// The forward of micro-batch `i`.
    fn forward(
        &mut self,
        i: usize,
        input: Option<Vec<f32>>,
    ) -> Result<(Self::Kept, Option<Vec<f32>>)>;

    /// The backward of micro-batch `i`.
    fn backward(
        &mut self,
        i: usize,
        kept: Self::Kept,
        output_grad: Option<Vec<f32>>,
    ) -> Result<Option<Vec<f32>>>;
}

impl PipelineStage {
    /// Runs `micro_batches` micro-batches through this stage in its schedule with `compute`:
    /// each forward's output goes to the next stage, each backward's input gradient to the one
    /// before.
    ///
    /// # Errors
    /// `compute`'s errors, and a neighbour that fails or sends nothing in time.
    pub(crate) fn run<C: StageCompute>(&self, micro_batches: usize, compute: &mut C) -> Result<()> {
        let ops = self.schedule(micro_batches);
        let mut kept = std::collections::HashMap::new();
        // Inputs received ahead of their forward (below).
        let mut early = std::collections::HashMap::new();
        for (k, &op) in ops.iter().enumerate() {
            match op {
                PipelineOp::Forward(i) => {
                    let input = match (self.is_first(), early.remove(&i)) {
                        (true, _) => None,
                        (false, Some(x)) => Some(x),
                        (false, None) => Some(self.receive(false)?),
                    };
                    let (state, output) = compute.forward(i, input)?;
                    if let (false, Some(output)) = (self.is_last(), output) {
                        self.send(true, &output)?;
                    }
                    kept.insert(i, state);
                }
                PipelineOp::Backward(i) => {
                    let state = kept.remove(&i).ok_or_else(|| {
                        BackendError::Train(format!("pipeline: no forward of micro-batch {i}"))
                    })?;
                    let output_grad = if self.is_last() {
                        None
                    } else {
                        Some(self.receive(true)?)
                    };
                    if let (false, Some(input_grad)) =
                        (self.is_first(), compute.backward(i, state, output_grad)?)
                    {
                        // The stage before sends the input of this stage's next forward before it
                        // waits for this gradient: take it first, or the two blocking sends (MPI)
                        // would wait for each other.
                        if let Some(&PipelineOp::Forward(j)) = ops.get(k + 1) {
                            early.insert(j, self.receive(false)?);
                        }
                        self.send(false, &input_grad)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Stage `link.rank()` of a pipeline of `link.world_size()` stages over a model of
    /// `num_layers` layers.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] when there are more stages than layers (a stage would hold
    /// none).
    pub(crate) fn new(link: Arc<dyn Messenger>, num_layers: usize) -> Result<Self> {
        let (s, p) = (link.rank(), link.world_size());
        check_stages(p, num_layers)?;
        Ok(Self {
            layers: stage_layers(s, p, num_layers),
            link,
        })
    }

    /// This stage's index.
    pub fn stage(&self) -> usize {
        self.link.rank()
    }

    /// Stages in the pipeline.
    pub fn stages(&self) -> usize {
        self.link.world_size()
    }

    /// The decoder layers this stage holds (indices in the whole model).
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Whether this stage embeds the tokens.
    pub fn is_first(&self) -> bool {
        self.stage() == 0
    }

    /// Whether this stage runs the LM head and the objective.
    pub fn is_last(&self) -> bool {
        self.stage() + 1 == self.stages()
    }

    /// This stage's schedule over `micro_batches` micro-batches.
    pub fn schedule(&self, micro_batches: usize) -> Vec<PipelineOp> {
        one_forward_one_backward(self.stage(), self.stages(), micro_batches)
    }

    /// Sends `values` to the next stage (`+1`) or the previous one (`-1`).
    pub(crate) fn send(&self, next: bool, values: &[f32]) -> Result<()> {
        let to = self.neighbour(next);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.link
            .send(to, &bytes)
            .map_err(|e| self.failed(to, &e.to_string()))
    }

    /// The next message from the next stage or the previous one.
    pub(crate) fn receive(&self, next: bool) -> Result<Vec<f32>> {
        let from = self.neighbour(next);
        let start = Instant::now();
        loop {
            let waited = start.elapsed();
            if waited >= NEIGHBOUR_TIMEOUT {
                return Err(self.failed(from, &format!("nothing came in {waited:?}")));
            }
            match self.link.receive(from, Duration::from_secs(1)) {
                Ok(Some(bytes)) => {
                    return Ok(bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect());
                }
                Ok(None) => {}
                Err(e) => return Err(self.failed(from, &e.to_string())),
            }
        }
    }

    /// The pipeline's group, for the collectives of a training step.
    pub(crate) fn group(&self) -> Arc<dyn roll_core::strategy::Strategy> {
        self.link.clone()
    }

    fn neighbour(&self, next: bool) -> usize {
        if next {
            self.stage() + 1
        } else {
            self.stage().saturating_sub(1)
        }
    }

    fn failed(&self, neighbour: usize, reason: &str) -> BackendError {
        BackendError::Pipeline {
            stage: self.stage(),
            neighbour,
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PipelineOp::{Backward as B, Forward as F};
    use super::*;

    #[test]
    fn one_forward_one_backward_by_hand() {
        // Two stages, three micro-batches: stage 0 runs one forward ahead.
        assert_eq!(
            one_forward_one_backward(0, 2, 3),
            [F(0), F(1), B(0), F(2), B(1), B(2)]
        );
        assert_eq!(
            one_forward_one_backward(1, 2, 3),
            [F(0), B(0), F(1), B(1), F(2), B(2)]
        );
        // Four stages, two micro-batches: the warm-up is cut to the micro-batches there are.
        assert_eq!(one_forward_one_backward(0, 4, 2), [F(0), F(1), B(0), B(1)]);
        assert_eq!(one_forward_one_backward(2, 4, 2), [F(0), F(1), B(0), B(1)]);
        assert_eq!(one_forward_one_backward(3, 4, 2), [F(0), B(0), F(1), B(1)]);
        assert!(one_forward_one_backward(0, 2, 0).is_empty());
        // Every micro-batch once each way, forward first, on every stage.
        for (s, p, m) in [(0, 3, 5), (1, 3, 5), (2, 3, 5), (0, 1, 4)] {
            let ops = one_forward_one_backward(s, p, m);
            assert_eq!(ops.len(), 2 * m);
            for i in 0..m {
                let f = ops.iter().position(|&o| o == F(i)).unwrap();
                let b = ops.iter().position(|&o| o == B(i)).unwrap();
                assert!(f < b, "stage {s} of {p}: micro-batch {i}");
            }
            // At most `p − s` micro-batches in flight.
            let mut live = 0i64;
            let mut peak = 0;
            for op in ops {
                live += if matches!(op, F(_)) { 1 } else { -1 };
                peak = peak.max(live);
            }
            assert!(peak as usize <= p - s, "stage {s} of {p}: {peak} in flight");
        }
    }
}
