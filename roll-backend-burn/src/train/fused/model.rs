//! The dense Qwen decoder's forward over packed sequences, keeping exactly what its backward
//! reads (the tape), and the backward itself: every parameter's gradient from the gradients of
//! the per-position log-probs and entropies.

use super::attention::{self, Probs};
use super::grads::GradSink;
use super::head;
use super::mm::{self, Mat, MatRef};
use super::norm;
use super::rope;
use super::swiglu;
use super::weights::{Matrix, Weights};
use crate::engine::cpu::Recorder;
use crate::engine::cpu::matrix::transpose;
use crate::{BackendError, Result};

/// Sequences packed end to end, and the positions whose next token is scored.
#[derive(Debug, Clone, Default)]
pub(crate) struct Packed {
    /// Every token of every sequence, in order.
    pub tokens: Vec<u32>,
    /// `(start, len)` of each sequence in `tokens`.
    pub seqs: Vec<(usize, usize)>,
    /// Each token's position within its sequence.
    pub positions: Vec<usize>,
    /// Indices into `tokens` of the positions that predict a scored token.
    pub rows: Vec<usize>,
    /// The token each of `rows` predicts.
    pub targets: Vec<u32>,
}

impl Packed {
    /// Appends a sequence; scores its tokens from `first_scored` on (each predicted by the one
    /// before it), so `first_scored ≥ 1`.
    pub(crate) fn push(&mut self, ids: &[u32], first_scored: usize) {
        let start = self.tokens.len();
        self.seqs.push((start, ids.len()));
        self.tokens.extend_from_slice(ids);
        self.positions.extend(0..ids.len());
        for (t, &id) in ids.iter().enumerate().skip(first_scored.max(1)) {
            self.rows.push(start + t - 1);
            self.targets.push(id);
        }
    }
}

/// What one layer's backward reads.
///
/// Inputs of linear layers are kept transposed (`…_t`, `[features, tokens]`, as the decoder's
/// GEMMs read them) in the tensors the weight gradients `Xᵀ·dY` multiply; the rest per token.
struct LayerTape {
    rows: TokenRows,
    h1_t: Mat,
    attn_t: Mat,
    h2_t: Mat,
    act_t: Mat,
}

/// A layer's per-token activations (token-major), filled hook by hook as the decoder runs.
#[derive(Default)]
struct TokenRows {
    x: Vec<f32>,
    r1: Vec<f32>,
    /// Queries and keys before the QK-norm, with its reciprocal roots (Qwen3).
    qk_pre: Option<[(Vec<f32>, Vec<f32>); 2]>,
    /// Queries and keys as attention read them (normed, rotated).
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    probs: Vec<Probs>,
    xm: Vec<f32>,
    r2: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
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
    /// The current layer's per-token activations and GEMM inputs, until its last hook.
    rows: TokenRows,
    h1_t: Option<Mat>,
    attn_t: Option<Mat>,
    h2_t: Option<Mat>,
    layers: Vec<LayerTape>,
}

impl Keeper<'_> {
    /// A transposed activation `[features, tokens]`, kept for the weight gradients.
    fn kept_t(&self, values_t: &[f32]) -> Mat {
        let features = values_t.len() / self.tokens.max(1);
        Mat::new(values_t.to_vec(), features, self.tokens)
    }

    /// Splits per-token `q|k|v` rows into `q`, `k`, `v` (each `[tokens, width]`).
    fn split_qkv(&self, qkv: &[f32]) -> [Vec<f32>; 3] {
        let (heads, kv_heads, d) = (self.w.heads.heads, self.w.heads.kv_heads, self.w.heads.dim);
        let widths = [heads * d, kv_heads * d, kv_heads * d];
        let mut parts = widths.map(|w| Vec::with_capacity(self.tokens * w));
        for row in qkv.chunks_exact(widths.iter().sum()) {
            let mut at = 0;
            for (part, w) in parts.iter_mut().zip(widths) {
                part.extend_from_slice(&row[at..at + w]);
                at += w;
            }
        }
        parts
    }
}

impl Recorder for Keeper<'_> {
    const KEEPS_PROBS: bool = true;

    fn attention_input(&mut self, x_t: &[f32], normed_t: &[f32], inv_rms: &[f32]) {
        self.rows.x = transpose(x_t, self.w.hidden, self.tokens);
        self.rows.r1 = inv_rms.to_vec();
        self.h1_t = Some(self.kept_t(normed_t));
    }

    fn qkv_projected(&mut self, qkv: &[f32]) {
        let l = &self.w.layers[self.layers.len()];
        if let Some((qn, kn)) = &l.qk_norm {
            let [q, k, _] = self.split_qkv(qkv);
            // The backward needs only the reciprocal roots of the QK-norm's forward.
            let rq = norm::roots(&q, qn.values.len(), self.w.eps);
            let rk = norm::roots(&k, kn.values.len(), self.w.eps);
            self.rows.qk_pre = Some([(q, rq), (k, rk)]);
        }
    }

    fn qkv_rotated(&mut self, qkv: &[f32]) {
        let [q, k, v] = self.split_qkv(qkv);
        (self.rows.q, self.rows.k, self.rows.v) = (q, k, v);
    }

    fn attention(&mut self, probs: Vec<Vec<f32>>, out_t: &[f32]) {
        self.rows.probs = probs;
        self.attn_t = Some(self.kept_t(out_t));
    }

    fn mlp_input(&mut self, x_t: &[f32], normed_t: &[f32], inv_rms: &[f32]) {
        self.rows.xm = transpose(x_t, self.w.hidden, self.tokens);
        self.rows.r2 = inv_rms.to_vec();
        self.h2_t = Some(self.kept_t(normed_t));
    }

    fn mlp_hidden(&mut self, gate_up_t: &[f32], act_t: &[f32]) {
        let inter = act_t.len() / self.tokens.max(1);
        let (gate_t, up_t) = gate_up_t.split_at(gate_up_t.len() / 2);
        self.rows.gate = transpose(gate_t, inter, self.tokens);
        self.rows.up = transpose(up_t, inter, self.tokens);
        let act_t = self.kept_t(act_t);
        let rows = std::mem::take(&mut self.rows);
        // The decoder calls every hook of a layer before this one; `forward` checks that every
        // layer arrived.
        if let (Some(h1_t), Some(attn_t), Some(h2_t)) =
            (self.h1_t.take(), self.attn_t.take(), self.h2_t.take())
        {
            self.layers.push(LayerTape {
                rows,
                h1_t,
                attn_t,
                h2_t,
                act_t,
            });
        }
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
    let (n, h) = (p.tokens.len(), w.hidden);
    let seqs: Vec<&[u32]> = p
        .seqs
        .iter()
        .map(|&(start, len)| &p.tokens[start..start + len])
        .collect();
    let mut keeper = Keeper {
        w,
        tokens: n,
        rows: TokenRows::default(),
        h1_t: None,
        attn_t: None,
        h2_t: None,
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
    let longest = p.seqs.iter().map(|s| s.1).max().unwrap_or(0);
    let (cos, sin) = rope::tables(longest, &w.inv_freq);
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

/// Adds `Xᵀ·dY` (and the bias gradient) of a linear layer, given its input transposed (`x_t`,
/// `[d_in, tokens]`), to `sink`; returns `dY·Wᵀ`.
fn linear_backward(x_t: &Mat, dy: Vec<f32>, m: &Matrix, sink: &mut GradSink) -> Vec<f32> {
    if let Some(b) = &m.bias {
        let mut db = vec![0.0; b.values.len()];
        mm::add_column_sums(&mut db, &dy);
        sink.add_vector(b, db);
    }
    let (rows, x_t) = (x_t.cols, x_t.view());
    let dy = MatRef::row_major(&dy, rows, m.dims[1]);
    if let Some(ad) = &m.adapter {
        // dA = s·Xᵀ·(dY·Bᵀ), dB = s·(X·A)ᵀ·dY: through the rank-r products, never the
        // `[d_in, d_out]` gradient of the weight itself.
        let r = ad.a.cols;
        let scaled = |g: Vec<f32>| g.into_iter().map(|v| v * ad.scale).collect();
        let dy_b = mm::mul(dy, ad.b.view().t());
        let dy_b = MatRef::row_major(&dy_b, rows, r);
        sink.add_matrix(ad.a_id, ad.a.dims(), scaled(mm::mul(x_t, dy_b)));
        let x_a = mm::mul(x_t.t(), ad.a.view());
        let x_a = MatRef::row_major(&x_a, rows, r);
        sink.add_matrix(ad.b_id, ad.b.dims(), scaled(mm::mul(x_a.t(), dy)));
    }
    // A frozen weight needs no gradient of its own.
    if m.trains {
        sink.add_matrix(m.id, m.dims, mm::mul(x_t, dy));
    }
    mm::mul_packed(dy, &m.weight_t)
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
    let Tape {
        layers,
        x_final,
        r_final,
        cos,
        sin,
        ..
    } = tape;
    let mut dx = match (dh_rows, from) {
        (_, StageGrad::Stream(dx)) => dx,
        (dh_rows, _) => {
            let dh_rows = dh_rows.unwrap_or_default();
            let mut dhf = vec![0.0; n * h];
            for (i, &r) in p.rows.iter().enumerate() {
                mm::add_in_place(&mut dhf[r * h..(r + 1) * h], &dh_rows[i * h..(i + 1) * h]);
            }
            let mut dg = vec![0.0; h];
            let dx = norm::backward(&x_final, &r_final, &w.final_norm.values, &dhf, &mut dg);
            sink.add_vector(&w.final_norm, dg);
            dx
        }
    };
    for (l, t) in w.layers.iter().zip(layers).rev() {
        // MLP: x_next = xm + down(silu(gate(h2)) ⊙ up(h2)).
        let d_act = linear_backward(&t.act_t, dx.clone(), &l.down, sink);
        let (d_gate, d_up) = swiglu::backward(&t.rows.gate, &t.rows.up, &d_act);
        let mut dh2 = linear_backward(&t.h2_t, d_gate, &l.gate, sink);
        mm::add_in_place(&mut dh2, &linear_backward(&t.h2_t, d_up, &l.up, sink));
        let dh2 = completed(dh2)?;
        let mut dg2 = vec![0.0; h];
        let mut dxm = norm::backward(&t.rows.xm, &t.rows.r2, &l.post_norm.values, &dh2, &mut dg2);
        sink.add_vector(&l.post_norm, dg2);
        mm::add_in_place(&mut dxm, &dx);
        // Attention: xm = x + o(attention(rope(norm_qk(q(h1))), rope(norm_qk(k(h1))), v(h1))).
        let d_attn = linear_backward(&t.attn_t, dxm.clone(), &l.o, sink);
        let (mut dq, mut dk, dv) = attention::backward(
            &t.rows.q,
            &t.rows.k,
            &t.rows.v,
            &t.rows.probs,
            &d_attn,
            &p.seqs,
            w.heads,
        );
        rope::rotate(&mut dq, &p.positions, d, &cos, &sin, true);
        rope::rotate(&mut dk, &p.positions, d, &cos, &sin, true);
        if let (Some((qn, kn)), Some([(q_pre, rq), (k_pre, rk)])) = (&l.qk_norm, &t.rows.qk_pre) {
            // The QK-norm gains are shared by every head: a rank sums over its own heads only.
            let mut dgq = vec![0.0; d];
            dq = norm::backward(q_pre, rq, &qn.values, &dq, &mut dgq);
            sink.add_vector(qn, completed(dgq)?);
            let mut dgk = vec![0.0; d];
            dk = norm::backward(k_pre, rk, &kn.values, &dk, &mut dgk);
            sink.add_vector(kn, completed(dgk)?);
        }
        let mut dh1 = linear_backward(&t.h1_t, dq, &l.q, sink);
        mm::add_in_place(&mut dh1, &linear_backward(&t.h1_t, dk, &l.k, sink));
        mm::add_in_place(&mut dh1, &linear_backward(&t.h1_t, dv, &l.v, sink));
        let dh1 = completed(dh1)?;
        let mut dg1 = vec![0.0; h];
        dx = norm::backward(&t.rows.x, &t.rows.r1, &l.input_norm.values, &dh1, &mut dg1);
        sink.add_vector(&l.input_norm, dg1);
        mm::add_in_place(&mut dx, &dxm);
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
