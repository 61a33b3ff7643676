//! Chat templates: Qwen's ChatML, as the Jinja templates of Qwen2, Qwen2.5 and Qwen3 render it.

use crate::{BackendError, Result};
use roll_core::tokenizer::{ChatMessage, Role};

/// The default system prompt of Qwen2.5's template.
const QWEN25_SYSTEM: &str = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
/// The default system prompt of Qwen2's template.
const QWEN2_SYSTEM: &str = "You are a helpful assistant.";

/// A chat template this crate can render without a Jinja engine.
///
/// ChatML writes each message as `<|im_start|>{role}\n{content}<|im_end|>\n`; the generation
/// prompt is `<|im_start|>assistant\n`. Qwen2 and Qwen2.5 templates insert a default system
/// message when the conversation has none; Qwen2.5 and Qwen3 wrap tool results in a user turn
/// (`<tool_response>` blocks). [`ChatTemplate::from_source`] recognises these from the Jinja
/// source in `tokenizer_config.json`; other templates are kept and fail at render time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatTemplate {
    /// ChatML.
    ChatMl {
        /// System message inserted when the first message is not a system message.
        default_system: Option<String>,
        /// Tool results go into a user turn as `<tool_response>` blocks (Qwen2.5/Qwen3) instead
        /// of a `tool` turn.
        tool_response_blocks: bool,
    },
    /// No template: the message texts concatenated in order, for base models trained on raw
    /// text (`Q: 12+35=? A:`). The generation prompt adds nothing.
    Plain,
    /// A template that is not ChatML (its Jinja source).
    Unsupported(String),
}

impl Default for ChatTemplate {
    /// Plain ChatML: no default system message, `tool` turns.
    fn default() -> Self {
        Self::ChatMl {
            default_system: None,
            tool_response_blocks: false,
        }
    }
}

impl ChatTemplate {
    /// Recognises the Jinja `chat_template` of `tokenizer_config.json`; `None` (no template, as
    /// in small test tokenizers) gives plain ChatML.
    pub fn from_source(source: Option<&str>) -> Self {
        let Some(src) = source else {
            return Self::default();
        };
        if !src.contains("<|im_start|>") {
            return Self::Unsupported(src.to_string());
        }
        let default_system = if src.contains(QWEN25_SYSTEM) {
            Some(QWEN25_SYSTEM.to_string())
        } else if src.contains(QWEN2_SYSTEM) {
            Some(QWEN2_SYSTEM.to_string())
        } else {
            None
        };
        Self::ChatMl {
            default_system,
            tool_response_blocks: src.contains("<tool_response>"),
        }
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's reply
    /// begins.
    ///
    /// # Errors
    /// [`BackendError::UnsupportedChatTemplate`] for a template that is not ChatML.
    ///
    /// # Example
    /// ```
    /// use roll_backend_burn::ChatTemplate;
    /// use roll_core::tokenizer::{ChatMessage, Role};
    /// let text = ChatTemplate::default()
    ///     .render(&[ChatMessage::new(Role::User, "2+2?")], true)
    ///     .unwrap();
    /// assert_eq!(text, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
    /// ```
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let (default_system, tool_blocks) = match self {
            Self::ChatMl {
                default_system,
                tool_response_blocks,
            } => (default_system, *tool_response_blocks),
            Self::Plain => return Ok(messages.iter().map(|m| m.content.as_str()).collect()),
            Self::Unsupported(src) => {
                let head: String = src.chars().take(80).collect();
                return Err(BackendError::UnsupportedChatTemplate(head));
            }
        };
        let mut out = String::new();
        if let Some(system) = default_system
            && messages.first().map(|m| m.role) != Some(Role::System)
        {
            push_turn(&mut out, "system", system);
        }
        let mut i = 0;
        while i < messages.len() {
            let m = &messages[i];
            if m.role == Role::Tool && tool_blocks {
                out.push_str("<|im_start|>user");
                while i < messages.len() && messages[i].role == Role::Tool {
                    out.push_str("\n<tool_response>\n");
                    out.push_str(&messages[i].content);
                    out.push_str("\n</tool_response>");
                    i += 1;
                }
                out.push_str("<|im_end|>\n");
                continue;
            }
            push_turn(&mut out, role_name(m.role), &m.content);
            i += 1;
        }
        if add_generation_prompt {
            out.push_str("<|im_start|>assistant\n");
        }
        Ok(out)
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn push_turn(out: &mut String, role: &str, content: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(content);
    out.push_str("<|im_end|>\n");
}
