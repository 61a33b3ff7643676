//! # roll-env — text environments and the environment manager
//!
//! Environments an LLM agent can learn in, all behind roll-core's [`Env`](roll_core::Env) trait:
//! text in, text out, deterministic under a seed, and forgiving about format (an unparseable
//! action is a no-op step with a configurable penalty, never an error).
//!
//! | kind | type | task |
//! |---|---|---|
//! | `frozen_lake` | [`FrozenLake`] | walk to the goal across (slippery) ice |
//! | `sokoban` | [`Sokoban`] | SimpleSokoban: 6×6, one box |
//! | `larger_sokoban` | [`Sokoban`] | LargerSokoban: 8×8, two boxes |
//! | `sokoban_vocab` | [`Sokoban`] | DifferentGridVocab: SimpleSokoban drawn with other symbols |
//! | `shop` | [`Shop`] | WebShop-like: search a catalogue, pick options, buy |
//! | `tool_use` | [`ToolUse`] | arithmetic with a calculator (and optionally a code sandbox) |
//!
//! Environments are built by name from a [`ComponentSpec`](roll_core::config::ComponentSpec)
//! through an [`EnvRegistry`], where users register their own. The [`EnvManager`] plays many
//! episodes at once in groups that share a seed, survives environments that panic or hang, and
//! feeds the agentic pipeline through [`AgenticScheduler`], a [`Scheduler`](roll_core::Scheduler).
//!
//! Episode rules shared by every environment are [`wrappers`]: a step limit, a format penalty for
//! invalid actions and a guard against stepping outside an episode, chained with
//! [`EnvExt`](wrappers::EnvExt) onto any environment (the built-in ones wear all three).
//!
//! Shared pieces: [`action`] (the lenient action parser), [`prompt`] (the turn prompt), [`grid`].
#![warn(missing_docs)]

pub mod action;
mod error;
mod evaluate;
pub mod frozen_lake;
pub mod grid;
pub mod manager;
pub mod prompt;
mod registry;
mod rng;
mod scheduler;
pub mod shop;
pub mod sokoban;
pub mod tool_use;
pub mod wrappers;

pub use error::EnvError;
pub use evaluate::{EpisodeEval, EpisodeOutcome, evaluate_episodes};
pub use frozen_lake::{FrozenLake, FrozenLakeConfig};
pub use manager::{EnvManager, EnvManagerConfig};
pub use registry::{BUILTIN_KINDS, EnvFactory, EnvOptions, EnvRegistry};
pub use scheduler::AgenticScheduler;
pub use shop::{Shop, ShopConfig};
pub use sokoban::{Sokoban, SokobanConfig};
pub use tool_use::{ToolUse, ToolUseConfig};
