//! `interrupt`: stop a session's running cell.

use cellhost_kernel::InterruptOutcome;

use super::{RequestError, live_keys, validate_session};
use crate::registry::Registry;

/// Interrupt the running cell of an owner's session (any interpreter or
/// mode it runs under).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterruptRequest {
    /// The owner.
    pub owner: String,
    /// The session.
    pub session: String,
}

impl InterruptRequest {
    /// Runs the request: what the interrupt did (not delivered when no cell
    /// runs).
    ///
    /// # Errors
    /// `bad_request`; `session_not_found` when the session has no live
    /// kernel.
    pub async fn execute(&self, reg: &Registry) -> Result<InterruptOutcome, RequestError> {
        validate_session(&self.session)?;
        let Some(k) = live_keys(reg, &self.owner, &self.session)
            .into_iter()
            .find_map(|k| reg.kernel(&k))
        else {
            return Err(RequestError::SessionNotFound {
                session: self.session.clone(),
                live: true,
            });
        };
        Ok(k.interrupt().await)
    }
}
