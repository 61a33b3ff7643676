//! Finding the final answer in a response, and the answer in a ground truth.

use crate::text::{after_think, answer_is, hash_answer, last_boxed, strip_special_tokens};
use std::fmt;

/// Where the final answer was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnswerSource {
    /// The last `\boxed{...}` after any `</think>`.
    Boxed,
    /// A GSM8K-style `#### x` line.
    Hash,
    /// A sentence "... the answer is x".
    AnswerIs,
    /// The whole response ([`AnswerFormat::Whole`](crate::math::AnswerFormat::Whole)).
    Whole,
    /// No answer: none of the above, or a `<think>` block that never closed.
    None,
}

impl AnswerSource {
    /// The name reported in details: `boxed`, `hash`, `answer_is`, `whole` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            AnswerSource::Boxed => "boxed",
            AnswerSource::Hash => "hash",
            AnswerSource::AnswerIs => "answer_is",
            AnswerSource::Whole => "whole",
            AnswerSource::None => "none",
        }
    }
}

impl fmt::Display for AnswerSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The final answer of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractedAnswer {
    /// The answer text (empty for `\boxed{}` or when there is none).
    pub answer: String,
    /// Where it was found.
    pub source: AnswerSource,
    /// Whether the response is well formed: the answer is in a non-empty `\boxed{}` and any
    /// `<think>` block is opened at most once and closed exactly once.
    pub format_ok: bool,
}

/// The final answer of `response`: special tokens removed, everything up to the last `</think>`
/// ignored, then the last `\boxed{}`, else a `#### x` line, else "the answer is x".
pub fn extract_answer(response: &str) -> ExtractedAnswer {
    let text = strip_special_tokens(response);
    let none = ExtractedAnswer {
        answer: String::new(),
        source: AnswerSource::None,
        format_ok: false,
    };
    let Some(region) = after_think(&text) else {
        return none;
    };
    let (answer, source) = if let Some(b) = last_boxed(region) {
        (b, AnswerSource::Boxed)
    } else if let Some(h) = hash_answer(region) {
        (h, AnswerSource::Hash)
    } else if let Some(a) = answer_is(region) {
        (a, AnswerSource::AnswerIs)
    } else {
        return none;
    };
    let answer = answer.trim().to_owned();
    let think_ok = text.matches("<think>").count() <= 1 && text.matches("</think>").count() <= 1;
    ExtractedAnswer {
        format_ok: source == AnswerSource::Boxed && !answer.is_empty() && think_ok,
        answer,
        source,
    }
}

/// The whole of `response` as the answer: special tokens removed, everything up to the last
/// `</think>` ignored, whitespace trimmed. An unclosed `<think>` block gives no answer (source
/// `none`), like [`extract_answer`].
pub fn whole_answer(response: &str) -> ExtractedAnswer {
    let text = strip_special_tokens(response);
    match after_think(&text) {
        Some(region) if !region.trim().is_empty() => ExtractedAnswer {
            answer: region.trim().to_owned(),
            source: AnswerSource::Whole,
            format_ok: true,
        },
        _ => ExtractedAnswer {
            answer: String::new(),
            source: AnswerSource::None,
            format_ok: false,
        },
    }
}

/// The answer in a ground truth: the content of its last `\boxed{}` or `#### x` when it has
/// one (datasets store either), else the whole text.
pub fn gold_answer(ground_truth: &str) -> &str {
    last_boxed(ground_truth)
        .or_else(|| hash_answer(ground_truth))
        .unwrap_or(ground_truth)
        .trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_in_order_of_preference() {
        let e = extract_answer(r"#### 3 and \boxed{4}");
        assert_eq!(
            (e.answer.as_str(), e.source, e.format_ok),
            ("4", AnswerSource::Boxed, true)
        );
        let e = extract_answer("so\n#### 72");
        assert_eq!(
            (e.answer.as_str(), e.source, e.format_ok),
            ("72", AnswerSource::Hash, false)
        );
        let e = extract_answer("Thus the answer is 9.");
        assert_eq!((e.answer.as_str(), e.source), ("9", AnswerSource::AnswerIs));
        assert_eq!(extract_answer("nothing").source, AnswerSource::None);
    }

    #[test]
    fn think_blocks_and_empty_boxes() {
        let e = extract_answer(r"<think>\boxed{1}</think>\boxed{2}<|im_end|>");
        assert_eq!((e.answer.as_str(), e.format_ok), ("2", true));
        assert_eq!(
            extract_answer(r"<think>\boxed{1}").source,
            AnswerSource::None
        );
        let e = extract_answer(r"\boxed{}");
        assert_eq!(
            (e.answer.as_str(), e.source, e.format_ok),
            ("", AnswerSource::Boxed, false)
        );
        assert!(!extract_answer(r"</think>a</think>\boxed{1}").format_ok);
    }

    #[test]
    fn gold_answers() {
        assert_eq!(gold_answer(r"\boxed{5}"), "5");
        assert_eq!(gold_answer("steps\n#### 18"), "18");
        assert_eq!(gold_answer(" 7 "), "7");
    }
}
