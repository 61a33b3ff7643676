//! # roll-core — the vocabulary of roll
//!
//! roll trains large language models with reinforcement learning. This crate holds everything that
//! is true whatever model, environment or hardware is used, so the whole system can be read from
//! its public API:
//!
//! * **Data model** ([`data`]): a [`Prompt`] (text, dataset tag and the domain it resolves to,
//!   ground truth) is answered by a
//!   [`Group`] of [`Sample`]s; a sample — or a multi-turn [`Trajectory`] — records the token ids,
//!   per-token log-probs, loss mask, reward and the [`WeightVersion`] that generated it; rewarded
//!   groups become a [`TrainBatch`].
//! * **Five traits**, each small, each a seam where a researcher plugs in their own code:
//!   - [`Policy`] — the actor: [`Generate`] + [`Score`] + [`Train`]. Each role takes only the
//!     capabilities it has: a reference is a [`Score`], a critic a [`Critic`] (score + train), a
//!     judge a [`Generate`].
//!   - [`RewardWorker`] — scores one sample; any `Fn(&Sample) -> f32` closure is one.
//!   - [`Env`] — a text environment for multi-turn agents: `reset(seed)`, `step(action)`.
//!   - [`Strategy`] — how a role is placed on devices and how its work is split across replicas.
//!   - [`Scheduler`] — turns prompts into finished, rewarded groups ready for training.
//! * **Config** ([`config`]): one typed tree, read from TOML/YAML, `ROLL_` environment variables
//!   and `key.path=value` overrides, validated up front.
//! * **Errors** ([`Error`]): every user-reachable failure is a value naming what was wrong.
//!
//! The `testing` feature adds `testing`: a mock policy, constant and closure rewards and an echo
//! environment, so code built on the traits can be tested without a model.
#![warn(missing_docs)]

pub mod abort;
pub mod config;
pub mod data;
pub mod env;
pub mod episode;
pub mod error;
pub mod pipeline;
pub mod policy;
pub mod reward;
pub mod rng;
pub mod scheduler;
pub mod strategy;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokenizer;

pub use abort::{AbortHandle, AbortSignal};
pub use data::{
    FinishReason, Group, GroupId, Prompt, PromptId, Response, Reward, Sample, SampleId, TrainBatch,
    TrainSequence, Trajectory, Turn, WeightVersion,
};
pub use env::{Env, EnvStatus, Observation, StepResult};
pub use error::{BoxError, Error, Result};
pub use policy::{
    Critic, Generate, Generation, GenerationRequest, Policy, SamplingParams, Score, ScoreKernels,
    ScoreRequest, TokenScores, Train, TrainOutput,
};
pub use reward::{IntoReward, RewardWorker};
pub use scheduler::{RolloutBatch, Scheduler};
pub use strategy::{Messenger, ReduceOp, Strategy};
pub use tokenizer::Tokenizer;
