//! The SwiGLU feed-forward block of every dense Qwen layer (and of each Qwen3-MoE expert).

use super::decoder::FeedForwardBlock;
use super::linear::linear_rows;
use super::tensor_parallel::{ExpertSplit, TensorShard, linear_params};
use crate::Result;
use burn::module::{Module, ParamId};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::silu;
use burn::tensor::{Device, Tensor};

/// SwiGLU MLP: `down(silu(gate(x)) * up(x))`, no biases. Field names match HF keys.
#[derive(Module, Debug)]
pub struct Mlp {
    /// Gate projection, hidden → intermediate.
    pub gate_proj: Linear,
    /// Up projection, hidden → intermediate.
    pub up_proj: Linear,
    /// Down projection, intermediate → hidden.
    pub down_proj: Linear,
}

impl Mlp {
    /// A SwiGLU MLP of the given widths.
    pub fn init(hidden: usize, intermediate: usize, device: &Device) -> Self {
        let lin = |i, o| LinearConfig::new(i, o).with_bias(false).init(device);
        Self {
            gate_proj: lin(hidden, intermediate),
            up_proj: lin(hidden, intermediate),
            down_proj: lin(intermediate, hidden),
        }
    }

    /// # Shapes
    /// - `x`: `[..., hidden]`
    /// - output: `[..., hidden]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let mut dims = x.dims();
        let hidden = dims[D - 1];
        let rows = dims[..D - 1].iter().product();
        let x = x.reshape([rows, hidden]);
        let gate = silu(linear_rows(&self.gate_proj, x.clone()));
        let y = linear_rows(&self.down_proj, gate * linear_rows(&self.up_proj, x));
        dims[D - 1] = y.dims()[1];
        y.reshape(dims)
    }
}

impl FeedForwardBlock for Mlp {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        Mlp::forward(self, x)
    }

    fn dense(&self) -> Option<&Mlp> {
        Some(self)
    }

    fn shard_tensors(self, shard: &TensorShard, _: ExpertSplit) -> Result<Self> {
        shard.shard_mlp(self, "MLP width (intermediate_size)")
    }

    fn own_params(&self) -> Vec<ParamId> {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
            .into_iter()
            .flat_map(linear_params)
            .collect()
    }
}
