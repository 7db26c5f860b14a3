//! `interrupt`: stop a session's running cell.

use cellhost_kernel::InterruptOutcome;

use super::{CwdScope, RequestError, live_keys, validate_session};
use crate::registry::Registry;

/// Interrupt the running cell of an owner's session (any interpreter or
/// mode it runs under).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterruptRequest {
    /// The owner.
    pub owner: String,
    /// The session.
    pub session: String,
    /// Which of its directories (the daemon's sessions are keyed by one).
    pub cwd: CwdScope,
}

impl InterruptRequest {
    /// Runs the request: what the interrupt did (not delivered when no cell
    /// runs).
    ///
    /// # Errors
    /// `bad_request`; `session_not_found` when the session has no live
    /// kernel in the scope's directories.
    pub async fn execute(&self, reg: &Registry) -> Result<InterruptOutcome, RequestError> {
        validate_session(&self.session)?;
        let keys = live_keys(reg, &self.owner, &self.session, &self.cwd)?;
        // A busy kernel first: the session may run under two interpreters
        // or modes, and the interrupt is for the one running a cell.
        let kernels: Vec<_> = keys.iter().filter_map(|k| reg.kernel(k)).collect();
        let Some(k) = kernels
            .iter()
            .find(|k| k.is_busy())
            .or_else(|| kernels.first())
            .cloned()
        else {
            return Err(RequestError::SessionNotFound {
                session: self.session.clone(),
                live: true,
            });
        };
        Ok(k.interrupt().await)
    }
}
