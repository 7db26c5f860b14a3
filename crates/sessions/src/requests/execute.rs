//! `execute`: run one cell in a session.

use cellhost_kernel::{CellResult, ExecOptions, KernelError, LiveEvent};
use tokio::sync::mpsc::UnboundedSender;

use super::{Deadline, RequestError, SessionSpec};
use crate::registry::{Origin, Registry, RegistryError};

/// Run `code` in a session (its kernel started on first use).
#[derive(Debug, Clone)]
pub struct ExecuteRequest {
    /// The session.
    pub session: SessionSpec,
    /// The cell's code.
    pub code: String,
    /// Its deadline, counted from the moment it starts running.
    pub deadline: Deadline,
    /// Wait behind a running cell instead of being refused with
    /// `session_busy`.
    pub queue: bool,
    /// Receives rendered, redacted output while the cell runs.
    pub live: Option<UnboundedSender<LiveEvent>>,
    /// The caller's stop flag ([`ExecOptions::cancel`]).
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Who asks and why (journaled with the cell).
    pub origin: Origin,
}

/// What an execute produced.
#[derive(Debug, Clone)]
pub struct Executed {
    /// The cell's result.
    pub result: CellResult,
    /// The cell ran but its journal row could not be written (it may be
    /// left `running` in the journal): a surface that promises a journal
    /// must report this as a failure.
    pub journal_error: Option<String>,
}

impl ExecuteRequest {
    /// `code` in `session`, default deadline, not queued, no live output.
    pub fn new(session: SessionSpec, code: impl Into<String>, origin: Origin) -> Self {
        ExecuteRequest {
            session,
            code: code.into(),
            deadline: Deadline::Default,
            queue: false,
            live: None,
            cancel: None,
            origin,
        }
    }

    /// Runs the request.
    ///
    /// # Errors
    /// `bad_request` (name), `sandbox_below_floor`, `session_busy` (a cell
    /// runs and the request did not queue), `kernel_failed`,
    /// `registry_full`, `shut_down`.
    pub async fn execute(self, reg: &Registry) -> Result<Executed, RequestError> {
        let key = self.session.key(reg)?;
        reg.set_session_env(&key, &self.session.env);
        self.session.apply_limits(reg, &key, false)?;
        let opts = ExecOptions {
            timeout: self.deadline.as_exec_timeout(),
            fail_if_busy: !self.queue,
            live: self.live,
            cancel: self.cancel,
            ..Default::default()
        };
        match reg.execute_journaled(&key, &self.code, opts, &self.origin).await {
            Ok((result, journal_error)) => Ok(Executed {
                result,
                journal_error: journal_error.map(|e| e.to_string()),
            }),
            Err(RegistryError::Kernel(KernelError::KernelBusy { cell, .. })) => {
                Err(RequestError::SessionBusy {
                    session: key.session.clone(),
                    cell,
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}
