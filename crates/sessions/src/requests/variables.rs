//! `variables`: a session's namespace.

use cellhost_kernel::{KernelError, Variables};

use super::{RequestError, SessionSpec};
use crate::registry::Registry;

/// Largest `limit` of variables.
pub const MAX_VARIABLES: u32 = 10_000;

/// Inspect an idle session's namespace (never while a cell runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariablesRequest {
    /// The session.
    pub session: SessionSpec,
    /// Variables at most (1..=10,000).
    pub limit: u32,
}

impl VariablesRequest {
    /// Runs the request.
    ///
    /// # Errors
    /// `bad_request` (limit, name); `session_not_found` without a live
    /// kernel; `session_busy` while a cell runs; `kernel_failed`.
    pub async fn execute(&self, reg: &Registry) -> Result<Variables, RequestError> {
        if self.limit == 0 || self.limit > MAX_VARIABLES {
            return Err(RequestError::bad_request(format!(
                "limit is 1-{MAX_VARIABLES}, got {}",
                self.limit
            )));
        }
        let key = self.session.key(reg)?;
        let Some(k) = reg.kernel(&key) else {
            return Err(RequestError::SessionNotFound {
                session: key.session,
                live: true,
            });
        };
        match k.inspect_variables(self.limit).await {
            Err(KernelError::KernelBusy { cell, .. }) => Err(RequestError::SessionBusy {
                session: key.session,
                cell,
            }),
            other => other.map_err(|e| RequestError::Registry(e.into())),
        }
    }
}
