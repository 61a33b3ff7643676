//! Test support: a learning mock policy, a byte tokenizer, simple rewards and an echo environment,
//! so code built on roll's traits can be tested without a model (enable the `testing` feature).
//!
//! ```
//! use roll_core::testing::{ByteTokenizer, ConstantReward, EchoEnv, MockPolicy};
//! use roll_core::{Env, Generate, GenerationRequest, RewardWorker, SamplingParams};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let policy = MockPolicy::digits();
//! let request = GenerationRequest::new(vec![1, 2, 3], SamplingParams { seed: Some(7), max_new_tokens: 4, ..Default::default() });
//! let out = policy.generate(request).await.unwrap();
//! assert!(out.token_ids.len() <= 4);
//! # });
//! ```

mod echo_env;
mod mock_policy;
mod rewards;
mod scripted_policy;
mod tokenizer;

pub use crate::rng::SplitMix64;
pub use echo_env::EchoEnv;
pub use mock_policy::MockPolicy;
pub use rewards::{ConstantReward, FailingReward};
pub use scripted_policy::ScriptedPolicy;
pub use tokenizer::ByteTokenizer;
