//! Text ↔ token ids, and chat templates.

use crate::Result;
use serde::{Deserialize, Serialize};

/// Who speaks a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions that frame the conversation.
    System,
    /// The user (or an environment speaking as the user).
    User,
    /// The model.
    Assistant,
    /// The output of a tool call.
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// The speaker.
    pub role: Role,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }
}

/// Encodes and decodes text for one model, and renders conversations with its chat template.
///
/// Pipelines work in token ids (log-probs and loss masks are per token), so every text that reaches
/// a [`Policy`](crate::Policy) goes through one of these. A backend implements it from its
/// `tokenizer.json`; `roll_core::testing` (feature `testing`) has a byte-level one.
///
/// # Example
/// ```
/// use roll_core::tokenizer::{ChatMessage, Role, Tokenizer};
///
/// /// One token per byte; no chat template beyond "role: content" lines.
/// struct Bytes;
/// impl Tokenizer for Bytes {
///     fn encode(&self, text: &str) -> roll_core::Result<Vec<u32>> {
///         Ok(text.bytes().map(u32::from).collect())
///     }
///     fn decode(&self, ids: &[u32]) -> roll_core::Result<String> {
///         Ok(ids.iter().map(|&i| char::from(i as u8)).collect())
///     }
///     fn eos_token_id(&self) -> Option<u32> { None }
///     fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> roll_core::Result<String> {
///         let mut s: String = messages.iter().map(|m| format!("{:?}: {}\n", m.role, m.content)).collect();
///         if add_generation_prompt { s.push_str("Assistant: "); }
///         Ok(s)
///     }
/// }
/// let ids = Bytes.encode("hi").unwrap();
/// assert_eq!(Bytes.decode(&ids).unwrap(), "hi");
/// ```
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text` (no special tokens added).
    ///
    /// # Errors
    /// If the text cannot be encoded.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;

    /// Text of `ids`.
    ///
    /// # Errors
    /// If an id is outside the vocabulary.
    fn decode(&self, ids: &[u32]) -> Result<String>;

    /// The end-of-sequence token, if the model has one.
    fn eos_token_id(&self) -> Option<u32>;

    /// Every id that ends a generation (some models have several, e.g. Qwen's `<|im_end|>` and
    /// `<|endoftext|>`); an inference engine stops on each. Default: [`Self::eos_token_id`].
    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token_id().into_iter().collect()
    }

    /// Renders a conversation with the model's chat template; with `add_generation_prompt` the text
    /// ends where the assistant's next message begins.
    ///
    /// # Errors
    /// If the template cannot render the messages.
    fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String>;
}

/// The token ids of a single-turn prompt: the optional system message and the user message
/// rendered by the tokenizer's chat template with the generation prompt, then encoded. RLVR
/// rollouts, supervised fine-tuning and evaluation all encode prompts here — as the first turn of
/// a [`Transcript`](crate::episode::Transcript), which episodes continue — so a model is trained
/// and evaluated on exactly the ids it generates from.
///
/// # Errors
/// If the template cannot render the messages or the text cannot be encoded.
pub fn encode_prompt(
    tokenizer: &dyn Tokenizer,
    system: Option<&str>,
    user: &str,
) -> Result<Vec<u32>> {
    crate::episode::Transcript::start(tokenizer, system, user).map(|(_, ids)| ids)
}
