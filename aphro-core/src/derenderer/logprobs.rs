//! Generate logprobs (token ids, §2.4) → chat and completion shapes.
use crate::detokenizer::{token_bytes_with, token_text, TokenByteEncoding};
use crate::protocol::{
    ChatLogProb, ChatTopLogProb, CompletionLogProbs, GenerateLogProb, GenerateTopLogProb,
};
use serde_json::{Map, Value};
use tokenizers::Tokenizer;

/// How token strings are shown.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenShow<'a> {
    pub tokenizer: &'a Tokenizer,
    pub encoding: TokenByteEncoding,
    /// `return_tokens_as_token_ids`: `"token_id:<N>"`.
    pub as_ids: bool,
}

impl TokenShow<'_> {
    pub fn text(&self, id: u32) -> String {
        if self.as_ids {
            format!("token_id:{id}")
        } else {
            token_text(self.tokenizer, id)
        }
    }

    /// `bytes` of a logprob entry: the token's own bytes (exact for partial characters), the
    /// placeholder's bytes in token-id mode.
    pub fn bytes(&self, id: u32, text: &str) -> Option<Vec<u8>> {
        if self.as_ids {
            return Some(text.as_bytes().to_vec());
        }
        Some(
            token_bytes_with(self.tokenizer, self.encoding, id)
                .unwrap_or_else(|| text.as_bytes().to_vec()),
        )
    }
}

/// `-inf`/NaN → -9999.0, as vLLM clamps.
pub(crate) fn clamp(lp: f64) -> f64 {
    if lp.is_nan() {
        -9999.0
    } else {
        lp.max(-9999.0)
    }
}

/// Candidates deduplicated by id (first occurrence wins, as the dict vLLM rebuilds does).
fn dedup(top: &[GenerateTopLogProb]) -> Vec<&GenerateTopLogProb> {
    let mut out: Vec<&GenerateTopLogProb> = Vec::with_capacity(top.len());
    for t in top {
        if !out.iter().any(|o| o.token_id == t.token_id) {
            out.push(t);
        }
    }
    out
}

/// One chat entry; `k` = the request's `top_logprobs` (`-1` = all, `0`/none = no candidates).
pub(crate) fn chat_entry(show: &TokenShow<'_>, e: &GenerateLogProb, k: i64) -> ChatLogProb {
    let token = show.text(e.token_id);
    let bytes = show.bytes(e.token_id, &token);
    let top = dedup(&e.top_logprobs);
    let take = if k < 0 {
        top.len()
    } else {
        usize::try_from(k).unwrap_or(usize::MAX).min(top.len())
    };
    let top_logprobs = top[..take]
        .iter()
        .map(|t| {
            let token = show.text(t.token_id);
            ChatTopLogProb {
                bytes: show.bytes(t.token_id, &token),
                token,
                logprob: clamp(t.logprob),
            }
        })
        .collect();
    ChatLogProb {
        token,
        logprob: clamp(e.logprob),
        bytes,
        top_logprobs,
    }
}

/// Appends completion-shaped entries; `text_offset` runs from `*offset` (in characters, as
/// Python's `len`). `k` = the request's `logprobs` (candidates with rank ≤ k, plus the
/// sampled token).
pub(crate) fn completion_entries(
    show: &TokenShow<'_>,
    entries: &[GenerateLogProb],
    k: i64,
    offset: &mut u64,
    out: &mut CompletionLogProbs,
) {
    for e in entries {
        let token = show.text(e.token_id);
        out.text_offset.push(*offset);
        *offset = offset.saturating_add(token.chars().count() as u64);
        out.token_logprobs.push(Some(clamp(e.logprob)));
        let mut m = Map::new();
        for (i, t) in dedup(&e.top_logprobs).into_iter().enumerate() {
            let sampled = i == 0 && t.token_id == e.token_id;
            let in_k = k < 0 || t.rank.is_some_and(|r| r >= 1 && r <= k);
            if sampled || in_k {
                m.entry(show.text(t.token_id))
                    .or_insert_with(|| Value::from(clamp(t.logprob)));
            }
        }
        if m.is_empty() {
            m.insert(token.clone(), Value::from(clamp(e.logprob)));
        }
        out.tokens.push(token);
        out.top_logprobs.push(Some(m));
    }
}
