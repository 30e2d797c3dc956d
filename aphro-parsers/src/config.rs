//! Per-request parser context.
use serde_json::{Map, Value};

/// `tool_choice` of the request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    #[default]
    Auto,
    Required,
    /// A named function (`{"type":"function","function":{"name":…}}`).
    Named(String),
}

impl ToolChoice {
    /// Reads the request's `tool_choice` value (`null`/absent → `auto`).
    pub fn from_json(v: Option<&Value>) -> Result<Self, crate::ParserError> {
        match v {
            None | Some(Value::Null) => Ok(Self::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "none" => Ok(Self::None),
                "auto" => Ok(Self::Auto),
                "required" => Ok(Self::Required),
                other => Err(crate::ParserError::InvalidConfig(format!(
                    "tool_choice {other:?}"
                ))),
            },
            Some(Value::Object(o)) => o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(|n| Self::Named(n.to_string()))
                .ok_or_else(|| {
                    crate::ParserError::InvalidConfig(
                        "tool_choice object without function.name".into(),
                    )
                }),
            Some(other) => Err(crate::ParserError::InvalidConfig(format!(
                "tool_choice {other}"
            ))),
        }
    }
}

/// Everything a parser may read from the request besides the generated text.
#[derive(Debug, Clone)]
pub struct ParserConfig {
    /// The request's `tools` array (OpenAI shape `{"type":"function","function":{…}}`); used for
    /// schema-typed argument conversion and Kimi-K2 bare-id inference.
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    /// `parallel_tool_calls` (default true); false keeps only the first call.
    pub parallel_tool_calls: bool,
    /// `chat_template_kwargs` (`enable_thinking`, `thinking`, …).
    pub chat_template_kwargs: Map<String, Value>,
    /// Tail of the rendered prompt as text, if known. A prompt ending inside `<think>` means the
    /// output starts in reasoning; one whose last think block is closed means plain content.
    pub prompt_text: Option<String>,
    /// Number of assistant tool calls already in the conversation history (Kimi-K2 ids are
    /// `functions.NAME:N` with N counting those).
    pub history_tool_calls: usize,
}

impl Default for ParserConfig {
    fn default() -> Self {
        Self {
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            chat_template_kwargs: Map::new(),
            prompt_text: None,
            history_tool_calls: 0,
        }
    }
}

impl ParserConfig {
    /// Builds the context from a request-like JSON object with the corpus/CLI field names
    /// (`tools`, `tool_choice`, `parallel_tool_calls`, `chat_template_kwargs`, `prompt_text`).
    pub fn from_request_json(v: &Value) -> Result<Self, crate::ParserError> {
        let tools = match v.get("tools") {
            Some(Value::Array(a)) => a.clone(),
            _ => Vec::new(),
        };
        let chat_template_kwargs = match v.get("chat_template_kwargs") {
            Some(Value::Object(o)) => o.clone(),
            _ => Map::new(),
        };
        Ok(Self {
            tools,
            tool_choice: ToolChoice::from_json(v.get("tool_choice"))?,
            parallel_tool_calls: v
                .get("parallel_tool_calls")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            chat_template_kwargs,
            prompt_text: v
                .get("prompt_text")
                .and_then(Value::as_str)
                .map(str::to_string),
            history_tool_calls: v
                .get("history_tool_calls")
                .and_then(Value::as_u64)
                .unwrap_or(0) as usize,
        })
    }

    /// A boolean chat-template kwarg, if present.
    pub fn kwarg_bool(&self, key: &str) -> Option<bool> {
        self.chat_template_kwargs.get(key).and_then(Value::as_bool)
    }

    /// The `function` object of the tool named `name`.
    pub fn tool(&self, name: &str) -> Option<&Value> {
        self.tools.iter().find_map(|t| {
            let f = t.get("function").unwrap_or(t);
            (f.get("name").and_then(Value::as_str) == Some(name)).then_some(f)
        })
    }

    /// JSON schema of parameter `param` of tool `name`.
    pub fn param_schema(&self, name: &str, param: &str) -> Option<&Value> {
        self.tool(name)?
            .get("parameters")?
            .get("properties")?
            .get(param)
    }

    /// `Some(true)` if the prompt tail leaves the model inside `start`…`end` reasoning,
    /// `Some(false)` if its last block is closed, `None` if the prompt shows neither marker.
    pub fn prompt_in_reasoning(&self, start: &str, end: &str) -> Option<bool> {
        let p = self.prompt_text.as_deref()?;
        let s = p.rfind(start);
        let e = p.rfind(end);
        match (s, e) {
            (None, None) => None,
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
            (Some(s), Some(e)) => Some(s > e),
        }
    }
}
