//! The `limits` and `network` parameters of `execute_code` and
//! `submit_code`: what a session the call creates runs under, by the same
//! rules as HTTP's `POST /v1/sessions` and the daemon's `exec --session`
//! (see `cellhost_sessions::limits` and `cellhost_sessions::network`).
//!
//! A session that already runs keeps its own limits and policy (the result
//! carries a `note:` saying so); a value out of range is `bad_request`, one
//! over the operator's maximum (`[limits.max]`) is `limit_over_max` naming
//! the field and the maximum, a malformed rule is `bad_request` naming it;
//! each a tool error with the request layer's code, before any code runs.

use cellhost_sessions::egress::NetworkPolicy;
use cellhost_sessions::{EnvApplied, RequestError, SessionLimits, SessionSpec};
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::schemars;
use serde::Deserialize;

use crate::{CellhostMcp, request_tool_error};

/// Limits of a session the call creates (each optional; omitted: the
/// operator's configured ones). Bounded by the operator's maximum.
#[derive(Debug, Clone, Copy, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsParam {
    /// Memory of the kernel's whole process tree, in MiB (16 and up).
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// Processes and threads of the kernel at once (8 and up).
    #[serde(default)]
    pub pids: Option<u64>,
    /// CPU time as a number of cores (0.01 and up).
    #[serde(default)]
    pub cpu: Option<f64>,
    /// Disk the session's working directory and output spill may fill, in
    /// MiB (1 and up); writes past it fail, and the result's `fault` is
    /// `disk`.
    #[serde(default)]
    pub disk_mb: Option<u64>,
    /// A cell's default deadline, in seconds (0 = none).
    #[serde(default)]
    pub cell_timeout_s: Option<f64>,
}

impl From<LimitsParam> for SessionLimits {
    fn from(l: LimitsParam) -> SessionLimits {
        SessionLimits {
            memory_mb: l.memory_mb,
            pids: l.pids,
            cpu: l.cpu,
            disk_mb: l.disk_mb,
            cell_timeout_s: l.cell_timeout_s,
        }
    }
}

/// Network policy of a session the call creates: "off" (default: no
/// network), "on" (the host's network), or a list of "HOST[:PORT]" rules
/// (a DNS name, "*." and a name, an IP address; no port = 443 and 80)
/// reached through the host's egress proxy; other connections are refused
/// and listed in the result's `network.denied`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum NetworkParam {
    /// "off" or "on".
    Word(String),
    /// Rules, at most 256.
    Rules(Vec<String>),
}

impl NetworkParam {
    fn policy(&self) -> Result<NetworkPolicy, RequestError> {
        let parsed = match self {
            NetworkParam::Word(w) => NetworkPolicy::parse(w),
            NetworkParam::Rules(r) => NetworkPolicy::from_rules(r.clone()),
        };
        parsed.map_err(|e| RequestError::bad_request(format!("network: {e}")))
    }
}

impl CellhostMcp {
    /// Applies a call's `limits` and `network` to the session `spec`
    /// names: the notes to put before the result (a running session kept
    /// its own), or the tool error to answer instead.
    pub(crate) fn apply_session_settings(
        &self,
        spec: &mut SessionSpec,
        limits: Option<LimitsParam>,
        network: Option<&NetworkParam>,
    ) -> Result<Vec<String>, CallToolResult> {
        let fail = |e: &RequestError| request_tool_error("status: the session's settings were refused", e);
        let policy = network
            .map(NetworkParam::policy)
            .transpose()
            .map_err(|e| fail(&e))?;
        spec.limits = limits.map(SessionLimits::from).unwrap_or_default();
        let reg = &self.inner.registry;
        let key = spec.key(reg).map_err(|e| fail(&e))?;
        let mut notes = Vec::new();
        if !spec.apply_limits(reg, &key, false).map_err(|e| fail(&e))? {
            notes.push(format!(
                "note: session {} already runs with other limits; `limits` apply to new sessions only (restart it with reset: true)",
                key.session
            ));
        }
        match reg.set_session_network(&key, policy.as_ref()) {
            Ok(EnvApplied::Applied) => {}
            Ok(EnvApplied::Kept) => notes.push(format!(
                "note: session {} already runs with another network policy; `network` applies to new sessions only",
                key.session
            )),
            Err(e) => return Err(fail(&e)),
        }
        Ok(notes)
    }
}

/// Puts `notes` before the result's other content.
pub(crate) fn with_notes(mut r: CallToolResult, notes: Vec<String>) -> CallToolResult {
    if !notes.is_empty() {
        r.content.insert(0, ContentBlock::text(notes.join("\n")));
    }
    r
}
