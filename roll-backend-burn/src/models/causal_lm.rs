//! [`CausalLm`]: a model of any supported architecture, chosen by `config.json`'s `model_type`.

use super::attention::causal_padding_mask;
use super::batch::TokenBatch;
use super::decoder::{Architecture, Decoder, DecoderConfig, DecoderLayer, FeedForwardBlock};
use super::expert_parallel::ExpertShard;
use super::norm::rms_norm_hf;
use super::pipeline_parallel::PipelineStage;
use super::qwen2::Qwen2Config;
use super::qwen3::Qwen3Config;
use super::qwen3_moe::{FeedForward, Qwen3MoeConfig};
use super::tensor_parallel::{ExpertSplit, TensorShard};
use crate::hf::HfConfig;
use crate::{BackendError, Result};
use burn::module::{Module, ParamId};
use burn::tensor::{Bool, Device, Tensor};
use roll_core::strategy::{Messenger, Strategy};
use std::sync::Arc;

/// A causal language model of any supported architecture, chosen by `config.json`'s `model_type`.
///
/// Every variant is the same [`Decoder`] with another [`Architecture`]; the enum only says which,
/// so that loading, saving, scoring, generation and training are written once for all of them.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum CausalLm {
    /// `qwen2`.
    Qwen2(Decoder<Qwen2Config>),
    /// `qwen3`.
    Qwen3(Decoder<Qwen3Config>),
    /// `qwen3_moe`.
    Qwen3Moe(Decoder<Qwen3MoeConfig>),
}

/// Runs `$body` with `$m` bound to the decoder of whichever variant `$lm` is.
macro_rules! with_decoder {
    ($lm:expr, $m:ident => $body:expr) => {
        match $lm {
            CausalLm::Qwen2($m) => $body,
            CausalLm::Qwen3($m) => $body,
            CausalLm::Qwen3Moe($m) => $body,
        }
    };
}
pub(crate) use with_decoder;

impl CausalLm {
    /// A randomly initialised model for `config` (by its `model_type`).
    ///
    /// # Errors
    /// [`BackendError::UnknownModelType`] or [`BackendError::InvalidConfig`].
    pub fn init(config: &HfConfig, device: &Device) -> Result<Self> {
        fn build<A: Architecture>(config: &HfConfig, device: &Device) -> Result<Decoder<A>> {
            Ok(A::from_hf(config)?.init(device))
        }
        Ok(match config.model_type.as_str() {
            "qwen2" => Self::Qwen2(build(config, device)?),
            "qwen3" => Self::Qwen3(build(config, device)?),
            "qwen3_moe" => Self::Qwen3Moe(build(config, device)?),
            other => {
                return Err(BackendError::UnknownModelType {
                    model_type: other.to_string(),
                });
            }
        })
    }

    /// The HF `config.json` content of this model.
    pub fn hf_config(&self) -> HfConfig {
        with_decoder!(self, m => m.config.to_hf())
    }

    /// The sizes shared by every architecture (vocabulary, widths, heads, layers, RoPE base).
    pub fn decoder_config(&self) -> &DecoderConfig {
        with_decoder!(self, m => m.config.decoder())
    }

    /// The longest sequence (prompt and response) the model was built for, if its config says.
    pub fn max_position_embeddings(&self) -> Option<usize> {
        self.decoder_config().max_position_embeddings
    }

    /// Refuses sequences (their lengths in tokens, prompt and response, in request order)
    /// longer than [`CausalLm::max_position_embeddings`]: positions past it were never trained,
    /// and a model silently extrapolating there is a wrong result, not an answer.
    ///
    /// # Errors
    /// [`BackendError::SequenceTooLong`](crate::BackendError::SequenceTooLong) naming the first
    /// sequence too long.
    pub fn check_lengths(&self, lengths: impl IntoIterator<Item = usize>) -> crate::Result<()> {
        let max = self.max_position_embeddings();
        lengths
            .into_iter()
            .enumerate()
            .try_for_each(|(sequence, length)| check_length(max, sequence, length))
    }

    /// Vocabulary size (valid token ids are `0..vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.decoder_config().vocab_size
    }

    /// Width of the hidden states ([`CausalLm::forward_hidden`]'s last dimension).
    pub fn hidden_size(&self) -> usize {
        self.decoder_config().hidden_size
    }

    /// Final-norm hidden states (the trunk without the LM head).
    ///
    /// # Shapes
    /// - `batch.input_ids`: `[batch, seq]`
    /// - output: `[batch, seq, hidden]`
    pub fn forward_hidden(&self, batch: &TokenBatch) -> Tensor<3> {
        with_decoder!(self, m => m.forward_hidden(batch))
    }

    /// The embeddings of `batch`'s tokens, its rotary tables and its attention mask: what every
    /// layer's forward reads (a block-wise forward runs the layers one at a time).
    pub(crate) fn layer_inputs(&self, batch: &TokenBatch) -> LayerInputs {
        with_decoder!(self, m => {
            let (cos, sin) = m.rope.cos_sin(&batch.position_ids);
            LayerInputs {
                embedded: m.model.embed_tokens.forward(batch.input_ids.clone()),
                cos,
                sin,
                mask: causal_padding_mask(&batch.attention_mask),
            }
        })
    }

    /// The decoder layers this model holds (a pipeline stage's, or all).
    pub(crate) fn held_layers(&self) -> usize {
        with_decoder!(self, m => m.model.layers.len())
    }

    /// Layer `l`'s attention (`feed_forward` false) or feed-forward block's output before the
    /// residual, from its input `x` — on a tensor-parallel rank, this rank's partial sum.
    pub(crate) fn block(
        &self,
        l: usize,
        feed_forward: bool,
        x: Tensor<3>,
        at: &LayerInputs,
    ) -> Tensor<3> {
        with_decoder!(self, m => {
            let layer = &m.model.layers[l];
            if feed_forward {
                layer.feed_forward_block(x)
            } else {
                layer.attention_block(x, &at.cos, &at.sin, &at.mask)
            }
        })
    }

    /// The final norm of the last layer's output: the LM head's input.
    pub(crate) fn final_norm(&self, x: Tensor<3>) -> Tensor<3> {
        with_decoder!(self, m => rms_norm_hf(&m.model.norm, x))
    }

    /// The ids of the parameters inside the layers that every tensor-parallel rank holds whole
    /// but whose gradient a block-wise backward makes from this rank's heads, units or experts
    /// only: the norm gains (input, post-attention, QK-norms) and a mixture's router and shared
    /// expert gate.
    pub(crate) fn replicated_layer_params(&self) -> Vec<ParamId> {
        with_decoder!(self, m => m
            .model
            .layers
            .iter()
            .flat_map(|l| {
                let a = &l.self_attn;
                [Some(&l.input_layernorm), Some(&l.post_attention_layernorm), a.q_norm.as_ref(), a.k_norm.as_ref()]
                    .into_iter()
                    .flatten()
                    .map(|n| n.gamma.id)
                    .chain(l.mlp.replicated_params())
            })
            .collect())
    }

    /// LM-head logits of hidden states.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, hidden]`
    /// - output: `[batch, seq, vocab]`
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        with_decoder!(self, m => m.logits(hidden))
    }

    /// This rank's part of an expert-parallel model over `group` (see
    /// [`expert_parallel`](super::expert_parallel)): every mixture keeps only this rank's block
    /// of its experts; attention, dense layers, router, shared expert and embeddings stay whole.
    /// Every rank of `group` must shard the same model and run each forward together.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a dense model, a model already sharded (its ranks
    /// would not hold different tokens), or a group with more ranks than the model has experts.
    pub fn shard_experts(self, group: Arc<dyn Strategy>) -> Result<Self> {
        let shard = |experts| ExpertShard::new(group.clone(), experts);
        self.divide_experts(group.world_size(), |mixture, experts| {
            mixture.shard(shard(experts));
        })
    }

    /// Checks, dividing nothing, that this whole model can be split into `stages` pipeline
    /// stages (1: not split) whose experts are then divided among `ranks` ranks holding
    /// different tokens — what [`CausalLm::split_stages`] and [`CausalLm::shard_experts`] would
    /// refuse on every rank, found before any rank loads the weights (a lazily initialised model
    /// is enough).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a dense model, more ranks than experts, more stages
    /// than layers, or a stage without a mixture of experts.
    pub fn check_expert_division(&self, ranks: usize, stages: usize) -> Result<()> {
        let Self::Qwen3Moe(m) = self else {
            return Err(BackendError::InvalidInput(format!(
                "expert parallelism needs a mixture of experts (qwen3_moe); this {} model is dense",
                self.hf_config().model_type
            )));
        };
        let layers = m.model.layers.len();
        check_expert_ranks(ranks, m.config.num_experts)?;
        super::pipeline_parallel::check_stages(stages, layers)?;
        for stage in 0..stages {
            let held = super::pipeline_parallel::stage_layers(stage, stages, layers);
            if !held.clone().any(|l| m.config.is_sparse(l)) {
                return Err(no_mixture_on_stage(stage, stages, held));
            }
        }
        Ok(())
    }

    /// The parameters rank `part` of an expert-parallel group of `parts` holds
    /// ([`CausalLm::shard_experts`]), in its parameter order, without the group: every mixture
    /// keeps that block of its experts, everything else whole. What a weight sync sends such a
    /// rank.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] as [`CausalLm::shard_experts`] refuses: a dense or
    /// already sharded model, more parts than experts; or `part` not below `parts`.
    pub(crate) fn expert_block(self, part: usize, parts: usize) -> Result<Self> {
        if part >= parts {
            return Err(BackendError::InvalidInput(format!(
                "block {part} of {parts}: there is no such block of the experts"
            )));
        }
        self.divide_experts(parts, |mixture, experts| {
            mixture.keep_experts(super::expert_parallel::expert_block(part, parts, experts));
        })
    }

    /// This whole mixture of experts with `divide` applied to every mixture (with the number of
    /// experts), once it is known that `ranks` ranks can divide its experts.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a dense model, a model already sharded (its ranks
    /// would not hold different tokens), or more ranks than experts.
    fn divide_experts(
        self,
        ranks: usize,
        mut divide: impl FnMut(&mut super::qwen3_moe::SparseMoeBlock, usize),
    ) -> Result<Self> {
        if self.tensor_shard().is_some() || self.is_expert_sharded() {
            let kind = self.sharding().unwrap_or("a part of a model");
            return Err(BackendError::InvalidInput(format!(
                "{kind}: it is already sharded; divide the experts of the whole model (or of a \
                 pipeline stage)"
            )));
        }
        let Self::Qwen3Moe(mut m) = self else {
            return Err(BackendError::InvalidInput(
                "expert parallelism needs a mixture of experts (qwen3_moe); this model is dense"
                    .into(),
            ));
        };
        let experts = m.config.num_experts;
        check_expert_ranks(ranks, experts)?;
        // The ranks align their micro-batches through the experts' exchanges: a stage holding
        // no mixture would have none.
        if let Some(stage) = &m.pipeline_stage
            && !m
                .model
                .layers
                .iter()
                .any(|l| matches!(l.mlp, FeedForward::Sparse(_)))
        {
            return Err(no_mixture_on_stage(
                stage.stage(),
                stage.stages(),
                stage.layers(),
            ));
        }
        for layer in &mut m.model.layers {
            if let FeedForward::Sparse(mixture) = &mut layer.mlp {
                divide(mixture, experts);
            }
        }
        Ok(Self::Qwen3Moe(m))
    }

    /// An expert-parallel model ([`CausalLm::shard_experts`]) whose group is one of several
    /// that train data-parallel: `replicas` are the ranks holding the same experts as this one
    /// in every group (this rank among them, in group order), over which the experts' gradients
    /// are summed; the other parameters are summed over the whole data-parallel group, which
    /// the trainer joins ([`Trainer::with_strategy`](crate::train::Trainer::with_strategy)).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a model that is not expert-parallel.
    pub fn with_expert_replicas(self, replicas: Arc<dyn Strategy>) -> Result<Self> {
        let Self::Qwen3Moe(mut m) = self else {
            return Err(not_expert_parallel());
        };
        let mut found = false;
        for layer in &mut m.model.layers {
            if let FeedForward::Sparse(block) = &mut layer.mlp
                && let Some(shard) = block.shard.take()
            {
                block.shard = Some(shard.with_replicas(replicas.clone()));
                found = true;
            }
        }
        if !found {
            return Err(not_expert_parallel());
        }
        Ok(Self::Qwen3Moe(m))
    }

    /// This expert-parallel model ([`CausalLm::shard_experts`]) with its mixtures' tokens
    /// exchanged over `group` instead: the same ranks (the same size, this rank at the same
    /// place) and the same block of experts here — e.g. a
    /// [channel](roll_core::strategy::Messenger::channel) of their own for inference engines
    /// that step together beside the trainers holding the model. The ranks holding the same
    /// experts in other groups ([`CausalLm::with_expert_replicas`]) are left behind: only
    /// training sums over them.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a model that is not expert-parallel, or a group of
    /// another size or in which this rank has another place.
    pub fn with_expert_group(self, group: Arc<dyn Strategy>) -> Result<Self> {
        let current = self.expert_group().ok_or_else(not_expert_parallel)?;
        let (size, rank) = (current.world_size(), current.rank());
        if (group.world_size(), group.rank()) != (size, rank) {
            return Err(BackendError::InvalidInput(format!(
                "the experts are divided among {size} ranks, this one rank {rank}; a group of \
                 {} ranks in which it is rank {} cannot exchange their tokens",
                group.world_size(),
                group.rank()
            )));
        }
        let Self::Qwen3Moe(mut m) = self else {
            return Err(not_expert_parallel());
        };
        for layer in &mut m.model.layers {
            if let FeedForward::Sparse(block) = &mut layer.mlp
                && let Some(shard) = block.shard.take()
            {
                block.shard = Some(shard.over(group.clone()));
            }
        }
        Ok(Self::Qwen3Moe(m))
    }

    /// The ranks holding the same experts in the other groups of a data-parallel job
    /// ([`CausalLm::with_expert_replicas`]); `None` without.
    pub(crate) fn expert_replicas(&self) -> Option<Arc<dyn Strategy>> {
        self.expert_shard()?.replicas().cloned()
    }

    /// The group holding an expert-parallel model's experts; `None` for another model.
    pub(crate) fn expert_group(&self) -> Option<Arc<dyn Strategy>> {
        Some(self.expert_shard()?.group().clone())
    }

    /// An expert-parallel model's shard (every mixture holds the same block).
    fn expert_shard(&self) -> Option<&ExpertShard> {
        (0..self.held_layers())
            .find_map(|l| self.expert_parallel_mixture(l))
            .and_then(|(_, block)| block.shard.as_ref())
    }

    /// Layer `l`'s feed-forward norm and mixture when the mixture is expert-parallel
    /// ([`CausalLm::shard_experts`]); `None` for any other layer or model.
    pub(crate) fn expert_parallel_mixture(
        &self,
        l: usize,
    ) -> Option<(&burn::nn::RmsNorm, &super::qwen3_moe::SparseMoeBlock)> {
        let Self::Qwen3Moe(m) = self else {
            return None;
        };
        let layer = m.model.layers.get(l)?;
        match &layer.mlp {
            FeedForward::Sparse(block) if block.shard.is_some() => {
                Some((&layer.post_attention_layernorm, block))
            }
            _ => None,
        }
    }

    /// The ids of this rank's experts' parameters in an expert-parallel model (empty for
    /// another model).
    pub(crate) fn own_expert_params(&self) -> Vec<ParamId> {
        (0..self.held_layers())
            .filter_map(|l| self.expert_parallel_mixture(l))
            .flat_map(|(_, block)| block.experts.iter().flat_map(param_ids))
            .collect()
    }

    /// Whether this model holds only some of its experts ([`CausalLm::shard_experts`]): it
    /// scores, trains in the data-parallel group that holds the others, and serves engines
    /// that step with the others' (on the device decoder), but is not saved alone.
    pub fn is_expert_sharded(&self) -> bool {
        match self {
            Self::Qwen3Moe(m) => m
                .model
                .layers
                .iter()
                .any(|l| matches!(&l.mlp, FeedForward::Sparse(b) if b.shard.is_some())),
            Self::Qwen2(_) | Self::Qwen3(_) => false,
        }
    }

    /// This rank's part of a tensor-parallel model over `group` (see
    /// [`tensor_parallel`](super::tensor_parallel)): every layer keeps its slice of the attention
    /// heads and of the MLP, and a mixture of experts its experts divided as `experts` says
    /// (a dense model has none to divide: [`ExpertSplit::Sliced`]); norms, routers, embedding
    /// and LM head stay whole. Parameters keep their ids. Every rank of `group` must shard the
    /// same model and run each forward (and training step) together, on the same tokens.
    ///
    /// A pipeline stage ([`CausalLm::split_stages`]) shards its own layers: the stages of a
    /// pipeline, each tensor-parallel over its own group (Megatron's tensor and pipeline
    /// parallelism together; [`tensor_pipeline_groups`](crate::tensor_pipeline_groups) forms the
    /// groups of such a copy).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a model already tensor- or expert-parallel, heads, MLP
    /// widths or an expert count that the group's size does not divide, or
    /// [`ExpertSplit::Whole`] for a dense model.
    pub fn shard_tensors(self, group: Arc<dyn Strategy>, experts: ExpertSplit) -> Result<Self> {
        if self.tensor_shard().is_some() || self.is_expert_sharded() {
            let kind = self.sharding().unwrap_or("a part of a model");
            return Err(BackendError::InvalidInput(format!(
                "{kind}: it is already sharded; shard the whole model"
            )));
        }
        if experts == ExpertSplit::Whole && !matches!(self, Self::Qwen3Moe(_)) {
            return Err(BackendError::InvalidInput(format!(
                "whole experts per tensor-parallel rank (model.expert_parallel above 1) need a \
                 mixture of experts (qwen3_moe); this {} model is dense",
                self.hf_config().model_type
            )));
        }
        fn shard<A: Architecture>(
            mut m: Decoder<A>,
            group: Arc<dyn Strategy>,
            experts: ExpertSplit,
        ) -> Result<Decoder<A>> {
            let shard = TensorShard::new(group, m.config.decoder())?;
            m.model.layers = m
                .model
                .layers
                .into_iter()
                .map(|l| {
                    Ok(DecoderLayer {
                        self_attn: shard.shard_attention(l.self_attn),
                        mlp: l.mlp.shard_tensors(&shard, experts)?,
                        tensor_shard: Some(shard.clone()),
                        ..l
                    })
                })
                .collect::<Result<_>>()?;
            Ok(m)
        }
        match self {
            Self::Qwen2(m) => Ok(Self::Qwen2(shard(m, group, experts)?)),
            Self::Qwen3(m) => Ok(Self::Qwen3(shard(m, group, experts)?)),
            Self::Qwen3Moe(m) => Ok(Self::Qwen3Moe(shard(m, group, experts)?)),
        }
    }

    /// This process's stage of a pipeline-parallel model over `link` (see
    /// [`pipeline_parallel`](super::pipeline_parallel)): stage `link.rank()` keeps its block of
    /// the decoder layers; the embedding, final norm and LM head stay on every stage. Every stage
    /// must split the same model and take each training step together, on the same batch.
    ///
    /// A tensor-parallel model ([`CausalLm::shard_tensors`]) splits its slices of the layers:
    /// rank `t` of every stage's tensor-parallel group is then linked to rank `t` of the others
    /// (`link`), and the streams passed between stages are whole (each tensor-parallel block
    /// ends in its group's all-reduce).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a pipeline stage or an expert-parallel model (split
    /// the whole model, then divide each stage's experts: [`CausalLm::shard_experts`]), or more
    /// stages than layers.
    pub fn split_stages(self, link: Arc<dyn Messenger>) -> Result<Self> {
        if self.pipeline_stage().is_some() || self.is_expert_sharded() {
            let kind = self.sharding().unwrap_or("a part of a model");
            return Err(BackendError::InvalidInput(format!(
                "{kind}: it is already sharded; split the whole model into stages (and then \
                 divide each stage's experts)"
            )));
        }
        fn split<A: Architecture>(
            mut m: Decoder<A>,
            link: Arc<dyn Messenger>,
        ) -> Result<Decoder<A>> {
            let stage = PipelineStage::new(link, m.model.layers.len())?;
            let layers = stage.layers();
            m.model.layers = m
                .model
                .layers
                .into_iter()
                .enumerate()
                .filter(|(i, _)| layers.contains(i))
                .map(|(_, l)| l)
                .collect();
            m.pipeline_stage = Some(stage);
            Ok(m)
        }
        match self {
            Self::Qwen2(m) => Ok(Self::Qwen2(split(m, link)?)),
            Self::Qwen3(m) => Ok(Self::Qwen3(split(m, link)?)),
            Self::Qwen3Moe(m) => Ok(Self::Qwen3Moe(split(m, link)?)),
        }
    }

    /// This process's stage of a pipeline-parallel model ([`CausalLm::split_stages`]); `None`
    /// when it holds every layer.
    pub fn pipeline_stage(&self) -> Option<&PipelineStage> {
        with_decoder!(self, m => m.pipeline_stage.as_ref())
    }

    /// The ids of the parameters only this stage of a pipeline-parallel model holds (its
    /// layers'); empty when whole.
    pub(crate) fn stage_params(&self) -> Vec<ParamId> {
        if self.pipeline_stage().is_none() {
            return Vec::new();
        }
        with_decoder!(self, m => m.model.layers.iter().flat_map(param_ids).collect())
    }

    /// The ids of the parameters every stage of a pipeline holds alike (embedding, final norm,
    /// LM head): all but [`CausalLm::stage_params`].
    pub(crate) fn shared_stage_params(&self) -> std::collections::HashSet<ParamId> {
        let own: std::collections::HashSet<ParamId> = self.stage_params().into_iter().collect();
        param_ids(self)
            .into_iter()
            .filter(|id| !own.contains(id))
            .collect()
    }

    /// This rank's slice of a tensor-parallel model ([`CausalLm::shard_tensors`]); `None` when
    /// it is whole.
    pub fn tensor_shard(&self) -> Option<&TensorShard> {
        with_decoder!(self, m => m.tensor_shard())
    }

    /// The ids of the parameters a tensor-parallel rank holds its own part of — slices, and
    /// whole experts no other rank holds (empty when whole).
    pub(crate) fn sliced_params(&self) -> Vec<ParamId> {
        with_decoder!(self, m => {
            if m.tensor_shard().is_none() {
                return Vec::new();
            }
            m.model
                .layers
                .iter()
                .flat_map(|l| {
                    TensorShard::sliced_attention_params(&l.self_attn)
                        .into_iter()
                        .chain(l.mlp.own_params())
                })
                .collect()
        })
    }

    /// On a rank holding a block of whole experts (tensor-parallel with [`ExpertSplit::Whole`],
    /// or expert-parallel): the index among the model's experts of its first one (every
    /// mixture holds the same block).
    pub(crate) fn first_held_expert(&self) -> Option<usize> {
        let Self::Qwen3Moe(m) = self else {
            return None;
        };
        m.model.layers.iter().find_map(|l| match &l.mlp {
            FeedForward::Sparse(b) if m.tensor_shard().is_some() || b.shard.is_some() => {
                Some(b.first_expert).filter(|_| b.experts.len() < m.config.num_experts)
            }
            _ => None,
        })
    }

    /// How the ranks of a copy of a tensor-parallel model, an expert-parallel one, a pipeline, or
    /// a pipeline of tensor- or expert-parallel stages, hold parts of it: one [`PartLevel`] per
    /// way it is divided, innermost first (the tensor-parallel group of a stage, or the ranks
    /// dividing its experts; then the pipeline's link); empty for a whole model.
    pub(crate) fn part_levels(&self) -> Vec<PartLevel> {
        let mut levels = Vec::new();
        if let Some(shard) = self.tensor_shard() {
            levels.push(PartLevel {
                group: shard.group(),
                index: shard.rank(),
                own: self.sliced_params(),
            });
        }
        if let Some(group) = self.expert_group() {
            levels.push(PartLevel {
                index: group.rank(),
                group,
                own: self.own_expert_params(),
            });
        }
        if let Some(stage) = self.pipeline_stage() {
            levels.push(PartLevel {
                group: stage.group(),
                index: stage.stage(),
                own: self.stage_params(),
            });
        }
        levels
    }

    /// Whether this model holds only a part of its weights (expert or tensor parallel, a
    /// pipeline stage).
    pub fn is_sharded(&self) -> bool {
        self.sharding().is_some()
    }

    /// What part of its weights a sharded model holds, in words; `None` when whole.
    pub(crate) fn sharding(&self) -> Option<&'static str> {
        if self.is_expert_sharded() {
            Some(
                "an expert-parallel model (CausalLm::shard_experts) holds only some of its experts",
            )
        } else if self.tensor_shard().is_some() && self.pipeline_stage().is_some() {
            Some(
                "a pipeline stage of a tensor-parallel model (CausalLm::split_stages, \
                 CausalLm::shard_tensors) holds only a slice of some of the layers",
            )
        } else if self.tensor_shard().is_some() {
            Some(
                "a tensor-parallel model (CausalLm::shard_tensors) holds only a slice of its layers",
            )
        } else if self.pipeline_stage().is_some() {
            Some("a pipeline stage (CausalLm::split_stages) holds only some of the layers")
        } else {
            None
        }
    }

    /// Refuses a sharded model where the whole model is needed (`what` it was going to do).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] naming `what`.
    pub(crate) fn require_whole(&self, what: &str) -> Result<()> {
        let Some(kind) = self.sharding() else {
            return Ok(());
        };
        Err(BackendError::InvalidInput(format!(
            "{kind} and runs in step with its group: it cannot {what}"
        )))
    }

    /// Next-token logits at every position.
    ///
    /// # Shapes
    /// - `batch.input_ids`: `[batch, seq]`
    /// - output: `[batch, seq, vocab]`
    pub fn forward(&self, batch: &TokenBatch) -> Tensor<3> {
        self.logits(self.forward_hidden(batch))
    }
}

/// One way the ranks of a copy of a model divide it ([`CausalLm::part_levels`]).
pub(crate) struct PartLevel {
    /// The ranks dividing it this way (a stage's tensor-parallel group, a pipeline's link).
    pub group: Arc<dyn Strategy>,
    /// This rank's place among them (its slice, its stage).
    pub index: usize,
    /// The parameters this rank holds its own part of, at this level: a tensor-parallel rank's
    /// slices, a stage's layers (its slices among them too, when both).
    pub own: Vec<ParamId>,
}

impl PartLevel {
    /// This rank's index among the ranks of its copy over `levels` (innermost first): Megatron's
    /// order, rank `s·T + t` holds slice `t` of stage `s`.
    pub(crate) fn copy_index(levels: &[PartLevel]) -> usize {
        let (mut index, mut stride) = (0, 1);
        for level in levels {
            index += level.index * stride;
            stride *= level.group.world_size();
        }
        index
    }
}

/// Refuses more ranks than `experts` (or none) to divide them: each needs at least one.
fn check_expert_ranks(ranks: usize, experts: usize) -> Result<()> {
    if ranks == 0 || ranks > experts {
        return Err(BackendError::InvalidInput(format!(
            "{ranks} expert-parallel ranks for {experts} experts: each rank needs at least one"
        )));
    }
    Ok(())
}

/// Why stage `stage` of `stages`, holding `layers`, cannot divide its experts.
fn no_mixture_on_stage(
    stage: usize,
    stages: usize,
    layers: std::ops::Range<usize>,
) -> BackendError {
    BackendError::InvalidInput(format!(
        "pipeline stage {stage} of {stages} holds layers {layers:?}, none of them a mixture of \
         experts (mlp_only_layers): each stage of a pipeline whose experts are divided among \
         pipelines needs one"
    ))
}

fn not_expert_parallel() -> BackendError {
    BackendError::InvalidInput(
        "expert replicas need an expert-parallel model (CausalLm::shard_experts first)".into(),
    )
}

/// Every float parameter id of `module`, in visit order.
fn param_ids<M: Module>(module: &M) -> Vec<ParamId> {
    struct Ids(Vec<ParamId>);
    impl burn::module::ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<Tensor<D>>) {
            self.0.push(p.id);
        }
    }
    let mut ids = Ids(Vec::new());
    module.visit(&mut ids);
    ids.0
}

/// What every layer of a forward reads besides its input.
pub(crate) struct LayerInputs {
    /// The token embeddings, `[batch, seq, hidden]`: the first layer's input.
    pub embedded: Tensor<3>,
    pub cos: Tensor<4>,
    pub sin: Tensor<4>,
    pub mask: Tensor<4, Bool>,
}

/// [`CausalLm::check_lengths`] of one sequence against a known limit.
pub(crate) fn check_length(
    max_position_embeddings: Option<usize>,
    sequence: usize,
    length: usize,
) -> crate::Result<()> {
    match max_position_embeddings {
        Some(max) if length > max => Err(crate::BackendError::SequenceTooLong {
            sequence,
            length,
            max_position_embeddings: max,
        }),
        _ => Ok(()),
    }
}
