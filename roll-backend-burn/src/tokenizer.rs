//! `tokenizer.json` through HuggingFace's `tokenizers` crate, with the eos/pad ids of
//! `generation_config.json` and the chat template of `tokenizer_config.json`.

use crate::hf::GenerationConfig;
use crate::{BackendError, ChatTemplate, Result};
use roll_core::tokenizer::ChatMessage;
use std::path::Path;

/// A HuggingFace tokenizer: encode/decode, end-of-sequence and padding ids, chat template.
///
/// Special tokens written in the text (`<|im_start|>`, ...) encode to their ids, and nothing is
/// added around the text (no BOS), matching `tokenizer(text, add_special_tokens=False)`; decoding
/// keeps special tokens, so `decode(encode(s)) == s` for the byte-level BPE of Qwen models.
#[derive(Debug, Clone)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    eos_token_ids: Vec<u32>,
    pad_token_id: Option<u32>,
    chat_template: ChatTemplate,
}

impl HfTokenizer {
    /// Loads `tokenizer.json` of `dir`, eos/pad ids from `generation_config.json` (falling back to
    /// `config.json`, then to `tokenizer_config.json`'s `eos_token`/`pad_token`), and the chat
    /// template from `tokenizer_config.json` (plain ChatML when there is none).
    ///
    /// # Errors
    /// [`BackendError::Io`] if `tokenizer.json` is missing, [`BackendError::Tokenizer`] if it does
    /// not parse, [`BackendError::InvalidJson`] for a malformed config file.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let mut tok = Self::from_file(dir.join("tokenizer.json"))?;
        let generation = GenerationConfig::from_dir(dir)?;
        let tc_path = dir.join("tokenizer_config.json");
        let tc: serde_json::Value = if tc_path.exists() {
            crate::hf::read_json_value(&tc_path)?
        } else {
            serde_json::Value::Null
        };
        let token_id = |key: &str| {
            let v = tc.get(key)?;
            let s = v.as_str().or_else(|| v.get("content")?.as_str())?;
            tok.inner.token_to_id(s)
        };
        tok.eos_token_ids = if generation.eos_token_ids.is_empty() {
            token_id("eos_token").into_iter().collect()
        } else {
            generation.eos_token_ids
        };
        tok.pad_token_id = generation.pad_token_id.or_else(|| token_id("pad_token"));
        tok.chat_template =
            ChatTemplate::from_source(tc.get("chat_template").and_then(|v| v.as_str()));
        Ok(tok)
    }

    /// Loads a bare `tokenizer.json` (no eos/pad ids, plain ChatML).
    ///
    /// # Errors
    /// [`BackendError::Io`] if the file is missing, [`BackendError::Tokenizer`] if it does not
    /// parse.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| BackendError::io(path, e))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| BackendError::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Self {
            inner,
            eos_token_ids: Vec::new(),
            pad_token_id: None,
            chat_template: ChatTemplate::default(),
        })
    }

    /// Every id that ends a generation.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// The padding id, if any.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad_token_id
    }

    /// The chat template.
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat_template
    }

    /// Replaces the chat template.
    pub fn with_chat_template(mut self, template: ChatTemplate) -> Self {
        self.chat_template = template;
        self
    }

    /// Vocabulary size including added (special) tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token string (e.g. `<|im_end|>`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Token ids of `text`.
    ///
    /// # Errors
    /// [`BackendError::Tokenizer`] if the tokenizer fails.
    pub fn encode_ids(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| BackendError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included.
    ///
    /// # Errors
    /// [`BackendError::TokenOutOfVocab`] for an id the tokenizer does not know,
    /// [`BackendError::Tokenizer`] if decoding fails.
    pub fn decode_ids(&self, ids: &[u32]) -> Result<String> {
        if let Some(&id) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(BackendError::TokenOutOfVocab {
                id,
                vocab_size: self.vocab_size(),
            });
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| BackendError::Tokenizer(e.to_string()))
    }
}

impl roll_core::Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> roll_core::Result<Vec<u32>> {
        Ok(self.encode_ids(text)?)
    }

    fn decode(&self, ids: &[u32]) -> roll_core::Result<String> {
        Ok(self.decode_ids(ids)?)
    }

    fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_ids.first().copied()
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token_ids.clone()
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> roll_core::Result<String> {
        Ok(self.chat_template.render(messages, add_generation_prompt)?)
    }
}
