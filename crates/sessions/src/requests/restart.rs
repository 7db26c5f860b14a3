//! `restart`: a fresh kernel for a session, its state dropped.

use serde::Serialize;

use super::{RequestError, SessionSpec};
use crate::registry::Registry;

/// Kill a session's kernel (if one lives) and start a new generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartRequest {
    /// The session.
    pub session: SessionSpec,
}

/// What a restart did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestartReport {
    /// The session.
    pub session: String,
    /// The new kernel's generation.
    pub generation: u64,
    /// The new worker's pid.
    pub pid: u32,
    /// A live kernel was killed first.
    pub killed_previous: bool,
}

impl RestartRequest {
    /// Runs the request.
    ///
    /// # Errors
    /// `bad_request`, `sandbox_below_floor`, `kernel_failed`,
    /// `registry_full`, `shut_down`.
    pub async fn execute(&self, reg: &Registry) -> Result<RestartReport, RequestError> {
        let key = self.session.key(reg)?;
        self.session.apply_limits(reg, &key, true)?;
        // A restart drops the session's state on purpose: no restore.
        reg.drop_checkpoint(&key).await;
        let killed_previous = match reg.kernel(&key) {
            Some(k) => {
                k.kill().await;
                true
            }
            None => false,
        };
        let (k, generation) = reg.acquire(&key).await?;
        Ok(RestartReport {
            session: key.session,
            generation,
            pid: k.info().pid,
            killed_previous,
        })
    }
}
