//! `list`: an owner's live sessions, and (with
//! [`ListRequest::execute_with_paused`]) its paused ones: this host's and
//! those the journal records as paused by an earlier host.

use std::path::PathBuf;

use cellhost_sandbox::profile::SandboxMode;
use serde::Serialize;

use crate::registry::Registry;

/// List the sessions of an owner that have a live kernel (never another
/// owner's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRequest {
    /// The owner.
    pub owner: String,
}

/// One live or paused session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionSummary {
    /// Name.
    pub name: String,
    /// `live` (a kernel runs) or `paused` (its kernel was checkpointed and
    /// stopped; the next cell resumes it).
    pub state: &'static str,
    /// Kernel generation (for a paused session: the one that was stopped).
    pub generation: u64,
    /// Worker pid (0 for a paused session).
    pub pid: u32,
    /// A cell is running or queued.
    pub busy: bool,
    /// Interpreter.
    pub python: PathBuf,
    /// Sandbox mode.
    pub sandbox: SandboxMode,
    /// Working directory (`None`: the session directory).
    pub cwd: Option<PathBuf>,
    /// Where the kernel runs, for a remote kernel (placement, node, job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<cellhost_kernel::KernelPlacement>,
    /// The limits the session runs under ([`crate::limits`]): every value
    /// that applies, host defaults filled in (a field absent: no limit).
    pub limits: crate::limits::SessionLimits,
    /// When the session was paused, milliseconds since the Unix epoch
    /// (paused sessions only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_ms: Option<i64>,
    /// The checkpoint a paused session resumes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::registry::CheckpointSummary>,
}

impl ListRequest {
    /// Runs the request: sessions sorted by key.
    pub fn execute(&self, reg: &Registry) -> Vec<SessionSummary> {
        reg.sessions_of(&self.owner)
            .into_iter()
            .filter_map(|(k, generation)| {
                let kern = reg.kernel(&k)?;
                Some(SessionSummary {
                    name: k.session.clone(),
                    state: "live",
                    generation,
                    pid: kern.info().pid,
                    busy: kern.is_busy(),
                    python: k.python.clone(),
                    sandbox: k.sandbox,
                    cwd: k.cwd.clone(),
                    placement: kern.info().placement.clone(),
                    limits: reg.session_limits(&k),
                    paused_ms: None,
                    checkpoint: None,
                })
            })
            .collect()
    }

    /// The live sessions, then the paused ones (this host's, and those the
    /// journal records as paused, also when an earlier host paused them),
    /// each by name.
    pub async fn execute_with_paused(&self, reg: &Registry) -> Vec<SessionSummary> {
        let mut out = self.execute(reg);
        for p in reg.paused_sessions(&self.owner).await {
            if out.iter().any(|s| s.name == p.key.session) {
                continue;
            }
            out.push(SessionSummary {
                name: p.key.session.clone(),
                state: "paused",
                generation: p.generation,
                pid: 0,
                busy: false,
                python: p.key.python.clone(),
                sandbox: p.key.sandbox,
                cwd: p.key.cwd.clone(),
                placement: None,
                limits: reg.session_limits(&p.key),
                paused_ms: Some(p.paused_ms),
                checkpoint: Some(p.checkpoint),
            });
        }
        out
    }
}
