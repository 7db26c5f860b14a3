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
/// has a runtime for ([`cellhost_kernel::for_language`])
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
    /// The first cell was refused because the session was busy: the run
    /// is then that error, not a stop.
    busy: Option<RequestError>,
    ran: bool,
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
            busy: None,
            ran: false,
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
        let done = match req.execute(&self.registry).await {
            Ok(d) => d,
            Err(e) => {
                let message = e.to_string();
                if !self.ran && e.code() == "session_busy" {
                    self.busy = Some(e);
                }
                return Err(message);
            }
        };
        self.ran = true;
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
        // The session runs in the language it names, else the registry's.
        let runs = match &self.session.language {
            Some(l) => cellhost_kernel::for_language(l).map_or_else(|| l.clone(), |r| r.name().to_string()),
            None => registry.config().template.runtime.name().to_string(),
        };
        let found = cellhost_kernel::for_language(&language);
        if found.is_none_or(|r| r.name() != runs) {
            return Err(RequestError::UnsupportedLanguage {
                language,
                supported: cellhost_kernel::runtime::LANGUAGES
                    .iter()
                    .map(|l| l.to_string())
                    .collect(),
                runtime: runs,
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
    /// `unsupported_language`, `bad_request`, `sandbox_below_floor`,
    /// `session_busy` (the session runs another cell when the first cell
    /// is sent; nothing of the notebook ran); a cell that cannot run or
    /// fails is a [`RunSummary::stop`], not an error.
    pub async fn execute(
        &self,
        registry: &Arc<Registry>,
        nb: &mut Notebook,
        observer: &mut impl Observer,
    ) -> Result<RunSummary, RequestError> {
        // A session that names no language runs the notebook's (an R
        // notebook over HTTP or MCP runs in R).
        let mut session = self.session.clone();
        if session.language.is_none() {
            session.language = nb
                .language()
                .and_then(|l| cellhost_kernel::for_language(&l))
                .map(|r| r.name().to_string());
        }
        let this = RunNotebookRequest {
            session,
            ..self.clone()
        };
        let this = &this;
        this.prepare(registry, nb)?;
        let mut runner = RegistryRunner::new(
            registry.clone(),
            this.session.clone(),
            self.deadline,
            self.origin.clone(),
        )?
        .with_cancel(self.options.stop.clone());
        let mut opts = self.options.clone();
        opts.timeout = self.deadline.resolve(registry.config().template.cell_timeout);
        let summary = execute_notebook(nb, &mut runner, &opts, observer).await;
        // A session busy with another cell refuses the whole run, as it
        // refuses an execute (nothing of the notebook ran).
        if let Some(busy) = runner.busy.take() {
            return Err(busy);
        }
        Ok(summary)
    }
}

/// Most cells a notebook sent over HTTP or MCP may have.
pub const MAX_NOTEBOOK_CELLS: usize = 10_000;

/// A notebook as a surface receives it.
#[derive(Debug, Clone)]
pub enum NotebookInput {
    /// An nbformat 4 notebook as JSON.
    Ipynb(serde_json::Value),
    /// The text of a percent-format script (`# %%` cells).
    Percent(String),
}

impl NotebookInput {
    /// The notebook, checked: nbformat 4 (see
    /// [`Notebook::from_ipynb_str`]), at most [`MAX_NOTEBOOK_CELLS`] cells.
    ///
    /// # Errors
    /// [`RequestError::BadRequest`] naming what is wrong.
    pub fn parse(&self) -> Result<Notebook, RequestError> {
        let nb = match self {
            NotebookInput::Ipynb(v) => Notebook::from_ipynb_str(&v.to_string())
                .map_err(|e| RequestError::bad_request(e.to_string()))?,
            NotebookInput::Percent(text) => Notebook::from_percent_str(text),
        };
        if nb.cell_count() > MAX_NOTEBOOK_CELLS {
            return Err(RequestError::bad_request(format!(
                "the notebook has {} cells; at most {MAX_NOTEBOOK_CELLS} are run per request",
                nb.cell_count()
            )));
        }
        Ok(nb)
    }
}

/// Parameters from a JSON object of names to values (HTTP and MCP):
/// the JSON types map to Python's (`null` → `None`, …).
///
/// # Errors
/// [`RequestError::BadRequest`] for a name that is not a Python identifier.
pub fn parameters_from_json(
    obj: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<Parameters, RequestError> {
    match obj {
        None => Ok(Parameters::new()),
        Some(o) => Parameters::from_json_object(o).map_err(|e| RequestError::bad_request(e.to_string())),
    }
}

/// Where [`RunNotebookRequest::execute_temporary`] runs: a session of its
/// own (`notebook run <n>`: a name no API session can have), killed after.
fn temporary_name() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    format!(
        "notebook run {}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

impl RunNotebookRequest {
    /// Runs the request in a session of its own for `owner` (its name from
    /// a counter, with spaces so that it is no valid HTTP or MCP session
    /// name), whose kernels are killed when the run ends, however it
    /// ends. `self.session` gives the interpreter, mode and cwd; its name
    /// is replaced.
    ///
    /// # Errors
    /// As [`RunNotebookRequest::execute`].
    pub async fn execute_temporary(
        &self,
        registry: &Arc<Registry>,
        nb: &mut Notebook,
        observer: &mut impl Observer,
    ) -> Result<RunSummary, RequestError> {
        let mut req = self.clone();
        req.session.session = temporary_name();
        let kill = super::KillRequest {
            owner: req.session.owner.clone(),
            session: req.session.session.clone(),
            cwd: super::CwdScope::Any,
        };
        // The kill runs even when the caller drops this future mid-cell.
        struct Reap(Option<(Arc<Registry>, super::KillRequest)>);
        impl Drop for Reap {
            fn drop(&mut self) {
                if let Some((reg, kill)) = self.0.take()
                    && let Ok(rt) = tokio::runtime::Handle::try_current()
                {
                    rt.spawn(async move {
                        let _ = kill.execute(&reg).await;
                    });
                }
            }
        }
        let mut reap = Reap(Some((registry.clone(), kill.clone())));
        let out = req.execute(registry, nb, observer).await;
        reap.0 = None;
        let _ = kill.execute(registry).await;
        out
    }
}

/// A [`RunSummary`] as the HTTP and MCP surfaces report it:
/// `{"total", "ran", "stop": null | {"reason", "cell", "message",
/// "status"?}}` (`reason`: [`Stop::code`](cellhost_notebook::Stop::code)).
pub fn summary_json(s: &RunSummary) -> serde_json::Value {
    serde_json::json!({
        "total": s.total,
        "ran": s.ran,
        "stop": s.stop.as_ref().map(|stop| {
            let mut v = serde_json::json!({
                "reason": stop.code(),
                "cell": stop.cell(),
                "message": stop.message(),
            });
            if let cellhost_notebook::Stop::CellFailed { status, .. } = stop {
                v["status"] = status.as_str().into();
            }
            v
        }),
    })
}
