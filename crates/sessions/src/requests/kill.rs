//! `kill`: end a session's kernels and forget the session.

use serde::Serialize;

use super::{CwdScope, RequestError, live_keys, validate_session};
use crate::registry::Registry;

/// Kill every live kernel of an owner's session (and its delegated
/// children) and forget it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillRequest {
    /// The owner.
    pub owner: String,
    /// The session.
    pub session: String,
    /// Which of its directories (the daemon's sessions are keyed by one).
    pub cwd: CwdScope,
}

/// What a kill did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KillReport {
    /// The session.
    pub session: String,
    /// Kernels killed (one per interpreter and mode the session ran under).
    pub killed: usize,
}

impl KillRequest {
    /// Runs the request.
    ///
    /// # Errors
    /// `bad_request`; `session_not_found` when the session has no live
    /// kernel in the scope's directories.
    pub async fn execute(&self, reg: &Registry) -> Result<KillReport, RequestError> {
        validate_session(&self.session)?;
        let keys = match live_keys(reg, &self.owner, &self.session, &self.cwd) {
            Ok(keys) => keys,
            // A paused session has no live kernel: killing it drops its
            // checkpoint.
            Err(e) => match reg.paused_key(&self.owner, &self.session).await {
                Some(k) if self.cwd.admits(&k.cwd) => {
                    reg.drop_checkpoint(&k).await;
                    return Ok(KillReport {
                        session: self.session.clone(),
                        killed: 0,
                    });
                }
                _ => return Err(e),
            },
        };
        for k in &keys {
            // The session's state is dropped on purpose: no restore.
            reg.drop_checkpoint(k).await;
            reg.dispose(k).await;
        }
        Ok(KillReport {
            session: self.session.clone(),
            killed: keys.len(),
        })
    }
}
