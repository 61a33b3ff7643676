//! [`RegistryContext`]: the shared resources a worker factory may need besides its options.

use roll_core::Generate;
use roll_core::tokenizer::Tokenizer;
use std::sync::Arc;

/// The judge role: a policy and the tokenizer that renders its prompts.
#[derive(Clone)]
pub struct JudgeModel {
    /// The judge policy.
    pub policy: Arc<dyn Generate>,
    /// Its tokenizer.
    pub tokenizer: Arc<dyn Tokenizer>,
}

/// What factories may need besides their options: shared resources handed to the registry.
#[derive(Clone, Default)]
pub struct RegistryContext {
    judge: Option<JudgeModel>,
}

impl RegistryContext {
    /// The judge, if the registry was given one.
    pub fn judge(&self) -> Option<&JudgeModel> {
        self.judge.as_ref()
    }

    /// Gives factories a judge.
    pub(super) fn set_judge(&mut self, judge: JudgeModel) {
        self.judge = Some(judge);
    }
}
