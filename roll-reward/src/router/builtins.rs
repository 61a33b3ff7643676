//! The worker kinds every [`RewardRegistry::with_builtins`] knows.
//!
//! This module sits above the registry (it only calls [`RewardRegistry::register`]), so the
//! registry itself knows no worker: a registry built with [`RewardRegistry::new`] is empty, and
//! adding a built-in touches this file only.

use super::registry::RewardRegistry;
use crate::code_sandbox::{CodeSandboxConfig, CodeSandboxWorker};
use crate::error::RewardError;
use crate::format::{FormatConfig, FormatWorker};
use crate::ifeval::{IfEvalConfig, IfEvalWorker};
use crate::judge::{LlmJudge, LlmJudgeConfig};
use crate::math::{MathRuleConfig, MathRuleWorker};
use crate::multiple_choice::{MultipleChoiceConfig, MultipleChoiceWorker};

impl RewardRegistry {
    /// A registry with the built-in kinds: `math_rule`, `ifeval`, `format`, `multiple_choice`,
    /// `code_sandbox` and `llm_judge` (which needs [`with_judge`](Self::with_judge)).
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        r.register("math_rule", |c: MathRuleConfig, _| MathRuleWorker::new(c));
        r.register("ifeval", |c: IfEvalConfig, _| Ok(IfEvalWorker::new(c)));
        r.register("format", |c: FormatConfig, _| Ok(FormatWorker::new(c)));
        r.register("multiple_choice", |c: MultipleChoiceConfig, _| {
            MultipleChoiceWorker::new(c)
        });
        r.register("code_sandbox", |c: CodeSandboxConfig, _| {
            CodeSandboxWorker::new(c)
        });
        r.register("llm_judge", |c: LlmJudgeConfig, ctx| {
            let judge = ctx.judge().ok_or_else(|| RewardError::MissingResource {
                kind: "llm_judge".into(),
                what: "a judge policy and tokenizer (`RewardRegistry::with_judge`)".into(),
            })?;
            LlmJudge::new(judge.policy.clone(), judge.tokenizer.clone(), c)
        });
        r
    }
}
