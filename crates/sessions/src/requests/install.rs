//! `install`: install packages into a session (see [`crate::packages`]).
//!
//! The request runs the cell `%pip install SPEC…` in the session, so every
//! way of installing goes one way: the cell's built-in host tool runs the
//! installer on the host, its output comes back as the cell's, the cell is
//! journaled (`restore` replays it: the installer runs again and finds the
//! overlay's packages in place when the overlay survived), and the worker
//! invalidates its import caches so the next cell imports the packages.

use cellhost_kernel::{CellResult, LiveEvent};
use tokio::sync::mpsc::UnboundedSender;

use super::{Deadline, ExecuteRequest, RequestError, SessionSpec};
use crate::packages::{InstallReport, PackageError, validate_specs};
use crate::registry::{Origin, Registry};

/// Install `packages` for `session` (its kernel started on first use).
#[derive(Debug, Clone)]
pub struct InstallRequest {
    /// The session.
    pub session: SessionSpec,
    /// Requirement specs ([`crate::packages::validate_spec`]).
    pub packages: Vec<String>,
    /// Into the interpreter's own environment instead of the session's
    /// overlay (refused unless `packages.shared_venv = true`).
    pub shared_venv: bool,
    /// Wait behind a running cell instead of `session_busy`.
    pub queue: bool,
    /// Receives the installer's output as the cell's.
    pub live: Option<UnboundedSender<LiveEvent>>,
    /// Who asks (journaled with the cell).
    pub origin: Origin,
}

/// What an install did.
#[derive(Debug, Clone)]
pub struct Installed {
    /// The installer's report.
    pub report: InstallReport,
    /// The `%pip install` cell's result (its output is the installer's).
    pub result: CellResult,
    /// The cell's journal row could not be written.
    pub journal_error: Option<String>,
}

impl InstallRequest {
    /// `packages` for `session`, into its overlay.
    pub fn new(session: SessionSpec, packages: Vec<String>, origin: Origin) -> Self {
        InstallRequest {
            session,
            packages,
            shared_venv: false,
            queue: false,
            live: None,
            origin,
        }
    }

    /// The cell the request runs: `%pip install [--shared-venv] SPEC…`,
    /// each spec validated and normalised (so it holds no whitespace but
    /// around a URL's `@`, and is quoted then).
    ///
    /// # Errors
    /// `invalid_package_spec`; `shared_venv_refused`.
    pub fn cell_code(&self, reg: &Registry) -> Result<String, RequestError> {
        let settings = &reg.package_host().settings;
        let specs = validate_specs(&self.packages, settings.allow_urls)?;
        if self.shared_venv && !settings.shared_venv {
            return Err(PackageError::SharedVenvRefused.into());
        }
        let mut code = String::from("%pip install");
        if self.shared_venv {
            code.push_str(" --shared-venv");
        }
        for s in specs {
            code.push(' ');
            if s.contains(' ') {
                code.push('\'');
                code.push_str(&s);
                code.push('\'');
            } else {
                code.push_str(&s);
            }
        }
        Ok(code)
    }

    /// Runs the request.
    ///
    /// # Errors
    /// `invalid_package_spec`, `shared_venv_refused` (before anything
    /// runs); `install_failed` (the installer's exit status and stderr
    /// tail), `installer_unavailable`; `bad_request` for a session of
    /// another language; the execute errors (`session_busy`, …).
    pub async fn execute(self, reg: &Registry) -> Result<Installed, RequestError> {
        let code = self.cell_code(reg)?;
        let key = self.session.key(reg)?;
        if key.language != "python" {
            return Err(RequestError::bad_request(format!(
                "session {:?} runs {}; packages are installed for Python sessions",
                key.session, key.language
            )));
        }
        let timeout = reg.package_host().settings.timeout + std::time::Duration::from_secs(60);
        let mut req = ExecuteRequest::new(self.session, code, self.origin);
        req.deadline = Deadline::After(timeout);
        req.queue = self.queue;
        req.live = self.live;
        let executed = req.execute(reg).await?;
        let result = executed.result;
        match reg.package_host().log.take(&result.cell_id) {
            Some(Ok(report)) => Ok(Installed {
                report,
                result,
                journal_error: executed.journal_error,
            }),
            Some(Err(e)) => Err(e.into()),
            None => Err(PackageError::InstallFailed {
                status: format!("cell {}", result.status.as_str()),
                stderr_tail: result
                    .error
                    .as_ref()
                    .map(|e| format!("{}: {}", e.ename, e.evalue))
                    .unwrap_or_else(|| {
                        result
                            .stderr
                            .chars()
                            .rev()
                            .take(2000)
                            .collect::<Vec<_>>()
                            .into_iter()
                            .rev()
                            .collect()
                    }),
            }
            .into()),
        }
    }
}
