//! The KV-cached decoder for any Burn device and any architecture (Qwen3-MoE included): the
//! engine's decoder wherever the [`CpuDecoder`](super::cpu::CpuDecoder) does not run — a GPU, or
//! a mixture of experts.
//!
//! Keys and values live on the device in a paged cache ([`DeviceCache`]): per layer one pool of
//! `[blocks · 16, kv_heads · head_dim]` rows, with the block tables of [`PagedBlocks`] on the host.
//! A forward appends each input's tokens to its sequence's pages and attends over them, so a
//! decode step costs one token's work plus a read of the sequence's cache — not a recomputation of
//! the whole sequence as [`BurnDecoder`](super::BurnDecoder) does (that one stays as the oracle
//! this decoder is tested against).
//!
//! The arithmetic is the model's own: its weights, its [`linear_rows`] projections, its
//! feed-forward block (dense SwiGLU or routed experts), its LM head. What runs the row-wise
//! pieces depends on the device:
//! - on a cubecl device (features `wgpu`, `cuda`), roll's CubeCL kernels (module `gpu`): RMSNorm
//!   (and the residual add fused into the next norm), rotary embedding, SwiGLU, attention read
//!   straight from the pages (`gpu::paged_attention`, online softmax, no `[t, t]` scores
//!   written), and the sampling of each row's token (`gpu::sample`), so that logits stay on the
//!   device;
//! - anywhere else, Burn's tensor ops: the sequence's rows gathered from the pools, then
//!   matmul, masked softmax, matmul.
//!
//! **Batch invariance.** Each input of a forward runs through ops of its own (the inputs go
//! through the layers side by side, layer by layer), so no op ever sees another sequence's rows:
//! a sequence's logits are the same whatever shares the call. (Stacking the inputs' rows into
//! one GEMM would be faster on a GPU, but a GEMM's kernel choice — and so its rounding — may
//! depend on the row count.) The one exception is an expert-parallel mixture, whose experts
//! take every input's and every rank's routed rows in one product, as expert parallelism must:
//! there a sequence's logits are as exact as the experts' products are independent of their
//! row count — on the CPU, bit for bit in every test (`expert_parallel_engine_tests.rs`).

use super::backend::{CacheConfig, DecodeBackend, SeqId, StepInput};
use super::paged::{BLOCK_TOKENS, CacheShape, PagedBlocks, PagedCache, checked_step};
use super::sampler::{Draw, SampledToken, pick_rows};
use crate::models::{
    Architecture, CausalLm, Decoder, DecoderLayer, FeedForwardBlock, check_id, linear_rows,
    rms_norm_hf, with_decoder,
};
use crate::{BackendError, Result};
use burn::module::Module;
use burn::nn::{Linear, RmsNorm};
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, DType, Device, Int, Tensor, TensorData};

/// A [`CausalLm`] decoding with a key/value cache on its device.
#[derive(Debug)]
pub struct DeviceDecoder {
    model: CausalLm,
    device: Device,
}

/// The paged key/value cache of a [`DeviceDecoder`], on the decoder's device.
#[derive(Debug)]
pub struct DeviceCache {
    shape: CacheShape,
    blocks: PagedBlocks,
    /// Per layer, keys `[blocks · 16, kv_heads · head_dim]`: block `b`'s position `p` is row
    /// `b · 16 + p mod 16`.
    k: Vec<Tensor<2>>,
    /// Per layer, values, laid out as the keys.
    v: Vec<Tensor<2>>,
    /// What stands in for a pool while it is being written (see [`append`]).
    placeholder: Tensor<2>,
}

impl DeviceCache {
    /// Which blocks each sequence holds.
    pub fn blocks(&self) -> &PagedBlocks {
        &self.blocks
    }
}

impl PagedCache for DeviceCache {
    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn blocks_mut(&mut self) -> &mut PagedBlocks {
        &mut self.blocks
    }
}

impl DeviceDecoder {
    /// Wraps `model`, which must live on `device`.
    pub fn new(model: CausalLm, device: Device) -> Self {
        Self { model, device }
    }

    /// Copies `model` for decoding (a cheap, shared-storage clone).
    ///
    /// # Errors
    /// Never; the signature matches the other decoders' constructors.
    pub fn from_model(model: &CausalLm, device: &Device) -> Result<Self> {
        Ok(Self::new(model.clone(), device.clone()))
    }

    fn shape(&self) -> CacheShape {
        let c = self.model.decoder_config();
        CacheShape {
            layers: c.num_hidden_layers,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
        }
    }

    /// The next-token logits (`[inputs, vocab]`) after each input, whose blocks `cache` has
    /// reserved; `None` for no inputs. The inputs go through the layers together, layer by
    /// layer, but each through its own ops — only an expert-parallel mixture takes every
    /// input's tokens at once, in one exchange with the other ranks per layer.
    fn run_all(
        &self,
        cache: &mut DeviceCache,
        inputs: &[StepInput<'_>],
    ) -> Result<Option<Tensor<2>>> {
        let rows = inputs
            .iter()
            .map(|input| {
                let end = input.start + input.tokens.len();
                cache.blocks.rows(input.seq, end).ok_or_else(|| {
                    BackendError::InvalidInput(format!(
                        "sequence {:?} has no cache blocks for {end} positions",
                        input.seq
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        with_decoder!(&self.model, m => self.run_decoder(m, cache, inputs, &rows))
    }

    fn run_decoder<A: Architecture>(
        &self,
        m: &Decoder<A>,
        cache: &mut DeviceCache,
        inputs: &[StepInput<'_>],
        rows: &[Vec<usize>],
    ) -> Result<Option<Tensor<2>>> {
        let hidden = m.config.decoder().hidden_size;
        let mut xs = Vec::with_capacity(inputs.len());
        let mut steps = Vec::with_capacity(inputs.len());
        for (input, rows) in inputs.iter().zip(rows) {
            let t = input.tokens.len();
            let ids = input
                .tokens
                .iter()
                .map(|&id| check_id(id, self.model.vocab_size()))
                .collect::<Result<Vec<i32>>>()?;
            let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, t]), &self.device);
            let x = m.model.embed_tokens.forward(ids).reshape([t, hidden]);
            steps.push(Step::new(
                Path::of(&x),
                input.start,
                t,
                rows,
                m.rope.inv_freq(),
                &self.device,
            )?);
            xs.push(x);
        }
        for (l, layer) in m.model.layers.iter().enumerate() {
            let mut residuals = Vec::with_capacity(xs.len());
            let mut normed = Vec::with_capacity(xs.len());
            for (step, x) in steps.iter().zip(xs) {
                let pools = (&mut cache.k[l], &mut cache.v[l], &cache.placeholder);
                let (h, n) = step.attention(layer, x, pools)?;
                residuals.push(h);
                normed.push(n);
            }
            let fed = match self.model.expert_parallel_mixture(l) {
                // Every rank's tokens at once: one exchange per layer and call.
                Some((_, mixture)) => mixture.expert_parallel_rows(normed, hidden, &self.device)?,
                None => steps
                    .iter()
                    .zip(normed)
                    .map(|(step, n)| step.feed_forward(layer, n))
                    .collect::<Result<_>>()?,
            };
            xs = residuals.into_iter().zip(fed).map(|(h, f)| h + f).collect();
        }
        let logits = steps
            .iter()
            .zip(xs)
            .map(|(step, x)| {
                let t = step.tokens;
                let last = step.path.norm(x.narrow(0, t - 1, 1), &m.model.norm)?;
                let vocab = self.model.vocab_size();
                Ok(m.logits(last.reshape([1, 1, hidden])).reshape([1, vocab]))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((!logits.is_empty()).then(|| Tensor::cat(logits, 0)))
    }

    /// Runs each input through the model (see [`checked_step`]): their next-token logits
    /// (`[inputs, vocab]`, on the device), `None` for no inputs. An expert-parallel model's
    /// ranks run their steps together ([`DeviceDecoder::step_with_peers`]).
    fn step(&self, cache: &mut DeviceCache, inputs: &[StepInput<'_>]) -> Result<Option<Tensor<2>>> {
        if self.model.expert_group().is_some() {
            return self.step_with_peers(cache, inputs);
        }
        if inputs.is_empty() {
            return Ok(None);
        }
        checked_step(cache, self.shape(), self.vocab_size(), inputs, |cache| {
            self.run_all(cache, inputs)
        })
    }

    /// [`DeviceDecoder::step`] of an expert-parallel model: every mixture layer exchanges its
    /// inputs' tokens with the other ranks' once per call, so every rank goes through every
    /// layer in every call, with no inputs of its own too (its experts then serve the others').
    /// A call this rank refuses (a bad id, a full cache) still takes part, serving, then fails;
    /// one that fails part way aborts the group, which stops every peer's engine.
    fn step_with_peers(
        &self,
        cache: &mut DeviceCache,
        inputs: &[StepInput<'_>],
    ) -> Result<Option<Tensor<2>>> {
        let mut ran = false;
        let result = checked_step(cache, self.shape(), self.vocab_size(), inputs, |cache| {
            ran = true;
            self.run_all(cache, inputs)
        });
        if !ran {
            self.run_all(cache, &[])?;
        } else if let (Err(e), Some(group)) = (&result, self.model.expert_group()) {
            // Failed part way, the others may be waiting at a mixture this rank never reached:
            // their next exchange fails instead of waiting for ever.
            group.abort(&format!("expert-parallel decoding failed: {e}"));
        }
        result
    }
}

impl DecodeBackend for DeviceDecoder {
    type Cache = DeviceCache;

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn new_cache(&self, config: &CacheConfig) -> Result<DeviceCache> {
        let shape = self.shape();
        let blocks = PagedBlocks::new(config)?;
        shape.pool_len(&blocks, config)?;
        let rows = blocks.total_blocks() * BLOCK_TOKENS;
        let width = shape.kv_heads * shape.head_dim;
        let pool = || Tensor::<2>::zeros([rows, width], &self.device);
        Ok(DeviceCache {
            shape,
            blocks,
            k: (0..shape.layers).map(|_| pool()).collect(),
            v: (0..shape.layers).map(|_| pool()).collect(),
            placeholder: Tensor::zeros([1, width], &self.device),
        })
    }

    fn fits(&self, cache: &DeviceCache) -> bool {
        cache.shape == self.shape()
    }

    fn forward(&self, cache: &mut DeviceCache, inputs: &[StepInput<'_>]) -> Result<Vec<f32>> {
        match self.step(cache, inputs)? {
            Some(logits) => read_rows(logits),
            None => Ok(Vec::new()),
        }
    }

    /// On a cubecl device the logits never leave it: `gpu::sample` picks
    /// each row's token there. Elsewhere, the host picks from the logits read back.
    fn forward_sample(
        &self,
        cache: &mut DeviceCache,
        inputs: &[StepInput<'_>],
        draws: &[Option<Draw>],
    ) -> Result<Vec<Option<Result<SampledToken>>>> {
        let Some(logits) = self.step(cache, inputs)? else {
            return Ok(Vec::new());
        };
        #[cfg(feature = "gpu-kernels")]
        if crate::gpu::on_cube_device(&logits) {
            return sample_on_device(logits, draws);
        }
        Ok(pick_rows(&read_rows(logits)?, self.vocab_size(), draws))
    }

    fn peers(&self) -> Option<std::sync::Arc<dyn roll_core::strategy::Strategy>> {
        self.model.expert_group()
    }

    fn release(&self, cache: &mut DeviceCache, seq: SeqId) {
        cache.blocks.release(seq);
    }

    fn truncate(&self, cache: &mut DeviceCache, seq: SeqId, len: usize) {
        cache.blocks.truncate(seq, len);
    }
}

/// What runs the row-wise pieces of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Burn's tensor ops, on any device.
    Burn,
    /// roll's CubeCL kernels, on a cubecl device.
    #[cfg(feature = "gpu-kernels")]
    Cube,
}

impl Path {
    /// Where `x` lives decides what runs the row-wise work.
    fn of(x: &Tensor<2>) -> Self {
        #[cfg(feature = "gpu-kernels")]
        if crate::gpu::on_cube_device(x) {
            return Self::Cube;
        }
        let _ = x;
        Self::Burn
    }

    /// HF RMSNorm of each row of `x` (`[rows, d]`).
    fn norm(self, x: Tensor<2>, norm: &RmsNorm) -> Result<Tensor<2>> {
        match self {
            Self::Burn => Ok(rms_norm_hf(norm, x)),
            #[cfg(feature = "gpu-kernels")]
            Self::Cube => crate::gpu::rms_norm(x, norm.gamma.val(), norm.epsilon as f32),
        }
    }

    /// `(x + residual, norm(x + residual))`.
    fn add_norm(
        self,
        x: Tensor<2>,
        residual: Tensor<2>,
        norm: &RmsNorm,
    ) -> Result<(Tensor<2>, Tensor<2>)> {
        match self {
            Self::Burn => {
                let sum = x + residual;
                Ok((sum.clone(), rms_norm_hf(norm, sum)))
            }
            #[cfg(feature = "gpu-kernels")]
            Self::Cube => {
                crate::gpu::rms_norm_residual(x, residual, norm.gamma.val(), norm.epsilon as f32)
            }
        }
    }

    /// `x · W (+ b)` of a linear layer on rows `x`.
    fn linear(self, linear: &Linear, x: Tensor<2>) -> Tensor<2> {
        match self {
            Self::Burn => two_rows_at_least(x, |x| linear_rows(linear, x)),
            #[cfg(feature = "gpu-kernels")]
            Self::Cube => linear_rows(linear, x),
        }
    }

    /// `silu(gate) · up`.
    fn swiglu(self, gate: Tensor<2>, up: Tensor<2>) -> Result<Tensor<2>> {
        match self {
            Self::Burn => Ok(burn::tensor::activation::silu(gate) * up),
            #[cfg(feature = "gpu-kernels")]
            Self::Cube => crate::gpu::silu_mul(gate, up),
        }
    }
}

/// One forward call's per-sequence constants: the positions it appends, their pool rows and
/// their rotary tables, shared by every layer.
struct Step<'a> {
    path: Path,
    start: usize,
    tokens: usize,
    /// Pool row of each position `0 .. start + tokens`.
    rows: &'a [usize],
    /// The rows as an i32 index tensor, for gathering (Burn path) or reading in the kernel.
    row_index: Tensor<1, Int>,
    /// Rotary tables of the new positions.
    rope: RopeTables,
}

/// The rotary tables of a step's positions, in the form its path reads.
enum RopeTables {
    /// `[tokens, 1, head_dim]` full-width tables, the sine with `rotate_half`'s sign folded in
    /// (see [`Rope::rotate`](crate::models::Rope::rotate)).
    Full {
        cos: Tensor<3>,
        signed_sin: Tensor<3>,
    },
    /// `[tokens, head_dim / 2]`, as `gpu::rope` reads them.
    #[cfg(feature = "gpu-kernels")]
    Half { cos: Tensor<2>, sin: Tensor<2> },
}

impl<'a> Step<'a> {
    fn new(
        path: Path,
        start: usize,
        tokens: usize,
        rows: &'a [usize],
        inv_freq: &[f32],
        device: &Device,
    ) -> Result<Self> {
        let half = inv_freq.len();
        let (mut cos, mut sin) = (
            Vec::with_capacity(tokens * half),
            Vec::with_capacity(tokens * half),
        );
        for pos in start..start + tokens {
            super::cpu::rope_angles(pos, inv_freq, &mut cos, &mut sin);
        }
        let rope = match path {
            Path::Burn => {
                // HF's table repeats the half table: `[c, c]`, and `[-s, s]` with the sign.
                let full = |table: &[f32], sign: f32| -> Tensor<3> {
                    let values: Vec<f32> = table
                        .chunks_exact(half.max(1))
                        .flat_map(|row| {
                            row.iter()
                                .map(move |&v| sign * v)
                                .chain(row.iter().copied())
                        })
                        .collect();
                    Tensor::from_data(TensorData::new(values, [tokens, 1, 2 * half]), device)
                };
                RopeTables::Full {
                    cos: full(&cos, 1.0),
                    signed_sin: full(&sin, -1.0),
                }
            }
            #[cfg(feature = "gpu-kernels")]
            Path::Cube => {
                let table = |values: Vec<f32>| {
                    Tensor::<2>::from_data(TensorData::new(values, [tokens, half]), device)
                };
                RopeTables::Half {
                    cos: table(cos),
                    sin: table(sin),
                }
            }
        };
        let index = rows
            .iter()
            .map(|&r| {
                i32::try_from(r).map_err(|_| {
                    BackendError::InvalidInput(format!("cache row {r} beyond i32 indexing"))
                })
            })
            .collect::<Result<Vec<i32>>>()?;
        let len = index.len();
        Ok(Self {
            path,
            start,
            tokens,
            rows,
            row_index: Tensor::from_data(TensorData::new(index, [len]), (device, DType::I32)),
            rope,
        })
    }

    /// Positions the sequence holds after this step.
    fn len(&self) -> usize {
        self.start + self.tokens
    }

    /// The attention block of a decoder layer over the step's rows `x` (`[tokens, hidden]`),
    /// its keys and values appended to the layer's pools: the residual stream after it, and
    /// that normed for the feed-forward block.
    fn attention<F: Module + FeedForwardBlock>(
        &self,
        layer: &DecoderLayer<F>,
        x: Tensor<2>,
        (k_pool, v_pool, placeholder): (&mut Tensor<2>, &mut Tensor<2>, &Tensor<2>),
    ) -> Result<(Tensor<2>, Tensor<2>)> {
        let attn = &layer.self_attn;
        let (t, d) = (self.tokens, attn.head_dim);
        let (heads, kv_heads) = (attn.num_heads, attn.num_kv_heads);
        let linear = |lin, x| self.path.linear(lin, x);
        let normed = self.path.norm(x.clone(), &layer.input_layernorm)?;
        let q = linear(&attn.q_proj, normed.clone()).reshape([t * heads, d]);
        let k = linear(&attn.k_proj, normed.clone()).reshape([t * kv_heads, d]);
        let v = linear(&attn.v_proj, normed);
        let (q, k) = match (&attn.q_norm, &attn.k_norm) {
            (Some(qn), Some(kn)) => (self.path.norm(q, qn)?, self.path.norm(k, kn)?),
            _ => (q, k),
        };
        let q = self.rope(q, heads)?;
        let k = self.rope(k, kv_heads)?;
        let new_k = k.reshape([t, kv_heads * d]);
        append(k_pool, new_k, self.rows, self.start, placeholder);
        append(v_pool, v, self.rows, self.start, placeholder);
        let scale = (d as f64).powf(-0.5) as f32;
        let out = self.attend(q, k_pool, v_pool, heads, kv_heads, d, scale)?;
        let attended = linear(&attn.o_proj, out);
        self.path
            .add_norm(attended, x, &layer.post_attention_layernorm)
    }

    /// The feed-forward block of a decoder layer on the step's normed rows (`[tokens, hidden]`).
    fn feed_forward<F: Module + FeedForwardBlock>(
        &self,
        layer: &DecoderLayer<F>,
        normed: Tensor<2>,
    ) -> Result<Tensor<2>> {
        let linear = |lin, x| self.path.linear(lin, x);
        let t = self.tokens;
        Ok(match layer.mlp.dense() {
            Some(mlp) => {
                let gate = linear(&mlp.gate_proj, normed.clone());
                let up = linear(&mlp.up_proj, normed);
                linear(&mlp.down_proj, self.path.swiglu(gate, up)?)
            }
            None => {
                let hidden = normed.dims()[1];
                layer
                    .mlp
                    .try_forward(normed.reshape([1, t, hidden]))?
                    .reshape([t, hidden])
            }
        })
    }

    /// Rotary embedding of `x` (`[tokens · heads, head_dim]`, token-major).
    fn rope(&self, x: Tensor<2>, heads: usize) -> Result<Tensor<2>> {
        match &self.rope {
            RopeTables::Full { cos, signed_sin } => {
                let [n, d] = x.dims();
                let x = x.reshape([self.tokens, heads, d]);
                let half = d / 2;
                let swapped = Tensor::cat(
                    vec![
                        x.clone().narrow(2, half, half),
                        x.clone().narrow(2, 0, half),
                    ],
                    2,
                );
                Ok((x * cos.clone() + swapped * signed_sin.clone()).reshape([n, d]))
            }
            #[cfg(feature = "gpu-kernels")]
            RopeTables::Half { cos, sin } => {
                let positions: Vec<usize> = (0..self.tokens).collect();
                crate::gpu::rope(x, heads, &positions, cos.clone(), sin.clone())
            }
        }
    }

    /// Causal grouped-query attention of the step's queries (`[tokens · heads, head_dim]`,
    /// rotated) over the sequence's cached keys and values; returns `[tokens, heads · head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: Tensor<2>,
        k_pool: &Tensor<2>,
        v_pool: &Tensor<2>,
        heads: usize,
        kv_heads: usize,
        d: usize,
        scale: f32,
    ) -> Result<Tensor<2>> {
        let t = self.tokens;
        match self.path {
            Path::Burn => {
                let len = self.len();
                let rep = heads / kv_heads;
                // `[kv_heads, len, d]`: the sequence's keys and values, gathered from the pages.
                // Both copied contiguous (a reshape of a permuted view copies): a transposed
                // view would let small products take gemm's dot-product kernel, whose rounding
                // depends on the sizes — and so on how a prompt was chunked.
                let gather = |pool: &Tensor<2>, dims: [usize; 3]| {
                    pool.clone()
                        .select(0, self.row_index.clone())
                        .reshape([len, kv_heads, d])
                        .permute(dims)
                        .reshape([kv_heads * len * d])
                };
                let keys_t = gather(k_pool, [1, 2, 0]).reshape([kv_heads, d, len]);
                let values = gather(v_pool, [1, 0, 2]).reshape([kv_heads, len, d]);
                // Query heads `j·rep .. (j+1)·rep` share kv head `j`: stacked along the rows.
                let q = q
                    .reshape([t, kv_heads, rep, d])
                    .permute([1, 2, 0, 3])
                    .reshape([kv_heads, rep * t, d]);
                let scores = two_rows_at_least(q, |q| q.matmul(keys_t))
                    .mul_scalar(scale)
                    .reshape([kv_heads, rep, t, len]);
                let scores = if t > 1 {
                    scores.mask_fill(self.future_mask(kv_heads, rep), f32::NEG_INFINITY)
                } else {
                    scores
                };
                let probs = softmax(scores, 3).reshape([kv_heads, rep * t, len]);
                Ok(two_rows_at_least(probs, |p| p.matmul(values))
                    .reshape([kv_heads, rep, t, d])
                    .permute([2, 0, 1, 3])
                    .reshape([t, heads * d]))
            }
            #[cfg(feature = "gpu-kernels")]
            Path::Cube => crate::gpu::paged_attention(
                q,
                k_pool.clone(),
                v_pool.clone(),
                self.row_index.clone(),
                self.start,
                heads,
                kv_heads,
                scale,
            )
            .map(|out| out.reshape([t, heads * d])),
        }
    }

    /// `[kv_heads, rep, tokens, len]`, true where key position `p` lies after query `i`'s
    /// position `start + i`.
    fn future_mask(&self, kv_heads: usize, rep: usize) -> Tensor<4, Bool> {
        let (t, len) = (self.tokens, self.len());
        let mask: Vec<bool> = (0..t)
            .flat_map(|i| (0..len).map(move |p| p > self.start + i))
            .collect();
        let device = self.row_index.device();
        Tensor::<2, Bool>::from_data(TensorData::new(mask, [t, len]), &device)
            .reshape([1, 1, t, len])
            .expand([kv_heads, rep, t, len])
    }
}

/// The logits, read back to the host.
fn read_rows(logits: Tensor<2>) -> Result<Vec<f32>> {
    logits
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| BackendError::InvalidInput(format!("reading logits: {e:?}")))
}

/// The rows that have draws, sampled by the device kernel.
#[cfg(feature = "gpu-kernels")]
fn sample_on_device(
    logits: Tensor<2>,
    draws: &[Option<Draw>],
) -> Result<Vec<Option<Result<SampledToken>>>> {
    let wanted: Vec<(usize, Draw)> = draws
        .iter()
        .enumerate()
        .filter_map(|(row, d)| d.map(|d| (row, d)))
        .collect();
    let mut out: Vec<Option<Result<SampledToken>>> = draws.iter().map(|_| None).collect();
    if wanted.is_empty() {
        return Ok(out);
    }
    let device = logits.device();
    let rows: Vec<i32> = wanted
        .iter()
        .map(|&(row, _)| i32::try_from(row).unwrap_or(i32::MAX))
        .collect();
    let index = Tensor::<1, Int>::from_data(TensorData::new(rows, [wanted.len()]), &device);
    let draws: Vec<Draw> = wanted.iter().map(|&(_, d)| d).collect();
    let picked = crate::gpu::sample(logits.select(0, index), &draws)?;
    for (&(row, _), token) in wanted.iter().zip(picked) {
        out[row] = Some(token);
    }
    Ok(out)
}

/// `product(x)` for a product that acts on each row of `x` (dimension `D − 2`) on its own, with a
/// lone row computed as one of two: for a single row the CPU's GEMM switches to a matrix-vector
/// kernel with another summation order, which would make a token's bits depend on whether it was
/// fed alone or in a chunk — and a prompt reused from the prefix cache must give the bits of a cold
/// prefill. The CPU decoder pads the same way.
fn two_rows_at_least<const D: usize>(
    x: Tensor<D>,
    product: impl FnOnce(Tensor<D>) -> Tensor<D>,
) -> Tensor<D> {
    let rows = D - 2;
    if x.dims()[rows] == 1 {
        product(x.repeat_dim(rows, 2)).narrow(rows, 0, 1)
    } else {
        product(x)
    }
}

/// Writes `new` (`[tokens, width]`, positions `start ..`) into the pool rows of those positions,
/// one contiguous run (part of one block) at a time, in place.
fn append(
    pool: &mut Tensor<2>,
    new: Tensor<2>,
    rows: &[usize],
    start: usize,
    placeholder: &Tensor<2>,
) {
    let [tokens, width] = new.dims();
    let mut t = 0;
    while t < tokens {
        // Positions `start + t ..` stay in one block until the next multiple of the block size.
        let run = (BLOCK_TOKENS - (start + t) % BLOCK_TOKENS).min(tokens - t);
        let row = rows[start + t];
        // Moved out (a placeholder in its place) so that the pool's buffer is not shared and
        // the assignment writes in place instead of copying the pool.
        let taken = std::mem::replace(pool, placeholder.clone());
        *pool = taken.slice_assign([row..row + run, 0..width], new.clone().narrow(0, t, run));
        t += run;
    }
}

#[cfg(test)]
mod tests;
