//! The error type of roll-backend-burn.

use roll_core::strategy::DeviceSpec;
use std::path::PathBuf;

/// What can go wrong in the Burn backend.
///
/// Every variant names its cause (a path, a tensor name, both shapes, ...) so that a user who hands
/// the crate a broken HuggingFace directory learns what to fix from the message alone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The config names a device whose backend this build does not include.
    #[error(
        "device `{device}` needs roll-backend-burn's `{feature}` feature, which this build lacks"
    )]
    BackendNotBuilt {
        /// The requested device.
        device: DeviceSpec,
        /// The cargo feature that enables it.
        feature: &'static str,
    },

    /// A file is missing or cannot be read or written.
    #[error("cannot access `{}`: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },

    /// A JSON file (`config.json`, `generation_config.json`, an index, ...) is not what it should be.
    #[error("invalid JSON in `{}`: {message}", path.display())]
    InvalidJson {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },

    /// `config.json` names an architecture this crate does not implement.
    #[error("unknown model_type `{model_type}` (supported: qwen2, qwen3, qwen3_moe)")]
    UnknownModelType {
        /// The `model_type` found.
        model_type: String,
    },

    /// A model config is internally inconsistent (e.g. heads that do not divide the hidden size).
    #[error("invalid model config: {0}")]
    InvalidConfig(String),

    /// A `config.json` field has a value the architecture cannot run with (zero layers, a
    /// non-positive `rms_norm_eps`, a RoPE base of 0, `layer_types` of the wrong length, ...).
    #[error("config field `{field}` = {value} is not allowed: must be {allowed}")]
    InvalidConfigField {
        /// The key, dotted for nested ones (e.g. `rope_parameters.rope_type`).
        field: String,
        /// The value found, as JSON.
        value: String,
        /// What the architecture accepts.
        allowed: String,
    },

    /// A model handed to an export disagrees with the `config.json` it is exported under (a
    /// config that would describe other weights).
    #[error(
        "cannot export: the model's `{field}` is {model} but the source config.json says {source_value}"
    )]
    ExportMismatch {
        /// The config key that differs.
        field: String,
        /// The model's value.
        model: String,
        /// The source config's value.
        source_value: String,
    },

    /// A sequence is longer than the model's `max_position_embeddings`.
    #[error(
        "sequence {sequence} has {length} tokens, more than max_position_embeddings ({max_position_embeddings})"
    )]
    SequenceTooLong {
        /// Index of the sequence in its request.
        sequence: usize,
        /// Its length in tokens (prompt and response).
        length: usize,
        /// The model's limit.
        max_position_embeddings: usize,
    },

    /// A computed log-probability is NaN or infinite (broken weights or an overflow), which
    /// would poison every loss and advantage computed from it.
    #[error("log-prob of sequence {sequence} at response position {position} is {value}")]
    NonFiniteLogprob {
        /// Index of the sequence in its request.
        sequence: usize,
        /// Response token index.
        position: usize,
        /// The value (NaN or ±inf).
        value: f32,
    },

    /// The checkpoint lacks a tensor the model needs.
    #[error("missing tensor `{name}` in `{}`", dir.display())]
    MissingTensor {
        /// HuggingFace name of the tensor (e.g. `model.layers.0.self_attn.q_proj.weight`).
        name: String,
        /// The model directory or file.
        dir: PathBuf,
    },

    /// A checkpoint tensor has another shape than the config implies.
    #[error("tensor `{name}` has shape {found:?} but the config implies {expected:?}")]
    ShapeMismatch {
        /// HuggingFace name of the tensor.
        name: String,
        /// The shape the model expects (HuggingFace layout).
        expected: Vec<usize>,
        /// The shape in the file (HuggingFace layout).
        found: Vec<usize>,
    },

    /// A safetensors file is truncated, corrupt or holds an unsupported tensor.
    #[error("corrupt or unsupported safetensors file `{}`: {message}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },

    /// Writing a checkpoint failed.
    #[error("cannot save to `{}`: {message}", path.display())]
    Save {
        /// The file being written.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },

    /// The `tokenizers` crate failed to load `tokenizer.json` or to encode/decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// The chat template in `tokenizer_config.json` is not one this crate can render.
    #[error("unsupported chat template (only ChatML is implemented): {0}")]
    UnsupportedChatTemplate(String),

    /// A token id is outside the model's vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfVocab {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },

    /// An input that cannot be processed (e.g. an empty sequence).
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// A trainer setting is out of range or inconsistent with another one.
    #[error("invalid trainer config `{key}`: {message}")]
    InvalidTrainConfig {
        /// Dotted key of the setting (e.g. `lora.rank`, `schedule.min_lr_ratio`).
        key: String,
        /// What is wrong and what would be accepted.
        message: String,
    },

    /// A trainer checkpoint cannot be written or read back.
    #[error("checkpoint `{}`: {message}", path.display())]
    Checkpoint {
        /// The checkpoint directory or the file in it.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },

    /// A train step failed (the objective rejected its inputs, a tensor could not be read, ...).
    #[error("train step: {0}")]
    Train(String),
    /// A collective across ranks failed (data-parallel replicas, a tensor-parallel group):
    /// another rank failed, or the ranks disagreed on the collective.
    #[error("collective across ranks: {0}")]
    Collective(#[source] Box<roll_core::Error>),
    /// A pipeline stage could not exchange a micro-batch's activations or gradients with its
    /// neighbour (the neighbour failed, or sent nothing in time).
    #[error("pipeline stage {stage}, exchanging with stage {neighbour}: {reason}")]
    Pipeline {
        /// This process's stage.
        stage: usize,
        /// The stage it was sending to or waiting for.
        neighbour: usize,
        /// What went wrong.
        reason: String,
    },

    /// The inference engine failed a request or is no longer running.
    #[error("inference engine: {0}")]
    Engine(String),

    /// A rank that generates for this process (disaggregated rollout, [`crate::remote`]) failed
    /// a request, broke the protocol, or could not be reached.
    #[error("rollout rank {rank}: {reason}")]
    RolloutRank {
        /// The rollout rank, in the job.
        rank: usize,
        /// What happened.
        reason: String,
    },

    /// A decoder was asked to run a model it does not implement (e.g. the CPU decoder and a
    /// mixture-of-experts model).
    #[error("not supported by this decoder: {what}")]
    UnsupportedByDecoder {
        /// What is unsupported.
        what: String,
    },
}

impl BackendError {
    /// An [`BackendError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

impl From<BackendError> for roll_core::Error {
    fn from(e: BackendError) -> Self {
        roll_core::Error::policy(e)
    }
}

/// `Result` with [`BackendError`].
pub type Result<T, E = BackendError> = std::result::Result<T, E>;
