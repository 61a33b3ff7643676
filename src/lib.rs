//! # roll — reinforcement-learning post-training of LLMs, library first
//!
//! roll is a set of crates you depend on from Cargo and compose in ordinary Rust code. This facade
//! re-exports them under short names and offers a [`prelude`]:
//!
//! | module | crate | what it holds |
//! |---|---|---|
//! | [`core`](mod@core) | `roll-core` | data model, the five traits, config, schedulers, pipelines |
//! | [`algos`](mod@algos) | `roll-algos` | advantage estimators, losses, KL, reward shaping, filters |
//! | [`env`](mod@env) | `roll-env` | text environments and the environment manager |
//! | [`reward`](mod@reward) | `roll-reward` | reward workers and the domain router |
//! | [`backend`](mod@backend) | `roll-backend-burn` | the Burn implementation of `Policy` |
//!
//! Start with the traits in [`core`]: implement [`Env`](prelude::Env) or
//! [`RewardWorker`](prelude::RewardWorker) for your task and hand them to a pipeline.

pub use roll_algos as algos;

/// Compiles the README's examples as doctests, so the README cannot drift from the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use roll_backend_burn as backend;

pub mod run;

/// Sends roll's logs (the `tracing` events: checkpoints saved and resumed from, skipped
/// checkpoints, calls the watchdog names) to stderr, filtered by `RUST_LOG` when it is set
/// (e.g. `RUST_LOG=debug`), else warnings and roll's own info lines. Returns `false` when the
/// program already installed a subscriber (which then receives them).
pub fn init_logging() -> bool {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,roll=info,roll_core=info,roll_backend_burn=info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .is_ok()
}
pub use roll_core as core;
pub use roll_env as env;
/// Runs across processes on MPI (feature `mpi`): [`roll_mpi::MpiWorld`], whose replicas are the
/// [`Messenger`](roll_core::Messenger) of [`run::RunBuilder::lead`] and [`run::follow`].
#[cfg(feature = "mpi")]
pub use roll_mpi as mpi;
pub use roll_reward as reward;

/// The names most programs need: the traits to implement, the data they see, a config and the
/// run that trains from it, the Burn roles and the pipeline parts for composing one by hand.
pub mod prelude {
    pub use crate::run::{Followed, Run, RunBuilder, RunPlan, RunSummary, follow};
    pub use roll_algos::AlgorithmConfig;
    pub use roll_algos::filter::DynamicFilter;
    pub use roll_backend_burn::engine::EngineConfig;
    pub use roll_backend_burn::train::TrainerConfig;
    pub use roll_backend_burn::{
        BurnCritic, BurnFrozen, BurnPolicy, BurnReference, ChatTemplate, Device, HfTokenizer,
        Placement, PolicyOptions, load_model,
    };
    pub use roll_core::config::Config;
    pub use roll_core::pipeline::{
        RlvrPipeline, RlvrPipelineConfig, SftConfig, SftExample, SftPipeline, StepReport,
    };
    pub use roll_core::scheduler::{
        GroupFilter, RlvrScheduler, RlvrSchedulerConfig, RolloutBatch, Scheduler,
    };
    pub use roll_core::strategy::{DeviceSpec, LocalGroup, LocalReplica, Messenger, SingleDevice};
    pub use roll_core::tokenizer::{ChatMessage, Role};
    pub use roll_core::{
        Critic, Env, EnvStatus, Error, Generate, Generation, GenerationRequest, Group, Observation,
        Policy, Prompt, PromptId, Result, Reward, RewardWorker, Sample, SamplingParams, Score,
        ScoreKernels, StepResult, Strategy, Tokenizer, Train, TrainBatch, Trajectory,
        WeightVersion,
    };
    pub use roll_env::{AgenticScheduler, EnvManager, EnvManagerConfig, EnvRegistry};
    pub use roll_reward::router::{RewardRegistry, RewardRouter};
}
