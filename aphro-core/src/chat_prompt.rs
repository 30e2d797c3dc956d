//! vLLM's request normalization before the template (content format, tool-call arguments,
//! null content, tools, kwargs filtering) and transformers' `apply_chat_template` around it
//! (message clean-up, special-token variables, `continue_final_message`).
use crate::content_parts::{parse_parts, ContentCapabilities, Part};
use crate::error::{Error, Result};
use crate::protocol::{ChatCompletionRequest, ChatMessage, ChatTool, MessageContent};
use crate::template::{ChatTemplate, Clock, ContentFormat};
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
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedChat {
    pub prompt: String,
    /// vLLM-normalized conversation (`apply_chat_template_args.conversation`).
    pub conversation: Vec<Value>,
    /// Normalized tools, or `None`.
    pub tools: Option<Vec<Value>>,
    /// Request kwargs kept after filtering to names the template references.
    pub chat_template_kwargs: Map<String, Value>,
    /// The exact template variables.
    pub context: Map<String, Value>,
}

/// Template + special tokens + normalization settings: request → prompt string. Holds no
/// tokenizer, so template-only models can use it too.
#[derive(Debug)]
pub struct ChatPrompter {
    template: ChatTemplate,
    special_tokens: Map<String, Value>,
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
    fn normalize_content(&self, m: &ChatMessage) -> Result<Value> {
        let parts = match &m.content {
            None => Vec::new(),
            Some(MessageContent::Text(s)) => vec![Part::Text(s.clone())],
            Some(MessageContent::Parts(p)) => parse_parts(p, &self.capabilities)?,
        };
        let joined = || {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text(t) | Part::ToolReference(t) => Some(t.as_str()),
                    // Placeholders are the multimodal renderer's business.
                    Part::Media(_) => None,
                })
                .collect();
            Value::String(texts.join("\n"))
        };
        let all_text = parts.iter().all(|p| matches!(p, Part::Text(_)));
        if self.content_format == ContentFormat::String || (m.role == "tool" && all_text) {
            return Ok(joined());
        }
        Ok(Value::Array(
            parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => serde_json::json!({"type": "text", "text": t}),
                    Part::ToolReference(n) => {
                        serde_json::json!({"type": "tool_reference", "name": n})
                    }
                    Part::Media(m) => serde_json::json!({"type": m.as_str()}),
                })
                .collect(),
        ))
    }

    fn normalize_message(&self, m: &ChatMessage) -> Result<Value> {
        let mut o = Map::new();
        o.insert("role".into(), Value::String(m.role.clone()));
        let content = self.normalize_content(m)?;
        o.insert("content".into(), content);
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let args = match (&c.function.arguments, self.tool_arguments) {
                        (Value::String(s), ToolArguments::Object) => {
                            match serde_json::from_str::<Value>(s) {
                                Ok(v @ Value::Object(_)) => v,
                                _ => Value::Object(Map::new()),
                            }
                        }
                        (v, _) => v.clone(),
                    };
                    let mut f = Map::new();
                    f.insert("name".into(), Value::String(c.function.name.clone()));
                    f.insert("arguments".into(), args);
                    let mut call = Map::new();
                    call.insert("id".into(), c.id.clone().map_or(Value::Null, Value::String));
                    call.insert(
                        "type".into(),
                        Value::String(c.kind.clone().unwrap_or_else(|| "function".into())),
                    );
                    call.insert("function".into(), Value::Object(f));
                    Value::Object(call)
                })
                .collect();
            o.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &m.tool_call_id {
            o.insert("tool_call_id".into(), Value::String(id.clone()));
        }
        if let Some(name) = &m.name {
            o.insert("name".into(), Value::String(name.clone()));
        }
        if let Some(r) = &m.reasoning {
            o.insert("reasoning".into(), Value::String(r.clone()));
            o.insert("reasoning_content".into(), Value::String(r.clone()));
        }
        Ok(Value::Object(o))
    }

    /// transformers 5: drop `None`-valued keys and expose reasoning as `thinking` too.
    fn template_message(m: &Value) -> Value {
        let Some(obj) = m.as_object() else {
            return m.clone();
        };
        let mut o = Map::new();
        if let Some(r) = obj.get("reasoning").filter(|r| !r.is_null()) {
            o.insert("thinking".into(), r.clone());
        }
        for (k, v) in obj {
            if !v.is_null() {
                o.insert(k.clone(), v.clone());
            }
        }
        Value::Object(o)
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
        if req.continue_final_message && req.add_generation_prompt {
            return Err(Error::validation(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                None,
            ));
        }
        let conversation: Vec<Value> = req
            .messages
            .iter()
            .map(|m| self.normalize_message(m))
            .collect::<Result<_>>()?;
        let tools: Option<Vec<Value>> = req
            .tools
            .as_ref()
            .map(|t| t.iter().map(normalize_tool).collect());
        let kwargs = self.filter_kwargs(&Self::request_kwargs(req));

        let mut ctx = Map::new();
        ctx.insert(
            "messages".into(),
            Value::Array(conversation.iter().map(Self::template_message).collect()),
        );
        ctx.insert(
            "tools".into(),
            tools.clone().map_or(Value::Null, Value::Array),
        );
        ctx.insert(
            "documents".into(),
            req.documents.as_ref().map_or(Value::Null, |d| {
                Value::Array(d.iter().cloned().map(Value::Object).collect())
            }),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(req.add_generation_prompt),
        );
        for (k, v) in &self.special_tokens {
            ctx.insert(k.clone(), v.clone());
        }
        for (k, v) in &kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        let mut prompt = match self.template.render(&ctx) {
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
            prompt = cut_after_final_message(prompt, conversation.last())?;
        }
        Ok(RenderedChat {
            prompt,
            conversation,
            tools,
            chat_template_kwargs: kwargs,
            context: ctx,
        })
    }
}

/// transformers' `continue_final_message`: cut the rendered chat right after the final
/// message's text so the model continues it.
fn cut_after_final_message(rendered: String, last: Option<&Value>) -> Result<String> {
    let content = last.and_then(|m| m.get("content"));
    let final_text: String = match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .rev()
            .find_map(|p| p.get("text").and_then(Value::as_str))
            .map(str::to_owned)
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
