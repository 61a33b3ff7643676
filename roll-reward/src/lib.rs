//! # roll-reward — reward workers and the router that sends each sample to its domain's worker
//!
//! Rewards are where researchers put their domain knowledge, and where one strange sample must
//! never take down a training run. This crate holds:
//!
//! * **Workers** — each a [`RewardWorker`](roll_core::RewardWorker) in its own module:
//!   - [`math::MathRuleWorker`]: extracts the final answer (`\boxed{}`, `#### x`, "the answer
//!     is x") and decides equivalence with the ground truth — numbers in every notation,
//!     tuples, intervals, sets, equations, and symbolic expressions compared at random points
//!     with a built-in expression parser ([`math::Expr`]);
//!   - [`code_sandbox::CodeSandboxWorker`]: runs the response's Python program against
//!     stdin/stdout, assert-style or function-call test cases in a real sandbox (namespaces, an
//!     unprivileged user, rlimits, a private temporary directory, no network);
//!   - [`judge::LlmJudge`]: any [`Policy`](roll_core::Policy) grades the response with a prompt
//!     template; a robust parser reads `Score: 7/10`, `8`, `yes`/`no`; calls are
//!     concurrency-limited;
//!   - [`ifeval::IfEvalWorker`]: 24 verifiable instructions (IFEval / RLVR-IFeval taxonomy)
//!     selected by a `{"func_name", "kwargs"}` ground truth;
//!   - [`format::FormatWorker`] (think-then-answer format) and
//!     [`multiple_choice::MultipleChoiceWorker`] (boxed option letter).
//! * **Wrappers** ([`wrappers`]) that add one behaviour each around any worker: timeout,
//!   weight, clip, repetition penalty, length penalty, cache.
//! * **The router** ([`router`]): [`RewardRouter`](router::RewardRouter) dispatches on the
//!   prompt's (resolved) domain, runs every call isolated (errors, panics and timeouts cost one
//!   sample, never the run) under a per-domain concurrency limit;
//!   [`RewardRegistry`](router::RewardRegistry) builds workers by name from a run's `[domains]`
//!   config; [`PromptMixer`](router::PromptMixer) is the run's prompt stream: it resolves each
//!   prompt's dataset tag to its domain, once, and mixes domains by the
//!   [`DomainQuota`](router::DomainQuota) of their ratios.
//!
//! ```
//! use roll_core::config::{ComponentSpec, DomainConfig};
//! use roll_core::{Prompt, PromptId};
//! use roll_reward::router::{PromptMixer, RewardRegistry, RewardRouter};
//! use std::collections::BTreeMap;
//!
//! let mut domains = BTreeMap::new();
//! let mut math = DomainConfig::new(ComponentSpec::new("math_rule").with_option("timeout_s", 5));
//! math.ratio = 3.0;
//! math.tags = vec!["gsm8k".into()];
//! domains.insert("math".to_owned(), math);
//! domains.insert("ifeval".to_owned(), DomainConfig::new(ComponentSpec::new("ifeval")));
//! let router = RewardRouter::from_config(&domains, &RewardRegistry::with_builtins())?;
//! assert_eq!(router.quota()?.next_counts(8), vec![2, 6]); // ifeval, math
//!
//! // The prompt stream a scheduler draws from: tags resolved, domains mixed 1:3.
//! let dataset = (0..10).map(|i| {
//!     let tag = if i % 2 == 0 { "gsm8k" } else { "ifeval" };
//!     Prompt::new(PromptId(i), "...", tag)
//! });
//! let mixer = PromptMixer::from_config(&domains, dataset, 4)?;
//! let first: Vec<String> = mixer.take(4).map(|p| p.domain).collect();
//! assert_eq!(first, ["ifeval", "math", "math", "math"]);
//! # Ok::<(), roll_reward::RewardError>(())
//! ```
#![warn(missing_docs)]

pub mod code_sandbox;
pub mod error;
pub mod format;
pub mod ifeval;
mod join;
pub mod judge;
pub mod math;
pub mod multiple_choice;
pub mod router;
mod shared;
pub mod text;
pub mod wrappers;

pub use error::{Result, RewardError};
pub use shared::SharedWorker;
