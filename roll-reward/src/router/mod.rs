//! Routing samples to their domain's worker: the [`RewardRouter`], the [`RewardRegistry`] that
//! builds workers from config, and the [`DomainQuota`] / [`PromptMixer`] that decide how many
//! prompts of each domain a batch holds and resolve each prompt's domain as it enters the run.
//!
//! The modules form layers, each using only those below it:
//!
//! | layer | modules |
//! |---|---|
//! | router | `dispatch` ([`RewardRouter`]) |
//! | built-in kinds | `builtins` ([`RewardRegistry::with_builtins`]) |
//! | registry | `registry` ([`RewardRegistry`]) |
//! | prompt stream | `mixer` ([`PromptMixer`]) |
//! | leaves | `options` ([`RouteOptions`]), `context` ([`RegistryContext`]), `wrapping` ([`WrapperOptions`]), `quota` ([`DomainQuota`]), `status` ([`MixerStatus`]), `isolate` |

mod builtins;
mod context;
mod dispatch;
mod isolate;
mod mixer;
mod options;
mod quota;
mod registry;
mod status;
mod wrapping;

pub use context::{JudgeModel, RegistryContext};
pub use dispatch::{RewardRouter, RewardRouterBuilder};
pub use mixer::PromptMixer;
pub use options::RouteOptions;
pub use quota::DomainQuota;
pub use registry::{BuiltWorker, RewardRegistry};
pub use status::{MixerEnd, MixerStatus};
pub use wrapping::{WRAPPER_KEYS, WrapperOptions};
