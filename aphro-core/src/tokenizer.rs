//! The text ↔ token-id boundary: HF `tokenizers` with crate errors, and `fastokens` as the
//! encoder where it gives the same ids.
//!
//! `fastokens` is built from `tokenizers`' own serialization of the loaded tokenizer (never
//! from a hub download, nor with the `tokenizer_config.json` additions its own loader
//! merges), and when it is built both encode a probe (every added token in context,
//! whitespace runs, digits, several scripts); a difference turns the fast encoder off for
//! that tokenizer. Decoding, offsets and the vocabulary always come from `tokenizers`.
use crate::error::{Error, Result};
use std::sync::{Arc, OnceLock};

/// Token ids with the character span each covers.
pub type IdsWithOffsets = (Vec<u32>, Vec<(usize, usize)>);

/// The byte budget of the fast encoder's cache of text segments between added tokens: a chat
/// re-sends its history, whose turns the template delimits with added tokens, so every turn
/// but the newest is a hit. A segment larger than 1/64 of the budget (1 MiB here) is never
/// cached. Hits are confirmed against the stored text, so the cache never changes an id.
pub const DEFAULT_SEGMENT_CACHE_BYTES: usize = 64 << 20;

/// Which encoder [`Tokenizer::encode`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncoderBackend {
    /// `fastokens`, which agreed with `tokenizers` on the probe when it was built.
    Fast,
    /// HF `tokenizers`, because `fastokens` could not load this tokenizer or disagreed on the
    /// probe (the reason).
    Tokenizers { reason: String },
}

/// The fast encoder, or why there is none.
type FastEncoder = (Option<Arc<fastokens::Tokenizer>>, EncoderBackend);

/// A loaded tokenizer. Cheap to share behind an `Arc`; encode/decode take `&self`.
///
/// The fast encoder is built on first use (the first encode, or
/// [`Self::encoder_backend`], which the `Renderer` calls when it is built): a role that only
/// decodes (derender, generate) never pays for its tables. Clones share it.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    fast: Arc<OnceLock<FastEncoder>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("encoder", &self.fast.get().map(|(_, b)| b))
            .finish_non_exhaustive()
    }
}

/// Text that exercises what tends to differ between BPE implementations: whitespace runs
/// and newlines, digit groups, contractions, accents, CJK, emoji, and every added token
/// (up to 256) inside words, after spaces and between newlines.
fn probe_text(inner: &tokenizers::Tokenizer) -> String {
    let mut text = String::from(
        "Hello, world!  It's   a test\n\n\tindented\r\nline 12345 + 6.78e-9 = x;\n\
         naïve café Ünïcödé — “quotes” 日本語のテキスト 中文 한국어 Ελληνικά русский \
         emoji 🚀👩‍💻 ZWJ\u{200d}  trailing   \n   \n",
    );
    let mut added: Vec<(u32, String)> = inner
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, t)| (id, t.content))
        .collect();
    added.sort();
    for (_, content) in added.into_iter().take(256) {
        text.push_str(&format!("a{content}b {content} \n{content}\n x "));
    }
    text
}

/// `fastokens` from `tokenizers`' own serialization of the tokenizer, if it loads and agrees
/// on the probe.
fn fast_encoder(inner: &tokenizers::Tokenizer) -> FastEncoder {
    let fallback = |reason: String| (None, EncoderBackend::Tokenizers { reason });
    let value: serde_json::Value = match inner
        .to_string(false)
        .map_err(|e| e.to_string())
        .and_then(|json| serde_json::from_str(&json).map_err(|e| e.to_string()))
    {
        Ok(v) => v,
        Err(e) => return fallback(format!("the tokenizer does not serialize: {e}")),
    };
    let mut fast = match fastokens::Tokenizer::from_json(value) {
        Ok(f) => f,
        Err(e) => return fallback(format!("fastokens cannot load it: {e}")),
    };
    let probe = probe_text(inner);
    for add_special_tokens in [false, true] {
        let reference = inner
            .encode_fast(probe.as_str(), add_special_tokens)
            .map(|e| e.get_ids().to_vec());
        let got = fast.encode_with_special_tokens(&probe, add_special_tokens);
        match (reference, got) {
            (Ok(r), Ok(g)) if r == g => {}
            (Ok(r), Ok(g)) => {
                let at = r.iter().zip(&g).position(|(a, b)| a != b);
                return fallback(format!(
                    "fastokens disagrees on the probe (add_special_tokens={add_special_tokens}: \
                     {} vs {} ids, first difference at {at:?})",
                    g.len(),
                    r.len()
                ));
            }
            (_, Err(e)) => return fallback(format!("fastokens fails on the probe: {e}")),
            (Err(e), _) => return fallback(format!("tokenizers fails on the probe: {e}")),
        }
    }
    fast.enable_segment_cache(DEFAULT_SEGMENT_CACHE_BYTES);
    (Some(Arc::new(fast)), EncoderBackend::Fast)
}

impl Tokenizer {
    /// Wraps a `tokenizers` object; the fast encoder is built from its serialization.
    pub fn from_hf(inner: tokenizers::Tokenizer) -> Self {
        Self {
            inner,
            fast: Arc::new(OnceLock::new()),
        }
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

    fn fast(&self) -> &FastEncoder {
        self.fast.get_or_init(|| fast_encoder(&self.inner))
    }

    /// Which encoder [`Self::encode`] runs, and why not the fast one (builds the fast one if
    /// it is not built yet).
    pub fn encoder_backend(&self) -> &EncoderBackend {
        &self.fast().1
    }

    /// `tokenizers`' encoding, whatever [`Self::encode`] uses: the reference the fast
    /// encoder is held to.
    pub fn encode_reference(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The underlying `tokenizers` object (for the detokenizer's `DecodeStream`).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Encodes like `tokenizer(text, add_special_tokens=…)`: special-token strings in `text`
    /// become their ids, as the reference does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        match &self.fast().0 {
            Some(fast) => fast
                .encode_with_special_tokens(text, add_special_tokens)
                .map_err(|e| Error::Tokenizer(e.to_string())),
            None => self.encode_reference(text, add_special_tokens),
        }
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
