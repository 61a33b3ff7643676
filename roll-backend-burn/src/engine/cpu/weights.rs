//! Copies a dense Qwen model's parameters out of Burn into the CPU decoder's layout: f32 vectors
//! for norms and biases, fused linear layers (`q|k|v` stacked, `gate|up` stacked) packed for roll's
//! GEMM, and the embedding table as a Flex tensor (a tied LM head packs its own copy).

use super::linear::Linear;
use super::norm::Norm;
use crate::models::{Architecture, Attention, CausalLm, Decoder, Mlp, TensorShard};
use crate::{BackendError, Result};
use burn::module::Param;
use burn::nn::{Linear as BurnLinear, RmsNorm};
use burn::tensor::{Device, Tensor, TensorData};

/// Sizes of the model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    /// Vocabulary size.
    pub vocab: usize,
    /// Residual width.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// MLP width.
    pub inter: usize,
}

/// One decoder layer.
#[derive(Debug, Clone)]
pub(crate) struct LayerWeights {
    /// RMSNorm before attention.
    pub input_norm: Norm,
    /// `[hidden, (heads + 2·kv_heads)·head_dim]`: q, k, v projections side by side (+ biases).
    pub qkv: Linear,
    /// Qwen3's per-head RMSNorms of queries and keys (width `head_dim`).
    pub qk_norm: Option<(Norm, Norm)>,
    /// `[heads·head_dim, hidden]`.
    pub o: Linear,
    /// RMSNorm before the MLP.
    pub post_norm: Norm,
    /// `[hidden, 2·inter]`: gate and up projections side by side.
    pub gate_up: Linear,
    /// `[inter, hidden]`.
    pub down: Linear,
}

/// Every weight of the model, in the decoder's layout.
#[derive(Debug, Clone)]
pub(crate) struct Weights {
    /// Sizes.
    pub dims: Dims,
    /// Embedding table `[vocab, hidden]`.
    pub embed: Tensor<2>,
    /// Decoder layers.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm.
    pub final_norm: Norm,
    /// The LM head (its `Wᵀ` is the embedding table when tied).
    pub lm_head: Linear,
    /// RoPE inverse frequencies `[head_dim / 2]`.
    pub inv_freq: Vec<f32>,
    /// This rank's slice of a tensor-parallel model (its heads and MLP units; [`Dims`] are its
    /// own): the attention and MLP outputs are partial sums the group adds up.
    pub tensor_shard: Option<TensorShard>,
}

/// The parts of a dense Qwen model the decoder reads; Qwen2 and Qwen3 differ only in sizes,
/// biases and QK-norm.
struct Parts<'a> {
    dims: Dims,
    inv_freq: &'a [f32],
    embed: &'a Param<Tensor<2>>,
    layers: Vec<(&'a Attention, &'a Mlp, &'a RmsNorm, &'a RmsNorm)>,
    norm: &'a RmsNorm,
    lm_head: Option<&'a BurnLinear>,
    tensor_shard: Option<&'a TensorShard>,
}

impl<'a> Parts<'a> {
    /// The parts of a decoder whose every layer has a dense MLP.
    fn of<A: Architecture<FeedForward = Mlp>>(m: &'a Decoder<A>) -> Self {
        let c = m.local_config();
        Parts {
            dims: Dims {
                vocab: c.vocab_size,
                hidden: c.hidden_size,
                heads: c.num_attention_heads,
                kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim,
                inter: c.intermediate_size,
            },
            inv_freq: m.rope.inv_freq(),
            embed: &m.model.embed_tokens.weight,
            layers: m
                .model
                .layers
                .iter()
                .map(|l| {
                    (
                        &l.self_attn,
                        &l.mlp,
                        &l.input_layernorm,
                        &l.post_attention_layernorm,
                    )
                })
                .collect(),
            norm: &m.model.norm,
            lm_head: m.lm_head.as_ref(),
            tensor_shard: m.tensor_shard(),
        }
    }
}

/// Extracts the weights of a dense Qwen2 or Qwen3 model.
///
/// # Errors
/// [`BackendError::UnsupportedByDecoder`] for Qwen3-MoE, [`BackendError::InvalidConfig`] if a
/// tensor's shape disagrees with the config.
pub(crate) fn extract(model: &CausalLm, device: &Device) -> Result<Weights> {
    let parts = match model {
        CausalLm::Qwen2(m) => Parts::of(m),
        CausalLm::Qwen3(m) => Parts::of(m),
        CausalLm::Qwen3Moe(_) => {
            return Err(BackendError::UnsupportedByDecoder {
                what: "qwen3_moe (mixture-of-experts) models; the CPU decoder runs dense \
                       qwen2/qwen3 only"
                    .into(),
            });
        }
    };
    build(&parts, device)
}

fn build(p: &Parts<'_>, device: &Device) -> Result<Weights> {
    let Dims {
        vocab,
        hidden,
        heads,
        kv_heads,
        head_dim: d,
        inter,
    } = p.dims;
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) || d == 0 || d % 2 != 0 {
        return Err(BackendError::InvalidConfig(format!(
            "cpu decoder: {heads} heads / {kv_heads} kv heads / head_dim {d} is not a valid \
             grouped-query layout with even head_dim"
        )));
    }
    if p.inv_freq.len() != d / 2 {
        return Err(BackendError::InvalidConfig(format!(
            "cpu decoder: {} RoPE frequencies for head_dim {d}, expected {}",
            p.inv_freq.len(),
            d / 2
        )));
    }
    let embed = read(p.embed.val(), &[vocab, hidden], "embed_tokens")?;
    let mut layers = Vec::with_capacity(p.layers.len());
    for (i, (attn, mlp, in_norm, post_norm)) in p.layers.iter().enumerate() {
        let name = |s: &str| format!("layers.{i}.{s}");
        let (q, qb) = linear(&attn.q_proj, hidden, heads * d, &name("q_proj"))?;
        let (k, kb) = linear(&attn.k_proj, hidden, kv_heads * d, &name("k_proj"))?;
        let (v, vb) = linear(&attn.v_proj, hidden, kv_heads * d, &name("v_proj"))?;
        let qkv_width = (heads + 2 * kv_heads) * d;
        let qkv = concat_columns(&[(&q, heads * d), (&k, kv_heads * d), (&v, kv_heads * d)]);
        let qkv_bias = match (qb, kb, vb) {
            (None, None, None) => None,
            (qb, kb, vb) => {
                let mut b = qb.unwrap_or_else(|| vec![0.0; heads * d]);
                b.extend(kb.unwrap_or_else(|| vec![0.0; kv_heads * d]));
                b.extend(vb.unwrap_or_else(|| vec![0.0; kv_heads * d]));
                Some(b)
            }
        };
        let (o, ob) = linear(&attn.o_proj, heads * d, hidden, &name("o_proj"))?;
        let qk_norm = match (&attn.q_norm, &attn.k_norm) {
            (Some(qn), Some(kn)) => {
                Some((norm(qn, d, &name("q_norm"))?, norm(kn, d, &name("k_norm"))?))
            }
            (None, None) => None,
            _ => {
                return Err(BackendError::InvalidConfig(format!(
                    "{}: q_norm and k_norm must be both present or both absent",
                    name("self_attn")
                )));
            }
        };
        let (gate, gb) = linear(&mlp.gate_proj, hidden, inter, &name("gate_proj"))?;
        let (up, ub) = linear(&mlp.up_proj, hidden, inter, &name("up_proj"))?;
        let (down, db) = linear(&mlp.down_proj, inter, hidden, &name("down_proj"))?;
        if gb.is_some() || ub.is_some() || db.is_some() {
            return Err(BackendError::UnsupportedByDecoder {
                what: format!("{}: MLP biases", name("mlp")),
            });
        }
        layers.push(LayerWeights {
            input_norm: norm(in_norm, hidden, &name("input_layernorm"))?,
            qkv: Linear::new(&qkv, hidden, qkv_width, qkv_bias),
            qk_norm,
            o: Linear::new(&o, heads * d, hidden, ob),
            post_norm: norm(post_norm, hidden, &name("post_attention_layernorm"))?,
            gate_up: Linear::new(
                &concat_columns(&[(&gate, inter), (&up, inter)]),
                hidden,
                2 * inter,
                None,
            ),
            down: Linear::new(&down, inter, hidden, None),
        });
    }
    let lm_head = match p.lm_head {
        Some(head) => {
            let (w, b) = linear(head, hidden, vocab, "lm_head")?;
            Linear::new(&w, hidden, vocab, b)
        }
        // Tied: `Wᵀ` is the embedding table.
        None => Linear::from_transposed(&embed, hidden, vocab),
    };
    let embed = Tensor::<2>::from_data(TensorData::new(embed, [vocab, hidden]), device);
    Ok(Weights {
        dims: p.dims,
        embed,
        layers,
        final_norm: norm(p.norm, hidden, "norm")?,
        lm_head,
        inv_freq: p.inv_freq.to_vec(),
        tensor_shard: p.tensor_shard.cloned(),
    })
}

/// A tensor's values as f32, checked against the expected shape.
fn read<const D: usize>(t: Tensor<D>, shape: &[usize], name: &str) -> Result<Vec<f32>> {
    let dims = t.dims();
    if dims.as_slice() != shape {
        return Err(BackendError::InvalidConfig(format!(
            "cpu decoder: `{name}` has shape {dims:?}, expected {shape:?}"
        )));
    }
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| {
            BackendError::InvalidConfig(format!("cpu decoder: cannot read `{name}`: {e:?}"))
        })
}

/// A Linear's weight `[d_in, d_out]` and bias.
fn linear(
    l: &BurnLinear,
    d_in: usize,
    d_out: usize,
    name: &str,
) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
    let w = read(l.weight.val(), &[d_in, d_out], name)?;
    let b = l
        .bias
        .as_ref()
        .map(|b| read(b.val(), &[d_out], &format!("{name}.bias")))
        .transpose()?;
    Ok((w, b))
}

/// An RMSNorm's weight and epsilon.
fn norm(n: &RmsNorm, width: usize, name: &str) -> Result<Norm> {
    Ok(Norm {
        weight: read(n.gamma.val(), &[width], name)?,
        eps: n.epsilon as f32,
    })
}

/// Row-major matrices with the same row count, side by side.
fn concat_columns(parts: &[(&Vec<f32>, usize)]) -> Vec<f32> {
    let width: usize = parts.iter().map(|(_, w)| w).sum();
    let rows = parts.first().map_or(0, |(m, w)| m.len() / w);
    let mut out = Vec::with_capacity(rows * width);
    for r in 0..rows {
        for (m, w) in parts {
            out.extend_from_slice(&m[r * w..(r + 1) * w]);
        }
    }
    out
}
