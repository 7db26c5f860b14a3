//! Frame types of protocol v1. Field names are the wire names.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A MIME bundle: MIME type → data (a string, or JSON for `application/json`).
pub type MimeBundle = Map<String, Value>;

/// Options the host passes with a cell.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecuteOptions {
    /// Do not bump `execution_count` nor record `_` (Jupyter's `silent`).
    #[serde(default)]
    pub silent: bool,
    /// Directory where the worker may place files (figures are sent as
    /// frames; this is only informative for user code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_dir: Option<String>,
    /// The host reads the worker's output rings: large writes may go
    /// through them (announced in the pipe by a token carrying the cell's
    /// marker nonce, see [`RingOffer`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rings: bool,
}

/// An output ring the worker offers in `ready`: a memfd of
/// [`RING_HEADER`] + `size` bytes and an eventfd, both open in the worker
/// under the given descriptor numbers (the host takes copies with
/// `pidfd_getfd`).
///
/// The worker copies a large write (64 KiB or more) into the data area at
/// `write_pos % size` (wrapping) and then writes the token
/// `\x01cellhost-ring-<marker nonce>:<write_pos>:<len>\x01` to the stream's
/// pipe, in order with everything else written there. The host, on reading
/// the token, takes `len` bytes from the ring as if they had come through
/// the pipe, stores its new read position as a little-endian `u64` at byte
/// 8 of the header, and adds 1 to the eventfd. The worker never has more
/// than `size` bytes unread, and waits on the eventfd for room.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingOffer {
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The worker's descriptor of the memfd.
    pub memfd: i32,
    /// The worker's descriptor of the eventfd.
    pub eventfd: i32,
    /// Bytes in the data area.
    pub size: u64,
}

/// Bytes before a ring's data area (one page; the read position is at 8).
pub const RING_HEADER: u64 = 4096;

/// Frames the host sends to a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostFrame {
    /// Run `code` as cell `id`; write `marker` to fd 1 and fd 2 when done.
    Execute {
        /// Cell id, unique within the kernel.
        id: String,
        /// Source code of the cell.
        code: String,
        /// End marker token for this cell (fresh random hex per cell).
        marker: String,
        /// Options.
        #[serde(default)]
        options: ExecuteOptions,
    },
    /// Interrupt cell `id`. The frame is the authority; the SIGINT the host
    /// sends to the worker's main thread (`signalled`) only wakes code that
    /// sleeps or blocks. A cell whose `started` frame the host had not seen
    /// gets the frame alone: the worker cancels it before its code runs, or
    /// signals its own main thread if the code just started.
    Interrupt {
        /// Cell id the interrupt is meant for.
        id: String,
        /// The host sent SIGINT to the main thread before this frame.
        #[serde(default)]
        signalled: bool,
    },
    /// List the user namespace (idle kernels only).
    InspectVariables {
        /// Request id.
        id: String,
        /// Maximum number of variables, 1..=500.
        limit: u32,
    },
    /// Answer to a [`WorkerFrame::HostCall`].
    HostResponse {
        /// Id of the host call.
        id: String,
        /// Result of the call, when it succeeded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Value>,
        /// Error message, when it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Exit cleanly.
    Shutdown {},
}

/// How a worker's SIGINT handling stood when an interrupt arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SigintHandler {
    /// The worker's own handler (raises KeyboardInterrupt in the cell).
    Worker,
    /// User code set `SIG_IGN`.
    Ignored,
    /// User code installed its own handler.
    User,
    /// User code restored `SIG_DFL` (the process would die).
    Default,
}

/// Files a cell opened for reading and writing, as seen by Python's `open`
/// audit event (absolute paths, each at most once, at most 256 in all).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesOpened {
    /// Paths opened for reading.
    #[serde(default)]
    pub read: Vec<String>,
    /// Paths opened for writing (or appending, creating, updating).
    #[serde(default)]
    pub write: Vec<String>,
    /// More paths were opened than were kept.
    #[serde(default)]
    pub truncated: bool,
}

/// Frames a worker sends to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerFrame {
    /// First frame: the worker is ready for cells.
    Ready {
        /// Worker pid as the worker sees it (its own pid namespace).
        pid: u32,
        /// `sys.version` of the interpreter.
        python: String,
        /// `sys.executable`.
        #[serde(default)]
        executable: String,
        /// Protocol version the worker speaks.
        protocol: u32,
        /// Shared-memory rings the worker offers for large writes to its
        /// stdout and stderr (none: every byte goes through the pipes).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rings: Vec<RingOffer>,
    },
    /// A MIME bundle shown during cell `id`.
    Display {
        /// Cell id.
        id: String,
        /// The bundle.
        data: MimeBundle,
        /// Jupyter display metadata.
        #[serde(default)]
        metadata: Map<String, Value>,
    },
    /// A cell (or one of its threads) calls a host tool.
    HostCall {
        /// Call id (answered by a [`HostFrame::HostResponse`] with the same id).
        id: String,
        /// Cell whose authority the call claims.
        cell: String,
        /// Tool name.
        method: String,
        /// Arguments.
        #[serde(default)]
        args: Value,
    },
    /// Answer to [`HostFrame::InspectVariables`].
    Variables {
        /// Request id.
        id: String,
        /// One object per variable.
        variables: Vec<Value>,
        /// More variables existed than `limit`.
        truncated: bool,
    },
    /// Output written through `sys.stdout`/`sys.stderr` by a thread that an
    /// earlier, settled cell started. Kept apart from the running cell.
    Background {
        /// `stdout` or `stderr`.
        stream: String,
        /// The text.
        text: String,
    },
    /// The reader thread's view of an interrupt frame.
    InterruptAck {
        /// Cell id from the interrupt frame.
        id: String,
        /// The cell's code was running when the frame arrived.
        running: bool,
        /// SIGINT handling at that moment.
        handler: SigintHandler,
        /// KeyboardInterrupts the worker has raised in this cell so far.
        #[serde(default)]
        raised: u64,
    },
    /// The worker took cell `id` and is about to run its code (from now on
    /// a SIGINT to the main thread is meant for this cell).
    Started {
        /// Cell id.
        id: String,
    },
    /// The worker raised KeyboardInterrupt in cell `id`.
    InterruptRaised {
        /// Cell id.
        id: String,
    },
    /// The cell is done; the end markers follow on fd 1 and fd 2.
    Response {
        /// Cell id.
        id: String,
        /// `ok`, `error` or `interrupted`.
        status: String,
        /// Jupyter's execution_count after this cell.
        execution_count: u64,
        /// MIME bundle of the last expression.
        #[serde(default)]
        result: Option<MimeBundle>,
        /// `{ename, evalue, traceback}`.
        #[serde(default)]
        error: Option<Value>,
        /// `{cpu_s, peak_rss_kb}` of the worker.
        #[serde(default)]
        usage: Option<Value>,
        /// Working directory after the cell (null if it was deleted).
        #[serde(default)]
        cwd: Option<String>,
        /// SIGINT handling after the cell (re-armed before the next one).
        #[serde(default)]
        sigint_handler: Option<SigintHandler>,
        /// Files the cell opened, as seen by Python's `open` audit event.
        #[serde(default)]
        files: Option<FilesOpened>,
        /// Displays the worker had sent when it rendered `result` (the
        /// result goes before the ones after it: figures flushed at the
        /// cell's end come after the result, as in Jupyter).
        #[serde(default)]
        result_at: Option<u32>,
    },
    /// Diagnostic message from the worker itself.
    Log {
        /// Text.
        msg: String,
    },
    /// Sent by the kernel init (not Python) before `ready` when a sandbox
    /// profile is active: which confinement layers it applied.
    Sandbox {
        /// `auto` or `enforce`.
        mode: String,
        /// One entry per layer, in the order applied.
        layers: Vec<SandboxLayer>,
    },
}

/// One confinement layer as the kernel init reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxLayer {
    /// `rlimits`, `userns`, `pidns`, `netns`, `ipcns`, `utsns`, `mountns`,
    /// `landlock`, `seccomp`, `cgroup`, ...
    pub name: String,
    /// The layer is in force for the worker.
    pub enforced: bool,
    /// What was applied, or why not.
    #[serde(default)]
    pub detail: String,
    /// Not required by mode `enforce` (not applicable here, or turned off
    /// by the profile).
    #[serde(default)]
    pub optional: bool,
}

impl WorkerFrame {
    /// The frame's `type` tag, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkerFrame::Ready { .. } => "ready",
            WorkerFrame::Display { .. } => "display",
            WorkerFrame::HostCall { .. } => "host_call",
            WorkerFrame::Variables { .. } => "variables",
            WorkerFrame::Background { .. } => "background",
            WorkerFrame::InterruptAck { .. } => "interrupt_ack",
            WorkerFrame::Started { .. } => "started",
            WorkerFrame::InterruptRaised { .. } => "interrupt_raised",
            WorkerFrame::Response { .. } => "response",
            WorkerFrame::Log { .. } => "log",
            WorkerFrame::Sandbox { .. } => "sandbox",
        }
    }
}
