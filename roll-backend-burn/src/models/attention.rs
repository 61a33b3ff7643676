//! Grouped-query causal self-attention over a padded batch, with the options the Qwen family
//! switches: bias on q/k/v and on the output projection, and Qwen3's per-head QK-RMSNorm.

use super::linear::linear_rows;
use super::norm::{rms_norm, rms_norm_hf};
use super::rope::Rope;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, RmsNorm};
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, Tensor};

/// The additive-free boolean attention mask for a padded batch: `true` = masked.
///
/// A query attends to keys at or before it that are real tokens. A padding query attends to
/// itself only, so no softmax row is empty (its output is garbage that nothing reads).
///
/// # Shapes
/// - `attention_mask`: `[batch, seq]` (`true` = real token)
/// - output: `[batch, 1, seq, seq]`
pub fn causal_padding_mask(attention_mask: &Tensor<2, Bool>) -> Tensor<4, Bool> {
    let [batch, seq] = attention_mask.dims();
    let device = attention_mask.device();
    let future = Tensor::<2, Bool>::tril_mask([seq, seq], 0, &device); // true where j > i
    let off_diagonal = Tensor::<2, Bool>::diag_mask([seq, seq], 0, &device); // false where j == i
    let pad_key = attention_mask
        .clone()
        .bool_not()
        .reshape([batch, 1, 1, seq]);
    future
        .reshape([1, 1, seq, seq])
        .expand([batch, 1, seq, seq])
        .bool_or(pad_key.expand([batch, 1, seq, seq]))
        .bool_and(
            off_diagonal
                .reshape([1, 1, seq, seq])
                .expand([batch, 1, seq, seq]),
        )
}

/// Grouped-query self-attention with optional q/k/v bias and optional per-head QK-RMSNorm
/// (Qwen3). Field names match HF checkpoint keys (`q_proj`, `k_proj`, `v_proj`, `o_proj`,
/// `q_norm`, `k_norm`).
#[derive(Module, Debug)]
pub struct Attention {
    /// Query projection, hidden → heads × head_dim.
    pub q_proj: Linear,
    /// Key projection, hidden → kv_heads × head_dim.
    pub k_proj: Linear,
    /// Value projection, hidden → kv_heads × head_dim.
    pub v_proj: Linear,
    /// Output projection, heads × head_dim → hidden.
    pub o_proj: Linear,
    /// RMSNorm over each query head (Qwen3).
    pub q_norm: Option<RmsNorm>,
    /// RMSNorm over each key head (Qwen3).
    pub k_norm: Option<RmsNorm>,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
}

/// Sizes and options of an [`Attention`] block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionSpec {
    /// Width of the residual stream.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Bias on q/k/v.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// QK-RMSNorm with this epsilon.
    pub qk_norm_eps: Option<f64>,
}

impl AttentionSpec {
    /// Builds the block with Burn's default initialisation.
    pub fn init(&self, device: &Device) -> Attention {
        let lin = |i, o, b| LinearConfig::new(i, o).with_bias(b).init(device);
        let norm = |eps| rms_norm(self.head_dim, eps, device);
        Attention {
            q_proj: lin(self.hidden, self.heads * self.head_dim, self.qkv_bias),
            k_proj: lin(self.hidden, self.kv_heads * self.head_dim, self.qkv_bias),
            v_proj: lin(self.hidden, self.kv_heads * self.head_dim, self.qkv_bias),
            o_proj: lin(self.heads * self.head_dim, self.hidden, self.o_bias),
            q_norm: self.qk_norm_eps.map(norm),
            k_norm: self.qk_norm_eps.map(norm),
            num_heads: self.heads,
            num_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }
}

impl Attention {
    /// Causal self-attention over a padded batch.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, hidden]`
    /// - `cos`/`sin`: `[batch, 1, seq, head_dim]` (from [`Rope::cos_sin`])
    /// - `mask`: `[batch, 1, seq, seq]`, `true` = masked (from [`causal_padding_mask`])
    /// - output: `[batch, seq, hidden]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        cos: &Tensor<4>,
        sin: &Tensor<4>,
        mask: &Tensor<4, Bool>,
    ) -> Tensor<3> {
        let [b, t, hidden] = x.dims();
        let (h, kvh, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let rep = h / kvh;
        // The projections run as 2-D GEMMs over all `b·t` rows.
        let x = x.reshape([b * t, hidden]);
        let heads = |y: Tensor<2>, n: usize| y.reshape([b, t, n, d]).swap_dims(1, 2);
        let mut q = heads(linear_rows(&self.q_proj, x.clone()), h);
        let mut k = heads(linear_rows(&self.k_proj, x.clone()), kvh);
        let v = heads(linear_rows(&self.v_proj, x), kvh);
        if let Some(norm) = &self.q_norm {
            q = rms_norm_hf(norm, q);
        }
        if let Some(norm) = &self.k_norm {
            k = rms_norm_hf(norm, k);
        }
        // Grouped-query attention without copying k/v for every query head (HF `repeat_kv`):
        // the `rep` query heads that share kv head `j` (heads `j·rep .. (j+1)·rep`) are stacked
        // along the sequence axis, so one `[rep·t, d] × [d, t]` product serves the whole group.
        // The softmax scale `1/√d`: when it is a power of two (`d` = 4, 16, 64, 256, ...) it is
        // folded into the query's rotary tables, exactly, which saves a pass over the `[t, t]`
        // scores; otherwise it scales the scores as HF does (folding would change the rounding).
        let scale = (d as f64).powf(-0.5);
        let exact = scale.log2().fract() == 0.0;
        let sin = Rope::signed_sin(sin);
        let q = if exact {
            Rope::rotate(
                q,
                &cos.clone().mul_scalar(scale),
                &sin.clone().mul_scalar(scale),
            )
        } else {
            Rope::rotate(q, cos, &sin)
        };
        let k = Rope::rotate(k, cos, &sin);
        let scores = q.reshape([b, kvh, rep * t, d]).matmul(k.swap_dims(2, 3));
        let scores = if exact {
            scores
        } else {
            scores.mul_scalar(scale)
        };
        let scores = scores.reshape([b, kvh, rep, t, t]);
        let mask = mask
            .clone()
            .reshape([b, 1, 1, t, t])
            .expand([b, kvh, rep, t, t]);
        let probs = softmax(scores.mask_fill(mask, f32::NEG_INFINITY), 4);
        let out = probs.reshape([b, kvh, rep * t, t]).matmul(v);
        let out = out
            .reshape([b, h, t, d])
            .swap_dims(1, 2)
            .reshape([b * t, h * d]);
        linear_rows(&self.o_proj, out).reshape([b, t, hidden])
    }
}
