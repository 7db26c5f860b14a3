//! Agent interfaces of cellhost over one session [`Registry`]:
//!
//! - [`http`]: the HTTP API (axum): sessions, execute (JSON or server-sent
//!   events), interrupt, restart, variables, spilled output, history; the
//!   OpenAPI document generated from the types ([`openapi`]); error
//!   answers with stable codes ([`error`]); bearer tokens mapped to owners
//!   ([`auth`]); its connections served within [`ServeLimits`]
//!   ([`listen`]: header, idle and body timeouts, a connection cap); a
//!   whole notebook run in one request ([`http_notebook`]);
//! - [`daemon`]: the per-user daemon behind `cellhost exec --session`, JSON
//!   lines over a Unix socket (mode 0600), exiting after an idle period.
//!
//! [`Registry`]: cellhost_sessions::Registry
#![forbid(unsafe_code)]

pub mod auth;
pub mod daemon;
pub mod error;
pub mod http;
pub mod http_network;
pub mod http_notebook;
pub mod listen;
pub mod openapi;
pub mod routes;
pub mod rundir;

pub use auth::{Scope, Tokens};
pub use error::{ApiError, ErrorCode};
pub use http::{AppState, DEFAULT_LISTEN, MAX_BODY_BYTES, router};
pub use listen::ServeLimits;

/// The axum version the API is built with (for nesting other services).
pub use axum;
