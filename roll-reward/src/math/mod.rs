//! The math rule verifier: answer extraction, normalisation, equivalence rules and the
//! expression parser they use.
//!
//! [`MathRuleWorker`] is the [`RewardWorker`](roll_core::RewardWorker); the functions below are
//! public so they can be used (and benchmarked) on their own.

mod equivalence;
mod expr;
mod extract;
mod normalize;
mod rational;
mod value;
mod worker;

pub use equivalence::{MAX_ANSWER_LEN, MAX_ELEMENTS, MAX_POINTS, Rule, Tolerance, equivalent};
pub use expr::{Expr, Func};
pub use extract::{AnswerSource, ExtractedAnswer, extract_answer, gold_answer, whole_answer};
pub use normalize::{MAX_NORMALIZE_LEN, normalize};
pub use rational::{MAX_BITS, Rational};
pub use value::{Agreement, Value, compare};
pub use worker::{AnswerFormat, MathRuleConfig, MathRuleWorker, MathVerdict};
