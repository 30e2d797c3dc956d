//! Wire types, mirroring `docs/spec/api.md` field by field (vLLM 0.33.0).
//!
//! Requests accept unknown keys (ignored) as vLLM does. Responses
//! serialize with nulls present unless the spec says otherwise.
//! Submodules: [`chat`] (chat-completions request, messages, tools), [`completion`],
//! [`sampling`] (`SamplingParams` with vLLM's validation and "omit defaults" dump),
//! [`generate`] (`GenerateRequest`, `ParseContext`, `StreamOptions`), [`tokenize`] (§9),
//! [`response`] (generate / chat / completion responses, §4.2, §8), [`derender`] (§6, §7),
//! [`embeddings`] (`/v1/embeddings`), [`pooling`] (`/v2/embed`, `/pooling`, `/classify`,
//! `/score`, `/rerank`).
//!
//! Every type derives [`utoipa::ToSchema`] beside its serde impls, so the servers' OpenAPI
//! documents describe exactly these shapes; [`schema`] holds the few schemas written by hand.
pub mod chat;
pub mod completion;
pub mod derender;
pub mod embeddings;
pub mod error;
pub mod generate;
pub mod pooling;
pub mod response;
pub mod sampling;
pub mod schema;
pub mod tokenize;

pub use chat::*;
pub use completion::*;
pub use derender::*;
pub use embeddings::*;
pub use error::*;
pub use generate::*;
pub use pooling::*;
pub use response::*;
pub use sampling::*;
pub use tokenize::*;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `stop`: a single string or a list of strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

/// Request ids default to vLLM's `random_uuid()`: 16 lowercase hex chars.
pub fn random_request_id() -> String {
    use rand::Rng;
    let v: u64 = rand::rng().random();
    format!("{v:016x}")
}

/// A field whose absence means something else than any value it can take: present values are
/// `Some` (a JSON `null` is refused as the bare type refuses it), absence is the field's
/// `#[serde(default)]`, `None`.
pub(crate) fn explicit<'de, D, T>(de: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(de).map(Some)
}
