//! Pipelines: the RL step written once against the traits.
//!
//! [`build_train_batch`] turns rewarded groups into a [`TrainBatch`](crate::TrainBatch) under an
//! [`AlgorithmConfig`](roll_algos::AlgorithmConfig); [`RlvrPipeline`] drives a
//! [`Scheduler`](crate::Scheduler) and an actor [`Policy`](crate::Policy) through whole steps. The
//! same pipeline trains on multi-turn trajectories when the scheduler is an environment manager's.
//! [`SftPipeline`] fine-tunes the same actor on prompt/response pairs (the warm start of an RL
//! run).

mod batch_builder;
mod eval;
mod report;
mod rlvr;
mod sft;

pub use batch_builder::{BatchInputs, BatchStats, build_train_batch};
pub use eval::{EvalOutcome, EvalReport, evaluate};
pub use report::StepReport;
pub use rlvr::{PipelineState, RlvrPipeline, RlvrPipelineConfig};
pub use sft::{SftConfig, SftExample, SftPipeline, SftPosition, SftStepReport};
