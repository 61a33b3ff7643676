//! Tensor parallelism for Qwen2, Qwen3 and Qwen3-MoE (Megatron-LM: Shoeybi et al. 2019,
//! arXiv:1909.08053, §3; ROLL's Megatron `tensor_model_parallel_size`).
//!
//! Each rank `r` of a group of `W` holds `1/W` of every layer's attention heads and MLP width:
//! - `q_proj`, `k_proj`, `v_proj`, `gate_proj`, `up_proj` are split by output column (column
//!   parallel): rank `r` computes its heads' queries, keys and values and its units of the MLP;
//! - `o_proj` and `down_proj` are split by input row (row parallel): rank `r` turns its heads'
//!   (units') outputs into a partial sum of the block's output,
//!
//! so a head (a SwiGLU unit) never straddles two ranks, and one all-reduce per block completes
//! its output: `y = Σ_r o_r(attention_r(x))`, two all-reduces per layer.
//!
//! A mixture of experts divides its experts as [`ExpertSplit`] says — each expert sliced like an
//! MLP, or whole experts shared out among the ranks — and its shared expert like an MLP; its
//! router (and the shared expert's gate) stay whole. Either way the block's output is the sum of
//! the ranks' partial outputs, which the same all-reduce completes. Norms, the embedding and
//! the LM head stay whole on every rank, so every rank holds the same residual stream, log-probs
//! and loss. (A vocabulary-parallel head would save `vocab·hidden` floats per rank at the cost of
//! an all-reduce of the softmax's maximum and sum per position; on the models this runs on the CPU
//! the head is not what a rank runs out of, and a replicated head keeps the log-probs bitwise
//! equal to the engine's.)
//!
//! **One description, every path.** [`CausalLm::shard_tensors`](crate::CausalLm::shard_tensors)
//! slices the Burn model's own parameters (keeping their [`ParamId`]s);
//! every compute path then reads the sliced model and reduces at the same two points of a layer:
//! the Burn forward ([`DecoderLayer`](crate::models::DecoderLayer), any device), the CPU decoder
//! (scoring, and the fused training path's forward), and the fused training path's backward, which
//! adds the conjugate all-reduce — of the gradient entering each block's norm, summed over the
//! ranks' column-parallel inputs (Megatron's `f` operator).
//!
//! Every rank of the group runs each forward (and each training step) together, on the same
//! tokens. Burn's autodiff does not see the all-reduces (they go through host memory): on its
//! path (a GPU, `kernels = "autodiff"`) a sharded model trains block by block, the backward
//! re-running each block from its input and making the conjugate all-reduce by hand
//! ([`train`](crate::train)'s block-wise backward).

use super::attention::Attention;
use super::decoder::DecoderConfig;
use super::mlp::Mlp;
use crate::{BackendError, Result};
use burn::module::ParamId;
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorData};
use roll_core::strategy::{ReduceOp, Strategy};
use std::ops::Range;
use std::sync::Arc;

/// This rank's slice of a tensor-parallel model, and the group holding the other slices. Rank `r`
/// of `W` holds query heads `r·H/W .. (r+1)·H/W`, key/value heads `r·K/W .. (r+1)·K/W` and MLP
/// units `r·I/W .. (r+1)·I/W`.
#[derive(Clone)]
pub struct TensorShard {
    group: Arc<dyn Strategy>,
}

impl std::fmt::Debug for TensorShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorShard")
            .field("group", &self.group.name())
            .field("rank", &self.group.rank())
            .field("ranks", &self.group.world_size())
            .finish()
    }
}

impl TensorShard {
    /// This rank's slice of a model of `config` over `group`. (The feed-forward blocks check
    /// their own widths as they are sliced.)
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] naming the size that does not divide: query heads and
    /// key/value heads must each be a multiple of the group's size.
    pub(crate) fn new(group: Arc<dyn Strategy>, config: &DecoderConfig) -> Result<Self> {
        let shard = Self { group };
        shard.divides("query heads", config.num_attention_heads)?;
        shard.divides("key/value heads", config.num_key_value_heads)?;
        Ok(shard)
    }

    /// Checks that `n` (of `what`) divides evenly among the group's ranks.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] naming `n` and `what` when it does not.
    pub(crate) fn divides(&self, what: &str, n: usize) -> Result<()> {
        let ranks = self.ranks();
        if ranks == 0 || !n.is_multiple_of(ranks) {
            return Err(BackendError::InvalidInput(format!(
                "tensor parallelism over {ranks} ranks: {n} {what} do not divide evenly \
                 (each rank holds whole heads and an equal share)"
            )));
        }
        Ok(())
    }

    /// Ranks in the group.
    pub fn ranks(&self) -> usize {
        self.group.world_size()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The group holding the slices.
    pub(crate) fn group(&self) -> Arc<dyn Strategy> {
        self.group.clone()
    }

    /// This rank's share `r·n/W .. (r+1)·n/W` of `n` (heads, or units, or columns).
    pub fn slice(&self, n: usize) -> Range<usize> {
        let (r, w) = (self.rank(), self.ranks());
        r * n / w..(r + 1) * n / w
    }

    /// The sizes this rank's layers have: `config` with its heads and MLP width divided by the
    /// group's size.
    pub(crate) fn local_config(&self, config: &DecoderConfig) -> DecoderConfig {
        let w = self.ranks();
        DecoderConfig {
            num_attention_heads: config.num_attention_heads / w,
            num_key_value_heads: config.num_key_value_heads / w,
            intermediate_size: config.intermediate_size / w,
            ..config.clone()
        }
    }

    /// Sums `values` over the group in place (every rank gets the same sums).
    ///
    /// # Errors
    /// [`BackendError::Collective`] when the collective fails (another rank failed).
    pub(crate) fn all_reduce(&self, values: &mut [f32]) -> Result<()> {
        self.group
            .all_reduce(values, ReduceOp::Sum)
            .map_err(|e| BackendError::Collective(Box::new(e)))
    }

    /// `partial` (a tensor on any device) summed over the group, through host memory.
    ///
    /// # Errors
    /// A tensor that cannot be read, or a failed collective.
    pub(crate) fn summed<const D: usize>(&self, partial: Tensor<D>) -> Result<Tensor<D>> {
        let (shape, device) = (partial.shape(), partial.device());
        let mut values = partial
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .map_err(|e| BackendError::Train(format!("cannot read a partial sum: {e:?}")))?;
        self.all_reduce(&mut values)?;
        Ok(Tensor::from_data(TensorData::new(values, shape), &device))
    }

    /// A block's output from this rank's partial sum, on the Burn path. The forward has no error
    /// path: a failed collective (another rank failed, which MPI ends the job for) leaves NaN,
    /// which scoring refuses by name.
    pub(crate) fn reduce<const D: usize>(&self, partial: Tensor<D>) -> Tensor<D> {
        let (shape, device) = (partial.shape(), partial.device());
        self.summed(partial).unwrap_or_else(|e| {
            tracing::error!("tensor-parallel layer: {e}");
            Tensor::full(shape, f32::NAN, &device)
        })
    }

    /// This rank's part of an attention block: its query heads and their key/value heads
    /// (columns of q/k/v), and the rows of `o_proj` that read them. An output bias is added once,
    /// by rank 0.
    pub(crate) fn shard_attention(&self, a: Attention) -> Attention {
        let d = a.head_dim;
        let heads = self.slice(a.num_heads);
        let kv = self.slice(a.num_kv_heads);
        let columns = |h: &Range<usize>| h.start * d..h.end * d;
        Attention {
            q_proj: columns_of(a.q_proj, columns(&heads)),
            k_proj: columns_of(a.k_proj, columns(&kv)),
            v_proj: columns_of(a.v_proj, columns(&kv)),
            o_proj: self.rows_of(a.o_proj, columns(&heads)),
            q_norm: a.q_norm,
            k_norm: a.k_norm,
            num_heads: heads.len(),
            num_kv_heads: kv.len(),
            head_dim: d,
        }
    }

    /// This rank's part of a SwiGLU MLP: its units' columns of gate and up, their rows of down.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] when the group's size does not divide the MLP's units
    /// (`what` names them, e.g. `MLP width (intermediate_size)`).
    pub(crate) fn shard_mlp(&self, m: Mlp, what: &str) -> Result<Mlp> {
        let width = m.gate_proj.weight.dims()[1];
        self.divides(what, width)?;
        let units = self.slice(width);
        Ok(Mlp {
            gate_proj: columns_of(m.gate_proj, units.clone()),
            up_proj: columns_of(m.up_proj, units.clone()),
            down_proj: self.rows_of(m.down_proj, units),
        })
    }

    /// A row-parallel layer's slice: input rows `rows` of its weight; its bias on rank 0 only
    /// (the all-reduce adds it once).
    fn rows_of(&self, l: Linear, rows: Range<usize>) -> Linear {
        let out = l.weight.dims()[1];
        Linear {
            weight: l.weight.map(|w| copied(w.slice([rows, 0..out]))),
            bias: l.bias.filter(|_| self.rank() == 0),
        }
    }

    /// The ids of the parameters of an attention block that a rank holds a slice of (its
    /// norms are whole on every rank).
    pub(crate) fn sliced_attention_params(a: &Attention) -> Vec<ParamId> {
        [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]
            .into_iter()
            .flat_map(linear_params)
            .collect()
    }
}

/// The ids of a linear layer's weight and bias.
pub(crate) fn linear_params(l: &Linear) -> Vec<ParamId> {
    std::iter::once(l.weight.id)
        .chain(l.bias.as_ref().map(|b| b.id))
        .collect()
}

/// How a tensor-parallel mixture of experts divides its experts among the group's ranks (its
/// attention is divided by heads either way, its router stays whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertSplit {
    /// Every expert divided like a dense MLP, each rank holding its share of every expert's
    /// units (Megatron's expert tensor parallelism; config `model.expert_parallel = 1`).
    #[default]
    Sliced,
    /// Each rank of `W` holds `1/W` of the experts, whole (expert parallelism over the
    /// tensor-parallel group; config `model.expert_parallel = model.tensor_parallel`). The
    /// group sees the same tokens, so no token travels: each rank runs its experts on the
    /// tokens routed to them and the block's all-reduce combines the experts' weighted outputs
    /// (Megatron's all-gather token dispatcher). Fewer and larger products than `Sliced`.
    Whole,
}

/// A column-parallel layer's slice: output columns `columns` of its weight and bias.
fn columns_of(l: Linear, columns: Range<usize>) -> Linear {
    let inputs = l.weight.dims()[0];
    let bias_columns = columns.clone();
    Linear {
        weight: l.weight.map(|w| copied(w.slice([0..inputs, columns]))),
        bias: l.bias.map(|b| b.map(|b| copied(b.slice([bias_columns])))),
    }
}

/// A copy of `t`'s values (a slice would keep the whole tensor alive).
fn copied<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    let device = t.device();
    Tensor::from_data(t.into_data(), &device)
}
