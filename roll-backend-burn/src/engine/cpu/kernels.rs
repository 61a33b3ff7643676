//! The arithmetic of the CPU decoder: RMSNorm, rotary embedding, paged causal attention, SwiGLU,
//! and a thin wrapper that runs GEMMs through Burn's Flex backend.
//!
//! Activations between GEMMs are kept **transposed**, `[features, tokens]` (one column per token):
//! the GEMMs then run as `Wᵀ · Xᵀ`, the weights being gemm's left operand, which it packs and
//! streams sequentially — 1.3–4× faster at decode shapes than `X · W` with the weights on the
//! right (see the crate's `decode_kernels` bench) — and the elementwise steps between GEMMs read
//! and write contiguous rows.
//!
//! Every reduction here (sum of squares, attention dot products, softmax sums, weighted sums of
//! values) runs in a fixed order that depends only on the token being reduced — never on how many
//! tokens there are or which thread computes it — so a token's result is bit-identical whatever
//! else shares the batch.

use super::cache::BLOCK_TOKENS;
use crate::{BackendError, Result};
use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

/// Accumulators of [`sum_sq`].
const LANES: usize = 8;

/// `Σ xᵢ²` in a fixed order: [`LANES`] strided partial sums, then the lanes left to right, then
/// the tail.
pub(crate) fn sum_sq(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    let mut s = acc.iter().fold(0.0f32, |s, a| s + a);
    for v in tail {
        s += v * v;
    }
    s
}

/// An RMSNorm: weight and epsilon (the f32 that Burn adds to an f32 tensor).
#[derive(Debug, Clone)]
pub(crate) struct Norm {
    /// Per-feature scale.
    pub weight: Vec<f32>,
    /// Added to the mean square.
    pub eps: f32,
}

/// HF RMSNorm of one vector in place: `x = weight * (x * (1 / sqrt(mean(x²) + eps)))`.
pub(crate) fn rms_norm_in_place(x: &mut [f32], norm: &Norm) {
    let inv = 1.0 / (sum_sq(x) / x.len() as f32 + norm.eps).sqrt();
    for (v, w) in x.iter_mut().zip(&norm.weight) {
        *v = w * (*v * inv);
    }
}

/// HF RMSNorm of every column of `xt` (`[norm.weight.len(), cols]`) into a new buffer of that
/// shape. Each column's sum of squares runs over the features in order, so it does not depend on
/// `cols`.
pub(crate) fn rms_norm_cols(xt: &[f32], cols: usize, norm: &Norm) -> Vec<f32> {
    let width = norm.weight.len();
    let mut ss = vec![0.0f32; cols];
    for row in xt.chunks_exact(cols) {
        for (s, v) in ss.iter_mut().zip(row) {
            *s += v * v;
        }
    }
    let inv: Vec<f32> = ss
        .iter()
        .map(|s| 1.0 / (s / width as f32 + norm.eps).sqrt())
        .collect();
    let mut out = vec![0.0f32; xt.len()];
    for ((o, row), w) in out
        .chunks_exact_mut(cols)
        .zip(xt.chunks_exact(cols))
        .zip(&norm.weight)
    {
        for ((o, v), i) in o.iter_mut().zip(row).zip(&inv) {
            *o = w * (v * i);
        }
    }
    out
}

/// `x += y` elementwise (the residual connection).
pub(crate) fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// The transpose of a row-major `[rows, cols]` matrix.
///
/// Works through tiles of [`TILE`] rows, writing each output row's piece contiguously: writing
/// straight down a column would touch `cols` lines spaced `rows · 4` bytes apart, which alias in
/// the L1 cache when `rows` is a multiple of 1024.
pub(crate) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; m.len()];
    if rows == 0 || cols == 0 {
        return t;
    }
    for (tile, src) in m.chunks(TILE * cols).enumerate() {
        let r0 = tile * TILE;
        let n = src.len() / cols;
        for (c, dst) in t.chunks_exact_mut(rows).enumerate() {
            for (d, row) in dst[r0..r0 + n].iter_mut().zip(src.chunks_exact(cols)) {
                *d = row[c];
            }
        }
    }
    t
}

/// Rows per tile of [`transpose`].
const TILE: usize = 64;

/// Inverse RoPE frequencies `1 / theta^(2i/d)`, `i < d/2`, in f32 exactly as
/// [`Rope::new`](crate::models::common::Rope::new) computes them.
pub(crate) fn rope_inv_freq(head_dim: usize, theta: f64) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            1.0 / (theta as f32).powf(exponent)
        })
        .collect()
}

/// `cos` and `sin` of `pos · inv_freq` (the first half of HF's duplicated table; the second half
/// is identical), appended to `cos` and `sin`.
pub(crate) fn rope_angles(pos: usize, inv_freq: &[f32], cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
    let p = pos as f32;
    for f in inv_freq {
        let angle = p * f;
        cos.push(angle.cos());
        sin.push(angle.sin());
    }
}

/// HF `rotate_half` RoPE of one head in place: `x * cos + rotate_half(x) * sin`, pairs
/// `(i, i + d/2)`.
pub(crate) fn rope_in_place(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (x1, x2) = x.split_at_mut(half);
    for (((a, b), c), s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
        let (u, v) = (*a, *b);
        *a = u * c + (-v) * s;
        *b = v * c + u * s;
    }
}

/// `silu(gate) · up` from a transposed gate/up GEMM output (`[2 · inter, cols]`: the gate rows,
/// then the up rows), as `[inter, cols]`.
pub(crate) fn silu_mul(gate_up_t: &[f32]) -> Vec<f32> {
    let (gate, up) = gate_up_t.split_at(gate_up_t.len() / 2);
    gate.iter()
        .zip(up)
        .map(|(g, u)| g / (1.0 + exp(-g)) * u)
        .collect()
}

/// `eˣ` for f32, branch-free so that loops over it vectorise (libm's `expf` is a call per
/// element): `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`, a degree-7 Taylor polynomial for `eʳ`
/// (truncation error < 1e-8 relative), and `2ⁿ` built from its bits. Within 2 ulps of
/// `f32::exp` on `[-87, 88]`; inputs are clamped to that range (below it the result is ~1e-38
/// instead of a denormal or 0, above it finite instead of infinite; NaN gives ~1e-38).
#[inline]
// `max`/`min` vectorise to `maxps`/`minps`; `clamp` keeps NaN, which costs scalar checks.
#[allow(clippy::manual_clamp)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // ln 2 to 17 bits
    const LN2_LO: f32 = 1.428_606_8e-6; // ln 2 − LN2_HI
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding and subtracting it rounds to an integer
    let x = x.max(-87.0).min(88.0);
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2ⁿ for n ∈ [-126, 127]: `2²³ + n + 127` holds `n + 127` in its low mantissa bits, which
    // the shift moves into the exponent field (a float-to-int cast would not vectorise).
    let biased = n + (8_388_608.0 + 127.0);
    p * f32::from_bits(biased.to_bits() << 23)
}

/// Columns of logits one task of [`logprobs_and_entropy_t`] reduces.
const SCORE_COLS: usize = 64;

/// Per column `c` of transposed logits `logits_t` (`[vocab, cols]`, row-major):
/// `log_softmax(column)[targets[c]]` and, when `with_entropy`, the entropy of `softmax(column)`.
///
/// Each column reduces over the vocabulary in order (maximum, then `Σ exp(x − max)` and
/// `Σ exp(x − max)·(x − max)` accumulated in f64), whatever the column count or the thread, so
/// results are batch-invariant. Columns are split into tasks of [`SCORE_COLS`] run with rayon;
/// each task walks the rows front to back, reading a contiguous slice of each.
///
/// Returns `(logprobs, entropy)`, each of length `cols` (`entropy` empty unless requested).
/// `targets` must hold `cols` ids below `vocab` (checked by the caller).
pub(crate) fn logprobs_and_entropy_t(
    logits_t: &[f32],
    cols: usize,
    targets: &[u32],
    with_entropy: bool,
) -> (Vec<f32>, Vec<f32>) {
    debug_assert_eq!(targets.len(), cols);
    debug_assert!(cols == 0 || logits_t.len().is_multiple_of(cols));
    let mut logprobs = vec![0.0f32; cols];
    let mut entropy = vec![0.0f32; if with_entropy { cols } else { 0 }];
    if cols == 0 {
        return (logprobs, entropy);
    }
    let vocab = logits_t.len() / cols;
    let reduce = |c0: usize, lp: &mut [f32], ent: &mut [f32]| {
        let w = lp.len();
        let rows = || logits_t.chunks_exact(cols).map(|row| &row[c0..c0 + w]);
        let mut max = vec![f32::NEG_INFINITY; w];
        for row in rows() {
            for (m, &x) in max.iter_mut().zip(row) {
                *m = m.max(x);
            }
        }
        let mut z = vec![0.0f64; w];
        let mut s1 = vec![0.0f64; w];
        let mut e = vec![0.0f32; w];
        for row in rows() {
            for ((e, &x), &m) in e.iter_mut().zip(row).zip(&max) {
                *e = exp(x - m);
            }
            for (z, &e) in z.iter_mut().zip(&e) {
                *z += f64::from(e);
            }
            if with_entropy {
                for (((s, &e), &x), &m) in s1.iter_mut().zip(&e).zip(row).zip(&max) {
                    *s += f64::from(e) * f64::from(x - m);
                }
            }
        }
        for j in 0..w {
            let c = c0 + j;
            let log_z = z[j].ln();
            let target = targets[c] as usize;
            debug_assert!(target < vocab);
            let x = logits_t[target * cols + c];
            lp[j] = (f64::from(x - max[j]) - log_z) as f32;
            if with_entropy {
                ent[j] = (log_z - s1[j] / z[j]) as f32;
            }
        }
    };
    if with_entropy {
        logprobs
            .par_chunks_mut(SCORE_COLS)
            .zip(entropy.par_chunks_mut(SCORE_COLS))
            .enumerate()
            .for_each(|(i, (lp, ent))| reduce(i * SCORE_COLS, lp, ent));
    } else {
        logprobs
            .par_chunks_mut(SCORE_COLS)
            .enumerate()
            .for_each(|(i, lp)| reduce(i * SCORE_COLS, lp, &mut []));
    }
    (logprobs, entropy)
}

/// Head counts and widths of one attention layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
}

/// Causal attention of one query token over positions `0..len` of its sequence.
///
/// - `q`: the token's queries `[heads, head_dim]`, already normed and rotated;
/// - `k_pool`: one layer's keys, `[blocks, kv_heads, head_dim, BLOCK_TOKENS]` (a block's keys
///   transposed, so the scores of a block's 16 positions accumulate side by side);
/// - `v_pool`: one layer's values, `[blocks, kv_heads, BLOCK_TOKENS, head_dim]`;
/// - `blocks`: the sequence's block table (position `p` lives in `blocks[p / BLOCK_TOKENS]`);
/// - `scores`: scratch, resized here;
/// - `out`: `[heads, head_dim]`, overwritten.
///
/// Query head `j` reads kv head `j / (heads / kv_heads)`. Each score sums over the head dimension
/// in order, the softmax sum and each output element over positions in order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    shape: HeadShape,
    q: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    blocks: &[u32],
    len: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    const B: usize = BLOCK_TOKENS;
    let HeadShape {
        heads,
        kv_heads,
        head_dim: d,
    } = shape;
    let group = heads / kv_heads;
    let scale = (d as f32).powf(-0.5);
    let n_blocks = len.div_ceil(B);
    let blocks = &blocks[..n_blocks];
    // Scores `[heads, stride]` of a whole number of blocks; slots past `len` are never read.
    let stride = n_blocks * B;
    scores.clear();
    scores.resize(heads * stride, 0.0);
    // Blocks outer, heads inner: a block's keys (then values) of all heads are one contiguous
    // `kv_heads · 16 · head_dim` run, read front to back.
    for (b, &block) in blocks.iter().enumerate() {
        let base = block as usize * kv_heads * d * B;
        let tiles = k_pool[base..base + kv_heads * d * B].chunks_exact(d * B);
        for (g, kt) in tiles.enumerate() {
            for r in 0..group {
                let j = g * group + r;
                let mut acc = [0.0f32; B];
                for (qi, krow) in q[j * d..(j + 1) * d].iter().zip(kt.chunks_exact(B)) {
                    for (a, k) in acc.iter_mut().zip(krow) {
                        *a += qi * k;
                    }
                }
                let s = &mut scores[j * stride + b * B..j * stride + (b + 1) * B];
                for (s, a) in s.iter_mut().zip(acc) {
                    *s = a * scale;
                }
            }
        }
    }
    for s in scores.chunks_exact_mut(stride) {
        let s = &mut s[..len];
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        for x in s.iter_mut() {
            *x = exp(*x - max);
        }
        let sum = s.iter().fold(0.0f32, |a, &x| a + x);
        for x in s.iter_mut() {
            *x /= sum;
        }
    }
    out.fill(0.0);
    for (b, &block) in blocks.iter().enumerate() {
        let valid = B.min(len - b * B);
        let base = block as usize * kv_heads * B * d;
        let tiles = v_pool[base..base + kv_heads * B * d].chunks_exact(B * d);
        for (g, vt) in tiles.enumerate() {
            let vb = &vt[..valid * d];
            for r in 0..group {
                let j = g * group + r;
                let w = &scores[j * stride + b * B..j * stride + b * B + valid];
                let or = &mut out[j * d..(j + 1) * d];
                // Eight output elements at a time stay in registers across the block's positions.
                let mut chunks = or.chunks_exact_mut(8);
                for (c, oc) in (&mut chunks).enumerate() {
                    let mut acc = [0.0f32; 8];
                    acc.copy_from_slice(oc);
                    for (wp, vrow) in w.iter().zip(vb.chunks_exact(d)) {
                        for (a, v) in acc.iter_mut().zip(&vrow[c * 8..c * 8 + 8]) {
                            *a += wp * v;
                        }
                    }
                    oc.copy_from_slice(&acc);
                }
                let tail = chunks.into_remainder();
                let t0 = d - tail.len();
                for (wp, vrow) in w.iter().zip(vb.chunks_exact(d)) {
                    for (a, v) in tail.iter_mut().zip(&vrow[t0..]) {
                        *a += wp * v;
                    }
                }
            }
        }
    }
}

/// Widest slice of the inner dimension one GEMM call gets (see [`Gemm`]).
const MAX_K: usize = 512;

/// Row blocks of a [`Gemm`] start at multiples of this (gemm's micro-kernel height for f32), so
/// every output row is computed by the same micro-kernel rows as without blocks.
const ROW_ALIGN: usize = 16;

/// A linear layer's weight, held transposed (`Wᵀ`, `[d_out, d_in]`) as Burn tensors for Flex's
/// GEMM, with an optional bias.
///
/// The weight is cut two ways, once, at construction:
///
/// - **output rows** into one block per rayon thread (at most 8), multiplied concurrently.
///   Flex parallelises a single GEMM itself, but at decode shapes that gains nothing on the
///   2-core development machine, whereas independent row blocks run ~1.6× faster than one GEMM
///   (memory streams in parallel: a decode step's GEMMs are mostly memory-bound);
/// - an **inner dimension** wider than [`MAX_K`] into near-equal slices, each its own contiguous
///   tensor, whose products are summed in order. `gemm` blocks such a depth internally too, but
///   then reads each weight row in strided pieces; contiguous slices stream, which doubles the
///   speed of a one-token step's `down` projection.
///
/// Neither cut depends on the input, so each output element is always computed the same way.
#[derive(Debug, Clone)]
pub(crate) struct Gemm {
    /// Row blocks: output rows `r0..r1`, and the slices of `Wᵀ[r0..r1]` with the input rows
    /// `k0..k1` each multiplies.
    blocks: Vec<RowBlock>,
    bias: Option<Vec<f32>>,
    d_in: usize,
    d_out: usize,
}

/// Output rows `r0..r1` of a [`Gemm`].
#[derive(Debug, Clone)]
struct RowBlock {
    r0: usize,
    r1: usize,
    /// `Wᵀ[r0..r1, k0..k1]` and `(k0, k1)`.
    slices: Vec<(Tensor<2>, usize, usize)>,
}

/// The slices `k0..k1` of an inner dimension of `d_in`.
fn k_slices(d_in: usize) -> Vec<(usize, usize)> {
    let pieces = d_in.div_ceil(MAX_K).max(1);
    let width = d_in.div_ceil(pieces);
    (0..pieces)
        .map(|p| (p * width, ((p + 1) * width).min(d_in)))
        .filter(|(a, b)| a < b)
        .collect()
}

/// Weights below which a [`Gemm`] is one row block: for small matrices, spreading the work over
/// threads costs more than it saves.
const MIN_PARALLEL_WEIGHTS: usize = 1 << 18;

/// The row blocks `r0..r1` of a `[d_out, d_in]` matrix: one per rayon thread (at most 8),
/// aligned to [`ROW_ALIGN`]; a single block below [`MIN_PARALLEL_WEIGHTS`].
fn row_blocks(d_out: usize, d_in: usize) -> Vec<(usize, usize)> {
    let wanted = if d_out * d_in < MIN_PARALLEL_WEIGHTS {
        1
    } else {
        rayon::current_num_threads().clamp(1, 8)
    };
    let height = d_out.div_ceil(wanted).div_ceil(ROW_ALIGN) * ROW_ALIGN;
    (0..wanted)
        .map(|b| (b * height, ((b + 1) * height).min(d_out)))
        .filter(|(a, b)| a < b)
        .collect()
}

impl Gemm {
    /// Wraps `Wᵀ`, given row-major `[d_out, d_in]` (each output feature's weights contiguous).
    pub(crate) fn from_transposed(
        weight_t: Vec<f32>,
        d_in: usize,
        d_out: usize,
        bias: Option<Vec<f32>>,
        device: &Device,
    ) -> Self {
        debug_assert_eq!(weight_t.len(), d_in * d_out);
        let slices = k_slices(d_in);
        let blocks = row_blocks(d_out, d_in)
            .into_iter()
            .map(|(r0, r1)| RowBlock {
                r0,
                r1,
                slices: slices
                    .iter()
                    .map(|&(k0, k1)| {
                        let piece: Vec<f32> = weight_t[r0 * d_in..r1 * d_in]
                            .chunks_exact(d_in)
                            .flat_map(|row| &row[k0..k1])
                            .copied()
                            .collect();
                        let shape = [r1 - r0, k1 - k0];
                        (
                            Tensor::from_data(TensorData::new(piece, shape), device),
                            k0,
                            k1,
                        )
                    })
                    .collect(),
            })
            .collect();
        Self {
            blocks,
            bias,
            d_in,
            d_out,
        }
    }

    /// Wraps `Wᵀ` held in a tensor `[d_out, d_in]`, without bias. Its storage is shared, not
    /// copied: blocks and slices are views.
    pub(crate) fn from_tensor_t(weight_t: Tensor<2>, d_in: usize, d_out: usize) -> Self {
        debug_assert_eq!(weight_t.dims(), [d_out, d_in]);
        let slices = k_slices(d_in);
        let blocks = row_blocks(d_out, d_in)
            .into_iter()
            .map(|(r0, r1)| {
                let rows = weight_t.clone().narrow(0, r0, r1 - r0);
                RowBlock {
                    r0,
                    r1,
                    slices: slices
                        .iter()
                        .map(|&(k0, k1)| (rows.clone().narrow(1, k0, k1 - k0), k0, k1))
                        .collect(),
                }
            })
            .collect();
        Self {
            blocks,
            bias: None,
            d_in,
            d_out,
        }
    }

    /// Wraps `W`, given row-major `[d_in, d_out]` (Burn's `Linear` layout).
    pub(crate) fn new(
        weight: Vec<f32>,
        d_in: usize,
        d_out: usize,
        bias: Option<Vec<f32>>,
        device: &Device,
    ) -> Self {
        Self::from_transposed(transpose(&weight, d_in, d_out), d_in, d_out, bias, device)
    }

    /// `(X · W + bias)ᵀ = Wᵀ · Xᵀ (+ bias)` for transposed activations `xt` (`[d_in, cols]`),
    /// returned transposed (`[d_out, cols]`).
    ///
    /// A single column is padded with a zero column: for one column `gemm` switches to a
    /// matrix-vector kernel whose summation order differs from its matrix-matrix kernel, which
    /// would break batch invariance. From two columns on, each output column is bit-identical
    /// whatever the column count (checked by the tests).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if Flex hands back something other than f32 (a bug).
    pub(crate) fn forward(&self, xt: Vec<f32>, cols: usize) -> Result<Product> {
        debug_assert_eq!(xt.len(), cols * self.d_in);
        let (mut xt, padded) = if cols == 1 {
            (xt.iter().flat_map(|&x| [x, 0.0]).collect(), 2)
        } else {
            (xt, cols)
        };
        // One input tensor per inner slice, shared by the row blocks.
        let slices = &self.blocks.first().map_or(&[][..], |b| &b.slices[..]);
        let device = slices
            .first()
            .map_or_else(Device::flex, |(w, _, _)| w.device());
        let inputs: Vec<Tensor<2>> = slices
            .iter()
            .map(|&(_, k0, k1)| {
                let data = if slices.len() == 1 {
                    std::mem::take(&mut xt)
                } else {
                    xt[k0 * padded..k1 * padded].to_vec()
                };
                Tensor::from_data(TensorData::new(data, [k1 - k0, padded]), &device)
            })
            .collect();
        let block_product = |block: &RowBlock| -> Result<Product> {
            let mut acc: Option<Product> = None;
            for ((w, _, _), x) in block.slices.iter().zip(&inputs) {
                let part = Product(w.clone().matmul(x.clone()).into_data());
                match &mut acc {
                    None => acc = Some(part),
                    Some(acc) => add_in_place(acc.values_mut()?, part.values()?),
                }
            }
            acc.ok_or_else(|| BackendError::InvalidInput("GEMM without weights".into()))
        };
        let mut y = if self.blocks.len() == 1 {
            block_product(&self.blocks[0])?
        } else {
            let parts = self
                .blocks
                .par_iter()
                .map(block_product)
                .collect::<Result<Vec<_>>>()?;
            let mut all = Vec::with_capacity(self.d_out * padded);
            for (block, part) in self.blocks.iter().zip(&parts) {
                debug_assert_eq!(part.values()?.len(), (block.r1 - block.r0) * padded);
                all.extend_from_slice(part.values()?);
            }
            Product(TensorData::new(all, [self.d_out, padded]))
        };
        if padded != cols {
            let column: Vec<f32> = y.values()?.iter().step_by(padded).copied().collect();
            y = Product(TensorData::new(column, [self.d_out, 1]));
        }
        if let Some(bias) = &self.bias {
            for (row, b) in y.values_mut()?.chunks_exact_mut(cols).zip(bias) {
                for v in row {
                    *v += b;
                }
            }
        }
        Ok(y)
    }
}

/// The result of a [`Gemm`]: `[d_out, cols]`, row-major, f32.
#[derive(Debug)]
pub(crate) struct Product(TensorData);

impl Product {
    /// The values.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if Flex produced another dtype than f32 (a bug).
    pub(crate) fn values(&self) -> Result<&[f32]> {
        self.0
            .as_slice::<f32>()
            .map_err(|e| BackendError::InvalidInput(format!("cannot read a GEMM back: {e:?}")))
    }

    /// The values, mutable.
    ///
    /// # Errors
    /// As [`Product::values`].
    pub(crate) fn values_mut(&mut self) -> Result<&mut [f32]> {
        self.0
            .as_mut_slice::<f32>()
            .map_err(|e| BackendError::InvalidInput(format!("cannot read a GEMM back: {e:?}")))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 2000) as f32 / 1000.0 - 1.0
        }
    }

    #[test]
    fn norms_match_the_textbook_formula() {
        let mut rnd = rng(3);
        let x: Vec<f32> = (0..37).map(|_| rnd()).collect();
        let naive: f32 = x.iter().map(|a| a * a).sum();
        assert!((sum_sq(&x) - naive).abs() < 1e-5);
        // Columns of a [37, 3] matrix against the one-vector norm.
        let norm = Norm {
            weight: (0..37).map(|_| rnd()).collect(),
            eps: 1e-6,
        };
        let cols: Vec<Vec<f32>> = (0..3).map(|_| (0..37).map(|_| rnd()).collect()).collect();
        let xt = transpose(&cols.concat(), 3, 37);
        let normed = rms_norm_cols(&xt, 3, &norm);
        for (c, col) in cols.iter().enumerate() {
            let mut want = col.clone();
            rms_norm_in_place(&mut want, &norm);
            for (i, want) in want.iter().enumerate() {
                assert!((normed[i * 3 + c] - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn rope_rotates_pairs_half_apart() {
        let inv = rope_inv_freq(4, 10000.0);
        let (mut c, mut s) = (Vec::new(), Vec::new());
        rope_angles(0, &inv, &mut c, &mut s);
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rope_in_place(&mut x, &c, &s);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0], "position 0 is the identity");
        let (mut c, mut s) = (Vec::new(), Vec::new());
        rope_angles(3, &inv, &mut c, &mut s);
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope_in_place(&mut x, &c, &s);
        assert!((x[0] - 3.0f32.cos()).abs() < 1e-6 && (x[2] - 3.0f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn fast_exp_is_within_a_few_ulps_of_libm() {
        let mut worst = 0.0f32;
        for i in -87_000..88_000 {
            let x = i as f32 * 1e-3 + 1.7e-4;
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 2.5e-7, "max relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) < 1e-37 && exp(1000.0).is_finite());
    }

    #[test]
    fn silu_mul_pairs_gate_and_up_rows() {
        let y = silu_mul(&[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(y[0], 0.0);
        assert!((y[1] - 3.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
    }

    #[test]
    fn attention_matches_a_naive_softmax() {
        let shape = HeadShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 6,
        };
        let (h, kvh, d, len) = (4, 2, 6, 37);
        let blocks = [5u32, 0, 3];
        let mut rnd = rng(11);
        let keys: Vec<f32> = (0..len * kvh * d).map(|_| rnd()).collect(); // [pos, kvh, d]
        let values: Vec<f32> = (0..len * kvh * d).map(|_| rnd()).collect();
        let q: Vec<f32> = (0..h * d).map(|_| rnd()).collect();
        let pool = 6 * kvh * BLOCK_TOKENS * d;
        let (mut kp, mut vp) = (vec![0.0; pool], vec![0.0; pool]);
        for p in 0..len {
            let block = blocks[p / BLOCK_TOKENS] as usize;
            let slot = p % BLOCK_TOKENS;
            for g in 0..kvh {
                for i in 0..d {
                    let src = (p * kvh + g) * d + i;
                    kp[((block * kvh + g) * d + i) * BLOCK_TOKENS + slot] = keys[src];
                    vp[((block * kvh + g) * BLOCK_TOKENS + slot) * d + i] = values[src];
                }
            }
        }
        let mut out = vec![0.0; h * d];
        attend(shape, &q, &kp, &vp, &blocks, len, &mut Vec::new(), &mut out);
        for j in 0..h {
            let g = j / (h / kvh);
            let qj = &q[j * d..(j + 1) * d];
            let s: Vec<f32> = (0..len)
                .map(|p| {
                    let k = &keys[(p * kvh + g) * d..(p * kvh + g + 1) * d];
                    qj.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() / (d as f32).sqrt()
                })
                .collect();
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
            let z: f32 = e.iter().sum();
            for i in 0..d {
                let want: f32 = (0..len)
                    .map(|p| e[p] / z * values[(p * kvh + g) * d + i])
                    .sum();
                assert!((out[j * d + i] - want).abs() < 1e-5, "head {j} dim {i}");
            }
        }
    }

    #[test]
    fn gemm_matches_a_hand_product() {
        let device = Device::flex();
        let w = vec![1., 2., 3., 4., 5., 6.]; // [2, 3]
        let g = Gemm::new(w, 2, 3, Some(vec![0.5, 0., 0.]), &device);
        // Tokens (1, 1) and (2, 0), transposed.
        let y = g.forward(vec![1., 2., 1., 0.], 2).unwrap();
        assert_eq!(y.values().unwrap(), [5.5, 2.5, 7., 4., 9., 6.]);
        let y = g.forward(vec![1., 1.], 1).unwrap();
        assert_eq!(y.values().unwrap(), [5.5, 7., 9.]);
    }

    /// Each output column is bit-identical whatever the column count, including one column
    /// (padded) and inner dimensions above gemm's 512-wide depth blocks.
    #[test]
    fn gemm_columns_do_not_depend_on_the_column_count() {
        let device = Device::flex();
        let mut rnd = rng(12345);
        for (k, n) in [(1408usize, 96usize), (352, 128), (128, 704), (96, 64)] {
            let w: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
            let g = Gemm::new(w, k, n, None, &device);
            let x: Vec<f32> = (0..70 * k).map(|_| rnd()).collect(); // [70 tokens, k]
            let alone: Vec<Vec<f32>> = (0..70)
                .map(|t| {
                    let y = g.forward(x[t * k..(t + 1) * k].to_vec(), 1).unwrap();
                    y.values().unwrap().to_vec()
                })
                .collect();
            for m in [2, 3, 5, 7, 16, 33, 70] {
                let y = g.forward(transpose(&x[..m * k], m, k), m).unwrap();
                let y = transpose(y.values().unwrap(), n, m);
                for (t, want) in alone.iter().take(m).enumerate() {
                    assert!(
                        &y[t * n..(t + 1) * n] == want.as_slice(),
                        "k {k} m {m} token {t}"
                    );
                }
            }
        }
    }
}
