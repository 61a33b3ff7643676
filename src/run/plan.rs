//! [`RunPlan`]: what a [`Config`] means, as the settings of every component that runs.
//!
//! Reading a config happens here and nowhere else: each key becomes a field of the runtime struct
//! that consumes it (the scheduler's, the engine's, the trainer's, the pipeline's, the run loop's),
//! so "is this key used?" is a question about one function, and a test walks every key of a full
//! config to check that changing it changes the plan.

use roll_algos::AlgorithmConfig;
use roll_algos::filter::DynamicFilter;
use roll_backend_burn::engine::EngineConfig;
use roll_backend_burn::train::TrainerConfig;
use roll_backend_burn::{ExpertSplit, PartKind, ScoringOptions};
use roll_core::config::{
    ComponentSpec, Config, DomainConfig, ModelSource, NewModel, Pipeline, PromptFormat,
};
use roll_core::pipeline::{RlvrPipelineConfig, SftConfig};
use roll_core::policy::SamplingParams;
use roll_core::rng::derive_seed;
use roll_core::scheduler::RlvrSchedulerConfig;
use roll_core::strategy::DeviceSpec;
use roll_core::{Error, Result};
use roll_env::EnvManagerConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The run loop's own settings (`[run]` minus the seed, which the components derive theirs from).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSettings {
    /// Printed in every report line (`run.name`).
    pub name: String,
    /// Steps to train (`run.max_steps`).
    pub max_steps: u64,
    /// Where `config.toml` and `metrics.jsonl` go (`run.output_dir`).
    pub output_dir: PathBuf,
    /// A report line every this many steps (`run.log_every`).
    pub log_every: u64,
    /// Held-out evaluation every this many RL steps; 0: before and after RL only
    /// (`run.eval_every`).
    pub eval_every: u64,
    /// The longest greedy answer of an evaluation (`rollout.max_new_tokens`).
    pub eval_max_new_tokens: u32,
    /// How held-out prompts and episodes are also sampled, besides greedily, when
    /// `run.eval_temperature` is above 0: the rollout's sampling at that temperature, seeded
    /// from `run.seed`. `None`: greedy only.
    pub eval_sampling: Option<SamplingParams>,
    /// A checkpoint every this many RL steps and after the last; 0: none (`run.save_every`).
    pub save_every: u64,
    /// Checkpoints kept (`run.keep_checkpoints`).
    pub keep_checkpoints: u32,
    /// Continue from the newest readable checkpoint (`run.resume`).
    pub resume: bool,
    /// TensorBoard event files under `tensorboard/` (`run.tensorboard`).
    pub tensorboard: bool,
    /// The loopback port of the Prometheus endpoint; 0: any free one (`run.prometheus_port`).
    pub prometheus_port: Option<u16>,
}

/// The supervised warm start (`[sft]`).
#[derive(Debug, Clone, PartialEq)]
pub struct SftPlan {
    /// The SFT pipeline's settings (`sft.epochs`, `sft.batch_size`, `sft.shuffle`, the derived
    /// seed).
    pub pipeline: SftConfig,
    /// The SFT stage's trainer: `[train]`'s optimiser and clip with `sft.learning_rate`,
    /// `sft.warmup_steps` and `sft.lr_schedule`, one pass per batch. Its `total_steps` is set
    /// when the dataset's size is known.
    pub trainer: TrainerConfig,
    /// Held-out loss every this many steps; 0: at the end only (`sft.eval_every`).
    pub eval_every: u64,
    /// A checkpoint every this many SFT steps; 0: none (`sft.save_every`).
    pub save_every: u64,
}

/// Where the actor comes from and how it reads text.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    /// The HuggingFace directory the actor loads (`model.source.path`, or `base_model/` in the
    /// run directory for a new model).
    pub dir: PathBuf,
    /// A new model to write to `dir` first, with the seed of its weights
    /// (`model.source.kind = "new"`).
    pub new: Option<(NewModel, u64)>,
    /// The device inference runs on (`model.device`).
    pub device: DeviceSpec,
    /// The trainer replicas' devices, `device` first (`model.device`, `model.data_parallel`).
    pub trainer_devices: Vec<DeviceSpec>,
    /// `true`: messages are concatenated without a chat template (`model.prompt_format = plain`).
    pub plain_prompts: bool,
    /// How many training processes hold one copy of the actor between them, and how they
    /// divide it; `None`: each holds all of it (`model.tensor_parallel`,
    /// `model.pipeline_parallel`).
    pub parts: Option<(PartKind, usize)>,
}

/// How rollouts are produced: prompts scored by domain (RLVR) or episodes against an
/// environment (agentic).
#[derive(Debug, Clone, PartialEq)]
pub enum RolloutPlan {
    /// `pipeline = "rlvr"`.
    Rlvr {
        /// The RLVR scheduler's settings (`[rollout]`).
        scheduler: RlvrSchedulerConfig,
        /// The domains: their ratios feed the prompt mixer, their tags its resolver, their
        /// reward specs the reward router (`[domains]`).
        domains: BTreeMap<String, DomainConfig>,
    },
    /// `pipeline = "agentic"`.
    Agentic {
        /// The environment manager's settings (`[agentic]`, `rollout.sampling`).
        manager: EnvManagerConfig,
        /// The environment by registered name, with its options (`agentic.env`); the section's
        /// `format_penalty` is already filled in for built-in environments.
        env: ComponentSpec,
        /// Groups per batch (`agentic.num_groups`).
        num_groups: usize,
    },
}

/// Every component's settings for one run: a config read once, each key into the runtime struct
/// that consumes it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    /// The run loop.
    pub run: RunSettings,
    /// The actor's model.
    pub model: ModelPlan,
    /// The pipeline's own settings.
    pub pipeline: RlvrPipelineConfig,
    /// Advantages, shaping, masks, KL and the objective (`[algorithm]` minus the filter).
    pub algorithm: AlgorithmConfig,
    /// The dynamic filter the scheduler applies to finished groups (`algorithm.dynamic_filter`).
    pub filter: Option<DynamicFilter>,
    /// The actor's trainer (`[train]`).
    pub trainer: TrainerConfig,
    /// The actor's inference engine (`rollout.max_running_requests`, the derived seed).
    pub engine: EngineConfig,
    /// Micro-batching of training-path scoring (`train.max_tokens_per_micro_batch`).
    pub scoring: ScoringOptions,
    /// Tokens of the actor's train–inference probe after each update (`train.gap_probe_tokens`;
    /// 0: none).
    pub gap_probe_tokens: u32,
    /// The rollout side.
    pub rollout: RolloutPlan,
    /// Processes of a run across processes that only generate, the last of the job
    /// (`rollout.ranks`).
    pub rollout_ranks: usize,
    /// Rollout ranks holding each mixture's experts divided among them, as one group stepping
    /// together (`rollout.expert_parallel`; 1: each holds the whole model).
    pub rollout_experts: usize,
    /// The supervised warm start, if any.
    pub sft: Option<SftPlan>,
}

impl RunPlan {
    /// The plan of a validated config.
    ///
    /// # Errors
    /// If the config does not validate (the error names the key), or an agentic section's
    /// numbers cannot be used by the environment manager.
    pub fn from_config(config: &Config) -> Result<Self> {
        config.validate()?;
        let (dir, new) = match &config.model.source {
            ModelSource::HfDir { path } => (path.clone(), None),
            ModelSource::New(spec) => (
                config.run.output_dir.join("base_model"),
                Some((spec.clone(), derive_seed(config.run.seed, "init"))),
            ),
        };
        let mut algorithm = config.algorithm.clone();
        let filter = algorithm.dynamic_filter.take();
        let rollout = match config.pipeline {
            Pipeline::Rlvr => RolloutPlan::Rlvr {
                scheduler: RlvrSchedulerConfig::from_config(config),
                domains: config.domains.clone(),
            },
            Pipeline::Agentic => {
                let agentic = config.agentic.as_ref().ok_or_else(|| Error::MissingKey {
                    key: "agentic.env".into(),
                })?;
                let seed = derive_seed(config.run.seed, "environments");
                let mut manager = EnvManagerConfig::from_agentic(agentic, seed)?;
                let episode = &mut manager.episode.sampling;
                *episode = SamplingParams {
                    max_new_tokens: episode.max_new_tokens,
                    seed: episode.seed,
                    ..config.rollout.sampling_params()
                };
                RolloutPlan::Agentic {
                    manager,
                    env: roll_env::AgenticScheduler::env_spec(agentic),
                    num_groups: agentic.num_groups as usize,
                }
            }
        };
        Ok(Self {
            run: RunSettings {
                name: config.run.name.clone(),
                max_steps: config.run.max_steps,
                output_dir: config.run.output_dir.clone(),
                log_every: config.run.log_every,
                eval_every: config.run.eval_every,
                eval_max_new_tokens: config.rollout.max_new_tokens,
                eval_sampling: (config.run.eval_temperature > 0.0).then(|| SamplingParams {
                    temperature: config.run.eval_temperature as f32,
                    seed: Some(derive_seed(config.run.seed, "evaluation")),
                    ..config.rollout.sampling_params()
                }),
                save_every: config.run.save_every,
                keep_checkpoints: config.run.keep_checkpoints,
                tensorboard: config.run.tensorboard,
                prometheus_port: config.run.prometheus_port,
                resume: config.run.resume,
            },
            model: ModelPlan {
                dir,
                new,
                device: config.model.device,
                trainer_devices: config.model.trainer_devices(),
                plain_prompts: config.model.prompt_format == PromptFormat::Plain,
                parts: {
                    // Validated: 1 (every expert sliced) or the tensor-parallel width where
                    // there are tensor-parallel ranks.
                    let experts = if config.model.expert_parallel > 1 {
                        ExpertSplit::Whole
                    } else {
                        ExpertSplit::Sliced
                    };
                    match (config.model.tensor_parallel, config.model.pipeline_parallel) {
                        (1, 1) => match config.model.expert_parallel {
                            1 => None,
                            e => Some((PartKind::Experts, e as usize)),
                        },
                        (t, 1) => Some((PartKind::Tensor { experts }, t as usize)),
                        (1, p) => match config.model.expert_parallel {
                            1 => Some((PartKind::Pipeline, p as usize)),
                            e => Some((
                                PartKind::PipelineExperts {
                                    experts: e as usize,
                                },
                                (p * e) as usize,
                            )),
                        },
                        (t, p) => Some((
                            PartKind::TensorPipeline {
                                tensor: t as usize,
                                experts,
                            },
                            (t * p) as usize,
                        )),
                    }
                },
            },
            pipeline: RlvrPipelineConfig::from_config(config),
            algorithm,
            filter,
            trainer: TrainerConfig::from_config(config),
            engine: EngineConfig::from_config(config),
            scoring: ScoringOptions {
                max_tokens_per_micro_batch: config.train.max_tokens_per_micro_batch as usize,
                ..ScoringOptions::default()
            },
            gap_probe_tokens: config.train.gap_probe_tokens,
            rollout,
            rollout_ranks: config.rollout.ranks as usize,
            rollout_experts: config.rollout.expert_parallel as usize,
            sft: config.sft.as_ref().map(|sft| {
                let mut trainer = TrainerConfig::from_config(config);
                trainer.lr = sft.learning_rate;
                trainer.warmup_steps = sft.warmup_steps;
                trainer.schedule = sft.lr_schedule;
                trainer.epochs = 1;
                trainer.total_steps = None;
                trainer.seed = derive_seed(config.run.seed, "sft trainer");
                SftPlan {
                    pipeline: SftConfig {
                        batch_size: sft.batch_size as usize,
                        epochs: sft.epochs,
                        shuffle: sft.shuffle,
                        seed: derive_seed(config.run.seed, "sft data"),
                    },
                    trainer,
                    eval_every: sft.eval_every,
                    save_every: sft.save_every,
                }
            }),
        })
    }
}
