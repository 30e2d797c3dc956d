//! Protocol types, model files, tokenizer, chat templates, Renderer and Derenderer.
pub mod default_model;
pub mod detokenizer;
pub mod gguf;
pub mod stop;
