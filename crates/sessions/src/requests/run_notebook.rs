//! `run_notebook`: execute a notebook cell by cell in one session.

use std::sync::Arc;

use cellhost_notebook::{
    CellRun, CellRunner, Notebook, Observer, Parameters, RunOptions, RunSummary, execute_notebook,
};

use super::{Deadline, ExecuteRequest, RequestError, SessionSpec};
use crate::registry::{Key, Origin, Registry};

/// Run every code cell of a notebook, in order, in one session, filling in
/// its outputs (see [`cellhost_notebook::execute_notebook`]).
///
/// Before anything runs, the notebook's language (`kernelspec.language`,
/// else `language_info.name`, else Python) must be one the kernel crate
/// has a runtime for ([`cellhost_kernel::runtime::runtime_for_language`])
/// and the one the registry's kernels run; otherwise the request fails
/// with `unsupported_language` and the notebook is not touched. Then the
/// [`parameters`](RunNotebookRequest::parameters), if any, are injected as
/// papermill does ([`Notebook::inject_parameters`]).
#[derive(Debug, Clone)]
pub struct RunNotebookRequest {
    /// The session the cells run in.
    pub session: SessionSpec,
    /// Each cell's deadline.
    pub deadline: Deadline,
    /// Figures directory, `allow_errors`, stop flag (its `timeout` is set
    /// from `deadline`).
    pub options: RunOptions,
    /// Who asks (journaled with every cell).
    pub origin: Origin,
    /// Parameters to inject (papermill's `-p`); empty: the notebook runs
    /// as it is.
    pub parameters: Parameters,
}

/// A [`CellRunner`] over one session of a registry: each cell an
/// [`ExecuteRequest`] (queued behind nothing: a notebook's cells run one
/// after another).
#[derive(Debug)]
pub struct RegistryRunner {
    registry: Arc<Registry>,
    key: Key,
    session: SessionSpec,
    deadline: Deadline,
    origin: Origin,
    cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl RegistryRunner {
    /// A runner for `session` of `registry`.
    ///
    /// # Errors
    /// `bad_request`, `sandbox_below_floor` (the session's key).
    pub fn new(
        registry: Arc<Registry>,
        session: SessionSpec,
        deadline: Deadline,
        origin: Origin,
    ) -> Result<Self, RequestError> {
        let key = session.key(&registry)?;
        Ok(RegistryRunner {
            registry,
            key,
            session,
            deadline,
            origin,
            cancel: None,
        })
    }

    /// Cells run with this stop flag ([`ExecOptions::cancel`](cellhost_kernel::kernel::ExecOptions)):
    /// a cell submitted after the flag was set is interrupted at once.
    pub fn with_cancel(mut self, cancel: Option<Arc<std::sync::atomic::AtomicBool>>) -> Self {
        self.cancel = cancel;
        self
    }

    /// The session's key.
    pub fn key(&self) -> &Key {
        &self.key
    }
}

impl CellRunner for RegistryRunner {
    async fn run(&mut self, code: &str) -> Result<CellRun, String> {
        let mut req = ExecuteRequest::new(self.session.clone(), code, self.origin.clone());
        req.deadline = self.deadline;
        req.cancel = self.cancel.clone();
        let done = req.execute(&self.registry).await.map_err(|e| e.to_string())?;
        Ok(CellRun {
            result: done.result,
            journal_error: done.journal_error,
        })
    }

    fn kernel_info(&self) -> Option<(String, String)> {
        self.registry.kernel(&self.key).map(|k| {
            (
                k.info().python_version.clone(),
                self.key.python.display().to_string(),
            )
        })
    }
}

impl RunNotebookRequest {
    /// Checks the notebook's language and injects the parameters: what
    /// [`RunNotebookRequest::execute`] does before the first cell.
    ///
    /// # Errors
    /// `unsupported_language`; `bad_request` for parameters given to a
    /// notebook of a language without a parameters translator.
    pub fn prepare(&self, registry: &Registry, nb: &mut Notebook) -> Result<(), RequestError> {
        let language = nb.language().unwrap_or_else(|| "python".to_string());
        let runs = registry.config().template.runtime.name();
        let found = cellhost_kernel::runtime::runtime_for_language(&language);
        if found.is_none_or(|r| r.name() != runs) {
            return Err(RequestError::UnsupportedLanguage {
                language,
                supported: cellhost_kernel::runtime::known_runtimes()
                    .iter()
                    .map(|r| r.name().to_string())
                    .collect(),
                runtime: runs.to_string(),
            });
        }
        if !self.parameters.is_empty() {
            let source =
                cellhost_notebook::parameters_source(&language, &self.parameters).ok_or_else(|| {
                    RequestError::bad_request(format!(
                        "parameters cannot be injected into a {language} notebook yet"
                    ))
                })?;
            nb.inject_parameters(&self.parameters, &source);
        }
        Ok(())
    }

    /// Runs the request on `nb` (its outputs replaced).
    ///
    /// # Errors
    /// `unsupported_language`, `bad_request`, `sandbox_below_floor`; a cell that cannot run or
    /// fails is a [`RunSummary::stop`], not an error.
    pub async fn execute(
        &self,
        registry: &Arc<Registry>,
        nb: &mut Notebook,
        observer: &mut impl Observer,
    ) -> Result<RunSummary, RequestError> {
        self.prepare(registry, nb)?;
        let mut runner = RegistryRunner::new(
            registry.clone(),
            self.session.clone(),
            self.deadline,
            self.origin.clone(),
        )?
        .with_cancel(self.options.stop.clone());
        let mut opts = self.options.clone();
        opts.timeout = self.deadline.resolve(registry.config().template.cell_timeout);
        Ok(execute_notebook(nb, &mut runner, &opts, observer).await)
    }
}
