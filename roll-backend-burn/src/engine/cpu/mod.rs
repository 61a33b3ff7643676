//! Hand-scheduled CPU decoding for dense Qwen models over a paged key/value cache.
//!
//! [`CpuDecoder`] holds a dense Qwen2 or Qwen3 model's weights in a decode-friendly layout;
//! [`CpuCache`] holds the keys and values of many sequences in fixed-size blocks of
//! [`BLOCK_TOKENS`] positions. Together they implement [`DecodeBackend`]:
//!
//! ```no_run
//! use roll_backend_burn::engine::cpu::CpuDecoder;
//! use roll_backend_burn::engine::{CacheConfig, DecodeBackend, SeqId, StepInput};
//!
//! let model = roll_backend_burn::load_model("tiny-qwen2", &roll_backend_burn::Device::flex())?;
//! let decoder = CpuDecoder::from_model(&model)?;
//! let mut cache = decoder.new_cache(&CacheConfig { max_seqs: 8, max_cached_tokens: 4096 })?;
//! // A prefill and, in the same call, a decode would be two inputs.
//! let prompt = [51, 28, 223];
//! let logits = decoder.forward(&mut cache, &[StepInput { seq: SeqId(0), tokens: &prompt, start: 0 }])?;
//! assert_eq!(logits.len(), decoder.vocab_size());
//! decoder.release(&mut cache, SeqId(0));
//! # Ok::<(), roll_backend_burn::BackendError>(())
//! ```
//!
//! # How a step runs
//!
//! A [`DecodeBackend::forward`] call flattens every input's new tokens into one batch of `n`
//! tokens (varlen batching, as vLLM does), so prefills and decodes share each GEMM. The residual
//! stream is kept **transposed**, `[hidden, n]`; every linear layer is `X · W` on roll's GEMM
//! ([`gemm`]) with the weight packed once as its right operand and the activations read through
//! their transposed layout. Per layer:
//!
//! 1. HF RMSNorm of each token;
//! 2. **one** GEMM against `q|k|v`, fused at load time (`[(heads + 2·kv_heads)·head_dim, hidden]`),
//!    plus biases;
//! 3. Qwen3's per-head QK-RMSNorm, then HF `rotate_half` RoPE of queries and keys;
//! 4. keys and values written into the sequence's cache blocks;
//! 5. causal attention of each new token over its own sequence's positions `0..=pos`
//!    (grouped-query: query head `j` reads kv head `j / (heads / kv_heads)`), tokens in parallel;
//! 6. the output projection and the residual; RMSNorm, **one** GEMM against `gate|up` fused,
//!    `silu(gate)·up`, the down projection and the residual.
//!
//! Each step of that list is a kernel in its own file: `norm.rs` (RMSNorm), `rope.rs` (rotary
//! embedding), `attention.rs` (paged causal attention), `swiglu.rs` (the MLP's `silu(gate)·up`),
//! `linear.rs` (a linear layer on [`gemm`], roll's blocked GEMM), `logits.rs` (log-probs and entropies for scoring), with
//! `matrix.rs` (transpose, residual add) and `exp.rs` (the vectorised exponential) under them;
//! `weights.rs` builds the decoder's layout from a model and `cache.rs` is the paged cache.
//!
//! The trainer's forward on the CPU is this one: `forward_recorded` runs whole sequences through
//! the layers with a recorder (`record.rs`) that keeps what the training backward reads, so
//! the log-probs a training step computes are the bits the engine samples with.
//!
//! The final norm and the LM head run only on each input's last token: a prefill of a long prompt
//! costs no `[prompt, vocab]` logits. [`CpuDecoder::score`] runs the same layers with the LM head
//! at the positions that predict response tokens instead, and reduces those logits to per-token
//! log-probs and entropies.
//!
//! The GEMMs are roll's own ([`gemm`]: packed panels, an AVX2 + FMA micro-kernel, rayon across
//! pieces of the output), on weights packed once at [`CpuDecoder::from_model`]. Everything else
//! is plain Rust over `f32` slices.
//!
//! # Batch invariance
//!
//! A sequence's logits are bit-identical whatever else shares the call. Every reduction outside
//! the GEMMs (RMSNorm's sum of squares, attention dot products and softmax sums, the weighted sum
//! of values) runs in a fixed order that depends only on the token being reduced, never on the
//! batch or on which thread runs it, and each GEMM output element is one chain of fused
//! multiply-adds over the inner dimension in order, whatever the number of tokens (see
//! [`gemm`]). The tests check this bit for bit, mixing prefills and decodes, at the tiny fixture's shapes and at
//! those of the benchmark's 28M-parameter model.
//!
//! # Numerics
//!
//! Everything is f32 and follows the formulas of [`crate::models`] term by term (HF RMSNorm
//! `w · (x · (1/√(mean(x²) + ε)))`, RoPE angles `pos as f32 · inv_freq`, softmax with the maximum
//! subtracted); only summation orders and the exponential (a polynomial within 2 ulps of libm's,
//! so that it vectorises) differ, so logits agree with [`CausalLm::forward`] to float round-off
//! (≤ 1.6e-5 on the fixtures and random Qwen3 models).

mod attention;
mod cache;
pub(crate) mod exp;
pub mod gemm;
mod linear;
mod logits;
pub(crate) mod matrix;
mod norm;
pub(crate) mod pool;
mod record;
mod rope;
pub(crate) mod scratch;
mod swiglu;
mod weights;

pub use cache::{BLOCK_TOKENS, CpuCache};
pub(crate) use rope::rope_angles;

use super::backend::{CacheConfig, Continuation, DecodeBackend, SeqId, StepInput};
use super::paged::{CacheShape, checked_step};
use super::sampler::{Draw, SampledToken, pick_rows};
use crate::models::{CausalLm, check_id};
use crate::{BackendError, Device, Result};
use attention::{HeadShape, attend};
use burn::tensor::{Int, Tensor, TensorData};
use logits::logprobs_and_entropy_t;
use matrix::{add_in_place, transpose};
use norm::{rms_norm_cols, rms_norm_cols_keeping_roots, rms_norm_in_place};
use rayon::prelude::*;
pub(crate) use record::{AttentionBlock, MlpBlock, Recorder};
use roll_core::policy::{ScoreRequest, TokenScores};
use rope::rope_in_place;
use std::collections::HashMap;
use swiglu::silu_mul;
use weights::Weights;

/// Runs `f` compiled with the widest vector instructions this CPU has — AVX-512 (x86-64-v4), else
/// AVX2 + FMA (v3), else the build's baseline — for loops the compiler vectorises on its own.
/// Only for code whose bits cannot depend on the vector width: element-wise work, sums kept in
/// order (Rust does not reassociate floating-point sums or fuse a multiply and an add unless told
/// to). `f`'s body must be inlined into it for the instructions to apply: call it through
/// [`vectorized!`], which marks the closure `#[inline(always)]` (a closure the inliner keeps out
/// of line is compiled for the baseline), and mark what the closure calls `#[inline(always)]`.
#[inline(always)]
pub(crate) fn widest<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(simd) = pulp::x86::V4::try_new() {
            return simd.vectorize(f);
        }
        if let Some(simd) = pulp::x86::V3::try_new() {
            return simd.vectorize(f);
        }
    }
    f()
}

/// `widest(closure)` with the closure inlined into [`widest`]'s instantiations, so that its loops
/// compile with their instructions: `vectorized!(|| { ... })`.
macro_rules! vectorized {
    ($closure:expr $(,)?) => {
        $crate::engine::cpu::widest(
            #[inline(always)]
            $closure,
        )
    };
}
pub(crate) use vectorized;

/// Tokens per forward call of [`CpuDecoder::score`]; bounds its live activations. Small enough
/// that a layer's activations stay in cache and are allocated from the heap rather than mapped
/// afresh, large enough that each weight read serves hundreds of tokens: scoring 16 × 128 tokens
/// took 20–35% less time in groups of 512 than of 4096 (both fixtures; for the 28M model 256 and
/// 384 were within the host's noise of 512 and 1024 was 10% slower, for the tiny one 512 was the
/// fastest). The bits are the same in any grouping.
const SCORE_TOKENS: usize = 512;

/// The part of a prompt that the sequences sharing it compute once (CPU scoring, the fused
/// training forward, the trainer's micro-batch plan): all of it but its last token, whose row
/// predicts the first response token and so stays each sequence's own. Empty for a prompt of
/// one token, which is then not shared.
pub(crate) fn computed_once(prompt: &[u32]) -> &[u32] {
    prompt.split_last().map_or(&[], |(_, before)| before)
}

/// Tokens whose logits exist at once in [`CpuDecoder::logprobs_at`]: `HEAD_COLS × vocab` floats.
const HEAD_COLS: usize = 256;

/// One sequence of [`CpuDecoder::forward_recorded`]: its tokens, and the earlier sequence of the
/// same call whose tokens come before them, if any (a prompt several sequences share, computed
/// once). A continuation's tokens sit at positions from that sequence's length on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordedSeq<'a> {
    /// The tokens this sequence computes.
    pub tokens: &'a [u32],
    /// The index of the sequence it continues (which continues none itself).
    pub after: Option<usize>,
}

/// A dense Qwen2/Qwen3 model's weights laid out for cached decoding on the CPU.
///
/// Built from a [`CausalLm`] by [`CpuDecoder::from_model`] (a copy: the model can be dropped or
/// trained further). Mixture-of-experts models are not supported. See the [module
/// docs](self) for how a step runs.
#[derive(Debug, Clone)]
pub struct CpuDecoder {
    w: Weights,
}

impl CpuDecoder {
    /// Copies `model`'s weights into the decoder's layout: linear layers packed for roll's GEMM
    /// with `q|k|v` and `gate|up` fused, and the embedding table (a tied LM head packs its own
    /// copy).
    ///
    /// # Errors
    /// [`BackendError::UnsupportedByDecoder`] for [`CausalLm::Qwen3Moe`] (or MLP biases),
    /// [`BackendError::InvalidConfig`] if a parameter's shape disagrees with the model's config,
    /// [`BackendError::InvalidInput`] for a pipeline stage (it holds some of the layers).
    pub fn from_model(model: &CausalLm) -> Result<Self> {
        if model.pipeline_stage().is_some() {
            model.require_whole("run a whole forward")?;
        }
        Self::of_layers(model)
    }

    /// The decoder of whatever layers `model` holds: a pipeline stage's runs that stage only
    /// (the fused training path's forward).
    pub(crate) fn of_layers(model: &CausalLm) -> Result<Self> {
        // Packing is parallel sections, like a forward's (and waits on no peer).
        let w = pool::as_one_job(false, || weights::extract(model, &Device::flex()))?;
        Ok(Self { w })
    }

    /// Decoder layers.
    pub fn num_layers(&self) -> usize {
        self.w.layers.len()
    }

    /// Key/value heads per layer.
    pub fn num_kv_heads(&self) -> usize {
        self.w.dims.kv_heads
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.w.dims.head_dim
    }

    /// The shape of the caches this decoder reads and writes.
    fn cache_shape(&self) -> CacheShape {
        CacheShape {
            layers: self.num_layers(),
            kv_heads: self.num_kv_heads(),
            head_dim: self.head_dim(),
        }
    }

    /// Embedding rows of `ids`, `[ids.len(), hidden]`.
    fn embed_rows(&self, ids: Vec<i32>) -> Result<Vec<f32>> {
        let device = self.w.embed.device();
        let n = ids.len();
        let index = Tensor::<1, Int>::from_data(TensorData::new(ids, [n]), &device);
        self.w
            .embed
            .clone()
            .select(0, index)
            .into_data()
            .try_into_vec::<f32>()
            .map_err(|e| BackendError::InvalidInput(format!("cannot read embeddings: {e:?}")))
    }

    /// Runs the layers over the flattened tokens of `inputs`, whose blocks `cache` has reserved,
    /// handing `rec` what it asks for on the way, and returns the final residual stream,
    /// transposed (`[hidden, tokens]`). The stream starts from the tokens' embeddings, or from
    /// `stream_in` (`[hidden, tokens]`, a pipeline stage's input from the stage before). In each
    /// layer, once the tokens' keys and values are written, each of `continuations` copies its
    /// shared positions into the sequence that continues them, before anything attends.
    fn run<R: Recorder>(
        &self,
        cache: &mut CpuCache,
        inputs: &[StepInput<'_>],
        continuations: &[Continuation],
        stream_in: Option<&[f32]>,
        rec: &mut R,
    ) -> Result<Vec<f32>> {
        let dims = self.w.dims;
        let (hidden, heads, kv_heads, d) = (dims.hidden, dims.heads, dims.kv_heads, dims.head_dim);
        let half = d / 2;
        let q_width = heads * d;
        let qkv_width = (heads + 2 * kv_heads) * d;
        let shape = HeadShape {
            heads,
            kv_heads,
            head_dim: d,
        };

        // Flatten: per token, its id, its input, its position and its RoPE angles.
        let n: usize = inputs.iter().map(|i| i.tokens.len()).sum();
        let mut ids = Vec::with_capacity(n);
        let mut tok_input = Vec::with_capacity(n);
        let mut tok_pos = Vec::with_capacity(n);
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for (i, input) in inputs.iter().enumerate() {
            for (t, &id) in input.tokens.iter().enumerate() {
                let pos = input.start + t;
                ids.push(check_id(id, dims.vocab)?);
                tok_input.push(i);
                tok_pos.push(pos);
                rope_angles(pos, &self.w.inv_freq, &mut cos, &mut sin);
            }
        }
        let tables = inputs
            .iter()
            .map(|i| {
                cache
                    .blocks
                    .table(i.seq)
                    .map(<[u32]>::to_vec)
                    .ok_or_else(|| {
                        BackendError::InvalidInput(format!(
                            "sequence {:?} has no cache entry",
                            i.seq
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let copy_tables = continuations
            .iter()
            .map(|c| {
                let table = |seq| cache.blocks.table(seq).map(<[u32]>::to_vec);
                match (table(c.from), table(c.to)) {
                    (Some(from), Some(to)) => Ok((from, to, c.len)),
                    _ => Err(BackendError::InvalidInput(format!(
                        "a prompt copy from {:?} to {:?} without both cache entries",
                        c.from, c.to
                    ))),
                }
            })
            .collect::<Result<Vec<_>>>()?;

        // The residual stream, transposed: `[hidden, n]`.
        let mut xt = match stream_in {
            None => transpose(&self.embed_rows(ids)?, n, hidden),
            Some(x) if x.len() == n * hidden => x.to_vec(),
            Some(x) => {
                return Err(BackendError::InvalidInput(format!(
                    "a pipeline stage's input holds {} values for {n} tokens of width {hidden}",
                    x.len()
                )));
            }
        };
        for (l, layer) in self.w.layers.iter().enumerate() {
            // Attention block: q|k|v per token.
            let (normed, inv_rms) = rms_norm_cols_keeping_roots(&xt, n, &layer.input_norm);
            rec.attention_input(&xt);
            let mut qkv = layer.qkv.forward_rows(&normed, n);
            rec.qkv_projected(&qkv);
            for (t, row) in qkv.chunks_exact_mut(qkv_width).enumerate() {
                let (c, s) = (
                    &cos[t * half..(t + 1) * half],
                    &sin[t * half..(t + 1) * half],
                );
                let (q, rest) = row.split_at_mut(q_width);
                let k = &mut rest[..kv_heads * d];
                if let Some((qn, kn)) = &layer.qk_norm {
                    q.chunks_exact_mut(d).for_each(|h| rms_norm_in_place(h, qn));
                    k.chunks_exact_mut(d).for_each(|h| rms_norm_in_place(h, kn));
                }
                q.chunks_exact_mut(d)
                    .chain(k.chunks_exact_mut(d))
                    .for_each(|h| rope_in_place(h, c, s));
            }
            for (t, row) in qkv.chunks_exact(qkv_width).enumerate() {
                let (k, v) = row[q_width..].split_at(kv_heads * d);
                for (g, (k, v)) in k.chunks_exact(d).zip(v.chunks_exact(d)).enumerate() {
                    cache.write(l, &tables[tok_input[t]], tok_pos[t], g, k, v);
                }
            }
            for (from, to, len) in &copy_tables {
                cache.copy_prefix(l, from, to, *len);
            }
            let (k_pool, v_pool) = (&cache.k[l], &cache.v[l]);
            let mut attn = scratch::zeroed(n * q_width);
            let attend_token = |scores: &mut Vec<f32>, t: usize, out: &mut [f32]| {
                let q = &qkv[t * qkv_width..t * qkv_width + q_width];
                let len = tok_pos[t] + 1;
                attend(
                    shape,
                    q,
                    k_pool,
                    v_pool,
                    &tables[tok_input[t]],
                    len,
                    scores,
                    out,
                );
                len
            };
            let probs: Vec<Vec<f32>> = if R::KEEPS_PROBS {
                // After `attend`, `scores` holds the probabilities, `[heads, stride]`.
                attn.par_chunks_mut(q_width)
                    .enumerate()
                    .map_init(Vec::new, |scores, (t, out)| {
                        let len = attend_token(scores, t, out);
                        let stride = scores.len() / heads;
                        scores
                            .chunks_exact(stride)
                            .flat_map(|head| &head[..len])
                            .copied()
                            .collect()
                    })
                    .collect()
            } else {
                attn.par_chunks_mut(q_width).enumerate().for_each_init(
                    Vec::new,
                    |scores, (t, out)| {
                        attend_token(scores, t, out);
                    },
                );
                Vec::new()
            };
            let attn_t = transpose(&attn, n, q_width);
            scratch::recycle(attn);
            let o = self.reduced(layer.o.forward(&attn_t, n))?;
            rec.attention(AttentionBlock {
                normed_t: normed,
                inv_rms,
                qkv,
                probs,
                out_t: attn_t,
            });
            add_in_place(&mut xt, &o);
            scratch::recycle(o);

            // MLP block.
            let (normed, inv_rms) = rms_norm_cols_keeping_roots(&xt, n, &layer.post_norm);
            rec.mlp_input(&xt);
            let gate_up = layer.gate_up.forward(&normed, n);
            let act = silu_mul(&gate_up);
            let down = self.reduced(layer.down.forward(&act, n))?;
            rec.mlp(MlpBlock {
                normed_t: normed,
                inv_rms,
                gate_up_t: gate_up,
                act_t: act,
            });
            add_in_place(&mut xt, &down);
            scratch::recycle(down);
        }
        Ok(xt)
    }

    /// A block's output from this rank's partial sum (a tensor-parallel model), or the output
    /// itself.
    fn reduced(&self, mut partial: Vec<f32>) -> Result<Vec<f32>> {
        if let Some(shard) = &self.w.tensor_shard {
            shard.all_reduce(&mut partial)?;
        }
        Ok(partial)
    }

    /// The final norm of the tokens `at` of a final residual stream `xt` (`[hidden, cols]`):
    /// the LM head's input, transposed (`[hidden, at.len()]`).
    fn head_input(&self, xt: &[f32], cols: usize, at: &[usize]) -> Vec<f32> {
        let mut picked_t = Vec::with_capacity(self.w.dims.hidden * at.len());
        for row in xt.chunks_exact(cols) {
            picked_t.extend(at.iter().map(|&t| row[t]));
        }
        rms_norm_cols(&picked_t, at.len(), &self.w.final_norm)
    }

    /// `log p(targets[i])` (and, when `with_entropy`, the entropy) of the next-token
    /// distribution after token `at[i]` of a final residual stream `xt` (`[hidden, cols]`), the
    /// LM head running on [`HEAD_COLS`] tokens at a time (which bounds the live logits).
    pub(crate) fn logprobs_at(
        &self,
        xt: &[f32],
        cols: usize,
        at: &[usize],
        targets: &[u32],
        with_entropy: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (mut logprobs, mut entropy) = (Vec::with_capacity(at.len()), Vec::new());
        for (at, targets) in at.chunks(HEAD_COLS).zip(targets.chunks(HEAD_COLS)) {
            let logits_t = self
                .w
                .lm_head
                .forward(&self.head_input(xt, cols, at), at.len());
            let (lp, ent) = logprobs_and_entropy_t(&logits_t, at.len(), targets, with_entropy);
            logprobs.extend(lp);
            entropy.extend(ent);
        }
        Ok((logprobs, entropy))
    }

    /// Runs whole sequences through every layer in one call, as a prefill would, handing `rec`
    /// the activations as they are made; returns the final residual stream, transposed
    /// (`[hidden, tokens]`, the sequences' tokens end to end). The training path's forward: see
    /// [`Recorder`]. A pipeline stage after the first starts from `stream_in`, the stage before's
    /// output (`[hidden, tokens]`), instead of the embeddings.
    ///
    /// A sequence may continue another one of the call ([`RecordedSeq::after`]): a prompt that
    /// several sequences share (a GRPO group's) is then computed once, and each continuation
    /// attends to its keys and values as to its own. Each continuation reads copies of them in
    /// the same cache slots its own prefill would have written, so its bits are those of the
    /// whole sequence run alone.
    ///
    /// # Errors
    /// [`BackendError::TokenOutOfVocab`] for an id outside the vocabulary,
    /// [`BackendError::InvalidInput`] for a sequence continuing one that is not an earlier
    /// sequence starting at position 0, or if the temporary cache cannot be allocated.
    pub(crate) fn forward_recorded<R: Recorder>(
        &self,
        seqs: &[RecordedSeq<'_>],
        stream_in: Option<&[f32]>,
        rec: &mut R,
    ) -> Result<Vec<f32>> {
        let mut inputs = Vec::with_capacity(seqs.len());
        let mut continuations = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            let start = match s.after {
                None => 0,
                Some(j) => {
                    let parent = seqs.get(j).filter(|p| j < i && p.after.is_none());
                    let parent = parent.ok_or_else(|| {
                        BackendError::InvalidInput(format!(
                            "recorded sequence {i} continues {j}, which is not an earlier \
                             sequence starting at position 0"
                        ))
                    })?;
                    if !parent.tokens.is_empty() {
                        continuations.push(Continuation {
                            from: SeqId(j as u64),
                            to: SeqId(i as u64),
                            len: parent.tokens.len(),
                        });
                    }
                    parent.tokens.len()
                }
            };
            if !s.tokens.is_empty() {
                inputs.push(StepInput {
                    seq: SeqId(i as u64),
                    tokens: s.tokens,
                    start,
                });
            }
        }
        let tokens: usize = inputs.iter().map(|i| i.start + i.tokens.len()).sum();
        let mut cache = CpuCache::scratch(
            self.cache_shape(),
            &CacheConfig {
                max_seqs: inputs.len().max(1),
                max_cached_tokens: tokens.max(1),
            },
        )?;
        // A continuation without tokens of its own needs no copy.
        continuations.retain(|c| inputs.iter().any(|i| i.seq == c.to));
        let out = self.step(&mut cache, &inputs, &continuations, stream_in, rec);
        cache.recycle();
        out
    }

    /// Checks `inputs` against `cache`, creates the sequences `continuations` start (each holding
    /// the positions it shares), reserves the inputs' blocks, runs them (see [`Self::run`]) and
    /// commits — or, if anything fails, gives back the reservation and the created sequences.
    fn step<R: Recorder>(
        &self,
        cache: &mut CpuCache,
        inputs: &[StepInput<'_>],
        continuations: &[Continuation],
        stream_in: Option<&[f32]>,
        rec: &mut R,
    ) -> Result<Vec<f32>> {
        let input = |seq: SeqId| inputs.iter().find(|i| i.seq == seq);
        for c in continuations {
            let from = input(c.from).is_some_and(|i| i.start + i.tokens.len() >= c.len);
            let to = input(c.to).is_some_and(|i| i.start == c.len);
            let chained = continuations.iter().any(|d| d.to == c.from);
            if c.from == c.to || !from || !to || chained {
                return Err(BackendError::InvalidInput(format!(
                    "{c:?}: `from` must be an input reaching position {} that continues no other \
                     input, and `to` one starting there",
                    c.len
                )));
            }
        }
        let mut started = Vec::with_capacity(continuations.len());
        let mut result = Ok(Vec::new());
        for c in continuations {
            result = cache.blocks.start_at(c.to, c.len).map(|()| Vec::new());
            if result.is_err() {
                break;
            }
            started.push(c.to);
        }
        if result.is_ok() {
            result = checked_step(
                cache,
                self.cache_shape(),
                self.vocab_size(),
                inputs,
                |cache| self.run(cache, inputs, continuations, stream_in, rec),
            );
        }
        if result.is_err() {
            started
                .into_iter()
                .for_each(|seq| cache.blocks.release(seq));
        }
        result
    }

    /// The logits of every input's last token (what [`DecodeBackend::forward`] returns), on the
    /// caller's thread.
    fn forward_logits(
        &self,
        cache: &mut CpuCache,
        inputs: &[StepInput<'_>],
        continuations: &[Continuation],
    ) -> Result<Vec<f32>> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        // The LM head runs on each input's last token only (an empty input is rejected by
        // `step` before anything runs).
        let last: Vec<usize> = inputs
            .iter()
            .scan(0, |end, i| {
                *end += i.tokens.len();
                Some(end.saturating_sub(1))
            })
            .collect();
        let n = last.last().map_or(0, |&t| t + 1);
        let xt = self.step(cache, inputs, continuations, None, &mut ())?;
        Ok(self
            .w
            .lm_head
            .forward_rows(&self.head_input(&xt, n, &last), last.len()))
    }

    /// Scores every sequence of `request` — `logprobs[t] = log p(response[t] | prompt,
    /// response[..t])` and, when `request.with_entropy`, the entropy of that next-token
    /// distribution — with the same semantics as [`crate::score`] without a value head
    /// (`values` is always `None`; a sequence with an empty response gets empty results).
    ///
    /// Each sequence is prefilled into a temporary [`CpuCache`], the LM head running only at the
    /// positions that predict response tokens. Sequences are packed, in request order, into
    /// forward calls of at most 512 tokens (a longer sequence is prefilled in pieces across
    /// calls), and the LM head runs on 256 positions at a time, which bounds the live logits to
    /// `256 × vocab` floats. A prompt that several sequences share (a GRPO group's) is computed
    /// once: the later sequences start at its last token from a copy of its keys and values.
    /// Results are batch-invariant: a sequence's scores are bit-identical whatever else the
    /// request holds.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a sequence with a response but an empty prompt,
    /// [`BackendError::TokenOutOfVocab`] for an id outside the vocabulary (in a sequence with a
    /// response), or if the temporary cache cannot be allocated.
    pub fn score(&self, request: &ScoreRequest) -> Result<Vec<TokenScores>> {
        pool::as_one_job(self.waits_on_peers(), || {
            self.score_in_groups(request, SCORE_TOKENS)
                .map(|(scores, _)| scores)
        })
    }

    /// Whether a forward exchanges with other ranks (a tensor-parallel shard's all-reduce): then
    /// it runs on its caller's thread, not as one job on the pool (see [`pool::as_one_job`]).
    pub(crate) fn waits_on_peers(&self) -> bool {
        self.w.tensor_shard.is_some()
    }

    /// [`Self::score`] with forward calls of at most `budget` computed tokens; also returns how
    /// many tokens were computed.
    fn score_in_groups(
        &self,
        request: &ScoreRequest,
        budget: usize,
    ) -> Result<(Vec<TokenScores>, usize)> {
        /// Positions `start..end` of sequence `k` (an index into `todo`).
        struct Piece {
            k: usize,
            start: usize,
            end: usize,
        }
        let budget = budget.max(1);
        let vocab = self.vocab_size();
        let mut results = vec![TokenScores::default(); request.sequences.len()];
        let mut todo = Vec::new();
        for (i, s) in request.sequences.iter().enumerate() {
            if s.response_ids.is_empty() {
                results[i].entropy = request.with_entropy.then(Vec::new);
                continue;
            }
            if s.prompt_ids.is_empty() {
                return Err(BackendError::InvalidInput(format!(
                    "sequence {i} has an empty prompt: its first response token has no context"
                )));
            }
            todo.push(i);
        }
        let seqs: Vec<Vec<u32>> = todo
            .iter()
            .map(|&i| {
                let s = &request.sequences[i];
                [s.prompt_ids.as_slice(), s.response_ids.as_slice()].concat()
            })
            .collect();
        for &id in seqs.iter().flatten() {
            check_id(id, vocab)?;
        }
        let prompt_len = |k: usize| request.sequences[todo[k]].prompt_ids.len();

        // A prompt of two tokens or more that several sequences share (a GRPO group's) is
        // computed once, all of it but its last token, by the first of them; each later one
        // starts at that token, from a copy of the first's keys and values in the slots its own
        // prefill would have written (as the engine and the training forward share prompts), so
        // every score keeps its bits.
        let mut first_with: HashMap<&[u32], usize> = HashMap::new();
        let parent: Vec<Option<usize>> = (0..todo.len())
            .map(|k| {
                let prompt = request.sequences[todo[k]].prompt_ids.as_slice();
                if computed_once(prompt).is_empty() {
                    return None;
                }
                let first = *first_with.entry(prompt).or_insert(k);
                (first != k).then_some(first)
            })
            .collect();
        let shared = |k: usize| {
            parent[k].map_or(0, |_| {
                computed_once(&request.sequences[todo[k]].prompt_ids).len()
            })
        };

        // Pack the sequences, in order, into groups of at most `budget` computed tokens, cutting
        // a sequence where a group fills up.
        let mut groups: Vec<Vec<Piece>> = Vec::new();
        let (mut group, mut tokens) = (Vec::new(), 0);
        for (k, seq) in seqs.iter().enumerate() {
            let mut start = shared(k);
            while start < seq.len() {
                if tokens == budget {
                    groups.push(std::mem::take(&mut group));
                    tokens = 0;
                }
                let end = (start + budget - tokens).min(seq.len());
                group.push(Piece { k, start, end });
                tokens += end - start;
                start = end;
            }
        }
        if !group.is_empty() {
            groups.push(group);
        }
        // A sequence's entry goes once its last piece has run and, for a prompt's first
        // sequence, every sequence continuing it has started.
        let mut waiting = vec![0usize; seqs.len()];
        for &j in parent.iter().flatten() {
            waiting[j] += 1;
        }
        let mut done = vec![false; seqs.len()];
        let releases: Vec<Vec<usize>> = groups
            .iter()
            .map(|group| {
                let mut out = Vec::new();
                for p in group {
                    if let Some(j) = parent[p.k].filter(|_| p.start == shared(p.k)) {
                        waiting[j] -= 1;
                        if done[j] && waiting[j] == 0 {
                            out.push(j);
                        }
                    }
                    if p.end == seqs[p.k].len() {
                        done[p.k] = true;
                        if waiting[p.k] == 0 {
                            out.push(p.k);
                        }
                    }
                }
                out
            })
            .collect();
        // The entries alive while each group runs, and the positions they hold.
        let (mut max_seqs, mut max_cached) = (0, 0);
        let mut held: HashMap<usize, usize> = HashMap::new();
        for (group, released) in groups.iter().zip(&releases) {
            for p in group {
                held.insert(p.k, p.end);
            }
            max_seqs = max_seqs.max(held.len());
            max_cached = max_cached.max(held.values().sum::<usize>());
            for k in released {
                held.remove(k);
            }
        }
        if max_seqs == 0 {
            return Ok((results, 0));
        }
        let mut cache = CpuCache::scratch(
            self.cache_shape(),
            &CacheConfig {
                max_seqs,
                max_cached_tokens: max_cached,
            },
        )?;

        for (k, &i) in todo.iter().enumerate() {
            let n = request.sequences[i].response_ids.len();
            results[i] = TokenScores {
                logprobs: vec![0.0; n],
                entropy: request.with_entropy.then(|| vec![0.0; n]),
                values: None,
            };
            debug_assert_eq!(seqs[k].len(), prompt_len(k) + n);
        }
        let mut computed = 0;
        for (group, released) in groups.iter().zip(&releases) {
            let mut inputs = Vec::with_capacity(group.len());
            let mut continuations = Vec::new();
            // Flattened token, target id, and (sequence, response index) of each scored position.
            let (mut at, mut targets, mut dest) = (Vec::new(), Vec::new(), Vec::new());
            let mut offset = 0;
            for p in group {
                let seq = &seqs[p.k];
                let prompt = prompt_len(p.k);
                if let Some(j) = parent[p.k].filter(|_| p.start == shared(p.k)) {
                    let (from, to, len) = (SeqId(j as u64), SeqId(p.k as u64), p.start);
                    // The shared positions were computed by an earlier call, or are in this one.
                    if cache.blocks.cached_len(from) >= len {
                        self.fork(&mut cache, from, to, len)?;
                    } else {
                        continuations.push(Continuation { from, to, len });
                    }
                }
                inputs.push(StepInput {
                    seq: SeqId(p.k as u64),
                    tokens: &seq[p.start..p.end],
                    start: p.start,
                });
                for q in p.start.max(prompt - 1)..p.end.min(seq.len() - 1) {
                    at.push(offset + q - p.start);
                    targets.push(seq[q + 1]);
                    dest.push((todo[p.k], q + 1 - prompt));
                }
                offset += p.end - p.start;
            }
            computed += offset;
            let xt = self.step(&mut cache, &inputs, &continuations, None, &mut ())?;
            let (logprobs, entropy) =
                self.logprobs_at(&xt, offset, &at, &targets, request.with_entropy)?;
            for (j, &(i, t)) in dest.iter().enumerate() {
                results[i].logprobs[t] = logprobs[j];
                if let Some(e) = &mut results[i].entropy {
                    e[t] = entropy[j];
                }
            }
            for &k in released {
                cache.blocks.release(SeqId(k as u64));
            }
        }
        cache.recycle();
        Ok((results, computed))
    }
}

impl DecodeBackend for CpuDecoder {
    type Cache = CpuCache;

    fn vocab_size(&self) -> usize {
        self.w.dims.vocab
    }

    fn new_cache(&self, config: &CacheConfig) -> Result<CpuCache> {
        CpuCache::new(self.cache_shape(), config)
    }

    fn fits(&self, cache: &CpuCache) -> bool {
        cache.shape == self.cache_shape()
    }

    fn forward(&self, cache: &mut CpuCache, inputs: &[StepInput<'_>]) -> Result<Vec<f32>> {
        pool::as_one_job(self.waits_on_peers(), || {
            self.forward_logits(cache, inputs, &[])
        })
    }

    fn forward_sample(
        &self,
        cache: &mut CpuCache,
        inputs: &[StepInput<'_>],
        draws: &[Option<Draw>],
    ) -> Result<Vec<Option<Result<SampledToken>>>> {
        self.forward_sample_continuing(cache, inputs, &[], draws)
    }

    fn continues_prompts(&self) -> bool {
        true
    }

    fn forward_sample_continuing(
        &self,
        cache: &mut CpuCache,
        inputs: &[StepInput<'_>],
        continuations: &[Continuation],
        draws: &[Option<Draw>],
    ) -> Result<Vec<Option<Result<SampledToken>>>> {
        pool::as_one_job(self.waits_on_peers(), || {
            let logits = self.forward_logits(cache, inputs, continuations)?;
            Ok(pick_rows(&logits, self.vocab_size(), draws))
        })
    }

    fn fork(&self, cache: &mut CpuCache, from: SeqId, to: SeqId, len: usize) -> Result<()> {
        let held = cache.blocks.cached_len(from);
        if held < len {
            return Err(BackendError::InvalidInput(format!(
                "cannot copy {len} positions of sequence {from:?}, which holds {held}"
            )));
        }
        let Some(src) = cache.blocks.table(from).map(<[u32]>::to_vec) else {
            return Err(BackendError::InvalidInput(format!(
                "sequence {from:?} has no cache entry"
            )));
        };
        cache.blocks.start_at(to, len)?;
        let Some(dst) = cache.blocks.table(to).map(<[u32]>::to_vec) else {
            return Err(BackendError::InvalidInput(format!(
                "sequence {to:?} has no cache entry after it was made"
            )));
        };
        for layer in 0..self.num_layers() {
            cache.copy_prefix(layer, &src, &dst, len);
        }
        Ok(())
    }

    fn release(&self, cache: &mut CpuCache, seq: SeqId) {
        cache.blocks.release(seq);
    }

    fn truncate(&self, cache: &mut CpuCache, seq: SeqId, len: usize) {
        cache.blocks.truncate(seq, len);
    }
}

/// Uniform test values in `[-1, 1)` from the project's generator, for the kernels' tests.
#[cfg(test)]
fn uniform(seed: u64) -> impl FnMut() -> f32 {
    let mut rng = roll_core::rng::SplitMix64::new(seed);
    move || (rng.next_f64() * 2.0 - 1.0) as f32
}

#[cfg(test)]
mod tests;
