//! Per-choice output processing: engine deltas → wire deltas, with incremental
//! detokenization and stop strings in text mode.

use std::sync::Arc;

use aphro_core::detokenizer::{token_text, DetokenizeOptions, IncrementalDetokenizer};
use aphro_core::stop::{StopState, StopStringMatcher};
use aphro_core::Tokenizer;

use crate::request::{EngineOutput, FinishReason, Logprob, PositionLogprobs};
use aphro_core::protocol::{
    clamp_logprob, ChatCompletionLogProbs, ChatLogProb, ChatTopLogProb, ChoiceLogProbs,
    GenerateLogProb, GenerateLogProbs, GenerateTopLogProb, StopReason,
};

/// An `Arc`'d aphro tokenizer lent to the detokenizer, which works on the HF type.
#[derive(Clone)]
pub(crate) struct SharedTokenizer(pub Arc<Tokenizer>);

impl std::borrow::Borrow<tokenizers::Tokenizer> for SharedTokenizer {
    fn borrow(&self) -> &tokenizers::Tokenizer {
        self.0.hf()
    }
}

/// What text mode needs per request.
#[derive(Clone)]
pub(crate) struct TextSpec {
    pub tokenizer: Arc<Tokenizer>,
    pub options: DetokenizeOptions,
    pub stop: Vec<String>,
    pub include_stop_str_in_output: bool,
    pub min_tokens: usize,
    /// Text mode: the deltas carry text. Tokens mode with stop strings decodes only to find
    /// them (the request still ends, and its KV is freed, at the stop string).
    pub emit_text: bool,
    /// `--return-tokens-as-token-ids`: logprob tokens are `token_id:N`, without bytes.
    pub tokens_as_ids: bool,
}

struct TextState {
    spec: TextSpec,
    detok: IncrementalDetokenizer<SharedTokenizer>,
    matcher: StopStringMatcher,
    stop: StopState,
}

/// One choice's wire delta.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChoiceDelta {
    pub token_ids: Vec<u32>,
    pub text: Option<String>,
    pub logprobs: Option<ChoiceLogProbs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<StopReason>,
}

impl ChoiceDelta {
    /// Appends a later delta of the same choice (`stream_interval` batching).
    pub fn append(&mut self, later: ChoiceDelta) {
        self.token_ids.extend(later.token_ids);
        if let Some(t) = later.text {
            self.text.get_or_insert_with(String::new).push_str(&t);
        }
        self.logprobs = match (self.logprobs.take(), later.logprobs) {
            (Some(mut a), Some(b)) => {
                a.extend(b);
                Some(a)
            }
            (a, b) => b.or(a),
        };
        if later.finish_reason.is_some() {
            self.finish_reason = later.finish_reason;
            self.stop_reason = later.stop_reason;
        }
    }
}

/// Turns one choice's engine outputs into wire deltas.
pub(crate) struct ChoiceState {
    text: Option<TextState>,
    /// Tokens mode with `logprobs` requested, or text mode with `logprobs`.
    want_logprobs: bool,
    /// Chat-shape entries kept per position (`max(logprobs, 1)`; all for -1).
    chat_cut: usize,
    /// Finished (by the engine or by a stop string); later outputs are ignored.
    pub finished: bool,
    pub completion_tokens: usize,
    /// This choice's stream already carried the prompt logprobs.
    pub prompt_logprobs_sent: bool,
}

impl ChoiceState {
    pub fn new(text: Option<TextSpec>, prompt: &[u32], logprobs: Option<i64>) -> Self {
        let want_logprobs = logprobs.is_some();
        let chat_cut = match logprobs {
            Some(-1) | None => usize::MAX,
            Some(k) => usize::try_from(k).unwrap_or(0).max(1),
        };
        let text = text.map(|spec| TextState {
            detok: IncrementalDetokenizer::seeded(
                SharedTokenizer(spec.tokenizer.clone()),
                prompt,
                spec.options,
            ),
            matcher: StopStringMatcher::new(
                spec.stop.clone(),
                spec.include_stop_str_in_output,
                spec.min_tokens,
            ),
            stop: StopState::default(),
            spec,
        });
        Self {
            text,
            want_logprobs,
            chat_cut,
            finished: false,
            completion_tokens: 0,
            prompt_logprobs_sent: false,
        }
    }

    /// Whether the deltas carry text (text mode).
    pub fn is_text(&self) -> bool {
        self.text.as_ref().is_some_and(|t| t.spec.emit_text)
    }

    /// Process one engine output. Returns `None` when the choice already finished.
    pub fn process(&mut self, out: EngineOutput) -> Option<ChoiceDelta> {
        if self.finished {
            return None;
        }
        let mut finish_reason = out.finish_reason.map(FinishReason::as_str);
        let mut stop_reason = out.stop_reason.map(StopReason::Token);
        let mut token_ids = out.token_ids;
        let mut lps = out.logprobs;
        let mut text = None;
        if let Some(ts) = self.text.as_mut() {
            // vLLM skips the text of a stop token (EOS / stop_token_ids) unless
            // include_stop_str_in_output.
            let stop_token_end =
                out.finish_reason == Some(FinishReason::Stop) && !token_ids.is_empty();
            let n_text = if stop_token_end && !ts.spec.include_stop_str_in_output {
                token_ids.len() - 1
            } else {
                token_ids.len()
            };
            let mut released = String::new();
            let mut cut_at = None;
            for (i, &id) in token_ids[..n_text].iter().enumerate() {
                let piece = ts.detok.push(id).unwrap_or_default();
                let step = ts.matcher.push(&mut ts.stop, [piece.as_str()]);
                released.push_str(&step.text);
                if let Some(s) = step.stop {
                    cut_at = Some(i + 1);
                    finish_reason = Some("stop");
                    stop_reason = Some(StopReason::Text(s));
                    break;
                }
            }
            match cut_at {
                Some(n) => {
                    token_ids.truncate(n);
                    if let Some(l) = lps.as_mut() {
                        l.truncate(n);
                    }
                }
                None if finish_reason.is_some() => {
                    // End of generation: flush the detokenizer and the stop hold-back.
                    let tail = ts.detok.finish();
                    let step = ts.matcher.push(&mut ts.stop, [tail.as_str()]);
                    released.push_str(&step.text);
                    if let Some(s) = step.stop {
                        stop_reason = Some(StopReason::Text(s));
                        finish_reason = Some("stop");
                    } else {
                        released.push_str(&ts.matcher.finish(&mut ts.stop));
                    }
                }
                None => {}
            }
            if ts.spec.emit_text {
                text = Some(released);
            }
        }
        if finish_reason.is_some() {
            self.finished = true;
        }
        self.completion_tokens += token_ids.len();
        let logprobs = if self.want_logprobs {
            Some(match &self.text {
                Some(ts) if ts.spec.emit_text => chat_logprobs(
                    (!ts.spec.tokens_as_ids).then_some(&*ts.spec.tokenizer),
                    &token_ids,
                    lps.as_deref(),
                    self.chat_cut,
                ),
                _ => tokens_logprobs(&token_ids, lps.as_deref()),
            })
        } else {
            None
        };
        Some(ChoiceDelta {
            token_ids,
            text,
            logprobs,
            finish_reason,
            stop_reason,
        })
    }
}

fn rank(l: &Logprob) -> Option<i64> {
    (l.rank != 0).then_some(l.rank as i64)
}

/// The engine's entries for one position in vLLM's dict order: chosen, then the top-k.
fn entries(p: &PositionLogprobs) -> impl Iterator<Item = &Logprob> {
    std::iter::once(&p.chosen).chain(
        p.top
            .iter()
            .filter(move |t| t.token_id != p.chosen.token_id),
    )
}

fn tokens_logprobs(ids: &[u32], lps: Option<&[PositionLogprobs]>) -> ChoiceLogProbs {
    let content = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| match lps.and_then(|l| l.get(i)) {
            Some(p) if p.chosen.token_id == id => GenerateLogProb {
                token_id: id,
                logprob: clamp_logprob(p.chosen.logprob),
                rank: rank(&p.chosen),
                top_logprobs: entries(p)
                    .map(|l| GenerateTopLogProb {
                        token_id: l.token_id,
                        logprob: clamp_logprob(l.logprob),
                        rank: rank(l),
                    })
                    .collect(),
            },
            _ => GenerateLogProb {
                token_id: id,
                logprob: -9999.0,
                rank: None,
                top_logprobs: Vec::new(),
            },
        })
        .collect();
    ChoiceLogProbs::Tokens(GenerateLogProbs {
        content: Some(content),
    })
}

/// Token string and the UTF-8 bytes of that string (`api.md` §2.4: "bytes = UTF-8 bytes of token");
/// without a tokenizer (`--return-tokens-as-token-ids`) the `token_id:N` placeholder and no
/// bytes, as vLLM's `_logprob_token`.
fn token_and_bytes(tok: Option<&Tokenizer>, id: u32) -> (String, Option<Vec<u8>>) {
    let Some(tok) = tok else {
        return (format!("token_id:{id}"), None);
    };
    let t = token_text(tok.hf(), id);
    let b = t.as_bytes().to_vec();
    (t, Some(b))
}

fn chat_logprobs(
    tok: Option<&Tokenizer>,
    ids: &[u32],
    lps: Option<&[PositionLogprobs]>,
    cut: usize,
) -> ChoiceLogProbs {
    let content = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let (token, bytes) = token_and_bytes(tok, id);
            match lps.and_then(|l| l.get(i)) {
                Some(p) if p.chosen.token_id == id => ChatLogProb {
                    token,
                    logprob: clamp_logprob(p.chosen.logprob),
                    bytes,
                    top_logprobs: entries(p)
                        .take(cut)
                        .map(|l| {
                            let (token, bytes) = token_and_bytes(tok, l.token_id);
                            ChatTopLogProb {
                                token,
                                logprob: clamp_logprob(l.logprob),
                                bytes,
                            }
                        })
                        .collect(),
                },
                _ => ChatLogProb {
                    token,
                    logprob: -9999.0,
                    bytes,
                    top_logprobs: Vec::new(),
                },
            }
        })
        .collect();
    ChoiceLogProbs::Chat(ChatCompletionLogProbs {
        content: Some(content),
    })
}
