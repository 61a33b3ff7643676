//! The dense Qwen decoder's forward over packed sequences, keeping exactly what its backward
//! reads (the tape), and the backward itself: every parameter's gradient from the gradients of
//! the per-position log-probs and entropies.

use super::attention::{self, Probs};
use super::grads::GradSink;
use super::head;
use super::mm::{self, Mat, MatRef, OutputGrad};
use super::norm;
use super::rope;
use super::swiglu;
use super::weights::{Projection, Weights};
use crate::engine::cpu::matrix::transpose;
use crate::engine::cpu::{AttentionBlock, MlpBlock, RecordedSeq, Recorder};
use crate::engine::cpu::{pool, scratch};
use crate::{BackendError, Result};

/// Sequences packed end to end, and the positions whose next token is scored.
#[derive(Debug, Clone, Default)]
pub(crate) struct Packed {
    /// Every token of every sequence, in order.
    pub tokens: Vec<u32>,
    /// Where each sequence lies in `tokens`, and which one it continues.
    pub seqs: Vec<PackedSeq>,
    /// Each token's position within its sequence (a continuation's counting the tokens it
    /// continues).
    pub positions: Vec<usize>,
    /// Indices into `tokens` of the positions that predict a scored token.
    pub rows: Vec<usize>,
    /// The token each of `rows` predicts.
    pub targets: Vec<u32>,
}

/// One sequence of a [`Packed`] micro-batch: `tokens[start..start + len]`, after the tokens of
/// the sequence it continues, if any.
///
/// A continuation lets sequences that share a prompt (a GRPO group's samples) compute it once:
/// the prompt is a sequence of its own and each sample continues it. Attention reads the
/// prompt's rows as the continuation's first `offset` keys; the backward sums what every
/// continuation's queries give those keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PackedSeq {
    /// Index of its first token in `tokens`.
    pub start: usize,
    /// Its tokens.
    pub len: usize,
    /// The sequence it continues (one that continues none).
    pub after: Option<usize>,
    /// Position of its first token: the length of the sequence it continues, or 0.
    pub offset: usize,
}

impl Packed {
    /// Appends a sequence; scores its tokens from `first_scored` on (each predicted by the one
    /// before it), so `first_scored ≥ 1`. Returns its index.
    pub(crate) fn push(&mut self, ids: &[u32], first_scored: usize) -> usize {
        self.push_seq(ids, first_scored, None, 0)
    }

    /// Appends a sequence continuing sequence `prefix` (which must continue none: continuations
    /// are one level deep, so attention reads at most two runs of rows); scores its tokens as
    /// [`Self::push`] does. Returns its index, or `None` (and appends nothing) if `prefix` is
    /// not such a sequence.
    pub(crate) fn push_after(
        &mut self,
        prefix: usize,
        ids: &[u32],
        first_scored: usize,
    ) -> Option<usize> {
        let parent = *self.seqs.get(prefix).filter(|p| p.after.is_none())?;
        Some(self.push_seq(ids, first_scored, Some(prefix), parent.len))
    }

    fn push_seq(
        &mut self,
        ids: &[u32],
        first_scored: usize,
        after: Option<usize>,
        offset: usize,
    ) -> usize {
        let start = self.tokens.len();
        self.seqs.push(PackedSeq {
            start,
            len: ids.len(),
            after,
            offset,
        });
        self.tokens.extend_from_slice(ids);
        self.positions.extend(offset..offset + ids.len());
        for (t, &id) in ids.iter().enumerate().skip(first_scored.max(1)) {
            self.rows.push(start + t - 1);
            self.targets.push(id);
        }
        self.seqs.len() - 1
    }
}

/// What one layer's backward reads.
///
/// Inputs of linear layers are kept transposed (`…_t`, `[features, tokens]`, as the decoder's
/// GEMMs read them) in the tensors the weight gradients `Xᵀ·dY` multiply; the rest per token.
struct LayerTape {
    /// The residual stream entering the layer, `[tokens, hidden]`, and its norm's reciprocal
    /// roots.
    x: Vec<f32>,
    r1: Vec<f32>,
    h1_t: Mat,
    /// Queries and keys before the QK-norm, with its reciprocal roots (Qwen3).
    qk_pre: Option<[(Vec<f32>, Vec<f32>); 2]>,
    /// `q|k|v` per token as attention read them (normed, rotated).
    qkv: Vec<f32>,
    probs: Vec<Probs>,
    attn_t: Mat,
    /// The residual stream entering the MLP, `[tokens, hidden]`, and its norm's roots.
    xm: Vec<f32>,
    r2: Vec<f32>,
    h2_t: Mat,
    /// `gate|up`, `[2·inter, tokens]` (the gate rows, then the up rows).
    gate_up_t: Mat,
    act_t: Mat,
}

/// Its buffers go back to the pool ([`scratch`]) once the backward has read them (its matrices
/// go by themselves).
impl Drop for LayerTape {
    fn drop(&mut self) {
        let kept = [&mut self.x, &mut self.qkv, &mut self.xm];
        kept.into_iter()
            .for_each(|v| scratch::recycle(std::mem::take(v)));
        if let Some([(q, _), (k, _)]) = self.qk_pre.take() {
            scratch::recycle(q);
            scratch::recycle(k);
        }
    }
}

/// A forward's saved activations and its outputs.
pub(crate) struct Tape {
    layers: Vec<LayerTape>,
    x_final: Vec<f32>,
    r_final: Vec<f32>,
    /// The final norm's output at each scored row, `[rows, hidden]`: what the LM head (or a
    /// critic's value head) reads.
    pub hidden_rows: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// `log p(target)` of each scored row (empty unless asked for).
    pub logprobs: Vec<f32>,
    /// The entropy of each scored row's distribution (empty unless asked for).
    pub entropy: Vec<f32>,
    /// The final residual stream, `[hidden, tokens]`, of a pipeline stage before the last: the
    /// next stage's input (empty otherwise).
    pub stream_out: Vec<f32>,
}

/// Its large buffers go back to the pool ([`scratch`]), as [`LayerTape`]'s do.
impl Drop for Tape {
    fn drop(&mut self) {
        let kept = [
            &mut self.x_final,
            &mut self.hidden_rows,
            &mut self.stream_out,
        ];
        kept.into_iter()
            .for_each(|v| scratch::recycle(std::mem::take(v)));
    }
}

/// What the forward computes at the scored rows besides their hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outputs {
    /// The LM head's log-probs and entropies (an actor).
    LogProbs,
    /// Nothing more: a value head reads the hidden states (a critic).
    Hidden,
    /// The residual stream itself, neither normed nor scored: a pipeline stage before the last.
    Stream,
}

/// The [`Recorder`] of the training forward: keeps, in the backward's layouts, what it reads.
struct Keeper<'a> {
    w: &'a Weights,
    tokens: usize,
    /// The current layer's values, until its last hook.
    x: Vec<f32>,
    qk_pre: Option<[(Vec<f32>, Vec<f32>); 2]>,
    attention: Option<AttentionBlock>,
    xm: Vec<f32>,
    layers: Vec<LayerTape>,
}

impl Keeper<'_> {
    /// A transposed activation `[features, tokens]`, kept for the weight gradients.
    fn kept_t(&self, values_t: Vec<f32>) -> Mat {
        let features = values_t.len() / self.tokens.max(1);
        Mat::new(values_t, features, self.tokens)
    }
}

impl Recorder for Keeper<'_> {
    const KEEPS_PROBS: bool = true;

    fn attention_input(&mut self, x_t: &[f32]) {
        self.x = transpose(x_t, self.w.hidden, self.tokens);
    }

    fn qkv_projected(&mut self, qkv: &[f32]) {
        let l = &self.w.layers[self.layers.len()];
        if let Some((qn, kn)) = &l.qk_norm {
            let (heads, kv_heads, d) =
                (self.w.heads.heads, self.w.heads.kv_heads, self.w.heads.dim);
            let width = (heads + 2 * kv_heads) * d;
            let q = mm::columns(qkv, width, 0..heads * d);
            let k = mm::columns(qkv, width, heads * d..(heads + kv_heads) * d);
            // The backward needs only the reciprocal roots of the QK-norm's forward.
            let rq = norm::roots(&q, qn.values.len(), self.w.eps);
            let rk = norm::roots(&k, kn.values.len(), self.w.eps);
            self.qk_pre = Some([(q, rq), (k, rk)]);
        }
    }

    fn attention(&mut self, block: AttentionBlock) {
        self.attention = Some(block);
    }

    fn mlp_input(&mut self, x_t: &[f32]) {
        self.xm = transpose(x_t, self.w.hidden, self.tokens);
    }

    fn mlp(&mut self, block: MlpBlock) {
        // The decoder calls every hook of a layer before this one; `forward` checks that every
        // layer arrived.
        let Some(a) = self.attention.take() else {
            return;
        };
        self.layers.push(LayerTape {
            x: std::mem::take(&mut self.x),
            r1: a.inv_rms,
            h1_t: self.kept_t(a.normed_t),
            qk_pre: self.qk_pre.take(),
            qkv: a.qkv,
            probs: a.probs,
            attn_t: self.kept_t(a.out_t),
            xm: std::mem::take(&mut self.xm),
            r2: block.inv_rms,
            h2_t: self.kept_t(block.normed_t),
            gate_up_t: self.kept_t(block.gate_up_t),
            act_t: self.kept_t(block.act_t),
        });
    }
}

/// The forward pass: the CPU decoder's own forward (so the log-probs are the bits the engine
/// samples with), keeping what the backward reads. A pipeline stage after the first starts from
/// `stream_in`, the stage before's [`Tape::stream_out`].
///
/// # Errors
/// [`BackendError::TokenOutOfVocab`] for a token outside the vocabulary.
pub(crate) fn forward(
    w: &Weights,
    p: &Packed,
    stream_in: Option<&[f32]>,
    outputs: Outputs,
) -> Result<Tape> {
    pool::as_one_job(w.decoder.waits_on_peers(), || {
        forward_here(w, p, stream_in, outputs)
    })
}

/// [`forward`] on the caller's thread.
fn forward_here(
    w: &Weights,
    p: &Packed,
    stream_in: Option<&[f32]>,
    outputs: Outputs,
) -> Result<Tape> {
    let (n, h) = (p.tokens.len(), w.hidden);
    let seqs: Vec<RecordedSeq<'_>> = p
        .seqs
        .iter()
        .map(|s| RecordedSeq {
            tokens: &p.tokens[s.start..s.start + s.len],
            after: s.after,
        })
        .collect();
    let mut keeper = Keeper {
        w,
        tokens: n,
        x: Vec::new(),
        qk_pre: None,
        attention: None,
        xm: Vec::new(),
        layers: Vec::with_capacity(w.layers.len()),
    };
    let x_final_t = w.decoder.forward_recorded(&seqs, stream_in, &mut keeper)?;
    if keeper.layers.len() != w.layers.len() {
        return Err(BackendError::Train(format!(
            "fused path: the decoder's forward recorded {} of {} layers",
            keeper.layers.len(),
            w.layers.len()
        )));
    }
    let positions = p.positions.iter().max().map_or(0, |&last| last + 1);
    let (cos, sin) = rope::tables(positions, &w.inv_freq);
    let (logprobs, entropy) = match outputs {
        Outputs::LogProbs => w
            .decoder
            .logprobs_at(&x_final_t, n, &p.rows, &p.targets, true)?,
        Outputs::Hidden => (Vec::new(), Vec::new()),
        Outputs::Stream => {
            return Ok(Tape {
                layers: keeper.layers,
                x_final: Vec::new(),
                r_final: Vec::new(),
                hidden_rows: Vec::new(),
                cos,
                sin,
                logprobs: Vec::new(),
                entropy: Vec::new(),
                stream_out: x_final_t,
            });
        }
    };
    let x_final = transpose(&x_final_t, h, n);
    let (hf, r_final) = norm::forward(&x_final, &w.final_norm.values, w.eps);
    let mut hidden_rows = Vec::with_capacity(p.rows.len() * h);
    for &r in &p.rows {
        hidden_rows.extend_from_slice(&hf[r * h..(r + 1) * h]);
    }
    Ok(Tape {
        layers: keeper.layers,
        x_final,
        r_final,
        hidden_rows,
        cos,
        sin,
        logprobs,
        entropy,
        stream_out: Vec::new(),
    })
}

/// Adds `Xᵀ·dY` (and the bias gradients) of a projection's parts, given its input transposed
/// (`x_t`, `[d_in, tokens]`) and its output's gradient, to `sink`.
fn weight_gradients(x_t: &Mat, dy: OutputGrad<'_>, p: &Projection, sink: &mut GradSink) {
    let (rows, x_t, dy_all) = (x_t.cols, x_t.view(), dy.view());
    let mut at = 0;
    for m in &p.parts {
        let cols = at..at + m.dims[1];
        at = cols.end;
        if let Some(b) = &m.bias {
            let mut db = vec![0.0; b.values.len()];
            mm::add_column_sums(&mut db, dy, cols.clone());
            sink.add_vector(b, db);
        }
        if let Some(ad) = &m.adapter {
            // dA = s·Xᵀ·(dY·Bᵀ), dB = s·(X·A)ᵀ·dY: through the rank-r products, never the
            // `[d_in, d_out]` gradient of the weight itself.
            let dy = dy_all.columns(cols);
            let r = ad.a.cols;
            let scaled = |g: Vec<f32>| g.into_iter().map(|v| v * ad.scale).collect();
            let dy_b = mm::mul(dy, ad.b.view().t());
            let dy_b = MatRef::row_major(&dy_b, rows, r);
            sink.add_matrix(ad.a_id, ad.a.dims(), scaled(mm::mul(x_t, dy_b)));
            let x_a = mm::mul(x_t.t(), ad.a.view());
            let x_a = MatRef::row_major(&x_a, rows, r);
            sink.add_matrix(ad.b_id, ad.b.dims(), scaled(mm::mul(x_a.t(), dy)));
        }
    }
    // A frozen weight needs no gradient of its own; the trained ones get theirs from one
    // product over every part, split by columns.
    if let OutputGrad::Cols { values, .. } = dy {
        if !p.parts.iter().any(|m| m.trains) {
            return;
        }
        // `dWᵀ = dYᵀ·X`: both operands are then read along their contiguous rows when packed
        // (`Xᵀ·dY` would pack both from columns).
        let d_in = x_t.rows();
        let dw_t = mm::mul(MatRef::row_major(values, p.width(), rows), x_t.t());
        let mut at = 0;
        for m in &p.parts {
            let cols = at..at + m.dims[1];
            at = cols.end;
            if m.trains {
                let g = transpose(&dw_t[cols.start * d_in..cols.end * d_in], cols.len(), d_in);
                sink.add_matrix(m.id, m.dims, g);
            }
        }
        scratch::recycle(dw_t);
        return;
    }
    match p.parts.as_slice() {
        [m] if m.trains => sink.add_matrix(m.id, m.dims, mm::mul(x_t, dy_all)),
        parts if parts.iter().any(|m| m.trains) => {
            let (dw, width) = (mm::mul(x_t, dy_all), p.width());
            let mut at = 0;
            for m in parts {
                let cols = at..at + m.dims[1];
                at = cols.end;
                if m.trains {
                    sink.add_matrix(m.id, m.dims, mm::columns(&dw, width, cols));
                }
            }
        }
        _ => {}
    }
}

/// [`weight_gradients`] of a projection whose output's gradient `dy` is per token
/// (`[tokens, Σ d_out]`); returns the input's, `dY·Wᵀ`, per token.
fn projection_backward(x_t: &Mat, dy: &[f32], p: &Projection, sink: &mut GradSink) -> Vec<f32> {
    let dy = OutputGrad::Rows {
        values: dy,
        width: p.width(),
    };
    weight_gradients(x_t, dy, p, sink);
    p.input_grad(dy)
}

/// What a pipeline stage's backward starts from.
pub(crate) enum StageGrad<'a> {
    /// The gradients of the scored rows' log-probs and entropies (the last stage, or a whole
    /// model).
    LogProbs {
        d_logp: &'a [f32],
        d_entropy: &'a [f32],
    },
    /// The gradient of the final norm's output at the scored rows, `[rows, hidden]` (a critic's
    /// value head).
    Hidden(&'a [f32]),
    /// The gradient of this stage's output stream, `[tokens, hidden]` (from the stage after).
    Stream(Vec<f32>),
}

/// The backward pass: the gradient of `Σ d_logp·logp + d_entropy·entropy` over the scored rows,
/// for every parameter, into `sink`.
///
/// # Errors
/// As [`backward_stage`].
pub(crate) fn backward(
    w: &Weights,
    p: &Packed,
    tape: Tape,
    d_logp: &[f32],
    d_entropy: &[f32],
    sink: &mut GradSink,
) -> Result<()> {
    backward_stage(w, p, tape, StageGrad::LogProbs { d_logp, d_entropy }, sink).map(drop)
}

/// The backward from the gradient of the loss with respect to the final norm's output at the
/// scored rows (`dh_rows`, `[rows, hidden]`): every trunk parameter's gradient, into `sink`.
///
/// # Errors
/// As [`backward_stage`].
pub(crate) fn backward_from_hidden(
    w: &Weights,
    p: &Packed,
    tape: Tape,
    dh_rows: &[f32],
    sink: &mut GradSink,
) -> Result<()> {
    backward_stage(w, p, tape, StageGrad::Hidden(dh_rows), sink).map(drop)
}

/// The backward of whatever layers `w` holds, from `from`, every parameter's gradient into
/// `sink`; returns the gradient of the stage's input stream (`[tokens, hidden]`) for the stage
/// before, or `None` where the stage embeds the tokens (the embedding's gradient then goes to
/// `sink`).
///
/// On a tensor-parallel rank the gradient entering each block's norm from its column-parallel
/// projections is this rank's heads' (units') part only; it is summed over the group before the
/// norm's backward (Megatron's `f`), so every rank carries the same residual gradient. So are the
/// gradients of the QK-norm gains, which every head shares.
///
/// # Errors
/// [`BackendError::Collective`] when a tensor-parallel all-reduce fails.
pub(crate) fn backward_stage(
    w: &Weights,
    p: &Packed,
    tape: Tape,
    from: StageGrad<'_>,
    sink: &mut GradSink,
) -> Result<Option<Vec<f32>>> {
    pool::as_one_job(w.decoder.waits_on_peers(), || {
        backward_stage_here(w, p, tape, from, sink)
    })
}

/// [`backward_stage`] on the caller's thread.
fn backward_stage_here(
    w: &Weights,
    p: &Packed,
    tape: Tape,
    from: StageGrad<'_>,
    sink: &mut GradSink,
) -> Result<Option<Vec<f32>>> {
    let completed = |mut partial: Vec<f32>| -> Result<Vec<f32>> {
        if let Some(shard) = &w.tensor_shard {
            shard.all_reduce(&mut partial)?;
        }
        Ok(partial)
    };
    let (n, h, d) = (p.tokens.len(), w.hidden, w.heads.dim);
    let dh_rows = match from {
        StageGrad::LogProbs { d_logp, d_entropy } => {
            Some(head_backward(w, p, &tape, d_logp, d_entropy, sink))
        }
        StageGrad::Hidden(dh_rows) => Some(dh_rows.to_vec()),
        StageGrad::Stream(_) => None,
    };
    let mut tape = tape;
    let layers = std::mem::take(&mut tape.layers);
    let (x_final, r_final) = (&tape.x_final, &tape.r_final);
    let (cos, sin) = (&tape.cos, &tape.sin);
    let mut dx = match (dh_rows, from) {
        (_, StageGrad::Stream(dx)) => dx,
        (dh_rows, _) => {
            let dh_rows = dh_rows.unwrap_or_default();
            let mut dhf = scratch::zeroed(n * h);
            for (i, &r) in p.rows.iter().enumerate() {
                mm::add_in_place(&mut dhf[r * h..(r + 1) * h], &dh_rows[i * h..(i + 1) * h]);
            }
            let mut dg = vec![0.0; h];
            let dx = norm::backward(x_final, r_final, &w.final_norm.values, &dhf, &mut dg);
            scratch::recycle(dhf);
            sink.add_vector(&w.final_norm, dg);
            dx
        }
    };
    let (heads, kv_heads) = (w.heads.heads, w.heads.kv_heads);
    for (l, t) in w.layers.iter().zip(layers).rev() {
        // MLP: x_next = xm + down(silu(gate(h2)) ⊙ up(h2)).
        // Its gradients run transposed, `[features, tokens]`, as the forward kept its
        // activations: the SwiGLU backward then reads them as they are.
        let d_out = OutputGrad::Rows {
            values: &dx,
            width: h,
        };
        weight_gradients(&t.act_t, d_out, &l.down, sink);
        let d_act_t = l.down.input_grad_t(d_out);
        let d_gate_up_t = swiglu::backward(&t.gate_up_t.values, &d_act_t);
        scratch::recycle(d_act_t);
        let d_gate_up = OutputGrad::Cols {
            values: &d_gate_up_t,
            tokens: n,
        };
        weight_gradients(&t.h2_t, d_gate_up, &l.gate_up, sink);
        let dh2 = l.gate_up.input_grad(d_gate_up);
        scratch::recycle(d_gate_up_t);
        let dh2 = completed(dh2)?;
        let mut dg2 = vec![0.0; h];
        let mut dxm = norm::backward(&t.xm, &t.r2, &l.post_norm.values, &dh2, &mut dg2);
        scratch::recycle(dh2);
        sink.add_vector(&l.post_norm, dg2);
        mm::add_in_place(&mut dxm, &dx);
        // Attention: xm = x + o(attention(rope(norm_qk(q(h1))), rope(norm_qk(k(h1))), v(h1))).
        let d_attn = projection_backward(&t.attn_t, &dxm, &l.o, sink);
        let mut dqkv = attention::backward(&t.qkv, &t.probs, &d_attn, &p.seqs, w.heads);
        scratch::recycle(d_attn);
        // The queries and keys, side by side at the start of each row, were rotated.
        rope::rotate(
            &mut dqkv,
            (heads + kv_heads) * d,
            &p.positions,
            d,
            cos,
            sin,
            true,
        );
        if let (Some((qn, kn)), Some([(q_pre, rq), (k_pre, rk)])) = (&l.qk_norm, &t.qk_pre) {
            // The QK-norm gains are shared by every head: a rank sums over its own heads only.
            let width = (heads + 2 * kv_heads) * d;
            let (q_cols, k_cols) = (0..heads * d, heads * d..(heads + kv_heads) * d);
            let dq = mm::columns(&dqkv, width, q_cols.clone());
            let dk = mm::columns(&dqkv, width, k_cols.clone());
            let mut dgq = vec![0.0; d];
            let dq = norm::backward(q_pre, rq, &qn.values, &dq, &mut dgq);
            sink.add_vector(qn, completed(dgq)?);
            let mut dgk = vec![0.0; d];
            let dk = norm::backward(k_pre, rk, &kn.values, &dk, &mut dgk);
            sink.add_vector(kn, completed(dgk)?);
            for ((row, dq), dk) in dqkv
                .chunks_exact_mut(width)
                .zip(dq.chunks_exact(q_cols.len()))
                .zip(dk.chunks_exact(k_cols.len()))
            {
                row[q_cols.clone()].copy_from_slice(dq);
                row[k_cols.clone()].copy_from_slice(dk);
            }
        }
        let dh1 = projection_backward(&t.h1_t, &dqkv, &l.qkv, sink);
        scratch::recycle(dqkv);
        let dh1 = completed(dh1)?;
        let mut dg1 = vec![0.0; h];
        let dx_in = norm::backward(&t.x, &t.r1, &l.input_norm.values, &dh1, &mut dg1);
        scratch::recycle(dh1);
        scratch::recycle(std::mem::replace(&mut dx, dx_in));
        sink.add_vector(&l.input_norm, dg1);
        mm::add_in_place(&mut dx, &dxm);
        scratch::recycle(dxm);
    }
    if w.stage.as_ref().is_some_and(|s| !s.is_first()) {
        return Ok(Some(dx));
    }
    if w.embed.trains {
        let mut d_embed = vec![0.0; w.vocab * h];
        for (i, &tok) in p.tokens.iter().enumerate() {
            let t = tok as usize;
            mm::add_in_place(&mut d_embed[t * h..(t + 1) * h], &dx[i * h..(i + 1) * h]);
        }
        sink.add_matrix(w.embed.id, [w.vocab, h], d_embed);
    }
    Ok(None)
}

/// The LM head's backward: its weight's gradient into `sink` (the embedding's, when tied); returns
/// the gradient of the final norm's output at the scored rows, `[rows, hidden]`.
fn head_backward(
    w: &Weights,
    p: &Packed,
    tape: &Tape,
    d_logp: &[f32],
    d_entropy: &[f32],
    sink: &mut GradSink,
) -> Vec<f32> {
    let h = w.hidden;
    let mut dw_head = w.head_trains.then(|| vec![0.0; w.vocab * h]);
    let dh_rows = head::backward(
        &w.head,
        &tape.hidden_rows,
        h,
        &p.targets,
        w.vocab,
        d_logp,
        d_entropy,
        dw_head.as_deref_mut(),
    );
    match (w.head_id, dw_head) {
        (Some(id), Some(dw)) => sink.add_matrix(id, [h, w.vocab], dw),
        (None, Some(dw)) => sink.add_matrix(w.embed.id, [w.vocab, h], dw),
        (_, None) => {}
    }
    dh_rows
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::engine::test_support::{grpo_groups, models_under_test};
    use crate::train::fused::{extract, pack};
    use roll_core::{SampleId, TrainSequence};

    fn sequence(prompt: &[u32], response: Vec<u32>) -> TrainSequence {
        let mask = vec![true; response.len()];
        TrainSequence::supervised(SampleId(0), prompt.to_vec(), response, mask)
    }

    /// [`grpo_groups`] as SFT sequences.
    fn groups(vocab: usize) -> Vec<TrainSequence> {
        grpo_groups(vocab, 10)
            .into_iter()
            .map(|(prompt, response)| sequence(&prompt, response))
            .collect()
    }

    /// A forward over sequences that continue shared prompts gives the log-probs and entropies of
    /// the same sequences packed whole, bit for bit — the bits the engine samples with — on
    /// fewer tokens.
    #[test]
    fn shared_prompts_keep_the_bits_of_whole_sequences() {
        for (name, model, _) in models_under_test() {
            let w = extract(&model, None).unwrap();
            let seqs = groups(model.vocab_size());
            let refs: Vec<&TrainSequence> = seqs.iter().collect();
            let shared = pack(&refs);
            let mut whole = Packed::default();
            for s in &seqs {
                whole.push(
                    &[s.prompt_ids.clone(), s.response_ids.clone()].concat(),
                    s.prompt_ids.len(),
                );
            }
            // Each prompt of two tokens or more is computed once, all but its last token.
            let saved: usize = [5, 16, 17, 35].iter().map(|n| 2 * (n - 1)).sum();
            assert_eq!(shared.tokens.len(), whole.tokens.len() - saved, "{name}");
            assert_eq!(shared.targets, whole.targets, "{name}");
            let a = forward(&w, &shared, None, Outputs::LogProbs).unwrap();
            let b = forward(&w, &whole, None, Outputs::LogProbs).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.logprobs), bits(&b.logprobs), "{name}: log-probs");
            assert_eq!(bits(&a.entropy), bits(&b.entropy), "{name}: entropies");
            assert_eq!(
                bits(&a.hidden_rows),
                bits(&b.hidden_rows),
                "{name}: hidden rows"
            );
        }
    }
}
