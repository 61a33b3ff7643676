//! `[model]`: which weights the actor starts from, in which precision, on which device.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::check::Checker;
use crate::Result;
use crate::strategy::DeviceSpec;

/// `[model]`: the policy model. `model.source` is the one key every config must set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Where the weights, model config and tokenizer come from. Required.
    /// ROLL: `pretrain` / `model_args.model_name_or_path`.
    pub source: ModelSource,
    /// How prompts and turns become model input: `chat` renders them through the tokenizer's
    /// chat template (instruct models), `plain` concatenates the message texts (base models
    /// trained on raw text). Default `chat`.
    #[serde(default)]
    pub prompt_format: PromptFormat,
    /// Device the model runs on: `cpu`, `cuda` or `cuda:N`. Default `cpu`.
    /// ROLL: `device_mapping` (a list of GPU ids per role).
    #[serde(default)]
    pub device: DeviceSpec,
    /// Data-parallel replicas of the trainers (actor, critic): each step is split across them by
    /// tokens and their gradients summed, so they train as one on the whole batch. On `cpu`
    /// they share the CPU; on `cuda:N` they take GPUs N, N+1, …. Inference runs on `device`.
    /// Default `1`. ROLL: the data-parallel size of `actor_train.device_mapping`.
    #[serde(default = "one")]
    pub data_parallel: u32,
    /// Processes of a distributed run that hold one copy of the actor between them, each a
    /// slice of every layer's attention heads and MLP (tensor parallelism, Megatron-LM's): the
    /// training processes form `N / tensor_parallel` such copies, trained data-parallel.
    /// Qwen2, Qwen3 and Qwen3-MoE, without LoRA; the heads, key/value heads and MLP widths must
    /// divide. With `pipeline_parallel` above 1 too, each pipeline stage is tensor-parallel (see
    /// there). Default `1`. ROLL: `tensor_model_parallel_size`.
    #[serde(default = "one")]
    pub tensor_parallel: u32,
    /// How the `tensor_parallel` processes holding a copy of a mixture of experts divide its
    /// experts: `1` slices every expert by its units, as a dense MLP is sliced (expert tensor
    /// parallelism); `tensor_parallel` gives each process whole experts, `1/tensor_parallel` of
    /// them (expert parallelism within the copy: its processes see the same tokens, so each runs
    /// its experts on the tokens routed to them and the layer's all-reduce combines the results,
    /// as Megatron's all-gather dispatcher does). Without tensor or pipeline parallelism, a value
    /// above 1 divides the experts among the training processes themselves, which hold
    /// different tokens (data parallel): each routed token travels to its expert's process and
    /// back, forward and backward (GShard's all-to-all); it must then divide the training
    /// processes, which form copies of `expert_parallel` consecutive processes side by side,
    /// the experts' gradients summed over the processes holding the same ones. With
    /// `pipeline_parallel` above 1 (and no tensor parallelism), `expert_parallel` pipelines
    /// train side by side, each on its own tokens, and each stage's experts are divided among
    /// the pipelines' processes holding that stage (Megatron's expert parallelism across the
    /// data-parallel ranks of a stage); see `pipeline_parallel`. Qwen3-MoE only (a dense model
    /// refuses a value above 1); the experts must divide. Default `1`. ROLL:
    /// `expert_model_parallel_size`.
    #[serde(default = "one")]
    pub expert_parallel: u32,
    /// Processes of a distributed run that hold one copy of the actor between them, each a
    /// block of its layers, micro-batches running one forward one backward through them
    /// (pipeline parallelism). Qwen2, Qwen3 and Qwen3-MoE, without LoRA; at most one stage per
    /// layer.
    /// With `tensor_parallel` above 1 too, a copy spans `tensor_parallel × pipeline_parallel`
    /// processes: `pipeline_parallel` stages of `tensor_parallel` consecutive processes, each
    /// holding a slice of its stage's layers (Megatron-LM's layout); the training processes
    /// form copies of that many. With `expert_parallel` above 1 instead, a copy spans
    /// `expert_parallel × pipeline_parallel` processes: `pipeline_parallel` stages of
    /// `expert_parallel` consecutive processes, each process one pipeline's stage, holding that
    /// block of the stage's experts; every stage must hold a mixture. Default `1`. ROLL:
    /// `pipeline_model_parallel_size`.
    #[serde(default = "one")]
    pub pipeline_parallel: u32,
}

fn one() -> u32 {
    1
}

impl ModelConfig {
    /// A model config for `source` with default dtype and device.
    pub fn new(source: ModelSource) -> Self {
        Self {
            source,
            prompt_format: PromptFormat::default(),
            device: DeviceSpec::default(),
            data_parallel: 1,
            tensor_parallel: 1,
            expert_parallel: 1,
            pipeline_parallel: 1,
        }
    }

    /// The devices of the trainer replicas, in rank order (see [`Self::data_parallel`]).
    pub fn trainer_devices(&self) -> Vec<DeviceSpec> {
        (0..self.data_parallel as usize)
            .map(|i| match self.device {
                DeviceSpec::Cpu => DeviceSpec::Cpu,
                DeviceSpec::Cuda(first) => DeviceSpec::Cuda(first + i),
                DeviceSpec::Vulkan(first) => DeviceSpec::Vulkan(first + i),
            })
            .collect()
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let model = Checker::new("model");
        model.at_least("data_parallel", self.data_parallel.into(), 1)?;
        model.at_least("tensor_parallel", self.tensor_parallel.into(), 1)?;
        model.at_least("pipeline_parallel", self.pipeline_parallel.into(), 1)?;
        model.at_least("expert_parallel", self.expert_parallel.into(), 1)?;
        model.require(
            self.expert_parallel == 1
                || self.expert_parallel == self.tensor_parallel
                || self.tensor_parallel == 1,
            "expert_parallel",
            self.expert_parallel,
            "1 (every expert sliced) or model.tensor_parallel (whole experts): the experts are \
             divided among the processes of a tensor-parallel copy of the actor (without tensor \
             parallelism, among the training processes, or the pipelines)",
        )?;
        let c = Checker::new("model.source");
        match &self.source {
            ModelSource::HfDir { path } => c.require(
                !path.as_os_str().is_empty(),
                "path",
                "\"\"",
                "the path of a HuggingFace model directory",
            ),
            ModelSource::New(spec) => spec.validate(&c),
        }
    }
}

/// Where a model's files come from; `kind` selects the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSource {
    /// A local HuggingFace model directory (`config.json`, `*.safetensors`, `tokenizer.json`).
    HfDir {
        /// The directory.
        path: PathBuf,
    },
    /// A new, randomly initialised model of the given sizes with a byte-level tokenizer (one
    /// token per byte plus `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, and optionally merges
    /// learned from the run's SFT texts): no download, no files to provide. The run writes it as
    /// a HuggingFace directory (`base_model/` in the run directory) and continues from there as
    /// from `hf_dir`.
    New(NewModel),
}

/// The sizes of a model built from scratch (`model.source.kind = "new"`); the vocabulary is the
/// tokenizer's (`tokenizer`: 259 byte-level tokens, or more with learned merges). Keys and
/// meanings are those of a HF `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewModel {
    /// `qwen2` (q/k/v biases) or `qwen3` (q/k norms, no biases).
    pub model_type: String,
    /// Width of the residual stream.
    pub hidden_size: u32,
    /// Width of each feed-forward layer.
    pub intermediate_size: u32,
    /// Decoder layers.
    pub num_hidden_layers: u32,
    /// Query heads; must divide `hidden_size`.
    pub num_attention_heads: u32,
    /// Key/value heads; must divide `num_attention_heads`.
    pub num_key_value_heads: u32,
    /// The longest sequence the model is built for (RoPE needs no table, but generation and
    /// scoring refuse longer inputs).
    pub max_position_embeddings: u32,
    /// RoPE base. Default `10000`.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// Standard deviation of the normal initialisation of every matrix (HF's
    /// `initializer_range`). Default `0.02`.
    #[serde(default = "default_init_std")]
    pub initializer_range: f64,
    /// The tokenizer (`{ kind = "bytes" }` or `{ kind = "bpe", vocab_size = N }`). Default
    /// bytes.
    #[serde(default)]
    pub tokenizer: NewTokenizer,
}

/// The tokenizer of a new model (`model.source.tokenizer`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum NewTokenizer {
    /// One token per byte and the three special tokens (259): any text, nothing to learn; every
    /// character costs at least one position.
    #[default]
    Bytes,
    /// Byte-level BPE (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with
    /// Subword Units", arXiv:1508.07909) whose merges are learned from the run's SFT texts
    /// before the model is built: the 259 byte-level tokens stay (any text still encodes) and
    /// up to `vocab_size − 259` merged tokens are added, most frequent pair first. Merges may
    /// cross spaces and newlines (no pre-tokenisation), so text an environment repeats every
    /// turn shrinks to a few tokens: shorter sequences, cheaper steps.
    Bpe {
        /// Vocabulary size, 260–65536.
        vocab_size: u32,
    },
}

fn default_rope_theta() -> f64 {
    10_000.0
}

fn default_init_std() -> f64 {
    0.02
}

impl NewModel {
    fn validate(&self, c: &Checker) -> Result<()> {
        c.require(
            matches!(self.model_type.as_str(), "qwen2" | "qwen3"),
            "model_type",
            format!("{:?}", self.model_type),
            "\"qwen2\" or \"qwen3\"",
        )?;
        for (key, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            c.at_least(key, u64::from(v), 1)?;
        }
        if let NewTokenizer::Bpe { vocab_size } = self.tokenizer {
            c.require(
                (260..=65_536).contains(&vocab_size),
                "tokenizer.vocab_size",
                vocab_size,
                "260 to 65536 (the 259 byte-level tokens and at least one merge)",
            )?;
        }
        c.require(
            self.hidden_size.is_multiple_of(self.num_attention_heads)
                && (self.hidden_size / self.num_attention_heads).is_multiple_of(2),
            "num_attention_heads",
            self.num_attention_heads,
            &format!(
                "a divisor of hidden_size ({}) leaving an even head width (RoPE rotates pairs)",
                self.hidden_size
            ),
        )?;
        c.require(
            self.num_attention_heads
                .is_multiple_of(self.num_key_value_heads),
            "num_key_value_heads",
            self.num_key_value_heads,
            &format!(
                "a divisor of num_attention_heads ({})",
                self.num_attention_heads
            ),
        )?;
        c.positive("rope_theta", self.rope_theta)?;
        c.positive("initializer_range", self.initializer_range)
    }
}

/// How messages become model input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptFormat {
    /// The tokenizer's chat template (Qwen's ChatML for Qwen models).
    #[default]
    Chat,
    /// The message texts concatenated, no template: for base models.
    Plain,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_model_sizes_are_checked_naming_the_key() {
        let good = NewModel {
            model_type: "qwen2".into(),
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 64,
            rope_theta: 10_000.0,
            initializer_range: 0.02,
            tokenizer: Default::default(),
        };
        assert!(
            ModelConfig::new(ModelSource::New(good.clone()))
                .validate()
                .is_ok()
        );
        type Break = fn(&mut NewModel);
        let cases: [(Break, &str); 6] = [
            (
                |m| m.tokenizer = NewTokenizer::Bpe { vocab_size: 259 },
                "model.source.tokenizer.vocab_size",
            ),
            (|m| m.model_type = "gpt2".into(), "model.source.model_type"),
            (
                |m| m.num_hidden_layers = 0,
                "model.source.num_hidden_layers",
            ),
            (
                |m| m.num_attention_heads = 3,
                "model.source.num_attention_heads",
            ),
            (
                |m| m.num_key_value_heads = 3,
                "model.source.num_key_value_heads",
            ),
            (|m| m.rope_theta = 0.0, "model.source.rope_theta"),
        ];
        for (break_it, key) in cases {
            let mut m = good.clone();
            break_it(&mut m);
            let err = ModelConfig::new(ModelSource::New(m))
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
    }

    #[test]
    fn empty_model_path_is_rejected() {
        let model = ModelConfig::new(ModelSource::HfDir { path: "".into() });
        let err = model.validate().expect_err("empty path").to_string();
        assert!(err.contains("model.source.path"), "{err}");
    }
}
