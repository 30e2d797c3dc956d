//! Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) as a
//! translation onto the chat pipeline, the way vLLM serves it (`endpoints.md` §2): a
//! [`MessagesRequest`] becomes a chat completion body that runs through the same render →
//! generate → derender path as `/v1/chat/completions`, and the chat response (or its chunk
//! stream) becomes Anthropic's message (or its event stream).
//!
//! Where vLLM's output breaks Anthropic's own clients, this module follows Anthropic's
//! published API instead (each is marked "Anthropic, not vLLM" below): `message_start`
//! carries `type`/`role`, a matched stop string is `stop_reason: "stop_sequence"` with
//! `stop_sequence` set, a `ping` follows `message_start`, and errors use Anthropic's error
//! types (`invalid_request_error`, ...). `thinking` is honoured instead of dropped.
use crate::protocol::{ChatCompletionResponse, StopReason};
use crate::Error;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// Which route a body came in on: `count_tokens` takes no `max_tokens` and no sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Messages,
    CountTokens,
}

/// A `/v1/messages` body. Unknown fields are ignored, as in vLLM's (plain pydantic) model.
#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    pub messages: Vec<AnthropicMessage>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub system: Option<SystemPrompt>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub tools: Option<Vec<AnthropicTool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// Accepted and ignored (Anthropic uses it for abuse tracking only).
    #[serde(default)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub thinking: Option<ThinkingConfig>,
    /// `{effort, format}`: `effort` becomes the chat's `reasoning_effort`.
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
    /// vLLM extensions, passed through to the chat request.
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    pub kv_transfer_params: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SystemPrompt {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct AnthropicMessage {
    pub role: String,
    pub content: MessageContent,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

/// One content block. Like vLLM's `AnthropicContentBlock` a single permissive shape; the
/// `type` decides which fields count.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentBlock {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub source: Option<Map<String, Value>>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub tool_use_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub content: Option<Value>,
    #[serde(default)]
    pub is_error: Option<bool>,
    #[serde(default)]
    pub thinking: Option<String>,
    #[serde(default)]
    pub signature: Option<String>,
}

const BLOCK_TYPES: [&str; 7] = [
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
];

#[derive(Debug, Clone, Deserialize)]
pub struct AnthropicTool {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub input_schema: Map<String, Value>,
    #[serde(default)]
    pub defer_loading: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

/// `output_config: {effort: "low" | ..., format: {type: "json_schema", schema}}`.
#[derive(Debug, Clone, Deserialize)]
pub struct OutputConfig {
    #[serde(default)]
    pub effort: Option<String>,
    #[serde(default)]
    pub format: Option<Value>,
}

/// `thinking: {type: "enabled", budget_tokens} | {type: "disabled"} | {type: "adaptive"}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ThinkingConfig {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub budget_tokens: Option<i64>,
}

fn invalid(message: impl Into<String>, param: &str) -> Error {
    Error::for_param(message, param)
}

/// Parses and checks a Messages body (structure and the rules vLLM and Anthropic enforce).
pub fn parse_request(body: &Value, route: Route) -> Result<MessagesRequest, Error> {
    let req: MessagesRequest = crate::validation::from_body(body)?;
    if req.model.is_empty() {
        return Err(invalid("Model is required", "model"));
    }
    if req.messages.is_empty() {
        return Err(invalid(
            "messages: at least one message is required",
            "messages",
        ));
    }
    for (i, m) in req.messages.iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            return Err(invalid(
                format!(
                    "messages.{i}.role: Input should be 'user' or 'assistant', got '{}'",
                    m.role
                ),
                "messages",
            ));
        }
        if let MessageContent::Blocks(blocks) = &m.content {
            check_blocks(blocks, &format!("messages.{i}.content"))?;
        }
    }
    if let Some(SystemPrompt::Blocks(blocks)) = &req.system {
        for (j, b) in blocks.iter().enumerate() {
            if b.kind != "text" {
                return Err(invalid(
                    format!(
                        "system.{j}.type: system blocks must be 'text', got '{}'",
                        b.kind
                    ),
                    "system",
                ));
            }
        }
    }
    if route == Route::Messages {
        match req.max_tokens {
            None => return Err(invalid("max_tokens: Field required", "max_tokens")),
            Some(n) if n <= 0 => return Err(invalid("max_tokens must be positive", "max_tokens")),
            Some(_) => {}
        }
    }
    check_tool_choice(&req)?;
    check_thinking(&req)?;
    if req
        .output_config
        .as_ref()
        .is_some_and(|o| o.format.as_ref().is_some_and(|f| !f.is_null()))
    {
        return Err(invalid(
            "Structured output (output_config.format) is not supported by this server yet.",
            "output_config.format",
        ));
    }
    Ok(req)
}

fn check_blocks(blocks: &[ContentBlock], at: &str) -> Result<(), Error> {
    for (j, b) in blocks.iter().enumerate() {
        if !BLOCK_TYPES.contains(&b.kind.as_str()) {
            return Err(invalid(
                format!(
                    "{at}.{j}.type: unsupported content block type '{}' (expected one of {})",
                    b.kind,
                    BLOCK_TYPES.join(", ")
                ),
                "messages",
            ));
        }
        let missing = match b.kind.as_str() {
            "text" if b.text.is_none() => Some("text"),
            "image" if b.source.is_none() => Some("source"),
            "tool_use" if b.name.is_none() => Some("name"),
            "tool_result" if b.tool_use_id.is_none() => Some("tool_use_id"),
            "thinking" if b.thinking.is_none() => Some("thinking"),
            _ => None,
        };
        if let Some(field) = missing {
            return Err(invalid(
                format!("{at}.{j}.{field}: Field required for a '{}' block", b.kind),
                "messages",
            ));
        }
    }
    Ok(())
}

fn check_tool_choice(req: &MessagesRequest) -> Result<(), Error> {
    let Some(tc) = &req.tool_choice else {
        return Ok(());
    };
    let names: Vec<&str> = req
        .tools
        .iter()
        .flatten()
        .map(|t| t.name.as_str())
        .collect();
    match tc.kind.as_str() {
        "auto" | "none" => Ok(()),
        "any" if names.is_empty() => Err(invalid(
            "tool_choice 'any' requires at least one tool in 'tools'",
            "tool_choice",
        )),
        "any" => Ok(()),
        "tool" => match tc.name.as_deref() {
            None => Err(invalid(
                "tool_choice.name is required when type is 'tool'",
                "tool_choice",
            )),
            Some(n) if !names.contains(&n) => Err(invalid(
                format!("tool_choice names tool '{n}', which is not in 'tools'"),
                "tool_choice",
            )),
            Some(_) => Ok(()),
        },
        other => Err(invalid(
            format!(
                "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none', got '{other}'"
            ),
            "tool_choice",
        )),
    }
}

/// The engine does not cap reasoning tokens separately, so a budget below `max_tokens`
/// (which would need that cap) is refused rather than silently exceeded; a budget at or
/// above `max_tokens` is already enforced by `max_tokens`.
fn check_thinking(req: &MessagesRequest) -> Result<(), Error> {
    let Some(t) = &req.thinking else {
        return Ok(());
    };
    match t.kind.as_str() {
        "enabled" => {
            if let (Some(budget), Some(max)) = (t.budget_tokens, req.max_tokens) {
                if budget < max {
                    return Err(Error::invalid_param(
                        format!(
                            "thinking.budget_tokens ({budget}) below max_tokens ({max}) cannot \
                             be enforced: this server does not cap reasoning tokens separately. \
                             Set budget_tokens >= max_tokens, or use thinking.type 'adaptive'"
                        ),
                        "thinking.budget_tokens",
                        budget,
                    ));
                }
            }
            Ok(())
        }
        "disabled" | "adaptive" => Ok(()),
        other => Err(invalid(
            format!(
                "thinking.type: Input should be 'enabled', 'disabled' or 'adaptive', got '{other}'"
            ),
            "thinking",
        )),
    }
}

fn image_url(source: &Map<String, Value>) -> String {
    let get = |k: &str| source.get(k).and_then(Value::as_str);
    if get("type") == Some("url") {
        return get("url").unwrap_or_default().to_owned();
    }
    format!(
        "data:{};base64,{}",
        get("media_type").unwrap_or("image/jpeg"),
        get("data").unwrap_or_default()
    )
}

/// `str(content)` of a tool result inside an assistant message, as vLLM writes it (the
/// template layer's Python `str()`).
fn python_str(v: &Value) -> String {
    crate::template::json::py_str_json(v)
}

/// Python's `json.dumps(v)` (ASCII-escaped, as vLLM writes a `tool_use` input's arguments).
fn python_json_dumps(v: &Value) -> String {
    let mut out = String::new();
    for c in aphro_parsers::pyjson::dumps(v).chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            // Non-ASCII appears only inside strings; UTF-16 units as Python escapes them.
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

fn convert_user_tool_result(b: &ContentBlock, out: &mut Vec<Value>) {
    let id = b.tool_use_id.clone().unwrap_or_default();
    let mut text = String::new();
    let mut images = Vec::new();
    let mut references = Vec::new();
    match &b.content {
        Some(Value::String(s)) => text = s.clone(),
        Some(Value::Array(items)) => {
            let mut parts = Vec::new();
            for item in items {
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => parts.push(
                        item.get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    ),
                    Some("image") => {
                        if let Some(src) = item.get("source").and_then(Value::as_object) {
                            let url = image_url(src);
                            if !url.is_empty() {
                                images.push(url);
                            }
                        }
                    }
                    Some("tool_reference") => {
                        let name = item
                            .get("tool_name")
                            .or_else(|| item.get("name"))
                            .and_then(Value::as_str);
                        if let Some(n) = name.filter(|n| !n.is_empty()) {
                            references.push(json!({"type": "tool_reference", "name": n}));
                        }
                    }
                    _ => {}
                }
            }
            text = parts.join("\n");
        }
        _ => {}
    }
    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    if !images.is_empty() {
        let parts: Vec<Value> = images
            .into_iter()
            .map(|u| json!({"type": "image_url", "image_url": {"url": u}}))
            .collect();
        out.push(json!({"role": "user", "content": parts}));
    }
    if !references.is_empty() {
        out.push(json!({"role": "tool", "tool_call_id": id, "content": references}));
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn convert_messages(req: &MessagesRequest) -> Vec<Value> {
    let mut out = Vec::new();
    let system = match &req.system {
        Some(SystemPrompt::Text(s)) => s.clone(),
        Some(SystemPrompt::Blocks(blocks)) => blocks
            .iter()
            .filter_map(|b| b.text.as_deref())
            // Claude Code's per-request attribution line would defeat prefix caching.
            .filter(|t| !t.is_empty() && !t.starts_with("x-anthropic-billing-header"))
            .collect(),
        None => String::new(),
    };
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    for m in &req.messages {
        let blocks = match &m.content {
            MessageContent::Text(s) => {
                out.push(json!({"role": m.role, "content": s}));
                continue;
            }
            MessageContent::Blocks(b) => b,
        };
        let mut msg = Map::new();
        msg.insert("role".into(), Value::String(m.role.clone()));
        let mut parts: Vec<Value> = Vec::new();
        let mut tool_calls: Vec<Value> = Vec::new();
        let mut reasoning = String::new();
        let mut has_reasoning = false;
        let mut trailing = Vec::new();
        for b in blocks {
            match b.kind.as_str() {
                "text" => {
                    if let Some(t) = b.text.as_deref().filter(|t| !t.is_empty()) {
                        parts.push(json!({"type": "text", "text": t}));
                    }
                }
                "image" => {
                    if let Some(src) = &b.source {
                        parts.push(
                            json!({"type": "image_url", "image_url": {"url": image_url(src)}}),
                        );
                    }
                }
                "thinking" => {
                    if let Some(t) = &b.thinking {
                        reasoning.push_str(t);
                        has_reasoning = true;
                    }
                }
                "tool_use" => {
                    let input = b
                        .input
                        .clone()
                        .filter(|v| !v.is_null())
                        .unwrap_or(json!({}));
                    tool_calls.push(json!({
                        "id": b.id.clone().filter(|s| !s.is_empty())
                            .unwrap_or_else(|| format!("call_{}", unix_now())),
                        "type": "function",
                        "function": {"name": b.name.clone().unwrap_or_default(),
                                     "arguments": python_json_dumps(&input)},
                    }));
                }
                "tool_result" if m.role == "user" => convert_user_tool_result(b, &mut trailing),
                "tool_result" => {
                    let text = b.content.as_ref().map(python_str).unwrap_or_default();
                    parts.push(json!({"type": "text", "text": format!("Tool result: {text}")}));
                }
                // redacted_thinking is opaque; tool_reference is expanded inside tool results.
                _ => {}
            }
        }
        // vLLM appends the tool messages as it meets the blocks, before the message itself.
        out.append(&mut trailing);
        if has_reasoning {
            msg.insert("reasoning".into(), Value::String(reasoning));
        }
        if !tool_calls.is_empty() {
            msg.insert("tool_calls".into(), Value::Array(tool_calls));
        }
        if parts.len() == 1 && parts[0]["type"] == "text" {
            msg.insert("content".into(), parts[0]["text"].clone());
        } else if !parts.is_empty() {
            msg.insert("content".into(), Value::Array(parts));
        }
        if m.role != "user" || msg.contains_key("content") {
            out.push(Value::Object(msg));
        }
    }
    out
}

/// The chat completion body a Messages request runs as (`endpoints.md` §2.1–2.2).
/// `template_reads` says which variables the chat template reads: `thinking` switches
/// whichever of `enable_thinking` / `thinking` it reads (a template reading neither has no
/// switch, and the model reasons as its template makes it).
pub fn to_chat_body(
    req: &MessagesRequest,
    route: Route,
    template_reads: &dyn Fn(&str) -> bool,
) -> Value {
    let mut chat = Map::new();
    chat.insert("model".into(), Value::String(req.model.clone()));
    chat.insert("messages".into(), Value::Array(convert_messages(req)));
    let mut kwargs = Map::new();
    if let Some(t) = &req.thinking {
        // Templates read one of the two names; the user's own kwargs win.
        let on = t.kind != "disabled";
        for name in ["enable_thinking", "thinking"] {
            if template_reads(name) {
                kwargs.insert(name.into(), Value::Bool(on));
            }
        }
    }
    if let Some(user) = &req.chat_template_kwargs {
        kwargs.extend(user.clone());
    }
    if !kwargs.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
    if route == Route::Messages {
        if let Some(n) = req.max_tokens {
            chat.insert("max_tokens".into(), n.into());
            chat.insert("max_completion_tokens".into(), n.into());
        }
        if let Some(stop) = &req.stop_sequences {
            chat.insert("stop".into(), json!(stop));
        }
        for (k, v) in [("temperature", req.temperature), ("top_p", req.top_p)] {
            if let Some(v) = v {
                chat.insert(k.into(), json!(v));
            }
        }
        if let Some(k) = req.top_k {
            chat.insert("top_k".into(), k.into());
        }
        if let Some(effort) = req.output_config.as_ref().and_then(|o| o.effort.as_ref()) {
            chat.insert("reasoning_effort".into(), Value::String(effort.clone()));
        }
        if let Some(kv) = &req.kv_transfer_params {
            chat.insert("kv_transfer_params".into(), kv.clone());
        }
        if req.stream == Some(true) {
            chat.insert("stream".into(), Value::Bool(true));
            chat.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    if let Some(tc) = &req.tool_choice {
        let v = match tc.kind.as_str() {
            "any" => json!("required"),
            "none" => json!("none"),
            "tool" => json!({"type": "function", "function": {"name": tc.name}}),
            _ => json!("auto"),
        };
        chat.insert("tool_choice".into(), v);
        if let Some(d) = tc.disable_parallel_tool_use {
            chat.insert("parallel_tool_calls".into(), Value::Bool(!d));
        }
    }
    if let Some(tools) = &req.tools {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                let mut schema = t.input_schema.clone();
                schema
                    .entry("type")
                    .or_insert_with(|| Value::String("object".into()));
                let mut f = Map::new();
                f.insert("name".into(), Value::String(t.name.clone()));
                if let Some(d) = &t.description {
                    f.insert("description".into(), Value::String(d.clone()));
                }
                f.insert("parameters".into(), Value::Object(schema));
                if let Some(d) = t.defer_loading {
                    f.insert("defer_loading".into(), Value::Bool(d));
                }
                json!({"type": "function", "function": f})
            })
            .collect();
        chat.entry("tool_choice").or_insert_with(|| json!("auto"));
        chat.insert("tools".into(), Value::Array(tools));
    }
    Value::Object(chat)
}

/// Anthropic's `stop_reason` (and `stop_sequence`) for a chat choice's finish.
pub fn stop_reason(
    finish_reason: Option<&str>,
    stop: Option<&StopReason>,
) -> (Option<&'static str>, Option<String>) {
    match (finish_reason, stop) {
        // Anthropic, not vLLM: a matched stop string is its own reason.
        (Some("stop"), Some(StopReason::Text(s))) => (Some("stop_sequence"), Some(s.clone())),
        (Some("stop"), _) => (Some("end_turn"), None),
        (Some("length"), _) => (Some("max_tokens"), None),
        (Some("tool_calls"), _) => (Some("tool_use"), None),
        _ => (None, None),
    }
}

fn signature() -> String {
    use rand::Rng;
    let v: u128 = rand::rng().random();
    format!("{v:032x}")
}

/// The non-streaming Messages response for a chat response (`endpoints.md` §2.3).
pub fn from_chat_response(resp: &ChatCompletionResponse, model: &str) -> Value {
    let mut content = Vec::new();
    let (mut reason, mut sequence) = (None, None);
    if let Some(choice) = resp.choices.first() {
        (reason, sequence) =
            stop_reason(choice.finish_reason.as_deref(), choice.stop_reason.as_ref());
        let msg = &choice.message;
        if let Some(r) = msg.reasoning.as_deref().filter(|r| !r.is_empty()) {
            content.push(json!({"type": "thinking", "thinking": r, "signature": signature()}));
        }
        if let Some(t) = msg.content.as_deref().filter(|t| !t.is_empty()) {
            content.push(json!({"type": "text", "text": t}));
        }
        for call in &msg.tool_calls {
            let input = serde_json::from_str::<Value>(&call.function.arguments)
                .unwrap_or_else(|_| json!({}));
            content.push(json!({"type": "tool_use", "id": call.id,
                                "name": call.function.name, "input": input}));
        }
    }
    json!({
        "id": resp.id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {"input_tokens": resp.usage.prompt_tokens,
                  "output_tokens": resp.usage.completion_tokens.unwrap_or(0)},
    })
}

/// The `count_tokens` response for a rendered prompt of `n` tokens (§2.6).
pub fn count_tokens_response(n: usize) -> Value {
    json!({"input_tokens": n, "context_management": {"original_input_tokens": n}})
}

/// `POST /v1/messages/count_tokens`: the prompt length of the equivalent chat render
/// (template, tools and generation prompt included), as the response body.
pub fn count_tokens(renderer: &crate::Renderer, body: &Value) -> Result<Value, Error> {
    let req = parse_request(body, Route::CountTokens)?;
    let body = to_chat_body(&req, Route::CountTokens, &|v| {
        renderer.chat_template_reads(v)
    });
    let chat = crate::renderer::parse_chat_request(&body)?;
    Ok(count_tokens_response(
        renderer.render_chat(&chat)?.token_ids.len(),
    ))
}

/// One SSE event: its `event:` name and `data:` object.
pub type StreamEvent = (&'static str, Value);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// Turns the coupled chat chunk stream (`data:` objects, in vLLM's `exclude_unset` shape)
/// into Anthropic's event stream (§2.4), one chunk at a time.
#[derive(Debug)]
pub struct MessageStream {
    id: String,
    model: String,
    input_tokens: u64,
    started: bool,
    finished: bool,
    /// The open block and its index; the next block gets `next_index`.
    open: Option<(Block, usize)>,
    next_index: usize,
    thinking_signature: Option<String>,
    active_tool_id: Option<String>,
    tool_ids: std::collections::HashMap<u64, String>,
    finish_reason: Option<String>,
    stop: Option<StopReason>,
}

impl MessageStream {
    pub fn new(id: impl Into<String>, model: impl Into<String>, input_tokens: u64) -> Self {
        MessageStream {
            id: id.into(),
            model: model.into(),
            input_tokens,
            started: false,
            finished: false,
            open: None,
            next_index: 0,
            thinking_signature: None,
            active_tool_id: None,
            tool_ids: Default::default(),
            finish_reason: None,
            stop: None,
        }
    }

    /// `message_start` and a `ping`, once (Anthropic, not vLLM: `type`/`role` are set).
    fn start(&mut self, out: &mut Vec<StreamEvent>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        out.push((
            "message_start",
            json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "content": [],
                "model": self.model, "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}}),
        ));
        out.push(("ping", json!({"type": "ping"})));
    }

    fn close_block(&mut self, out: &mut Vec<StreamEvent>) {
        let Some((kind, index)) = self.open.take() else {
            return;
        };
        if kind == Block::Thinking {
            let sig = self.thinking_signature.take().unwrap_or_else(signature);
            out.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "signature_delta", "signature": sig}}),
            ));
        }
        self.active_tool_id = None;
        out.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }

    fn open_block(&mut self, kind: Block, block: Value, out: &mut Vec<StreamEvent>) -> usize {
        self.close_block(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((kind, index));
        if kind == Block::Thinking {
            self.thinking_signature = Some(signature());
        }
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        index
    }

    fn delta(&mut self, kind: Block, block: Value, delta: Value, out: &mut Vec<StreamEvent>) {
        let index = match self.open {
            Some((k, i)) if k == kind => i,
            _ => self.open_block(kind, block, out),
        };
        out.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    /// The events for one chat chunk.
    pub fn push(&mut self, chunk: &Value) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        self.start(&mut out);
        let choices = chunk.get("choices").and_then(Value::as_array);
        let Some(choice) = choices.and_then(|c| c.first()) else {
            // The usage-only chunk ends the message.
            if chunk.get("usage").is_some_and(|u| !u.is_null()) {
                let output = chunk
                    .pointer("/usage/completion_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                self.message_delta(output, &mut out);
            }
            return out;
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(f.to_owned());
            self.stop = choice
                .get("stop_reason")
                .and_then(|v| serde_json::from_value(v.clone()).ok());
        }
        let delta = choice.get("delta");
        let text = |k: &str| {
            delta
                .and_then(|d| d.get(k))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        if let Some(r) = text("reasoning") {
            self.delta(
                Block::Thinking,
                json!({"type": "thinking", "thinking": ""}),
                json!({"type": "thinking_delta", "thinking": r}),
                &mut out,
            );
        }
        if let Some(t) = text("content") {
            self.delta(
                Block::Text,
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": t}),
                &mut out,
            );
        }
        let calls = delta
            .and_then(|d| d.get("tool_calls"))
            .and_then(Value::as_array);
        for call in calls.into_iter().flatten() {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let name = call.pointer("/function/name").and_then(Value::as_str);
            let id = match call.get("id").and_then(Value::as_str) {
                Some(id) => {
                    self.tool_ids.insert(index, id.to_owned());
                    if let Some(name) = name {
                        if self.active_tool_id.as_deref() != Some(id) {
                            self.open_block(
                                Block::ToolUse,
                                json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                                &mut out,
                            );
                            self.active_tool_id = Some(id.to_owned());
                        }
                    }
                    Some(id.to_owned())
                }
                None => self.tool_ids.get(&index).cloned(),
            };
            let args = call
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty());
            if let (Some(args), Some(id), Some((Block::ToolUse, i))) = (args, id, self.open) {
                if self.active_tool_id.as_deref() == Some(id.as_str()) {
                    out.push((
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                               "delta": {"type": "input_json_delta", "partial_json": args}}),
                    ));
                }
            }
        }
        out
    }

    fn message_delta(&mut self, output_tokens: u64, out: &mut Vec<StreamEvent>) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        self.close_block(out);
        let (reason, sequence) = stop_reason(
            Some(self.finish_reason.as_deref().unwrap_or("stop")),
            self.stop.as_ref(),
        );
        out.push((
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": {"input_tokens": self.input_tokens, "output_tokens": output_tokens}}),
        ));
    }

    /// The closing events once the chunk stream ended (`message_stop`).
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        self.start(&mut out);
        self.message_delta(0, &mut out);
        out.push(("message_stop", json!({"type": "message_stop"})));
        out
    }
}

/// Anthropic's error type for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 | 503 => "overloaded_error",
        _ => "api_error",
    }
}

/// Anthropic's error body (Anthropic, not vLLM, whose bodies carry its own type names).
pub fn error_body(status: u16, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Value {
        let reads = |v: &str| v == "enable_thinking";
        to_chat_body(
            &parse_request(&body, Route::Messages).expect("valid"),
            Route::Messages,
            &reads,
        )
    }

    #[test]
    fn maps_system_blocks_tools_and_sampling() {
        let c = chat(json!({
            "model": "m", "max_tokens": 16, "temperature": 0, "top_k": 5,
            "stop_sequences": ["\n\n"], "metadata": {"user_id": "u"},
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1"},
                       {"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "tools": [{"name": "get_weather", "description": "d",
                       "input_schema": {"properties": {"city": {"type": "string"}}}}],
            "messages": [{"role": "user", "content": "Hi"}],
        }));
        assert_eq!(
            c["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(c["max_tokens"], 16);
        assert_eq!(c["max_completion_tokens"], 16);
        assert_eq!(c["stop"], json!(["\n\n"]));
        assert_eq!(c["top_k"], 5);
        let effort = chat(
            json!({"model": "m", "max_tokens": 2, "output_config": {"effort": "high"},
                            "messages": [{"role": "user", "content": "q"}]}),
        );
        assert_eq!(effort["reasoning_effort"], "high");
        assert_eq!(c["tool_choice"], "auto");
        assert_eq!(
            c["tools"][0]["function"]["parameters"],
            json!({"properties": {"city": {"type": "string"}}, "type": "object"})
        );
        assert!(c.get("metadata").is_none());
    }

    #[test]
    fn tool_use_and_tool_result_round_trip_into_chat_messages() {
        let c = chat(json!({
            "model": "m", "max_tokens": 8,
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "f"},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "go"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1, "b": "é"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]}]},
            ],
        }));
        let m = c["messages"].as_array().expect("messages");
        assert_eq!(m[0], json!({"role": "user", "content": "go"}));
        assert_eq!(m[1]["reasoning"], "hmm");
        assert_eq!(m[1]["content"], "calling");
        assert_eq!(
            m[1]["tool_calls"][0]["function"],
            json!({"name": "f", "arguments": "{\"a\": 1, \"b\": \"\\u00e9\"}"})
        );
        // The user message held only a tool result, so it is dropped after its tool message.
        assert_eq!(
            m[2],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "r1\nr2"})
        );
        assert_eq!(m.len(), 3);
        assert_eq!(
            c["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
    }

    #[test]
    fn thinking_switches_the_template_and_refuses_an_unenforceable_budget() {
        let c = chat(json!({"model": "m", "max_tokens": 100,
            "thinking": {"type": "enabled", "budget_tokens": 100},
            "chat_template_kwargs": {"thinking": false},
            "messages": [{"role": "user", "content": "q"}]}));
        // Only the switch the template reads; the user's own kwargs are laid on top.
        assert_eq!(
            c["chat_template_kwargs"],
            json!({"enable_thinking": true, "thinking": false})
        );
        let c = chat(
            json!({"model": "m", "max_tokens": 10, "thinking": {"type": "disabled"},
            "messages": [{"role": "user", "content": "q"}]}),
        );
        assert_eq!(c["chat_template_kwargs"], json!({"enable_thinking": false}));
        let e = parse_request(
            &json!({"model": "m", "max_tokens": 2048,
                    "thinking": {"type": "enabled", "budget_tokens": 1024},
                    "messages": [{"role": "user", "content": "q"}]}),
            Route::Messages,
        )
        .expect_err("refused");
        assert_eq!(e.param(), Some("thinking.budget_tokens"));
    }

    #[test]
    fn bad_inputs_are_400s_naming_the_field() {
        let cases = [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "q"}]}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "q"}]}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": []}),
                "messages",
            ),
            (
                json!({"model": "m", "max_tokens": 1,
                    "messages": [{"role": "user", "content": [{"type": "video"}]}]}),
                "messages",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "q"}]}),
                "messages",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "tools": [{"name": "f", "input_schema": {}}],
                    "tool_choice": {"type": "tool", "name": "g"},
                    "messages": [{"role": "user", "content": "q"}]}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "tool_choice": {"type": "tool"},
                    "messages": [{"role": "user", "content": "q"}]}),
                "tool_choice",
            ),
        ];
        for (body, param) in cases {
            let e = parse_request(&body, Route::Messages).expect_err("bad input");
            assert_eq!((e.status(), e.param()), (400, Some(param)), "{body}");
        }
        // A structural error (wrong type) is a 400 too, without a panic.
        let e = parse_request(
            &json!({"model": "m", "max_tokens": "x", "messages": 3}),
            Route::Messages,
        )
        .expect_err("bad types");
        assert_eq!(e.status(), 400);
        let e = parse_request(
            &json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "q"}],
                    "output_config": {"format": {"type": "json_schema", "schema": {}}}}),
            Route::Messages,
        )
        .expect_err("unsupported");
        assert_eq!(e.param(), Some("output_config.format"));
        // count_tokens takes no max_tokens.
        assert!(parse_request(
            &json!({"model": "m", "messages": [{"role": "user", "content": "q"}]}),
            Route::CountTokens
        )
        .is_ok());
    }

    #[test]
    fn stream_converts_chunks_into_the_event_sequence() {
        let mut s = MessageStream::new("chatcmpl-1", "m", 7);
        let mut events = Vec::new();
        for chunk in [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"index": 0, "delta": {"reasoning": "think"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{\"a\""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                    "function": {"arguments": ": 1}"}}]}, "finish_reason": "tool_calls", "stop_reason": null}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}}),
        ] {
            events.extend(s.push(&chunk));
        }
        events.extend(s.finish());
        let names: Vec<&str> = events.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(events[0].1["message"]["role"], "assistant");
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 7);
        assert_eq!(events[4].1["delta"]["type"], "signature_delta");
        assert_eq!(
            events[9].1["content_block"],
            json!({"type": "tool_use", "id": "c1", "name": "f", "input": {}})
        );
        assert_eq!(events[11].1["delta"]["partial_json"], ": 1}");
        assert_eq!(events[11].1["index"], 2);
        assert_eq!(events[13].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(events[13].1["usage"]["output_tokens"], 9);
    }

    #[test]
    fn a_matched_stop_string_is_a_stop_sequence() {
        let mut s = MessageStream::new("id", "m", 1);
        s.push(&json!({"choices": [{"index": 0, "delta": {"content": "a"},
                                     "finish_reason": "stop", "stop_reason": "\n"}]}));
        let ev = s.push(&json!({"choices": [], "usage": {"completion_tokens": 2}}));
        let delta = &ev.iter().find(|e| e.0 == "message_delta").expect("delta").1;
        assert_eq!(
            delta["delta"],
            json!({"stop_reason": "stop_sequence", "stop_sequence": "\n"})
        );
        assert_eq!(
            stop_reason(Some("stop"), Some(&StopReason::Token(2))),
            (Some("end_turn"), None)
        );
        assert_eq!(
            error_body(400, "x")["error"]["type"],
            "invalid_request_error"
        );
    }

    #[test]
    fn an_assistant_tool_result_is_python_text() {
        assert_eq!(
            python_str(&json!([{"type": "text", "text": "it's"}, null, true, 1.5])),
            "[{'type': 'text', 'text': \"it's\"}, None, True, 1.5]"
        );
    }
}
