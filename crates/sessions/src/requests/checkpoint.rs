//! `checkpoint`: take a session's checkpoint now.

use super::{CwdScope, RequestError, live_key};
use crate::checkpoint::CheckpointMode;
use crate::registry::{CheckpointSummary, Registry};

/// Take a checkpoint of an owner's live, idle session now, in its mode
/// (`namespace` for a session whose mode is `off`; `process`: the whole
/// kernel dumped by CRIU, left running — refused with the reason where
/// CRIU cannot run or the session's sandbox or limits would not survive a
/// restore). Waits for a checkpoint in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRequest {
    /// The owner.
    pub owner: String,
    /// The session.
    pub session: String,
    /// Which of its directories (the daemon's sessions are keyed by one).
    pub cwd: CwdScope,
}

impl CheckpointRequest {
    /// Runs the request.
    ///
    /// # Errors
    /// `bad_request`; `session_not_found` (no live kernel);
    /// `session_busy`; `checkpoint_unavailable` (`process` mode without a
    /// working CRIU or root, or with a sandbox (`layer: landlock`) or
    /// limits (`layer: cgroup`); a remote kernel; not Python);
    /// `checkpoint_failed` (CRIU's or the kernel's error).
    pub async fn execute(&self, reg: &Registry) -> Result<CheckpointSummary, RequestError> {
        let key = &live_key(reg, &self.owner, &self.session, &self.cwd)?;
        if reg.checkpoint_mode(key) == CheckpointMode::Process {
            reg.check_checkpoint_mode(key, CheckpointMode::Process)?;
        }
        reg.checkpoint_now(key)
            .await
            .map_err(super::busy_as_session_busy(&self.session))
    }
}
