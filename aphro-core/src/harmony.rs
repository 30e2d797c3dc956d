//! gpt-oss prompts in OpenAI's Harmony format, rendered the way vLLM renders them.
//!
//! vLLM does not run gpt-oss's Jinja template: both its Python renderer
//! (`renderers/online_renderer.py`, `use_harmony`, via `openai_harmony`) and `vllm-rs`
//! (`chat-renderer/src/harmony`) turn the chat into Harmony messages and let the Harmony
//! encoding produce the token ids. This module does the same in two halves:
//!
//! * **the conversation** ([`HarmonyRenderer::conversation`]): vLLM's lowering of a chat
//!   request — a system preamble with the date and reasoning effort, the first
//!   system/developer message peeled into developer instructions, request tools as a
//!   `functions` namespace, assistant turns split into `analysis` / `commentary` / `final`
//!   channels and tool calls, tool results authored by `functions.{name}`, stale
//!   chain-of-thought dropped once a later `final` answer exists;
//! * **the encoding** ([`HarmonyRenderer::render`]): the `openai-harmony` crate's renderer
//!   (v0.0.8, `encoding.rs`), ported here because that crate tokenizes with its own copy of
//!   `o200k_base` that it downloads at run time. aphro encodes with the model's own
//!   `tokenizer.json` (the same vocabulary): formatting tokens by id, and every text piece on
//!   its own as *ordinary* text, so a `<|end|>` typed by a user stays text, as in Harmony.
use crate::content_parts::{parse_parts, ContentCapabilities, Part};
use crate::error::{Error, Result};
use crate::protocol::{ChatCompletionRequest, ChatMessage, ChatTool, MessageContent};
use crate::tokenizer::Tokenizer;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap, HashSet};

/// The system identity Harmony's `SystemContent::default()` carries.
const MODEL_IDENTITY: &str = "You are ChatGPT, a large language model trained by OpenAI.";
const KNOWLEDGE_CUTOFF: &str = "2024-06";
const CHANNELS: [&str; 3] = ["analysis", "commentary", "final"];

/// How the Harmony preamble is built; vLLM reads both from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HarmonyOptions {
    /// `VLLM_SYSTEM_START_DATE`: the `Current date:` line (`YYYY-MM-DD`). `None`: today, from
    /// the renderer's clock.
    pub start_date: Option<String>,
    /// `VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS` (a non-zero integer): system-message
    /// instructions extend the system identity instead of becoming developer instructions.
    pub system_instructions: bool,
}

impl HarmonyOptions {
    /// The options from vLLM's environment variables.
    pub fn from_env() -> Self {
        HarmonyOptions {
            start_date: std::env::var("VLLM_SYSTEM_START_DATE")
                .ok()
                .filter(|d| !d.is_empty()),
            system_instructions: std::env::var("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS")
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .is_some_and(|v| v != 0),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A function tool in a developer message's `functions` namespace.
#[derive(Debug, Clone, PartialEq)]
struct ToolDescription {
    name: String,
    description: String,
    parameters: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
struct SystemContent {
    model_identity: String,
    reasoning_effort: &'static str,
    conversation_start_date: String,
}

#[derive(Debug, Clone, PartialEq, Default)]
struct DeveloperContent {
    instructions: Option<String>,
    tools: Vec<ToolDescription>,
}

#[derive(Debug, Clone, PartialEq)]
enum Content {
    Text(String),
    System(SystemContent),
    Developer(DeveloperContent),
}

/// One Harmony message: `<|start|>{author}[ to={recipient}][<|channel|>{channel}]
/// [ {content_type}]<|message|>{content}<|end|>` (`<|call|>` for an assistant tool call).
#[derive(Debug, Clone, PartialEq)]
struct Message {
    role: Role,
    /// Tool messages are authored by their name (`functions.get_weather`).
    author_name: Option<String>,
    recipient: Option<String>,
    channel: Option<&'static str>,
    content_type: Option<&'static str>,
    content: Content,
}

impl Message {
    fn new(role: Role, content: Content) -> Self {
        Message {
            role,
            author_name: None,
            recipient: None,
            channel: None,
            content_type: None,
            content,
        }
    }

    fn text(role: Role, text: String) -> Self {
        Self::new(role, Content::Text(text))
    }

    fn on(mut self, channel: &'static str) -> Self {
        self.channel = Some(channel);
        self
    }
}

/// Ids of the Harmony formatting tokens in the model's vocabulary.
#[derive(Debug, Clone, Copy)]
struct FormattingIds {
    start: u32,
    message: u32,
    end: u32,
    channel: u32,
    constrain: u32,
    call: u32,
}

/// Renders chat requests for a gpt-oss model; built once per [`crate::Renderer`].
pub struct HarmonyRenderer {
    /// The model's tokenizer with special-token matching off: Harmony encodes every text
    /// piece with `encode_ordinary`.
    ordinary: tokenizers::Tokenizer,
    ids: FormattingIds,
    options: HarmonyOptions,
}

impl std::fmt::Debug for HarmonyRenderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarmonyRenderer")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Token ids with the byte span of the rendered prompt each covers.
pub type HarmonyIds = (Vec<u32>, Vec<(usize, usize)>);

impl HarmonyRenderer {
    /// Fails when the vocabulary lacks a Harmony formatting token (not a gpt-oss tokenizer).
    pub fn new(tokenizer: &Tokenizer, options: HarmonyOptions) -> Result<Self> {
        let id = |t: &str| {
            tokenizer.token_to_id(t).ok_or_else(|| {
                Error::Tokenizer(format!(
                    "the tokenizer has no Harmony formatting token {t}, so gpt-oss prompts \
                     cannot be rendered"
                ))
            })
        };
        let ids = FormattingIds {
            start: id("<|start|>")?,
            message: id("<|message|>")?,
            end: id("<|end|>")?,
            channel: id("<|channel|>")?,
            constrain: id("<|constrain|>")?,
            call: id("<|call|>")?,
        };
        let mut ordinary = tokenizer.hf().clone();
        ordinary.set_encode_special_tokens(true);
        Ok(HarmonyRenderer {
            ordinary,
            ids,
            options,
        })
    }

    /// The request's prompt ids (and their spans in the prompt text), as vLLM renders a
    /// gpt-oss chat. `today` is the date used when no start date is pinned.
    pub fn render(&self, req: &ChatCompletionRequest, today: &str) -> Result<HarmonyIds> {
        let messages = self.conversation(req, today)?;
        let mut out = Encoder::new(self);
        let has_function_tools = messages.iter().any(|m| match &m.content {
            Content::Developer(d) => !d.tools.is_empty(),
            _ => false,
        });
        for m in &messages {
            out.message(m, has_function_tools)?;
        }
        if req.add_generation_prompt() {
            out.special(self.ids.start);
            out.text(Role::Assistant.as_str())?;
        }
        Ok((out.ids, out.offsets))
    }

    /// vLLM's lowering of a chat request to Harmony messages.
    fn conversation(&self, req: &ChatCompletionRequest, today: &str) -> Result<Vec<Message>> {
        if req.continue_final_message {
            let last_is_assistant = req.messages.last().is_some_and(|m| m.role == "assistant");
            return Err(Error::Template(if last_is_assistant {
                "chat template error: Harmony renderer does not support continue_final_message"
                    .into()
            } else {
                "Cannot set `continue_final_message` to True when the last message is not from \
                 the assistant."
                    .into()
            }));
        }
        let start_date = self.options.start_date.as_deref().unwrap_or(today);
        let (instructions, leading_tools, rest) = match req.messages.first() {
            Some(m) if m.role == "system" => (Some(flatten_text(m)?), None, &req.messages[1..]),
            Some(m) if m.role == "developer" => (
                Some(flatten_text(m)?),
                message_tools(m)?,
                &req.messages[1..],
            ),
            _ => (None, None, &req.messages[..]),
        };
        let effort = req
            .reasoning_effort
            .as_deref()
            .map(reasoning_effort)
            .transpose()?;
        let identity_instructions = instructions
            .as_deref()
            .filter(|_| self.options.system_instructions);
        let mut messages = vec![Message::new(
            Role::System,
            Content::System(system_content(identity_instructions, effort, start_date)),
        )];

        let mut developer = DeveloperContent::default();
        if !self.options.system_instructions {
            developer.instructions = instructions.filter(|t| !t.is_empty());
        }
        // Request tools are shown whatever `tool_choice` says (`none` included), as vllm-rs
        // does: the model knows them, the grammar or parser decides what a call may be.
        developer
            .tools
            .extend(req.tools.iter().flatten().map(tool_description));
        if let Some(tools) = &leading_tools {
            developer.tools.extend(tools.iter().map(tool_description));
        }
        if developer.instructions.is_some() || !developer.tools.is_empty() {
            messages.push(Message::new(Role::Developer, Content::Developer(developer)));
        }

        let tool_names = tool_call_names(&req.messages);
        for m in rest {
            self.lower(m, &tool_names, start_date, &mut messages)?;
        }
        Ok(drop_stale_analysis(messages))
    }

    /// One request message after the preamble → Harmony messages.
    fn lower(
        &self,
        m: &ChatMessage,
        tool_names: &HashMap<String, String>,
        start_date: &str,
        out: &mut Vec<Message>,
    ) -> Result<()> {
        match m.role.as_str() {
            "system" if self.options.system_instructions => {
                let text = flatten_text(m)?;
                out.push(Message::new(
                    Role::System,
                    Content::System(system_content(Some(&text), None, start_date)),
                ));
            }
            "system" | "developer" => {
                let instructions = Some(flatten_text(m)?).filter(|t| !t.is_empty());
                let tools = message_tools(m)?
                    .unwrap_or_default()
                    .iter()
                    .map(tool_description)
                    .collect();
                out.push(Message::new(
                    Role::Developer,
                    Content::Developer(DeveloperContent {
                        instructions,
                        tools,
                    }),
                ));
            }
            "user" => out.push(Message::text(Role::User, flatten_text(m)?)),
            "assistant" => assistant_messages(m, out)?,
            "tool" => {
                let id = m.tool_call_id.as_deref().unwrap_or_default();
                let name = tool_names.get(id).ok_or_else(|| {
                    Error::Template(format!(
                        "invalid Harmony tool message: unknown tool_call_id `{id}`"
                    ))
                })?;
                let mut msg = Message::text(Role::Tool, flatten_text(m)?).on("commentary");
                msg.author_name = Some(format!("functions.{name}"));
                msg.recipient = Some("assistant".into());
                out.push(msg);
            }
            other => {
                return Err(Error::bad_request(format!(
                    "chat role `{other}` is not supported by this chat renderer"
                )))
            }
        }
        Ok(())
    }
}

/// The system message: identity (plus instructions when they go there), knowledge cutoff,
/// date, reasoning effort (Harmony's default is medium) and the required channels.
fn system_content(
    instructions: Option<&str>,
    effort: Option<&'static str>,
    start_date: &str,
) -> SystemContent {
    let model_identity = match instructions.filter(|t| !t.is_empty()) {
        Some(i) => format!("{MODEL_IDENTITY}\n{i}"),
        None => MODEL_IDENTITY.to_owned(),
    };
    SystemContent {
        model_identity,
        reasoning_effort: effort.unwrap_or("medium"),
        conversation_start_date: start_date.to_owned(),
    }
}

/// Harmony knows three efforts; vLLM refuses the other OpenAI values for gpt-oss.
fn reasoning_effort(effort: &str) -> Result<&'static str> {
    match effort {
        "low" => Ok("low"),
        "medium" => Ok("medium"),
        "high" => Ok("high"),
        other => Err(Error::for_param(
            format!(
                "reasoning_effort={other:?} is not supported by Harmony. Supported values are: \
                 low, medium, high."
            ),
            "reasoning_effort",
        )),
    }
}

fn tool_description(t: &ChatTool) -> ToolDescription {
    ToolDescription {
        name: t.function.name.clone(),
        description: t.function.description.clone().unwrap_or_default(),
        parameters: Some(
            t.function
                .parameters
                .clone()
                .unwrap_or_else(|| Value::Object(Default::default())),
        ),
    }
}

/// A developer message's own `tools` (vLLM's `ChatMessage::Developer { tools }`).
fn message_tools(m: &ChatMessage) -> Result<Option<Vec<ChatTool>>> {
    match m.extra.get("tools") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| {
            Error::for_param(
                format!("invalid tools on a {} message: {e}", m.role),
                "messages",
            )
        }),
    }
}

/// Text content concatenated without separators; a media part is vLLM's refusal for a
/// text-only model.
fn flatten_text(m: &ChatMessage) -> Result<String> {
    Ok(match &m.content {
        None => String::new(),
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => {
            let caps = ContentCapabilities {
                modalities: BTreeSet::new(),
                model_name: String::new(),
            };
            parse_parts(parts, &caps)?
                .into_iter()
                .filter_map(|p| match p {
                    Part::Text(t) => Some(t),
                    Part::ToolReference(_) | Part::Media(_) => None,
                })
                .collect()
        }
    })
}

/// Assistant history in channels: visible text goes to `commentary` when the turn calls
/// tools and to `final` otherwise; reasoning to `analysis`; each call to
/// `functions.{name}` on `commentary` with `<|constrain|>json` arguments.
fn assistant_messages(m: &ChatMessage, out: &mut Vec<Message>) -> Result<()> {
    let text = flatten_text(m)?;
    let calls = m.tool_calls.as_deref().unwrap_or_default();
    if !calls.is_empty() && !text.is_empty() {
        out.push(Message::text(Role::Assistant, text.clone()).on("commentary"));
    }
    if let Some(reasoning) = &m.reasoning {
        out.push(Message::text(Role::Assistant, reasoning.clone()).on("analysis"));
    }
    if calls.is_empty() {
        if !text.is_empty() {
            out.push(Message::text(Role::Assistant, text).on("final"));
        }
        return Ok(());
    }
    for call in calls {
        let arguments = match &call.function.arguments {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        let mut msg = Message::text(Role::Assistant, arguments).on("commentary");
        msg.recipient = Some(format!("functions.{}", call.function.name));
        msg.content_type = Some("<|constrain|>json");
        out.push(msg);
    }
    Ok(())
}

/// Tool-call id → function name over the whole history, for the tool results' authors.
fn tool_call_names(messages: &[ChatMessage]) -> HashMap<String, String> {
    messages
        .iter()
        .filter(|m| m.role == "assistant")
        .flat_map(|m| m.tool_calls.iter().flatten())
        .filter_map(|c| Some((c.id.clone()?, c.function.name.clone())))
        .collect()
}

/// vLLM's clean-up: once an assistant `final` message exists, the `analysis` before the last
/// one is chain-of-thought of finished turns and is not replayed.
fn drop_stale_analysis(messages: Vec<Message>) -> Vec<Message> {
    let Some(last_final) = messages
        .iter()
        .rposition(|m| m.role == Role::Assistant && m.channel == Some("final"))
    else {
        return messages;
    };
    messages
        .into_iter()
        .enumerate()
        .filter(|(i, m)| *i >= last_final || m.channel != Some("analysis"))
        .map(|(_, m)| m)
        .collect()
}

/// Accumulates ids and the prompt text they spell, piece by piece.
struct Encoder<'a> {
    renderer: &'a HarmonyRenderer,
    ids: Vec<u32>,
    offsets: Vec<(usize, usize)>,
    /// Bytes of prompt text rendered so far (the offsets' base).
    len: usize,
}

impl<'a> Encoder<'a> {
    fn new(renderer: &'a HarmonyRenderer) -> Self {
        Encoder {
            renderer,
            ids: Vec::new(),
            offsets: Vec::new(),
            len: 0,
        }
    }

    fn special(&mut self, id: u32) {
        // Every formatting token is `<|name|>`; its span is its own text.
        let width = self
            .renderer
            .ordinary
            .id_to_token(id)
            .map_or(0, |t| t.len());
        self.ids.push(id);
        self.offsets.push((self.len, self.len + width));
        self.len += width;
    }

    fn text(&mut self, text: &str) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let enc = self
            .renderer
            .ordinary
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        self.ids.extend_from_slice(enc.get_ids());
        let base = self.len;
        self.offsets
            .extend(enc.get_offsets().iter().map(|&(a, b)| (base + a, base + b)));
        self.len += text.len();
        Ok(())
    }

    fn message(&mut self, m: &Message, has_function_tools: bool) -> Result<()> {
        let ids = self.renderer.ids;
        self.special(ids.start);
        match (&m.role, &m.author_name) {
            (Role::Tool, Some(name)) => self.text(name)?,
            (Role::Tool, None) => return Err(Error::Template("Tools should have a name!".into())),
            (role, name) => {
                self.text(role.as_str())?;
                if let Some(name) = name {
                    self.text(&format!(":{name}"))?;
                }
            }
        }
        // The channel comes before the recipient (`<|channel|>commentary to=functions.f`), as
        // gpt-oss was trained and as vllm-rs's Harmony renders it.
        if let Some(channel) = m.channel {
            self.special(ids.channel);
            self.text(channel)?;
        }
        if let Some(r) = m.recipient.as_deref().filter(|r| *r != "all") {
            self.text(&format!(" to={r}"))?;
        }
        if let Some(ct) = m.content_type {
            match ct.strip_prefix("<|constrain|>") {
                Some(rest) => {
                    self.text(" ")?;
                    self.special(ids.constrain);
                    self.text(rest)?;
                }
                None => self.text(&format!(" {ct}"))?,
            }
        }
        self.special(ids.message);
        match &m.content {
            Content::Text(t) => self.text(t)?,
            Content::System(s) => self.text(&render_system(s, has_function_tools))?,
            Content::Developer(d) => self.text(&render_developer(d))?,
        }
        if m.role == Role::Assistant && m.recipient.is_some() {
            self.special(ids.call);
        } else {
            self.special(ids.end);
        }
        Ok(())
    }
}

fn render_system(s: &SystemContent, has_function_tools: bool) -> String {
    let top = [
        s.model_identity.clone(),
        format!("Knowledge cutoff: {KNOWLEDGE_CUTOFF}"),
        format!("Current date: {}", s.conversation_start_date),
    ]
    .join("\n");
    let mut channels = format!(
        "# Valid channels: {}. Channel must be included for every message.",
        CHANNELS.join(", ")
    );
    if has_function_tools {
        channels.push_str("\nCalls to these tools must go to the commentary channel: 'functions'.");
    }
    [top, format!("Reasoning: {}", s.reasoning_effort), channels].join("\n\n")
}

fn render_developer(d: &DeveloperContent) -> String {
    let mut sections = Vec::new();
    if let Some(i) = &d.instructions {
        sections.push("# Instructions".to_owned());
        sections.push(i.clone());
    }
    if !d.tools.is_empty() {
        sections.push(tools_section(&d.tools));
    }
    sections.join("\n\n")
}

/// The `# Tools` section with the one `functions` namespace vLLM builds.
fn tools_section(tools: &[ToolDescription]) -> String {
    let mut ns = vec![
        "## functions\n".to_owned(),
        "namespace functions {\n".to_owned(),
    ];
    for tool in tools {
        for line in tool.description.lines() {
            ns.push(format!("// {line}"));
        }
        match &tool.parameters {
            Some(p) => ns.push(format!(
                "type {} = (_: {}) => any;\n",
                tool.name,
                schema_to_typescript(p, "")
            )),
            None => ns.push(format!("type {} = () => any;\n", tool.name)),
        }
    }
    ns.push("} // namespace functions".to_owned());
    ["# Tools".to_owned(), ns.join("\n")].join("\n\n")
}

fn is_enum(schema: &Value) -> bool {
    schema
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

/// `default: …` as Harmony writes it: strings quoted unless the schema is an enum.
fn default_comment(schema: &Value, default: &Value) -> String {
    match default.as_str() {
        Some(s) if !is_enum(schema) => format!("default: \"{s}\""),
        Some(s) => format!("default: {s}"),
        None => format!("default: {default}"),
    }
}

fn nullable(schema: &Value, type_str: String) -> String {
    if schema
        .get("nullable")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        && !type_str.contains("null")
    {
        format!("{type_str} | null")
    } else {
        type_str
    }
}

/// A JSON schema as the TypeScript-like type Harmony shows the model
/// (`HarmonyEncoding::json_schema_to_typescript`).
fn schema_to_typescript(schema: &Value, indent: &str) -> String {
    if let Some(variants) = schema.get("oneOf").and_then(Value::as_array) {
        let mut out = String::new();
        for (i, variant) in variants.iter().enumerate() {
            if i > 0 {
                out.push('\n');
                out.push_str(&format!("{indent} | "));
            } else {
                out.push_str(&format!("\n{indent} | "));
            }
            let ty = schema_to_typescript(variant, &format!("{indent}   "));
            out.push_str(&nullable(variant, ty));
            let mut comments = Vec::new();
            if let Some(d) = variant.get("description").and_then(Value::as_str) {
                comments.push(d.to_owned());
            }
            if let Some(default) = variant.get("default") {
                // The top-level oneOf writes enum defaults as JSON (quoted), unlike elsewhere.
                match default.as_str() {
                    Some(s) if !is_enum(variant) => comments.push(format!("default: \"{s}\"")),
                    _ => comments.push(format!("default: {default}")),
                }
            }
            if !comments.is_empty() {
                out.push_str(&format!(" // {}", comments.join(" ")));
            }
        }
        return out;
    }
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let names: Vec<&str> = types
            .iter()
            .filter_map(Value::as_str)
            .map(|t| if t == "integer" { "number" } else { t })
            .collect();
        if !names.is_empty() {
            return names.join(" | ");
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => object_to_typescript(schema, indent),
        Some("string") => {
            let enums: Vec<String> = schema
                .get("enum")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(|s| format!("\"{s}\"")))
                .collect();
            if enums.is_empty() {
                "string".to_owned()
            } else {
                enums.join(" | ")
            }
        }
        Some("number") | Some("integer") => "number".to_owned(),
        Some("boolean") => "boolean".to_owned(),
        Some("array") => match schema.get("items") {
            Some(items) => format!("{}[]", schema_to_typescript(items, indent)),
            None => "Array<any>".to_owned(),
        },
        _ => "any".to_owned(),
    }
}

fn object_to_typescript(schema: &Value, indent: &str) -> String {
    let mut out = String::new();
    if let Some(d) = schema.get("description").and_then(Value::as_str) {
        out.push_str(&format!("{indent}// {d}\n"));
    }
    out.push_str("{\n");
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        let required: HashSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let optional = |key: &str| if required.contains(key) { "" } else { "?" };
        for (key, val) in props {
            if let Some(title) = val.get("title").and_then(Value::as_str) {
                out.push_str(&format!("{indent}// {title}\n{indent}//\n"));
            }
            let one_of = val.get("oneOf").and_then(Value::as_array);
            if val.get("oneOf").is_none() {
                if let Some(d) = val.get("description").and_then(Value::as_str) {
                    out.push_str(&format!("{indent}// {d}\n"));
                }
            }
            if let Some(examples) = val.get("examples").and_then(Value::as_array) {
                if !examples.is_empty() {
                    out.push_str(&format!("{indent}// Examples:\n"));
                    for ex in examples.iter().filter_map(Value::as_str) {
                        out.push_str(&format!("{indent}// - \"{ex}\"\n"));
                    }
                }
            }
            if let Some(variants) = one_of {
                let property_desc = val.get("description").and_then(Value::as_str);
                let skip_property_desc = property_desc.is_some()
                    && variants
                        .first()
                        .and_then(|v| v.get("description"))
                        .and_then(Value::as_str)
                        == property_desc;
                let mut desc_above = false;
                if !skip_property_desc {
                    if let Some(d) = property_desc {
                        out.push_str(&format!("{indent}// {d}\n"));
                        desc_above = true;
                    }
                }
                if let Some(default) = val.get("default") {
                    out.push_str(&format!("{indent}// {}\n", default_comment(val, default)));
                }
                out.push_str(&format!("{indent}{key}{}:\n", optional(key)));
                for (i, variant) in variants.iter().enumerate() {
                    out.push_str(&format!("{indent} | "));
                    let ty = schema_to_typescript(variant, &format!("{indent}   "));
                    out.push_str(&nullable(variant, ty));
                    let mut comments = Vec::new();
                    if !(i == 0 && desc_above) {
                        if let Some(d) = variant.get("description").and_then(Value::as_str) {
                            if Some(d) != property_desc {
                                comments.push(d.to_owned());
                            }
                        }
                    }
                    if let Some(default) = variant.get("default") {
                        comments.push(default_comment(variant, default));
                    }
                    if !comments.is_empty() {
                        out.push_str(&format!(" // {}", comments.join(" ")));
                    }
                    out.push('\n');
                }
                out.push_str(&format!("{indent},\n"));
                continue;
            }
            out.push_str(&format!("{indent}{key}{}: ", optional(key)));
            let ty = schema_to_typescript(val, &format!("{indent}    "));
            out.push_str(&nullable(val, ty));
            out.push(',');
            if let Some(default) = val.get("default") {
                out.push_str(&format!(" // {}", default_comment(val, default)));
            }
            out.push('\n');
        }
    }
    out.push_str(&format!("{indent}}}"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_renders_as_harmony_typescript() {
        let schema = json!({
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "either": {"oneOf": [{"type": "string", "description": "a name"}, {"type": "number"}]}
            },
            "required": ["location"]
        });
        // Expected text written from openai-harmony 0.0.8's renderer rules.
        let expected = "{\n// City and country\nlocation: string,\nunit?: \"celsius\" | \
                        \"fahrenheit\", // default: celsius\ndays?: number,\ntags?: string[],\n\
                        either?:\n | string // a name\n | number\n,\n}";
        assert_eq!(schema_to_typescript(&schema, ""), expected);
        assert_eq!(schema_to_typescript(&json!({}), ""), "any");
        assert_eq!(
            schema_to_typescript(&json!({"type": ["integer", "null"]}), ""),
            "number | null"
        );
    }

    #[test]
    fn stale_analysis_is_dropped_before_the_last_final() {
        let a = |ch: &'static str| Message::text(Role::Assistant, ch.into()).on(ch);
        let msgs = vec![
            a("analysis"),
            a("final"),
            Message::text(Role::User, "u".into()),
            a("analysis"),
            a("final"),
            a("analysis"),
        ];
        let kept: Vec<_> = drop_stale_analysis(msgs)
            .into_iter()
            .map(|m| m.channel.unwrap_or("-"))
            .collect();
        assert_eq!(kept, ["final", "-", "final", "analysis"]);
    }

    #[test]
    fn efforts_outside_harmony_are_refused() {
        assert_eq!(reasoning_effort("high").expect("high"), "high");
        let err = reasoning_effort("minimal").expect_err("minimal");
        assert!(
            err.to_string().contains("not supported by Harmony"),
            "{err}"
        );
    }
}
