//! `restore`: rebuild a session from the journal.

use super::{RequestError, SessionSpec, validate_session};
use crate::registry::{Registry, RestoreReport};

/// Replay the successful cells of the last journaled kernel of `from`'s
/// session (of that owner only) into a new kernel of `into`, in the
/// language the journal recorded for that session unless `into` names
/// one. Opt-in: nothing replays code unless asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreRequest {
    /// The session to rebuild (where the new kernel lives).
    pub into: SessionSpec,
    /// Whose journaled session to replay: (owner, session); default the
    /// same as `into`'s.
    pub from: Option<(String, String)>,
    /// Replace a live kernel of `into` (otherwise a live kernel refuses).
    pub force: bool,
}

impl RestoreRequest {
    /// Runs the request.
    ///
    /// # Errors
    /// `bad_request`; `restore` (no journal, nothing to replay, a live
    /// kernel without `force`); kernel errors.
    pub async fn execute(&self, reg: &Registry) -> Result<RestoreReport, RequestError> {
        let (owner, session) = self
            .from
            .clone()
            .unwrap_or_else(|| (self.into.owner.clone(), self.into.session.clone()));
        validate_session(&session)?;
        let mut into = self.into.clone();
        if into.language.is_none()
            && let Some(j) = reg.journal()
        {
            // The cells are replayed in the language they were written in
            // (a session journaled before languages were ran Python).
            into.language =
                j.session_language(&owner, &session)
                    .await
                    .map_err(|e| RequestError::Journal {
                        message: e.to_string(),
                    })?;
        }
        let key = into.key(reg)?;
        Ok(reg.restore_from(&owner, &session, &key, self.force).await?)
    }
}
