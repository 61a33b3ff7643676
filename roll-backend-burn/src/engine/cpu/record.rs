//! What a forward of the decoder can hand out as it runs, for the training path to keep.
//!
//! The fused training forward (`train::fused`) *is* the decoder's forward: it runs
//! [`CpuDecoder::forward_recorded`](super::CpuDecoder::forward_recorded) with a recorder that
//! keeps the activations its backward reads. So the log-probs a training step computes are the
//! bits the engine sampled with, by construction. Inference records nothing (`()`), and the
//! hooks compile away.
//!
//! A block's intermediate values are handed over by value once the forward is done with them
//! (the recorder keeps the buffers themselves, no copy); only the residual stream, which the
//! forward goes on adding to, is lent.

/// Hooks called by the decoder's forward, per layer, in this order. Transposed values (`…_t`)
/// are `[features, tokens]`; the others `[tokens, features]`.
pub(crate) trait Recorder {
    /// Whether [`AttentionBlock::probs`] holds the attention probabilities (they cost
    /// `heads · (position + 1)` floats per token to keep).
    const KEEPS_PROBS: bool;

    /// The residual stream entering the layer (`x_t`, `[hidden, tokens]`).
    fn attention_input(&mut self, _x_t: &[f32]) {}

    /// The `q|k|v` projection per token (`[tokens, (heads + 2·kv_heads)·head_dim]`), before the
    /// QK-norm and the rotary embedding.
    fn qkv_projected(&mut self, _qkv: &[f32]) {}

    /// The attention block's values, once the forward no longer reads them.
    fn attention(&mut self, _block: AttentionBlock) {}

    /// The residual stream after the attention block, entering the MLP's (`[hidden, tokens]`).
    fn mlp_input(&mut self, _x_t: &[f32]) {}

    /// The MLP block's values, once the forward no longer reads them.
    fn mlp(&mut self, _block: MlpBlock) {}
}

/// What a layer's attention block computed.
pub(crate) struct AttentionBlock {
    /// The input's RMSNorm, `[hidden, tokens]`: what the `q|k|v` projection read.
    pub normed_t: Vec<f32>,
    /// The norm's reciprocal root of each token.
    pub inv_rms: Vec<f32>,
    /// `q|k|v` per token as attention read them (QK-normed, rotated),
    /// `[tokens, (heads + 2·kv_heads)·head_dim]`.
    pub qkv: Vec<f32>,
    /// Per token, its probabilities `[heads, position + 1]` (empty unless
    /// [`Recorder::KEEPS_PROBS`]).
    pub probs: Vec<Vec<f32>>,
    /// The attention output, `[heads·head_dim, tokens]`: what the `o` projection read.
    pub out_t: Vec<f32>,
}

/// What a layer's MLP block computed.
pub(crate) struct MlpBlock {
    /// The input's RMSNorm, `[hidden, tokens]`: what the `gate|up` projection read.
    pub normed_t: Vec<f32>,
    /// The norm's reciprocal root of each token.
    pub inv_rms: Vec<f32>,
    /// The `gate|up` projection, `[2·inter, tokens]` (the gate rows, then the up rows).
    pub gate_up_t: Vec<f32>,
    /// `silu(gate)·up`, `[inter, tokens]`: what the `down` projection read.
    pub act_t: Vec<f32>,
}

/// Inference keeps nothing: the blocks' buffers go back to the pool ([`super::scratch`]).
impl Recorder for () {
    const KEEPS_PROBS: bool = false;

    fn attention(&mut self, block: AttentionBlock) {
        let AttentionBlock {
            normed_t,
            inv_rms: _,
            qkv,
            probs: _,
            out_t,
        } = block;
        [normed_t, qkv, out_t]
            .into_iter()
            .for_each(super::scratch::recycle);
    }

    fn mlp(&mut self, block: MlpBlock) {
        let MlpBlock {
            normed_t,
            inv_rms: _,
            gate_up_t,
            act_t,
        } = block;
        [normed_t, gate_up_t, act_t]
            .into_iter()
            .for_each(super::scratch::recycle);
    }
}
