//! The text ↔ token-id boundary: a thin wrapper over HF `tokenizers` with crate errors.
use crate::error::{Error, Result};

/// Token ids with the character span each covers.
pub type IdsWithOffsets = (Vec<u32>, Vec<(usize, usize)>);

/// A loaded tokenizer. Cheap to share behind an `Arc`; encode/decode take `&self`.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    pub fn from_hf(inner: tokenizers::Tokenizer) -> Self {
        Self { inner }
    }

    /// Loads a `tokenizer.json`.
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        tokenizers::Tokenizer::from_file(path)
            .map(Self::from_hf)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))
    }

    /// Parses `tokenizer.json` text.
    pub fn from_json_str(json: &str) -> Result<Self> {
        json.parse::<tokenizers::Tokenizer>()
            .map(Self::from_hf)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The underlying `tokenizers` object (for the detokenizer's `DecodeStream`).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Encodes like `tokenizer(text, add_special_tokens=…)`: special-token strings in `text`
    /// become their ids, as the reference does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Encodes and returns `(ids, char offsets)` for `return_token_offsets`.
    pub fn encode_with_offsets(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<IdsWithOffsets> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|e| (e.get_ids().to_vec(), e.get_offsets().to_vec()))
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
