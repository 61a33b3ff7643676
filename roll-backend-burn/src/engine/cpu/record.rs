//! What a forward of the decoder can hand out as it runs, for the training path to keep.
//!
//! The fused training forward (`train::fused`) *is* the decoder's forward: it runs
//! [`CpuDecoder::forward_recorded`](super::CpuDecoder::forward_recorded) with a recorder that
//! copies the activations its backward reads. So the log-probs a training step computes are the
//! bits the engine sampled with, by construction. Inference records nothing (`()`), and the
//! hooks compile away.

/// Hooks called by the decoder's forward, per layer, in this order. Every slice is the value the
/// forward itself goes on with; transposed ones (`…_t`) are `[features, tokens]`.
pub(crate) trait Recorder {
    /// Whether [`Recorder::attention`] gets the attention probabilities (they cost
    /// `heads · (position + 1)` floats per token to keep).
    const KEEPS_PROBS: bool;

    /// The residual stream entering the layer, the attention's RMSNorm of it and the norm's
    /// reciprocal roots (one per token).
    fn attention_input(&mut self, _x_t: &[f32], _normed_t: &[f32], _inv_rms: &[f32]) {}

    /// The `q|k|v` projection per token (`[tokens, (heads + 2·kv_heads)·head_dim]`), before the
    /// QK-norm and the rotary embedding.
    fn qkv_projected(&mut self, _qkv: &[f32]) {}

    /// The same after the QK-norm and the rotary embedding: what attention reads.
    fn qkv_rotated(&mut self, _qkv: &[f32]) {}

    /// Per token, its probabilities `[heads, position + 1]` (empty unless
    /// [`Recorder::KEEPS_PROBS`]), and the attention output `[heads·head_dim, tokens]`.
    fn attention(&mut self, _probs: Vec<Vec<f32>>, _out_t: &[f32]) {}

    /// The residual stream after attention, the MLP's RMSNorm of it and its reciprocal roots.
    fn mlp_input(&mut self, _x_t: &[f32], _normed_t: &[f32], _inv_rms: &[f32]) {}

    /// The `gate|up` projection (`[2·inter, tokens]`) and `silu(gate)·up` (`[inter, tokens]`).
    fn mlp_hidden(&mut self, _gate_up_t: &[f32], _act_t: &[f32]) {}
}

impl Recorder for () {
    const KEEPS_PROBS: bool = false;
}
