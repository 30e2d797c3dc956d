//! The Derenderer: generated token ids → OpenAI chat / completion responses (`api.md` §6–§7).
//!
//! Built once per served model ([`Derenderer::new`]) with the server's parser names. Entry
//! points:
//!
//! * wire, non-streaming: [`Derenderer::derender_chat`], [`Derenderer::derender_completion`];
//! * wire, stateless streaming (one call per generate event, state carried by the client):
//!   [`Derenderer::derender_chat_stream`], [`Derenderer::derender_completion_stream`] — the
//!   state format is documented in [`crate::protocol::derender`];
//! * in-process (integrated server, no JSON round trip): [`Derenderer::chat_response`] turns
//!   (chat request, generated choices) into a `ChatCompletionResponse`, and
//!   [`Derenderer::chat_stream`] / [`Derenderer::completion_stream`] return per-choice
//!   streaming states ([`ChatDerenderStream`], [`CompletionDerenderStream`]) whose `push` costs
//!   work proportional to the pushed chunk.
//!
//! Every bound of §6.1 is checked before any decode or parse ([`Derenderer::check_choices`]).
//! Caller-supplied counts go through checked arithmetic; nothing here panics on input.
mod logprobs;
pub(crate) mod stream;

pub use stream::{ChatDerenderStream, CompletionDerenderStream};

use crate::detokenizer::{
    token_byte_encoding, DetokenizeOptions, IncrementalDetokenizer, TokenByteEncoding,
};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::protocol::{
    ChatChoice, ChatCompletionLogProbs, ChatCompletionRequest, ChatCompletionResponse,
    ChoiceLogProbs, CompletionChoice, CompletionLogProbs, CompletionRequest, CompletionResponse,
    DerenderChatRequest, DerenderCompletionRequest, GenerateChoice, GenerateResponse,
    ResponseFunction, ResponseMessage, ResponseToolCall, StopReason, UsageInfo,
};
use crate::stop::StopStringMatcher;
use aphro_parsers::{ParserConfig, ParserRegistry, StreamParser, ToolChoice};
use logprobs::TokenShow;
use serde_json::Value;
use std::borrow::Borrow;
use std::sync::Arc;

/// vLLM's `VLLM_MAX_N_SEQUENCES`.
pub const MAX_N_SEQUENCES: usize = 16384;
/// Prompt ids decoded for the parsers' look-back (an open `<think>` at the end of the prompt).
pub const PROMPT_TAIL_IDS: usize = 128;

/// Server-level settings of a [`Derenderer`].
#[derive(Debug, Clone)]
pub struct DerenderOptions {
    /// Served model name (default: the model's name).
    pub served_model_name: Option<String>,
    /// `--tool-call-parser`.
    pub tool_call_parser: Option<String>,
    /// `--reasoning-parser`.
    pub reasoning_parser: Option<String>,
    /// `--enable-auto-tool-choice`.
    pub enable_auto_tool_choice: bool,
    /// Context length (default: the model's, else 4096).
    pub max_model_len: Option<usize>,
    /// `--max-logprobs` (default 20; -1 = unlimited).
    pub max_logprobs: i64,
    /// `--return-tokens-as-token-ids`: the default of a request's `return_tokens_as_token_ids`.
    pub return_tokens_as_token_ids: bool,
}

impl Default for DerenderOptions {
    fn default() -> Self {
        Self {
            served_model_name: None,
            tool_call_parser: None,
            reasoning_parser: None,
            enable_auto_tool_choice: false,
            max_model_len: None,
            max_logprobs: 20,
            return_tokens_as_token_ids: false,
        }
    }
}

/// `Borrow<Tokenizer>` over a shared model, so streaming states own their detokenizer.
#[derive(Clone, Debug)]
pub(crate) struct ModelTok(pub Arc<Model>);

impl Borrow<tokenizers::Tokenizer> for ModelTok {
    fn borrow(&self) -> &tokenizers::Tokenizer {
        self.0.tokenizer.hf()
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub model: Arc<Model>,
    pub opts: DerenderOptions,
    pub served: String,
    pub max_model_len: usize,
    pub encoding: TokenByteEncoding,
    pub registry: ParserRegistry,
    /// The tokenizer's own EOS (`stop_reason` stays null for it).
    pub primary_eos: Option<u32>,
    /// Live wire-streaming states, so a stream's next call resumes in O(chunk) (see
    /// [`stream::LiveStreams`]).
    pub live: std::sync::Mutex<stream::LiveStreams>,
}

/// Token ids → OpenAI responses. Cheap to clone (shared inner).
#[derive(Debug, Clone)]
pub struct Derenderer {
    inner: Arc<Inner>,
}

/// Per-request settings resolved from the chat request (shared by all choices).
#[derive(Debug, Clone)]
pub struct ChatContext {
    pub(crate) parser_cfg: Option<ParserConfig>,
    pub(crate) named: bool,
    pub(crate) forced: bool,
    pub(crate) keep_tools: bool,
    pub(crate) include_reasoning: bool,
    pub(crate) parallel: bool,
    pub(crate) hide: bool,
    pub(crate) detok: DetokenizeOptions,
    pub(crate) stop: StopStringMatcher,
    pub(crate) stop_token_ids: Vec<u32>,
    pub(crate) ignore_eos: bool,
    pub(crate) include_stop_str: bool,
    pub(crate) top_logprobs: i64,
    pub(crate) as_ids: bool,
    pub(crate) return_token_ids: bool,
    /// `echo`: the text put before every choice's content.
    pub(crate) echo: Option<String>,
}

/// Per-request settings of a completion derender.
#[derive(Debug, Clone)]
pub struct CompletionContext {
    pub(crate) detok: DetokenizeOptions,
    pub(crate) stop: StopStringMatcher,
    pub(crate) stop_token_ids: Vec<u32>,
    pub(crate) ignore_eos: bool,
    pub(crate) include_stop_str: bool,
    pub(crate) logprobs: i64,
    /// `logprob_token_ids`: every candidate of a position is shown.
    pub(crate) all_candidates: bool,
    pub(crate) as_ids: bool,
    pub(crate) return_token_ids: bool,
}

/// What `echo` puts before one prompt's completion choices (vLLM's completion serving).
#[derive(Debug, Clone)]
pub(crate) struct EchoPrompt {
    /// The prompt's text: the string sent, or the decoded ids of a token prompt; `""` with
    /// `return_token_ids`.
    text: String,
    ids: Vec<u32>,
    /// `max_tokens: 0`: the prompt alone; the one token generated for it is left out.
    only_prompt: bool,
}

impl EchoPrompt {
    /// A choice's text with the echo in front (the prompt alone with `only_prompt`).
    pub(crate) fn text_before(&self, generated: &str) -> String {
        if self.only_prompt {
            self.text.clone()
        } else {
            format!("{}{generated}", self.text)
        }
    }
}

/// The text of prompt `i` of a completion request, when it was sent as text.
fn prompt_text(p: &crate::protocol::PromptInput, i: usize) -> Option<&str> {
    use crate::protocol::PromptInput;
    match p {
        PromptInput::Text(s) if i == 0 => Some(s),
        PromptInput::Texts(v) => v.get(i).map(String::as_str),
        _ => None,
    }
}

/// The content `echo` puts before a chat answer (vLLM's chat serving): the last message's
/// content when its role is the answer's role (the last message's own role when
/// `add_generation_prompt` is off, else `assistant`); text parts are joined with newlines.
pub fn chat_echo_text(req: &ChatCompletionRequest) -> Option<String> {
    if !req.echo {
        return None;
    }
    let role = if req.add_generation_prompt() {
        "assistant"
    } else {
        req.messages.last().map_or("assistant", |m| m.role.as_str())
    };
    let text = match req.messages.last() {
        Some(m) if m.role == role => match &m.content {
            Some(crate::protocol::MessageContent::Text(t)) => t.clone(),
            Some(crate::protocol::MessageContent::Parts(parts)) => parts
                .iter()
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join("\n"),
            None => String::new(),
        },
        _ => String::new(),
    };
    Some(text)
}

pub(crate) fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn ids_from_i64(v: Option<&Vec<i64>>) -> Vec<u32> {
    v.map(|v| v.iter().filter_map(|&i| u32::try_from(i).ok()).collect())
        .unwrap_or_default()
}

/// What the per-choice stop handling decided.
pub(crate) struct StopOutcome {
    pub keep: usize,
    pub stop_reason: Option<StopReason>,
}

impl Derenderer {
    /// Builds the derenderer for `model`. Unknown parser names are an error here (startup), not
    /// per request.
    pub fn new(model: Arc<Model>, opts: DerenderOptions) -> Result<Self> {
        let registry = ParserRegistry::new();
        if let Some(t) = &opts.tool_call_parser {
            if !registry.has_tool_parser(t) {
                return Err(Error::ModelFiles(format!("unknown tool call parser {t:?}")));
            }
        }
        if let Some(r) = &opts.reasoning_parser {
            if !registry.has_reasoning_parser(r) {
                return Err(Error::ModelFiles(format!("unknown reasoning parser {r:?}")));
            }
        }
        let served = opts
            .served_model_name
            .clone()
            .unwrap_or_else(|| model.name.clone());
        let max_model_len = opts.max_model_len.or(model.max_model_len).unwrap_or(4096);
        let encoding = token_byte_encoding(model.tokenizer.hf());
        let primary_eos = model
            .special_tokens
            .get("eos_token")
            .and_then(|v| match v {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => o.get("content").and_then(Value::as_str),
                _ => None,
            })
            .and_then(|s| model.tokenizer.token_to_id(s))
            .or_else(|| model.eos_token_ids.first().copied());
        Ok(Self {
            inner: Arc::new(Inner {
                model,
                opts,
                served,
                max_model_len,
                encoding,
                registry,
                primary_eos,
                live: std::sync::Mutex::new(stream::LiveStreams::default()),
            }),
        })
    }

    pub fn model(&self) -> &Model {
        &self.inner.model
    }

    pub fn served_model_name(&self) -> &str {
        &self.inner.served
    }

    pub fn max_model_len(&self) -> usize {
        self.inner.max_model_len
    }

    /// True when a tool or reasoning parser is configured.
    pub fn has_parser(&self) -> bool {
        self.inner.opts.tool_call_parser.is_some() || self.inner.opts.reasoning_parser.is_some()
    }

    /// Unknown served model → 404; returns the name to report.
    pub fn check_model(&self, model: Option<&str>) -> Result<String> {
        match model {
            None => Ok(self.inner.served.clone()),
            Some(m) if m == self.inner.served => Ok(m.to_owned()),
            Some(m) => Err(Error::ModelNotFound(m.to_owned())),
        }
    }

    /// `skip_special_tokens` when the request leaves it out: the model's generation config,
    /// else true (vLLM's default sampling params).
    fn default_skip_special_tokens(&self) -> bool {
        self.inner
            .model
            .generation_defaults
            .skip_special_tokens
            .unwrap_or(true)
    }

    fn show(&self, as_ids: bool) -> TokenShow<'_> {
        TokenShow {
            tokenizer: self.inner.model.tokenizer.hf(),
            encoding: self.inner.encoding,
            as_ids,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Bounds (§6.1), all before any decode or parse.

    /// Checks the §6.1 bounds of a set of choices: count, per-choice `token_ids` (non-empty
    /// unless `allow_empty`, ≤ max_model_len) and logprob sizes.
    pub fn check_choices(&self, choices: &[GenerateChoice], allow_empty: bool) -> Result<()> {
        let mml = self.inner.max_model_len;
        if choices.len() > MAX_N_SEQUENCES {
            return Err(Error::bad_request(format!(
                "too many choices: {} (the limit is {MAX_N_SEQUENCES})",
                choices.len()
            )));
        }
        for (i, c) in choices.iter().enumerate() {
            let n = c.token_ids.as_ref().map_or(0, Vec::len);
            if n == 0 && !allow_empty {
                return Err(Error::bad_request(format!(
                    "choice {i} has empty or null token_ids"
                )));
            }
            if n > mml {
                return Err(Error::bad_request(format!(
                    "choice {i} has {n} token_ids, more than max_model_len={mml}"
                )));
            }
            self.check_in_vocab(c.token_ids.as_deref().unwrap_or_default())?;
            if matches!(c.logprobs, Some(ChoiceLogProbs::Chat(_))) {
                return Err(Error::bad_request(format!(
                    "choice {i} has chat-shaped logprobs; derender reads the tokens shape \
                     (output_mode \"tokens\": token_id, logprob, rank, top_logprobs)"
                )));
            }
            if let Some(content) = c
                .logprobs
                .as_ref()
                .and_then(ChoiceLogProbs::tokens)
                .and_then(|l| l.content.as_ref())
            {
                if content.len() > mml {
                    return Err(Error::bad_request(format!(
                        "choice {i} has {} logprobs entries, more than max_model_len={mml}",
                        content.len()
                    )));
                }
                let max = self.inner.opts.max_logprobs;
                if max >= 0 {
                    // The sampled token comes first and may be outside the top k: k + 1.
                    let limit = usize::try_from(max).unwrap_or(usize::MAX).saturating_add(1);
                    if let Some(e) = content.iter().find(|e| e.top_logprobs.len() > limit) {
                        return Err(Error::bad_request(format!(
                            "choice {i} has {} top_logprobs in one entry, more than \
                             max_logprobs={max}",
                            e.top_logprobs.len()
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    fn check_prompt_ids(&self, ids: Option<&Vec<u32>>, what: &str) -> Result<()> {
        let mml = self.inner.max_model_len;
        if let Some(ids) = ids {
            if ids.len() > mml {
                return Err(Error::bad_request(format!(
                    "{what} has {} ids, more than max_model_len={mml}",
                    ids.len()
                )));
            }
            self.check_in_vocab(ids)?;
        }
        Ok(())
    }

    /// Ids the tokenizer cannot decode are refused as `/detokenize` refuses them, rather
    /// than decoded to nothing.
    pub(crate) fn check_in_vocab(&self, ids: &[u32]) -> Result<()> {
        let vocab = self.inner.model.tokenizer.vocab_size();
        match ids.iter().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(Error::bad_request(format!(
                "Token id {t} is out of vocabulary"
            ))),
            None => Ok(()),
        }
    }

    fn check_generate_response(&self, g: &GenerateResponse, allow_empty: bool) -> Result<()> {
        if let Some(m) = g.output_mode.as_deref() {
            if m != "tokens" {
                return Err(Error::validation(
                    format!(
                        "1 validation error:\n  generate_response.output_mode: Input should be \
                         'tokens' (got '{m}')"
                    ),
                    Some("body.generate_response.output_mode"),
                ));
            }
        }
        self.check_choices(&g.choices, allow_empty)?;
        if let Some(pl) = &g.prompt_logprobs {
            if pl.len() > self.inner.max_model_len {
                return Err(Error::bad_request(format!(
                    "prompt_logprobs has {} entries, more than max_model_len={}",
                    pl.len(),
                    self.inner.max_model_len
                )));
            }
        }
        self.check_prompt_ids(g.prompt_token_ids.as_ref(), "prompt_token_ids")
    }

    // -----------------------------------------------------------------------------------------
    // Contexts.

    /// Resolves the per-request chat settings. `prompt_ids` feed the parsers' look-back (only
    /// the last [`PROMPT_TAIL_IDS`] are decoded).
    pub fn chat_context(
        &self,
        req: Option<&ChatCompletionRequest>,
        prompt_ids: Option<&[u32]>,
    ) -> Result<ChatContext> {
        let has_parser = self.has_parser();
        let Some(req) = req else {
            if has_parser {
                return Err(Error::bad_request(
                    "chat_request is required when a tool or reasoning parser is configured \
                     because plain detokenization would leak raw parser markup into content.",
                ));
            }
            return Ok(ChatContext {
                parser_cfg: None,
                named: false,
                forced: false,
                keep_tools: false,
                include_reasoning: true,
                parallel: true,
                hide: false,
                detok: DetokenizeOptions::default(),
                stop: StopStringMatcher::new(Vec::new(), false, 0),
                stop_token_ids: Vec::new(),
                ignore_eos: false,
                include_stop_str: false,
                top_logprobs: 0,
                as_ids: false,
                return_token_ids: false,
                echo: None,
            });
        };
        let tool_choice = ToolChoice::from_json(req.tool_choice.as_ref()).map_err(|e| {
            Error::invalid_param(
                format!("invalid tool_choice: {e}"),
                "tool_choice",
                req.tool_choice
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            )
        })?;
        let tools: Vec<Value> = req
            .tools
            .as_ref()
            .map(|t| {
                t.iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect()
            })
            .unwrap_or_default();
        let named = matches!(tool_choice, ToolChoice::Named(_));
        let forced = named || tool_choice == ToolChoice::Required;
        let auto_ok = self.inner.opts.enable_auto_tool_choice && !tools.is_empty();
        let keep_tools = self.inner.opts.tool_call_parser.is_some()
            && (forced || (tool_choice == ToolChoice::Auto && auto_ok));
        // "auto" without --enable-auto-tool-choice / tools: no extraction (engine-style parsers
        // still strip their markup, as with "none").
        let effective = if tool_choice == ToolChoice::Auto && !auto_ok {
            ToolChoice::None
        } else {
            tool_choice
        };
        let parallel = req.parallel_tool_calls.unwrap_or(true);
        let parser_cfg = has_parser.then(|| {
            let prompt_text = prompt_ids.map(|ids| {
                let tail = &ids[ids.len().saturating_sub(PROMPT_TAIL_IDS)..];
                crate::detokenizer::decode(self.inner.model.tokenizer.hf(), tail, false)
            });
            let history_tool_calls = req
                .messages
                .iter()
                .filter(|m| m.role == "assistant")
                .map(|m| m.tool_calls.as_ref().map_or(0, Vec::len))
                .sum();
            ParserConfig {
                tools,
                tool_choice: effective,
                parallel_tool_calls: parallel,
                chat_template_kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
                prompt_text,
                history_tool_calls,
            }
        });
        let skip = if has_parser {
            false
        } else {
            req.skip_special_tokens
                .unwrap_or_else(|| self.default_skip_special_tokens())
        };
        let detok = DetokenizeOptions {
            skip_special_tokens: skip,
            spaces_between_special_tokens: req.spaces_between_special_tokens || skip,
        };
        let stops = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
        let min_tokens = usize::try_from(req.min_tokens).unwrap_or(0);
        Ok(ChatContext {
            parser_cfg,
            named,
            forced,
            keep_tools,
            include_reasoning: req.include_reasoning,
            parallel,
            hide: has_parser && !req.include_reasoning,
            detok,
            stop: StopStringMatcher::new(stops, req.include_stop_str_in_output, min_tokens),
            stop_token_ids: ids_from_i64(req.stop_token_ids.as_ref()),
            ignore_eos: req.ignore_eos,
            include_stop_str: req.include_stop_str_in_output,
            top_logprobs: if req.logprobs {
                req.top_logprobs.unwrap_or(0)
            } else {
                0
            },
            as_ids: req
                .return_tokens_as_token_ids
                .unwrap_or(self.inner.opts.return_tokens_as_token_ids),
            return_token_ids: req.return_token_ids.unwrap_or(false),
            echo: chat_echo_text(req),
        })
    }

    /// Resolves the per-request completion settings.
    pub fn completion_context(&self, req: Option<&CompletionRequest>) -> CompletionContext {
        match req {
            None => CompletionContext {
                detok: DetokenizeOptions::default(),
                stop: StopStringMatcher::new(Vec::new(), false, 0),
                stop_token_ids: Vec::new(),
                ignore_eos: false,
                include_stop_str: false,
                logprobs: 0,
                all_candidates: false,
                as_ids: false,
                return_token_ids: false,
            },
            Some(r) => {
                let skip = r
                    .skip_special_tokens
                    .unwrap_or_else(|| self.default_skip_special_tokens());
                let stops = r.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
                CompletionContext {
                    detok: DetokenizeOptions {
                        skip_special_tokens: skip,
                        spaces_between_special_tokens: r.spaces_between_special_tokens || skip,
                    },
                    stop: StopStringMatcher::new(
                        stops,
                        r.include_stop_str_in_output,
                        usize::try_from(r.min_tokens).unwrap_or(0),
                    ),
                    stop_token_ids: ids_from_i64(r.stop_token_ids.as_ref()),
                    ignore_eos: r.ignore_eos,
                    include_stop_str: r.include_stop_str_in_output,
                    logprobs: r.logprobs.unwrap_or(0),
                    all_candidates: r.logprob_token_ids.is_some(),
                    as_ids: r
                        .return_tokens_as_token_ids
                        .unwrap_or(self.inner.opts.return_tokens_as_token_ids),
                    return_token_ids: r.return_token_ids.unwrap_or(false),
                }
            }
        }
    }

    pub(crate) fn new_parser(&self, cfg: &ParserConfig) -> Result<Box<dyn StreamParser>> {
        self.inner
            .registry
            .new_parser(
                self.inner.opts.tool_call_parser.as_deref(),
                self.inner.opts.reasoning_parser.as_deref(),
                cfg,
            )
            .map_err(|e| Error::bad_request(format!("cannot build the parser: {e}")))
    }

    /// The parser of a suspended stream, from its snapshot (`400` if the snapshot does not fit
    /// the configured parsers).
    pub(crate) fn restore_parser(
        &self,
        cfg: &ParserConfig,
        snap: aphro_parsers::ParserSnapshot,
    ) -> Result<Box<dyn StreamParser>> {
        self.inner
            .registry
            .restore(
                self.inner.opts.tool_call_parser.as_deref(),
                self.inner.opts.reasoning_parser.as_deref(),
                cfg,
                snap,
            )
            .map_err(|e| Error::bad_request(format!("invalid stream_state: {e}")))
    }

    /// §6.1 step 1: which ids to decode, and the resulting `stop_reason`.
    pub(crate) fn stop_token(
        &self,
        ids: &[u32],
        finish: Option<&str>,
        stop_reason: Option<&StopReason>,
        stop_token_ids: &[u32],
        ignore_eos: bool,
        include_stop_str: bool,
    ) -> StopOutcome {
        let mut out = StopOutcome {
            keep: ids.len(),
            stop_reason: stop_reason.cloned(),
        };
        if finish != Some("stop") || include_stop_str {
            return out;
        }
        let Some(&last) = ids.last() else {
            return out;
        };
        match stop_reason {
            Some(StopReason::Text(_)) => {}
            Some(StopReason::Token(t)) => {
                if last == *t {
                    out.keep -= 1;
                }
            }
            None => {
                if !ignore_eos && self.inner.primary_eos == Some(last) {
                    out.keep -= 1;
                } else if stop_token_ids.contains(&last)
                    || self.inner.model.eos_token_ids.contains(&last)
                {
                    out.keep -= 1;
                    out.stop_reason = Some(StopReason::Token(last));
                }
            }
        }
        out
    }

    /// Decodes `ids` (seeded with the prompt tail) into per-token texts; the held-back tail is
    /// appended to the last one.
    pub(crate) fn decode_texts(
        &self,
        ids: &[u32],
        prompt_ids: Option<&[u32]>,
        opts: DetokenizeOptions,
    ) -> Vec<String> {
        let tok = self.inner.model.tokenizer.hf();
        let mut d = match prompt_ids {
            Some(p) => IncrementalDetokenizer::seeded(tok, p, opts),
            None => IncrementalDetokenizer::new(tok, opts),
        };
        let mut texts: Vec<String> = ids.iter().map(|&i| d.push(i).unwrap_or_default()).collect();
        let tail = d.finish();
        if !tail.is_empty() {
            match texts.last_mut() {
                Some(t) => t.push_str(&tail),
                None => texts.push(tail),
            }
        }
        texts
    }

    /// §6.1 step 3 on a complete text.
    fn apply_stop_strings(
        stop: &StopStringMatcher,
        include_stop_str: bool,
        texts: &[String],
        finish: Option<&str>,
        stop_reason: &mut Option<StopReason>,
    ) -> String {
        match stop_reason {
            Some(StopReason::Text(s)) if !s.is_empty() => {
                let text: String = texts.concat();
                match text.rfind(s.as_str()) {
                    Some(p) => {
                        let end = if include_stop_str { p + s.len() } else { p };
                        text[..end].to_owned()
                    }
                    None => text,
                }
            }
            None if finish == Some("stop") && !stop.stops().is_empty() => {
                let (text, matched) = stop.apply_all(texts.iter().map(String::as_str));
                if let Some(m) = matched {
                    *stop_reason = Some(StopReason::Text(m));
                }
                text
            }
            _ => texts.concat(),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Chat, non-streaming.

    /// `POST /v1/chat/completions/derender` (non-streaming, §6.1).
    pub fn derender_chat(&self, req: DerenderChatRequest) -> Result<ChatCompletionResponse> {
        let model = self.check_model(req.model.as_deref())?;
        if req.stream {
            return Err(Error::validation(
                "1 validation error:\n  stream: this body is not a streaming request",
                Some("body.stream"),
            ));
        }
        let g = req.generate_response;
        self.check_generate_response(&g, false)?;
        self.check_prompt_ids(req.prompt_token_ids.as_ref(), "prompt_token_ids")?;
        let prompt_ids = req
            .prompt_token_ids
            .as_deref()
            .or(g.prompt_token_ids.as_deref());
        let ctx = self.chat_context(req.chat_request.as_ref(), prompt_ids)?;
        let want_prompt_ids = req
            .chat_request
            .as_ref()
            .and_then(|r| r.return_token_ids)
            .unwrap_or(false);
        let mut resp = self.chat_response_with(
            &ctx,
            g.request_id,
            model,
            prompt_ids,
            req.prompt_tokens.unwrap_or(0),
            &g.choices,
        )?;
        resp.prompt_logprobs = g.prompt_logprobs;
        resp.prompt_token_ids = if want_prompt_ids {
            g.prompt_token_ids
        } else {
            None
        };
        resp.kv_transfer_params = g.kv_transfer_params;
        resp.metrics = g.metrics;
        Ok(resp)
    }

    /// In-process chat derender (integrated server, generate `output_mode: "derender"`):
    /// (chat request, generated choices) → `ChatCompletionResponse`. Runs the §6.1 bounds first.
    /// `id` and `prompt_tokens` are the caller's; passthrough fields are left null.
    pub fn chat_response(
        &self,
        req: Option<&ChatCompletionRequest>,
        id: String,
        prompt_ids: Option<&[u32]>,
        prompt_tokens: u64,
        choices: &[GenerateChoice],
    ) -> Result<ChatCompletionResponse> {
        self.check_choices(choices, false)?;
        let ctx = self.chat_context(req, prompt_ids)?;
        let model = req
            .and_then(|r| r.model.clone())
            .unwrap_or_else(|| self.inner.served.clone());
        self.chat_response_with(&ctx, id, model, prompt_ids, prompt_tokens, choices)
    }

    fn chat_response_with(
        &self,
        ctx: &ChatContext,
        id: String,
        model: String,
        prompt_ids: Option<&[u32]>,
        prompt_tokens: u64,
        choices: &[GenerateChoice],
    ) -> Result<ChatCompletionResponse> {
        let usage = usage(prompt_tokens, choices)?;
        let out = choices
            .iter()
            .map(|c| self.chat_choice(ctx, c, prompt_ids))
            .collect::<Result<Vec<_>>>()?;
        Ok(ChatCompletionResponse {
            id,
            object: "chat.completion".into(),
            created: now_unix(),
            model,
            choices: out,
            service_tier: None,
            system_fingerprint: None,
            usage,
            prompt_logprobs: None,
            prompt_token_ids: None,
            prompt_text: None,
            kv_transfer_params: None,
            ec_transfer_params: None,
            metrics: None,
        })
    }

    /// One choice of §6.1 steps 1–6.
    pub fn chat_choice(
        &self,
        ctx: &ChatContext,
        c: &GenerateChoice,
        prompt_ids: Option<&[u32]>,
    ) -> Result<ChatChoice> {
        let ids: &[u32] = c.token_ids.as_deref().unwrap_or(&[]);
        let finish = c.finish_reason.as_deref();
        let st = self.stop_token(
            ids,
            finish,
            c.stop_reason.as_ref(),
            &ctx.stop_token_ids,
            ctx.ignore_eos,
            ctx.include_stop_str,
        );
        let kept = &ids[..st.keep];
        let mut stop_reason = st.stop_reason;
        let texts = self.decode_texts(kept, prompt_ids, ctx.detok);
        let text = Self::apply_stop_strings(
            &ctx.stop,
            ctx.include_stop_str,
            &texts,
            finish,
            &mut stop_reason,
        );
        let (message, has_calls) = match &ctx.parser_cfg {
            Some(cfg) => {
                let mut p = self.new_parser(cfg)?;
                let parsed = aphro_parsers::parse(p.as_mut(), &text);
                assemble(ctx, parsed)
            }
            None => (ResponseMessage::assistant(Some(text)), false),
        };
        let mut message = message;
        if let Some(echo) = &ctx.echo {
            message.content = Some(format!("{echo}{}", message.content.unwrap_or_default()));
        }
        let finish_reason = map_finish(finish, has_calls, ctx.named);
        let logprobs = if ctx.hide {
            None
        } else {
            c.logprobs
                .as_ref()
                .and_then(ChoiceLogProbs::tokens)
                .and_then(|l| l.content.as_ref())
                .map(|content| {
                    let show = self.show(ctx.as_ids);
                    let mut lp_ctx = Vec::new();
                    ChatCompletionLogProbs {
                        content: Some(
                            content
                                .iter()
                                .take(kept.len())
                                .map(|e| {
                                    logprobs::chat_entry(&show, e, ctx.top_logprobs, &mut lp_ctx)
                                })
                                .collect(),
                        ),
                    }
                })
        };
        Ok(ChatChoice {
            index: c.index,
            message,
            logprobs,
            finish_reason: Some(finish_reason),
            stop_reason,
            token_ids: (ctx.return_token_ids && !ctx.hide).then(|| ids.to_vec()),
            routed_experts: c.routed_experts.clone(),
            weight_versions: c.weight_versions.clone(),
        })
    }

    // -----------------------------------------------------------------------------------------
    // Completions, non-streaming.

    /// `POST /v1/completions/derender` (non-streaming, §7).
    pub fn derender_completion(
        &self,
        req: DerenderCompletionRequest,
    ) -> Result<CompletionResponse> {
        let model = self.check_model(req.model.as_deref())?;
        let n = req.generate_responses.len();
        if n == 0 {
            return Err(Error::validation(
                "1 validation error:\n  generate_responses: List should have at least 1 item",
                Some("body.generate_responses"),
            ));
        }
        if n > MAX_N_SEQUENCES {
            return Err(Error::bad_request(format!(
                "too many generate_responses: {n} (the limit is {MAX_N_SEQUENCES})"
            )));
        }
        if req.prompt_tokens.as_ref().is_some_and(|p| p.len() != n) {
            return Err(Error::validation(
                "1 validation error:\n  prompt_tokens must have the same length as \
                 generate_responses",
                Some("body.prompt_tokens"),
            ));
        }
        if req.prompt_token_ids.as_ref().is_some_and(|p| p.len() != n) {
            return Err(Error::validation(
                "1 validation error:\n  prompt_token_ids must have the same length as \
                 generate_responses",
                Some("body.prompt_token_ids"),
            ));
        }
        let mut total_choices = 0usize;
        for g in &req.generate_responses {
            self.check_generate_response(g, false)?;
            total_choices = total_choices.saturating_add(g.choices.len());
        }
        if total_choices > MAX_N_SEQUENCES {
            return Err(Error::bad_request(format!(
                "too many choices: {total_choices} (the limit is {MAX_N_SEQUENCES})"
            )));
        }
        for p in req.prompt_token_ids.iter().flatten() {
            self.check_prompt_ids(p.as_ref(), "prompt_token_ids")?;
        }
        let ctx = self.completion_context(req.completion_request.as_ref());
        let mut prompt_sum: u64 = 0;
        for p in req.prompt_tokens.iter().flatten() {
            prompt_sum = prompt_sum.checked_add(*p).ok_or_else(|| {
                Error::invalid_param("prompt_tokens overflow", "prompt_tokens", p)
            })?;
        }
        let mut completion_sum: u64 = 0;
        let mut choices = Vec::with_capacity(total_choices);
        for (gi, g) in req.generate_responses.iter().enumerate() {
            let prompt_ids = req
                .prompt_token_ids
                .as_ref()
                .and_then(|v| v.get(gi))
                .and_then(Option::as_deref)
                .or(g.prompt_token_ids.as_deref());
            let echo = self.echo_prompt(req.completion_request.as_ref(), gi, prompt_ids)?;
            for c in &g.choices {
                let n = c.token_ids.as_ref().map_or(0, Vec::len) as u64;
                completion_sum = completion_sum
                    .checked_add(n)
                    .ok_or_else(|| Error::bad_request("completion token count overflow"))?;
                let mut choice = self.completion_choice(&ctx, c, prompt_ids);
                choice.index = choices.len();
                if let Some(e) = &echo {
                    self.apply_echo(&ctx, e, g.prompt_logprobs.as_deref(), &mut choice)?;
                }
                choice.prompt_logprobs.clone_from(&g.prompt_logprobs);
                if ctx.return_token_ids {
                    choice.prompt_token_ids = g.prompt_token_ids.clone();
                }
                choices.push(choice);
            }
        }
        let total = prompt_sum
            .checked_add(completion_sum)
            .ok_or_else(|| Error::invalid_param("usage overflow", "prompt_tokens", prompt_sum))?;
        let first = &req.generate_responses[0];
        let kv = if req
            .generate_responses
            .iter()
            .all(|g| g.kv_transfer_params == first.kv_transfer_params)
        {
            first.kv_transfer_params.clone()
        } else {
            None
        };
        Ok(CompletionResponse {
            id: first.request_id.clone(),
            object: "text_completion".into(),
            created: now_unix(),
            model,
            choices,
            service_tier: None,
            system_fingerprint: None,
            usage: UsageInfo {
                prompt_tokens: prompt_sum,
                total_tokens: total,
                completion_tokens: Some(completion_sum),
                prompt_tokens_details: None,
                completion_tokens_details: None,
            },
            kv_transfer_params: kv,
            metrics: if n == 1 { first.metrics.clone() } else { None },
        })
    }

    /// One completion choice (no parsers).
    pub fn completion_choice(
        &self,
        ctx: &CompletionContext,
        c: &GenerateChoice,
        prompt_ids: Option<&[u32]>,
    ) -> CompletionChoice {
        let ids: &[u32] = c.token_ids.as_deref().unwrap_or(&[]);
        let finish = c.finish_reason.as_deref();
        let st = self.stop_token(
            ids,
            finish,
            c.stop_reason.as_ref(),
            &ctx.stop_token_ids,
            ctx.ignore_eos,
            ctx.include_stop_str,
        );
        let kept = &ids[..st.keep];
        let mut stop_reason = st.stop_reason;
        let texts = self.decode_texts(kept, prompt_ids, ctx.detok);
        let text = Self::apply_stop_strings(
            &ctx.stop,
            ctx.include_stop_str,
            &texts,
            finish,
            &mut stop_reason,
        );
        let logprobs = c
            .logprobs
            .as_ref()
            .and_then(ChoiceLogProbs::tokens)
            .and_then(|l| l.content.as_ref())
            .map(|content| {
                let mut out = CompletionLogProbs::default();
                let mut offset = 0u64;
                let take = content.len().min(kept.len());
                logprobs::completion_entries(
                    &self.show(ctx.as_ids),
                    &content[..take],
                    ctx.logprobs,
                    &mut offset,
                    &mut out,
                    &mut Vec::new(),
                );
                out
            });
        CompletionChoice {
            index: c.index,
            text,
            logprobs,
            finish_reason: Some(finish.unwrap_or("stop").to_owned()),
            stop_reason,
            token_ids: ctx.return_token_ids.then(|| ids.to_vec()),
            prompt_logprobs: None,
            prompt_token_ids: None,
            routed_experts: c.routed_experts.clone(),
            weight_versions: c.weight_versions.clone(),
        }
    }

    /// The echo of prompt `index` of `req`, or `None` without `echo`.
    pub(crate) fn echo_prompt(
        &self,
        req: Option<&CompletionRequest>,
        index: usize,
        prompt_ids: Option<&[u32]>,
    ) -> Result<Option<EchoPrompt>> {
        let Some(r) = req.filter(|r| r.echo) else {
            return Ok(None);
        };
        let ids = prompt_ids.ok_or_else(|| {
            Error::bad_request("echo=true needs the prompt's token ids (prompt_token_ids).")
        })?;
        let text = if r.return_token_ids.unwrap_or(false) {
            String::new()
        } else {
            match r.prompt.as_ref().and_then(|p| prompt_text(p, index)) {
                Some(t) => t.to_owned(),
                None => crate::detokenizer::decode(self.inner.model.tokenizer.hf(), ids, false),
            }
        };
        Ok(Some(EchoPrompt {
            text,
            ids: ids.to_vec(),
            only_prompt: r.max_tokens == Some(0),
        }))
    }

    /// Puts the echoed prompt before a completion choice: its text before the text and, when
    /// logprobs were asked for, its positions (from `prompt_logprobs`) before the generated
    /// ones. With `only_prompt` the generated token is dropped from both.
    fn apply_echo(
        &self,
        ctx: &CompletionContext,
        e: &EchoPrompt,
        prompt_logprobs: Option<&[Value]>,
        choice: &mut CompletionChoice,
    ) -> Result<()> {
        choice.text = e.text_before(&choice.text);
        if let Some(generated) = choice.logprobs.take() {
            let (mut out, offset) =
                self.echo_logprobs(ctx, e, prompt_logprobs, CompletionLogProbs::default(), 0)?;
            if !e.only_prompt {
                append_shifted(&mut out, generated, offset);
            }
            choice.logprobs = Some(out);
        }
        Ok(())
    }

    /// The prompt positions of an echo appended to `out`, starting at text offset `offset`;
    /// returns `out` and the offset after them.
    pub(crate) fn echo_logprobs(
        &self,
        ctx: &CompletionContext,
        e: &EchoPrompt,
        prompt_logprobs: Option<&[Value]>,
        mut out: CompletionLogProbs,
        mut offset: u64,
    ) -> Result<(CompletionLogProbs, u64)> {
        let pl = prompt_logprobs.ok_or_else(|| {
            Error::bad_request(
                "echo=true with logprobs needs the prompt logprobs of the generate response                  (prompt_logprobs).",
            )
        })?;
        logprobs::prompt_completion_entries(
            &self.show(ctx.as_ids),
            &e.ids,
            pl,
            ctx.logprobs,
            ctx.all_candidates,
            &mut offset,
            &mut out,
        );
        Ok((out, offset))
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }
}

/// Appends `more` to `out` with its text offsets moved by `shift`.
fn append_shifted(out: &mut CompletionLogProbs, more: CompletionLogProbs, shift: u64) {
    out.text_offset.extend(
        more.text_offset
            .into_iter()
            .map(|o| o.saturating_add(shift)),
    );
    out.token_logprobs.extend(more.token_logprobs);
    out.tokens.extend(more.tokens);
    out.top_logprobs.extend(more.top_logprobs);
}

/// `usage` of a non-streaming response, with checked sums.
fn usage(prompt_tokens: u64, choices: &[GenerateChoice]) -> Result<UsageInfo> {
    let mut completion: u64 = 0;
    for c in choices {
        let n = c.token_ids.as_ref().map_or(0, Vec::len) as u64;
        completion = completion
            .checked_add(n)
            .ok_or_else(|| Error::bad_request("completion token count overflow"))?;
    }
    let total = prompt_tokens.checked_add(completion).ok_or_else(|| {
        Error::invalid_param(
            "prompt_tokens + completion tokens overflows",
            "prompt_tokens",
            prompt_tokens,
        )
    })?;
    Ok(UsageInfo {
        prompt_tokens,
        total_tokens: total,
        completion_tokens: Some(completion),
        prompt_tokens_details: None,
        completion_tokens_details: None,
    })
}

/// §2.6: `tool_calls` replaces `stop` when calls are returned and tool_choice is not named.
pub(crate) fn map_finish(finish: Option<&str>, has_calls: bool, named: bool) -> String {
    match finish {
        None | Some("stop") if has_calls && !named => "tool_calls".into(),
        None => "stop".into(),
        Some(f) => f.to_owned(),
    }
}

/// §6.1 step 4, message assembly.
fn assemble(ctx: &ChatContext, parsed: aphro_parsers::ParsedMessage) -> (ResponseMessage, bool) {
    let mut calls = if ctx.keep_tools {
        parsed.tool_calls
    } else {
        Vec::new()
    };
    if !ctx.parallel {
        calls.truncate(1);
    }
    // `assemble_chat_message_fields` (chat_completion/message_assembly.py) keeps the parser's
    // content as it is, "" included: whitespace-only content next to tool calls is already
    // `None` from the parser, an empty string stays "". Forced tool choices send `content or ""`.
    let mut content = parsed.content;
    if ctx.forced && content.is_none() {
        content = Some(String::new());
    }
    let has_calls = !calls.is_empty();
    let mut m = ResponseMessage::assistant(content);
    m.reasoning = if ctx.include_reasoning {
        parsed.reasoning
    } else {
        None
    };
    m.tool_calls = calls
        .into_iter()
        .map(|c| ResponseToolCall {
            id: c.id,
            kind: "function".into(),
            function: ResponseFunction {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect();
    (m, has_calls)
}
