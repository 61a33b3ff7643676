//! The fused CPU training path for dense Qwen2/Qwen3: a forward over packed sequences that keeps
//! exactly the activations its backward reads, and an analytic backward — RMSNorm, rotary
//! embedding, causal grouped-query attention, SwiGLU, residuals, and the LM head fused with the
//! log-prob/entropy of each trained position a chunk of rows at a time (no `[tokens, vocab]`
//! tensor is kept). GEMMs run on roll's CPU GEMM (the decoder's); element-wise work is spread over rayon.
//!
//! **The forward is the inference engine's.** It runs the CPU decoder's own forward
//! ([`CpuDecoder::forward_recorded`](crate::engine::cpu::CpuDecoder::forward_recorded)) on the
//! trainer's current weights, every sequence prefilled from position 0, with a
//! [`Recorder`](crate::engine::cpu::Recorder) that copies what the backward reads; the log-probs
//! come from the decoder's LM head and the log-prob formula the sampler reports with. So the
//! log-probs a training step computes are, bit for bit, those the engine sampled with on the same
//! weights: the train–inference gap is 0 by construction on the CPU, not by tolerance (the
//! decoder is batch-invariant, so packing, prefill and decode all give the same bits). The
//! backward is free to sum in other orders; it is checked against finite differences and Burn's
//! autodiff.
//!
//! Why: on the CPU, Burn's autodiff path spends most of a training step outside the GEMMs —
//! per-op dispatch, fresh allocations, softmax decomposed into several recorded ops, a gradient
//! graph built and walked every step. The fused path runs the same mathematics as a fixed
//! sequence of kernels.
//!
//! The objective itself is not duplicated: the policy loss is still roll-algos'
//! [`policy_objective`](roll_algos::loss::policy_objective) on Burn tensors, but over the
//! `[rows, T]` log-probs and entropies as leaves; its backward gives `∂loss/∂logp` and
//! `∂loss/∂H` per token, which the fused backward carries through the model. So every objective
//! roll-algos has (PPO, GSPO, TIS, KL losses, ...) trains on this path unchanged.
//!
//! Which path trains is decided by the model and the device ([`kernels_for`]): a dense
//! Qwen2/Qwen3 on the CPU (Flex) device runs here — the actor and the critic (whose value head
//! reads [`Tape::hidden_rows`](model::Tape) and whose backward enters at
//! [`backward_from_hidden`]), fully fine-tuned or with LoRA on the decoder layers (the forward
//! reads the merged weight; the adapters get `dA = scale·Xᵀ·(dY·Bᵀ)`, `dB = scale·(X·A)ᵀ·dY`, i.e.
//! `scale·dW·Bᵀ` and `scale·Aᵀ·dW` without forming `dW`); anything else
//! (Qwen3-MoE, LoRA on the embedding or the LM head, a GPU device) runs on Burn's autodiff, which
//! is also the reference the tests compare this path against.

mod attention;
mod grads;
mod head;
mod mm;
mod model;
mod norm;
mod rope;
mod swiglu;
#[cfg(test)]
mod testing;
mod weights;

pub(crate) use grads::GradSink;
pub(crate) use model::{
    Outputs, Packed, StageGrad, Tape, backward, backward_from_hidden, backward_stage, forward,
};
pub(crate) use weights::{Weights, extract, vector};

use super::{TrainKernels, TrainerConfig};
use crate::engine::cpu::computed_once;
use crate::{BackendError, CausalLm, Device, Result};
use burn::tensor::{Tensor, TensorData};
use roll_core::TrainSequence;
use std::collections::HashMap;

/// The kernels a trainer with `config` runs for `model` on `device`: [`TrainKernels::Auto`] (this
/// path) for a dense Qwen2/Qwen3 on the CPU (Flex) device — LoRA included unless it adapts the
/// embedding or the LM head — when the config allows it, [`TrainKernels::Autodiff`] otherwise.
pub(crate) fn kernels_for(
    config: &TrainerConfig,
    device: &Device,
    model: &CausalLm,
) -> TrainKernels {
    let lora_covered = config.lora.as_ref().is_none_or(|l| {
        l.target_modules
            .iter()
            .all(|t| t != "lm_head" && t != "embed_tokens")
    });
    let covered =
        lora_covered && *device == Device::flex() && !matches!(model, CausalLm::Qwen3Moe(_));
    match config.kernels {
        TrainKernels::Auto if covered => TrainKernels::Auto,
        _ => TrainKernels::Autodiff,
    }
}

/// The micro-batch's sequences packed end to end, each scored over its response (the scored
/// rows in the order of `seqs`).
///
/// Sequences that share a prompt of two tokens or more (a GRPO group's samples) compute it once:
/// all of it but its last token is packed as a sequence of its own, which each of them continues
/// ([`Packed::push_after`]) from the prompt's last token on. That token's row predicts the first
/// response token, so each sequence keeps it: every scored row is its own sequence's. A group of
/// 8 samples of a 10-token prompt and 4-token responses packs 9 + 8·5 = 49 tokens instead of
/// 112. The log-probs keep their bits (the decoder reads the shared prompt's keys in the slots
/// it would have written them to); the gradients change only in summation order.
pub(crate) fn pack(seqs: &[&TrainSequence]) -> Packed {
    let mut sharing: HashMap<&[u32], usize> = HashMap::new();
    for s in seqs {
        *sharing.entry(s.prompt_ids.as_slice()).or_default() += 1;
    }
    let mut packed = Packed::default();
    let mut prompts: HashMap<&[u32], usize> = HashMap::new();
    for s in seqs {
        let prompt = s.prompt_ids.as_slice();
        let full = || [prompt, s.response_ids.as_slice()].concat();
        let before = computed_once(prompt);
        if before.is_empty() || sharing.get(prompt).is_none_or(|&n| n < 2) {
            packed.push(&full(), prompt.len());
            continue;
        }
        let last = &prompt[before.len()..];
        let parent = *prompts
            .entry(prompt)
            .or_insert_with(|| packed.push(before, before.len()));
        let own = [last, s.response_ids.as_slice()].concat();
        if packed.push_after(parent, &own, 1).is_none() {
            packed.push(&full(), prompt.len());
        }
    }
    packed
}

/// Per-response-token values (in [`pack`]'s row order) as a `[rows, width]` leaf on `device`
/// (zero in padding) that records its gradient: what the objective on Burn runs over.
pub(crate) fn leaf(
    values: &[f32],
    seqs: &[&TrainSequence],
    width: usize,
    device: &Device,
) -> Tensor<2> {
    let mut grid = vec![0.0; seqs.len() * width];
    let mut at = 0;
    for (r, s) in seqs.iter().enumerate() {
        let n = s.response_ids.len();
        grid[r * width..r * width + n].copy_from_slice(&values[at..at + n]);
        at += n;
    }
    Tensor::<2>::from_data(TensorData::new(grid, [seqs.len(), width]), device).require_grad()
}

/// The gradient of a [`leaf`] (`leaf.grad(..)`) back per response token, in [`pack`]'s row order;
/// zeros when it has none (the leaf did not reach the loss).
///
/// # Errors
/// [`BackendError::Train`] if the gradient cannot be read as f32.
pub(crate) fn leaf_grad(
    grad: Option<Tensor<2>>,
    seqs: &[&TrainSequence],
    width: usize,
) -> Result<Vec<f32>> {
    let tokens: usize = seqs.iter().map(|s| s.response_ids.len()).sum();
    let Some(grad) = grad else {
        return Ok(vec![0.0; tokens]);
    };
    let grid = grad
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| BackendError::Train(format!("fused path: cannot read a gradient: {e:?}")))?;
    let mut values = Vec::with_capacity(tokens);
    for (r, s) in seqs.iter().enumerate() {
        values.extend_from_slice(&grid[r * width..r * width + s.response_ids.len()]);
    }
    Ok(values)
}
