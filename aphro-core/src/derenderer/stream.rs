//! Streaming derender: per-choice states for in-process use, and the stateless wire form.
use super::logprobs::{self, TokenShow};
use super::{map_finish, now_unix, ChatContext, CompletionContext, Derenderer, ModelTok};
use crate::detokenizer::{DetokenizeOptions, IncrementalDetokenizer, MAX_WINDOW_IDS};
use crate::error::{Error, Result};
use crate::protocol::{
    AphroStreamState, ChatCompletionChunk, ChatCompletionLogProbs, ChatCompletionRequest,
    ChatStreamChoice, CompletionChunk, CompletionLogProbs, CompletionRequest,
    CompletionStreamChoice, DeltaFunction, DeltaMessageWire, DeltaToolCallWire,
    DerenderChatStreamRequest, DerenderChatStreamResponse, DerenderCompletionStreamRequest,
    DerenderCompletionStreamResponse, DerenderStreamState, GenerateChoice, GenerateLogProb,
    GenerateStreamResponse, StopReason, UsageInfo,
};
use crate::stop::StopState;
use aphro_parsers::{DeltaMessage, StreamParser};
use serde_json::Value;

/// Most preceding sampled ids kept for logprob token repair (vLLM's limit).
const LOGPROB_CONTEXT: usize = logprobs::CONTEXT;
/// vLLM's limit on `prev_tokens`.
const MAX_PREV_TOKENS: usize = 1024;
use crate::protocol::STREAM_STATE_VERSION as STATE_VERSION;

/// Shared decode state of a streamed choice (detokenizer + stop strings + counters).
struct Decode {
    detok: IncrementalDetokenizer<ModelTok>,
    stop_state: StopState,
    tokens: u64,
    finished: bool,
    logprob_ctx: Vec<u32>,
}

/// The text one step released, after stop handling.
struct Step {
    text: String,
    kept: usize,
    finish: Option<String>,
    stop_reason: Option<StopReason>,
}

impl Decode {
    fn new(d: &Derenderer, prompt_ids: Option<&[u32]>, opts: DetokenizeOptions) -> Self {
        let tok = ModelTok(d.inner().model.clone());
        let detok = match prompt_ids {
            Some(p) => IncrementalDetokenizer::seeded(tok, p, opts),
            None => IncrementalDetokenizer::new(tok, opts),
        };
        Self {
            detok,
            stop_state: StopState::default(),
            tokens: 0,
            finished: false,
            logprob_ctx: Vec::new(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        d: &Derenderer,
        c: &GenerateChoice,
        stop: &crate::stop::StopStringMatcher,
        stop_token_ids: &[u32],
        ignore_eos: bool,
        include_stop_str: bool,
    ) -> Result<Step> {
        let ids: &[u32] = c.token_ids.as_deref().unwrap_or(&[]);
        let mml = d.max_model_len() as u64;
        let total = self
            .tokens
            .checked_add(ids.len() as u64)
            .filter(|&t| t <= mml)
            .ok_or_else(|| {
                Error::bad_request(format!("stream output exceeds max_model_len={mml} tokens"))
            })?;
        if self.finished {
            self.tokens = total;
            return Ok(Step {
                text: String::new(),
                kept: 0,
                finish: None,
                stop_reason: None,
            });
        }
        let mut finish = c.finish_reason.clone();
        let st = d.stop_token(
            ids,
            finish.as_deref(),
            c.stop_reason.as_ref(),
            stop_token_ids,
            ignore_eos,
            include_stop_str,
        );
        let kept = &ids[..st.keep];
        let mut stop_reason = st.stop_reason;
        let mut texts: Vec<String> = kept
            .iter()
            .map(|&i| self.detok.push(i).unwrap_or_default())
            .collect();
        if finish.is_some() {
            let tail = self.detok.finish();
            if !tail.is_empty() {
                match texts.last_mut() {
                    Some(t) => t.push_str(&tail),
                    None => texts.push(tail),
                }
            }
        }
        let text = if stop.stops().is_empty() {
            texts.concat()
        } else {
            let step = stop.push(&mut self.stop_state, texts.iter().map(String::as_str));
            let mut t = step.text;
            if let Some(s) = step.stop {
                stop_reason = Some(StopReason::Text(s));
                finish = Some("stop".into());
            } else if finish.is_some() {
                t.push_str(&stop.finish(&mut self.stop_state));
            }
            t
        };
        self.tokens = total;
        self.finished = finish.is_some();
        // vLLM advances the repair context by the chunk's sampled ids.
        logprobs::advance(&mut self.logprob_ctx, ids);
        Ok(Step {
            text,
            kept: kept.len(),
            finish,
            stop_reason,
        })
    }
}

fn merge(into: &mut DeltaMessage, d: DeltaMessage) {
    if let Some(c) = d.content {
        into.content.get_or_insert_with(String::new).push_str(&c);
    }
    if let Some(r) = d.reasoning {
        into.reasoning.get_or_insert_with(String::new).push_str(&r);
    }
    into.tool_calls.extend(d.tool_calls);
}

fn logprob_slice(c: &GenerateChoice, kept: usize) -> Option<&[GenerateLogProb]> {
    let content = c.logprobs.as_ref()?.tokens()?.content.as_ref()?;
    Some(&content[..content.len().min(kept)])
}

/// Streaming chat derender of one choice. `push` costs work proportional to the chunk.
pub struct ChatDerenderStream {
    d: Derenderer,
    ctx: ChatContext,
    id: String,
    model: String,
    index: usize,
    decode: Decode,
    parser: Option<Box<dyn StreamParser>>,
    role_sent: bool,
    tools_streamed: bool,
    tool_ids: Vec<String>,
    prompt_tokens: Option<u64>,
    return_prompt_ids: bool,
    /// Wire-streaming session (see [`LiveStreams`]); `None` for in-process streams.
    session: Option<String>,
    seq: u64,
}

/// Live states of wire streams, keyed by session id. A hit (same session, the expected `seq`
/// and request id) resumes the stored state, so a call costs its chunk; anything else —
/// another server, an evicted or replayed state — rebuilds from the carried state. Bounded:
/// the least recently used session is evicted past [`LiveStreams::CAPACITY`].
#[derive(Default)]
pub(crate) struct LiveStreams {
    map: std::collections::HashMap<String, LiveEntry>,
    /// Sessions by last use, oldest first: eviction is O(log n), not a scan of the map.
    order: std::collections::BTreeMap<u64, String>,
    clock: u64,
}

struct LiveEntry {
    seq: u64,
    request_id: String,
    stream: ChatDerenderStream,
    used: u64,
}

impl std::fmt::Debug for LiveStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveStreams")
            .field("len", &self.map.len())
            .finish()
    }
}

impl LiveStreams {
    pub(crate) const CAPACITY: usize = 4096;

    fn take(&mut self, session: &str, seq: u64, request_id: &str) -> Option<ChatDerenderStream> {
        let hit = self
            .map
            .get(session)
            .is_some_and(|e| e.seq == seq && e.request_id == request_id);
        if hit {
            self.remove_entry(session).map(|e| e.stream)
        } else {
            None
        }
    }

    fn put(&mut self, session: String, seq: u64, request_id: String, stream: ChatDerenderStream) {
        self.clock += 1;
        self.remove_entry(&session);
        while self.map.len() >= Self::CAPACITY {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.map.remove(&oldest);
        }
        let used = self.clock;
        self.order.insert(used, session.clone());
        self.map.insert(
            session,
            LiveEntry {
                seq,
                request_id,
                stream,
                used,
            },
        );
    }

    fn remove(&mut self, session: &str) {
        self.remove_entry(session);
    }

    fn remove_entry(&mut self, session: &str) -> Option<LiveEntry> {
        let e = self.map.remove(session)?;
        self.order.remove(&e.used);
        Some(e)
    }
}

fn new_session_id() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..16)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

impl std::fmt::Debug for ChatDerenderStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatDerenderStream")
            .field("id", &self.id)
            .field("index", &self.index)
            .field("tokens", &self.decode.tokens)
            .finish_non_exhaustive()
    }
}

impl Derenderer {
    /// A streaming chat state for one choice (in-process: the integrated server's
    /// `/v1/chat/completions` stream). `prompt_ids` seed decoding and the parsers' look-back.
    /// Stop strings of the request are applied with hold-back (the wire form rejects them).
    pub fn chat_stream(
        &self,
        req: Option<&ChatCompletionRequest>,
        id: impl Into<String>,
        prompt_ids: Option<&[u32]>,
        index: usize,
    ) -> Result<ChatDerenderStream> {
        if let Some(p) = prompt_ids {
            self.check_prompt_ids_pub(p)?;
        }
        let ctx = self.chat_context(req, prompt_ids)?;
        let parser = match &ctx.parser_cfg {
            Some(cfg) => Some(self.new_parser(cfg)?),
            None => None,
        };
        let decode = Decode::new(self, prompt_ids, ctx.detok);
        Ok(ChatDerenderStream {
            d: self.clone(),
            id: id.into(),
            model: req
                .and_then(|r| r.model.clone())
                .unwrap_or_else(|| self.served_model_name().to_owned()),
            index,
            decode,
            parser,
            role_sent: false,
            tools_streamed: false,
            tool_ids: Vec::new(),
            prompt_tokens: None,
            return_prompt_ids: req.and_then(|r| r.return_token_ids).unwrap_or(false),
            session: None,
            seq: 0,
            ctx,
        })
    }

    fn check_prompt_ids_pub(&self, p: &[u32]) -> Result<()> {
        if p.len() > self.max_model_len() {
            return Err(Error::bad_request(format!(
                "prompt_token_ids has {} ids, more than max_model_len={}",
                p.len(),
                self.max_model_len()
            )));
        }
        self.check_in_vocab(p)
    }

    /// A streaming completion state for one choice of the request's first prompt.
    pub fn completion_stream(
        &self,
        req: Option<&CompletionRequest>,
        id: impl Into<String>,
        prompt_ids: Option<&[u32]>,
        index: usize,
    ) -> Result<CompletionDerenderStream> {
        self.completion_stream_for_prompt(req, id, prompt_ids, 0, index)
    }

    /// A streaming completion state for choice `index` of prompt `prompt_index` (which prompt
    /// `echo` repeats).
    pub fn completion_stream_for_prompt(
        &self,
        req: Option<&CompletionRequest>,
        id: impl Into<String>,
        prompt_ids: Option<&[u32]>,
        prompt_index: usize,
        index: usize,
    ) -> Result<CompletionDerenderStream> {
        if let Some(p) = prompt_ids {
            self.check_prompt_ids_pub(p)?;
        }
        let echo = self.echo_prompt(req, prompt_index, prompt_ids)?;
        let ctx = self.completion_context(req);
        let decode = Decode::new(self, prompt_ids, ctx.detok);
        Ok(CompletionDerenderStream {
            d: self.clone(),
            id: id.into(),
            model: req
                .and_then(|r| r.model.clone())
                .unwrap_or_else(|| self.served_model_name().to_owned()),
            index,
            decode,
            text_offset: 0,
            prompt_tokens: None,
            echo,
            ctx,
        })
    }
}

fn usage_chunk_usage(req_prompt: Option<u64>, chunk: &GenerateStreamResponse) -> Result<UsageInfo> {
    let mut u = chunk.usage.clone().unwrap_or_default();
    if let Some(p) = req_prompt {
        u.prompt_tokens = p;
    }
    u.total_tokens = u
        .prompt_tokens
        .checked_add(u.completion_tokens.unwrap_or(0))
        .ok_or_else(|| {
            Error::invalid_param(
                "prompt_tokens + completion tokens overflows",
                "prompt_tokens",
                u.prompt_tokens,
            )
        })?;
    Ok(u)
}

impl ChatDerenderStream {
    /// Sets the prompt token count reported in usage chunks.
    pub fn set_prompt_tokens(&mut self, n: Option<u64>) {
        self.prompt_tokens = n;
    }

    /// Generated tokens seen so far.
    pub fn tokens(&self) -> u64 {
        self.decode.tokens
    }

    /// One generate stream event → one chat chunk. A usage-only event gives `choices: []`.
    pub fn push(&mut self, chunk: &GenerateStreamResponse) -> Result<ChatCompletionChunk> {
        if chunk.choices.len() > 1 {
            return Err(Error::bad_request(format!(
                "generate_chunk must have at most one choice, got {}",
                chunk.choices.len()
            )));
        }
        let (choices, usage) = match chunk.choices.first() {
            None => (
                Vec::new(),
                Some(usage_chunk_usage(self.prompt_tokens, chunk)?),
            ),
            Some(c) => {
                self.d.check_choices(std::slice::from_ref(c), true)?;
                let usage = match &chunk.usage {
                    Some(_) => Some(usage_chunk_usage(self.prompt_tokens, chunk)?),
                    None => None,
                };
                (vec![self.push_choice(c)?], usage)
            }
        };
        Ok(ChatCompletionChunk {
            id: chunk.request_id.clone(),
            object: "chat.completion.chunk".into(),
            created: now_unix(),
            model: self.model.clone(),
            choices,
            usage,
            prompt_token_ids: if self.return_prompt_ids {
                chunk.prompt_token_ids.clone()
            } else {
                None
            },
        })
    }

    /// One choice delta (bounds of the choice are the caller's; `push` checks them).
    pub fn push_choice(&mut self, c: &GenerateChoice) -> Result<ChatStreamChoice> {
        let ctx = &self.ctx;
        let mut lp_ctx = self.decode.logprob_ctx.clone();
        let step = self.decode.step(
            &self.d,
            c,
            &ctx.stop,
            &ctx.stop_token_ids,
            ctx.ignore_eos,
            ctx.include_stop_str,
        )?;
        let mut dm = DeltaMessage::default();
        match &mut self.parser {
            Some(p) => {
                if !step.text.is_empty() {
                    dm = p.push(&step.text);
                }
                if step.finish.is_some() {
                    merge(&mut dm, p.finish());
                }
            }
            None => {
                if !step.text.is_empty() {
                    dm.content = Some(step.text);
                }
            }
        }
        let mut delta = DeltaMessageWire::default();
        if !self.role_sent {
            delta.role = Some("assistant".into());
            self.role_sent = true;
        }
        delta.content = dm.content.filter(|s| !s.is_empty());
        if ctx.include_reasoning {
            delta.reasoning = dm.reasoning.filter(|s| !s.is_empty());
        }
        if ctx.keep_tools {
            for tc in dm.tool_calls {
                if !ctx.parallel && tc.index > 0 {
                    continue;
                }
                if tc.name.is_some() || tc.id.is_some() {
                    let id = match self.tool_ids.get(tc.index) {
                        Some(pinned) => pinned.clone(),
                        None => {
                            let id = tc.id.clone().unwrap_or_default();
                            if tc.index == self.tool_ids.len() {
                                self.tool_ids.push(id.clone());
                            }
                            id
                        }
                    };
                    delta.tool_calls.push(DeltaToolCallWire {
                        id: Some(id),
                        kind: Some("function".into()),
                        index: tc.index,
                        function: Some(DeltaFunction {
                            name: tc.name.clone(),
                            arguments: None,
                        }),
                    });
                }
                if !tc.arguments.is_empty() {
                    delta.tool_calls.push(DeltaToolCallWire {
                        id: None,
                        kind: None,
                        index: tc.index,
                        function: Some(DeltaFunction {
                            name: None,
                            arguments: Some(tc.arguments),
                        }),
                    });
                }
                self.tools_streamed = true;
            }
        }
        let finish_reason = step
            .finish
            .as_deref()
            .map(|f| map_finish(Some(f), self.tools_streamed, ctx.named));
        let logprobs = if ctx.hide {
            None
        } else {
            logprob_slice(c, step.kept).map(|entries| {
                let show = TokenShow {
                    tokenizer: self.d.model().tokenizer.hf(),
                    encoding: self.d.inner().encoding,
                    as_ids: ctx.as_ids,
                };
                ChatCompletionLogProbs {
                    content: Some(
                        entries
                            .iter()
                            .map(|e| logprobs::chat_entry(&show, e, ctx.top_logprobs, &mut lp_ctx))
                            .collect(),
                    ),
                }
            })
        };
        Ok(ChatStreamChoice {
            index: self.index,
            delta,
            logprobs,
            finish_reason,
            stop_reason: if step.finish.is_some() {
                step.stop_reason
            } else {
                None
            },
            token_ids: (ctx.return_token_ids && !ctx.hide)
                .then(|| c.token_ids.clone().unwrap_or_default()),
        })
    }

    /// The client-carried state after this call (module docs of
    /// [`crate::protocol::derender`]).
    pub fn wire_state(&self) -> DerenderStreamState {
        let det = self.decode.detok.state().clone();
        DerenderStreamState {
            prev_tokens: Vec::new(),
            prefix_offset: 0,
            read_offset: det.read_offset,
            role_sent: self.role_sent,
            logprob_context_token_ids: self.decode.logprob_ctx.clone(),
            logprob_text_offset: 0,
            output_token_ids: Vec::new(),
            output_chunk_lens: Vec::new(),
            tools_streamed: self.tools_streamed,
            last_tool_call_ids: self.tool_ids.clone(),
            aphro: Some(AphroStreamState {
                v: STATE_VERSION,
                tokens: self.decode.tokens,
                finished: self.decode.finished,
                detokenizer: det,
                parser: self.parser.as_ref().and_then(|p| p.snapshot()),
                session: self.session.clone(),
                seq: self.seq,
            }),
        }
    }
}

/// Streaming completion derender of one choice.
pub struct CompletionDerenderStream {
    d: Derenderer,
    ctx: CompletionContext,
    id: String,
    model: String,
    index: usize,
    decode: Decode,
    text_offset: u64,
    prompt_tokens: Option<u64>,
    /// `echo` not yet sent: it goes before the first choice chunk.
    echo: Option<super::EchoPrompt>,
}

impl std::fmt::Debug for CompletionDerenderStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionDerenderStream")
            .field("id", &self.id)
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl CompletionDerenderStream {
    pub fn set_prompt_tokens(&mut self, n: Option<u64>) {
        self.prompt_tokens = n;
    }

    /// One generate stream event → one completion chunk.
    pub fn push(&mut self, chunk: &GenerateStreamResponse) -> Result<CompletionChunk> {
        if chunk.choices.len() > 1 {
            return Err(Error::bad_request(format!(
                "generate_chunk must have at most one choice, got {}",
                chunk.choices.len()
            )));
        }
        let (choices, usage) = match chunk.choices.first() {
            None => (
                Vec::new(),
                Some(usage_chunk_usage(self.prompt_tokens, chunk)?),
            ),
            Some(c) => {
                self.d.check_choices(std::slice::from_ref(c), true)?;
                let usage = match &chunk.usage {
                    Some(_) => Some(usage_chunk_usage(self.prompt_tokens, chunk)?),
                    None => None,
                };
                let echo = self.echo.take();
                let mut choice = self.push_choice(c)?;
                if let Some(e) = echo {
                    self.put_echo(&e, chunk.prompt_logprobs.as_deref(), &mut choice)?;
                }
                (vec![choice], usage)
            }
        };
        Ok(CompletionChunk {
            id: chunk.request_id.clone(),
            object: "text_completion".into(),
            created: now_unix(),
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    /// The echoed prompt before the first chunk's text and logprobs (vLLM's streaming
    /// completion serving); with `max_tokens: 0` the chunk shows the prompt alone.
    fn put_echo(
        &mut self,
        e: &super::EchoPrompt,
        prompt_logprobs: Option<&[Value]>,
        choice: &mut CompletionStreamChoice,
    ) -> Result<()> {
        choice.text = e.text_before(&choice.text);
        if let Some(generated) = choice.logprobs.take() {
            // The generated positions start where this chunk started.
            let start = generated
                .text_offset
                .first()
                .copied()
                .unwrap_or(self.text_offset);
            let (mut out, end) = self.d.echo_logprobs(
                &self.ctx,
                e,
                prompt_logprobs,
                CompletionLogProbs::default(),
                start,
            )?;
            if e.only_prompt {
                self.text_offset = end;
            } else {
                let moved = end - start;
                super::append_shifted(&mut out, generated, moved);
                self.text_offset = self.text_offset.saturating_add(moved);
            }
            choice.logprobs = Some(out);
        }
        Ok(())
    }

    pub fn push_choice(&mut self, c: &GenerateChoice) -> Result<CompletionStreamChoice> {
        let ctx = &self.ctx;
        let mut lp_ctx = self.decode.logprob_ctx.clone();
        let step = self.decode.step(
            &self.d,
            c,
            &ctx.stop,
            &ctx.stop_token_ids,
            ctx.ignore_eos,
            ctx.include_stop_str,
        )?;
        let logprobs = logprob_slice(c, step.kept).map(|entries| {
            let mut out = CompletionLogProbs::default();
            let show = TokenShow {
                tokenizer: self.d.model().tokenizer.hf(),
                encoding: self.d.inner().encoding,
                as_ids: ctx.as_ids,
            };
            logprobs::completion_entries(
                &show,
                entries,
                ctx.logprobs,
                &mut self.text_offset,
                &mut out,
                &mut lp_ctx,
            );
            out
        });
        Ok(CompletionStreamChoice {
            index: self.index,
            text: step.text,
            logprobs,
            finish_reason: step.finish.clone(),
            stop_reason: if step.finish.is_some() {
                step.stop_reason
            } else {
                None
            },
            token_ids: ctx
                .return_token_ids
                .then(|| c.token_ids.clone().unwrap_or_default()),
        })
    }

    pub fn wire_state(&self) -> DerenderStreamState {
        let det = self.decode.detok.state().clone();
        DerenderStreamState {
            read_offset: det.read_offset,
            role_sent: true,
            logprob_context_token_ids: self.decode.logprob_ctx.clone(),
            logprob_text_offset: self.text_offset,
            aphro: Some(AphroStreamState {
                v: STATE_VERSION,
                tokens: self.decode.tokens,
                finished: self.decode.finished,
                detokenizer: det,
                parser: None,
                session: None,
                seq: 0,
            }),
            ..DerenderStreamState::default()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The stateless wire form.

/// Checks a client-carried state and returns the generated-token count it stands for.
fn check_state(d: &Derenderer, s: &DerenderStreamState) -> Result<u64> {
    let bad = |m: String| Error::bad_request(format!("invalid stream_state: {m}"));
    let sum =
        s.output_chunk_lens
            .iter()
            .try_fold(0usize, |a, &n| if n == 0 { None } else { a.checked_add(n) });
    if sum != Some(s.output_token_ids.len()) {
        return Err(bad(
            "output_chunk_lens must be positive and sum to len(output_token_ids)".into(),
        ));
    }
    if s.prev_tokens.len() > MAX_PREV_TOKENS {
        return Err(bad(format!(
            "prev_tokens has more than {MAX_PREV_TOKENS} entries"
        )));
    }
    if s.logprob_context_token_ids.len() > LOGPROB_CONTEXT {
        return Err(bad(format!(
            "logprob_context_token_ids has more than {LOGPROB_CONTEXT} ids"
        )));
    }
    let mml = d.max_model_len();
    match &s.aphro {
        Some(a) => {
            if a.v != STATE_VERSION {
                return Err(bad(format!("unsupported state version {}", a.v)));
            }
            a.detokenizer.validate().map_err(|e| bad(e.to_string()))?;
            if a.detokenizer.ids.len() > MAX_WINDOW_IDS {
                return Err(bad("detokenizer window too long".into()));
            }
            if a.tokens > mml as u64 {
                return Err(bad(format!("more than max_model_len={mml} tokens")));
            }
            // Held text is at most the generated text (bounded like its tokens).
            let max_text = mml.saturating_mul(256);
            if a.parser.as_ref().is_some_and(|p| p.held_bytes() > max_text) {
                return Err(bad(
                    "parser state is longer than max_model_len allows".into()
                ));
            }
            Ok(a.tokens)
        }
        None => {
            check_vllm_state(d, s).map_err(bad)?;
            Ok(s.output_token_ids.len() as u64)
        }
    }
}

/// Prompt tokens vLLM seeds `prev_tokens` with (`INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`
/// + 2, `vllm/transformers_utils/detokenizer_utils.py`).
const VLLM_PROMPT_CONTEXT_TOKENS: usize = 7;

/// A vLLM-produced state is resumed from `output_token_ids`; its `prev_tokens` and offsets
/// must describe the same tokens, or the two servers would emit different text for it.
fn check_vllm_state(d: &Derenderer, s: &DerenderStreamState) -> std::result::Result<(), String> {
    d.check_in_vocab(&s.output_token_ids)
        .map_err(|e| e.to_string())?;
    if s.prev_tokens.is_empty() && s.prefix_offset == 0 && s.read_offset == 0 {
        return Ok(());
    }
    if s.prefix_offset > s.read_offset || s.read_offset > s.prev_tokens.len() {
        return Err(format!(
            "prefix_offset ({}) <= read_offset ({}) <= len(prev_tokens) ({}) does not hold",
            s.prefix_offset,
            s.read_offset,
            s.prev_tokens.len()
        ));
    }
    let context = s
        .prev_tokens
        .len()
        .checked_sub(s.output_token_ids.len())
        .filter(|&c| c <= VLLM_PROMPT_CONTEXT_TOKENS)
        .ok_or_else(|| {
            format!(
                "prev_tokens has {} entries for {} output_token_ids (at most {} more are prompt \
                 context)",
                s.prev_tokens.len(),
                s.output_token_ids.len(),
                VLLM_PROMPT_CONTEXT_TOKENS
            )
        })?;
    let tok = &d.inner().model.tokenizer;
    for (i, (&id, token)) in s
        .output_token_ids
        .iter()
        .zip(&s.prev_tokens[context..])
        .enumerate()
    {
        if tok.id_to_token(id).as_deref() != Some(token.as_str()) {
            return Err(format!(
                "prev_tokens[{}] ({token:?}) is not the token of output_token_ids[{i}] ({id})",
                context + i
            ));
        }
    }
    Ok(())
}

/// Limit of `api.md` §6.2: prompt + earlier output + this delta ≤ max_model_len.
fn check_total(
    d: &Derenderer,
    prompt: usize,
    before: u64,
    chunk: &GenerateStreamResponse,
) -> Result<()> {
    let delta = chunk
        .choices
        .first()
        .and_then(|c| c.token_ids.as_ref())
        .map_or(0, Vec::len) as u64;
    let mml = d.max_model_len() as u64;
    let total = (prompt as u64)
        .checked_add(before)
        .and_then(|t| t.checked_add(delta));
    match total {
        Some(t) if t <= mml => Ok(()),
        _ => Err(Error::bad_request(format!(
            "prompt_token_ids + output tokens exceed max_model_len={mml}"
        ))),
    }
}

fn reject_stop(stop: Option<&crate::protocol::StopSpec>) -> Result<()> {
    let non_empty = match stop {
        None => false,
        Some(crate::protocol::StopSpec::One(s)) => !s.is_empty(),
        Some(crate::protocol::StopSpec::Many(v)) => !v.is_empty(),
    };
    if non_empty {
        return Err(Error::invalid_param(
            "stop strings are not supported by streaming derender because text already sent \
             cannot be cut. Apply stop strings at generate time (sampling_params.stop) instead.",
            "stop",
            format!("{stop:?}"),
        ));
    }
    Ok(())
}

impl Derenderer {
    /// `POST /v1/chat/completions/derender` with `stream: true` (§6.2): one call per generate
    /// event, state carried by the client. Per-call work: this chunk's tokens, plus restoring
    /// the parser from its snapshot (the text it has not settled yet; see
    /// [`crate::protocol::derender`]) unless this server still holds the stream's live state.
    pub fn derender_chat_stream(
        &self,
        req: DerenderChatStreamRequest,
    ) -> Result<DerenderChatStreamResponse> {
        let model = self.check_model(req.model.as_deref())?;
        if !req.stream {
            return Err(Error::validation(
                "1 validation error:\n  stream: Input should be True",
                Some("body.stream"),
            ));
        }
        let chunk = &req.generate_chunk;
        if chunk.choices.len() > 1 {
            return Err(Error::bad_request(format!(
                "generate_chunk must have at most one choice, got {}",
                chunk.choices.len()
            )));
        }
        if self.has_parser() {
            if req.chat_request.is_none() {
                return Err(Error::bad_request(
                    "chat_request is required when a tool or reasoning parser is configured \
                     because plain detokenization would leak raw parser markup into content.",
                ));
            }
            if req.prompt_token_ids.is_none() {
                return Err(Error::bad_request(
                    "prompt_token_ids is required for streaming derender when a tool or \
                     reasoning parser is configured (parsers look back into the prompt).",
                ));
            }
        }
        if let Some(r) = &req.chat_request {
            reject_stop(r.stop.as_ref())?;
        }
        self.check_choices(&chunk.choices, true)?;
        let prompt_ids = req.prompt_token_ids.as_deref();
        if let Some(p) = prompt_ids {
            self.check_prompt_ids_pub(p)?;
        }
        let state = req.stream_state.unwrap_or_default();
        let before = check_state(self, &state)?;
        check_total(self, prompt_ids.map_or(0, <[u32]>::len), before, chunk)?;

        // Fast path: this server holds the stream's live state from the previous call.
        if let (Some(a), false) = (&state.aphro, chunk.choices.is_empty()) {
            if let Some(session) = &a.session {
                let cached = self
                    .inner()
                    .live
                    .lock()
                    .ok()
                    .and_then(|mut l| l.take(session, a.seq, &chunk.request_id));
                if let Some(mut s) = cached {
                    s.model = model;
                    s.prompt_tokens = req.prompt_tokens;
                    return self.finish_wire_call(s, chunk);
                }
            }
        }

        let mut s = self.chat_stream(
            req.chat_request.as_ref(),
            chunk.request_id.clone(),
            prompt_ids,
            0,
        )?;
        s.model = model;
        s.prompt_tokens = req.prompt_tokens;
        s.role_sent = state.role_sent;
        s.tools_streamed = state.tools_streamed;
        s.tool_ids = state.last_tool_call_ids.clone();
        if chunk.choices.is_empty() {
            let out = s.push(chunk)?;
            return Ok(DerenderChatStreamResponse {
                chunk: out,
                stream_state: state,
            });
        }
        s.index = chunk.choices[0].index;
        self.resume(&mut s.decode, &state, prompt_ids, s.ctx.detok)?;
        self.resume_parser(&mut s, &state, prompt_ids)?;
        s.session = Some(
            state
                .aphro
                .as_ref()
                .and_then(|a| a.session.clone())
                .unwrap_or_else(new_session_id),
        );
        s.seq = state.aphro.as_ref().map_or(0, |a| a.seq);
        self.finish_wire_call(s, chunk)
    }

    /// Push one chunk, advance the session, and keep the live state for the next call unless
    /// the stream finished.
    fn finish_wire_call(
        &self,
        mut s: ChatDerenderStream,
        chunk: &GenerateStreamResponse,
    ) -> Result<DerenderChatStreamResponse> {
        let out = s.push(chunk)?;
        s.seq += 1;
        let stream_state = s.wire_state();
        if let (Some(session), Ok(mut live)) = (s.session.clone(), self.inner().live.lock()) {
            if s.decode.finished {
                live.remove(&session);
            } else {
                let (seq, id) = (s.seq, chunk.request_id.clone());
                live.put(session, seq, id, s);
            }
        }
        Ok(DerenderChatStreamResponse {
            chunk: out,
            stream_state,
        })
    }

    /// Restores the decode state from the carried state (or decodes vLLM's replay ids once).
    fn resume(
        &self,
        dec: &mut Decode,
        state: &DerenderStreamState,
        prompt_ids: Option<&[u32]>,
        opts: DetokenizeOptions,
    ) -> Result<()> {
        match &state.aphro {
            Some(a) => {
                let mut det = a.detokenizer.clone();
                // The request's options win over the carried ones.
                det.skip_special_tokens = opts.skip_special_tokens;
                det.spaces_between_special_tokens = opts.spaces_between_special_tokens;
                dec.detok =
                    IncrementalDetokenizer::from_state(ModelTok(self.inner().model.clone()), det)
                        .map_err(|e| Error::bad_request(format!("invalid stream_state: {e}")))?;
                dec.tokens = a.tokens;
                dec.finished = a.finished;
            }
            None if !state.output_token_ids.is_empty() => {
                *dec = Decode::new(self, prompt_ids, opts);
                let _ = dec.detok.push_many(&state.output_token_ids);
                dec.tokens = state.output_token_ids.len() as u64;
            }
            None => {}
        }
        dec.logprob_ctx = state.logprob_context_token_ids.clone();
        Ok(())
    }

    /// Sets the parser of a rebuilt stream to where the carried state left it: restored from
    /// the snapshot (no replay), or for a vLLM-produced state fed the text of its replay ids
    /// once (output discarded).
    fn resume_parser(
        &self,
        s: &mut ChatDerenderStream,
        state: &DerenderStreamState,
        prompt_ids: Option<&[u32]>,
    ) -> Result<()> {
        let bad = |m: String| Error::bad_request(format!("invalid stream_state: {m}"));
        match (&state.aphro, s.parser.as_mut(), s.ctx.parser_cfg.as_ref()) {
            (Some(a), Some(p), Some(cfg)) => match &a.parser {
                Some(snap) => *p = self.restore_parser(cfg, snap.clone())?,
                // The state of a call that produced no output yet: a fresh parser is right.
                None if a.tokens == 0 => {}
                None => return Err(bad("aphro.parser is missing".into())),
            },
            (Some(a), None, _) if a.parser.is_some() => {
                return Err(bad(
                    "aphro.parser is set but no tool or reasoning parser is configured".into(),
                ))
            }
            (Some(_), _, _) => {}
            (None, Some(p), _) => {
                let text = self.replay_text(state, prompt_ids, s.ctx.detok);
                if !text.is_empty() {
                    let _ = p.push(&text);
                }
            }
            (None, None, _) => {}
        }
        Ok(())
    }

    /// vLLM-produced state: the text of `output_token_ids`, decoded once.
    fn replay_text(
        &self,
        state: &DerenderStreamState,
        prompt_ids: Option<&[u32]>,
        opts: DetokenizeOptions,
    ) -> String {
        if state.output_token_ids.is_empty() {
            return String::new();
        }
        let mut dec = Decode::new(self, prompt_ids, opts);
        dec.detok.push_many(&state.output_token_ids)
    }

    /// `POST /v1/completions/derender` with `stream: true` (§7).
    pub fn derender_completion_stream(
        &self,
        req: DerenderCompletionStreamRequest,
    ) -> Result<DerenderCompletionStreamResponse> {
        let model = self.check_model(req.model.as_deref())?;
        if !req.stream {
            return Err(Error::validation(
                "1 validation error:\n  stream: Input should be True",
                Some("body.stream"),
            ));
        }
        let chunk = &req.generate_chunk;
        if chunk.choices.len() > 1 {
            return Err(Error::bad_request(format!(
                "generate_chunk must have at most one choice, got {}",
                chunk.choices.len()
            )));
        }
        if let Some(r) = &req.completion_request {
            reject_stop(r.stop.as_ref())?;
        }
        self.check_choices(&chunk.choices, true)?;
        let prompt_ids = req.prompt_token_ids.as_deref();
        if let Some(p) = prompt_ids {
            self.check_prompt_ids_pub(p)?;
        }
        let state = req.stream_state.unwrap_or_default();
        let before = check_state(self, &state)?;
        check_total(self, prompt_ids.map_or(0, <[u32]>::len), before, chunk)?;
        let mut s = self.completion_stream(
            req.completion_request.as_ref(),
            chunk.request_id.clone(),
            prompt_ids,
            0,
        )?;
        s.model = model;
        s.prompt_tokens = req.prompt_tokens;
        if chunk.choices.is_empty() {
            let out = s.push(chunk)?;
            return Ok(DerenderCompletionStreamResponse {
                chunk: out,
                stream_state: state,
            });
        }
        s.index = chunk.choices[0].index;
        self.resume(&mut s.decode, &state, prompt_ids, s.ctx.detok)?;
        s.text_offset = state.logprob_text_offset;
        let out = s.push(chunk)?;
        Ok(DerenderCompletionStreamResponse {
            chunk: out,
            stream_state: s.wire_state(),
        })
    }
}
