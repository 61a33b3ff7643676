//! A dense Qwen model's parameters as the fused path reads them: GEMM weights packed for the
//! backward's products, norms and biases as `f32` vectors, each with
//! the [`ParamId`] its gradient is registered under and whether it trains at all (under LoRA the
//! base is frozen and only the adapters train).

use super::attention::Heads;
use super::head::Head;
use super::mm::{self, Init, Mat, MatRef, OutputGrad, PackedA, PackedB};
use crate::engine::cpu::{CpuDecoder, pool};
use crate::models::{Architecture, Attention, CausalLm, Decoder, Mlp, PipelineStage, TensorShard};
use crate::{BackendError, Result};
use burn::module::{Param, ParamId};
use burn::nn::{Linear, RmsNorm};
use burn::tensor::Tensor;
use std::sync::{Arc, OnceLock};

/// One GEMM weight `W` `[d_in, d_out]` (Burn's `Linear` layout: `y = x·W + b`) of a
/// [`Projection`], held as the backward reads it. With a LoRA adapter, `W` is the effective
/// `W + scale·A·B` the forward multiplies by.
#[derive(Debug, Clone)]
pub(crate) struct Matrix {
    pub id: ParamId,
    /// `[d_in, d_out]`.
    pub dims: [usize; 2],
    /// `Wᵀ`, packed as the right operand of `dY·Wᵀ`.
    pub weight_t: PackedB,
    /// `W` packed as the left operand of `W·dYᵀ` (the input's gradient transposed), from
    /// `weight_t` when first needed.
    weight: OnceLock<PackedA>,
    pub bias: Option<Vector>,
    /// Whether `W` itself trains (not under LoRA, whose base is frozen).
    pub trains: bool,
    pub adapter: Option<Adapter>,
}

/// One product of the forward: a linear layer, or several that read the same input side by side
/// (`q|k|v`, `gate|up`), as the CPU decoder multiplies them. Their output gradients sit side by
/// side in one `dY` (`[tokens, Σ d_out]`), so the backward runs one GEMM for all their weights'
/// gradients (`Xᵀ·dY`, split by columns: each element the same chain over the tokens as a GEMM
/// per part). The input's gradient stays one product per part, added in order: one chain over
/// every part would round differently from the path the tests and the main job were measured
/// on, and the demo's SFT stage turns any such change into a different run.
#[derive(Debug, Clone)]
pub(crate) struct Projection {
    /// The parts, in their column order.
    pub parts: Vec<Matrix>,
}

impl Projection {
    /// The input's gradient `Σ_parts dY_part·W_partᵀ`, per token (`[tokens, d_in]`).
    pub(crate) fn input_grad(&self, dy: OutputGrad<'_>) -> Vec<f32> {
        self.sum_over_parts(dy, |m, dy| mm::mul_packed(dy, &m.weight_t))
    }

    /// The input's gradient transposed, `Σ_parts W_part·dY_partᵀ` (`[d_in, tokens]`): the layout
    /// of the activations the forward kept, for a backward that goes on element-wise against
    /// them. Each element is the chain of [`Projection::input_grad`]'s, its factors swapped.
    pub(crate) fn input_grad_t(&self, dy: OutputGrad<'_>) -> Vec<f32> {
        self.sum_over_parts(dy, |m, dy| {
            let w = crate::engine::cpu::pool::made_once(&m.weight, || {
                PackedA::transposed_from(&m.weight_t)
            });
            let dy_t = PackedB::new(dy.t());
            let mut dx_t = crate::engine::cpu::scratch::overwritten(w.m() * dy.rows());
            mm::matmul_packed(&mut dx_t, w, &dy_t, Init::Overwrite);
            dx_t
        })
    }

    /// `product(part, its columns of dY)` of every part, added in order.
    fn sum_over_parts(
        &self,
        dy: OutputGrad<'_>,
        product: impl Fn(&Matrix, MatRef<'_>) -> Vec<f32>,
    ) -> Vec<f32> {
        let (view, mut at) = (dy.view(), 0);
        let mut sum: Option<Vec<f32>> = None;
        for m in &self.parts {
            let part = product(m, view.columns(at..at + m.dims[1]));
            at += m.dims[1];
            match &mut sum {
                Some(sum) => {
                    mm::add_in_place(sum, &part);
                    crate::engine::cpu::scratch::recycle(part);
                }
                None => sum = Some(part),
            }
        }
        sum.unwrap_or_default()
    }

    /// `Σ d_out`: the width of its output (and of `dY`).
    pub(crate) fn width(&self) -> usize {
        self.parts.iter().map(|m| m.dims[1]).sum()
    }
}

/// A LoRA adapter `W + scale·A·B` (`A`: `[d_in, r]`, `B`: `[r, d_out]`). From the effective
/// weight's gradient `dW`: `dA = scale·dW·Bᵀ`, `dB = scale·Aᵀ·dW`.
#[derive(Debug, Clone)]
pub(crate) struct Adapter {
    pub a_id: ParamId,
    pub a: Mat,
    pub b_id: ParamId,
    pub b: Mat,
    pub scale: f32,
}

/// A vector parameter (a norm's gain, a bias).
#[derive(Debug, Clone)]
pub(crate) struct Vector {
    pub id: ParamId,
    pub values: Vec<f32>,
    /// Whether it trains (not under LoRA).
    pub trains: bool,
}

/// One decoder layer.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub input_norm: Vector,
    /// `q|k|v`.
    pub qkv: Projection,
    /// Qwen3's per-head RMSNorm gains of queries and keys.
    pub qk_norm: Option<(Vector, Vector)>,
    pub o: Projection,
    pub post_norm: Vector,
    /// `gate|up`.
    pub gate_up: Projection,
    pub down: Projection,
}

/// Every parameter of the model.
#[derive(Debug, Clone)]
pub(crate) struct Weights {
    pub heads: Heads,
    pub hidden: usize,
    pub vocab: usize,
    pub eps: f32,
    /// The embedding table's id and `[vocab, hidden]` values (rows are gathered).
    pub embed: Vector,
    pub layers: Vec<Layer>,
    pub final_norm: Vector,
    /// The LM head (the embedding table, when tied).
    pub head: Head,
    /// The untied head's id (`None` when tied: its gradient goes to the embedding).
    pub head_id: Option<ParamId>,
    /// Whether the head's weight (the embedding, when tied) trains.
    pub head_trains: bool,
    pub inv_freq: Vec<f32>,
    /// The same weights in the CPU decoder's layout: the forward runs on the decoder's kernels.
    pub decoder: Arc<CpuDecoder>,
    /// This rank's slice of a tensor-parallel model (`heads` and the MLP are its own): the
    /// backward completes the gradient entering each block over the group.
    pub tensor_shard: Option<TensorShard>,
    /// This process's stage of a pipeline-parallel model (`layers` are its own).
    pub stage: Option<PipelineStage>,
}

/// A parameter's values (flattened), id and whether it trains.
pub(crate) fn vector<const D: usize>(p: &Param<Tensor<D>>, name: &str) -> Result<Vector> {
    Ok(Vector {
        id: p.id,
        values: values(&p.val().inner(), name)?,
        trains: trains(p),
    })
}

/// A tensor's values as f32, flattened.
fn values<const D: usize>(t: &Tensor<D>, name: &str) -> Result<Vec<f32>> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| BackendError::Train(format!("fused path: cannot read `{name}`: {e:?}")))
}

/// A 2-D parameter as a [`Mat`].
fn mat(p: &Param<Tensor<2>>, name: &str) -> Result<Mat> {
    let t = p.val().inner();
    let [rows, cols] = t.dims();
    Ok(Mat::new(values(&t, name)?, rows, cols))
}

/// Whether the parameter itself (its base, not an adapter) takes gradients.
fn trains<const D: usize>(p: &Param<Tensor<D>>) -> bool {
    Tensor::is_require_grad(&**p)
}

/// The part of a [`Projection`] that `l` is.
fn matrix(l: &Linear, name: &str) -> Result<Matrix> {
    let w = mat(&l.weight, name)?;
    Ok(Matrix {
        id: l.weight.id,
        dims: w.dims(),
        weight_t: PackedB::new(w.view().t()),
        weight: OnceLock::new(),
        trains: trains(&l.weight),
        adapter: l
            .weight
            .adapter()
            .map(|a| -> Result<Adapter> {
                Ok(Adapter {
                    a_id: a.a.id,
                    a: mat(&a.a, &format!("{name}.lora_A"))?,
                    b_id: a.b.id,
                    b: mat(&a.b, &format!("{name}.lora_B"))?,
                    scale: a.scale as f32,
                })
            })
            .transpose()?,
        bias: l
            .bias
            .as_ref()
            .map(|b| vector(b, &format!("{name}.bias")))
            .transpose()?,
    })
}

/// The projection of `layers` side by side, each named by its `(layer, name)`.
fn projection(layers: &[(&Linear, String)]) -> Result<Projection> {
    Ok(Projection {
        parts: layers
            .iter()
            .map(|(l, name)| matrix(l, name))
            .collect::<Result<Vec<_>>>()?,
    })
}

fn norm(n: &RmsNorm, name: &str) -> Result<Vector> {
    vector(&n.gamma, name)
}

fn layer(attn: &Attention, mlp: &Mlp, input: &RmsNorm, post: &RmsNorm, i: usize) -> Result<Layer> {
    let name = |s: &str| format!("layers.{i}.{s}");
    let qk_norm = match (&attn.q_norm, &attn.k_norm) {
        (Some(q), Some(k)) => Some((norm(q, &name("q_norm"))?, norm(k, &name("k_norm"))?)),
        (None, None) => None,
        _ => {
            return Err(BackendError::InvalidConfig(format!(
                "{}: q_norm and k_norm must be both present or both absent",
                name("self_attn")
            )));
        }
    };
    for (l, s) in [
        (&mlp.gate_proj, "gate_proj"),
        (&mlp.up_proj, "up_proj"),
        (&mlp.down_proj, "down_proj"),
    ] {
        if l.bias.is_some() {
            return Err(BackendError::UnsupportedByDecoder {
                what: format!("{}: MLP biases", name(s)),
            });
        }
    }
    Ok(Layer {
        input_norm: norm(input, &name("input_layernorm"))?,
        qkv: projection(&[
            (&attn.q_proj, name("q_proj")),
            (&attn.k_proj, name("k_proj")),
            (&attn.v_proj, name("v_proj")),
        ])?,
        qk_norm,
        o: projection(&[(&attn.o_proj, name("o_proj"))])?,
        post_norm: norm(post, &name("post_attention_layernorm"))?,
        gate_up: projection(&[
            (&mlp.gate_proj, name("gate_proj")),
            (&mlp.up_proj, name("up_proj")),
        ])?,
        down: projection(&[(&mlp.down_proj, name("down_proj"))])?,
    })
}

fn of<A: Architecture<FeedForward = Mlp>>(
    m: &Decoder<A>,
    decoder: Arc<CpuDecoder>,
) -> Result<Weights> {
    let c = m.local_config();
    let layers = m
        .model
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            layer(
                &l.self_attn,
                &l.mlp,
                &l.input_layernorm,
                &l.post_attention_layernorm,
                i,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let embed_param = &m.model.embed_tokens.weight;
    let embed = vector(embed_param, "embed_tokens")?;
    let (head, head_id, head_trains) = match &m.lm_head {
        Some(l) => {
            if l.bias.is_some() {
                return Err(BackendError::UnsupportedByDecoder {
                    what: "lm_head bias".into(),
                });
            }
            (
                Head::untied(&mat(&l.weight, "lm_head")?),
                Some(l.weight.id),
                trains(&l.weight),
            )
        }
        None => (
            Head::tied(&Mat::new(embed.values.clone(), c.vocab_size, c.hidden_size)),
            None,
            embed.trains,
        ),
    };
    Ok(Weights {
        heads: Heads {
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            dim: c.head_dim,
        },
        hidden: c.hidden_size,
        vocab: c.vocab_size,
        eps: m.model.norm.epsilon as f32,
        embed,
        layers,
        final_norm: norm(&m.model.norm, "norm")?,
        head,
        head_id,
        head_trains,
        inv_freq: m.rope.inv_freq().to_vec(),
        decoder,
        tensor_shard: m.tensor_shard().cloned(),
        stage: m.pipeline_stage.clone(),
    })
}

/// The weights of a dense Qwen2 or Qwen3 model. `packed`, when given, is `model`'s weights
/// already in the CPU decoder's layout (the engine's copy of the same parameters, see
/// [`Trainer::offer_packed`](crate::train::Trainer::offer_packed)): the forward reads it
/// instead of packing them again.
///
/// # Errors
/// [`BackendError::UnsupportedByDecoder`] for Qwen3-MoE or MLP biases.
pub(crate) fn extract(model: &CausalLm, packed: Option<Arc<CpuDecoder>>) -> Result<Weights> {
    let decoder = || match packed {
        Some(decoder) => Ok(decoder),
        None => CpuDecoder::of_layers(model).map(Arc::new),
    };
    // Packing is parallel sections, like a forward's (and waits on no peer).
    pool::as_one_job(false, || match model {
        CausalLm::Qwen2(m) => of(m, decoder()?),
        CausalLm::Qwen3(m) => of(m, decoder()?),
        CausalLm::Qwen3Moe(_) => Err(BackendError::UnsupportedByDecoder {
            what: "qwen3_moe (mixture-of-experts) models on the fused training path".into(),
        }),
    })
}
