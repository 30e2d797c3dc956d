//! The token-in/token-out engine: burn model, paged KV cache, scheduler, sampler.
pub mod model;
pub mod runner;
