//! `list`: an owner's live sessions.

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

/// One live session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionSummary {
    /// Name.
    pub name: String,
    /// Kernel generation.
    pub generation: u64,
    /// Worker pid.
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
                    generation,
                    pid: kern.info().pid,
                    busy: kern.is_busy(),
                    python: k.python.clone(),
                    sandbox: k.sandbox,
                    cwd: k.cwd.clone(),
                    placement: kern.info().placement.clone(),
                    limits: reg.session_limits(&k),
                })
            })
            .collect()
    }
}
