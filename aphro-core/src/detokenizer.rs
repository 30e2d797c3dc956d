//! Incremental (streaming) detokenization and per-token byte/text helpers.
//!
//! [`IncrementalDetokenizer`] turns a stream of generated token ids into text
//! deltas. It reproduces, step for step, the reference used by vLLM's fast
//! detokenizer: `tokenizers.decoders.DecodeStream` (prefix/read-offset window),
//! plus vLLM's `spaces_between_special_tokens=False` handling. Properties:
//!
//! * never emits a partial UTF-8 character and never emits U+FFFD for a
//!   character that later completes (text is held back while the window's
//!   decode ends with U+FFFD);
//! * never duplicates or drops text: the concatenation of all deltas plus
//!   [`IncrementalDetokenizer::finish`] is the batch decode of the ids;
//! * keeps the leading space of the first generated token when primed with
//!   prompt ids (SentencePiece `Strip` decoders drop it otherwise);
//! * O(1) amortized per token: only a small window of ids is decoded per step
//!   (ids since the previous emission point, plus the ones not yet emitted; the
//!   latter is capped at [`MAX_PENDING_IDS`]).
//!
//! The whole state is [`DetokenizerState`] (serde): a window of ids and an
//! offset, so a stateless streaming server can hand it to the client and
//! resume exactly where it stopped.
//!
//! Token bytes for logprobs come from the token itself, not from decoded text:
//! see [`token_bytes`].

use std::borrow::Borrow;

use serde::{Deserialize, Serialize};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::Tokenizer;

const REPLACEMENT: char = '\u{FFFD}';

/// Ids that may stay un-emitted in the window before the detokenizer forces
/// the window forward. A UTF-8 character spans at most 4 byte tokens, so
/// reaching this bound means the pending ids are skipped special tokens,
/// empty tokens or genuinely invalid bytes; forcing then emits the (final)
/// U+FFFD text and keeps the per-token cost bounded. The reference
/// (`DecodeStream`) has no such bound and would re-decode an ever-growing
/// window.
pub const MAX_PENDING_IDS: usize = 32;

/// Largest window a deserialized state may carry (client-carried state is
/// untrusted; a legitimate window never comes close).
pub const MAX_WINDOW_IDS: usize = 4 * MAX_PENDING_IDS + 64;

/// How many trailing prompt ids [`IncrementalDetokenizer::seeded`] looks at.
pub const MAX_SEED_IDS: usize = 24;

/// Decoding options, as in vLLM's `SamplingParams`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetokenizeOptions {
    /// Drop special (added, `special: true`) tokens from the text.
    pub skip_special_tokens: bool,
    /// vLLM: when false (and not skipping), a special token that directly
    /// follows another added token is emitted as its raw content.
    pub spaces_between_special_tokens: bool,
}

impl Default for DetokenizeOptions {
    /// vLLM defaults: skip special tokens, spaces between them.
    fn default() -> Self {
        Self {
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
        }
    }
}

impl DetokenizeOptions {
    /// Options with the given `skip_special_tokens` and default spacing.
    pub fn skip_special(skip_special_tokens: bool) -> Self {
        Self {
            skip_special_tokens,
            spaces_between_special_tokens: true,
        }
    }
}

/// The complete, serializable state of an [`IncrementalDetokenizer`].
///
/// JSON form: `{"ids":[…],"read_offset":n,"skip_special_tokens":b,
/// "spaces_between_special_tokens":b,"last_special":b}`.
///
/// `ids` is the window: `ids[..read_offset]` is context whose text has already
/// been emitted (or is prompt text), `ids[read_offset..]` are ids whose text
/// is still held back. In vLLM's `DerenderStreamState` terms the window starts
/// at `prefix_offset` and `read_offset` is relative to it. The window holds at
/// most a few dozen ids regardless of how long the generation is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DetokenizerState {
    pub ids: Vec<u32>,
    pub read_offset: usize,
    pub skip_special_tokens: bool,
    #[serde(default = "default_true")]
    pub spaces_between_special_tokens: bool,
    /// Whether the previous id was an added token (only used when
    /// `spaces_between_special_tokens` is false).
    #[serde(default)]
    pub last_special: bool,
}

fn default_true() -> bool {
    true
}

/// A deserialized [`DetokenizerState`] that cannot be resumed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DetokenizerStateError {
    #[error("detokenizer state: read_offset {read_offset} is beyond the window of {len} ids")]
    ReadOffsetOutOfRange { read_offset: usize, len: usize },
    #[error("detokenizer state: window of {len} ids exceeds the limit of {max}")]
    WindowTooLong { len: usize, max: usize },
}

impl DetokenizerState {
    /// Checks a state that came from outside (e.g. client-carried).
    pub fn validate(&self) -> Result<(), DetokenizerStateError> {
        if self.ids.len() > MAX_WINDOW_IDS {
            return Err(DetokenizerStateError::WindowTooLong {
                len: self.ids.len(),
                max: MAX_WINDOW_IDS,
            });
        }
        if self.read_offset > self.ids.len() {
            return Err(DetokenizerStateError::ReadOffsetOutOfRange {
                read_offset: self.read_offset,
                len: self.ids.len(),
            });
        }
        Ok(())
    }

    fn options(&self) -> DetokenizeOptions {
        DetokenizeOptions {
            skip_special_tokens: self.skip_special_tokens,
            spaces_between_special_tokens: self.spaces_between_special_tokens,
        }
    }
}

/// Streaming detokenizer over a borrowed (`&Tokenizer`) or shared
/// (`Arc<Tokenizer>`) tokenizer.
#[derive(Clone, Debug)]
pub struct IncrementalDetokenizer<T: Borrow<Tokenizer>> {
    tokenizer: T,
    state: DetokenizerState,
    /// Cache of `decode(ids[..read_offset])` (not serialized; recomputed).
    prefix: String,
}

impl<T: Borrow<Tokenizer>> IncrementalDetokenizer<T> {
    /// An unprimed detokenizer: the first token is decoded as the start of a
    /// text (SentencePiece `Strip` decoders drop its leading space).
    pub fn new(tokenizer: T, options: DetokenizeOptions) -> Self {
        Self::with_prefix(tokenizer, &[], options)
    }

    /// Primed with `prefix_ids` exactly like
    /// `tokenizers.decoders.DecodeStream(ids=prefix_ids)`: their text is
    /// never emitted, it only provides context (e.g. the leading space of the
    /// first generated SentencePiece token). Pass a short suffix of the prompt.
    ///
    /// The prompt ids are marked read at once (the reference does so on the
    /// first step, unless their text ends in an incomplete character, in which
    /// case it would later emit the prompt text; here it never does).
    pub fn with_prefix(tokenizer: T, prefix_ids: &[u32], options: DetokenizeOptions) -> Self {
        let prefix = decode(tokenizer.borrow(), prefix_ids, options.skip_special_tokens);
        Self {
            tokenizer,
            state: DetokenizerState {
                ids: prefix_ids.to_vec(),
                read_offset: prefix_ids.len(),
                skip_special_tokens: options.skip_special_tokens,
                spaces_between_special_tokens: options.spaces_between_special_tokens,
                last_special: false,
            },
            prefix,
        }
    }

    /// Primed from a whole prompt the way vLLM's fast detokenizer picks its
    /// seed: the shortest suffix of 4..24 ids whose decode has no U+FFFD
    /// (prompts of at most 4 ids are used whole; if no suffix is clean, the
    /// last [`MAX_SEED_IDS`] ids).
    pub fn seeded(tokenizer: T, prompt_ids: &[u32], options: DetokenizeOptions) -> Self {
        let seed = seed_suffix(tokenizer.borrow(), prompt_ids);
        Self::with_prefix(tokenizer, seed, options)
    }

    /// Resumes from a state produced by [`Self::state`] (e.g. carried by a
    /// client between stateless calls). Costs one decode of the window.
    pub fn from_state(
        tokenizer: T,
        state: DetokenizerState,
    ) -> Result<Self, DetokenizerStateError> {
        state.validate()?;
        let prefix = decode(
            tokenizer.borrow(),
            state.ids.get(..state.read_offset).unwrap_or(&[]),
            state.skip_special_tokens,
        );
        Ok(Self {
            tokenizer,
            state,
            prefix,
        })
    }

    /// The serializable state.
    pub fn state(&self) -> &DetokenizerState {
        &self.state
    }

    /// Consumes the detokenizer, returning its state.
    pub fn into_state(self) -> DetokenizerState {
        self.state
    }

    pub fn options(&self) -> DetokenizeOptions {
        self.state.options()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.tokenizer.borrow()
    }

    /// Feeds one id; returns the text it completes, or `None` while text is
    /// held back (incomplete UTF-8, a skipped special token, a SentencePiece
    /// leading space at the very start).
    pub fn push(&mut self, id: u32) -> Option<String> {
        let out = self.step(id);
        let opts = self.state.options();
        if opts.skip_special_tokens || opts.spaces_between_special_tokens {
            return out;
        }
        // vLLM FastIncrementalDetokenizer.decode_next: consecutive added
        // tokens are returned as their raw content, without the decoder's
        // spacing.
        let tok: &Tokenizer = self.tokenizer.borrow();
        let added = tok.get_added_vocabulary().simple_id_to_token(id);
        let result = match (&added, self.state.last_special) {
            (Some(content), true) => Some(content.clone()),
            _ => out,
        };
        self.state.last_special = added.is_some();
        result.filter(|s| !s.is_empty())
    }

    /// Feeds several ids; returns the concatenated deltas.
    pub fn push_many(&mut self, ids: &[u32]) -> String {
        let mut out = String::new();
        for &id in ids {
            if let Some(s) = self.push(id) {
                out.push_str(&s);
            }
        }
        out
    }

    /// End of generation: returns the held-back tail (e.g. U+FFFD for a
    /// truncated multi-byte character) so that all deltas plus this equal the
    /// batch decode. The detokenizer can continue afterwards.
    pub fn finish(&mut self) -> String {
        let st = &mut self.state;
        if st.read_offset >= st.ids.len() {
            return String::new();
        }
        let tok: &Tokenizer = self.tokenizer.borrow();
        let string = decode(tok, &st.ids, st.skip_special_tokens);
        let new_text = match string.strip_prefix(self.prefix.as_str()) {
            Some(rest) => rest.to_owned(),
            None => String::new(),
        };
        let drain_to = st.read_offset;
        st.ids.drain(..drain_to);
        self.prefix = decode(tok, &st.ids, st.skip_special_tokens);
        st.read_offset = st.ids.len();
        new_text
    }

    /// `tokenizers::step_decode_stream`, with a bound on pending ids and
    /// vLLM's recovery from a non-monotonic decode.
    fn step(&mut self, id: u32) -> Option<String> {
        let tok: &Tokenizer = self.tokenizer.borrow();
        let st = &mut self.state;
        let skip = st.skip_special_tokens;
        // The reference's prefill rule: while the prefix text is empty, all
        // ids so far become the prefix unless they end in an incomplete
        // character (matters when the window decodes to "", e.g. skipped
        // specials or a stripped SentencePiece space).
        if self.prefix.is_empty() && !st.ids.is_empty() {
            let p = decode(tok, &st.ids, skip);
            if !p.ends_with(REPLACEMENT) {
                self.prefix = p;
                st.read_offset = st.ids.len();
            }
            // A long run of ids decoding to "" (e.g. skipped specials) would
            // grow the context forever; keep only its tail.
            if st.read_offset > MAX_PENDING_IDS {
                let drop = st.read_offset - MAX_PENDING_IDS;
                st.ids.drain(..drop);
                st.read_offset -= drop;
                self.prefix = decode(tok, &st.ids[..st.read_offset], skip);
            }
        }
        st.ids.push(id);
        let string = decode(tok, &st.ids, skip);
        let grew = string.len() > self.prefix.len() && !string.ends_with(REPLACEMENT);
        if grew && !string.starts_with(self.prefix.as_str()) {
            // The decoder produced a text that does not extend what was
            // already emitted (vLLM issue 17448). vLLM resets the stream and
            // decodes the id on its own; do the same.
            st.ids.clear();
            st.read_offset = 0;
            self.prefix.clear();
            st.ids.push(id);
            let s = decode(tok, &st.ids, skip);
            if s.is_empty() || s.ends_with(REPLACEMENT) {
                return None;
            }
            self.prefix = s.clone();
            st.read_offset = st.ids.len();
            return Some(s);
        }
        let pending = st.ids.len() - st.read_offset;
        if !grew && pending < MAX_PENDING_IDS {
            return None;
        }
        // Emit `string - prefix` and slide the window: drop the old context,
        // the ids read so far become the new context.
        let new_text = string
            .get(self.prefix.len()..)
            .filter(|_| string.starts_with(self.prefix.as_str()))
            .unwrap_or("")
            .to_owned();
        let drain_to = st.read_offset;
        st.ids.drain(..drain_to);
        self.prefix = decode(tok, &st.ids, skip);
        st.read_offset = st.ids.len();
        if new_text.is_empty() {
            None
        } else {
            Some(new_text)
        }
    }
}

/// vLLM's choice of prompt ids to prime the stream with.
pub fn seed_suffix<'a>(tokenizer: &Tokenizer, prompt_ids: &'a [u32]) -> &'a [u32] {
    let n = prompt_ids.len();
    if n <= 4 {
        return prompt_ids;
    }
    for i in 4..=n.min(MAX_SEED_IDS - 1) {
        let suffix = &prompt_ids[n - i..];
        if !decode(tokenizer, suffix, false).contains(REPLACEMENT) {
            return suffix;
        }
    }
    &prompt_ids[n - n.min(MAX_SEED_IDS)..]
}

/// Batch decode that never fails (a decoder error yields an empty string;
/// unknown ids are ignored, as `tokenizers` does).
pub fn decode(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> String {
    tokenizer
        .decode(ids, skip_special_tokens)
        .unwrap_or_default()
}

/// How a tokenizer's vocabulary strings map to bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenByteEncoding {
    /// GPT-2 byte-level alphabet (Llama 3, Qwen, DeepSeek, GLM, gpt-oss, SmolLM).
    ByteLevel,
    /// SentencePiece style: `▁` is a space, `<0xAB>` is a raw byte
    /// (Mistral / Llama 2, Gemma).
    SentencePiece,
    /// Token strings are the text.
    Plain,
}

/// Detects the byte encoding from the tokenizer's decoder.
pub fn token_byte_encoding(tokenizer: &Tokenizer) -> TokenByteEncoding {
    fn walk(d: &DecoderWrapper) -> Option<TokenByteEncoding> {
        match d {
            DecoderWrapper::ByteLevel(_) => Some(TokenByteEncoding::ByteLevel),
            DecoderWrapper::Metaspace(_)
            | DecoderWrapper::ByteFallback(_)
            | DecoderWrapper::Replace(_) => Some(TokenByteEncoding::SentencePiece),
            DecoderWrapper::Sequence(seq) => {
                let found: Vec<_> = seq.get_decoders().iter().filter_map(walk).collect();
                if found.contains(&TokenByteEncoding::ByteLevel) {
                    Some(TokenByteEncoding::ByteLevel)
                } else {
                    found.first().copied()
                }
            }
            _ => None,
        }
    }
    tokenizer
        .get_decoder()
        .and_then(walk)
        .unwrap_or(TokenByteEncoding::Plain)
}

/// The vocabulary string of a token (`id_to_token`, e.g. `"Ġworld"`,
/// `"▁world"`, `"<0xF0>"`, `"<|im_end|>"`), for display and debugging.
pub fn token_string(tokenizer: &Tokenizer, id: u32) -> Option<String> {
    tokenizer.id_to_token(id)
}

/// The text of one token decoded on its own (`decode([id])`, specials kept),
/// which is what vLLM shows as a logprob entry's `token`.
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    decode(tokenizer, &[id], false)
}

/// The raw bytes a token stands for, for logprob `bytes`: byte-level tokens
/// are mapped back through the GPT-2 alphabet, SentencePiece `<0xAB>` byte
/// tokens give that byte and `▁` gives a space; added tokens give the UTF-8
/// of their content. `None` for an id outside the vocabulary.
///
/// Unlike the UTF-8 of the decoded text, this is exact for tokens that hold
/// part of a multi-byte character.
pub fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Option<Vec<u8>> {
    token_bytes_with(tokenizer, token_byte_encoding(tokenizer), id)
}

/// [`token_bytes`] with the encoding computed once by the caller.
pub fn token_bytes_with(
    tokenizer: &Tokenizer,
    encoding: TokenByteEncoding,
    id: u32,
) -> Option<Vec<u8>> {
    if let Some(content) = tokenizer.get_added_vocabulary().simple_id_to_token(id) {
        return Some(content.into_bytes());
    }
    let token = tokenizer.id_to_token(id)?;
    Some(match encoding {
        TokenByteEncoding::ByteLevel => {
            let mut out = Vec::with_capacity(token.len());
            for c in token.chars() {
                match byte_level_char_to_byte(c) {
                    Some(b) => out.push(b),
                    None => {
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
            out
        }
        TokenByteEncoding::SentencePiece => match parse_byte_token(&token) {
            Some(b) => vec![b],
            None => token.replace('\u{2581}', " ").into_bytes(),
        },
        TokenByteEncoding::Plain => token.into_bytes(),
    })
}

/// `<0xAB>` → `0xAB`.
fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Inverse of GPT-2's `bytes_to_unicode`: printable Latin-1 bytes map to
/// themselves, the other 68 bytes (0..=32, 127..=160, 173) in order to
/// U+0100..=U+0143.
pub fn byte_level_char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    match u {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => u8::try_from(u).ok(),
        0x100..=0x143 => {
            let n = u - 0x100;
            let b = if n < 33 {
                n
            } else if n < 67 {
                127 + (n - 33)
            } else {
                173
            };
            u8::try_from(b).ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
