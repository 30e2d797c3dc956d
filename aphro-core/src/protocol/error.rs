//! The error body every route of every role answers with (`api.md` §1.2), and what the
//! Python exceptions carry: one type that each error type of the workspace converts into.
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// vLLM's variant of the OpenAI error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorObject,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorObject {
    pub message: String,
    /// `BadRequestError`, `Bad Request` (structural validation), `NotFoundError`, ...
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    /// The HTTP status, as an integer.
    pub code: u16,
}

impl ErrorResponse {
    pub fn new(
        code: u16,
        kind: impl Into<String>,
        message: impl Into<String>,
        param: Option<&str>,
    ) -> Self {
        ErrorResponse {
            error: ErrorObject {
                message: message.into(),
                kind: kind.into(),
                param: param.map(str::to_owned),
                code,
            },
        }
    }

    /// The body as JSON.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}
