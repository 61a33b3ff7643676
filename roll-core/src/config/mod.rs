//! Typed configuration: one [`Config`] tree, read from a TOML or YAML file, `ROLL_` environment
//! variables and `key.path=value` overrides, and validated before anything runs.
//!
//! # Sources, in order of precedence (later wins)
//!
//! 1. the documented default of every key;
//! 2. config files (`.toml`, `.yaml` or `.yml`), in the order given;
//! 3. environment variables `ROLL_<SECTION>__<KEY>`: `__` separates levels, names are
//!    lower-cased (`ROLL_ROLLOUT__GROUP_SIZE=8` sets `rollout.group_size`);
//! 4. command-line overrides `key.path=value` (`rollout.group_size=16`).
//!
//! Values of environment variables and overrides are parsed like figment's `Env` provider:
//! `8` is an integer, `0.5` and `1e-6` are floats, `true` a boolean, `[1, 2]` an array,
//! `"8"` a string, anything else a string.
//!
//! Sections chosen by `kind` (`train.lr_schedule`, `train.optimizer`, `model.source`, rewards,
//! environments) follow two rules: a section whose `kind` no source sets keeps its default kind,
//! so `train.optimizer.weight_decay=0` works alone; and setting `kind` to a different value than a
//! lower source had replaces the whole section, so `train.lr_schedule.kind=constant` does not
//! inherit a file's `min_lr_ratio`.
//!
//! # Errors
//!
//! Every problem names its dotted key and, when it came from a file, a variable or an override,
//! that origin: unknown keys ([`Error::UnknownKey`], with the closest valid key when one is
//! close, or the roll key for a ROLL key name), wrong types, values out of range or an unknown
//! `kind` (listing the allowed ones), and missing required keys. Unknown keys are errors wherever
//! they come from, including a stray `ROLL_` variable in the environment.
//!
//! # Example
//!
//! ```
//! use roll_core::config::{ConfigLoader, LrSchedule};
//!
//! let config = ConfigLoader::new()
//!     .toml_str(
//!         r#"
//!         [model.source]
//!         kind = "hf_dir"
//!         path = "models/tiny"
//!
//!         [domains.math]
//!         reward = { kind = "math_rule" }
//!         "#,
//!     )
//!     .env_vars([("ROLL_ROLLOUT__GROUP_SIZE", "4")])
//!     .overrides(["train.lr_schedule.kind=cosine", "train.learning_rate=1e-5"])
//!     .load()?;
//! assert_eq!(config.rollout.group_size, 4);
//! assert_eq!(config.train.lr_schedule, LrSchedule::Cosine { min_lr_ratio: 0.0 });
//!
//! let err = ConfigLoader::new()
//!     .toml_str("[model.source]\nkind = \"hf_dir\"\npath = \"m\"\n[domains.math]\nreward = { kind = \"math_rule\" }")
//!     .overrides(["rollout.grop_size=3"])
//!     .load()
//!     .expect_err("a typo");
//! assert_eq!(
//!     err.to_string(),
//!     "unknown config key `rollout.grop_size`; did you mean `rollout.group_size`? \
//!      (from override rollout.grop_size=3)"
//! );
//! # Ok::<(), roll_core::Error>(())
//! ```

mod agentic;
mod args;
mod check;
mod component;
mod diagnose;
mod domain;
mod layer;
mod load;
mod model;
mod rollout;
mod run;
mod sft;
mod suggest;
mod train;

use std::collections::BTreeMap;
use std::path::Path;

use roll_algos::AlgorithmConfig;
use roll_algos::advantage::AdvantageEstimator;
use roll_algos::loss::{PolicyLoss, RatioLevel};
use roll_algos::shaping::RewardShaping;
use serde::{Deserialize, Serialize};

pub use crate::strategy::DeviceSpec;
pub use agentic::AgenticConfig;
pub use component::ComponentSpec;
pub use domain::{DomainConfig, DomainMap};
pub use load::ConfigLoader;
pub use model::{ModelConfig, ModelSource, NewModel, NewTokenizer, PromptFormat};
pub use rollout::{RolloutConfig, SamplingConfig};
pub use run::RunConfig;
pub use sft::SftSection;
pub use train::{LrSchedule, Optimizer, TrainConfig};

use crate::{Error, Result};
use check::Checker;

/// The whole configuration of a run. Only `model.source` is required; every other key has a
/// documented default. Build it with [`ConfigLoader`], [`Config::from_file`] or
/// [`Config::from_args`]; print it with [`Config::to_toml`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Which pipeline runs. Default `rlvr`. ROLL: the `start_*_pipeline.py` entry point.
    #[serde(default)]
    pub pipeline: Pipeline,
    /// `[run]`: name, seed, length, checkpoint and log cadence.
    #[serde(default)]
    pub run: RunConfig,
    /// `[model]`: the policy model. Required (`model.source`).
    pub model: ModelConfig,
    /// `[rollout]`: generation per step, staleness bound and sampling.
    #[serde(default)]
    pub rollout: RolloutConfig,
    /// `[train]`: optimiser, learning-rate schedule and batch consumption.
    #[serde(default)]
    pub train: TrainConfig,
    /// `[algorithm]`: advantage estimator, reward and advantage shaping, sample masks, dynamic
    /// filter, KL penalty and the loss (see [`AlgorithmConfig`]). Default GRPO with the
    /// PPO-clipped objective.
    #[serde(default)]
    pub algorithm: AlgorithmConfig,
    /// `[domains.<name>]`: RLVR task domains by name; at least one when `pipeline = "rlvr"`.
    /// Default none. ROLL: `rewards` and `domain_interleave_probs`.
    #[serde(default)]
    pub domains: BTreeMap<String, DomainConfig>,
    /// `[agentic]`: the environment of an agentic run; required when `pipeline = "agentic"`.
    /// Default unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agentic: Option<AgenticConfig>,
    /// `[sft]`: a supervised warm start before RL (see [`SftSection`]). Default unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sft: Option<SftSection>,
    /// `[task]`: settings of the user's own task (dataset sizes, operand ranges, ...), read by
    /// the program that runs the config through [`Config::task`] into its own type — which
    /// should deny unknown fields, so that every key here is read. Default unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<serde_json::Value>,
}

/// Which training pipeline a config drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pipeline {
    /// Reinforcement learning with verifiable rewards: prompts from several domains, each
    /// response scored by its domain's reward worker.
    #[default]
    Rlvr,
    /// Multi-turn agents: trajectories played against an environment.
    Agentic,
}

/// A setting [`Config::cautions`] flags: valid, but likely not what the user meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caution {
    /// The dotted key (`train.warmup_steps`).
    pub key: String,
    /// Its value as configured.
    pub value: String,
    /// What it will do, and what to set instead.
    pub why: String,
}

impl std::fmt::Display for Caution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{} = {}`: {}", self.key, self.value, self.why)
    }
}

impl Config {
    /// A config for `model` with every other key at its default (no domains yet, so it does not
    /// validate until a domain or an agentic environment is added).
    pub fn new(model: ModelConfig) -> Self {
        Self {
            pipeline: Pipeline::default(),
            run: RunConfig::default(),
            model,
            rollout: RolloutConfig::default(),
            train: TrainConfig::default(),
            algorithm: AlgorithmConfig::default(),
            domains: BTreeMap::new(),
            agentic: None,
            sft: None,
            task: None,
        }
    }

    /// The `[task]` section as the program's own settings type `T`.
    ///
    /// # Errors
    /// [`Error::MissingKey`] without a `[task]` section; [`Error::InvalidValue`] (key `task`)
    /// when it does not deserialize into `T` — an unknown or missing field, a wrong type — with
    /// serde's message naming the field.
    pub fn task<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        let value = self
            .task
            .clone()
            .ok_or_else(|| Error::MissingKey { key: "task".into() })?;
        serde_json::from_value(value).map_err(|e| Error::InvalidValue {
            key: "task".into(),
            value: "the section".into(),
            allowed: e.to_string(),
            origin: None,
        })
    }

    /// Loads and validates the config in `path` (TOML or YAML, by extension), without
    /// environment variables or overrides.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        ConfigLoader::new().file(path.as_ref()).load()
    }

    /// Loads and validates a config written as TOML text (e.g. inline in a program).
    pub fn from_toml(text: &str) -> Result<Self> {
        ConfigLoader::new().toml_str(text).load()
    }

    /// Loads and validates the config a command line asks for: `args` (without the program
    /// name) may hold `--config PATH`, `-c PATH` or `--config=PATH` and `key.path=value`
    /// overrides; `ROLL_` variables of the process environment apply between the two. Anything
    /// else is an error naming the argument.
    pub fn from_args<I, S>(args: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ConfigLoader::new().args(args).process_env().load()
    }

    /// Checks every value against its allowed range and the sections against each other
    /// (loading does this already). The error names the first offending key.
    pub fn validate(&self) -> Result<()> {
        self.run.validate()?;
        self.model.validate()?;
        self.rollout.validate()?;
        self.train.validate()?;
        self.algorithm
            .validate()
            .map_err(|e| Error::from_algo(e, "algorithm."))?;
        domain::validate_domains(&self.domains)?;
        if let Some(agentic) = &self.agentic {
            agentic.validate()?;
        }
        if let Some(sft) = &self.sft {
            sft.validate()?;
        }
        self.validate_rollout_experts()?;
        self.validate_pipeline()
    }

    /// `rollout.expert_parallel` divides the rollout ranks into groups; colocated, it divides
    /// the experts as the trainers do (each engine serves its own trainer's block).
    fn validate_rollout_experts(&self) -> Result<()> {
        let (rollout, model) = (&self.rollout, &self.model);
        if rollout.expert_parallel == 1 {
            return Ok(());
        }
        if rollout.ranks > 0 {
            return Checker::new("rollout").require(
                rollout.ranks.is_multiple_of(rollout.expert_parallel),
                "expert_parallel",
                rollout.expert_parallel,
                &format!(
                    "1, or a divisor of rollout.ranks ({}): the experts are divided among groups \
                     of that many rollout ranks",
                    rollout.ranks
                ),
            );
        }
        let divided_alike = model.expert_parallel == rollout.expert_parallel
            && model.tensor_parallel == 1
            && model.pipeline_parallel == 1;
        if divided_alike {
            return Ok(());
        }
        Err(Error::InvalidValue {
            key: "rollout.expert_parallel".into(),
            value: rollout.expert_parallel.to_string(),
            allowed: format!(
                "1, or with rollout.ranks = 0 (colocated) model.expert_parallel ({}) without \
                 tensor or pipeline parallelism: the training ranks' engines each serve their \
                 own trainer's block of experts",
                model.expert_parallel
            ),
            origin: None,
        })
    }

    /// Settings that load and run but are likely a mistake, one [`Caution`] each, for the run
    /// to log as warnings (a config is not refused for them: a user may mean it).
    ///
    /// - `train.warmup_steps = 0` after an `[sft]` stage: the RL stage starts a fresh AdamW,
    ///   whose first bias-corrected step `m̂ / (√v̂ + ε) = g / (|g| + ε) ≈ ±1` moves every
    ///   weight by about `train.learning_rate` whatever its gradient's size (measured:
    ///   [`TrainConfig::warmup_steps`]).
    pub fn cautions(&self) -> Vec<Caution> {
        let mut cautions = Vec::new();
        if self.sft.is_some() && self.train.warmup_steps == 0 {
            cautions.push(Caution {
                key: "train.warmup_steps".to_owned(),
                value: "0".to_owned(),
                why: format!(
                    "the RL stage starts a fresh AdamW after `[sft]`, and its first step \
                     moves every weight by about train.learning_rate ({}) whatever the \
                     gradient; a few steps of warm-up (the main job uses 20) avoid undoing \
                     the SFT stage",
                    self.train.learning_rate
                ),
            });
        }
        cautions
    }

    /// The sections the chosen pipeline needs are present, and the sections agree with each
    /// other: a combination that cannot run is refused here, naming the key, rather than at the
    /// first step.
    fn validate_pipeline(&self) -> Result<()> {
        let missing = match self.pipeline {
            Pipeline::Rlvr if self.domains.is_empty() => Some("domains"),
            Pipeline::Agentic if self.agentic.is_none() => Some("agentic.env"),
            _ => None,
        };
        if let Some(key) = missing {
            return Err(Error::MissingKey {
                key: key.to_owned(),
            });
        }
        let refuse = |key: &str, value: &str, allowed: &str| {
            Err(Error::InvalidValue {
                key: key.to_owned(),
                value: value.to_owned(),
                allowed: allowed.to_owned(),
                origin: None,
            })
        };
        // Keys of the other pipeline would be read by nothing: refuse them rather than ignore.
        match self.pipeline {
            Pipeline::Rlvr => {
                if self.agentic.is_some() {
                    return refuse(
                        "agentic",
                        "a section",
                        "no `[agentic]` section with `pipeline = \"rlvr\"`",
                    );
                }
            }
            Pipeline::Agentic => {
                if !self.domains.is_empty() {
                    return refuse(
                        "domains",
                        "a section",
                        "no `[domains]` with `pipeline = \"agentic\"` (environments give the \
                         rewards)",
                    );
                }
                let defaults = RolloutConfig::default();
                let r = &self.rollout;
                let rlvr_only = [
                    (
                        "rollout.prompts_per_step",
                        r.prompts_per_step != defaults.prompts_per_step,
                        u64::from(r.prompts_per_step),
                        "`agentic.num_groups`",
                    ),
                    (
                        "rollout.group_size",
                        r.group_size != defaults.group_size,
                        u64::from(r.group_size),
                        "`agentic.group_size`",
                    ),
                    (
                        "rollout.oversample_prompts",
                        r.oversample_prompts != defaults.oversample_prompts,
                        u64::from(r.oversample_prompts),
                        "`agentic.group_size_redundancy`",
                    ),
                    (
                        "rollout.max_new_tokens",
                        r.max_new_tokens != defaults.max_new_tokens,
                        u64::from(r.max_new_tokens),
                        "`agentic.max_tokens_per_turn`",
                    ),
                    (
                        "rollout.max_staleness",
                        r.max_staleness != defaults.max_staleness,
                        u64::from(r.max_staleness),
                        "`agentic.max_staleness`",
                    ),
                    (
                        "rollout.hang_warning_s",
                        r.hang_warning_s != defaults.hang_warning_s,
                        r.hang_warning_s,
                        "`agentic.hung_timeout` (the environment manager's watchdog)",
                    ),
                ];
                for (key, set, value, instead) in rlvr_only {
                    if set {
                        return refuse(
                            key,
                            &value.to_string(),
                            &format!("its default with `pipeline = \"agentic\"`; use {instead}"),
                        );
                    }
                }
            }
        }
        if self.algorithm.objective.is_supervised() {
            return refuse(
                "algorithm.objective.policy_loss.kind",
                "\"cross_entropy\"",
                "a reinforcement-learning loss: cross-entropy ignores the rewards (it is the \
                 objective of the `[sft]` warm start)",
            );
        }
        let advantage = &self.algorithm.advantage;
        if advantage.compares_within_group() {
            let (key, size) = match &self.agentic {
                Some(agentic) if self.pipeline == Pipeline::Agentic => {
                    ("agentic.group_size", agentic.group_size)
                }
                _ => ("rollout.group_size", self.rollout.group_size),
            };
            if size < 2 {
                return refuse(
                    key,
                    &size.to_string(),
                    &format!(
                        "at least 2 with `algorithm.advantage.kind = \"{}\"`: it scores each \
                         sample against the other samples of its group, so in a group of one \
                         every advantage is 0 and nothing trains",
                        advantage.name()
                    ),
                );
            }
        }
        if advantage.is_step_level() {
            let kind = format!("\"{}\"", advantage.name());
            if self.pipeline != Pipeline::Agentic {
                return refuse(
                    "algorithm.advantage.kind",
                    &kind,
                    "an estimator over whole responses: GiGPO and step REINFORCE take each turn \
                     of a multi-turn trajectory as a step, which needs `pipeline = \"agentic\"`",
                );
            }
            if self.algorithm.reward_shaping != RewardShaping::default() {
                return refuse(
                    "algorithm.reward_shaping",
                    "a reward shaping",
                    &format!(
                        "none with advantage.kind = {kind}, which normalises its step returns \
                         itself (configure `algorithm.advantage.{}` instead)",
                        if matches!(advantage, AdvantageEstimator::Gigpo { .. }) {
                            "episode_normalization"
                        } else {
                            "normalization"
                        }
                    ),
                );
            }
        }
        if self.pipeline != Pipeline::Agentic
            && matches!(
                self.algorithm.objective.policy_loss,
                PolicyLoss::Ppo {
                    ratio: RatioLevel::Segment,
                    ..
                }
            )
        {
            return refuse(
                "algorithm.objective.policy_loss.ratio",
                "\"segment\"",
                "\"token\" or \"sequence\": a single-turn response is one segment, so a \
                 segment ratio outside `pipeline = \"agentic\"` is the sequence ratio",
            );
        }
        if advantage.uses_critic() {
            return refuse(
                "algorithm.advantage.kind",
                &format!("\"{}\"", advantage.name()),
                "an estimator without a critic: a config cannot describe a critic model yet \
                 (build the pipeline in code with `RlvrPipeline::with_critic`)",
            );
        }
        let optimizer_steps = self
            .run
            .max_steps
            .saturating_mul(u64::from(self.train.ppo_epochs));
        if matches!(self.train.lr_schedule, LrSchedule::Cosine { .. })
            && self.train.warmup_steps >= optimizer_steps
        {
            return refuse(
                "train.warmup_steps",
                &self.train.warmup_steps.to_string(),
                &format!(
                    "fewer than the run's {optimizer_steps} optimiser steps (`run.max_steps × \
                     train.ppo_epochs`): the cosine schedule decays after the warm-up"
                ),
            );
        }
        if self.train.critic_warmup > 0 {
            return refuse(
                "train.critic_warmup",
                &self.train.critic_warmup.to_string(),
                "0: a config cannot describe a critic yet, so nothing would train during the \
                 warm-up (set `RlvrPipelineConfig::critic_warmup` with `with_critic` in code)",
            );
        }
        if self.algorithm.objective.train_infer_correction.is_some()
            && !self.train.recompute_old_logprobs
        {
            return refuse(
                "algorithm.objective.train_infer_correction",
                "a correction",
                "a correction only with `train.recompute_old_logprobs = true`: without \
                 recomputed old log-probs they are the rollout's, and the ratio it corrects \
                 is 1",
            );
        }
        Ok(())
    }

    /// The fully resolved config as TOML; loading it again gives an equal `Config`.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| Error::ConfigSource {
            origin: "the resolved config".to_owned(),
            message: format!("cannot be written as TOML: {e}"),
        })
    }
}
