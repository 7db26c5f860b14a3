//! The cell types the driver and the kernel handle share: options of a
//! cell, live events, interrupt outcomes, progress, facts about a kernel.
//! Neither the driver nor the handle owns them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cellhost_sandbox::profile::SandboxStatus;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::result::DisplayOutput;

/// Options of one cell.
#[derive(Debug, Default, Clone)]
pub struct ExecOptions {
    /// Deadline of this cell: `None` uses the kernel's default
    /// ([`KernelConfig::cell_timeout`](crate::KernelConfig::cell_timeout)); `Some(Duration::ZERO)` means none.
    /// The deadline counts from the moment the cell starts running (a queued
    /// cell's wait does not count).
    pub timeout: Option<Duration>,
    /// Jupyter's `silent`: do not bump `execution_count`.
    pub silent: bool,
    /// Fail at once with [`KernelError::KernelBusy`](crate::KernelError::KernelBusy) instead of queueing
    /// behind a running cell.
    pub fail_if_busy: bool,
    /// Receives rendered, redacted output while the cell runs.
    pub live: Option<mpsc::UnboundedSender<LiveEvent>>,
    /// A stop flag shared with whoever may cancel the cell (Ctrl-C of
    /// `cellhost run`): a caller that submits the cell interrupts it as soon
    /// as it is submitted when the flag is already set. Closes the window
    /// between "not stopped yet, submit" and "stopped, interrupt whatever
    /// runs", in which an interrupt would find no cell and be lost. Whoever
    /// sets the flag must set it before it interrupts the running cell.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// A silent cell that sets the worker's `execution_count` (the restore
    /// of a forked session or of a checkpoint): the host takes the count the worker answers
    /// when it is this one, and counts on from it. Otherwise the host
    /// believes only the previous count or one more.
    pub resume_count: Option<u64>,
}

/// Output delivered while a cell runs (same rendering and redaction as the
/// final result).
#[derive(Debug, Clone, PartialEq)]
pub enum LiveEvent {
    /// Text that became final on stdout.
    Stdout(String),
    /// Text that became final on stderr.
    Stderr(String),
    /// A display (figures are already saved as files).
    Display(DisplayOutput),
}

/// What an interrupt request did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptOutcome {
    /// SIGINT reached the worker's main thread.
    pub delivered: bool,
    /// `pid/tid` the signal was sent to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The cell the interrupt applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell: Option<String>,
    /// Why it was not delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The answer of [`Kernel::inspect_variables`](crate::Kernel::inspect_variables).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variables {
    /// One object per variable: `name`, `type`, and where known `len`,
    /// `shape`, `dtype`, `size_bytes`, `preview`.
    pub variables: Vec<Value>,
    /// More variables existed than the limit.
    pub truncated: bool,
}

/// State of a cell seen through [`CellHandle::peek`](crate::CellHandle::peek).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellProgress {
    /// Cell id.
    pub cell_id: String,
    /// `queued`, `running` or `settled`.
    pub state: String,
    /// The last up to 64 KiB of live stdout.
    pub stdout_tail: String,
    /// The last up to 64 KiB of live stderr.
    pub stderr_tail: String,
    /// Milliseconds since the cell started running (0 while queued).
    pub elapsed_ms: u64,
}

/// Facts about a live kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    /// Session name.
    pub session: String,
    /// Generation within the session.
    pub generation: u64,
    /// Host-side pid of the worker (its main thread's tid too).
    pub pid: u32,
    /// Pid of the kernel init that supervises the worker's tree.
    pub init_pid: u32,
    /// Interpreter path.
    pub python: PathBuf,
    /// `sys.version` of the worker.
    pub python_version: String,
    /// The confinement layers in force for this kernel (mode `off`: none).
    pub sandbox: SandboxStatus,
    /// Streams whose large writes come through a shared-memory ring
    /// (`stdout`, `stderr`), not the pipe alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_rings: Vec<String>,
    /// Host pid of the process this kernel was forked from: its template,
    /// or the parent session's worker for a copy-on-write fork
    /// ([`crate::cow`]); `None`: a cold start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<u32>,
    /// Where the kernel runs when a placement started it on another node
    /// (`None`: a local kernel). Pids above are the node's then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<KernelPlacement>,
}

/// Where a remote kernel runs: the placement that started its node agent
/// and what the scheduler and the agent said about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KernelPlacement {
    /// Name of the `[placement.<name>]` table.
    pub name: String,
    /// Placement kind: `loopback`, `slurm`, `kubernetes`, `ssh`.
    pub kind: String,
    /// The node the agent runs on (its host name as the agent reports it).
    pub node: String,
    /// The scheduler's id of the agent: Slurm job id, Pod name, ssh
    /// destination and pid, local pid for `loopback`.
    pub job: String,
    /// How long the kernel took to start, split by phase (absent when
    /// the node agent did not measure its part).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<PlacementStart>,
}

/// The start of a remote kernel, from the request to the kernel's `ready`,
/// split by phase. Milliseconds; the phases add up to `total_ms`.
/// `agent_start_ms` is measured by the agent on its node, the rest on the
/// host (so `queue_wait_ms` also holds the one-way latency of the host's
/// welcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlacementStart {
    /// From the request to the agent's start on the node: the submission
    /// (`sbatch`, the Pod's creation, `ssh`), the scheduler's queue and
    /// the job's launch.
    pub queue_wait_ms: u64,
    /// From the agent's start to its admission by the host: the dial back,
    /// TLS and the credential check.
    pub agent_start_ms: u64,
    /// From the admission to the kernel's `ready`: the worker started in
    /// the node's sandbox and the kernel's own handshake.
    pub handshake_ms: u64,
    /// From the request to the kernel's `ready`.
    pub total_ms: u64,
}

impl PlacementStart {
    /// Adds `d` to the handshake (and the total).
    pub fn add_handshake(&mut self, d: std::time::Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.handshake_ms = self.handshake_ms.saturating_add(ms);
        self.total_ms = self.total_ms.saturating_add(ms);
    }
}

static CELL_SEQ: AtomicU64 = AtomicU64::new(1);

/// A fresh cell id: `c<sequence>-<8 random hex digits>`.
pub(crate) fn new_cell_id() -> String {
    let mut r = [0u8; 4];
    let _ = getrandom::fill(&mut r);
    format!(
        "c{}-{:08x}",
        CELL_SEQ.fetch_add(1, Ordering::Relaxed),
        u32::from_le_bytes(r)
    )
}

/// The directory of the session directory where the host keeps each
/// cell's spill files and figures (`cells/<cell id>/`). It is covered in
/// the kernel's view, so a kernel can neither read nor replace what the
/// host wrote there, nor plant links in it.
pub(crate) const CELLS_DIR: &str = "cells";
