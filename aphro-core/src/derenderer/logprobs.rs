//! Generate logprobs (token ids, `api.md` §2.4) → chat and completion shapes.
use crate::detokenizer::{decode, token_bytes_with, token_text, TokenByteEncoding};
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

    /// `bytes` of a logprob entry: the token's own bytes, the placeholder's bytes in token-id
    /// mode.
    pub fn bytes(&self, id: u32, text: &str) -> Option<Vec<u8>> {
        if self.as_ids {
            return Some(text.as_bytes().to_vec());
        }
        Some(
            token_bytes_with(self.tokenizer, self.encoding, id)
                .unwrap_or_else(|| text.as_bytes().to_vec()),
        )
    }

    /// `token` and `bytes` of a token at a position preceded by the sampled ids `ctx` (§2.4):
    /// a token whose text ends in U+FFFD (part of a multi-byte character) is decoded again with
    /// up to [`CONTEXT`] preceding sampled ids, as vLLM's `_correct_decoded_token` does, and
    /// its `bytes` are then the UTF-8 of the repaired text.
    pub fn resolve(&self, id: u32, ctx: &[u32]) -> (String, Option<Vec<u8>>) {
        let text = self.text(id);
        if self.as_ids || !text.ends_with('\u{FFFD}') {
            let bytes = self.bytes(id, &text);
            return (text, bytes);
        }
        let fixed = self.correct(id, ctx);
        let bytes = Some(fixed.as_bytes().to_vec());
        (fixed, bytes)
    }

    /// The text `id` adds after the shortest tail of `ctx` with which it decodes cleanly; `""`
    /// when none does.
    fn correct(&self, id: u32, ctx: &[u32]) -> String {
        let dec = |ids: &[u32]| decode(self.tokenizer, ids, false);
        for n in 1..=ctx.len().min(CONTEXT) {
            let context = &ctx[ctx.len() - n..];
            let mut ids = context.to_vec();
            ids.push(id);
            let full = dec(&ids);
            if full.ends_with('\u{FFFD}') {
                continue;
            }
            // Context tokens that are themselves partial characters belong to this token's text.
            let mut clean_end = context.len();
            for j in (0..context.len()).rev() {
                if token_text(self.tokenizer, context[j]).ends_with('\u{FFFD}') {
                    clean_end = j;
                } else {
                    break;
                }
            }
            let prefix = if clean_end > 0 {
                dec(&context[..clean_end])
            } else {
                String::new()
            };
            if let Some(rest) = full.strip_prefix(prefix.as_str()) {
                return rest.to_owned();
            }
            let common = full
                .chars()
                .zip(prefix.chars())
                .take_while(|(a, b)| a == b)
                .count();
            return full.chars().skip(common).collect();
        }
        String::new()
    }
}

/// Preceding sampled ids kept as logprob repair context (vLLM's window).
pub(crate) const CONTEXT: usize = 4;

/// Appends a sampled id to the repair context, keeping its last [`CONTEXT`] ids.
pub(crate) fn advance(ctx: &mut Vec<u32>, ids: &[u32]) {
    ctx.extend_from_slice(ids);
    let drop = ctx.len().saturating_sub(CONTEXT);
    ctx.drain(..drop);
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
/// `ctx`: the sampled ids before this position (repair context), advanced past it.
pub(crate) fn chat_entry(
    show: &TokenShow<'_>,
    e: &GenerateLogProb,
    k: i64,
    ctx: &mut Vec<u32>,
) -> ChatLogProb {
    let (token, bytes) = show.resolve(e.token_id, ctx);
    let top = dedup(&e.top_logprobs);
    let take = if k < 0 {
        top.len()
    } else {
        usize::try_from(k).unwrap_or(usize::MAX).min(top.len())
    };
    let top_logprobs = top[..take]
        .iter()
        .map(|t| {
            let (token, bytes) = show.resolve(t.token_id, ctx);
            ChatTopLogProb {
                bytes,
                token,
                logprob: clamp(t.logprob),
            }
        })
        .collect();
    advance(ctx, &[e.token_id]);
    ChatLogProb {
        token,
        logprob: clamp(e.logprob),
        bytes,
        top_logprobs,
    }
}

/// Appends completion-shaped entries; `text_offset` runs from `*offset` (in characters, as
/// Python's `len`). `k` = the request's `logprobs` (candidates with rank ≤ k, plus the
/// sampled token). `ctx` as for [`chat_entry`].
pub(crate) fn completion_entries(
    show: &TokenShow<'_>,
    entries: &[GenerateLogProb],
    k: i64,
    offset: &mut u64,
    out: &mut CompletionLogProbs,
    ctx: &mut Vec<u32>,
) {
    for e in entries {
        let token = show.resolve(e.token_id, ctx).0;
        out.text_offset.push(*offset);
        *offset = offset.saturating_add(token.chars().count() as u64);
        out.token_logprobs.push(Some(clamp(e.logprob)));
        let mut m = Map::new();
        for (i, t) in dedup(&e.top_logprobs).into_iter().enumerate() {
            let sampled = i == 0 && t.token_id == e.token_id;
            let in_k = k < 0 || t.rank.is_some_and(|r| r >= 1 && r <= k);
            if sampled || in_k {
                m.entry(show.resolve(t.token_id, ctx).0)
                    .or_insert_with(|| Value::from(clamp(t.logprob)));
            }
        }
        if m.is_empty() {
            m.insert(token.clone(), Value::from(clamp(e.logprob)));
        }
        out.tokens.push(token);
        out.top_logprobs.push(Some(m));
        advance(ctx, &[e.token_id]);
    }
}

/// The prompt positions of an echoed completion, as vLLM's `_create_completion_logprobs`
/// shows `prompt_logprobs` (`{"<id>": {"logprob", "rank", "decoded_token"}}` per position,
/// `null` first): a `null` position gets its token text and no logprob; the others the
/// prompt token's logprob and the first `k + 1` candidates of the position (all for `k = -1`
/// or with `logprob_token_ids`). `offset` continues across the output tokens that follow.
pub(crate) fn prompt_completion_entries(
    show: &TokenShow<'_>,
    ids: &[u32],
    prompt_logprobs: &[Value],
    k: i64,
    return_all: bool,
    offset: &mut u64,
    out: &mut CompletionLogProbs,
) {
    let limit = if return_all || k < 0 {
        usize::MAX
    } else {
        usize::try_from(k).map_or(usize::MAX, |k| k.saturating_add(1))
    };
    let shown = |id: u32, entry: Option<&Value>| -> String {
        if show.as_ids {
            return show.text(id);
        }
        entry
            .and_then(|e| e.get("decoded_token"))
            .and_then(Value::as_str)
            .map_or_else(|| show.text(id), str::to_owned)
    };
    let logprob_of = |e: &Value| clamp(e.get("logprob").and_then(Value::as_f64).unwrap_or(-9999.0));
    for (i, &id) in ids.iter().enumerate() {
        let position = prompt_logprobs.get(i).and_then(Value::as_object);
        let (token, logprob, top) = match position {
            None => (show.text(id), None, None),
            Some(m) => {
                let own = m.get(&id.to_string());
                let mut top = Map::new();
                for (key, e) in m.iter().take(limit) {
                    let Ok(cand) = key.parse::<u32>() else {
                        continue;
                    };
                    top.insert(shown(cand, Some(e)), Value::from(logprob_of(e)));
                }
                (shown(id, own), own.map(logprob_of), Some(top))
            }
        };
        out.text_offset.push(*offset);
        *offset = offset.saturating_add(token.chars().count() as u64);
        out.token_logprobs.push(logprob);
        out.tokens.push(token);
        out.top_logprobs.push(top);
    }
}
