//! The dense Qwen decoder's forward over packed sequences, keeping exactly what its backward
//! reads (the tape), and the backward itself: every parameter's gradient from the gradients of
//! the per-position log-probs and entropies.

use super::attention::{self, Probs};
use super::grads::GradSink;
use super::head;
use super::mm;
use super::norm;
use super::rope;
use super::swiglu;
use super::weights::{Matrix, Weights};
use crate::{BackendError, Result};
use burn::tensor::{Device, Tensor};

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
/// Inputs of linear layers (`h1`, `attn`, `h2`, `act`) are kept as the tensors their GEMMs read;
/// the rest as values.
struct LayerTape {
    x: Vec<f32>,
    r1: Vec<f32>,
    h1: Tensor<2>,
    /// Queries and keys before the QK-norm, with its reciprocal roots (Qwen3).
    qk_pre: Option<[(Vec<f32>, Vec<f32>); 2]>,
    /// Queries and keys as attention read them (normed, rotated).
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    probs: Vec<Probs>,
    attn: Tensor<2>,
    xm: Vec<f32>,
    r2: Vec<f32>,
    h2: Tensor<2>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Tensor<2>,
}

/// A forward's saved activations and its outputs.
pub(crate) struct Tape {
    layers: Vec<LayerTape>,
    x_final: Vec<f32>,
    r_final: Vec<f32>,
    hidden_rows: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// `log p(target)` of each scored row.
    pub logprobs: Vec<f32>,
    /// The entropy of each scored row's distribution.
    pub entropy: Vec<f32>,
}

fn linear(x: &Tensor<2>, m: &Matrix) -> Result<Vec<f32>> {
    let mut y = mm::mul(x, &m.weight)?;
    if let Some(b) = &m.bias {
        mm::add_bias(&mut y, &b.values);
    }
    Ok(y)
}

/// The forward pass.
///
/// # Errors
/// [`BackendError::InvalidInput`] for a token outside the vocabulary; GEMM read-back failures.
pub(crate) fn forward(w: &Weights, p: &Packed, device: &Device) -> Result<Tape> {
    let (n, h, d) = (p.tokens.len(), w.hidden, w.heads.dim);
    let mut x = Vec::with_capacity(n * h);
    for &t in &p.tokens {
        let row = w
            .embed
            .values
            .get(t as usize * h..(t as usize + 1) * h)
            .ok_or_else(|| {
                BackendError::InvalidInput(format!(
                    "token id {t} is outside the vocabulary ({})",
                    w.vocab
                ))
            })?;
        x.extend_from_slice(row);
    }
    let longest = p.seqs.iter().map(|s| s.1).max().unwrap_or(0);
    let (cos, sin) = rope::tables(longest, &w.inv_freq);
    let mut layers = Vec::with_capacity(w.layers.len());
    for l in &w.layers {
        let (h1, r1) = norm::forward(&x, &l.input_norm.values, w.eps);
        let h1 = mm::tensor(h1, n, h, device);
        let mut q = linear(&h1, &l.q)?;
        let mut k = linear(&h1, &l.k)?;
        let v = linear(&h1, &l.v)?;
        let qk_pre = match &l.qk_norm {
            Some((qn, kn)) => {
                let (q_normed, rq) = norm::forward(&q, &qn.values, w.eps);
                let (k_normed, rk) = norm::forward(&k, &kn.values, w.eps);
                Some([
                    (std::mem::replace(&mut q, q_normed), rq),
                    (std::mem::replace(&mut k, k_normed), rk),
                ])
            }
            None => None,
        };
        rope::rotate(&mut q, &p.positions, d, &cos, &sin, false);
        rope::rotate(&mut k, &p.positions, d, &cos, &sin, false);
        let (attn, probs) = attention::forward(&q, &k, &v, &p.seqs, w.heads);
        let attn = mm::tensor(attn, n, w.heads.heads * d, device);
        let mut xm = linear(&attn, &l.o)?;
        mm::add_in_place(&mut xm, &x);
        let (h2, r2) = norm::forward(&xm, &l.post_norm.values, w.eps);
        let h2 = mm::tensor(h2, n, h, device);
        let gate = mm::mul(&h2, &l.gate.weight)?;
        let up = mm::mul(&h2, &l.up.weight)?;
        let act = swiglu::forward(&gate, &up);
        let act = mm::tensor(act, n, l.down.weight.dims()[0], device);
        let mut next = mm::mul(&act, &l.down.weight)?;
        mm::add_in_place(&mut next, &xm);
        layers.push(LayerTape {
            x,
            r1,
            h1,
            qk_pre,
            q,
            k,
            v,
            probs,
            attn,
            xm,
            r2,
            h2,
            gate,
            up,
            act,
        });
        x = next;
    }
    let (hf, r_final) = norm::forward(&x, &w.final_norm.values, w.eps);
    let mut hidden_rows = Vec::with_capacity(p.rows.len() * h);
    for &r in &p.rows {
        hidden_rows.extend_from_slice(&hf[r * h..(r + 1) * h]);
    }
    for &t in &p.targets {
        if t as usize >= w.vocab {
            return Err(BackendError::InvalidInput(format!(
                "token id {t} is outside the vocabulary ({})",
                w.vocab
            )));
        }
    }
    let (logprobs, entropy) = head::forward(&w.head, &hidden_rows, h, &p.targets, w.vocab, device)?;
    Ok(Tape {
        layers,
        x_final: x,
        r_final,
        hidden_rows,
        cos,
        sin,
        logprobs,
        entropy,
    })
}

/// Adds `Xᵀ·dY` (and the bias gradient) of a linear layer to `sink`; returns `dY·Wᵀ`.
fn linear_backward(
    x: &Tensor<2>,
    dy: Vec<f32>,
    m: &Matrix,
    sink: &mut GradSink,
    device: &Device,
) -> Result<Vec<f32>> {
    if let Some(b) = &m.bias {
        let mut db = vec![0.0; b.values.len()];
        mm::add_column_sums(&mut db, &dy);
        sink.add_vector(b.id, db);
    }
    let [rows, cols] = [x.dims()[0], m.weight.dims()[1]];
    let dy = mm::tensor(dy, rows, cols, device);
    sink.add_matrix(m.id, m.weight.dims(), mm::t_mul(x, &dy)?);
    mm::mul_t(&dy, &m.weight)
}

/// The backward pass: the gradient of `Σ d_logp·logp + d_entropy·entropy` over the scored rows,
/// for every parameter, into `sink`.
///
/// # Errors
/// GEMM read-back failures.
pub(crate) fn backward(
    w: &Weights,
    p: &Packed,
    tape: Tape,
    d_logp: &[f32],
    d_entropy: &[f32],
    sink: &mut GradSink,
    device: &Device,
) -> Result<()> {
    let (n, h, d) = (p.tokens.len(), w.hidden, w.heads.dim);
    let Tape {
        layers,
        x_final,
        r_final,
        hidden_rows,
        cos,
        sin,
        ..
    } = tape;
    let mut dw_head = vec![0.0; w.vocab * h];
    let dh_rows = head::backward(
        &w.head,
        &hidden_rows,
        h,
        &p.targets,
        w.vocab,
        d_logp,
        d_entropy,
        &mut dw_head,
        device,
    )?;
    match w.head_id {
        Some(id) => sink.add_matrix(id, [h, w.vocab], dw_head),
        None => sink.add_matrix(w.embed.id, [w.vocab, h], dw_head),
    }
    let mut dhf = vec![0.0; n * h];
    for (i, &r) in p.rows.iter().enumerate() {
        mm::add_in_place(&mut dhf[r * h..(r + 1) * h], &dh_rows[i * h..(i + 1) * h]);
    }
    let mut dg = vec![0.0; h];
    let mut dx = norm::backward(&x_final, &r_final, &w.final_norm.values, &dhf, &mut dg);
    sink.add_vector(w.final_norm.id, dg);
    for (l, t) in w.layers.iter().zip(layers).rev() {
        // MLP: x_next = xm + down(silu(gate(h2)) ⊙ up(h2)).
        let d_act = linear_backward(&t.act, dx.clone(), &l.down, sink, device)?;
        let (d_gate, d_up) = swiglu::backward(&t.gate, &t.up, &d_act);
        let mut dh2 = linear_backward(&t.h2, d_gate, &l.gate, sink, device)?;
        mm::add_in_place(
            &mut dh2,
            &linear_backward(&t.h2, d_up, &l.up, sink, device)?,
        );
        let mut dg2 = vec![0.0; h];
        let mut dxm = norm::backward(&t.xm, &t.r2, &l.post_norm.values, &dh2, &mut dg2);
        sink.add_vector(l.post_norm.id, dg2);
        mm::add_in_place(&mut dxm, &dx);
        // Attention: xm = x + o(attention(rope(norm_qk(q(h1))), rope(norm_qk(k(h1))), v(h1))).
        let d_attn = linear_backward(&t.attn, dxm.clone(), &l.o, sink, device)?;
        let (mut dq, mut dk, dv) =
            attention::backward(&t.q, &t.k, &t.v, &t.probs, &d_attn, &p.seqs, w.heads);
        rope::rotate(&mut dq, &p.positions, d, &cos, &sin, true);
        rope::rotate(&mut dk, &p.positions, d, &cos, &sin, true);
        if let (Some((qn, kn)), Some([(q_pre, rq), (k_pre, rk)])) = (&l.qk_norm, &t.qk_pre) {
            let mut dgq = vec![0.0; d];
            dq = norm::backward(q_pre, rq, &qn.values, &dq, &mut dgq);
            sink.add_vector(qn.id, dgq);
            let mut dgk = vec![0.0; d];
            dk = norm::backward(k_pre, rk, &kn.values, &dk, &mut dgk);
            sink.add_vector(kn.id, dgk);
        }
        let mut dh1 = linear_backward(&t.h1, dq, &l.q, sink, device)?;
        mm::add_in_place(&mut dh1, &linear_backward(&t.h1, dk, &l.k, sink, device)?);
        mm::add_in_place(&mut dh1, &linear_backward(&t.h1, dv, &l.v, sink, device)?);
        let mut dg1 = vec![0.0; h];
        dx = norm::backward(&t.x, &t.r1, &l.input_norm.values, &dh1, &mut dg1);
        sink.add_vector(l.input_norm.id, dg1);
        mm::add_in_place(&mut dx, &dxm);
    }
    let mut d_embed = vec![0.0; w.vocab * h];
    for (i, &tok) in p.tokens.iter().enumerate() {
        let t = tok as usize;
        mm::add_in_place(&mut d_embed[t * h..(t + 1) * h], &dx[i * h..(i + 1) * h]);
    }
    sink.add_matrix(w.embed.id, [w.vocab, h], d_embed);
    Ok(())
}
