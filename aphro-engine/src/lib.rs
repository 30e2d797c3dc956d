//! The token-in/token-out engine: burn model, paged KV cache, scheduler, sampler.
pub mod backend;
pub mod gpu;
pub mod model;
pub mod runner;
/// The audio routes' work over [`speech::Transcriber`] (shared by HTTP, CLI and Python).
pub mod transcription;

pub mod engine;
pub mod kobold;
pub mod kv;
pub mod kv_events;
pub mod kv_hash;
pub mod kv_publisher;
pub mod messages;
pub mod metrics;
pub mod openai;
pub mod pacer;
pub mod pooling;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod serving;
pub mod speech;
#[cfg(test)]
mod test_support;
