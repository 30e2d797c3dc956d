//! axum routers for the three server roles, and the `aphro` CLI.
pub mod auth;
pub mod cli;
pub mod error;
pub mod extract;
pub mod logging;
pub mod metrics;
pub mod server;
pub mod sse;
