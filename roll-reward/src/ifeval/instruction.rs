//! The verifiable instructions and how each is checked.

use crate::error::RewardError;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// How a count compares with its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Quantifier {
    /// `count ≥ N`.
    #[serde(rename = "at least")]
    AtLeast,
    /// `|count − N| ≤ tolerance` (±10 % of N, at least 1, for words; ±1 for sentences).
    #[serde(rename = "around")]
    Around,
    /// `count ≤ N`.
    #[serde(rename = "at most")]
    AtMost,
}

impl Quantifier {
    fn holds(self, count: usize, n: usize, tolerance: usize) -> bool {
        match self {
            Quantifier::AtLeast => count >= n,
            Quantifier::AtMost => count <= n,
            Quantifier::Around => count.abs_diff(n) <= tolerance,
        }
    }
}

/// One verifiable instruction, named in ground truths by the `func_name` of the
/// open-instruct / RLVR-IFeval taxonomy that ROLL's `IF_FUNCTIONS_MAP` uses.
#[derive(Debug, Clone, PartialEq)]
pub enum Instruction {
    /// `verify_keywords {keyword_list}`: every keyword appears (case-insensitive).
    Keywords(Vec<String>),
    /// `verify_keyword_frequency {word, N}`: the word appears exactly N times as a whole word.
    KeywordFrequency {
        /// The word.
        word: String,
        /// Required count.
        n: usize,
    },
    /// `validate_forbidden_words {forbidden_words}`: none of them appears as a whole word.
    ForbiddenWords(Vec<String>),
    /// `verify_letter_frequency {letter, N}`: the letter appears exactly N times (case-sensitive).
    LetterFrequency {
        /// The letter.
        letter: char,
        /// Required count.
        n: usize,
    },
    /// `verify_paragraph_count {N}`: N non-empty paragraphs separated by `* * *`.
    ParagraphCount(usize),
    /// `validate_word_constraint {N, quantifier}`: whitespace-separated word count.
    WordCount {
        /// Target.
        n: usize,
        /// Comparison.
        quantifier: Quantifier,
    },
    /// `verify_sentence_constraint {N, quantifier}`: sentences ended by `.`, `!` or `?`.
    SentenceCount {
        /// Target.
        n: usize,
        /// Comparison.
        quantifier: Quantifier,
    },
    /// `validate_paragraphs {N, first_word, i}`: N paragraphs separated by blank lines, the i-th
    /// (1-based) starting with `first_word` (case-insensitive, punctuation ignored).
    Paragraphs {
        /// Number of paragraphs.
        n: usize,
        /// Required first word.
        first_word: String,
        /// Which paragraph, from 1.
        index: usize,
    },
    /// `verify_postscript {postscript_marker}`: the marker appears, followed by some text.
    Postscript(String),
    /// `validate_placeholders {N}`: at least N `[placeholders]`.
    Placeholders(usize),
    /// `verify_bullet_points {N}`: exactly N markdown bullet lines (`* ` or `- `).
    BulletPoints(usize),
    /// `validate_title`: a title in double angular brackets, `<<like this>>`.
    Title,
    /// `validate_choice {options}`: one of the options appears.
    Choice(Vec<String>),
    /// `validate_highlighted_sections {N}`: at least N `*highlighted*` sections.
    HighlightedSections(usize),
    /// `validate_sections {N, section_splitter}`: at least N headers `<splitter> <number>`.
    Sections {
        /// Minimum number of sections.
        n: usize,
        /// The header word, e.g. `Section`.
        splitter: String,
    },
    /// `validate_json_format`: the whole response (a ```json fence allowed) is JSON.
    Json,
    /// `validate_repeat_prompt {original_prompt}`: the response starts with the request.
    RepeatPrompt(String),
    /// `validate_two_responses`: two different responses separated by `******`.
    TwoResponses,
    /// `validate_uppercase`: no lowercase letters.
    Uppercase,
    /// `validate_lowercase`: no uppercase letters.
    Lowercase,
    /// `validate_frequency_capital_words {N, quantifier}`: words in capitals.
    CapitalWords {
        /// Target.
        n: usize,
        /// Comparison.
        quantifier: Quantifier,
    },
    /// `validate_end {end_phrase}`: the response ends with the phrase.
    EndsWith(String),
    /// `validate_quotation`: the response is wrapped in double quotes.
    Quotation,
    /// `validate_no_commas`: no commas.
    NoCommas,
}

/// The `func_name`s understood, in the order of the taxonomy.
pub const INSTRUCTIONS: &[&str] = &[
    "verify_keywords",
    "verify_keyword_frequency",
    "validate_forbidden_words",
    "verify_letter_frequency",
    "verify_paragraph_count",
    "validate_word_constraint",
    "verify_sentence_constraint",
    "validate_paragraphs",
    "verify_postscript",
    "validate_placeholders",
    "verify_bullet_points",
    "validate_title",
    "validate_choice",
    "validate_highlighted_sections",
    "validate_sections",
    "validate_json_format",
    "validate_repeat_prompt",
    "validate_two_responses",
    "validate_uppercase",
    "validate_lowercase",
    "validate_frequency_capital_words",
    "validate_end",
    "validate_quotation",
    "validate_no_commas",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeywordList {
    keyword_list: Vec<String>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WordN {
    word: String,
    #[serde(rename = "N")]
    n: usize,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Forbidden {
    forbidden_words: Vec<String>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LetterN {
    letter: String,
    #[serde(rename = "N")]
    n: usize,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct N {
    #[serde(rename = "N")]
    n: usize,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NQuant {
    #[serde(rename = "N")]
    n: usize,
    quantifier: Quantifier,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParagraphArgs {
    #[serde(rename = "N")]
    n: usize,
    first_word: String,
    i: usize,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Marker {
    postscript_marker: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    options: Vec<String>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SectionArgs {
    #[serde(rename = "N")]
    n: usize,
    section_splitter: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Original {
    original_prompt: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct End {
    end_phrase: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

impl Instruction {
    /// The instruction `func_name` with `kwargs` (null values already removed).
    ///
    /// # Errors
    /// [`RewardError::UnknownInstruction`] naming an unknown `func_name`;
    /// [`RewardError::InvalidInstructionArgs`] naming the instruction and the bad, missing or
    /// unknown argument — including degenerate values that every response would pass or none
    /// could: an empty `keyword_list`, `forbidden_words` or `options` (or an empty entry), an
    /// empty `word`, `first_word`, `postscript_marker`, `section_splitter`, `original_prompt`
    /// or `end_phrase`, a `letter` that is not a letter, `N` = 0 for counts of paragraphs,
    /// placeholders, bullets, highlights, sections, words and sentences, "at least 0" capital
    /// words, and a paragraph index `i` outside `1..=N`.
    pub fn from_parts(func_name: &str, kwargs: Map<String, Value>) -> Result<Self, RewardError> {
        let bad = |reason: String| RewardError::InvalidInstructionArgs {
            func_name: func_name.to_owned(),
            reason,
        };
        let kw = Value::Object(kwargs);
        fn args<T: DeserializeOwned>(
            kw: Value,
            bad: impl Fn(String) -> RewardError,
        ) -> Result<T, RewardError> {
            serde_json::from_value(kw).map_err(|e| bad(e.to_string()))
        }
        let instruction = match func_name {
            "verify_keywords" => Self::Keywords(args::<KeywordList>(kw, bad)?.keyword_list),
            "verify_keyword_frequency" => {
                let a: WordN = args(kw, bad)?;
                Self::KeywordFrequency {
                    word: a.word,
                    n: a.n,
                }
            }
            "validate_forbidden_words" => {
                Self::ForbiddenWords(args::<Forbidden>(kw, bad)?.forbidden_words)
            }
            "verify_letter_frequency" => {
                let a: LetterN = args(kw, bad)?;
                let mut chars = a.letter.chars();
                match (chars.next(), chars.next()) {
                    (Some(letter), None) => Self::LetterFrequency { letter, n: a.n },
                    _ => return Err(bad(format!("`letter` {:?} is not one character", a.letter))),
                }
            }
            "verify_paragraph_count" => Self::ParagraphCount(args::<N>(kw, bad)?.n),
            "validate_word_constraint" => {
                let a: NQuant = args(kw, bad)?;
                Self::WordCount {
                    n: a.n,
                    quantifier: a.quantifier,
                }
            }
            "verify_sentence_constraint" => {
                let a: NQuant = args(kw, bad)?;
                Self::SentenceCount {
                    n: a.n,
                    quantifier: a.quantifier,
                }
            }
            "validate_paragraphs" => {
                let a: ParagraphArgs = args(kw, bad)?;
                Self::Paragraphs {
                    n: a.n,
                    first_word: a.first_word,
                    index: a.i,
                }
            }
            "verify_postscript" => Self::Postscript(args::<Marker>(kw, bad)?.postscript_marker),
            "validate_placeholders" => Self::Placeholders(args::<N>(kw, bad)?.n),
            "verify_bullet_points" => Self::BulletPoints(args::<N>(kw, bad)?.n),
            "validate_title" => {
                args::<NoArgs>(kw, bad)?;
                Self::Title
            }
            "validate_choice" => Self::Choice(args::<Options>(kw, bad)?.options),
            "validate_highlighted_sections" => Self::HighlightedSections(args::<N>(kw, bad)?.n),
            "validate_sections" => {
                let a: SectionArgs = args(kw, bad)?;
                Self::Sections {
                    n: a.n,
                    splitter: a.section_splitter,
                }
            }
            "validate_json_format" => {
                args::<NoArgs>(kw, bad)?;
                Self::Json
            }
            "validate_repeat_prompt" => {
                Self::RepeatPrompt(args::<Original>(kw, bad)?.original_prompt)
            }
            "validate_two_responses" => {
                args::<NoArgs>(kw, bad)?;
                Self::TwoResponses
            }
            "validate_uppercase" => {
                args::<NoArgs>(kw, bad)?;
                Self::Uppercase
            }
            "validate_lowercase" => {
                args::<NoArgs>(kw, bad)?;
                Self::Lowercase
            }
            "validate_frequency_capital_words" => {
                let a: NQuant = args(kw, bad)?;
                Self::CapitalWords {
                    n: a.n,
                    quantifier: a.quantifier,
                }
            }
            "validate_end" => Self::EndsWith(args::<End>(kw, bad)?.end_phrase),
            "validate_quotation" => {
                args::<NoArgs>(kw, bad)?;
                Self::Quotation
            }
            "validate_no_commas" => {
                args::<NoArgs>(kw, bad)?;
                Self::NoCommas
            }
            other => {
                return Err(RewardError::UnknownInstruction {
                    func_name: other.to_owned(),
                    known: INSTRUCTIONS.iter().map(|s| (*s).to_owned()).collect(),
                });
            }
        };
        instruction.validate().map_err(bad)?;
        Ok(instruction)
    }

    /// Refuses degenerate arguments — those that every response passes or none can (an empty
    /// keyword list, an empty end phrase or marker, zero sections, "at least 0" of anything):
    /// such a ground truth rewards saying anything, so it is bad data, not an easy prompt.
    /// The reason names the argument.
    fn validate(&self) -> Result<(), String> {
        let empty = |field: &str, text: &str| -> Result<(), String> {
            if text.trim().is_empty() {
                Err(format!("`{field}` is empty"))
            } else {
                Ok(())
            }
        };
        let list = |field: &str, items: &[String]| -> Result<(), String> {
            if items.is_empty() {
                return Err(format!("`{field}` is an empty list"));
            }
            match items.iter().position(|i| i.trim().is_empty()) {
                Some(k) => Err(format!("`{field}` has an empty entry at index {k}")),
                None => Ok(()),
            }
        };
        let positive = |field: &str, n: usize| -> Result<(), String> {
            if n == 0 {
                Err(format!("`{field}` is 0; the instruction needs at least 1"))
            } else {
                Ok(())
            }
        };
        match self {
            Self::Keywords(k) => list("keyword_list", k),
            Self::ForbiddenWords(k) => list("forbidden_words", k),
            Self::Choice(k) => list("options", k),
            Self::KeywordFrequency { word, .. } => {
                empty("word", word)?;
                if word.chars().all(is_word_char) {
                    Ok(())
                } else {
                    Err(format!(
                        "`word` {word:?} is not a single word (it is counted as a whole word)"
                    ))
                }
            }
            Self::LetterFrequency { letter, .. } => {
                if letter.is_alphabetic() {
                    Ok(())
                } else {
                    Err(format!("`letter` {letter:?} is not a letter"))
                }
            }
            Self::ParagraphCount(n)
            | Self::Placeholders(n)
            | Self::BulletPoints(n)
            | Self::HighlightedSections(n)
            | Self::WordCount { n, .. }
            | Self::SentenceCount { n, .. } => positive("N", *n),
            Self::Paragraphs {
                n,
                first_word,
                index,
            } => {
                positive("N", *n)?;
                if *index == 0 || index > n {
                    return Err(format!("`i` = {index} is not a paragraph in 1..={n}"));
                }
                empty("first_word", first_word)
            }
            Self::Sections { n, splitter } => {
                positive("N", *n)?;
                empty("section_splitter", splitter)
            }
            Self::CapitalWords { n, quantifier } => {
                if *n == 0 && *quantifier == Quantifier::AtLeast {
                    Err("`N` is 0 with `quantifier` \"at least\": every response passes".into())
                } else {
                    Ok(())
                }
            }
            Self::Postscript(marker) => empty("postscript_marker", marker),
            Self::RepeatPrompt(prompt) => empty("original_prompt", prompt),
            Self::EndsWith(phrase) => empty("end_phrase", phrase),
            Self::Title
            | Self::Json
            | Self::TwoResponses
            | Self::Uppercase
            | Self::Lowercase
            | Self::Quotation
            | Self::NoCommas => Ok(()),
        }
    }

    /// The instruction's `func_name` in the taxonomy.
    pub fn func_name(&self) -> &'static str {
        match self {
            Instruction::Keywords(_) => "verify_keywords",
            Instruction::KeywordFrequency { .. } => "verify_keyword_frequency",
            Instruction::ForbiddenWords(_) => "validate_forbidden_words",
            Instruction::LetterFrequency { .. } => "verify_letter_frequency",
            Instruction::ParagraphCount(_) => "verify_paragraph_count",
            Instruction::WordCount { .. } => "validate_word_constraint",
            Instruction::SentenceCount { .. } => "verify_sentence_constraint",
            Instruction::Paragraphs { .. } => "validate_paragraphs",
            Instruction::Postscript(_) => "verify_postscript",
            Instruction::Placeholders(_) => "validate_placeholders",
            Instruction::BulletPoints(_) => "verify_bullet_points",
            Instruction::Title => "validate_title",
            Instruction::Choice(_) => "validate_choice",
            Instruction::HighlightedSections(_) => "validate_highlighted_sections",
            Instruction::Sections { .. } => "validate_sections",
            Instruction::Json => "validate_json_format",
            Instruction::RepeatPrompt(_) => "validate_repeat_prompt",
            Instruction::TwoResponses => "validate_two_responses",
            Instruction::Uppercase => "validate_uppercase",
            Instruction::Lowercase => "validate_lowercase",
            Instruction::CapitalWords { .. } => "validate_frequency_capital_words",
            Instruction::EndsWith(_) => "validate_end",
            Instruction::Quotation => "validate_quotation",
            Instruction::NoCommas => "validate_no_commas",
        }
    }

    /// Whether `response` follows the instruction.
    ///
    /// A response that says nothing — empty, blank, or without a single letter or digit
    /// (`...`, `{}`, `<<>>`, `******`) — follows no instruction: "no commas", "all lowercase",
    /// "no forbidden word", "valid JSON" would otherwise reward saying nothing. "All uppercase"
    /// and "all lowercase" also need a letter of that case. A degenerate instruction (see
    /// [`from_parts`](Self::from_parts)) built directly is followed by no response.
    pub fn check(&self, response: &str) -> bool {
        if !response.chars().any(char::is_alphanumeric) || self.validate().is_err() {
            return false;
        }
        match self {
            Self::Keywords(list) => {
                let lower = response.to_lowercase();
                list.iter().all(|k| lower.contains(&k.to_lowercase()))
            }
            Self::KeywordFrequency { word, n } => {
                let w = word.to_lowercase();
                words(response).filter(|x| x.to_lowercase() == w).count() == *n
            }
            Self::ForbiddenWords(list) => {
                let found: Vec<String> = words(response).map(str::to_lowercase).collect();
                !list.iter().any(|f| {
                    let f = f.to_lowercase();
                    if f.contains(|c: char| !is_word_char(c)) {
                        response.to_lowercase().contains(&f) // a phrase
                    } else {
                        found.contains(&f)
                    }
                })
            }
            Self::LetterFrequency { letter, n } => response.matches(*letter).count() == *n,
            Self::ParagraphCount(n) => {
                let parts: Vec<&str> = response.trim().split("* * *").collect();
                parts.iter().all(|p| !p.trim().is_empty()) && parts.len() == *n
            }
            Self::WordCount { n, quantifier } => {
                let count = response.split_whitespace().count();
                quantifier.holds(count, *n, around(*n))
            }
            Self::SentenceCount { n, quantifier } => {
                quantifier.holds(sentence_count(response), *n, 1)
            }
            Self::Paragraphs {
                n,
                first_word,
                index,
            } => {
                let paragraphs: Vec<&str> = response
                    .trim()
                    .split("\n\n")
                    .filter(|p| !p.trim().is_empty())
                    .collect();
                paragraphs.len() == *n
                    && index
                        .checked_sub(1)
                        .and_then(|i| paragraphs.get(i))
                        .is_some_and(|p| {
                            let first = p.split_whitespace().next().unwrap_or("");
                            let first: String =
                                first.chars().filter(|c| c.is_alphanumeric()).collect();
                            first.to_lowercase() == first_word.to_lowercase()
                        })
            }
            Self::Postscript(marker) => response
                .find(marker.as_str())
                .is_some_and(|i| !response[i + marker.len()..].trim().is_empty()),
            Self::Placeholders(n) => {
                delimited(response, "[", "]")
                    .filter(|s| !s.is_empty())
                    .count()
                    >= *n
            }
            Self::BulletPoints(n) => {
                let bullets = response.lines().filter(|l| {
                    let t = l.trim_start();
                    (t.starts_with('*') && !t.starts_with("**") && !t.starts_with("* * *"))
                        || t.starts_with("- ")
                });
                bullets.count() == *n
            }
            Self::Title => delimited(response, "<<", ">>").any(|t| !t.trim().is_empty()),
            Self::Choice(options) => options.iter().any(|o| response.contains(o.as_str())),
            Self::HighlightedSections(n) => {
                let count = delimited(response, "*", "*")
                    .filter(|s| !s.trim().is_empty() && !s.contains('\n'))
                    .count();
                count >= *n
            }
            Self::Sections { n, splitter } => section_headers(response, splitter) >= *n,
            Self::Json => {
                let t = response.trim();
                let t = t
                    .strip_prefix("```json")
                    .or_else(|| t.strip_prefix("```JSON"))
                    .or_else(|| t.strip_prefix("```"))
                    .map_or(t, |r| r.strip_suffix("```").unwrap_or(r));
                serde_json::from_str::<Value>(t.trim()).is_ok()
            }
            Self::RepeatPrompt(prompt) => response.trim_start().starts_with(prompt.trim()),
            Self::TwoResponses => {
                let parts: Vec<&str> = response.split("******").collect();
                match parts.as_slice() {
                    [a, b] => {
                        let (a, b) = (a.trim(), b.trim());
                        !a.is_empty() && !b.is_empty() && a != b
                    }
                    _ => false,
                }
            }
            Self::Uppercase => {
                response.chars().any(char::is_uppercase) && response == response.to_uppercase()
            }
            Self::Lowercase => {
                response.chars().any(char::is_lowercase) && response == response.to_lowercase()
            }
            Self::CapitalWords { n, quantifier } => {
                let count = words(response)
                    .filter(|w| w.chars().all(|c| c.is_ascii_uppercase()))
                    .count();
                quantifier.holds(count, *n, around(*n))
            }
            Self::EndsWith(phrase) => response.trim_end().ends_with(phrase.trim()),
            Self::Quotation => {
                let t = response.trim();
                t.len() >= 2
                    && t.starts_with('"')
                    && t.ends_with('"')
                    && !t[1..t.len() - 1].trim().is_empty()
            }
            Self::NoCommas => !response.contains(','),
        }
    }
}

fn around(n: usize) -> usize {
    ((n as f64 * 0.1).round() as usize).max(1)
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Runs of word characters (`\w+`).
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !is_word_char(c))
        .filter(|w| !w.is_empty())
}

/// Sentences: runs of text ended by `.`, `!` or `?` followed by whitespace or the end (a
/// trailing fragment without one counts too); `3.5` and `e.g.x` do not end a sentence.
fn sentence_count(text: &str) -> usize {
    let chars: Vec<char> = text.chars().collect();
    let mut count = 0;
    let mut has_content = false;
    for (i, &c) in chars.iter().enumerate() {
        if matches!(c, '.' | '!' | '?') {
            let at_end = chars.get(i + 1).is_none_or(|n| n.is_whitespace());
            if at_end && has_content {
                count += 1;
                has_content = false;
            }
        } else if c.is_alphanumeric() {
            has_content = true;
        }
    }
    count + usize::from(has_content)
}

/// The contents of non-overlapping `open … close` spans, shortest first.
fn delimited<'a>(text: &'a str, open: &'a str, close: &'a str) -> impl Iterator<Item = &'a str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let start = rest.find(open)? + open.len();
        let len = rest[start..].find(close)?;
        let inner = &rest[start..start + len];
        rest = &rest[start + len + close.len()..];
        Some(inner)
    })
}

/// Headers `<splitter> <number>` (case-insensitive), e.g. `SECTION 2`.
fn section_headers(text: &str, splitter: &str) -> usize {
    if splitter.trim().is_empty() {
        return 0;
    }
    let lower = text.to_lowercase();
    let needle = splitter.trim().to_lowercase();
    lower
        .match_indices(&needle)
        .filter(|(i, _)| {
            let after = lower[i + needle.len()..].trim_start();
            after.starts_with(|c: char| c.is_ascii_digit())
        })
        .count()
}
