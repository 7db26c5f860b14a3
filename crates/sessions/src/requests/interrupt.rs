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

/// What an interrupt did, and which submitted cells of the session it
/// dropped from the queue.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Interrupted {
    /// The interrupt of the running cell.
    pub outcome: InterruptOutcome,
    /// Submitted cells that were queued behind it and will not run.
    pub dropped: Vec<String>,
}

impl InterruptRequest {
    /// Interrupts the running cell and drops the session's queued
    /// submitted cells ([`crate::requests::SubmitRequest`]): an interrupt
    /// stops the session's work, not only its current cell.
    ///
    /// # Errors
    /// As [`InterruptRequest::execute`] (`session_not_found` only when
    /// nothing was dropped either).
    pub async fn execute_dropping_queued(&self, reg: &Registry) -> Result<Interrupted, RequestError> {
        validate_session(&self.session)?;
        let dropped = reg.detached().drop_queued(&self.owner, &self.session, &self.cwd);
        match self.execute(reg).await {
            Ok(outcome) => Ok(Interrupted { outcome, dropped }),
            Err(RequestError::SessionNotFound { .. }) if !dropped.is_empty() => Ok(Interrupted {
                outcome: InterruptOutcome {
                    delivered: false,
                    target: None,
                    cell: None,
                    reason: Some("no cell was running".into()),
                },
                dropped,
            }),
            Err(e) => Err(e),
        }
    }
}
