//! [`MathRuleWorker`]: 1 if the final answer equals the ground truth, else 0.

use super::equivalence::{MAX_POINTS, Rule, Tolerance, equivalent};
use super::extract::{AnswerSource, extract_answer, gold_answer, whole_answer};
use crate::error::RewardError;
use crate::text::shorten;
use async_trait::async_trait;
use roll_core::{Reward, RewardWorker, Sample};
use serde::{Deserialize, Serialize};

/// Options of [`MathRuleWorker`] (registry kind `math_rule`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MathRuleConfig {
    /// Relative tolerance for values with an irrational part, and the most a rounded decimal
    /// may differ from the exact value it stands for (see [`Tolerance`]); in `[0, 1)`.
    /// Default `1e-6`.
    pub relative_tolerance: f64,
    /// Sample points (per half: twice this are tried) at which symbolic answers are compared;
    /// 3 to [`MAX_POINTS`]. Default `8`.
    pub symbolic_points: usize,
    /// Where the answer is read from. Default [`AnswerFormat::Marked`].
    pub answer: AnswerFormat,
}

/// Where [`MathRuleWorker`] reads a response's final answer (option `answer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerFormat {
    /// The last `\boxed{}`, else a `#### x` line, else "the answer is x" (see
    /// [`extract_answer`]): free-form reasoning with a marked answer, as in GSM8K and MATH.
    #[default]
    Marked,
    /// Only a `\boxed{}` answer; `#### x` and "the answer is x" score 0.
    Boxed,
    /// The whole response is the answer (after any `</think>`, special tokens removed,
    /// surrounding whitespace trimmed): short-answer tasks such as `Q: 12+35=? A: 47`, where any
    /// extra text makes the answer wrong rather than being skipped over.
    Whole,
}

impl Default for MathRuleConfig {
    fn default() -> Self {
        Self {
            relative_tolerance: 1e-6,
            symbolic_points: 8,
            answer: AnswerFormat::Marked,
        }
    }
}

impl MathRuleConfig {
    /// Checks the ranges: a tolerance that is NaN, infinite, negative or 1 and more (which
    /// would make any two numbers of one sign equal), and fewer than 3 or more than
    /// [`MAX_POINTS`] symbolic points, are refused.
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] naming the key.
    pub fn validate(&self) -> Result<(), RewardError> {
        let tol = self.relative_tolerance;
        if !(tol.is_finite() && (0.0..1.0).contains(&tol)) {
            return Err(RewardError::invalid_config(
                "math_rule.relative_tolerance",
                format!("{tol} is not a number in [0, 1)"),
            ));
        }
        if !(3..=MAX_POINTS).contains(&self.symbolic_points) {
            return Err(RewardError::invalid_config(
                "math_rule.symbolic_points",
                format!(
                    "{} is outside 3..={MAX_POINTS} (3 points are needed to decide)",
                    self.symbolic_points
                ),
            ));
        }
        Ok(())
    }
}

/// The verdict of the math rule on one response.
#[derive(Debug, Clone, PartialEq)]
pub struct MathVerdict {
    /// Whether the answer equals the ground truth.
    pub correct: bool,
    /// The rule that matched, when correct.
    pub rule: Option<Rule>,
    /// Where the answer was found.
    pub source: AnswerSource,
    /// The extracted answer.
    pub answer: String,
    /// Whether the response is well formed (boxed answer, balanced `<think>` block).
    pub format_ok: bool,
}

/// Verifies math answers by rule, like ROLL's `MathRuleRewardWorker` but without a Python
/// dependency: the final answer is extracted from the response (last `\boxed{}` after any
/// `</think>`, else `#### x`, else "the answer is x") and compared with the ground truth by the
/// rules of [`equivalent`](crate::math::equivalent): normalised strings, numbers (integers,
/// decimals, fractions, percentages, scientific notation), tuples, intervals, sets, equations and
/// symbolic expressions evaluated at random points.
///
/// The reward is 1 or 0 (`value` and `score`); `details` hold `rule` (the matching rule or
/// `none`), `format` (`true`/`false`), `source` (`boxed`, `hash`, `answer_is`, `whole`, `none`) and
/// `answer`. A prompt without a ground truth is an error.
///
/// ```
/// use roll_reward::math::MathRuleWorker;
///
/// let v = MathRuleWorker::default().verify(r"<think>...</think> so $\boxed{\dfrac{3}{4}}$", "0.75");
/// assert!(v.correct && v.format_ok);
/// assert_eq!(v.rule.map(|r| r.name()), Some("numeric"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct MathRuleWorker {
    config: MathRuleConfig,
}

impl MathRuleWorker {
    /// A verifier with `config`.
    ///
    /// # Errors
    /// If the config is out of range.
    pub fn new(config: MathRuleConfig) -> Result<Self, RewardError> {
        config.validate()?;
        Ok(Self { config })
    }

    /// The verdict on `response` against `ground_truth` (synchronous; what
    /// [`score`](RewardWorker::score) calls).
    pub fn verify(&self, response: &str, ground_truth: &str) -> MathVerdict {
        let extracted = match self.config.answer {
            AnswerFormat::Whole => whole_answer(response),
            AnswerFormat::Marked | AnswerFormat::Boxed => extract_answer(response),
        };
        let tol = Tolerance {
            relative: self.config.relative_tolerance,
            points: self.config.symbolic_points,
        };
        let allowed =
            self.config.answer != AnswerFormat::Boxed || extracted.source == AnswerSource::Boxed;
        let rule = if allowed && !extracted.answer.is_empty() {
            equivalent(&extracted.answer, gold_answer(ground_truth), &tol)
        } else {
            None
        };
        MathVerdict {
            correct: rule.is_some(),
            rule,
            source: extracted.source,
            answer: extracted.answer,
            format_ok: extracted.format_ok,
        }
    }
}

#[async_trait]
impl RewardWorker for MathRuleWorker {
    async fn score(&self, sample: &Sample) -> roll_core::Result<Reward> {
        let truth = sample.prompt.ground_truth.as_deref().ok_or_else(|| {
            RewardError::MissingGroundTruth {
                worker: "math_rule",
                prompt: sample.prompt.id.to_string(),
            }
        })?;
        let v = self.verify(&sample.text, truth);
        let value = if v.correct { 1.0 } else { 0.0 };
        Ok(Reward::new(value)
            .with_score(value)
            .with_detail("rule", v.rule.map_or("none", Rule::name))
            .with_detail("format", v.format_ok.to_string())
            .with_detail("source", v.source.name())
            .with_detail("answer", shorten(&v.answer, 200)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roll_core::{GroupId, Prompt, PromptId, SampleId};
    use std::sync::Arc;

    fn sample(text: &str, truth: Option<&str>) -> Sample {
        let mut p = Prompt::new(PromptId(3), "q", "math");
        p.ground_truth = truth.map(str::to_owned);
        let mut s = Sample::new(SampleId(0), GroupId(0), Arc::new(p), vec![]);
        s.text = text.to_owned();
        s
    }

    #[tokio::test]
    async fn scores_with_details() {
        let w = MathRuleWorker::default();
        let r = w
            .score(&sample(r"\boxed{1,000.0}", Some("1000")))
            .await
            .unwrap();
        assert_eq!(r.value, 1.0);
        assert_eq!(r.details["rule"], "numeric");
        assert_eq!(r.details["format"], "true");
        let r = w
            .score(&sample("the answer is 7", Some("8")))
            .await
            .unwrap();
        assert_eq!((r.value, r.details["rule"].as_str()), (0.0, "none"));
        assert_eq!(r.details["source"], "answer_is");
        let err = w.score(&sample("1", None)).await.unwrap_err();
        assert!(err.to_string().contains("no ground truth"), "{err}");
    }

    #[test]
    fn answer_formats_and_validation() {
        let strict = MathRuleWorker::new(MathRuleConfig {
            answer: AnswerFormat::Boxed,
            ..Default::default()
        })
        .unwrap();
        assert!(!strict.verify("#### 5", "5").correct);
        assert!(strict.verify(r"\boxed{5}", "5").correct);
        let whole = MathRuleWorker::new(MathRuleConfig {
            answer: AnswerFormat::Whole,
            ..Default::default()
        })
        .unwrap();
        // (response, truth, correct): the whole answer must equal the truth; extra text, an empty
        // answer, or an unclosed think block earn nothing.
        for (response, truth, correct) in [
            (" 47", "47", true),
            (" 47<|endoftext|>", "47", true),
            ("<think>sum</think> 47\n", "47", true),
            (" -12", "-12", true),
            (" 12", "-12", false),
            (" 47 48", "47", false),
            (" 4", "47", false),
            ("", "0", false),
            ("   ", "0", false),
            ("<think>47", "47", false),
            ("47 is the answer is 47", "47", false),
        ] {
            let v = whole.verify(response, truth);
            assert_eq!(v.correct, correct, "{response:?} vs {truth}");
            assert_eq!(
                v.source == AnswerSource::Whole,
                !v.answer.is_empty() || correct
            );
        }
        let bad = MathRuleConfig {
            symbolic_points: 1,
            ..Default::default()
        };
        assert!(
            MathRuleWorker::new(bad)
                .unwrap_err()
                .to_string()
                .contains("symbolic_points")
        );
    }
}
