//! The Renderer: OpenAI chat/completion request → `GenerateRequest` (`api.md` §3, §5, §10).
use crate::chat_prompt::{ChatPrompter, RenderedChat, ToolArguments};
use crate::content_parts::{ContentCapabilities, Modality};
use crate::error::{Error, Result};
use crate::harmony::{HarmonyOptions, HarmonyRenderer};
use crate::model::{GenerationDefaults, Model, DEFAULT_MAX_MODEL_LEN};
use crate::multimodal::KwargsPayload;
use crate::protocol::*;
use crate::template::{Clock, ContentFormat, SystemClock};
use crate::tokenizer::Tokenizer;
use crate::tool_grammar::{self, GrammarContext};
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Hooks a configured reasoning/tool parser provides at render time (§3, §11).
pub trait RenderHooks: Send + Sync {
    /// `reasoning_ended` for a prompt: `Some(true)` if the prompt already closed reasoning,
    /// `Some(false)` if it is open. Called only when `include_reasoning` is true.
    fn reasoning_ended(
        &self,
        prompt_ids: &[u32],
        chat_template_kwargs: &Map<String, Value>,
    ) -> Option<bool>;
    /// Whether a reasoning parser is configured (then `reasoning_parser_kwargs` is emitted).
    fn has_reasoning_parser(&self) -> bool;
    /// Tool parsers may adjust sampling (e.g. keep special tokens so markers survive).
    fn adjust_sampling_params(&self, _req: &ChatCompletionRequest, _params: &mut SamplingParams) {}
    /// The `--reasoning-parser` name, for the structural tag of [`crate::tool_grammar`].
    fn reasoning_parser(&self) -> Option<&str> {
        None
    }
    /// Where the prompt left reasoning (its last reasoning marker).
    fn prompt_reasoning(&self, _prompt_ids: &[u32]) -> tool_grammar::PromptReasoning {
        tool_grammar::PromptReasoning::Absent
    }
}

/// Renderer configuration.
#[derive(Clone)]
pub struct RenderOptions {
    /// `--chat-template` contents (overrides the model's).
    pub chat_template: Option<String>,
    /// `--chat-template-content-format`.
    pub content_format: ContentFormat,
    pub tool_arguments: ToolArguments,
    /// Clock for `strftime_now`.
    pub clock: Arc<dyn Clock>,
    /// `--max-model-len` (overrides the model files).
    pub max_model_len: Option<usize>,
    /// vLLM's server-default template kwargs, merged under the request's in `parse_context`.
    pub default_chat_template_kwargs: Map<String, Value>,
    /// Served names; `None` accepts any `model` value.
    pub served_model_names: Option<Vec<String>>,
    /// Reasoning/tool parser hooks.
    pub hooks: Option<Arc<dyn RenderHooks>>,
    /// Refuse (400) a `chat_template_kwargs` key or a `reasoning_effort` the chat template
    /// never reads. Off by default: transformers (and so the render goldens) silently drop
    /// such kwargs; the HTTP server turns it on so a client learns its knob does nothing.
    pub strict_template_kwargs: bool,
    /// Size limits checked before tokenization.
    pub limits: crate::limits::RequestLimits,
    /// `--tool-call-parser`. With `enable_auto_tool_choice` it makes tool parsing available;
    /// without, a request whose `tool_choice` needs a parser is refused as vLLM refuses it.
    pub tool_call_parser: Option<String>,
    /// `--enable-auto-tool-choice`.
    pub enable_auto_tool_choice: bool,
    /// The Harmony preamble of gpt-oss prompts (vLLM's `VLLM_SYSTEM_START_DATE` and
    /// `VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS`).
    pub harmony: HarmonyOptions,
    /// The image processor of a vision-language model (`None`: text-only, image parts are
    /// refused as vLLM refuses them).
    pub vision: Option<Arc<crate::multimodal::VisionModel>>,
    /// vLLM's multimodal server flags.
    pub multimodal: crate::multimodal::MultimodalOptions,
    /// Loads `http(s)` / `file` image URLs (`--allowed-media-domains`,
    /// `--allowed-local-media-path`); `None`: only `data:` URLs.
    pub media_fetch: Option<Arc<crate::multimodal::MediaFetcher>>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        let mut kw = Map::new();
        // vLLM 0.33 puts this Cohere key into every model's default kwargs (spec §13).
        kw.insert("cohere_format".into(), Value::String("cmd4".into()));
        Self {
            chat_template: None,
            content_format: ContentFormat::Auto,
            tool_arguments: ToolArguments::Object,
            clock: Arc::new(SystemClock),
            max_model_len: None,
            default_chat_template_kwargs: kw,
            served_model_names: None,
            hooks: None,
            strict_template_kwargs: false,
            limits: crate::limits::RequestLimits::default(),
            // vLLM's defaults; its render path refuses tool choices that need a parser then.
            tool_call_parser: None,
            enable_auto_tool_choice: false,
            harmony: HarmonyOptions::default(),
            vision: None,
            multimodal: crate::multimodal::MultimodalOptions::default(),
            media_fetch: None,
        }
    }
}

impl std::fmt::Debug for RenderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderOptions")
            .field("content_format", &self.content_format)
            .field("max_model_len", &self.max_model_len)
            .field("strict_template_kwargs", &self.strict_template_kwargs)
            .field("tool_call_parser", &self.tool_call_parser)
            .field("enable_auto_tool_choice", &self.enable_auto_tool_choice)
            .finish_non_exhaustive()
    }
}

/// vLLM refuses a request `chat_template` unless `--trust-request-chat-template` is set.
fn untrusted_chat_template() -> Error {
    Error::bad_request(
        "Chat template is passed with request, but --trust-request-chat-template is not set. \
         Refused request with untrusted chat template.",
    )
}

/// Loaded once; `render_*` take `&self` and can be called from many threads.
pub struct Renderer {
    model: Arc<Model>,
    prompter: Option<ChatPrompter>,
    options: RenderOptions,
    max_model_len: usize,
    /// Longest prompt (characters) that is tokenized at all; see [`crate::limits`].
    max_prompt_chars: usize,
    /// gpt-oss: chats render as Harmony, not through the Jinja template (as vLLM does).
    harmony: Option<HarmonyRenderer>,
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renderer")
            .field("model", &self.model.name)
            .field("max_model_len", &self.max_model_len)
            .finish_non_exhaustive()
    }
}

/// The media a model takes: images when a vision processor is configured; otherwise none,
/// and media content parts get vLLM's refusal.
fn supported_modalities(options: &RenderOptions) -> BTreeSet<Modality> {
    if options.vision.is_some() {
        BTreeSet::from([Modality::Image])
    } else {
        BTreeSet::new()
    }
}

/// The `image_url` of each image part of a chat request in prompt order (the `image_url` /
/// `input_image` parts vLLM's parser takes), with the part's `uuid`.
fn chat_image_parts(
    messages: &[crate::protocol::ChatMessage],
) -> Vec<(Option<&str>, Option<&str>)> {
    use crate::protocol::MessageContent;
    let mut out = Vec::new();
    for m in messages {
        let Some(MessageContent::Parts(parts)) = &m.content else {
            continue;
        };
        for part in parts {
            let kind = part.kind.as_deref();
            let is_image = matches!(kind, Some("image_url" | "input_image"))
                || (kind.is_none() && part.extra.contains_key("image_url"));
            if !is_image {
                continue;
            }
            let url = match part.extra.get("image_url") {
                Some(Value::String(u)) => Some(u.as_str()),
                Some(Value::Object(o)) => o.get("url").and_then(Value::as_str),
                _ => None,
            };
            out.push((url, part.extra.get("uuid").and_then(Value::as_str)));
        }
    }
    out
}

/// The image items of a chat request in prompt order: the file each URL names (`data:`
/// URLs decoded, `http(s)` / `file` URLs loaded through `fetcher` when it allows them) and
/// the part's `uuid`.
fn chat_image_inputs(
    messages: &[crate::protocol::ChatMessage],
    fetcher: Option<&crate::multimodal::MediaFetcher>,
) -> Result<Vec<crate::multimodal::ImageInput>> {
    chat_image_parts(messages)
        .into_iter()
        .map(|(url, uuid)| {
            Ok(crate::multimodal::ImageInput {
                file: url
                    .map(|u| crate::multimodal::load_image_url(u, fetcher))
                    .transpose()?,
                uuid: uuid.map(str::to_owned),
            })
        })
        .collect()
}

/// Whether rendering `req` may fetch an image from the network or the disk (an image URL
/// that is not a `data:` URL): the caller should then render on a blocking thread.
pub fn chat_fetches_media(req: &ChatCompletionRequest) -> bool {
    chat_image_parts(&req.messages)
        .into_iter()
        .any(|(url, _)| url.is_some_and(crate::multimodal::fetch::is_remote_url))
}

/// Character offsets of each token in the prompt (`return_token_offsets`).
type Offsets = Vec<(usize, usize)>;
/// A chat prompt's ids, their offsets when asked, and the normalized tools the prompt shows.
type RenderedChatIds = (Vec<u32>, Option<Offsets>, Option<Vec<Value>>);

impl Renderer {
    /// Compiles the template once; errors in it surface here, not per request.
    pub fn new(model: Arc<Model>, options: RenderOptions) -> Result<Self> {
        // Build the fast encoder now, not on the first request.
        model.tokenizer.encoder_backend();
        let source = options
            .chat_template
            .clone()
            .or_else(|| model.chat_template.clone());
        // vLLM names the model in its errors by the first served name, else `--model`.
        let model_name = options
            .served_model_names
            .as_ref()
            .and_then(|n| n.first())
            .unwrap_or(&model.name)
            .clone();
        let capabilities = ContentCapabilities {
            modalities: supported_modalities(&options),
            model_name,
        };
        let prompter = match source {
            Some(src) => Some(
                ChatPrompter::new(
                    &src,
                    model.special_tokens.clone(),
                    options.content_format,
                    options.tool_arguments,
                    options.clock.clone(),
                )?
                .with_capabilities(capabilities),
            ),
            None => None,
        };
        let max_model_len = options
            .max_model_len
            .or(model.max_model_len)
            .unwrap_or(DEFAULT_MAX_MODEL_LEN);
        let harmony = match model.model_type.as_deref() {
            Some("gpt_oss") => Some(HarmonyRenderer::new(
                &model.tokenizer,
                options.harmony.clone(),
            )?),
            _ => None,
        };
        let max_prompt_chars = options
            .limits
            .prompt_chars_limit(max_model_len, &model.tokenizer);
        Ok(Self {
            model,
            prompter,
            options,
            max_model_len,
            max_prompt_chars,
            harmony,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.model.tokenizer
    }

    /// Whether the chat template reads the variable `name` (false without a template).
    pub fn chat_template_reads(&self, name: &str) -> bool {
        self.prompter
            .as_ref()
            .is_some_and(|p| p.template().reads_variable(name))
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    pub fn prompter(&self) -> Option<&ChatPrompter> {
        self.prompter.as_ref()
    }

    /// The longest prompt, in characters, this renderer tokenizes.
    pub fn max_prompt_chars(&self) -> usize {
        self.max_prompt_chars
    }

    /// The text of a chat's messages (content, text parts, reasoning) measured against the
    /// prompt-character limit *before* the template runs: the rendered prompt contains that
    /// text, so a chat over the limit could not fit anyway, and rendering it would cost
    /// several copies of it first.
    fn check_chat_chars(&self, messages: &[crate::protocol::ChatMessage]) -> Result<()> {
        use crate::protocol::MessageContent;
        let each_text = |f: &mut dyn FnMut(&str)| {
            for m in messages {
                match &m.content {
                    Some(MessageContent::Text(t)) => f(t),
                    Some(MessageContent::Parts(parts)) => parts
                        .iter()
                        .filter_map(|p| p.text.as_deref())
                        .for_each(&mut *f),
                    None => {}
                }
                if let Some(r) = &m.reasoning {
                    f(r);
                }
            }
        };
        // Bytes bound chars from above: count chars only when the bytes are over.
        let mut bytes = 0usize;
        each_text(&mut |t| bytes = bytes.saturating_add(t.len()));
        if bytes > self.max_prompt_chars {
            let mut chars = 0usize;
            each_text(&mut |t| chars = chars.saturating_add(t.chars().count()));
            crate::limits::RequestLimits::check_prompt_chars(
                chars,
                self.max_prompt_chars,
                self.max_model_len,
            )?;
        }
        Ok(())
    }

    /// Tokenize `text` unless it is too long to fit the context whatever it tokenizes to.
    fn encode_checked(
        &self,
        text: &str,
        add_special_tokens: bool,
        with_offsets: bool,
    ) -> Result<(Vec<u32>, Option<Offsets>)> {
        // Bytes bound chars from above, so most prompts skip the count.
        if text.len() > self.max_prompt_chars {
            crate::limits::RequestLimits::check_prompt_chars(
                text.chars().count(),
                self.max_prompt_chars,
                self.max_model_len,
            )?;
        }
        if with_offsets {
            let (ids, offsets) = self
                .model
                .tokenizer
                .encode_with_offsets(text, add_special_tokens)?;
            Ok((ids, Some(offsets)))
        } else {
            Ok((self.model.tokenizer.encode(text, add_special_tokens)?, None))
        }
    }

    fn check_model(&self, model: Option<&str>) -> Result<()> {
        if let (Some(names), Some(m)) = (&self.options.served_model_names, model) {
            if !names.iter().any(|n| n == m) {
                return Err(Error::ModelNotFound(m.to_owned()));
            }
        }
        Ok(())
    }

    /// vLLM's `OnlineRenderer.render_chat` check: without a tool parser (which vLLM only
    /// builds with both `--tool-call-parser` and `--enable-auto-tool-choice`), a `tool_choice`
    /// other than `none` cannot be honoured and is refused. gpt-oss (harmony) parses its tool
    /// calls itself and is exempt. `tool_choice` defaults to `auto` when `tools` are given.
    fn check_tool_parsing(&self, req: &ChatCompletionRequest) -> Result<()> {
        let parser_available =
            self.options.tool_call_parser.is_some() && self.options.enable_auto_tool_choice;
        if parser_available || self.harmony.is_some() {
            return Ok(());
        }
        let defaulted = Value::String("auto".into());
        let tool_choice = match &req.tool_choice {
            Some(tc) => tc,
            None if req.tools.is_some() => &defaulted,
            None => return Ok(()),
        };
        let message = match tool_choice {
            Value::String(s) if s == "none" => return Ok(()),
            Value::String(s) if s == "auto" => {
                if self.options.enable_auto_tool_choice {
                    return Ok(());
                }
                "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser \
                 to be set"
                    .to_owned()
            }
            Value::Object(o) => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                format!("tool_choice=function \"{name}\" requires --tool-call-parser to be set")
            }
            Value::String(s) => {
                format!("tool_choice=\"{s}\" requires --tool-call-parser to be set")
            }
            other => format!("tool_choice={other} requires --tool-call-parser to be set"),
        };
        Err(Error::bad_request(message))
    }

    /// Template → prompt string only (no tokenization).
    pub fn render_chat_prompt(&self, req: &ChatCompletionRequest) -> Result<RenderedChat> {
        if req.chat_template.is_some() {
            return Err(untrusted_chat_template());
        }
        let prompter = self.prompter.as_ref().ok_or_else(|| {
            Error::bad_request(
                "As of transformers v4.44, default chat template is no longer allowed, so you must provide \
                 a chat template if the tokenizer does not define one.",
            )
        })?;
        if self.options.strict_template_kwargs {
            prompter.check_kwargs_are_read(req)?;
        }
        // `--default-chat-template-kwargs` reach the template under the request's own (vLLM
        // merges them before rendering); only the request's keys are held to strictness.
        prompter.render_with_defaults(req, &self.options.default_chat_template_kwargs)
    }

    /// A chat's prompt ids (and offsets when asked), with the normalized tools the prompt
    /// shows. gpt-oss renders as Harmony; every other model through its chat template.
    fn render_chat_ids(
        &self,
        req: &ChatCompletionRequest,
        with_offsets: bool,
    ) -> Result<RenderedChatIds> {
        let Some(harmony) = &self.harmony else {
            let rendered = self.render_chat_prompt(req)?;
            let (ids, offsets) =
                self.encode_checked(&rendered.prompt, req.add_special_tokens, with_offsets)?;
            return Ok((ids, offsets, rendered.tools));
        };
        // A request `chat_template` is not refused: Harmony has no template to replace, and
        // vLLM renders such a request as Harmony too.
        if let (Some(p), true) = (&self.prompter, self.options.strict_template_kwargs) {
            p.check_kwargs_are_read(req)?;
        }
        let today = self.options.clock.now().format("%Y-%m-%d").to_string();
        let (ids, offsets) = harmony.render(req, &today)?;
        let tools = req
            .tools
            .as_ref()
            .map(|t| t.iter().map(crate::chat_prompt::normalize_tool).collect());
        Ok((ids, with_offsets.then_some(offsets), tools))
    }

    /// `POST /v1/chat/completions/render` with the body's `request_id`.
    pub fn render_chat(&self, req: &ChatCompletionRequest) -> Result<GenerateRequest> {
        self.render_chat_with_id(req, None)
    }

    /// As [`Self::render_chat`]; `header_request_id` is `X-Request-Id`, which wins over the body.
    pub fn render_chat_with_id(
        &self,
        req: &ChatCompletionRequest,
        header_request_id: Option<&str>,
    ) -> Result<GenerateRequest> {
        let (mut out, payload) = self.render_chat_with_pending_kwargs(req, header_request_id)?;
        if let (Some(payload), Some(features)) = (payload, out.features.as_mut()) {
            payload.fill(features);
        }
        Ok(out)
    }

    /// As [`Self::render_chat_with_id`], with the `kwargs_data` blobs of an image request
    /// not yet encoded: `features.kwargs_data.image` holds a `null` per image, and the
    /// payload writes each blob's base64 text wherever the caller keeps it (the Python
    /// binding writes it straight into a `str`, saving a copy of tens of megabytes).
    pub fn render_chat_with_pending_kwargs(
        &self,
        req: &ChatCompletionRequest,
        header_request_id: Option<&str>,
    ) -> Result<(GenerateRequest, Option<KwargsPayload>)> {
        validate_chat(req)?;
        self.check_model(req.model.as_deref())?;
        self.options
            .limits
            .check_tools(req.tools.as_ref().map_or(0, Vec::len))?;
        self.check_chat_chars(&req.messages)?;
        self.check_tool_parsing(req)?;
        let (mut ids, offsets, normalized_tools) =
            self.render_chat_ids(req, req.return_token_offsets)?;
        let (features, payload) = match self.chat_image_features(req, &mut ids)? {
            Some((features, payload)) => (Some(features), payload),
            None => (None, None),
        };
        truncate_prompt(
            &mut ids,
            req.truncate_prompt_tokens,
            req.truncation_side.as_deref(),
            self.max_model_len,
        )?;
        self.check_prompt_len(ids.len())?;
        let requested = req.max_completion_tokens.or(req.max_tokens);
        let max_tokens = self.resolve_max_tokens(requested, ids.len())?;
        let mut sp = self.chat_sampling_params(req, max_tokens)?;
        if let Some(h) = &self.options.hooks {
            h.adjust_sampling_params(req, &mut sp);
        }
        let grammar_plan = tool_grammar::plan(
            req,
            sp.structured_outputs.as_ref(),
            GrammarContext {
                tool_parser: self
                    .options
                    .tool_call_parser
                    .as_deref()
                    .filter(|_| self.options.enable_auto_tool_choice),
                reasoning_parser: self
                    .options
                    .hooks
                    .as_ref()
                    .and_then(|h| h.reasoning_parser()),
                prompt_reasoning: self
                    .options
                    .hooks
                    .as_ref()
                    .map_or(Default::default(), |h| h.prompt_reasoning(&ids)),
            },
        )?;
        if let Some(p) = &grammar_plan {
            sp.structured_outputs = Some(p.structured_outputs.clone());
        }
        sp.normalize_and_validate()?;
        self.options.limits.check_sampling(&sp)?;

        let mut kwargs = self.options.default_chat_template_kwargs.clone();
        kwargs.insert(
            "add_generation_prompt".into(),
            Value::Bool(req.add_generation_prompt()),
        );
        kwargs.insert(
            "continue_final_message".into(),
            Value::Bool(req.continue_final_message),
        );
        if let Some(k) = &req.chat_template_kwargs {
            for (k, v) in k {
                kwargs.insert(k.clone(), v.clone());
            }
        }
        let (reasoning_ended, reasoning_parser_kwargs) = match &self.options.hooks {
            Some(h) if h.has_reasoning_parser() => {
                let ended = if !req.include_reasoning {
                    Some(true)
                } else {
                    h.reasoning_ended(&ids, &kwargs)
                };
                (
                    ended,
                    Some(serde_json::json!({"chat_template_kwargs": kwargs.clone()})),
                )
            }
            _ => (
                if req.include_reasoning {
                    None
                } else {
                    Some(true)
                },
                None,
            ),
        };
        // The grammar covers the reasoning block, so it applies from the first token.
        let reasoning_ended = if grammar_plan.as_ref().is_some_and(|p| p.reasoning_ended) {
            Some(true)
        } else {
            reasoning_ended
        };
        let tool_choice = match &req.tool_choice {
            Some(tc) => tc.clone(),
            None if req.tools.is_some() => Value::String("auto".into()),
            None => Value::String("none".into()),
        };
        let history_tool_call_cnt = req
            .messages
            .iter()
            .filter(|m| m.role == "assistant")
            .map(|m| m.tool_calls.as_ref().map_or(0, Vec::len) as u64)
            .sum();
        let parse_context = ParseContext {
            // Normalized once, for the template.
            tools: normalized_tools,
            tool_choice: Some(tool_choice),
            parallel_tool_calls: Some(req.parallel_tool_calls.unwrap_or(true)),
            include_reasoning: req.include_reasoning,
            chat_template_kwargs: if self.harmony.is_some() {
                Map::new()
            } else {
                kwargs
            },
            history_tool_call_cnt,
            extra: Map::new(),
        };
        let base = header_request_id
            .map(str::to_owned)
            .or_else(|| req.request_id.clone())
            .unwrap_or_else(random_request_id);
        let (kv, ec) = hoisted_transfer_params(
            req.kv_transfer_params.as_ref(),
            req.ec_transfer_params.as_ref(),
            req.vllm_xargs.as_ref(),
        );
        let rendered = GenerateRequest {
            request_id: format!("chatcmpl-{base}"),
            token_ids: ids,
            sampling_params: sp,
            model: req.model.clone(),
            output_mode: "tokens".into(),
            stream: Some(req.stream),
            stream_options: if req.stream { req.stream_options } else { None },
            return_token_ids: req.return_token_ids,
            cache_salt: req.cache_salt.clone(),
            priority: req.priority,
            kv_transfer_params: kv,
            ec_transfer_params: ec,
            reasoning_ended,
            reasoning_parser_kwargs,
            parse_context: Some(parse_context),
            // Offsets index the template text; with images they would not (vLLM: null).
            token_offsets: if features.is_some() { None } else { offsets },
            features,
            content_parts: None,
        };
        Ok((rendered, payload))
    }

    /// With a vision model: processes the request's images, replaces each template
    /// `<|image_pad|>` in `ids` with the image's run, and returns the `features` object
    /// (its `kwargs_data` pending) and the payload.
    fn chat_image_features(
        &self,
        req: &ChatCompletionRequest,
        ids: &mut Vec<u32>,
    ) -> Result<Option<(Value, Option<KwargsPayload>)>> {
        let Some(vision) = &self.options.vision else {
            return Ok(None);
        };
        let images = chat_image_inputs(&req.messages, self.options.media_fetch.as_deref())?;
        if images.is_empty() {
            return Ok(None);
        }
        let kwargs = req.mm_processor_kwargs.as_ref().and_then(Value::as_object);
        let feats = vision.process_images(&images, kwargs, self.options.multimodal)?;
        let (expanded, placeholders) = vision.expand_placeholders(ids, &feats)?;
        *ids = expanded;
        let with_payload = req.mm_payload.as_deref() != Some("none");
        Ok(Some(crate::multimodal::features_json_pending(
            feats,
            &placeholders,
            with_payload,
        )))
    }

    /// `POST /v1/completions/render`: one `GenerateRequest` per prompt.
    pub fn render_completion(&self, req: &CompletionRequest) -> Result<Vec<GenerateRequest>> {
        self.render_completion_with_id(req, None)
    }

    pub fn render_completion_with_id(
        &self,
        req: &CompletionRequest,
        header_request_id: Option<&str>,
    ) -> Result<Vec<GenerateRequest>> {
        validate_completion(req)?;
        self.check_model(req.model.as_deref())?;
        check_suffix(req)?;
        // Embeddings come first in vLLM's prompt list (renderers/online_renderer.py:
        // preprocess_completion), and each is refused without `--enable-prompt-embeds`
        // (renderers/embed_utils.py), which aphro does not have.
        if has_prompt_embeds(req.prompt_embeds.as_ref()) {
            return Err(Error::for_param(
                "You must set `--enable-prompt-embeds` to input `prompt_embeds`.",
                "prompt_embeds",
            ));
        }
        let prompts = req
            .prompt
            .clone()
            .map(PromptInput::into_prompts)
            .unwrap_or_default();
        if prompts.is_empty() {
            // `BaseRenderer.render_prompts` (renderers/base.py).
            return Err(Error::for_param(
                "You must pass at least one prompt",
                "prompt",
            ));
        }
        self.options.limits.check_prompt_count(prompts.len())?;
        let base = header_request_id
            .map(str::to_owned)
            .or_else(|| req.request_id.clone())
            .unwrap_or_else(random_request_id);
        let n_prompts = prompts.len();
        let mut out = Vec::with_capacity(n_prompts);
        for (i, p) in prompts.into_iter().enumerate() {
            let (mut ids, offsets) = match p {
                SinglePrompt::Text(t) => {
                    self.encode_checked(&t, req.add_special_tokens, req.return_token_offsets)?
                }
                SinglePrompt::Tokens(t) => {
                    let ids = t
                        .iter()
                        .map(|&v| {
                            u32::try_from(v).map_err(|_| {
                                Error::validation(
                                    format!(
                                        "Invalid token id {v}: token ids must be non-negative."
                                    ),
                                    Some("body.prompt"),
                                )
                            })
                        })
                        .collect::<Result<Vec<u32>>>()?;
                    (ids, None)
                }
            };
            truncate_prompt(
                &mut ids,
                req.truncate_prompt_tokens,
                req.truncation_side.as_deref(),
                self.max_model_len,
            )?;
            if ids.is_empty() {
                return Err(Error::bad_request("No token_ids rendered"));
            }
            self.check_prompt_len(ids.len())?;
            let max_tokens = self.resolve_max_tokens(req.max_tokens, ids.len())?;
            // `echo` with `max_tokens: 0` returns the prompt alone; vLLM still generates one
            // token (and counts it in usage) and the response leaves it out.
            let max_tokens = if req.echo && req.max_tokens == Some(0) {
                1
            } else {
                max_tokens
            };
            let mut sp = self.completion_sampling_params(req, max_tokens);
            sp.normalize_and_validate()?;
            self.options.limits.check_sampling(&sp)?;
            let (kv, ec) = hoisted_transfer_params(
                req.kv_transfer_params.as_ref(),
                req.ec_transfer_params.as_ref(),
                req.vllm_xargs.as_ref(),
            );
            out.push(GenerateRequest {
                request_id: if n_prompts == 1 {
                    format!("cmpl-{base}")
                } else {
                    format!("cmpl-{base}-{i}")
                },
                token_ids: ids,
                sampling_params: sp,
                model: req.model.clone(),
                output_mode: "tokens".into(),
                stream: Some(req.stream),
                stream_options: if req.stream { req.stream_options } else { None },
                return_token_ids: req.return_token_ids,
                cache_salt: req.cache_salt.clone(),
                priority: req.priority,
                kv_transfer_params: kv,
                ec_transfer_params: ec,
                reasoning_ended: None,
                reasoning_parser_kwargs: None,
                parse_context: None,
                token_offsets: offsets,
                features: None,
                content_parts: None,
            });
        }
        Ok(out)
    }

    fn check_prompt_len(&self, n: usize) -> Result<()> {
        if n == 0 {
            return Err(Error::bad_request("No token_ids rendered"));
        }
        if n > self.max_model_len {
            return Err(Error::PromptTooLong {
                prompt_len: n,
                max_model_len: self.max_model_len,
            });
        }
        Ok(())
    }

    /// §10: min over `max_model_len - prompt_len` and the request (or server default) value.
    fn resolve_max_tokens(&self, requested: Option<i64>, prompt_len: usize) -> Result<i64> {
        let room = i64::try_from(self.max_model_len.saturating_sub(prompt_len)).unwrap_or(i64::MAX);
        if let Some(r) = requested {
            if r > i64::try_from(self.max_model_len).unwrap_or(i64::MAX) {
                return Err(Error::invalid_param(
                    format!(
                        "max_tokens={r} cannot be greater than max_model_len={}. Please request fewer output tokens.",
                        self.max_model_len
                    ),
                    "max_tokens",
                    r,
                ));
            }
        }
        let value = requested.or(self.model.generation_defaults.max_tokens);
        Ok(match value {
            Some(v) => v.min(room),
            None => room,
        })
    }

    fn defaults(&self) -> &GenerationDefaults {
        &self.model.generation_defaults
    }

    #[allow(clippy::too_many_arguments)]
    fn common_params(&self, c: CommonSampling<'_>) -> SamplingParams {
        let d = self.defaults();
        let mut stop_token_ids: Vec<i64> = c.stop_token_ids.cloned().unwrap_or_default();
        stop_token_ids.extend(d.stop_token_ids.iter().copied());
        let (structured_outputs, _) = structured_from(c.structured_outputs, c.response_format);
        let extra_args = c.vllm_xargs.map(|x| {
            x.iter()
                .filter(|(k, _)| {
                    k.as_str() != "kv_transfer_params" && k.as_str() != "ec_transfer_params"
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Map<String, Value>>()
        });
        SamplingParams {
            n: c.n,
            presence_penalty: c.presence_penalty.or(d.presence_penalty).unwrap_or(0.0),
            frequency_penalty: c.frequency_penalty.or(d.frequency_penalty).unwrap_or(0.0),
            repetition_penalty: c.repetition_penalty.or(d.repetition_penalty).unwrap_or(1.0),
            temperature: c.temperature.or(d.temperature).unwrap_or(1.0),
            top_p: c.top_p.or(d.top_p).unwrap_or(1.0),
            top_k: c.top_k.or(d.top_k).unwrap_or(0),
            min_p: c.min_p.or(d.min_p).unwrap_or(0.0),
            seed: c.seed,
            stop: c.stop.cloned().map(StopSpec::into_vec).unwrap_or_default(),
            stop_token_ids,
            ignore_eos: c.ignore_eos,
            max_tokens: Some(c.max_tokens),
            min_tokens: c.min_tokens,
            logprobs: c.logprobs,
            prompt_logprobs: c.prompt_logprobs,
            logprob_token_ids: c.logprob_token_ids.cloned(),
            include_stop_str_in_output: c.include_stop_str_in_output,
            skip_special_tokens: c
                .skip_special_tokens
                .or(d.skip_special_tokens)
                .unwrap_or(true),
            spaces_between_special_tokens: c.spaces_between_special_tokens,
            output_kind: if c.stream {
                OUTPUT_KIND_DELTA
            } else {
                OUTPUT_KIND_FINAL_ONLY
            },
            skip_clone: true,
            stream_interval: c.stream_interval,
            structured_outputs,
            logit_bias: c.logit_bias.cloned(),
            allowed_token_ids: c.allowed_token_ids.cloned(),
            extra_args: extra_args.filter(|m| !m.is_empty()),
            bad_words: c.bad_words.cloned().unwrap_or_default(),
            thinking_token_budget: c.thinking_token_budget,
            ..SamplingParams::default()
        }
    }

    fn chat_sampling_params(
        &self,
        req: &ChatCompletionRequest,
        max_tokens: i64,
    ) -> Result<SamplingParams> {
        let top_logprobs = req.top_logprobs.unwrap_or(0);
        let logprobs = if req.logprobs && req.logprob_token_ids.is_none() {
            Some(top_logprobs)
        } else {
            None
        };
        let prompt_logprobs = req
            .prompt_logprobs
            // vLLM's `top_logprobs` defaults to 0, so `echo` always asks for prompt logprobs.
            .or(req.echo.then_some(top_logprobs));
        let mut sp = self.common_params(CommonSampling {
            n: req.n,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            repetition_penalty: req.repetition_penalty,
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            min_p: req.min_p,
            seed: req.seed,
            stop: req.stop.as_ref(),
            stop_token_ids: req.stop_token_ids.as_ref(),
            ignore_eos: req.ignore_eos,
            max_tokens,
            min_tokens: req.min_tokens,
            logprobs,
            prompt_logprobs,
            logprob_token_ids: req.logprob_token_ids.as_ref(),
            include_stop_str_in_output: req.include_stop_str_in_output,
            skip_special_tokens: req.skip_special_tokens,
            spaces_between_special_tokens: req.spaces_between_special_tokens,
            stream: req.stream,
            stream_interval: req.stream_interval,
            structured_outputs: req.structured_outputs.as_ref(),
            response_format: req.response_format.as_ref(),
            logit_bias: req.logit_bias.as_ref(),
            allowed_token_ids: req.allowed_token_ids.as_ref(),
            vllm_xargs: req.vllm_xargs.as_ref(),
            bad_words: req.bad_words.as_ref(),
            thinking_token_budget: req.thinking_token_budget,
        });
        sp.repetition_detection = req.repetition_detection.clone();
        Ok(sp)
    }

    fn completion_sampling_params(
        &self,
        req: &CompletionRequest,
        max_tokens: i64,
    ) -> SamplingParams {
        let prompt_logprobs = req
            .prompt_logprobs
            .or(if req.echo { req.logprobs } else { None });
        self.common_params(CommonSampling {
            n: req.n,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            repetition_penalty: req.repetition_penalty,
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            min_p: req.min_p,
            seed: req.seed,
            stop: req.stop.as_ref(),
            stop_token_ids: req.stop_token_ids.as_ref(),
            ignore_eos: req.ignore_eos,
            max_tokens,
            min_tokens: req.min_tokens,
            logprobs: if req.logprob_token_ids.is_some() {
                None
            } else {
                req.logprobs
            },
            prompt_logprobs,
            logprob_token_ids: req.logprob_token_ids.as_ref(),
            include_stop_str_in_output: req.include_stop_str_in_output,
            skip_special_tokens: req.skip_special_tokens,
            spaces_between_special_tokens: req.spaces_between_special_tokens,
            stream: req.stream,
            stream_interval: req.stream_interval,
            structured_outputs: req.structured_outputs.as_ref(),
            response_format: req.response_format.as_ref(),
            logit_bias: req.logit_bias.as_ref(),
            allowed_token_ids: req.allowed_token_ids.as_ref(),
            vllm_xargs: req.vllm_xargs.as_ref(),
            bad_words: req.bad_words.as_ref(),
            thinking_token_budget: req.thinking_token_budget,
        })
    }

    /// `POST /tokenize` (§9).
    pub fn tokenize(&self, req: &TokenizeRequest) -> Result<TokenizeResponse> {
        self.check_model(match req {
            TokenizeRequest::Completion(c) => c.model.as_deref(),
            TokenizeRequest::Chat(c) => c.model.as_deref(),
        })?;
        let (ids, want_strs) = match req {
            TokenizeRequest::Completion(c) => (
                self.encode_checked(&c.prompt, c.add_special_tokens, false)?
                    .0,
                c.return_token_strs,
            ),
            TokenizeRequest::Chat(c) => {
                self.check_chat_chars(&c.messages)?;
                let chat = ChatCompletionRequest {
                    messages: c.messages.clone(),
                    model: c.model.clone(),
                    add_generation_prompt: c.add_generation_prompt,
                    continue_final_message: c.continue_final_message,
                    add_special_tokens: c.add_special_tokens,
                    chat_template: c.chat_template.clone(),
                    chat_template_kwargs: c.chat_template_kwargs.clone(),
                    tools: c.tools.clone(),
                    n: 1,
                    include_reasoning: true,
                    spaces_between_special_tokens: true,
                    length_penalty: 1.0,
                    ..ChatCompletionRequest::default()
                };
                self.options
                    .limits
                    .check_tools(chat.tools.as_ref().map_or(0, Vec::len))?;
                (self.render_chat_ids(&chat, false)?.0, c.return_token_strs)
            }
        };
        let token_strs = want_strs.then(|| {
            ids.iter()
                .map(|&i| self.model.tokenizer.id_to_token(i).unwrap_or_default())
                .collect()
        });
        Ok(TokenizeResponse {
            count: ids.len(),
            max_model_len: self.max_model_len,
            tokens: ids,
            token_strs,
        })
    }

    /// `POST /detokenize` (§9).
    pub fn detokenize(&self, req: &DetokenizeRequest) -> Result<DetokenizeResponse> {
        self.check_model(req.model.as_deref())?;
        let vocab = self.model.tokenizer.vocab_size() as u64;
        let ids = req
            .tokens
            .iter()
            .map(|&t| {
                u32::try_from(t)
                    .ok()
                    .filter(|&v| u64::from(v) < vocab)
                    .ok_or_else(|| Error::bad_request(format!("Token id {t} is out of vocabulary")))
            })
            .collect::<Result<Vec<u32>>>()?;
        Ok(DetokenizeResponse {
            prompt: self.model.tokenizer.decode(&ids, false)?,
        })
    }
}

/// Fields shared by chat and completion sampling.
struct CommonSampling<'a> {
    n: i64,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    repetition_penalty: Option<f64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    seed: Option<i64>,
    stop: Option<&'a StopSpec>,
    stop_token_ids: Option<&'a Vec<i64>>,
    ignore_eos: bool,
    max_tokens: i64,
    min_tokens: i64,
    logprobs: Option<i64>,
    prompt_logprobs: Option<i64>,
    logprob_token_ids: Option<&'a Vec<i64>>,
    include_stop_str_in_output: bool,
    skip_special_tokens: Option<bool>,
    spaces_between_special_tokens: bool,
    stream: bool,
    stream_interval: Option<i64>,
    structured_outputs: Option<&'a Value>,
    response_format: Option<&'a Value>,
    logit_bias: Option<&'a Map<String, Value>>,
    allowed_token_ids: Option<&'a Vec<i64>>,
    vllm_xargs: Option<&'a Map<String, Value>>,
    bad_words: Option<&'a Vec<String>>,
    thinking_token_budget: Option<i64>,
}

/// `structured_outputs` from the request, else derived from `response_format`.
fn structured_from(so: Option<&Value>, rf: Option<&Value>) -> (Option<Value>, ()) {
    if let Some(so) = so {
        return (Some(so.clone()), ());
    }
    let Some(rf) = rf else { return (None, ()) };
    let out = match rf.get("type").and_then(Value::as_str) {
        Some("json_object") => Some(serde_json::json!({"json_object": true})),
        Some("json_schema") => rf
            .get("json_schema")
            .and_then(|s| s.get("schema").or_else(|| s.get("json_schema")))
            .map(|schema| serde_json::json!({"json": schema})),
        Some("structural_tag") => Some(serde_json::json!({"structural_tag": rf.to_string()})),
        _ => None,
    };
    (out, ())
}

/// `kv_transfer_params`/`ec_transfer_params`: request fields, else hoisted out of `vllm_xargs`.
fn hoisted_transfer_params(
    kv: Option<&Value>,
    ec: Option<&Value>,
    xargs: Option<&Map<String, Value>>,
) -> (Option<Value>, Option<Value>) {
    let kv = kv
        .cloned()
        .or_else(|| xargs.and_then(|x| x.get("kv_transfer_params").cloned()));
    let ec = ec
        .cloned()
        .or_else(|| xargs.and_then(|x| x.get("ec_transfer_params").cloned()));
    (kv, ec)
}

fn truncate_prompt(
    ids: &mut Vec<u32>,
    k: Option<i64>,
    side: Option<&str>,
    max_model_len: usize,
) -> Result<()> {
    if let Some(s) = side.filter(|s| *s != "left" && *s != "right") {
        return Err(Error::invalid_param(
            "`truncation_side` must be either 'left' or 'right'.",
            "truncation_side",
            s,
        ));
    }
    let Some(k) = k else { return Ok(()) };
    if k < -1 {
        return Err(Error::invalid_param(
            format!("truncate_prompt_tokens must be >= -1, got {k}."),
            "truncate_prompt_tokens",
            k,
        ));
    }
    if usize::try_from(k).is_ok_and(|k| k > max_model_len) {
        return Err(Error::invalid_param(
            format!(
                "truncate_prompt_tokens={k} cannot be greater than max_model_len = \
                 {max_model_len}. Please request a smaller truncation size."
            ),
            "truncate_prompt_tokens",
            k,
        ));
    }
    // -1: as long as the context allows while leaving one token to generate (vLLM's
    // `max_truncation_tokens`), so a truncated prompt never ends in a zero-token budget.
    let keep = if k == -1 {
        max_model_len.saturating_sub(1)
    } else {
        usize::try_from(k).unwrap_or(usize::MAX)
    };
    if ids.len() > keep {
        if side == Some("right") {
            ids.truncate(keep);
        } else {
            let cut = ids.len() - keep;
            ids.drain(..cut);
        }
    }
    Ok(())
}

/// `suffix` as vLLM's `render_completion` refuses it: no model aphro serves renders
/// fill-in-the-middle, so every suffix is refused, after the checks vLLM makes first.
fn check_suffix(req: &CompletionRequest) -> Result<()> {
    if req.suffix.is_none() {
        return Ok(());
    }
    // vLLM's `create_error_response(message, param="suffix")`: the message as is.
    let refuse = |m: &str| {
        Err(Error::BadRequest {
            message: m.to_owned(),
            param: Some("suffix".to_owned()),
        })
    };
    if req.echo {
        return refuse("Echo is unsupported with suffix.");
    }
    if req.prompt_embeds.is_some() {
        return refuse("suffix is not supported with prompt_embeds");
    }
    if req.truncate_prompt_tokens.is_some() {
        return refuse("suffix is not supported with truncate_prompt_tokens");
    }
    match &req.prompt {
        Some(PromptInput::Text(_) | PromptInput::Texts(_)) => {
            refuse("suffix is only supported for models with FIM completion rendering")
        }
        _ => refuse("suffix requires text prompt input for FIM completion rendering"),
    }
}

/// vLLM's `validate_cache_salt`: a salt is a key into every cache backend, so it is short
/// and free of path and key separators.
fn validate_cache_salt(salt: Option<&str>) -> Result<()> {
    let Some(salt) = salt else { return Ok(()) };
    if salt.is_empty() {
        return Err(Error::for_param(
            "Parameter 'cache_salt' must be a non-empty string if provided.",
            "cache_salt",
        ));
    }
    if salt.chars().count() > 128 || salt.contains(['@', '/', '\\', '\0']) {
        return Err(Error::for_param(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', \
             '/', '\\\\', or NUL.",
            "cache_salt",
        ));
    }
    Ok(())
}

/// Request-level checks of §8.1 (those not covered by `SamplingParams`).
/// OpenAI's `reasoning_effort` values plus vLLM's `max` (spec §8.1).
pub const REASONING_EFFORTS: [&str; 7] =
    ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// vLLM's `ChatCompletionRequest` model validators (entrypoints/openai/chat_completion/protocol.py),
/// in the order pydantic runs them (`mode="before"` validators run last-defined first), with
/// their messages: each raises a `VLLMValidationError`, which is not a `ValueError`, so it
/// leaves pydantic unwrapped and becomes a `BadRequestError` whose message carries the
/// ` (parameter=…, value=…)` suffix. The structural (field) checks follow them, as pydantic
/// validates fields after its before-validators.
fn validate_chat(req: &ChatCompletionRequest) -> Result<()> {
    // check_generation_prompt reads the raw body: only an explicit `true` is refused here.
    if req.add_generation_prompt == Some(true) {
        crate::chat_prompt::check_continue_final_message(
            req.continue_final_message,
            req.add_generation_prompt,
        )?;
    }
    check_tool_usage(req)?;
    // check_tool_usage (run first) fills in "auto" when tools come without a choice, and an
    // absent choice reads as "none"; any other value (a named tool, null) excludes constraints.
    let named_tool_choice = req
        .tool_choice
        .as_ref()
        .is_some_and(|tc| !matches!(tc.as_str(), Some("none" | "auto" | "required")));
    check_structured_outputs_count(req.structured_outputs.as_ref(), named_tool_choice, None)?;
    if has_items(req.logprob_token_ids.as_deref()) && req.use_beam_search {
        return Err(Error::for_param(
            "`logprob_token_ids` is not supported with beam search.",
            "logprob_token_ids",
        ));
    }
    if has_items(req.logprob_token_ids.as_deref()) && !req.logprobs {
        return Err(Error::for_param(
            "when using `logprob_token_ids`, `logprobs` must be set to true.",
            "logprob_token_ids",
        ));
    }
    check_prompt_logprobs(req.prompt_logprobs, req.stream)?;
    if let Some(t) = req.top_logprobs {
        check_logprob_count(t, "top_logprobs")?;
        if t != 0 && !req.logprobs {
            return Err(Error::for_param(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                "top_logprobs",
            ));
        }
    }
    check_stream_options(req.stream_options.is_some(), req.stream)?;
    check_response_format(req.response_format.as_ref())?;
    validate_cache_salt(req.cache_salt.as_deref())?;
    // Field validation.
    if let Some(effort) = &req.reasoning_effort {
        if !REASONING_EFFORTS.contains(&effort.as_str()) {
            use crate::validation::{literal_error, validation_error, Loc};
            return Err(validation_error(&[literal_error(
                &[Loc::Key("reasoning_effort".into())],
                &REASONING_EFFORTS,
                &Value::String(effort.clone()),
            )]));
        }
    }
    validate_response_format_type(req.response_format.as_ref())?;
    // render_chat_request (entrypoints/scale_out/render/serving.py).
    if req.use_beam_search {
        return Err(Error::bad_request(
            "Beam search is not supported by the render endpoint",
        ));
    }
    Ok(())
}

/// Python's truthiness of an optional list.
fn has_items<T>(v: Option<&[T]>) -> bool {
    v.is_some_and(|v| !v.is_empty())
}

/// `check_tool_usage`.
fn check_tool_usage(req: &ChatCompletionRequest) -> Result<()> {
    if req.tools.as_ref().is_some_and(Vec::is_empty) {
        return Err(Error::for_param(
            "`tools` must not be an empty array. Either provide at least one tool or omit the \
             field entirely.",
            "tools",
        ));
    }
    let Some(tc) = req.tool_choice.as_ref().filter(|tc| !tc.is_null()) else {
        return Ok(());
    };
    if tc.as_str() == Some("none") {
        return Ok(());
    }
    let Some(tools) = &req.tools else {
        return Err(Error::for_param(
            "When using `tool_choice`, `tools` must be set.",
            "tool_choice",
        ));
    };
    let Value::Object(named) = tc else {
        if matches!(tc.as_str(), Some("auto" | "required")) {
            return Ok(());
        }
        return Err(Error::for_param(
            format!(
                "Invalid value for `tool_choice`: {}! Only named tools, \"none\", \"auto\" or \
                 \"required\" are supported.",
                crate::template::json::py_str_json(tc)
            ),
            "tool_choice",
        ));
    };
    const CORRECT_USAGE: &str =
        r#"Correct usage: `{"type": "function", "function": {"name": "my_function"}}`"#;
    let function = match named.get("function") {
        Some(Value::Object(f)) => f,
        other => {
            return Err(Error::for_param(
                format!(
                    "Invalid value for `function`: `{}` in `tool_choice`! {CORRECT_USAGE}",
                    crate::template::json::py_str_json(other.unwrap_or(&Value::Null))
                ),
                "tool_choice.function",
            ))
        }
    };
    let Some(name) = function.get("name") else {
        return Err(Error::for_param(
            format!("Expected field `name` in `function` in `tool_choice`! {CORRECT_USAGE}"),
            "tool_choice.function.name",
        ));
    };
    let name = match name.as_str() {
        Some(n) if !n.is_empty() => n,
        _ => {
            return Err(Error::for_param(
                format!(
                    "Invalid `name` in `function`: `{}` in `tool_choice`! {CORRECT_USAGE}",
                    crate::template::json::py_str_json(name)
                ),
                "tool_choice.function.name",
            ))
        }
    };
    if !tools.iter().any(|t| t.function.name == name) {
        return Err(Error::for_param(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            "tool_choice",
        ));
    }
    Ok(())
}

/// `check_structured_outputs_count` of the chat (`param: None`) and completion
/// (`param: structured_outputs`) requests. `named_tool_choice` (chat only) is a `tool_choice`
/// other than none/auto/required, which rules constraints out.
fn check_structured_outputs_count(
    so: Option<&Value>,
    named_tool_choice: bool,
    param: Option<&str>,
) -> Result<()> {
    let Some(so) = so.and_then(Value::as_object) else {
        return Ok(());
    };
    let count = ["json", "regex", "choice"]
        .iter()
        .filter(|k| so.get(**k).is_some_and(|v| !v.is_null()))
        .count();
    let refuse = |message: &str| match param {
        Some(p) => Error::for_param(message, p),
        None => Error::bad_request(message),
    };
    if count > 1 {
        return Err(refuse(
            "You can only use one kind of constraints for structured outputs ('json', 'regex' \
             or 'choice').",
        ));
    }
    if count > 0 && named_tool_choice {
        return Err(refuse(
            "You can only either use constraints for structured outputs or tools, not both.",
        ));
    }
    Ok(())
}

/// The `prompt_logprobs` half of `check_logprobs` (chat and completion alike).
fn check_prompt_logprobs(prompt_logprobs: Option<i64>, stream: bool) -> Result<()> {
    let Some(p) = prompt_logprobs else {
        return Ok(());
    };
    if stream && (p > 0 || p == -1) {
        return Err(Error::for_param(
            "`prompt_logprobs` are not available when `stream=True`.",
            "prompt_logprobs",
        ));
    }
    check_logprob_count(p, "prompt_logprobs")
}

/// `logprobs`, `top_logprobs`, `prompt_logprobs`: a count, or -1 for all of the vocabulary.
fn check_logprob_count(v: i64, param: &str) -> Result<()> {
    if v < -1 {
        return Err(Error::invalid_param(
            format!("`{param}` must be a positive value or -1."),
            param,
            v,
        ));
    }
    Ok(())
}

/// `prompt_embeds` as vLLM's validators see it: anything but null or an empty list is given.
fn has_prompt_embeds(embeds: Option<&Value>) -> bool {
    match embeds {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

/// `validate_stream_options`.
fn check_stream_options(has_stream_options: bool, stream: bool) -> Result<()> {
    if has_stream_options && !stream {
        return Err(Error::for_param(
            "Stream options can only be defined when `stream=True`.",
            "stream_options",
        ));
    }
    Ok(())
}

/// `validate_response_format`.
fn check_response_format(rf: Option<&Value>) -> Result<()> {
    if let Some(rf) = rf {
        if rf.get("type").and_then(Value::as_str) == Some("json_schema")
            && rf.get("json_schema").is_none_or(Value::is_null)
        {
            return Err(Error::for_param(
                "When response_format type is 'json_schema', the 'json_schema' field must be \
                 provided.",
                "response_format",
            ));
        }
    }
    Ok(())
}

/// `response_format.type` is one of the formats vLLM's `AnyResponseFormat` union declares; an
/// unknown one is pydantic's structural 400 rather than an unconstrained answer.
fn validate_response_format_type(rf: Option<&Value>) -> Result<()> {
    const TYPES: [&str; 4] = ["text", "json_object", "json_schema", "structural_tag"];
    let Some(kind) = rf.and_then(|rf| rf.get("type")) else {
        return Ok(());
    };
    if kind.as_str().is_some_and(|k| TYPES.contains(&k)) {
        return Ok(());
    }
    use crate::validation::{literal_error, validation_error, Loc};
    let loc = [Loc::Key("response_format".into()), Loc::Key("type".into())];
    Err(validation_error(&[literal_error(&loc, &TYPES, kind)]))
}

/// vLLM's `CompletionRequest` model validators (entrypoints/openai/completion/protocol.py), in
/// pydantic's order, then the field checks; see [`validate_chat`].
fn validate_completion(req: &CompletionRequest) -> Result<()> {
    // validate_prompt_and_prompt_embeds: a missing or "" prompt without embeddings.
    let prompt_is_empty = match &req.prompt {
        None => true,
        Some(PromptInput::Text(t)) => t.is_empty(),
        Some(_) => false,
    };
    if prompt_is_empty && !has_prompt_embeds(req.prompt_embeds.as_ref()) {
        return Err(Error::for_param(
            "Either prompt or prompt_embeds must be provided and non-empty.",
            "prompt",
        ));
    }
    check_stream_options(req.stream_options.is_some(), req.stream)?;
    let has_token_ids = has_items(req.logprob_token_ids.as_deref());
    if has_token_ids && req.use_beam_search {
        return Err(Error::for_param(
            "`logprob_token_ids` is not supported with beam search.",
            "logprob_token_ids",
        ));
    }
    if req.use_beam_search && req.echo && req.logprobs.is_some() {
        return Err(Error::for_param(
            "`echo` with `logprobs` is not supported with beam search because beam search does \
             not compute prompt logprobs.",
            "echo",
        ));
    }
    if has_token_ids && req.echo && req.max_tokens == Some(0) {
        return Err(Error::for_param(
            "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because \
             no output tokens are generated.",
            "logprob_token_ids",
        ));
    }
    if has_token_ids && req.logprobs.is_none() {
        return Err(Error::for_param(
            "when using `logprob_token_ids`, `logprobs` must be set.",
            "logprob_token_ids",
        ));
    }
    check_prompt_logprobs(req.prompt_logprobs, req.stream)?;
    if let Some(l) = req.logprobs {
        check_logprob_count(l, "logprobs")?;
    }
    check_structured_outputs_count(
        req.structured_outputs.as_ref(),
        false,
        Some("structured_outputs"),
    )?;
    check_response_format(req.response_format.as_ref())?;
    validate_cache_salt(req.cache_salt.as_deref())?;
    validate_response_format_type(req.response_format.as_ref())?;
    // render_completion_request (entrypoints/scale_out/render/serving.py).
    if req.use_beam_search {
        return Err(Error::bad_request(
            "Beam search is not supported by the render endpoint",
        ));
    }
    Ok(())
}

/// Parses a request body as vLLM would: a JSON object with `messages` is a chat request,
/// with `prompt` a completion request. Deserialization failures are structural 400s naming
/// the field and the expected type (see [`crate::validation`]).
pub fn parse_chat_request(body: &Value) -> Result<ChatCompletionRequest> {
    crate::validation::from_body(body)
}

pub fn parse_completion_request(body: &Value) -> Result<CompletionRequest> {
    crate::validation::from_body(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(extra: Value) -> ChatCompletionRequest {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        parse_chat_request(&body).expect("structurally valid")
    }

    fn completion(body: Value) -> CompletionRequest {
        parse_completion_request(&body).expect("structurally valid")
    }

    /// The error body vLLM sends: (message, type, param).
    fn refusal(r: Result<()>) -> (String, &'static str, Option<String>) {
        let e = r.expect_err("refused");
        let body = e.to_error_response();
        (body.error.message, e.error_type(), body.error.param)
    }

    #[test]
    fn chat_validators_word_their_errors_as_vllm() {
        let weather = json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let cases = [
            (
                json!({"tools": []}),
                "`tools` must not be an empty array. Either provide at least one tool or omit \
                 the field entirely. (parameter=tools)",
                "tools",
            ),
            (
                json!({"tool_choice": "required"}),
                "When using `tool_choice`, `tools` must be set. (parameter=tool_choice)",
                "tool_choice",
            ),
            (
                json!({"tools": weather, "tool_choice": "sometimes"}),
                "Invalid value for `tool_choice`: sometimes! Only named tools, \"none\", \
                 \"auto\" or \"required\" are supported. (parameter=tool_choice)",
                "tool_choice",
            ),
            (
                json!({"tools": weather, "tool_choice": {"type": "function"}}),
                "Invalid value for `function`: `None` in `tool_choice`! Correct usage: \
                 `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}` \
                 (parameter=tool_choice.function)",
                "tool_choice.function",
            ),
            (
                json!({"tools": weather, "tool_choice": {"type": "function", "function": {}}}),
                "Expected field `name` in `function` in `tool_choice`! Correct usage: \
                 `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}` \
                 (parameter=tool_choice.function.name)",
                "tool_choice.function.name",
            ),
            (
                json!({"tools": weather,
                       "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "The tool specified in `tool_choice` does not match any of the specified \
                 `tools` (parameter=tool_choice)",
                "tool_choice",
            ),
            (
                json!({"stream_options": {"include_usage": true}}),
                "Stream options can only be defined when `stream=True`. \
                 (parameter=stream_options)",
                "stream_options",
            ),
            (
                json!({"top_logprobs": 3}),
                "when using `top_logprobs`, `logprobs` must be set to true. \
                 (parameter=top_logprobs)",
                "top_logprobs",
            ),
            (
                json!({"logprobs": true, "top_logprobs": -2}),
                "`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, \
                 value=-2)",
                "top_logprobs",
            ),
            (
                json!({"prompt_logprobs": 1, "stream": true}),
                "`prompt_logprobs` are not available when `stream=True`. \
                 (parameter=prompt_logprobs)",
                "prompt_logprobs",
            ),
            (
                json!({"logprob_token_ids": [1]}),
                "when using `logprob_token_ids`, `logprobs` must be set to true. \
                 (parameter=logprob_token_ids)",
                "logprob_token_ids",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "When response_format type is 'json_schema', the 'json_schema' field must be \
                 provided. (parameter=response_format)",
                "response_format",
            ),
        ];
        for (extra, message, param) in cases {
            let (got, kind, got_param) = refusal(validate_chat(&chat(extra.clone())));
            assert_eq!(got, message, "{extra}");
            assert_eq!(kind, "BadRequestError", "{extra}");
            assert_eq!(got_param.as_deref(), Some(param), "{extra}");
        }
    }

    #[test]
    fn structured_outputs_count_is_checked_before_the_params() {
        let (msg, kind, param) = refusal(validate_chat(&chat(
            json!({"structured_outputs": {"regex": "a+", "choice": ["a"]}}),
        )));
        assert_eq!(
            msg,
            "You can only use one kind of constraints for structured outputs ('json', 'regex' \
             or 'choice')."
        );
        assert_eq!((kind, param), ("BadRequestError", None));
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let (msg, ..) = refusal(validate_chat(&chat(json!({
            "structured_outputs": {"regex": "a+"}, "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "f"}}}))));
        assert_eq!(
            msg,
            "You can only either use constraints for structured outputs or tools, not both."
        );
        // Completions name the parameter.
        let (_, _, param) = refusal(validate_completion(&completion(
            json!({"prompt": "x", "structured_outputs": {"json": {}, "choice": ["a"]}}),
        )));
        assert_eq!(param.as_deref(), Some("structured_outputs"));
    }

    #[test]
    fn continue_final_message_refuses_an_explicit_generation_prompt_only() {
        let both = chat(json!({"continue_final_message": true, "add_generation_prompt": true}));
        let (msg, kind, param) = refusal(validate_chat(&both));
        assert_eq!(
            msg,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        );
        assert_eq!((kind, param), ("BadRequestError", None));
        // Left out, add_generation_prompt is true only by default: the request validator lets
        // it through and the template step refuses it with transformers' words.
        let implicit = chat(json!({"continue_final_message": true}));
        assert!(validate_chat(&implicit).is_ok());
        assert!(implicit.add_generation_prompt());
        let (msg, ..) = refusal(crate::chat_prompt::check_continue_final_message(
            true,
            implicit.add_generation_prompt,
        ));
        assert!(msg.starts_with("continue_final_message and add_generation_prompt are not"));
        let explicit_off = chat(json!({"continue_final_message": true,
                                       "add_generation_prompt": false}));
        assert!(validate_chat(&explicit_off).is_ok());
        assert!(crate::chat_prompt::check_continue_final_message(
            true,
            explicit_off.add_generation_prompt
        )
        .is_ok());
        // null is not a boolean.
        let body = json!({"messages": [], "add_generation_prompt": null});
        assert!(parse_chat_request(&body).is_err());
    }

    #[test]
    fn completion_prompt_checks_follow_vllm() {
        for body in [json!({}), json!({"prompt": ""}), json!({"prompt": null})] {
            let (msg, kind, param) = refusal(validate_completion(&completion(body.clone())));
            assert_eq!(
                msg,
                "Either prompt or prompt_embeds must be provided and non-empty. \
                 (parameter=prompt)",
                "{body}"
            );
            assert_eq!(
                (kind, param.as_deref()),
                ("BadRequestError", Some("prompt"))
            );
        }
        // A list is not "empty" to the validator; the renderer refuses an empty one.
        assert!(validate_completion(&completion(json!({"prompt": []}))).is_ok());
        let (msg, ..) = refusal(validate_completion(&completion(
            json!({"prompt": "x", "logprobs": -3}),
        )));
        assert_eq!(
            msg,
            "`logprobs` must be a positive value or -1. (parameter=logprobs, value=-3)"
        );
        let (msg, ..) = refusal(validate_completion(&completion(
            json!({"prompt": "x", "logprob_token_ids": [1]}),
        )));
        assert_eq!(
            msg,
            "when using `logprob_token_ids`, `logprobs` must be set. \
             (parameter=logprob_token_ids)"
        );
    }
}
