//! The result of one cell as a caller sees it ([`CellResult`]), and its parts.
//!
//! Field names follow Jupyter's messaging spec where Jupyter has one
//! (`execution_count`, `execute_result` → `result`, `display_data` →
//! `displays`, `stream` → `stdout`/`stderr`, `error {ename, evalue,
//! traceback}`); the shape is DESIGN.md's "The result an agent sees".

use std::collections::BTreeMap;

pub use cellhost_protocol::frame::FilesOpened;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A MIME bundle. Text types (`text/plain`, `text/html`, `text/markdown`,
/// `image/svg+xml`, `application/json`) hold their data inline; binary types
/// (`image/png`, `image/jpeg`) hold `{"path": "...", "bytes": N}` pointing to
/// the file the host saved in the session's directory.
pub type MimeBundle = Map<String, Value>;

/// How a cell ended.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    /// The code ran to its end.
    Ok,
    /// The code raised (including `SystemExit`), or could not start.
    Error,
    /// The cell passed its deadline and was stopped.
    Timeout,
    /// A caller interrupted the cell.
    Interrupted,
    /// The worker process died during the cell.
    Crashed,
}

impl CellStatus {
    /// Exit code of `cellhost exec` for this status (CLI contract):
    /// 0 ok, 1 error, 124 timeout, 130 interrupted, 137 crashed.
    pub fn exit_code(self) -> i32 {
        match self {
            CellStatus::Ok => 0,
            CellStatus::Error => 1,
            CellStatus::Timeout => 124,
            CellStatus::Interrupted => 130,
            CellStatus::Crashed => 137,
        }
    }

    /// The wire name (`ok`, `error`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            CellStatus::Ok => "ok",
            CellStatus::Error => "error",
            CellStatus::Timeout => "timeout",
            CellStatus::Interrupted => "interrupted",
            CellStatus::Crashed => "crashed",
        }
    }
}

/// An exception raised by a cell.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellError {
    /// Exception class name, e.g. `ZeroDivisionError`.
    pub ename: String,
    /// `str()` of the exception (redacted).
    pub evalue: String,
    /// Formatted traceback lines, worker frames removed, repeats collapsed.
    pub traceback: Vec<String>,
}

/// A display (Jupyter `display_data`) shown during the cell.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DisplayOutput {
    /// The bundle (binary types replaced by file references, see [`MimeBundle`]).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: MimeBundle,
    /// Jupyter display metadata.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub metadata: Map<String, Value>,
}

/// Displays the host did not keep for a cell (see
/// [`DisplayLimits`](crate::config::DisplayLimits)); a `text/plain` note
/// among the displays says the same.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisplaysDropped {
    /// Displays dropped because the cell's count or byte budget was spent
    /// (the last expression's bundle included).
    pub count: u64,
    /// Bytes of the dropped displays' data (base64 text for binary data).
    pub bytes: u64,
    /// Displays withheld because their data contained a registered secret
    /// (each replaced by a note; not counted in `count`).
    #[serde(default)]
    pub withheld: u64,
}

impl DisplaysDropped {
    /// Nothing was dropped or withheld.
    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.withheld == 0
    }
}

/// How one stream was cut to its inline size (the capture crate's record,
/// which also says why a spill file is missing or short).
pub use cellhost_capture::Truncation;

/// Which kernel ran the cell.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRef {
    /// Session name.
    pub session: String,
    /// Kernel generation within the session (1 for the first kernel).
    pub generation: u64,
    /// Host-side pid of the worker.
    pub pid: u32,
    /// The kernel had run earlier cells of this session.
    pub reused: bool,
    /// The session's namespace was lost before this cell (a new kernel).
    pub state_reset: bool,
    /// Why the state was reset, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_reason: Option<String>,
    /// The sandbox the kernel runs under, as applied.
    #[serde(default)]
    pub sandbox: SandboxRef,
    /// Where a remote kernel ran (placement, node, job); absent for a
    /// local kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::cell::KernelPlacement>,
}

/// The sandbox a kernel runs under, as applied (the full layer list is in
/// the kernel's info).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRef {
    /// The mode applied: `off`, `auto` or `enforce` — the mode asked for
    /// (a kernel that cannot have it is refused, never started weaker).
    pub mode: cellhost_sandbox::profile::SandboxMode,
    /// Layers not in force (mode `auto` applies what the machine supports).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// Why each layer of `missing` is not in force, by layer name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reasons: BTreeMap<String, String>,
    /// Layers in force, in the order applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub enforced: Vec<String>,
}

impl SandboxRef {
    /// The summary of a kernel's sandbox status.
    pub fn of(status: &cellhost_sandbox::profile::SandboxStatus) -> Self {
        SandboxRef {
            mode: status.mode,
            missing: status.missing().map(|l| l.name.clone()).collect(),
            reasons: status
                .missing()
                .map(|l| (l.name.clone(), l.detail.clone()))
                .collect(),
            enforced: status
                .layers
                .iter()
                .filter(|l| l.enforced)
                .map(|l| l.name.clone())
                .collect(),
        }
    }

    /// One line naming the layers not in force and why
    /// (`sandbox auto: not in force here: cgroup (…)`), or `None` when
    /// every required layer is.
    pub fn degradation(&self) -> Option<String> {
        if self.missing.is_empty() {
            return None;
        }
        let parts: Vec<String> = self
            .missing
            .iter()
            .map(|m| match self.reasons.get(m) {
                Some(why) => format!("{m} ({why})"),
                None => m.clone(),
            })
            .collect();
        Some(format!(
            "sandbox {}: not in force here: {}",
            self.mode,
            parts.join("; ")
        ))
    }
}

/// What happened when a cell was interrupted or timed out.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptReport {
    /// SIGINT reached the worker's main thread.
    pub delivered: bool,
    /// Thread the signal was sent to (`pid/tid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The cell did not settle within the grace and the kernel was killed.
    pub escalated: bool,
    /// The namespace survived.
    pub state_kept: bool,
    /// Why the interrupt did not stop the code in time, or was not delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// [`CrashReport::reason`] of a cell whose worker died before it took the
/// cell (no `started` frame): none of the cell's code ran, so the session
/// layer may run it on a new generation.
pub const CRASH_NOT_STARTED: &str = "not started";

/// How the worker process died (status `crashed`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashReport {
    /// Exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal number, when a signal killed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Signal name, e.g. `SIGSEGV`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_name: Option<String>,
    /// One line for a reader: what died and the likely cause.
    pub message: String,
    /// A short stable cause when the worker's own exit status is not the
    /// story: `connection lost` (a remote kernel whose node agent's
    /// connection broke), [`CRASH_NOT_STARTED`] (the worker died before it
    /// took the cell: none of its code ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Resources used by the worker.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// CPU seconds (user + system) the cell used.
    #[serde(default)]
    pub cpu_s: f64,
    /// Peak resident set of the worker so far, in KiB.
    #[serde(default)]
    pub peak_rss_kb: u64,
}

/// Output that earlier cells' threads or children wrote after those cells
/// settled, delivered with the next result and never mixed into its streams.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackgroundOutput {
    /// Text on stdout.
    pub stdout: String,
    /// Text on stderr.
    pub stderr: String,
    /// Bytes dropped because the background buffer was full.
    #[serde(default)]
    pub dropped_bytes: u64,
}

impl BackgroundOutput {
    /// Nothing was captured.
    pub fn is_empty(&self) -> bool {
        self.stdout.is_empty() && self.stderr.is_empty() && self.dropped_bytes == 0
    }
}

/// The result of one cell.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    /// Cell id (unique within the host process).
    pub cell_id: String,
    /// How the cell ended.
    pub status: CellStatus,
    /// Jupyter's execution_count of this cell (0 if it never started).
    pub execution_count: u64,
    /// Rendered, redacted, bounded stdout.
    pub stdout: String,
    /// Rendered, redacted, bounded stderr.
    pub stderr: String,
    /// The last expression's value (Jupyter `execute_result`).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub result: Option<MimeBundle>,
    /// Displays shown during the cell, in order.
    pub displays: Vec<DisplayOutput>,
    /// Where `result` stands among `displays`: it was shown before
    /// `displays[result_index]` (figures flushed at the cell's end come
    /// after the result, as with Jupyter's inline backend). Absent when
    /// there is no result or it came after every display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_index: Option<usize>,
    /// Displays the host dropped (over the cell's budget) or withheld (a
    /// registered secret in binary data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub displays_dropped: Option<DisplaysDropped>,
    /// The exception, for status `error` (and `interrupted`/`timeout` when
    /// the worker reported KeyboardInterrupt).
    pub error: Option<CellError>,
    /// Streams that were cut, by name (`stdout`, `stderr`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub truncated: BTreeMap<String, Truncation>,
    /// The kernel that ran it.
    pub kernel: KernelRef,
    /// Set when the cell was interrupted or timed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt: Option<InterruptReport>,
    /// Set for status `crashed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash: Option<CrashReport>,
    /// The resource limit the cell ran into, when it hit one (`oom`,
    /// `pids`, `disk`, `timeout`, `seccomp`; see [`crate::fault`]): the
    /// status says how the cell ended, this says which limit ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<crate::fault::Fault>,
    /// Wall time of the cell's own run, from the moment it started running
    /// to its settlement, in milliseconds (a queued cell's wait is not in
    /// it: see `queued_ms`).
    pub duration_ms: u64,
    /// Milliseconds the cell waited behind earlier cells of its kernel
    /// before it started running (absent when it did not wait).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub queued_ms: u64,
    /// When the cell settled, by the host's wall clock, stamped by the
    /// kernel's driver before it starts the next cell (so a later cell's
    /// start is never before it). In-process only: the journal's times
    /// come from it; not part of the wire result.
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub settled_at: Option<std::time::SystemTime>,
    /// Worker resource use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Host calls made by the cell, in the order they were answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::tools::ToolCallRecord>,
    /// Output of earlier cells' threads or children that arrived since the
    /// previous result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_output: Option<BackgroundOutput>,
    /// The worker's working directory after the cell (None if deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// One line for a language model on how to proceed after a common failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Files the cell opened for reading and writing (the runtime's `open` audit
    /// events; at most 256 paths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<FilesOpened>,
    /// Egress by allowlist: the connections the session's proxy refused
    /// while the cell ran (or since the previous cell settled); absent
    /// when none were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<cellhost_egress::NetworkReport>,
    /// What a new kernel of the session was given before this cell: an
    /// automatic restore from the session's latest checkpoint after its
    /// kernel was lost, or the resume of a paused session; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<crate::restored::RestoredState>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
