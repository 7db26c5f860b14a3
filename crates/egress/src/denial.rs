//! Connections the proxy refused, kept for the cell that made them.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Most denials one report holds; more are counted in
/// [`NetworkReport::dropped`].
pub const MAX_DENIALS: usize = 100;

/// Why a connection was refused (a stable code on every surface).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyReason {
    /// No rule admits the host and port.
    NotAllowed,
    /// An IP literal no IP rule names.
    IpLiteral,
    /// A numeric host that is not a dotted quad (`127.1`), or a malformed host.
    BadHost,
    /// The name resolved only to loopback, private, link-local or other
    /// non-public addresses (and is not pinned in the policy's `hosts`).
    PrivateAddress,
    /// The proxy's resolver found no address.
    ResolveFailed,
    /// The TLS ClientHello's server name is not the `CONNECT` host.
    SniMismatch,
    /// A `CONNECT` to a name whose ClientHello carries no server name.
    NoSni,
    /// What followed a `CONNECT` is not a TLS ClientHello.
    NotTls,
    /// A plain HTTP request whose `Host` header is not its target's host.
    HostMismatch,
    /// Not a proxy request (origin-form, a scheme other than `http`,
    /// user info in the URL, a malformed head), or a plain request whose
    /// body's end is ambiguous or whose chunked body is malformed.
    BadRequest,
    /// The request head is larger than the proxy takes.
    HeadTooLarge,
    /// The session's connection cap was reached.
    ConnectionCap,
}

impl DenyReason {
    /// The code as text (`not_allowed`, …).
    pub fn code(self) -> &'static str {
        match self {
            DenyReason::NotAllowed => "not_allowed",
            DenyReason::IpLiteral => "ip_literal",
            DenyReason::BadHost => "bad_host",
            DenyReason::PrivateAddress => "private_address",
            DenyReason::ResolveFailed => "resolve_failed",
            DenyReason::SniMismatch => "sni_mismatch",
            DenyReason::NoSni => "no_sni",
            DenyReason::NotTls => "not_tls",
            DenyReason::HostMismatch => "host_mismatch",
            DenyReason::BadRequest => "bad_request",
            DenyReason::HeadTooLarge => "head_too_large",
            DenyReason::ConnectionCap => "connection_cap",
        }
    }
}

/// One refused connection.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// The host asked for, as sent (at most 255 characters; empty when the
    /// request named none).
    pub host: String,
    /// The port asked for (0 when the request named none).
    pub port: u16,
    /// Why it was refused.
    pub reason: DenyReason,
    /// For `sni_mismatch`: the server name the ClientHello carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
}

/// The network part of a cell's result: what the proxy refused while the
/// cell ran (or since the previous cell settled).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NetworkReport {
    /// The refused connections, oldest first (at most [`MAX_DENIALS`]).
    pub denied: Vec<Denial>,
    /// Refused connections past [`MAX_DENIALS`], counted only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Denials collected by a proxy until a cell takes them.
#[derive(Debug, Default)]
pub struct DenialLog {
    inner: Mutex<NetworkReport>,
}

impl DenialLog {
    /// Records one denial (counted only past [`MAX_DENIALS`]).
    pub fn push(&self, d: Denial) {
        tracing::info!(host = %d.host, port = d.port, reason = d.reason.code(), "egress denied");
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.denied.len() < MAX_DENIALS {
            g.denied.push(d);
        } else {
            g.dropped = g.dropped.saturating_add(1);
        }
    }

    /// Everything recorded since the last call; `None` when nothing was.
    pub fn take(&self) -> Option<NetworkReport> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.denied.is_empty() && g.dropped == 0 {
            return None;
        }
        Some(std::mem::take(&mut *g))
    }
}

/// `host` cut to 255 characters, control characters replaced.
pub(crate) fn shown_host(host: &str) -> String {
    host.chars()
        .take(255)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}
