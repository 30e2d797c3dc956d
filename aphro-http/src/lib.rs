//! axum routers for the three server roles, and the `aphro` CLI.
pub mod cli;
