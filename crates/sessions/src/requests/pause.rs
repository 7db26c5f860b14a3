//! `pause`: checkpoint a session and stop its kernel; the next cell resumes it.

use super::{CwdScope, RequestError, live_key};
use crate::registry::{PauseReport, Registry};

/// Pause an owner's live, idle session: a checkpoint (a process checkpoint
/// in `process` mode, else a namespace checkpoint), then its kernel
/// stopped (its memory freed). The journal records the pause and
/// the checkpoint, so the session survives a restart of the host; its next
/// cell (on any surface) resumes it, and that cell's result says
/// `restored.resumed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseRequest {
    /// The owner.
    pub owner: String,
    /// The session.
    pub session: String,
    /// Which of its directories (the daemon's sessions are keyed by one).
    pub cwd: CwdScope,
}

impl PauseRequest {
    /// Runs the request.
    ///
    /// # Errors
    /// `bad_request`; `session_not_found` (no live kernel: never started,
    /// killed, or paused already); `session_busy` (a cell runs);
    /// `checkpoint_unavailable` (a remote kernel, not Python; in `process`
    /// mode as [`super::CheckpointRequest`]);
    /// `checkpoint_failed` (the kernel keeps running).
    pub async fn execute(&self, reg: &Registry) -> Result<PauseReport, RequestError> {
        let key = &live_key(reg, &self.owner, &self.session, &self.cwd)?;
        reg.pause(key)
            .await
            .map_err(super::busy_as_session_busy(&self.session))
    }
}
