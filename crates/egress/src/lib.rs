//! Egress by allowlist for cellhost kernels.
//!
//! A kernel whose session's network policy is a list of rules
//! ([`policy`]) runs in its own network namespace, as every sandboxed
//! kernel does, and reaches exactly one thing there: a TCP listener on
//! `127.0.0.1:`[`PROXY_PORT`] that the kernel init bound inside the
//! namespace and handed to the host (`SCM_RIGHTS`) before any code of the
//! kernel ran. The host serves it with [`proxy::serve`]: HTTP `CONNECT`
//! (the TLS ClientHello's server name must be the `CONNECT` host) and
//! plain HTTP in absolute form (the `Host` header must be the target's),
//! each target checked against the rules, names resolved by the proxy
//! ([`resolve`]), never to a non-public address unless the operator named
//! it ([`address`]). Every refusal is recorded ([`denial`]) for the cell's
//! result. The kernel's environment names the proxy
//! ([`proxy_env`]), so `urllib`, `requests`, `pip`, `curl` and most HTTP
//! clients use it without being told.

pub mod address;
pub mod body;
pub mod denial;
pub mod head;
pub mod policy;
pub mod proxy;
pub mod resolve;
pub mod sni;

use std::sync::Arc;
use std::time::Duration;

pub use denial::{Denial, DenialLog, DenyReason, NetworkReport};
pub use policy::{NetworkPolicy, PolicyError, Rule};
pub use resolve::Resolver;

/// The port of the proxy's listener inside a kernel's network namespace
/// (the namespace is the kernel's own, so a fixed port collides with
/// nothing).
pub const PROXY_PORT: u16 = 3128;

/// The proxy's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once per kernel; more are answered 503.
    pub max_connections: usize,
    /// Largest request head (request line and headers), in bytes.
    pub max_head_bytes: usize,
    /// Time for a request head, and for a `CONNECT`'s ClientHello, to arrive.
    pub head_timeout: Duration,
    /// Time a tunnel or forwarded request may pass without a byte either way.
    pub idle_timeout: Duration,
    /// Time to connect to the target.
    pub connect_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            max_head_bytes: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// One kernel's egress: its rules, resolver and bounds, and the denials
/// recorded for its cells. Shared by the proxy and the kernel's driver.
#[derive(Debug, Default)]
pub struct Egress {
    /// The rules (at least one).
    pub rules: Vec<Rule>,
    /// How names are resolved.
    pub resolver: Resolver,
    /// The proxy's bounds.
    pub limits: Limits,
    /// Refused connections, taken by each cell as it settles.
    pub log: DenialLog,
}

impl Egress {
    /// The egress of a list policy; `None` for `on` and `off`.
    pub fn for_policy(policy: &NetworkPolicy, resolver: Resolver, limits: Limits) -> Option<Arc<Egress>> {
        match policy {
            NetworkPolicy::Allow(rules) => Some(Arc::new(Egress {
                rules: rules.clone(),
                resolver,
                limits,
                log: DenialLog::default(),
            })),
            _ => None,
        }
    }
}

/// The environment that points a kernel's HTTP clients at the proxy:
/// `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY`, upper and
/// lower case. `NO_PROXY` keeps the kernel's own loopback direct (a
/// server a cell starts for itself).
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut v = Vec::new();
    for (k, val) in [
        ("HTTP_PROXY", url.as_str()),
        ("HTTPS_PROXY", url.as_str()),
        ("ALL_PROXY", url.as_str()),
        ("NO_PROXY", "localhost,127.0.0.1,::1"),
    ] {
        v.push((k.to_string(), val.to_string()));
        v.push((k.to_ascii_lowercase(), val.to_string()));
    }
    v
}
