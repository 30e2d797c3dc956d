//! vLLM's request normalization before the template (content format, tool-call arguments,
//! null content, tools, kwargs filtering) and transformers' `apply_chat_template` around it
//! (message clean-up, special-token variables, `continue_final_message`).
use crate::content_parts::{parse_parts, ContentCapabilities, Part};
use crate::error::{Error, Result};
use crate::protocol::{ChatCompletionRequest, ChatMessage, ChatTool, MessageContent};
use crate::template::{ChatTemplate, Clock, ContentFormat};
use minijinja::Value as Jv;
use serde_json::{Map, Value};
use std::sync::Arc;

/// How assistant `tool_calls[].function.arguments` reach the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolArguments {
    /// vLLM: JSON strings are parsed to objects; invalid JSON becomes `{}`.
    #[default]
    Object,
    /// Left as the request's string.
    String,
}

/// `apply_chat_template` keyword names that are not template variables.
const RESERVED_KWARGS: [&str; 8] = [
    "messages",
    "conversation",
    "tools",
    "documents",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "tokenize",
];

/// The prompt and what the template saw (useful to debug against the goldens).
#[derive(Debug, Clone)]
pub struct RenderedChat {
    pub prompt: String,
    /// The normalized tools the template saw (`parse_context.tools` reuses them), or `None`.
    pub tools: Option<Vec<Value>>,
    /// Request kwargs kept after filtering to names the template references.
    pub chat_template_kwargs: Map<String, Value>,
    /// The exact template variables, as the template engine holds them.
    context: Jv,
}

impl RenderedChat {
    /// The exact template variables as JSON (`messages`, `tools`, `documents`,
    /// `add_generation_prompt`, the special-token strings, the kwargs).
    pub fn context(&self) -> Map<String, Value> {
        match serde_json::to_value(&self.context) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        }
    }
}

/// Template + special tokens + normalization settings: request → prompt string. Holds no
/// tokenizer, so template-only models can use it too.
#[derive(Debug)]
pub struct ChatPrompter {
    template: ChatTemplate,
    /// The special-token strings (`bos_token`, …) as template values, converted once.
    special_tokens: Vec<(Jv, Jv)>,
    content_format: ContentFormat,
    tool_arguments: ToolArguments,
    /// Which media parts pass (none: a text-only model).
    capabilities: ContentCapabilities,
}

/// Normalized tool definition: `{"type":"function","function":{"name","description","parameters",…}}`.
pub fn normalize_tool(t: &ChatTool) -> Value {
    let mut f = Map::new();
    f.insert("name".into(), Value::String(t.function.name.clone()));
    f.insert(
        "description".into(),
        t.function
            .description
            .clone()
            .map_or(Value::Null, Value::String),
    );
    f.insert(
        "parameters".into(),
        t.function.parameters.clone().unwrap_or(Value::Null),
    );
    for (k, v) in &t.function.extra {
        f.insert(k.clone(), v.clone());
    }
    let mut o = Map::new();
    o.insert("type".into(), Value::String(t.kind.clone()));
    o.insert("function".into(), Value::Object(f));
    Value::Object(o)
}

impl ChatPrompter {
    pub fn new(
        template_source: &str,
        special_tokens: Map<String, Value>,
        content_format: ContentFormat,
        tool_arguments: ToolArguments,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        let template = ChatTemplate::new(template_source, clock)?;
        let content_format = match content_format {
            ContentFormat::Auto => template.detected_content_format(),
            f => f,
        };
        let special_tokens = special_tokens
            .iter()
            .map(|(k, v)| (Jv::from(k.as_str()), Jv::from_serialize(v)))
            .collect();
        Ok(Self {
            template,
            special_tokens,
            content_format,
            tool_arguments,
            capabilities: ContentCapabilities::text_only("model"),
        })
    }

    /// Sets what non-text content parts are accepted (the renderer passes the served model's
    /// name and modalities; the default is a text-only model called `model`).
    pub fn with_capabilities(mut self, capabilities: ContentCapabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    pub fn capabilities(&self) -> &ContentCapabilities {
        &self.capabilities
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The effective content format (never `Auto`).
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// vLLM's `parse_chat_message_content` for `content`: parts parsed one by one (the first
    /// refused part is the request's error), then joined into one string for `string`
    /// templates, or kept as typed dicts for `openai` ones (a tool message's text parts are
    /// joined into a string either way).
    fn normalize_content(&self, m: &ChatMessage) -> Result<Jv> {
        let parts = match &m.content {
            None => Vec::new(),
            // The common case: one string, whatever the content format (vLLM wraps it as
            // one text part, which joins back to itself; `openai` templates get that part).
            Some(MessageContent::Text(s))
                if self.content_format == ContentFormat::String || m.role == "tool" =>
            {
                return Ok(Jv::from(s.as_str()));
            }
            Some(MessageContent::Text(s)) => vec![Part::Text(s.clone())],
            Some(MessageContent::Parts(p)) => parse_parts(p, &self.capabilities)?,
        };
        let all_text = parts.iter().all(|p| matches!(p, Part::Text(_)));
        if self.content_format == ContentFormat::String || (m.role == "tool" && all_text) {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text(t) | Part::ToolReference(t) => Some(t.as_str()),
                    // Placeholders are the multimodal renderer's business.
                    Part::Media(_) => None,
                })
                .collect();
            return Ok(Jv::from(texts.join("\n")));
        }
        Ok(parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => Jv::from_iter([("type", "text"), ("text", t.as_str())]),
                Part::ToolReference(n) => {
                    Jv::from_iter([("type", "tool_reference"), ("name", n.as_str())])
                }
                Part::Media(m) => Jv::from_iter([("type", m.as_str())]),
            })
            .collect())
    }

    /// One message as the template sees it: vLLM's normalized message (role, content,
    /// tool calls with their arguments parsed, tool call id, name, reasoning) as transformers
    /// 5 passes it on, with `None`-valued keys dropped and the reasoning also under
    /// `thinking` (first). Built straight into template values: no intermediate JSON tree.
    fn template_message(&self, m: &ChatMessage) -> Result<Jv> {
        let mut o: Vec<(&'static str, Jv)> = Vec::with_capacity(4);
        if let Some(r) = &m.reasoning {
            o.push(("thinking", Jv::from(r.as_str())));
        }
        o.push(("role", Jv::from(m.role.as_str())));
        o.push(("content", self.normalize_content(m)?));
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
            let calls: Jv = calls
                .iter()
                .map(|c| {
                    let args = match (&c.function.arguments, self.tool_arguments) {
                        (Value::String(s), ToolArguments::Object) => {
                            match serde_json::from_str::<Value>(s) {
                                Ok(v @ Value::Object(_)) => Jv::from_serialize(&v),
                                _ => Jv::from_iter(std::iter::empty::<(Jv, Jv)>()),
                            }
                        }
                        (v, _) => Jv::from_serialize(v),
                    };
                    let function = Jv::from_iter([
                        ("name", Jv::from(c.function.name.as_str())),
                        ("arguments", args),
                    ]);
                    Jv::from_iter([
                        ("id", c.id.as_deref().map_or(Jv::from(()), Jv::from)),
                        ("type", Jv::from(c.kind.as_deref().unwrap_or("function"))),
                        ("function", function),
                    ])
                })
                .collect();
            o.push(("tool_calls", calls));
        }
        if let Some(id) = &m.tool_call_id {
            o.push(("tool_call_id", Jv::from(id.as_str())));
        }
        if let Some(name) = &m.name {
            o.push(("name", Jv::from(name.as_str())));
        }
        if let Some(r) = &m.reasoning {
            o.push(("reasoning", Jv::from(r.as_str())));
            o.push(("reasoning_content", Jv::from(r.as_str())));
        }
        Ok(Jv::from_iter(o))
    }

    /// Kwargs the template can see: names it references, minus `apply_chat_template`'s own.
    pub fn filter_kwargs(&self, kwargs: &Map<String, Value>) -> Map<String, Value> {
        kwargs
            .iter()
            .filter(|(k, _)| {
                !RESERVED_KWARGS.contains(&k.as_str())
                    && self.template.referenced_variables().contains(k.as_str())
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The kwargs the template receives: `chat_template_kwargs` with the top-level
    /// `reasoning_effort` on top (vLLM merges it in when set), before [`Self::filter_kwargs`].
    pub fn request_kwargs(req: &ChatCompletionRequest) -> Map<String, Value> {
        let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(effort) = &req.reasoning_effort {
            kwargs.insert("reasoning_effort".into(), Value::String(effort.clone()));
        }
        kwargs
    }

    /// Strict kwargs: a `chat_template_kwargs` key or a `reasoning_effort` that the template
    /// never reads would be dropped without effect (transformers' behaviour), so the client
    /// is told instead.
    pub fn check_kwargs_are_read(&self, req: &ChatCompletionRequest) -> Result<()> {
        if let Some(kwargs) = &req.chat_template_kwargs {
            for (k, v) in kwargs {
                if !self.template.reads_variable(k) {
                    return Err(Error::invalid_param(
                        format!(
                            "chat_template_kwargs.{k} is not read by this model's chat template, \
                             so it would have no effect."
                        ),
                        &format!("chat_template_kwargs.{k}"),
                        v,
                    ));
                }
            }
        }
        if let Some(effort) = &req.reasoning_effort {
            if !self.template.reads_variable("reasoning_effort") {
                return Err(Error::invalid_param(
                    "reasoning_effort is not supported by this model's chat template \
                     (the template never reads it), so it would have no effect.",
                    "reasoning_effort",
                    effort,
                ));
            }
        }
        Ok(())
    }

    /// Normalizes the request and renders the template.
    pub fn render(&self, req: &ChatCompletionRequest) -> Result<RenderedChat> {
        self.render_with_defaults(req, &Map::new())
    }

    /// As [`Self::render`], with `defaults` under the request's `chat_template_kwargs` (the
    /// server's `--default-chat-template-kwargs`; the request's keys win).
    pub fn render_with_defaults(
        &self,
        req: &ChatCompletionRequest,
        defaults: &Map<String, Value>,
    ) -> Result<RenderedChat> {
        check_continue_final_message(req.continue_final_message, req.add_generation_prompt)?;
        let messages = req
            .messages
            .iter()
            .map(|m| self.template_message(m))
            .collect::<Result<Vec<Jv>>>()?;
        let last_message = messages.last().cloned();
        let messages = Jv::from(messages);
        let tools: Option<Vec<Value>> = req
            .tools
            .as_ref()
            .map(|t| t.iter().map(normalize_tool).collect());
        let tools_jv = tools
            .as_ref()
            .map_or(Jv::from(()), |t| t.iter().map(Jv::from_serialize).collect());
        let documents = req
            .documents
            .as_ref()
            .map_or(Jv::from(()), |d| d.iter().map(Jv::from_serialize).collect());
        let mut kwargs = defaults.clone();
        kwargs.extend(Self::request_kwargs(req));
        let kwargs = self.filter_kwargs(&kwargs);

        let mut ctx: Vec<(Jv, Jv)> =
            Vec::with_capacity(4 + self.special_tokens.len() + kwargs.len());
        ctx.push((Jv::from("messages"), messages));
        ctx.push((Jv::from("tools"), tools_jv));
        ctx.push((Jv::from("documents"), documents));
        ctx.push((
            Jv::from("add_generation_prompt"),
            Jv::from(req.add_generation_prompt()),
        ));
        ctx.extend(self.special_tokens.iter().cloned());
        for (k, v) in &kwargs {
            ctx.push((Jv::from(k.as_str()), Jv::from_serialize(v)));
        }
        let context = Jv::from_iter(ctx);
        let mut prompt = match self.template.render_value(&context) {
            // vLLM accepts an empty list and lets the template decide; most templates index
            // `messages[0]`, and their bare "undefined value" would not say what is wrong.
            Err(Error::Template(e)) if req.messages.is_empty() => {
                return Err(Error::for_param(
                    format!(
                        "The `messages` list is empty and the chat template cannot render \
                         an empty conversation: {e}"
                    ),
                    "messages",
                ))
            }
            r => r?,
        };
        if req.continue_final_message {
            prompt = cut_after_final_message(prompt, last_message.as_ref())?;
        }
        Ok(RenderedChat {
            prompt,
            tools,
            chat_template_kwargs: kwargs,
            context,
        })
    }
}

/// transformers' `continue_final_message`: cut the rendered chat right after the final
/// message's text so the model continues it.
fn cut_after_final_message(rendered: String, last: Option<&Jv>) -> Result<String> {
    use minijinja::value::ValueKind;
    let content = last.and_then(|m| m.get_attr("content").ok());
    let final_text: String = match content {
        Some(c) if c.kind() == ValueKind::String => c.as_str().unwrap_or_default().to_owned(),
        Some(c) if c.kind() == ValueKind::Seq => c
            .try_iter()
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .find_map(|p| {
                p.get_attr("text")
                    .ok()
                    .and_then(|t| t.as_str().map(str::to_owned))
            })
            .ok_or_else(|| {
                Error::Template(
                    "continue_final_message is set but we could not find any text to continue in the final message!"
                        .into(),
                )
            })?,
        _ => String::new(),
    };
    let stripped = final_text.trim();
    let Some(loc) = rendered.rfind(stripped) else {
        return Err(Error::Template(
            "continue_final_message is set but the final message does not appear in the chat after \
             applying the chat template! This can happen if the chat template deletes portions of \
             the final message. Please verify the chat template and final message in your chat to \
             ensure they are compatible."
                .into(),
        ));
    };
    let lstripped = final_text.trim_start();
    let end = if rendered[loc..].starts_with(lstripped)
        && rendered.get(loc..loc + lstripped.len()) == Some(final_text.as_str())
    {
        loc + lstripped.len()
    } else {
        loc + stripped.len()
    };
    let mut rendered = rendered;
    rendered.truncate(end);
    Ok(rendered)
}

/// `continue_final_message` leaves the last message open, so no generation prompt may follow.
/// vLLM refuses an explicit `add_generation_prompt: true` in its request validator
/// (`check_generation_prompt`, entrypoints/openai/chat_completion/protocol.py; it reads the raw
/// body), and the default `true` reaches `transformers`' `apply_chat_template`, whose
/// `ValueError` vLLM's renderer returns as a 400 (renderers/hf.py:safe_apply_chat_template).
pub(crate) fn check_continue_final_message(
    continue_final_message: bool,
    add_generation_prompt: Option<bool>,
) -> Result<()> {
    if !continue_final_message {
        return Ok(());
    }
    match add_generation_prompt {
        Some(false) => Ok(()),
        Some(true) => Err(Error::bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        )),
        None => Err(Error::bad_request(
            "continue_final_message and add_generation_prompt are not compatible. Use \
             continue_final_message when you want the model to continue the final message, and \
             add_generation_prompt when you want to add a header that will prompt it to start a \
             new assistant message instead.",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::SystemClock;

    fn prompter(src: &str) -> ChatPrompter {
        ChatPrompter::new(
            src,
            Map::new(),
            ContentFormat::String,
            ToolArguments::Object,
            Arc::new(SystemClock),
        )
        .expect("template compiles")
    }

    fn request(extra: Value) -> ChatCompletionRequest {
        let mut body = serde_json::json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            body[k] = v.clone();
        }
        crate::renderer::parse_chat_request(&body).expect("valid request")
    }

    const TEMPLATE: &str =
        "{% if reasoning_effort is defined %}[{{ reasoning_effort }}]{% endif %}\
        {% for m in messages %}{{ m.content }}{% endfor %}{% if flavour %}!{% endif %}";

    #[test]
    fn reasoning_effort_reaches_the_template_and_overrides_the_kwarg() {
        let p = prompter(TEMPLATE);
        let out = p
            .render(&request(serde_json::json!({
                "reasoning_effort": "high",
                "chat_template_kwargs": {"reasoning_effort": "low"}
            })))
            .expect("render");
        assert_eq!(out.prompt, "[high]hi");
        let out = p
            .render(&request(
                serde_json::json!({"chat_template_kwargs": {"reasoning_effort": "low"}}),
            ))
            .expect("render");
        assert_eq!(out.prompt, "[low]hi");
    }

    #[test]
    fn strict_check_names_unread_kwargs() {
        let p = prompter(TEMPLATE);
        assert!(p.template().reads_variable("flavour"));
        assert!(p.template().reads_variable("reasoning_effort"));
        assert!(!p.template().reads_variable("tone"));
        assert!(p
            .check_kwargs_are_read(&request(serde_json::json!({
                "reasoning_effort": "low", "chat_template_kwargs": {"flavour": true}
            })))
            .is_ok());
        let err = p
            .check_kwargs_are_read(&request(
                serde_json::json!({"chat_template_kwargs": {"tone": 1}}),
            ))
            .expect_err("unread kwarg");
        assert!(
            matches!(&err, Error::BadRequest { param: Some(p), .. } if p == "chat_template_kwargs.tone"),
            "{err:?}"
        );
        let plain = prompter("{% for m in messages %}{{ m.content }}{% endfor %}");
        let err = plain
            .check_kwargs_are_read(&request(serde_json::json!({"reasoning_effort": "low"})))
            .expect_err("template without reasoning_effort");
        assert!(
            matches!(&err, Error::BadRequest { param: Some(p), .. } if p == "reasoning_effort"),
            "{err:?}"
        );
        // Without the strict check the kwarg is dropped, as transformers does.
        let out = plain
            .render(&request(
                serde_json::json!({"reasoning_effort": "low", "chat_template_kwargs": {"tone": 1}}),
            ))
            .expect("render");
        assert_eq!(out.prompt, "hi");
    }
}
