//! The `network` field of `POST /v1/sessions`: its schema in the OpenAPI
//! document and how it reaches the registry.

use cellhost_sessions::egress::NetworkPolicy;
use cellhost_sessions::{EnvApplied, Key, Registry};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::ApiError;

/// A session's network policy: `"off"` (default: a private loopback
/// only), `"on"` (the host's network), or a list of `HOST[:PORT]` rules
/// reached through the host's egress proxy: a DNS name, `*.` and a name
/// (every name below it), an IPv4 address or `[IPv6]`; the port 1–65535
/// or `*`, none meaning 443 and 80.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum NetworkField {
    /// `off` or `on`.
    Word(NetworkWord),
    /// Rules, at most 256.
    #[schema(example = json!(["api.openai.com:443", "*.githubusercontent.com"]))]
    Rules(Vec<String>),
}

/// `off` or `on`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum NetworkWord {
    /// A private loopback only.
    Off,
    /// The host's network.
    On,
}

/// Sets the policy of a session being created (its kernel not started
/// yet): `policy` (the body's, else the one the journal keeps for a
/// session of that name that was not deleted), else the configured one.
///
/// # Errors
/// `bad_request` (a list with sandbox mode `off`).
pub fn apply(reg: &Registry, key: &Key, policy: Option<&NetworkPolicy>) -> Result<(), ApiError> {
    let policy = policy
        .cloned()
        .unwrap_or_else(|| reg.configured_network(&key.session));
    match reg.set_session_network(key, Some(&policy))? {
        EnvApplied::Applied | EnvApplied::Kept => Ok(()),
    }
}
