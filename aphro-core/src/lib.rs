//! Protocol types, model files, tokenizer, chat templates, Renderer and Derenderer.
//!
//! Entry points: [`model::Model::load`] (dir, `.gguf` or hub id), [`renderer::Renderer`]
//! (`render_chat`, `render_completion`, `tokenize`, `detokenize`), [`error::Error::to_envelope`],
//! [`detokenizer::IncrementalDetokenizer`], [`default_model::ensure_default_model`].
pub mod anthropic;
pub mod audio;
pub mod bench_support;
pub mod chat_prompt;
pub mod content_parts;
pub mod default_model;
pub mod derenderer;
pub mod detokenizer;
pub mod error;
pub mod gguf;
pub mod gguf_tokenizer;
pub mod harmony;
pub mod http_client;
pub mod kobold;
pub mod limits;
pub mod model;
pub mod multimodal;
pub mod protocol;
pub mod renderer;
pub mod stop;
pub mod structural_tag;
pub mod structured;
pub mod template;
pub mod tokenizer;
pub mod tool_grammar;
pub mod validation;

pub use derenderer::{DerenderOptions, Derenderer};
pub use error::{Error, Result};
pub use limits::RequestLimits;
pub use model::{LoadOptions, Model};
pub use renderer::{RenderHooks, RenderOptions, Renderer};
pub use template::{Clock, ContentFormat, FixedClock, SystemClock};
pub use tokenizer::Tokenizer;
pub mod parser_hooks;
