//! The one error type of `aphro-core`. Every variant knows the HTTP status, the OpenAI-style
//! `type` string and the `param` vLLM would report, so the HTTP layer only has to serialize
//! [`Error::to_envelope`] (`api.md` §1.2/§1.3).
use serde_json::Value;

/// Result alias for the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Structural request validation (pydantic-style): HTTP 400, `type` = `"Bad Request"`.
    #[error("{message}")]
    Validation {
        message: String,
        param: Option<String>,
    },
    /// Semantic validation by vLLM's own checks (sampling ranges, tool_choice rules, …):
    /// HTTP 400, `type` = `"BadRequestError"`, message carries the `(parameter=…, value=…)` suffix.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
    },
    /// The chat template raised (`raise_exception`) or failed to render: HTTP 400.
    #[error("{0}")]
    Template(String),
    /// Prompt longer than the model context: HTTP 400.
    #[error(
        "Input length ({prompt_len}) exceeds model's maximum context length ({max_model_len})."
    )]
    PromptTooLong {
        prompt_len: usize,
        max_model_len: usize,
    },
    /// Unknown served model name: HTTP 404.
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    /// Model files could not be found or parsed (load time, not request time): HTTP 500 if it
    /// ever reaches a client.
    #[error("{0}")]
    ModelFiles(String),
    /// Tokenizer failure (load or encode/decode).
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// Fetching a media URL failed for a reason that may pass (network, timeout, a 5xx) or
    /// fetching is off: vLLM lets such fetch errors through as a 500.
    #[error("{0}")]
    MediaFetch(String),
    /// The request names something that cannot be processed (a media URL answering 404, a
    /// download over the size limit): HTTP 422, vLLM's `VLLMUnprocessableEntityError`.
    #[error("{message}")]
    Unprocessable {
        message: String,
        param: Option<String>,
    },
    /// A request form vLLM parses but does not implement (a non-base64 `data:` URL): HTTP 501.
    #[error("{0}")]
    NotImplemented(String),
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}: {source}")]
    Json {
        context: String,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// Structural 400 (`type: "Bad Request"`).
    pub fn validation(message: impl Into<String>, param: Option<&str>) -> Self {
        Error::Validation {
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// Semantic 400 with vLLM's `" (parameter=<p>, value=<v>)"` suffix.
    pub fn invalid_param(
        message: impl Into<String>,
        param: &str,
        value: impl std::fmt::Display,
    ) -> Self {
        Error::BadRequest {
            message: format!("{} (parameter={param}, value={value})", message.into()),
            param: Some(param.to_owned()),
        }
    }

    /// Semantic 400 naming a parameter but no value: vLLM's
    /// `VLLMValidationError(message, parameter=p)`, `" (parameter=<p>)"`.
    pub fn for_param(message: impl Into<String>, param: &str) -> Self {
        Error::BadRequest {
            message: format!("{} (parameter={param})", message.into()),
            param: Some(param.to_owned()),
        }
    }

    /// Handler-level 400 without a parameter.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Error::BadRequest {
            message: message.into(),
            param: None,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn json(context: impl Into<String>, source: serde_json::Error) -> Self {
        Error::Json {
            context: context.into(),
            source,
        }
    }

    /// HTTP status code (equals `error.code` in the envelope).
    pub fn status(&self) -> u16 {
        match self {
            Error::Validation { .. }
            | Error::BadRequest { .. }
            | Error::Template(_)
            | Error::PromptTooLong { .. } => 400,
            Error::ModelNotFound(_) => 404,
            Error::Unprocessable { .. } => 422,
            Error::NotImplemented(_) => 501,
            _ => 500,
        }
    }

    /// OpenAI-style `type`: the exception class name vLLM reports, or the HTTP reason phrase
    /// for structural validation errors.
    pub fn error_type(&self) -> &'static str {
        match self {
            Error::Validation { .. } => "Bad Request",
            Error::BadRequest { .. } | Error::Template(_) | Error::PromptTooLong { .. } => {
                "BadRequestError"
            }
            Error::ModelNotFound(_) => "NotFoundError",
            Error::Unprocessable { .. } => "UnprocessableEntityError",
            Error::NotImplemented(_) => "NotImplementedError",
            _ => "InternalServerError",
        }
    }

    /// The `param` field of the envelope.
    pub fn param(&self) -> Option<&str> {
        match self {
            Error::Validation { param, .. }
            | Error::BadRequest { param, .. }
            | Error::Unprocessable { param, .. } => param.as_deref(),
            Error::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    /// The error body this error answers with.
    pub fn to_error_response(&self) -> crate::protocol::ErrorResponse {
        crate::protocol::ErrorResponse::new(
            self.status(),
            self.error_type(),
            self.to_string(),
            self.param(),
        )
    }

    /// vLLM's error body `{"error":{"message","type","param","code"}}` as JSON.
    pub fn to_envelope(&self) -> Value {
        self.to_error_response().to_value()
    }
}
