//! Disaggregated rollout: generation on other ranks of the job than training.
//!
//! In a colocated run the actor's inference engine shares the trainer's process. Disaggregated,
//! ranks of their own only generate — ROLL's `actor_infer` role on its own devices — and the
//! controller's rank trains:
//!
//! - [`RolloutServer::serve`] runs on each rollout rank: an [`Engine`](crate::engine::Engine)
//!   fed by the controller's messages.
//! - [`RemoteRollout`] is the controller's side, a [`Generate`](roll_core::policy::Generate)
//!   like any other: each request goes to the rollout rank that took its prompt's start last
//!   (an agentic episode's next turn finds its earlier turns in that engine's prefix cache)
//!   unless that rank is much busier than the least busy, which gets it then; aborts follow it
//!   there,
//!   and [`RemoteRollout::sync`] hands every rank new weights with their version.
//! - [`Disaggregated`] is the actor the pipeline sees: it generates remotely, scores and trains
//!   with the local [`BurnPolicy`](crate::BurnPolicy), and after each step that changed the
//!   weights pushes them to the rollout ranks before the step returns — so the rollout ranks'
//!   weight version follows the trainer's, step for step.
//!
//! # Protocol
//! Over any [`Messenger`](roll_core::strategy::Messenger) (MPI across processes, threads in
//! tests). Only the controller starts an exchange and each exchange is one message each way
//! (JSON, but for the weights): a rank never sends while the other is sending, which is what keeps MPI's
//! blocking sends from deadlocking. A round carries new requests and aborts and brings back the
//! requests that finished since the last round; the controller polls a rank while it has
//! requests there. Weights travel as raw little-endian `f32` in buckets of at most
//! [`BUCKET_FLOATS`], every float parameter of the model in [`Module::visit`] order, copied
//! once on each side, and the rank answers once its engine serves them.
//!
//! [`Module::visit`]: burn::module::Module::visit

mod actor;
mod client;
mod server;
pub(crate) mod weights;
pub(crate) mod wire;

pub use actor::Disaggregated;
pub use client::RemoteRollout;
pub use server::{RolloutServer, Served};

/// Floats per weight message: 64 MiB, well under MPI's 2 GiB message limit, and small enough
/// that a rank receiving a 7B model's 28 GB does not hold two copies of it in flight.
pub const BUCKET_FLOATS: usize = 16 << 20;
