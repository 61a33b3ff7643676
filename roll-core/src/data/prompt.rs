//! Prompts: what the policy is asked.

use super::PromptId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One task for the policy: a user message, the dataset it came from, the domain that scores it
/// and, for verifiable rewards, the ground truth the reward worker checks against.
///
/// Two names, because one dataset is not one domain: `tag` is what the data says (`gsm8k`,
/// `math500`), `domain` is what the run's config makes of it (`math`). The domain decides which
/// reward worker scores the answers, which prompts are normalised together, and how many prompts
/// of this kind a batch holds. It is resolved once, when the prompt enters the RLVR pipeline
/// ([`DomainMap::resolve_prompt`](crate::config::DomainMap::resolve_prompt), applied by the
/// reward crate's prompt mixer); everything downstream reads `domain` and never looks at the
/// tag again.
///
/// In serialised form `tag` and `domain` may each be left out when they are equal, so rows
/// written before the two were split (with only `domain`) still load; a row with neither is an
/// error naming the prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "PromptRow")]
pub struct Prompt {
    /// Stable identifier.
    pub id: PromptId,
    /// The user message (rendered through the chat template before generation).
    pub text: String,
    /// An optional system message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The dataset tag the prompt came with, e.g. `gsm8k` (ROLL: the row's `tag`).
    pub tag: String,
    /// The domain that scores the prompt, e.g. `math`: a key of the config's `[domains]`.
    /// Equal to `tag` until resolved (a tag that names a domain resolves to itself).
    pub domain: String,
    /// What a verifier compares against: a final answer, or JSON (test cases, instruction spec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ground_truth: Option<String>,
    /// Anything else a reward worker or filter may need (difficulty, source dataset, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, serde_json::Value>,
}

impl Prompt {
    /// A prompt with a text and a dataset tag, no ground truth. The domain starts equal to the
    /// tag: right for a tag that names its domain (`math`), and resolved by the pipeline for
    /// one that does not (`gsm8k`).
    pub fn new(id: PromptId, text: impl Into<String>, tag: impl Into<String>) -> Self {
        let tag = tag.into();
        Self {
            id,
            text: text.into(),
            system: None,
            domain: tag.clone(),
            tag,
            ground_truth: None,
            metadata: BTreeMap::new(),
        }
    }

    /// Sets the domain explicitly. Resolution keeps an explicit domain (it only checks that the
    /// config knows it), as ROLL keeps a row's own `domain` over its tag's.
    #[must_use]
    pub fn with_domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = domain.into();
        self
    }

    /// Sets the ground truth.
    #[must_use]
    pub fn with_ground_truth(mut self, truth: impl Into<String>) -> Self {
        self.ground_truth = Some(truth.into());
        self
    }

    /// Sets the system message.
    #[must_use]
    pub fn with_system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(system.into());
        self
    }
}

/// The serialised form of a [`Prompt`]: `tag` and `domain` each optional, one defaulting to the
/// other.
#[derive(Deserialize)]
struct PromptRow {
    id: PromptId,
    text: String,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    ground_truth: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, serde_json::Value>,
}

impl TryFrom<PromptRow> for Prompt {
    type Error = String;

    fn try_from(row: PromptRow) -> Result<Self, String> {
        let (tag, domain) = match (row.tag, row.domain) {
            (Some(tag), Some(domain)) => (tag, domain),
            (Some(tag), None) => (tag.clone(), tag),
            (None, Some(domain)) => (domain.clone(), domain),
            (None, None) => {
                return Err(format!(
                    "{} has neither a `tag` nor a `domain`; give at least one",
                    row.id
                ));
            }
        };
        Ok(Self {
            id: row.id,
            text: row.text,
            system: row.system,
            tag,
            domain,
            ground_truth: row.ground_truth,
            metadata: row.metadata,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn new_sets_the_domain_to_the_tag_and_with_domain_overrides_it() {
        let p = Prompt::new(PromptId(1), "2+2?", "gsm8k");
        assert_eq!((p.tag.as_str(), p.domain.as_str()), ("gsm8k", "gsm8k"));
        let p = p.with_domain("math");
        assert_eq!((p.tag.as_str(), p.domain.as_str()), ("gsm8k", "math"));
    }

    #[test]
    fn serde_round_trips_both_fields() {
        let p = Prompt::new(PromptId(3), "q", "gsm8k")
            .with_domain("math")
            .with_ground_truth("4");
        let value = serde_json::to_value(&p).unwrap();
        assert_eq!(value["tag"], "gsm8k");
        assert_eq!(value["domain"], "math");
        assert_eq!(serde_json::from_value::<Prompt>(value).unwrap(), p);
    }

    #[test]
    fn a_missing_tag_or_domain_defaults_to_the_other() {
        let only_tag: Prompt =
            serde_json::from_value(json!({"id": 1, "text": "q", "tag": "gsm8k"})).unwrap();
        assert_eq!(only_tag.domain, "gsm8k");
        // A row written before the split: its `domain` was the tag.
        let only_domain: Prompt =
            serde_json::from_value(json!({"id": 2, "text": "q", "domain": "math"})).unwrap();
        assert_eq!(only_domain.tag, "math");
        let err = serde_json::from_value::<Prompt>(json!({"id": 7, "text": "q"}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("prompt#7 has neither a `tag` nor a `domain`"),
            "{err}"
        );
    }
}
