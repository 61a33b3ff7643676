//! Pieces every Qwen-family decoder shares: the token batch (ids, padding mask, position ids),
//! HuggingFace-style rotary embeddings, grouped-query self-attention with optional QK-RMSNorm,
//! and the SwiGLU MLP.
//!
//! Everything computes in the dtype of its weights (f32 by default) and follows HF transformers'
//! formulas term by term, so that logits agree with PyTorch to float round-off.

use crate::{BackendError, Result};
use burn::module::Module;
use burn::nn::{Embedding, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

/// Which side of a batch row holds the padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PaddingSide {
    /// Padding before the tokens (what generation uses: every row ends at the last column).
    #[default]
    Left,
    /// Padding after the tokens.
    Right,
}

/// A padded batch of token sequences, ready for a model's `forward`.
///
/// Padding never changes a real token's result: padded keys are masked out of attention and
/// position ids count only real tokens, so each row is computed exactly as if it were alone.
#[derive(Debug, Clone)]
pub struct TokenBatch {
    /// Token ids, padding filled with `pad_id`. `[batch, seq]`.
    pub input_ids: Tensor<2, Int>,
    /// `true` where a real token is. `[batch, seq]`.
    pub attention_mask: Tensor<2, Bool>,
    /// Position of each token within its own sequence (0 for padding). `[batch, seq]`.
    pub position_ids: Tensor<2, Int>,
    /// Length of each sequence (real tokens).
    pub lengths: Vec<usize>,
    /// Where the padding is.
    pub padding: PaddingSide,
}

impl TokenBatch {
    /// Pads `sequences` to a common length on `padding`'s side.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if there are no sequences or one is empty,
    /// [`BackendError::TokenOutOfVocab`] if an id is `>= vocab_size`.
    pub fn new<S: AsRef<[u32]>>(
        sequences: &[S],
        padding: PaddingSide,
        pad_id: u32,
        vocab_size: usize,
        device: &Device,
    ) -> Result<Self> {
        if sequences.is_empty() {
            return Err(BackendError::InvalidInput("no sequences to batch".into()));
        }
        let lengths: Vec<usize> = sequences.iter().map(|s| s.as_ref().len()).collect();
        if lengths.contains(&0) {
            return Err(BackendError::InvalidInput("empty token sequence".into()));
        }
        let width = lengths.iter().copied().max().unwrap_or(0);
        let batch = sequences.len();
        let mut ids = vec![i32::try_from(pad_id).unwrap_or(0); batch * width];
        let mut mask = vec![false; batch * width];
        let mut pos = vec![0i32; batch * width];
        for (row, seq) in sequences.iter().enumerate() {
            let seq = seq.as_ref();
            let offset = match padding {
                PaddingSide::Left => width - seq.len(),
                PaddingSide::Right => 0,
            };
            for (t, &id) in seq.iter().enumerate() {
                let id = check_id(id, vocab_size)?;
                let at = row * width + offset + t;
                ids[at] = id;
                mask[at] = true;
                pos[at] = i32::try_from(t).map_err(|_| {
                    BackendError::InvalidInput(format!("sequence of {} tokens", seq.len()))
                })?;
            }
        }
        Ok(Self {
            input_ids: Tensor::from_data(TensorData::new(ids, [batch, width]), device),
            attention_mask: Tensor::from_data(TensorData::new(mask, [batch, width]), device),
            position_ids: Tensor::from_data(TensorData::new(pos, [batch, width]), device),
            lengths,
            padding,
        })
    }

    /// One unpadded sequence.
    ///
    /// # Errors
    /// As [`TokenBatch::new`].
    pub fn single(ids: &[u32], vocab_size: usize, device: &Device) -> Result<Self> {
        Self::new(&[ids], PaddingSide::Right, 0, vocab_size, device)
    }

    /// Column of token `t` of row `row` in the padded layout.
    pub fn column(&self, row: usize, t: usize) -> usize {
        let width = self.lengths.iter().copied().max().unwrap_or(0);
        match self.padding {
            PaddingSide::Left => width - self.lengths[row] + t,
            PaddingSide::Right => t,
        }
    }
}

/// Checks a token id against the vocabulary and converts it for an Int tensor.
pub(crate) fn check_id(id: u32, vocab_size: usize) -> Result<i32> {
    if (id as usize) < vocab_size
        && let Ok(v) = i32::try_from(id)
    {
        return Ok(v);
    }
    Err(BackendError::TokenOutOfVocab { id, vocab_size })
}

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

/// Rotary position embedding as HF computes it (`rotate_half`: pairs `(i, i + d/2)`, not Burn's
/// interleaved pairs).
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// Frequencies `1 / theta^(2i/d)` for `i < d/2`, computed in f32 as HF does.
    pub fn new(head_dim: usize, theta: f64) -> Self {
        let half = head_dim / 2;
        let inv_freq = (0..half)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                1.0 / (theta as f32).powf(exponent)
            })
            .collect();
        Self { inv_freq }
    }

    /// `cos` and `sin` tables for the given positions.
    ///
    /// # Shapes
    /// - `position_ids`: `[batch, seq]`
    /// - output: two `[batch, 1, seq, head_dim]`
    pub fn cos_sin(&self, position_ids: &Tensor<2, Int>) -> (Tensor<4>, Tensor<4>) {
        let [batch, seq] = position_ids.dims();
        let device = position_ids.device();
        let half = self.inv_freq.len();
        let inv = Tensor::<1>::from_data(TensorData::new(self.inv_freq.clone(), [half]), &device)
            .reshape([1, 1, half]);
        let freqs = position_ids.clone().float().reshape([batch, seq, 1]) * inv;
        let emb = Tensor::cat(vec![freqs.clone(), freqs], 2).reshape([batch, 1, seq, 2 * half]);
        (emb.clone().cos(), emb.sin())
    }

    /// Rotates `x` by the positions' angles: `x * cos + rotate_half(x) * sin`.
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`, `cos`/`sin`: `[batch, 1, seq, head_dim]`
    /// - output: like `x`
    pub fn apply(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
        let [b, h, t, d] = x.dims();
        let half = d / 2;
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        debug_assert_eq!(rotated.dims(), [b, h, t, d]);
        x * cos.clone() + rotated * sin.clone()
    }

    /// The sine table with `rotate_half`'s sign folded in: `[−sin(first half), sin(second half)]`,
    /// for [`Rope::rotate`].
    ///
    /// # Shapes
    /// - `sin`: `[batch, 1, seq, head_dim]`
    /// - output: like `sin`
    pub fn signed_sin(sin: &Tensor<4>) -> Tensor<4> {
        let half = sin.dims()[3] / 2;
        Tensor::cat(
            vec![
                sin.clone().narrow(3, 0, half).neg(),
                sin.clone().narrow(3, half, half),
            ],
            3,
        )
    }

    /// [`Rope::apply`] with the sign of `rotate_half` already in the sine table (from
    /// [`Rope::signed_sin`]): `x * cos + swap_halves(x) * signed_sin`, one pass fewer and the
    /// same values (a sign flip is exact).
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`, `cos`/`signed_sin`: `[batch, 1, seq, head_dim]`
    /// - output: like `x`
    pub fn rotate(x: Tensor<4>, cos: &Tensor<4>, signed_sin: &Tensor<4>) -> Tensor<4> {
        let half = x.dims()[3] / 2;
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(3, half, half),
                x.clone().narrow(3, 0, half),
            ],
            3,
        );
        x * cos.clone() + swapped * signed_sin.clone()
    }
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
#[derive(Debug, Clone, Copy)]
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
        let norm = |eps| {
            RmsNormConfig::new(self.head_dim)
                .with_epsilon(eps)
                .init(device)
        };
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

/// `x · W (+ b)` of a [`Linear`] layer on a matrix of rows, as one 2-D GEMM.
///
/// The same arithmetic as [`Linear::forward`], spelled out so that the forward and above all
/// the backward pass (`dx = dy · Wᵀ`, `dW = xᵀ · dy`) run as plain 2-D matrix products.
///
/// # Shapes
/// - `x`: `[rows, d_in]`
/// - output: `[rows, d_out]`
pub fn linear_rows(linear: &Linear, x: Tensor<2>) -> Tensor<2> {
    let y = x.matmul(linear.weight.val());
    match &linear.bias {
        Some(bias) => y + bias.val().unsqueeze_dim(0),
        None => y,
    }
}

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

/// An RMSNorm of width `d` with epsilon `eps`.
pub(crate) fn rms_norm(d: usize, eps: f64, device: &Device) -> RmsNorm {
    RmsNormConfig::new(d).with_epsilon(eps).init(device)
}

/// Checks the head arithmetic shared by all Qwen configs.
pub(crate) fn check_heads(
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> Result<()> {
    if heads == 0 || kv_heads == 0 || head_dim == 0 || hidden == 0 {
        return Err(BackendError::InvalidConfig(
            "hidden_size, heads, kv heads and head_dim must be positive".into(),
        ));
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(BackendError::InvalidConfig(format!(
            "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )));
    }
    if !head_dim.is_multiple_of(2) {
        return Err(BackendError::InvalidConfig(format!(
            "head_dim {head_dim} must be even for RoPE"
        )));
    }
    Ok(())
}

/// RMSNorm exactly as HF computes it: `weight * (x * rsqrt(mean(x²) + eps))`.
///
/// Burn's `RmsNorm::forward` divides by the root instead of multiplying by its reciprocal;
/// the two differ in the last bit, which adds up over a deep network. The parameter still lives
/// in Burn's `RmsNorm` (`gamma`), so checkpoints map as usual.
///
/// # Shapes
/// - `x`: `[..., d]`
/// - output: `[..., d]`
pub fn rms_norm_hf<const D: usize>(norm: &RmsNorm, x: Tensor<D>) -> Tensor<D> {
    let inv_rms = (x.clone().square().mean_dim(D - 1) + norm.epsilon)
        .sqrt()
        .recip();
    norm.gamma.val().unsqueeze() * (x * inv_rms)
}

/// Logits from final hidden states: through `lm_head`, or — for tied embeddings — through the
/// transposed embedding matrix.
///
/// # Shapes
/// - `hidden`: `[batch, seq, hidden]`
/// - output: `[batch, seq, vocab]`
pub(crate) fn lm_logits(
    lm_head: Option<&Linear>,
    embed: &Embedding,
    hidden: Tensor<3>,
) -> Tensor<3> {
    let [b, t, h] = hidden.dims();
    let rows = hidden.reshape([b * t, h]);
    // 2-D GEMMs: a batched product against a broadcast `[1, h, vocab]` weight costs ~30% more
    // forward and ~2x more backward (the weight gradient is summed over a `[b, h, vocab]` stack).
    let logits = match lm_head {
        Some(head) => linear_rows(head, rows),
        None => {
            // `embedᵀ` copied contiguous: a transposed view would let small products take
            // gemm's dot-product kernel, whose rounding differs from the big ones', so a row's
            // logits would depend (in the last bits) on how many rows share the batch.
            let [vocab, _] = embed.weight.dims();
            let weight = embed.weight.val().transpose().reshape([h * vocab]);
            rows.matmul(weight.reshape([h, vocab]))
        }
    };
    let vocab = logits.dims()[1];
    logits.reshape([b, t, vocab])
}
