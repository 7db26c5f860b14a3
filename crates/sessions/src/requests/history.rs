//! `history`: a session's journaled cells and kernels.

use serde::Serialize;

use super::{RequestError, validate_session};
use crate::journal::{CellRow, JournalReader, KernelRow};
use crate::registry::Registry;

/// The journaled cells (oldest first) and kernels of an owner's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRequest {
    /// The owner.
    pub owner: String,
    /// The session.
    pub session: String,
}

/// A session's history.
#[derive(Debug, Clone, Serialize)]
pub struct History {
    /// The owner.
    pub owner: String,
    /// The session.
    pub session: String,
    /// The language its kernels last ran (`python`, `r`); `None` when the
    /// journal has no session row or the session was journaled before
    /// languages were (then it ran Python).
    pub language: Option<String>,
    /// Its kernels, oldest first, with why each ended.
    pub kernels: Vec<KernelRow>,
    /// Its cells, oldest first.
    pub cells: Vec<CellRow>,
}

impl HistoryRequest {
    /// Runs the request against a journal opened for reading (no
    /// registry needed: `cellhost history`).
    ///
    /// # Errors
    /// `bad_request`; `journal_failed`; `session_not_found` when the
    /// journal knows neither a cell nor a kernel of the session.
    pub fn execute_on(&self, reader: &JournalReader) -> Result<History, RequestError> {
        validate_session(&self.session)?;
        let journal = |e: crate::journal::JournalError| RequestError::Journal {
            message: e.to_string(),
        };
        let cells = reader.cells(&self.owner, &self.session).map_err(journal)?;
        let kernels = reader.kernels(&self.owner, &self.session).map_err(journal)?;
        let language = reader
            .session_language(&self.owner, &self.session)
            .map_err(journal)?;
        self.found(cells, kernels, language)
    }

    /// Runs the request against the registry's journal.
    ///
    /// # Errors
    /// As [`HistoryRequest::execute_on`]; `journal_failed` when the
    /// registry keeps no journal.
    pub async fn execute(&self, reg: &Registry) -> Result<History, RequestError> {
        validate_session(&self.session)?;
        let Some(j) = reg.journal() else {
            return Err(RequestError::Journal {
                message: "no journal is kept".into(),
            });
        };
        let cells = j
            .history(&self.owner, &self.session)
            .await
            .map_err(|e| RequestError::Journal {
                message: e.to_string(),
            })?;
        let reader = JournalReader::open(j.path()).map_err(|e| RequestError::Journal {
            message: e.to_string(),
        })?;
        let kernels = reader
            .kernels(&self.owner, &self.session)
            .map_err(|e| RequestError::Journal {
                message: e.to_string(),
            })?;
        let language =
            reader
                .session_language(&self.owner, &self.session)
                .map_err(|e| RequestError::Journal {
                    message: e.to_string(),
                })?;
        self.found(cells, kernels, language)
    }

    fn found(
        &self,
        cells: Vec<CellRow>,
        kernels: Vec<KernelRow>,
        language: Option<String>,
    ) -> Result<History, RequestError> {
        if cells.is_empty() && kernels.is_empty() {
            return Err(RequestError::SessionNotFound {
                session: self.session.clone(),
                live: false,
            });
        }
        Ok(History {
            owner: self.owner.clone(),
            session: self.session.clone(),
            language,
            kernels,
            cells,
        })
    }
}
