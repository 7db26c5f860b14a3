//! The driver's state: the commands a handle sends, the running cell, the
//! interrupt in progress, output of no cell. Every other driver module
//! works on these types; this one uses none of them.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellhost_capture::StreamCapture;
use cellhost_protocol::WorkerFrame;
use cellhost_protocol::frame::SigintHandler;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::cell::{CellProgress, ExecOptions, InterruptOutcome, KernelInfo, Variables};
use crate::config::KernelConfig;
use crate::error::KernelError;
use crate::link::WorkerLink;
use crate::marker::MarkerScanner;
use crate::outputs;
use crate::result::{BackgroundOutput, CellResult, DisplayOutput};
use crate::seal;
use crate::tools::ToolCallRecord;

/// How long after a `response` the end markers may take before the cell
/// settles without them (they are written before the response, so this only
/// matters if a pipe is wedged).
pub(super) const MARKER_WAIT: Duration = Duration::from_secs(2);
/// How long to keep reading the output streams after the worker died.
pub(super) const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(300);
/// How long the link's supervisor may take to kill and reap the tree
/// before the driver asks the link to force it.
pub(super) const KILL_GRACE: Duration = Duration::from_millis(1000);
/// How long to wait for the reader thread's answer to an escalation probe.
pub(super) const PROBE_WAIT: Duration = Duration::from_millis(300);
/// Bytes of a `background` frame redacted before the cap cuts it: the room
/// left plus this much, so that a secret across the cut is still masked.
pub(super) const BACKGROUND_SLACK: usize = 64 * 1024;
/// Live text kept for `peek`, per stream.
pub(super) const PEEK_TAIL: usize = 64 * 1024;

/// State visible to handles without asking the driver.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub running: Option<String>,
    pub queued: usize,
    pub exit: Option<String>,
    pub cells_settled: u64,
}

/// A cell waiting for its turn.
pub(crate) struct QueuedCell {
    pub id: String,
    pub code: String,
    pub options: ExecOptions,
    pub submitted: Instant,
    pub reply: oneshot::Sender<Result<CellResult, KernelError>>,
}

/// What a kernel handle asks of its driver.
pub(crate) enum Command {
    Execute(Box<QueuedCell>),
    Interrupt {
        cell: Option<String>,
        reply: oneshot::Sender<InterruptOutcome>,
    },
    Inspect {
        limit: u32,
        reply: oneshot::Sender<Result<Variables, KernelError>>,
    },
    Peek {
        cell: String,
        reply: oneshot::Sender<Option<CellProgress>>,
    },
    Kill {
        reply: oneshot::Sender<()>,
    },
}

/// Who interrupted a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    User,
    Timeout,
}

/// An interrupt in progress.
pub(super) struct Interrupt {
    pub(super) cause: Cause,
    pub(super) delivered: bool,
    /// The wake-up was sent (or tried): false for an interrupt that came
    /// before the cell's `started`, until the driver sends it on `started`.
    pub(super) signalled: bool,
    pub(super) target: String,
    pub(super) not_delivered: Option<String>,
    pub(super) escalate_at: Instant,
    pub(super) probe_until: Option<Instant>,
    pub(super) handler: Option<SigintHandler>,
    pub(super) raised: u64,
    pub(super) escalation: Option<String>,
}

/// The running cell.
pub(super) struct ActiveCell {
    pub(super) q: QueuedCell,
    /// Per stream, until the cell's start marker: bytes before it are
    /// earlier cells' (background), never this cell's.
    pub(super) start_scan: [MarkerScanner; 2],
    pub(super) start_seen: [bool; 2],
    pub(super) scan: [MarkerScanner; 2],
    pub(super) marker_seen: [bool; 2],
    pub(super) capture: [Option<StreamCapture>; 2],
    pub(super) peek: [String; 2],
    pub(super) response: Option<WorkerFrame>,
    pub(super) response_at: Option<Instant>,
    /// The worker sent `started`: an interrupt's wake-up is now meant for
    /// this cell.
    pub(super) started_code: bool,
    pub(super) displays: Vec<DisplayOutput>,
    /// What this cell's displays (and result bundle) may still take.
    pub(super) budget: outputs::DisplayBudget,
    pub(super) started: Instant,
    pub(super) deadline: Option<Instant>,
    pub(super) interrupt: Option<Interrupt>,
    pub(super) background: BackgroundOutput,
    pub(super) dir: PathBuf,
    /// Host calls answered (or refused) for this cell.
    pub(super) tool_calls: Vec<ToolCallRecord>,
    /// Host calls this cell made (counted against the budget).
    pub(super) tool_count: u32,
    /// The tree's process-limit hits when the cell started.
    pub(super) pid_hits_at_start: u64,
    /// The tree's OOM kills when the cell started.
    pub(super) oom_kills_at_start: u64,
    /// Set when the host killed the tree after the cell's code ended.
    pub(super) tree_killed: Option<String>,
}

/// Bounded text kept for the next result.
#[derive(Default)]
pub(super) struct Background {
    pub(super) text: [String; 2],
    pub(super) dropped: u64,
}

impl Background {
    pub(super) fn push(&mut self, stream: usize, text: &str) {
        seal::push_capped(&mut self.text[stream], &mut self.dropped, text);
    }

    pub(super) fn take(&mut self) -> BackgroundOutput {
        let [stdout, stderr] = std::mem::take(&mut self.text);
        BackgroundOutput {
            stdout,
            stderr,
            dropped_bytes: std::mem::take(&mut self.dropped),
        }
    }
}

/// Where the answer to an `inspect_variables` goes.
pub(super) type VariablesReply = oneshot::Sender<Result<Variables, KernelError>>;

/// A host call whose tool has answered.
pub(super) struct ToolDone {
    pub(super) id: String,
    pub(super) cell: String,
    pub(super) name: String,
    pub(super) args_preview: String,
    pub(super) started: Instant,
    pub(super) answer: Result<Value, String>,
}

/// The task that owns one kernel: its link, its queue, its running cell.
pub(crate) struct Driver<L: WorkerLink> {
    pub(super) config: KernelConfig,
    pub(super) info: KernelInfo,
    pub(super) label: String,
    pub(super) link: L,
    /// Per stream: the link still delivers it.
    pub(super) out_open: [bool; 2],
    pub(super) cmd_rx: mpsc::UnboundedReceiver<Command>,
    pub(super) cmds_open: bool,
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) queue: VecDeque<QueuedCell>,
    pub(super) active: Option<ActiveCell>,
    pub(super) background: Background,
    /// Background bytes not yet decoded (raw, between cells).
    pub(super) raw_background: [Vec<u8>; 2],
    /// The pending `inspect_variables`: request id, limit, reply.
    pub(super) inspect: Option<(String, u32, VariablesReply)>,
    pub(super) exit: Option<ExitStatus>,
    pub(super) drain_until: Option<Instant>,
    pub(super) kill_requested: Option<Instant>,
    pub(super) kill_waiters: Vec<oneshot::Sender<()>>,
    pub(super) protocol_error: Option<String>,
    pub(super) cells_settled: u64,
    pub(super) seq: u64,
    pub(super) dead: bool,
    /// Why the host killed the kernel, when it did so on its own.
    pub(super) kill_reason: Option<String>,
    /// The worker's execution_count after the last answered cell.
    pub(super) execution_count: u64,
    /// Finished host calls, from their tasks back to the driver.
    pub(super) tool_done_tx: mpsc::UnboundedSender<ToolDone>,
    pub(super) tool_done_rx: mpsc::UnboundedReceiver<ToolDone>,
}

impl<L: WorkerLink> Driver<L> {
    /// A driver for `link`, whose worker said `ready`; `early` holds the
    /// bytes each stream carried before (output of no cell).
    pub(crate) fn new(
        config: KernelConfig,
        link: L,
        cmd_rx: mpsc::UnboundedReceiver<Command>,
        shared: Arc<Mutex<Shared>>,
        info: KernelInfo,
        early: [Vec<u8>; 2],
    ) -> Self {
        let label = config.label();
        let (tool_done_tx, tool_done_rx) = mpsc::unbounded_channel();
        Driver {
            config,
            info,
            label,
            link,
            out_open: [true, true],
            cmd_rx,
            cmds_open: true,
            shared,
            queue: VecDeque::new(),
            active: None,
            background: Background::default(),
            raw_background: early,
            inspect: None,
            exit: None,
            drain_until: None,
            kill_requested: None,
            kill_waiters: Vec::new(),
            protocol_error: None,
            cells_settled: 0,
            seq: 0,
            dead: false,
            kill_reason: None,
            execution_count: 0,
            tool_done_tx,
            tool_done_rx,
        }
    }

    pub(super) fn set_shared(&self, f: impl FnOnce(&mut Shared)) {
        if let Ok(mut s) = self.shared.lock() {
            f(&mut s);
        }
    }
}
