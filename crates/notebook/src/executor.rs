//! The notebook executor: runs a notebook's code cells in order through a
//! [`CellRunner`] (one persistent kernel) and fills in their outputs —
//! streams, displays and figures (embedded as base64 and saved as files),
//! the last expression's value, errors, state resets and background
//! output. The crate knows no kernel lifecycle: `cellhost-sessions`
//! implements [`CellRunner`] over its registry, and the CLI, HTTP and MCP
//! call it through that request.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use cellhost_kernel::{CellResult, CellStatus};
use serde_json::{Map, Value};

use crate::{ExecutionTiming, Notebook, Output, merge_streams};

/// One cell run by a [`CellRunner`].
#[derive(Debug, Clone)]
pub struct CellRun {
    /// The cell's result.
    pub result: CellResult,
    /// The cell ran but was not journaled (why): the run stops there and
    /// fails, so a journal left with the cell `running` never ends in
    /// success.
    pub journal_error: Option<String>,
}

/// What runs a notebook's cells: one persistent kernel, in order.
pub trait CellRunner {
    /// Runs one cell and waits for its result. An `Err` is a failure to
    /// run it at all (no kernel, refused): the run stops there.
    fn run(&mut self, code: &str) -> impl std::future::Future<Output = Result<CellRun, String>> + Send;

    /// The kernel's Python version and interpreter path, once it runs.
    fn kernel_info(&self) -> Option<(String, String)>;
}

/// What the executor reports while it runs (progress, notes).
pub trait Observer {
    /// Cell `n` of `total` (1-based, counting code cells) starts.
    fn cell_started(&mut self, n: usize, total: usize) {
        let _ = (n, total);
    }
    /// Cell `n` of `total` settled after `took`.
    fn cell_done(&mut self, n: usize, total: usize, result: &CellResult, took: Duration) {
        let _ = (n, total, result, took);
    }
    /// Something worth saying that does not stop the run (a figure file
    /// that could not be read).
    fn note(&mut self, message: &str) {
        let _ = message;
    }
}

/// An observer that reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Quiet;
impl Observer for Quiet {}

/// How to run a notebook.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Where figures are saved as files (`cell<N>-<M>.<ext>`) besides
    /// being embedded; `None`: embedded only (HTTP, MCP).
    pub files_dir: Option<PathBuf>,
    /// Keep going after a cell fails.
    pub allow_errors: bool,
    /// The effective per-cell deadline (for the timeout message only).
    pub timeout: Option<Duration>,
    /// Set to stop the run (Ctrl-C): checked between cells and after each.
    pub stop: Option<Arc<AtomicBool>>,
}

/// Why a run stopped before its end.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// Stopped through [`RunOptions::stop`]: before cell `cell` ran, or
    /// right after it (`before == false`).
    Interrupted {
        /// 1-based cell number.
        cell: usize,
        /// Before the cell ran.
        before: bool,
    },
    /// Cell `cell` did not end `ok` and errors were not allowed.
    CellFailed {
        /// 1-based cell number.
        cell: usize,
        /// Its status.
        status: CellStatus,
        /// Its traceback (may be empty).
        traceback: Vec<String>,
    },
    /// Cell `cell` could not be run at all.
    RunnerFailed {
        /// 1-based cell number.
        cell: usize,
        /// Why.
        message: String,
    },
    /// Cell `cell` ran but was not journaled.
    JournalFailed {
        /// 1-based cell number.
        cell: usize,
        /// Why.
        message: String,
    },
    /// The outputs of cell `cell` could not be set in the notebook.
    NotebookFailed {
        /// 1-based cell number.
        cell: usize,
        /// Why.
        message: String,
    },
}

impl Stop {
    /// A stable name of the reason: `interrupted`, `cell_failed`,
    /// `runner_failed`, `journal_failed`, `notebook_failed`.
    pub fn code(&self) -> &'static str {
        match self {
            Stop::Interrupted { .. } => "interrupted",
            Stop::CellFailed { .. } => "cell_failed",
            Stop::RunnerFailed { .. } => "runner_failed",
            Stop::JournalFailed { .. } => "journal_failed",
            Stop::NotebookFailed { .. } => "notebook_failed",
        }
    }

    /// The 1-based number of the code cell the run stopped at.
    pub fn cell(&self) -> usize {
        match self {
            Stop::Interrupted { cell, .. }
            | Stop::CellFailed { cell, .. }
            | Stop::RunnerFailed { cell, .. }
            | Stop::JournalFailed { cell, .. }
            | Stop::NotebookFailed { cell, .. } => *cell,
        }
    }

    /// One line saying why.
    pub fn message(&self) -> String {
        match self {
            Stop::Interrupted { cell, before: true } => format!("interrupted before cell {cell}"),
            Stop::Interrupted { cell, before: false } => format!("interrupted at cell {cell}"),
            Stop::CellFailed {
                cell,
                status,
                traceback,
            } => match traceback.last() {
                Some(last) => format!("cell {cell} ended {}: {last}", status.as_str()),
                None => format!("cell {cell} ended {}", status.as_str()),
            },
            Stop::RunnerFailed { cell, message } => format!("cell {cell} could not run: {message}"),
            Stop::JournalFailed { cell, message } => {
                format!("cell {cell} ran but was not journaled: {message}")
            }
            Stop::NotebookFailed { cell, message } => format!("cell {cell}: {message}"),
        }
    }

    /// The exit code a CLI gives for this stop: 130 interrupted, the
    /// cell's status code for a failed cell, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Stop::Interrupted { .. } => 130,
            Stop::CellFailed { status, .. } => u8::try_from(status.exit_code()).unwrap_or(1),
            _ => 1,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Code cells in the notebook.
    pub total: usize,
    /// Cells that ran (and have outputs).
    pub ran: usize,
    /// Figure files saved under [`RunOptions::files_dir`].
    pub figures: usize,
    /// Why the run stopped early (`None`: every cell ran).
    pub stop: Option<Stop>,
}

impl RunSummary {
    /// 0, or the stop's [`Stop::exit_code`].
    pub fn exit_code(&self) -> u8 {
        self.stop.as_ref().map_or(0, Stop::exit_code)
    }
}

/// Runs `nb`'s code cells in order through `runner`, replacing their
/// outputs, execution counts and `metadata.execution` timestamps (see
/// [`ExecutionTiming`]), and recording the kernel and sandbox in the
/// notebook's metadata. Blank cells are skipped (and keep their metadata,
/// as under nbclient). Stops at the first failed cell unless
/// [`RunOptions::allow_errors`] or the cell is tagged `raises-exception`
/// (nbclient's rule).
pub async fn execute_notebook<R: CellRunner, O: Observer>(
    nb: &mut Notebook,
    runner: &mut R,
    opts: &RunOptions,
    observer: &mut O,
) -> RunSummary {
    nb.clear_outputs();
    let cells = nb.code_cells();
    let mut summary = RunSummary {
        total: cells.len(),
        ..RunSummary::default()
    };
    let total = cells.len();
    let stopped = || opts.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst));
    let mut kernel_info_set = false;
    for (i, cell) in cells.iter().enumerate() {
        let n = i + 1;
        if cell.source.trim().is_empty() {
            continue;
        }
        if stopped() {
            summary.stop = Some(Stop::Interrupted {
                cell: n,
                before: true,
            });
            break;
        }
        observer.cell_started(n, total);
        let t0 = Instant::now();
        let submitted = SystemTime::now();
        let run = match runner.run(&cell.source).await {
            Ok(r) => r,
            Err(message) => {
                summary.stop = Some(Stop::RunnerFailed { cell: n, message });
                break;
            }
        };
        let r = &run.result;
        if !kernel_info_set && let Some((version, python)) = runner.kernel_info() {
            nb.set_kernel_info(&version, &python);
            nb.set_sandbox(serde_json::to_value(&r.kernel.sandbox).unwrap_or_default());
            kernel_info_set = true;
        }
        let outputs = to_outputs(
            r,
            opts.files_dir.as_deref(),
            n,
            &mut summary.figures,
            opts.timeout,
            observer,
        );
        let count = (r.execution_count > 0).then_some(r.execution_count);
        nb.set_execution_timing(cell.index, &timing_of(r, submitted));
        if let Err(e) = nb.set_outputs(cell.index, count, merge_streams(outputs)) {
            summary.stop = Some(Stop::NotebookFailed {
                cell: n,
                message: e.to_string(),
            });
            break;
        }
        summary.ran += 1;
        observer.cell_done(n, total, r, t0.elapsed());
        if let Some(message) = run.journal_error {
            summary.stop = Some(Stop::JournalFailed { cell: n, message });
            break;
        }
        if stopped() {
            summary.stop = Some(Stop::Interrupted {
                cell: n,
                before: false,
            });
            break;
        }
        // nbclient's rule: a cell tagged `raises-exception` may fail.
        if r.status != CellStatus::Ok
            && !opts.allow_errors
            && !nb.cell_has_tag(cell.index, "raises-exception")
        {
            summary.stop = Some(Stop::CellFailed {
                cell: n,
                status: r.status,
                traceback: r.error.as_ref().map(|e| e.traceback.clone()).unwrap_or_default(),
            });
            break;
        }
    }
    summary
}

/// When the cell ran: it started `duration_ms` before it settled (its
/// queueing, `queued_ms`, is not part of its run), never before it was
/// submitted; a result without a settle stamp settled now.
fn timing_of(r: &CellResult, submitted: SystemTime) -> ExecutionTiming {
    let settled = r.settled_at.unwrap_or_else(SystemTime::now).max(submitted);
    let started = settled
        .checked_sub(Duration::from_millis(r.duration_ms))
        .unwrap_or(submitted)
        .max(submitted);
    ExecutionTiming { started, settled }
}

/// Jupyter outputs for one result; images are read back from the session
/// directory, embedded as base64, and copied to `files_dir` when given.
pub fn to_outputs(
    r: &CellResult,
    files_dir: Option<&Path>,
    cell_no: usize,
    figures: &mut usize,
    timeout: Option<Duration>,
    observer: &mut impl Observer,
) -> Vec<Output> {
    let mut out = Vec::new();
    if r.kernel.state_reset {
        // The notebook must say that the namespace is new (an earlier cell
        // crashed or was killed), not just restart the execution counts.
        out.push(Output::Stream {
            name: "stderr".into(),
            text: format!(
                "cellhost: state reset: {} (a fresh kernel, generation {}); earlier cells' variables are gone\n",
                r.kernel.reset_reason.as_deref().unwrap_or("new kernel"),
                r.kernel.generation
            ),
        });
    }
    // Output of earlier cells' threads or children stays apart from this
    // cell's streams: a display marked as background, never a stream that
    // Jupyter would merge into the cell's own text.
    if let Some(bg) = &r.background_output {
        for (name, text) in [("stdout", &bg.stdout), ("stderr", &bg.stderr)] {
            if text.is_empty() {
                continue;
            }
            let mut data = Map::new();
            data.insert(
                "text/plain".into(),
                Value::String(format!(
                    "[background {name} from earlier cells' threads or children]\n{text}"
                )),
            );
            let mut metadata = Map::new();
            metadata.insert("cellhost".into(), serde_json::json!({ "background": name }));
            out.push(Output::DisplayData { data, metadata });
        }
    }
    if !r.stdout.is_empty() {
        out.push(Output::Stream {
            name: "stdout".into(),
            text: r.stdout.clone(),
        });
    }
    if !r.stderr.is_empty() {
        out.push(Output::Stream {
            name: "stderr".into(),
            text: r.stderr.clone(),
        });
    }
    // The result goes where it was shown: before the displays flushed at
    // the cell's end (`result_index`, as with Jupyter's inline backend),
    // else after every display.
    let result_at = r.result_index.unwrap_or(r.displays.len()).min(r.displays.len());
    let mut result = r.result.as_ref().map(|res| {
        let data = embed(
            res,
            files_dir,
            &format!("cell{cell_no}-result"),
            figures,
            observer,
        );
        Output::ExecuteResult {
            execution_count: r.execution_count,
            data,
            metadata: Map::new(),
        }
    });
    for (n, d) in r.displays.iter().enumerate() {
        if n == result_at
            && let Some(res) = result.take()
        {
            out.push(res);
        }
        let data = embed(
            &d.data,
            files_dir,
            &format!("cell{cell_no}-{}", n + 1),
            figures,
            observer,
        );
        out.push(Output::DisplayData {
            data,
            metadata: d.metadata.clone(),
        });
    }
    if let Some(res) = result {
        out.push(res);
    }
    if matches!(r.status, CellStatus::Timeout | CellStatus::Interrupted) {
        // Say why the cell stopped (not just the KeyboardInterrupt the
        // interrupt raised), and keep the Python traceback: it shows where.
        out.push(Output::Error {
            ename: if r.status == CellStatus::Timeout {
                "CellTimeout"
            } else {
                "CellInterrupted"
            }
            .to_string(),
            evalue: stop_message(r, timeout),
            traceback: r
                .error
                .as_ref()
                .map(|e| e.traceback.clone())
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| vec![stop_message(r, timeout)]),
        });
    } else if let Some(e) = &r.error {
        out.push(Output::Error {
            ename: e.ename.clone(),
            evalue: e.evalue.clone(),
            traceback: e.traceback.clone(),
        });
    } else if r.status != CellStatus::Ok {
        let (ename, evalue) = match &r.crash {
            Some(c) => ("KernelCrashed".to_string(), c.message.clone()),
            None => ("CellFailed".to_string(), r.status.as_str().to_string()),
        };
        // Viewers show the traceback, not ename/evalue: never leave it empty.
        let traceback = vec![format!("{ename}: {evalue}")];
        out.push(Output::Error {
            ename,
            evalue,
            traceback,
        });
    }
    out
}

/// Why a timed-out or interrupted cell stopped, and what became of the
/// kernel's state.
pub fn stop_message(r: &CellResult, timeout: Option<Duration>) -> String {
    let what = match (r.status, timeout) {
        (CellStatus::Timeout, Some(t)) => {
            format!("the cell exceeded its {} s timeout", t.as_secs_f64())
        }
        (CellStatus::Timeout, None) => "the cell timed out".to_string(),
        _ => "the cell was interrupted".to_string(),
    };
    match &r.interrupt {
        Some(i) if i.escalated => match &i.reason {
            Some(reason) => format!("{what}: {reason}; the session's state is gone"),
            None => format!("{what}; the kernel was killed and the session's state is gone"),
        },
        Some(i) if i.state_kept => format!("{what}; the code stopped and the session's state is kept"),
        Some(i) => format!(
            "{what}; {}",
            i.reason.as_deref().unwrap_or("the interrupt was not delivered")
        ),
        None => what,
    }
}

fn embed(
    bundle: &Map<String, Value>,
    files_dir: Option<&Path>,
    stem: &str,
    figures: &mut usize,
    observer: &mut impl Observer,
) -> Map<String, Value> {
    let mut data = Map::new();
    for (mime, v) in bundle {
        if let Some(path) = v
            .get("path")
            .and_then(Value::as_str)
            .filter(|_| cellhost_kernel::is_saved_file_mime(mime))
        {
            // The figure is in the session directory and its copy goes
            // beside the notebook, maybe the kernel's workdir: links the
            // kernel planted in either are never followed.
            let read = cellhost_kernel::hostfs::open_verified(Path::new(path)).and_then(|mut f| {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut b).map(|_| b)
            });
            match read {
                Ok(bytes) => {
                    let ext = Path::new(path)
                        .extension()
                        .and_then(|e| e.to_str())
                        .unwrap_or("bin");
                    if let Some((parent, dir_name)) =
                        files_dir.and_then(|d| Some((d.parent()?, d.file_name()?)))
                    {
                        let rel = Path::new(dir_name).join(format!("{stem}.{ext}"));
                        let parent = if parent.as_os_str().is_empty() {
                            Path::new(".")
                        } else {
                            parent
                        };
                        match cellhost_kernel::hostfs::create_beneath(parent, &rel)
                            .and_then(|(mut f, _)| std::io::Write::write_all(&mut f, &bytes))
                        {
                            Ok(()) => *figures += 1,
                            Err(e) => {
                                observer.note(&format!("cannot write {}: {e}", parent.join(&rel).display()))
                            }
                        }
                    }
                    data.insert(
                        mime.clone(),
                        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
                    );
                }
                Err(e) => observer.note(&format!("cannot read {path}: {e}")),
            }
        } else if !v.is_object() || mime == "application/json" {
            data.insert(mime.clone(), v.clone());
        }
    }
    data
}
