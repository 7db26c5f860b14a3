//! The task that owns one kernel's process, pipes and control channel.
//!
//! Everything about a kernel happens here, in one place and in order: frames,
//! output bytes, the process's exit, caller commands and deadlines. A cell
//! *settles* only when its `response` frame and its end marker on both fd 1
//! and fd 2 have arrived (or the worker died), so no late byte of a cell
//! leaks into the next one.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellhost_capture::{StreamCapture, StreamLimits};

use crate::init_proc::InitProc;
use cellhost_protocol::frame::{ExecuteOptions, SigintHandler};
use cellhost_protocol::{FrameReader, FrameWriter, HostFrame, ProtocolError, WorkerFrame};
use cellhost_sandbox::cgroup::KernelCgroup;
use cellhost_sandbox::signal;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};

use crate::config::KernelConfig;
use crate::error::KernelError;
use crate::hints;
use crate::kernel::{CellProgress, ExecOptions, InterruptOutcome, KernelInfo, LiveEvent, Variables};
use crate::marker::MarkerScanner;
use crate::outputs;
use crate::result::{
    BackgroundOutput, CellError, CellResult, CellStatus, CrashReport, DisplayOutput, InterruptReport,
    KernelRef, Usage,
};
use crate::ring::{OutputRing, Piece, RingTokens};
use crate::tools::{self, ToolCall, ToolCallRecord};

/// How long after a `response` the end markers may take before the cell
/// settles without them (they are written before the response, so this only
/// matters if a pipe is wedged).
const MARKER_WAIT: Duration = Duration::from_secs(2);
/// How long to keep reading the pipes after the worker died.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(300);
/// How long the init may take to kill and reap the tree after SIGTERM
/// before the host SIGKILLs the tree itself.
const KILL_GRACE: Duration = Duration::from_millis(1000);
/// How long to wait for the reader thread's answer to an escalation probe.
const PROBE_WAIT: Duration = Duration::from_millis(300);
use crate::seal::{self, BACKGROUND_CAP};
/// Bytes of a `background` frame redacted before the cap cuts it: the room
/// left plus this much, so that a secret across the cut is still masked.
const BACKGROUND_SLACK: usize = 64 * 1024;
/// Live text kept for `peek`, per stream.
const PEEK_TAIL: usize = 64 * 1024;
/// Read buffer per stream while output is light.
const READ_BUF: usize = 64 * 1024;
/// Read buffer and pipe capacity per stream while a cell writes a lot (a
/// read filled the small buffer): fewer reads and fewer wake-ups of the
/// writer per byte. Back to the small sizes once reads are small again.
const READ_BUF_BULK: usize = 1024 * 1024;
/// A read this small ends bulk mode.
const SMALL_READ: usize = 4 * 1024;
/// Pipes of this process grown to `READ_BUF_BULK` at once (16 MiB). Grown
/// pipes count against the user's pipe budget (`fs.pipe-user-pages-soft`,
/// 64 MiB by default); past it, every new pipe of that user gets only two
/// pages, so many busy kernels must not use it all.
static BULK_PIPES: PipeBudget = PipeBudget::new(16);

/// A count of grown pipes with a cap.
struct PipeBudget {
    used: AtomicUsize,
    cap: usize,
}

impl PipeBudget {
    const fn new(cap: usize) -> Self {
        PipeBudget {
            used: AtomicUsize::new(0),
            cap,
        }
    }

    /// A grant for one grown pipe, or `None` when the cap is reached.
    fn take(&'static self) -> Option<PipeGrant> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| PipeGrant(self))
    }
}

/// One grown pipe's share of the budget, returned on drop.
struct PipeGrant(&'static PipeBudget);

impl Drop for PipeGrant {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// State visible to handles without asking the driver.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub running: Option<String>,
    pub queued: usize,
    pub exit: Option<String>,
    pub cells_settled: u64,
}

pub(crate) struct QueuedCell {
    pub id: String,
    pub code: String,
    pub options: ExecOptions,
    pub submitted: Instant,
    pub reply: oneshot::Sender<Result<CellResult, KernelError>>,
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    User,
    Timeout,
}

struct Interrupt {
    cause: Cause,
    delivered: bool,
    target: String,
    not_delivered: Option<String>,
    escalate_at: Instant,
    probe_until: Option<Instant>,
    handler: Option<SigintHandler>,
    raised: u64,
    escalation: Option<String>,
}

struct ActiveCell {
    q: QueuedCell,
    marker: Vec<u8>,
    /// Per stream, until the cell's start marker: bytes before it are
    /// earlier cells' (background), never this cell's.
    start_scan: [MarkerScanner; 2],
    start_seen: [bool; 2],
    scan: [MarkerScanner; 2],
    /// Ring tokens of this cell per stream (when the worker may use rings).
    tokens: [Option<RingTokens>; 2],
    marker_seen: [bool; 2],
    capture: [Option<StreamCapture>; 2],
    peek: [String; 2],
    response: Option<WorkerFrame>,
    response_at: Option<Instant>,
    /// The worker sent `started`: a SIGINT to its main thread is now meant
    /// for this cell.
    started_code: bool,
    displays: Vec<DisplayOutput>,
    /// What this cell's displays (and result bundle) may still take.
    budget: outputs::DisplayBudget,
    started: Instant,
    deadline: Option<Instant>,
    interrupt: Option<Interrupt>,
    background: BackgroundOutput,
    dir: PathBuf,
    /// Host calls answered (or refused) for this cell.
    tool_calls: Vec<ToolCallRecord>,
    /// Host calls this cell made (counted against the budget).
    tool_count: u32,
    /// `pids.events max` when the cell started.
    pid_hits_at_start: u64,
    /// Set when the host killed the tree after the cell's code ended.
    tree_killed: Option<String>,
}

/// Bounded text kept for the next result.
#[derive(Default)]
struct Background {
    text: [String; 2],
    dropped: u64,
}

impl Background {
    fn push(&mut self, stream: usize, text: &str) {
        seal::push_capped(&mut self.text[stream], &mut self.dropped, text);
    }

    fn take(&mut self) -> BackgroundOutput {
        let [stdout, stderr] = std::mem::take(&mut self.text);
        BackgroundOutput {
            stdout,
            stderr,
            dropped_bytes: std::mem::take(&mut self.dropped),
        }
    }
}

pub(crate) struct Driver {
    config: KernelConfig,
    info: KernelInfo,
    label: String,
    child: InitProc,
    pidfd: AsyncFd<OwnedFd>,
    reader: FrameReader<OwnedReadHalf>,
    writer: FrameWriter<OwnedWriteHalf>,
    pipes: [Option<pipe::Receiver>; 2],
    /// The worker's output rings, when the host could take them.
    rings: [Option<OutputRing>; 2],
    bufs: [Vec<u8>; 2],
    /// Per stream: in bulk mode (big read buffer).
    bulk: [bool; 2],
    /// Per stream: the pipe is grown to `READ_BUF_BULK`.
    grown: [Option<PipeGrant>; 2],
    cmd_rx: mpsc::UnboundedReceiver<Command>,
    cmds_open: bool,
    ctl_open: bool,
    shared: Arc<Mutex<Shared>>,
    queue: VecDeque<QueuedCell>,
    active: Option<ActiveCell>,
    background: Background,
    /// Background bytes not yet decoded (raw, between cells).
    raw_background: [Vec<u8>; 2],
    /// The pending `inspect_variables`: request id, limit, reply.
    inspect: Option<(String, u32, VariablesReply)>,
    exit: Option<ExitStatus>,
    drain_until: Option<Instant>,
    kill_requested: Option<Instant>,
    kill_waiters: Vec<oneshot::Sender<()>>,
    protocol_error: Option<String>,
    cells_settled: u64,
    seq: u64,
    dead: bool,
    /// The kernel's control groups (limits, exact membership).
    cgroup: Option<KernelCgroup>,
    /// Why the host killed the kernel, when it did so on its own.
    kill_reason: Option<String>,
    /// The worker's execution_count after the last answered cell.
    execution_count: u64,
    /// Finished host calls, from their tasks back to the driver.
    tool_done_tx: mpsc::UnboundedSender<ToolDone>,
    tool_done_rx: mpsc::UnboundedReceiver<ToolDone>,
}

/// Where the answer to an `inspect_variables` goes.
type VariablesReply = oneshot::Sender<Result<Variables, KernelError>>;

/// A host call whose tool has answered.
struct ToolDone {
    id: String,
    cell: String,
    name: String,
    args_preview: String,
    started: Instant,
    answer: Result<Value, String>,
}

impl Driver {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: KernelConfig,
        child: InitProc,
        pidfd: AsyncFd<OwnedFd>,
        reader: FrameReader<OwnedReadHalf>,
        writer: FrameWriter<OwnedWriteHalf>,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
        cmd_rx: mpsc::UnboundedReceiver<Command>,
        shared: Arc<Mutex<Shared>>,
        info: KernelInfo,
        early_stderr: Vec<u8>,
        cgroup: Option<KernelCgroup>,
        rings: [Option<OutputRing>; 2],
    ) -> Self {
        let label = config.label();
        let (tool_done_tx, tool_done_rx) = mpsc::unbounded_channel();
        Driver {
            config,
            info,
            label,
            child,
            pidfd,
            reader,
            writer,
            pipes: [Some(stdout), Some(stderr)],
            rings,
            bufs: [vec![0u8; READ_BUF], vec![0u8; READ_BUF]],
            bulk: [false, false],
            grown: [None, None],
            cmd_rx,
            cmds_open: true,
            ctl_open: true,
            shared,
            queue: VecDeque::new(),
            active: None,
            background: Background::default(),
            raw_background: [Vec::new(), early_stderr],
            inspect: None,
            exit: None,
            drain_until: None,
            kill_requested: None,
            kill_waiters: Vec::new(),
            protocol_error: None,
            cells_settled: 0,
            seq: 0,
            dead: false,
            cgroup,
            kill_reason: None,
            execution_count: 0,
            tool_done_tx,
            tool_done_rx,
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mut d: Option<Instant> = None;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                d = Some(d.map_or(t, |x| x.min(t)));
            }
        };
        // Only timers that can still change something: a deadline left in
        // the past would fire on every turn of the loop.
        if self.pipes.iter().any(Option::is_some) {
            consider(self.drain_until);
        }
        if self.exit.is_none() {
            consider(self.kill_requested.map(|t| t + KILL_GRACE));
        }
        if let Some(a) = &self.active {
            if a.interrupt.is_none() && a.response.is_none() {
                consider(a.deadline);
            }
            if let Some(i) = a.interrupt.as_ref().filter(|i| i.escalation.is_none()) {
                consider(Some(i.probe_until.unwrap_or(i.escalate_at)));
            }
            consider(a.response_at.map(|t| t + MARKER_WAIT));
        }
        d
    }

    pub(crate) async fn run(mut self) {
        loop {
            if self.dead && self.active.is_none() && self.queue.is_empty() && !self.cmds_open {
                break;
            }
            if self.dead && !self.cmds_open {
                break;
            }
            let deadline = self.next_deadline();
            let alive = self.exit.is_none();
            let [out_pipe, err_pipe] = &mut self.pipes;
            let [out_buf, err_buf] = &mut self.bufs;
            tokio::select! {
                cmd = self.cmd_rx.recv(), if self.cmds_open => match cmd {
                    Some(c) => self.on_command(c).await,
                    None => {
                        self.cmds_open = false;
                        if !self.dead {
                            self.request_kill();
                        }
                    }
                },
                frame = self.reader.next::<WorkerFrame>(), if self.ctl_open => self.on_frame(frame).await,
                n = read_opt(out_pipe, out_buf) => self.on_bytes(0, n),
                n = read_opt(err_pipe, err_buf) => self.on_bytes(1, n),
                _ = self.pidfd.readable(), if alive => self.on_exit(),
                Some(done) = self.tool_done_rx.recv() => self.on_tool_done(done).await,
                _ = sleep_opt(deadline) => self.on_timer().await,
            }
            self.after_event().await;
        }
        self.finish_waiters();
    }

    fn finish_waiters(&mut self) {
        for w in self.kill_waiters.drain(..) {
            let _ = w.send(());
        }
    }

    async fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Execute(cell) => {
                if self.dead || self.kill_requested.is_some() {
                    let err = self.dead_error();
                    self.set_shared(|s| s.queued = s.queued.saturating_sub(1));
                    let _ = cell.reply.send(Err(err));
                } else {
                    self.queue.push_back(*cell);
                }
            }
            Command::Interrupt { cell, reply } => {
                let out = self.interrupt(cell, Cause::User).await;
                let _ = reply.send(out);
            }
            Command::Inspect { limit, reply } => {
                if self.dead {
                    let _ = reply.send(Err(self.dead_error()));
                } else if let Some(a) = &self.active {
                    let _ = reply.send(Err(KernelError::KernelBusy {
                        kernel: self.label.clone(),
                        cell: a.q.id.clone(),
                    }));
                } else if !self.queue.is_empty() || self.inspect.is_some() {
                    let _ = reply.send(Err(KernelError::KernelBusy {
                        kernel: self.label.clone(),
                        cell: "queued".into(),
                    }));
                } else {
                    self.seq += 1;
                    let id = format!("v{}", self.seq);
                    match self
                        .writer
                        .send(&HostFrame::InspectVariables {
                            id: id.clone(),
                            limit,
                        })
                        .await
                    {
                        Ok(()) => self.inspect = Some((id, limit, reply)),
                        Err(e) => {
                            let _ = reply.send(Err(KernelError::Protocol {
                                kernel: self.label.clone(),
                                source: e,
                            }));
                        }
                    }
                }
            }
            Command::Peek { cell, reply } => {
                let progress = if let Some(a) = self.active.as_ref().filter(|a| a.q.id == cell) {
                    Some(CellProgress {
                        cell_id: cell,
                        state: "running".into(),
                        stdout_tail: a.peek[0].clone(),
                        stderr_tail: a.peek[1].clone(),
                        elapsed_ms: a.started.elapsed().as_millis() as u64,
                    })
                } else if self.queue.iter().any(|q| q.id == cell) {
                    Some(CellProgress {
                        cell_id: cell,
                        state: "queued".into(),
                        stdout_tail: String::new(),
                        stderr_tail: String::new(),
                        elapsed_ms: 0,
                    })
                } else {
                    None
                };
                let _ = reply.send(progress);
            }
            Command::Kill { reply } => {
                if self.dead {
                    let _ = reply.send(());
                } else {
                    self.kill_waiters.push(reply);
                    self.request_kill();
                }
            }
        }
    }

    async fn interrupt(&mut self, cell: Option<String>, cause: Cause) -> InterruptOutcome {
        let pid = self.info.pid as i32;
        let target = format!("{pid}/{pid}");
        let Some(active) = self.active.as_mut() else {
            return InterruptOutcome {
                delivered: false,
                target: None,
                cell: None,
                reason: Some("no cell is running".into()),
            };
        };
        if cell.as_ref().is_some_and(|c| *c != active.q.id) {
            return InterruptOutcome {
                delivered: false,
                target: None,
                cell: cell.clone(),
                reason: Some("that cell is not running".into()),
            };
        }
        let id = active.q.id.clone();
        if let Some(i) = &active.interrupt {
            // A second interrupt during the grace changes nothing but is
            // reported; the escalation timer keeps running.
            return InterruptOutcome {
                delivered: i.delivered,
                target: Some(i.target.clone()),
                cell: Some(id),
                reason: Some("an interrupt is already in progress; the kernel is killed if the cell does not stop within the grace".into()),
            };
        }
        if active.response.is_some() {
            return InterruptOutcome {
                delivered: false,
                target: None,
                cell: Some(id),
                reason: Some("the cell already finished".into()),
            };
        }
        // The frame is the authority. The SIGINT (sent only once the worker
        // has said `started`, so it cannot land on another cell) wakes code
        // that sleeps or blocks; before `started`, the frame alone cancels
        // the cell, or the worker signals its own main thread.
        let signalled = active.started_code;
        let sent = if signalled {
            signal::tgkill(pid, pid, libc::SIGINT)
        } else {
            Ok(())
        };
        let not_delivered = sent.as_ref().err().map(|e| format!("tgkill failed: {e}"));
        active.interrupt = Some(Interrupt {
            cause,
            delivered: sent.is_ok(),
            target: target.clone(),
            not_delivered: not_delivered.clone(),
            escalate_at: Instant::now() + self.config.interrupt_grace,
            probe_until: None,
            handler: None,
            raised: 0,
            escalation: None,
        });
        let frame = HostFrame::Interrupt {
            id: id.clone(),
            signalled: signalled && sent.is_ok(),
        };
        let _ = self.writer.send(&frame).await;
        InterruptOutcome {
            delivered: sent.is_ok(),
            target: Some(target),
            cell: Some(id),
            reason: not_delivered,
        }
    }

    async fn on_frame(&mut self, frame: Result<Option<WorkerFrame>, ProtocolError>) {
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.ctl_open = false;
                return;
            }
            Err(e) => {
                // A malformed or oversized frame: the channel cannot be
                // trusted. Fail the cell with a protocol error, kill the kernel.
                let msg = e.to_string();
                tracing::warn!(kernel = %self.label, "protocol error: {msg}");
                self.protocol_error = Some(msg);
                self.ctl_open = false;
                self.request_kill();
                return;
            }
        };
        match frame {
            WorkerFrame::Response { ref id, .. } => {
                if let Some(a) = self.active.as_mut().filter(|a| a.q.id == *id) {
                    a.response = Some(frame);
                    a.response_at = Some(Instant::now());
                }
            }
            WorkerFrame::Display {
                id: _,
                data,
                metadata,
            } => {
                let Some(a) = self.active.as_mut() else {
                    return;
                };
                // Checked before anything is decoded or written: the host,
                // not the kernel's limits, pays for what is kept.
                if !a.budget.admit(outputs::bundle_size(&data, &metadata)) {
                    return;
                }
                let n = a.budget.kept();
                let redactor = &self.config.redactor;
                let max_text = self.config.display_limits.max_inline_text;
                let mut d = match outputs::save_bundle(
                    data,
                    &self.config.session_dir,
                    &a.dir,
                    &format!("display-{n}"),
                    redactor,
                    max_text,
                ) {
                    outputs::Saved::Bundle(data) => DisplayOutput { data, metadata },
                    outputs::Saved::Withheld(mime) => {
                        a.budget.withheld();
                        outputs::withheld_note(&mime)
                    }
                };
                seal::seal_display(&mut d, redactor);
                if let Some(live) = &a.q.options.live {
                    let _ = live.send(LiveEvent::Display(d.clone()));
                }
                a.displays.push(d);
            }
            WorkerFrame::HostCall {
                id,
                cell,
                method,
                args,
            } => self.on_host_call(id, cell, method, args).await,
            WorkerFrame::Variables {
                id,
                variables,
                truncated,
            } => {
                if self.inspect.as_ref().is_some_and(|(i, _, _)| *i == id)
                    && let Some((_, limit, reply)) = self.inspect.take()
                {
                    let _ = reply.send(Ok(seal::seal_variables(
                        variables,
                        truncated,
                        limit,
                        &self.config.redactor,
                    )));
                }
            }
            WorkerFrame::Background { stream, mut text } => {
                let idx = usize::from(stream == "stderr");
                let (buf, dropped) = match self.active.as_mut() {
                    Some(a) => {
                        let b = &mut a.background;
                        let buf = if idx == 0 { &mut b.stdout } else { &mut b.stderr };
                        (buf, &mut b.dropped_bytes)
                    }
                    None => (&mut self.background.text[idx], &mut self.background.dropped),
                };
                // Only what can still be kept is redacted (plus a margin so
                // a secret across the cut is masked whole); the rest of a
                // huge frame is counted, never copied.
                let room = BACKGROUND_CAP.saturating_sub(buf.len());
                let keep = text.floor_char_boundary(room.saturating_add(BACKGROUND_SLACK));
                *dropped = dropped.saturating_add((text.len() - keep) as u64);
                text.truncate(keep);
                let text = self.config.redactor.redact(&text);
                seal::push_capped(buf, dropped, &text);
            }
            WorkerFrame::InterruptAck {
                id, handler, raised, ..
            } => {
                if let Some(i) = self
                    .active
                    .as_mut()
                    .filter(|a| a.q.id == id)
                    .and_then(|a| a.interrupt.as_mut())
                {
                    i.handler = Some(handler);
                    i.raised = raised;
                    if i.probe_until.is_some() && i.escalation.is_none() {
                        i.escalation = Some(escalation_reason(i));
                        self.request_kill();
                    }
                }
            }
            WorkerFrame::Started { id } => {
                if let Some(a) = self.active.as_mut().filter(|a| a.q.id == id) {
                    a.started_code = true;
                }
            }
            WorkerFrame::InterruptRaised { .. } | WorkerFrame::Ready { .. } => {}
            // The kernel init's report, read by the handshake.
            WorkerFrame::Sandbox { .. } => {}
            WorkerFrame::Log { mut msg } => {
                seal::cut(&mut msg, seal::LOG_MAX);
                let msg = self.config.redactor.redact(&msg);
                tracing::debug!(kernel = %self.label, "worker: {msg}");
            }
        }
    }

    /// Checks a host call's authority, budget and tool name, then runs it
    /// on its own task; refusals are answered at once.
    async fn on_host_call(&mut self, id: String, cell: String, mut name: String, args: Value) {
        seal::cut(&mut name, 256);
        let args_preview = self
            .config
            .redactor
            .redact(&tools::preview(&args, 200))
            .into_owned();
        let budget = self.config.tool_budget;
        let names = self.config.tool_names();
        let args_len = args.to_string().len();
        let refusal = match self.active.as_mut() {
            Some(a) if a.q.id == cell && a.response.is_none() => {
                if args_len > seal::HOST_CALL_ARGS_MAX {
                    Some(format!(
                        "host call refused: its arguments are {args_len} bytes of JSON, more than the {} allowed",
                        seal::HOST_CALL_ARGS_MAX
                    ))
                } else if a.tool_count >= budget {
                    Some(format!(
                        "the tool budget of {budget} calls per cell is spent; split the work across cells"
                    ))
                } else if !names.contains(&name) {
                    Some(if names.is_empty() {
                        format!("tool '{name}' is not enabled: this session has no host tools")
                    } else {
                        format!(
                            "tool '{name}' is not enabled; enabled tools: {}",
                            names.join(", ")
                        )
                    })
                } else {
                    a.tool_count += 1;
                    None
                }
            }
            _ => Some(format!(
                "host call refused: cell {cell} has settled, and a cell's tool authority ends when the cell settles"
            )),
        };
        if let Some(error) = refusal {
            if let Some(a) = self.active.as_mut().filter(|a| a.q.id == cell) {
                a.tool_calls.push(ToolCallRecord {
                    name,
                    args_preview,
                    duration_ms: 0,
                    outcome: "refused".into(),
                    error: Some(error.clone()),
                });
            }
            let _ = self
                .writer
                .send(&HostFrame::HostResponse {
                    id,
                    data: None,
                    error: Some(error),
                })
                .await;
            return;
        }
        let Some(host) = self.config.tool_host.clone() else {
            return;
        };
        let call = ToolCall {
            session: self.info.session.clone(),
            cell: cell.clone(),
            name: name.clone(),
            args,
        };
        let tx = self.tool_done_tx.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            let answer = host.call(call).await;
            let _ = tx.send(ToolDone {
                id,
                cell,
                name,
                args_preview,
                started,
                answer,
            });
        });
    }

    async fn on_tool_done(&mut self, done: ToolDone) {
        let redactor = self.config.redactor.clone();
        let (data, error) = match done.answer {
            Ok(v) => (Some(outputs::redact_value(v, &redactor)), None),
            Err(e) => (None, Some(redactor.redact(&e).into_owned())),
        };
        if let Some(a) = self.active.as_mut().filter(|a| a.q.id == done.cell) {
            a.tool_calls.push(ToolCallRecord {
                name: done.name,
                args_preview: done.args_preview,
                duration_ms: done.started.elapsed().as_millis() as u64,
                outcome: if error.is_some() { "error" } else { "ok" }.into(),
                error: error.clone(),
            });
        }
        let _ = self
            .writer
            .send(&HostFrame::HostResponse {
                id: done.id,
                data,
                error,
            })
            .await;
    }

    fn on_bytes(&mut self, stream: usize, n: std::io::Result<usize>) {
        let n = match n {
            Ok(0) | Err(_) => {
                self.pipes[stream] = None;
                return;
            }
            Ok(n) => n,
        };
        let mut chunk = std::borrow::Cow::Borrowed(&self.bufs[stream][..n]);
        if let Some(a) = self.active.as_mut()
            && !a.start_seen[stream]
        {
            let scan = a.start_scan[stream].feed(&chunk);
            self.raw_background[stream].extend_from_slice(&scan.before);
            if !scan.found {
                self.adapt_read_size(stream, n);
                return;
            }
            a.start_seen[stream] = true;
            chunk = std::borrow::Cow::Owned(scan.after.into_owned());
        }
        if let Some(a) = self.active.as_mut()
            && !a.marker_seen[stream]
        {
            let scan = a.scan[stream].feed(&chunk);
            push_output(a, &mut self.rings[stream], stream, &scan.before);
            if scan.found {
                if let Some(t) = a.tokens[stream].as_mut() {
                    let held = t.take_held();
                    push_capture(a, stream, &held);
                }
                a.marker_seen[stream] = true;
                self.raw_background[stream].extend_from_slice(&scan.after);
            }
        } else if self.raw_background[stream].len() < 4 * BACKGROUND_CAP {
            self.raw_background[stream].extend_from_slice(&chunk);
        } else {
            self.background.dropped += n as u64;
        }
        self.adapt_read_size(stream, n);
    }

    /// Enters bulk mode when a read filled the small buffer: a big read
    /// buffer, and a big pipe while the process-wide budget allows (the
    /// kernel may refuse too: then the bigger reads alone help). Leaves it
    /// when a read is small; the pipe shrinks back once it holds less than
    /// the small size (retried at each read until then).
    fn adapt_read_size(&mut self, stream: usize, n: usize) {
        if !self.bulk[stream] && n == self.bufs[stream].len() {
            self.bulk[stream] = true;
            self.bufs[stream].resize(READ_BUF_BULK, 0);
            if let Some(grant) = BULK_PIPES.take()
                && let Some(p) = &self.pipes[stream]
                && rustix::pipe::fcntl_setpipe_size(p, READ_BUF_BULK).is_ok()
            {
                self.grown[stream] = Some(grant);
            }
        } else if self.bulk[stream] && n < SMALL_READ {
            self.bulk[stream] = false;
            let buf = &mut self.bufs[stream];
            buf.truncate(READ_BUF);
            buf.shrink_to_fit();
        }
        if !self.bulk[stream] && self.grown[stream].is_some() {
            let shrunk = self.pipes[stream]
                .as_ref()
                .is_none_or(|p| rustix::pipe::fcntl_setpipe_size(p, READ_BUF).is_ok());
            if shrunk {
                self.grown[stream] = None;
            }
        }
    }

    fn on_exit(&mut self) {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.exit = Some(status);
                self.drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                let reason = if let Some(why) = &self.kill_reason {
                    why.clone()
                } else if self.kill_requested.is_some() {
                    "killed by the host".to_string()
                } else {
                    describe_exit(status)
                };
                self.set_shared(|s| s.exit = Some(reason));
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(kernel = %self.label, "waiting for the kernel init: {e}"),
        }
    }

    async fn on_timer(&mut self) {
        let now = Instant::now();
        if let Some(t) = self.kill_requested
            && now >= t + KILL_GRACE
            && self.exit.is_none()
        {
            // The init did not finish in time: sweep the tree from here.
            let init = self.info.init_pid as i32;
            signal::kill_descendants(init, 20);
            if let Some(cg) = &self.cgroup {
                cg.kill_all(20);
            }
            let _ = signal::kill(init, libc::SIGKILL);
            self.kill_requested = Some(now);
        }
        if self.drain_until.is_some_and(|t| now >= t) {
            self.pipes = [None, None];
        }
        let mut to_interrupt = false;
        let mut escalate = false;
        if let Some(a) = self.active.as_mut() {
            if a.interrupt.is_none() && a.response.is_none() && a.deadline.is_some_and(|d| now >= d) {
                to_interrupt = true;
            }
            if let Some(i) = a.interrupt.as_mut()
                && i.escalation.is_none()
            {
                if let Some(p) = i.probe_until {
                    if now >= p {
                        i.escalation = Some(escalation_reason(i));
                        escalate = true;
                    }
                } else if now >= i.escalate_at {
                    if i.handler.is_some_and(|h| h != SigintHandler::Worker) {
                        i.escalation = Some(escalation_reason(i));
                        escalate = true;
                    } else {
                        i.probe_until = Some(now + PROBE_WAIT);
                        let id = a.q.id.clone();
                        let probe = HostFrame::Interrupt { id, signalled: true };
                        let _ = self.writer.send(&probe).await;
                    }
                }
            }
            if a.response_at.is_some_and(|t| now >= t + MARKER_WAIT) {
                tracing::warn!(kernel = %self.label, "cell {} settled without its end markers", a.q.id);
                a.marker_seen = [true, true];
            }
        }
        if to_interrupt {
            self.interrupt(None, Cause::Timeout).await;
        }
        if escalate {
            self.request_kill();
        }
    }

    fn request_kill(&mut self) {
        if self.kill_requested.is_some() || self.exit.is_some() {
            return;
        }
        self.kill_requested = Some(Instant::now());
        let _ = signal::kill(self.info.init_pid as i32, libc::SIGTERM);
    }

    async fn after_event(&mut self) {
        // Background bytes between cells: decode and keep for the next result.
        for s in 0..2 {
            if self.raw_background[s].is_empty() {
                continue;
            }
            // Before the running cell's start marker: output of earlier
            // cells that this result reports; after its end marker (or
            // between cells): output the next result reports.
            let before_start = self.active.as_ref().is_some_and(|a| !a.start_seen[s]);
            if before_start || self.active.is_none() || self.active_marker_seen(s) {
                let raw = std::mem::take(&mut self.raw_background[s]);
                let text = cellhost_capture::render_once(&raw);
                let text = self.config.redactor.redact(&text);
                match self.active.as_mut().filter(|_| before_start) {
                    Some(a) => {
                        let b = &mut a.background;
                        let buf = if s == 0 { &mut b.stdout } else { &mut b.stderr };
                        seal::push_capped(buf, &mut b.dropped_bytes, &text);
                    }
                    None => self.background.push(s, &text),
                }
            }
        }
        let gone = self.exit.is_some() && self.pipes.iter().all(Option::is_none);
        let saturated = self.saturated_tree();
        if let Some(a) = self.active.as_mut()
            && a.tree_killed.is_none()
            && a.response.is_some()
            && let Some(why) = saturated
        {
            // The cell's processes filled the kernel's process limit and are
            // still there: they would starve every later cell. Kill the tree.
            a.tree_killed = Some(why.clone());
            self.kill_reason = Some(why);
            self.request_kill();
        }
        if let Some(a) = &self.active {
            let complete = a.response.is_some() && a.marker_seen == [true, true] && a.tree_killed.is_none();
            // After a protocol error the cell settles once the kill is done,
            // so the caller never sees a result while the kernel still lives.
            if complete || gone {
                self.settle();
            }
        }
        if gone && !self.dead {
            self.dead = true;
            if let Some(cg) = self.cgroup.as_mut() {
                cg.kill_all(5);
                cg.remove();
            }
            let err = self.dead_error();
            for q in self.queue.drain(..) {
                let _ = q.reply.send(Err(clone_dead(&err)));
            }
            if let Some((_, _, reply)) = self.inspect.take() {
                let _ = reply.send(Err(clone_dead(&err)));
            }
            self.set_shared(|s| {
                s.queued = 0;
                s.running = None;
            });
            self.finish_waiters();
        }
        if self.active.is_none() && !self.dead && self.kill_requested.is_none() {
            self.start_next().await;
        }
    }

    /// `Some(reason)` when the running cell hit the kernel's process limit
    /// and processes other than the init and the worker remain.
    fn saturated_tree(&self) -> Option<String> {
        let cg = self.cgroup.as_ref()?;
        let a = self.active.as_ref()?;
        if a.response.is_none() || cg.pids_limit_hits() <= a.pid_hits_at_start {
            return None;
        }
        let others = cg.pids().len().saturating_sub(2);
        (others > 0).then(|| {
            format!(
                "the cell's processes reached the kernel's process limit (pids.max {}) and {others} were still running; the kernel's whole tree was killed",
                cg.pids_max().map_or_else(|| "?".into(), |n| n.to_string())
            )
        })
    }

    fn active_marker_seen(&self, s: usize) -> bool {
        self.active.as_ref().is_some_and(|a| a.marker_seen[s])
    }

    async fn start_next(&mut self) {
        let Some(q) = self.queue.pop_front() else {
            return;
        };
        let mut token = [0u8; 16];
        let _ = getrandom::fill(&mut token);
        let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
        let marker = format!("\u{1}cellhost-end-{hex}\u{1}");
        let dir = self.config.session_dir.join(crate::kernel::CELLS_DIR).join(&q.id);
        let timeout = match q.options.timeout {
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
            None => self.config.cell_timeout,
        };
        let redactor = self.config.redactor.clone();
        let cap = |limits: &StreamLimits, name: &str| {
            StreamCapture::new(
                limits.clone(),
                redactor.clone(),
                Some(dir.join(format!("{name}.txt"))),
            )
            .spill_beneath(self.config.session_dir.clone())
        };
        let started = Instant::now();
        let frame = HostFrame::Execute {
            id: q.id.clone(),
            code: q.code.clone(),
            marker: marker.clone(),
            options: ExecuteOptions {
                silent: q.options.silent,
                session_dir: None,
                rings: self.rings.iter().any(Option::is_some),
            },
        };
        let start = marker.replacen("cellhost-end-", "cellhost-start-", 1);
        let mut a = ActiveCell {
            marker: marker.clone().into_bytes(),
            start_scan: [
                MarkerScanner::new(start.as_bytes()),
                MarkerScanner::new(start.as_bytes()),
            ],
            start_seen: [false, false],
            scan: [
                MarkerScanner::new(marker.as_bytes()),
                MarkerScanner::new(marker.as_bytes()),
            ],
            tokens: [0, 1].map(|s| self.rings[s].as_ref().map(|_| RingTokens::new(&hex))),
            marker_seen: [false, false],
            capture: [
                Some(cap(&self.config.stdout_limits, "stdout")),
                Some(cap(&self.config.stderr_limits, "stderr")),
            ],
            peek: [String::new(), String::new()],
            response: None,
            response_at: None,
            started_code: false,
            displays: Vec::new(),
            budget: outputs::DisplayBudget::new(self.config.display_limits.clone()),
            started,
            deadline: timeout.map(|t| started + t),
            interrupt: None,
            background: self.background.take(),
            dir,
            pid_hits_at_start: self.cgroup.as_ref().map_or(0, KernelCgroup::pids_limit_hits),
            tool_calls: Vec::new(),
            tool_count: 0,
            tree_killed: None,
            q,
        };
        let _ = &a.marker;
        self.set_shared(|s| {
            s.running = Some(a.q.id.clone());
            s.queued = s.queued.saturating_sub(1);
        });
        if let Err(e) = self.writer.send(&frame).await {
            self.protocol_error = Some(format!("cannot send the cell: {e}"));
            a.marker_seen = [true, true];
        }
        self.active = Some(a);
    }

    fn settle(&mut self) {
        let Some(mut a) = self.active.take() else {
            return;
        };
        for s in 0..2 {
            // A cell that never wrote its start marker (its worker died
            // first): what came was not its own.
            let early = a.start_scan[s].take_held();
            if !early.is_empty() {
                let text = cellhost_capture::render_once(&early);
                let b = &mut a.background;
                let buf = if s == 0 { &mut b.stdout } else { &mut b.stderr };
                seal::push_capped(buf, &mut b.dropped_bytes, &self.config.redactor.redact(&text));
            }
            let held = a.scan[s].take_held();
            push_output(&mut a, &mut self.rings[s], s, &held);
            if let Some(t) = a.tokens[s].as_mut() {
                let held = t.take_held();
                push_capture(&mut a, s, &held);
            }
        }
        let [out, err] = [a.capture[0].take(), a.capture[1].take()].map(|c| c.map(StreamCapture::finish));
        let mut truncated = std::collections::BTreeMap::new();
        let mut texts = [String::new(), String::new()];
        for (i, (fin, name)) in [(out, "stdout"), (err, "stderr")].into_iter().enumerate() {
            if let Some(fin) = fin {
                if !fin.live_tail.is_empty()
                    && let Some(live) = &a.q.options.live
                {
                    let ev = if i == 0 {
                        LiveEvent::Stdout(fin.live_tail.clone())
                    } else {
                        LiveEvent::Stderr(fin.live_tail.clone())
                    };
                    let _ = live.send(ev);
                }
                texts[i] = fin.text;
                if let Some(t) = fin.truncation {
                    truncated.insert(name.to_string(), t);
                }
            }
        }
        let [stdout, stderr] = texts;
        let redactor = self.config.redactor.clone();
        let mut status;
        // A cell whose kernel died before it answered still took a number
        // (the worker counts a cell as soon as it starts it).
        let mut execution_count = if a.q.options.silent {
            self.execution_count
        } else {
            self.execution_count.saturating_add(1)
        };
        let mut result = None;
        let mut error = None;
        let mut usage = None;
        let mut cwd = None;
        let mut crash = None;
        let mut files = None;
        if let Some(WorkerFrame::Response {
            status: st,
            execution_count: ec,
            result: res,
            error: er,
            usage: us,
            cwd: c,
            files: fl,
            ..
        }) = a.response.take()
        {
            status = match st.as_str() {
                "ok" => CellStatus::Ok,
                "interrupted" => CellStatus::Interrupted,
                _ => CellStatus::Error,
            };
            // The worker's count is believed only where it can be true: the
            // previous count, or one more (a hostile worker must not make
            // the host's own count overflow or jump).
            if ec == self.execution_count || ec == self.execution_count.saturating_add(1) {
                execution_count = ec;
            }
            self.execution_count = execution_count;
            result = res.and_then(|r| {
                if !a.budget.admit(outputs::bundle_size(&r, &serde_json::Map::new())) {
                    return None;
                }
                let max_text = self.config.display_limits.max_inline_text;
                match outputs::save_bundle(r, &self.config.session_dir, &a.dir, "result", &redactor, max_text)
                {
                    outputs::Saved::Bundle(b) => Some(b),
                    outputs::Saved::Withheld(mime) => {
                        a.budget.withheld();
                        Some(outputs::withheld_note(&mime).data)
                    }
                }
            });
            error = er.and_then(|e| parse_error(e, &redactor));
            usage = us.and_then(|u| serde_json::from_value::<Usage>(u).ok());
            cwd = c;
            files = fl.map(|mut f| {
                for p in f.read.iter_mut().chain(f.write.iter_mut()) {
                    *p = redactor.redact(p).into_owned();
                }
                f
            });
        } else if let Some(msg) = &self.protocol_error {
            status = CellStatus::Crashed;
            crash = Some(CrashReport {
                exit_code: None,
                signal: None,
                signal_name: None,
                message: format!(
                    "protocol error from the worker (kernel {} killed): {msg}",
                    self.label
                ),
            });
        } else {
            status = CellStatus::Crashed;
            crash = Some(self.crash_report(a.pid_hits_at_start));
        }
        let mut interrupt = None;
        if let Some(why) = &a.tree_killed {
            crash = None;
            if let Some(i) = &a.interrupt {
                status = match i.cause {
                    Cause::User => CellStatus::Interrupted,
                    Cause::Timeout => CellStatus::Timeout,
                };
                interrupt = Some(InterruptReport {
                    delivered: i.delivered,
                    target: Some(i.target.clone()),
                    escalated: true,
                    state_kept: false,
                    reason: Some(why.clone()),
                });
            } else {
                // Nobody interrupted the cell: the host killed its kernel
                // (process limit reached), whatever the worker answered.
                status = CellStatus::Crashed;
                crash = Some(CrashReport {
                    exit_code: None,
                    signal: Some(libc::SIGKILL),
                    signal_name: Some(signal::signal_name(libc::SIGKILL)),
                    message: why.clone(),
                });
            }
        } else if let Some(i) = &a.interrupt {
            let escalated = i.escalation.is_some();
            if escalated || status != CellStatus::Ok {
                status = match i.cause {
                    Cause::User => CellStatus::Interrupted,
                    Cause::Timeout => CellStatus::Timeout,
                };
            }
            if escalated {
                crash = None;
            }
            let mut reason = i.escalation.clone().or_else(|| i.not_delivered.clone());
            if escalated
                && let Some(cg) = &self.cgroup
                && cg.pids_limit_hits() > a.pid_hits_at_start
            {
                let max = cg.pids_max().map_or_else(|| "?".into(), |n| n.to_string());
                reason = Some(format!(
                    "the cell's processes reached the kernel's process limit (pids.max {max}); {}",
                    reason.unwrap_or_default()
                ));
            }
            interrupt = Some(InterruptReport {
                delivered: i.delivered,
                target: Some(i.target.clone()),
                escalated,
                state_kept: !escalated,
                reason,
            });
        }
        self.cells_settled += 1;
        let reused = self.cells_settled > 1;
        let truncated_any = !truncated.is_empty();
        let displays_dropped = a.budget.report();
        let mut displays = a.displays;
        displays.extend(a.budget.drop_note());
        let mut res = CellResult {
            cell_id: a.q.id.clone(),
            status,
            execution_count,
            stdout,
            stderr,
            result,
            displays,
            displays_dropped,
            error,
            truncated,
            kernel: KernelRef {
                session: self.info.session.clone(),
                generation: self.info.generation,
                pid: self.info.pid,
                reused,
                state_reset: false,
                reset_reason: None,
                sandbox: crate::result::SandboxRef::of(&self.info.sandbox),
            },
            interrupt,
            crash,
            duration_ms: a.started.elapsed().as_millis() as u64,
            queued_ms: a.started.saturating_duration_since(a.q.submitted).as_millis() as u64,
            usage,
            tool_calls: std::mem::take(&mut a.tool_calls),
            background_output: (!a.background.is_empty()).then_some(a.background),
            cwd,
            hint: None,
            files,
        };
        res.hint = hints::hint_for(&res, &self.config.python, truncated_any);
        // The one place a result leaves the kernel crate: every text field
        // redacted, everything the worker sent bounded.
        seal::seal_result(&mut res, &redactor);
        let settled = self.cells_settled;
        self.set_shared(|s| {
            s.running = None;
            s.cells_settled = settled;
        });
        let _ = a.q.reply.send(Ok(res));
    }

    /// How the worker died; `pid_hits_at_start` is the cgroup's
    /// `pids.events max` when the cell started.
    fn crash_report(&self, pid_hits_at_start: u64) -> CrashReport {
        match self.exit {
            Some(st) => {
                let signal_num = st.signal();
                let code = st.code();
                let signal_name = signal_num.map(signal::signal_name);
                let mut message = format!("the worker process {}", describe_exit(st));
                let oom = self.cgroup.as_ref().map_or(0, KernelCgroup::oom_kills);
                if oom > 0 {
                    message.push_str(&format!(
                        ": out of memory, the kernel's memory limit ({}) was reached and the OOM killer ended it",
                        self.config.limits.memory_bytes.map_or_else(|| "?".into(), |b| format!("{} MiB", b >> 20))
                    ));
                } else if let Some(cg) = self
                    .cgroup
                    .as_ref()
                    .filter(|cg| cg.pids_limit_hits() > pid_hits_at_start)
                {
                    message.push_str(&format!(
                        ": the kernel's process limit (pids.max {}) was reached (threads count too)",
                        cg.pids_max().map_or_else(|| "?".into(), |n| n.to_string())
                    ));
                } else if signal_num == Some(libc::SIGKILL) {
                    message.push_str(" (killed from outside: often the out-of-memory killer)");
                }
                CrashReport {
                    exit_code: code,
                    signal: signal_num,
                    signal_name,
                    message,
                }
            }
            None => CrashReport {
                exit_code: None,
                signal: None,
                signal_name: None,
                message: "the worker's output ended without a result".into(),
            },
        }
    }

    fn dead_error(&self) -> KernelError {
        let reason = if let Some(p) = &self.protocol_error {
            format!("protocol error: {p}")
        } else if let Some(why) = &self.kill_reason {
            why.clone()
        } else if self.kill_requested.is_some() {
            "killed by the host".into()
        } else {
            self.exit.map(describe_exit).unwrap_or_else(|| "exited".into())
        };
        KernelError::Dead {
            kernel: self.label.clone(),
            reason,
        }
    }

    fn set_shared(&self, f: impl FnOnce(&mut Shared)) {
        if let Ok(mut s) = self.shared.lock() {
            f(&mut s);
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Runtime shutdown or a panic: never leave the tree behind.
        if self.exit.is_none() {
            self.child.kill_and_reap();
        }
    }
}

/// Hands a cell's bytes from the pipe to its capture, with the ring
/// tokens among them replaced by the bytes they stand for.
fn push_output(a: &mut ActiveCell, ring: &mut Option<OutputRing>, stream: usize, bytes: &[u8]) {
    let Some(tokens) = a.tokens[stream].as_mut() else {
        push_capture(a, stream, bytes);
        return;
    };
    for piece in tokens.feed(bytes) {
        match piece {
            Piece::Bytes(b) => push_capture(a, stream, &b),
            Piece::Ring { pos, len, raw } => {
                let taken = match ring.as_mut() {
                    Some(r) => r.consume(pos, len, |b| push_capture(a, stream, b)),
                    None => Ok(false),
                };
                match taken {
                    Ok(true) => {}
                    Ok(false) => push_capture(a, stream, &raw),
                    Err(e) => {
                        // The ring is unusable from now on; the worker
                        // falls back to the pipe when it gets no room.
                        tracing::warn!("output ring failed, back to the pipe only: {e}");
                        *ring = None;
                        push_capture(a, stream, &raw);
                    }
                }
            }
        }
    }
}

fn push_capture(a: &mut ActiveCell, stream: usize, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let Some(cap) = a.capture[stream].as_mut() else {
        return;
    };
    let peek = &mut a.peek[stream];
    // The live text is assembled only for a subscriber; `peek` keeps a tail.
    let mut live_text = a.q.options.live.as_ref().map(|_| String::new());
    cap.push_with(bytes, |piece| {
        keep_tail(peek, piece);
        if let Some(t) = live_text.as_mut() {
            t.push_str(piece);
        }
    });
    if let (Some(live), Some(text)) = (&a.q.options.live, live_text)
        && !text.is_empty()
    {
        let _ = live.send(if stream == 0 {
            LiveEvent::Stdout(text)
        } else {
            LiveEvent::Stderr(text)
        });
    }
}

/// Appends `text` to `peek`, keeping at most the last `PEEK_TAIL` bytes
/// (cut at a character boundary); of a long `text` only that tail is copied.
fn keep_tail(peek: &mut String, text: &str) {
    if text.len() >= PEEK_TAIL {
        peek.clear();
        peek.push_str(&text[text.ceil_char_boundary(text.len() - PEEK_TAIL)..]);
        return;
    }
    peek.push_str(text);
    if peek.len() > PEEK_TAIL {
        let cut = peek.ceil_char_boundary(peek.len() - PEEK_TAIL);
        peek.drain(..cut);
    }
}

fn escalation_reason(i: &Interrupt) -> String {
    match i.handler {
        Some(SigintHandler::Ignored) => {
            "the cell's code ignores SIGINT (signal.SIG_IGN); the kernel was killed".into()
        }
        Some(SigintHandler::User) => {
            "the cell's code replaced the SIGINT handler and kept running; the kernel was killed".into()
        }
        Some(SigintHandler::Default) => "the cell's code restored the default SIGINT action".into(),
        _ if i.raised > 0 => format!(
            "the code caught the KeyboardInterrupt ({} raised) and kept running; the kernel was killed",
            i.raised
        ),
        Some(SigintHandler::Worker) => {
            "the cell is still in native code that does not check for interrupts; the kernel was killed"
                .into()
        }
        None => "the worker did not answer (stuck in native code with the GIL held?); the kernel was killed"
            .into(),
    }
}

fn parse_error(v: Value, redactor: &cellhost_capture::Redactor) -> Option<CellError> {
    let e: CellError = serde_json::from_value(v).ok()?;
    Some(CellError {
        ename: e.ename,
        evalue: redactor.redact(&e.evalue).into_owned(),
        traceback: e
            .traceback
            .iter()
            .map(|l| redactor.redact(l).into_owned())
            .collect(),
    })
}

fn clone_dead(e: &KernelError) -> KernelError {
    match e {
        KernelError::Dead { kernel, reason } => KernelError::Dead {
            kernel: kernel.clone(),
            reason: reason.clone(),
        },
        other => KernelError::Dead {
            kernel: "?".into(),
            reason: other.to_string(),
        },
    }
}

/// `exited with code 1` / `was killed by SIGSEGV (signal 11)`.
pub(crate) fn describe_exit(st: ExitStatus) -> String {
    if let Some(code) = st.code() {
        format!("exited with code {code}")
    } else if let Some(sig) = st.signal() {
        format!("was killed by {} (signal {sig})", signal::signal_name(sig))
    } else {
        "ended".into()
    }
}

async fn read_opt(pipe: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> std::io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_tail_holds_the_last_bytes_on_char_boundaries() {
        let mut peek = String::new();
        let mut all = String::new();
        for i in 0..20_000 {
            let piece = if i % 3 == 0 {
                format!("é{i}\n")
            } else {
                "x".repeat(i % 97)
            };
            keep_tail(&mut peek, &piece);
            all.push_str(&piece);
        }
        assert!(peek.len() <= PEEK_TAIL && peek.len() + 1 >= PEEK_TAIL);
        assert!(all.ends_with(&peek));
        let big = "ü".repeat(PEEK_TAIL);
        keep_tail(&mut peek, &big);
        assert_eq!(peek.len(), PEEK_TAIL);
        assert!(big.ends_with(&peek));
    }

    #[test]
    fn pipe_budget_caps_grants_and_returns_them_on_drop() {
        static BUDGET: PipeBudget = PipeBudget::new(2);
        let a = BUDGET.take().expect("first");
        let b = BUDGET.take().expect("second");
        assert!(BUDGET.take().is_none(), "cap of 2 reached");
        drop(a);
        let c = BUDGET.take().expect("a grant came back");
        assert!(BUDGET.take().is_none());
        drop((b, c));
        assert_eq!(BUDGET.used.load(Ordering::Acquire), 0);
    }
}
