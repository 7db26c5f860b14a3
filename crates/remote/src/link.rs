//! [`RemoteLink`]: a [`WorkerLink`] whose worker runs under a node agent,
//! everything multiplexed over the agent's one TLS connection.
//!
//! A reader task turns the agent's messages into [`LinkEvent`]s on a
//! bounded channel (so `next_event` is cancel-safe and a slow driver slows
//! the agent down through TCP, not the host's memory); a writer task sends
//! the host's messages and a heartbeat. When the connection ends before
//! the worker's exit status came, or stays silent past the host's
//! `silence`, the link reports the worker's end itself: control and output
//! closed, a synthetic `Exited` (SIGKILL) and
//! [`lost_reason`](WorkerLink::lost_reason) `connection lost`.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellhost_kernel::link::{LinkEvent, Stream, TreeUsage, WorkerIds, WorkerLink};
use cellhost_protocol::frame::RingOffer;
use cellhost_protocol::{HostFrame, ProtocolError, WorkerFrame};
use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::mpsc;

use crate::host::AgentConn;
use crate::wire::{InterruptDone, MAX_MESSAGE, Msg, UsageSnapshot, WorkerPids, read_msg, write_msg};

/// Events buffered between the reader task and the driver (each at most
/// one output chunk, 1 MiB).
const EVENT_QUEUE: usize = 32;

/// The reason a lost connection reports.
pub const CONNECTION_LOST: &str = "connection lost";

/// How long an interrupt waits for the node agent's report of its
/// `tgkill` before it counts as not delivered (the `interrupt` frame went
/// out regardless; the grace and the escalation run as for a local
/// kernel).
pub const DELIVERY_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Usage {
    pids_limit_hits: AtomicU64,
    pids_max: AtomicU64,
    oom_kills: AtomicU64,
    processes: AtomicUsize,
}

impl Usage {
    fn set(&self, u: UsageSnapshot) {
        self.pids_limit_hits.store(u.pids_limit_hits, Ordering::Relaxed);
        self.pids_max
            .store(u.pids_max.map_or(0, |m| m + 1), Ordering::Relaxed);
        self.oom_kills.store(u.oom_kills, Ordering::Relaxed);
        self.processes.store(u.processes, Ordering::Relaxed);
    }
}

impl TreeUsage for Usage {
    fn pids_limit_hits(&self) -> u64 {
        self.pids_limit_hits.load(Ordering::Relaxed)
    }
    fn pids_max(&self) -> Option<u64> {
        self.pids_max.load(Ordering::Relaxed).checked_sub(1)
    }
    fn oom_kills(&self) -> u64 {
        self.oom_kills.load(Ordering::Relaxed)
    }
    fn processes(&self) -> usize {
        self.processes.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
struct State {
    usage: Usage,
    has_usage: AtomicBool,
    pids: Mutex<Option<WorkerPids>>,
    lost: Mutex<Option<String>>,
    exited: AtomicBool,
}

/// What runs when the link is released or dropped (the placement's cancel).
pub type OnRelease = Box<dyn FnOnce() + Send>;

/// The host's end of a remote worker.
pub struct RemoteLink {
    events: mpsc::Receiver<LinkEvent>,
    /// The agent's reports of the interrupts it delivered, in order.
    delivered: mpsc::UnboundedReceiver<InterruptDone>,
    out: mpsc::UnboundedSender<Msg>,
    state: Arc<State>,
    node: String,
    init_pid: u32,
    worker_pid: u32,
    on_release: Option<OnRelease>,
}

impl std::fmt::Debug for RemoteLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteLink")
            .field("node", &self.node)
            .field("worker_pid", &self.worker_pid)
            .finish_non_exhaustive()
    }
}

impl RemoteLink {
    /// A link over an admitted connection whose agent reported `Started`.
    /// `heartbeat`: the host's ping interval; `silence`: how long without
    /// a message before the connection counts as lost.
    pub(crate) fn new(
        conn: AgentConn,
        node: String,
        init_pid: u32,
        heartbeat: Duration,
        silence: Duration,
        on_release: Option<OnRelease>,
    ) -> RemoteLink {
        let (rd, wr) = tokio::io::split(conn);
        let (ev_tx, events) = mpsc::channel(EVENT_QUEUE);
        let (out, out_rx) = mpsc::unbounded_channel();
        let (done_tx, delivered) = mpsc::unbounded_channel();
        let state = Arc::new(State::default());
        tokio::spawn(reader(rd, ev_tx, done_tx, state.clone(), silence));
        tokio::spawn(writer(wr, out_rx, heartbeat));
        RemoteLink {
            events,
            delivered,
            out,
            state,
            node,
            init_pid,
            worker_pid: 0,
            on_release,
        }
    }
}

async fn reader(
    mut rd: ReadHalf<AgentConn>,
    tx: mpsc::Sender<LinkEvent>,
    delivered: mpsc::UnboundedSender<InterruptDone>,
    state: Arc<State>,
    silence: Duration,
) {
    let mut open = [true, true];
    let mut ctl_open = true;
    let why = loop {
        let msg = match tokio::time::timeout(silence, read_msg(&mut rd, MAX_MESSAGE)).await {
            Err(_) => break format!("no message from the node agent for {} s", silence.as_secs()),
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => break "the node agent closed the connection".to_string(),
            Ok(Err(e)) => break e.to_string(),
        };
        let ev = match msg {
            Msg::Frame(b) => match serde_json::from_slice::<WorkerFrame>(&b) {
                Ok(f) => LinkEvent::Frame(f),
                Err(e) => {
                    ctl_open = false;
                    LinkEvent::ControlError(ProtocolError::Malformed {
                        detail: e.to_string(),
                        preview: String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned(),
                    })
                }
            },
            Msg::ControlClosed => {
                ctl_open = false;
                LinkEvent::ControlClosed
            }
            Msg::ControlError(m) => {
                ctl_open = false;
                LinkEvent::ControlError(ProtocolError::Io(std::io::Error::other(m)))
            }
            Msg::Output(s, bytes) if !bytes.is_empty() && open[usize::from(s.min(1))] => LinkEvent::Output {
                stream: if s == 0 { Stream::Stdout } else { Stream::Stderr },
                bytes,
            },
            Msg::Output(..) => continue,
            Msg::OutputClosed(s) => {
                open[usize::from(s)] = false;
                LinkEvent::OutputClosed(if s == 0 { Stream::Stdout } else { Stream::Stderr })
            }
            Msg::Exited(raw) => {
                state.exited.store(true, Ordering::Release);
                LinkEvent::Exited(ExitStatus::from_raw(raw))
            }
            Msg::Pids(p) => {
                if let Ok(mut g) = state.pids.lock() {
                    *g = Some(p);
                }
                continue;
            }
            Msg::Usage(u) => {
                state.usage.set(u);
                state.has_usage.store(true, Ordering::Release);
                continue;
            }
            Msg::InterruptDone(d) => {
                if !d.delivered {
                    tracing::warn!(
                        "the node agent could not deliver an interrupt: {}",
                        d.reason.as_deref().unwrap_or_default()
                    );
                }
                // The driver waits for it (or gave up waiting: then
                // nobody reads it and the next interrupt drops it).
                let _ = delivered.send(d);
                continue;
            }
            Msg::Ping => continue,
            other => {
                break format!("unexpected message from the node agent: {other:?}");
            }
        };
        if tx.send(ev).await.is_err() {
            return;
        }
    };
    if state.exited.load(Ordering::Acquire) {
        // The worker's end was reported: the rest is the normal close.
        for (s, o) in Stream::BOTH.iter().zip(open) {
            if o {
                let _ = tx.send(LinkEvent::OutputClosed(*s)).await;
            }
        }
        return;
    }
    tracing::warn!("remote kernel: {CONNECTION_LOST}: {why}");
    if let Ok(mut l) = state.lost.lock() {
        *l = Some(CONNECTION_LOST.to_string());
    }
    if ctl_open {
        let _ = tx.send(LinkEvent::ControlClosed).await;
    }
    for (s, o) in Stream::BOTH.iter().zip(open) {
        if o {
            let _ = tx.send(LinkEvent::OutputClosed(*s)).await;
        }
    }
    state.exited.store(true, Ordering::Release);
    let _ = tx
        .send(LinkEvent::Exited(ExitStatus::from_raw(libc::SIGKILL)))
        .await;
}

async fn writer(mut wr: WriteHalf<AgentConn>, mut rx: mpsc::UnboundedReceiver<Msg>, heartbeat: Duration) {
    let mut tick = tokio::time::interval(heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let msg = tokio::select! {
            m = rx.recv() => match m {
                Some(m) => m,
                None => break,
            },
            _ = tick.tick() => Msg::Ping,
        };
        if write_msg(&mut wr, &msg).await.is_err() {
            break;
        }
    }
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
}

impl WorkerLink for RemoteLink {
    async fn next_event(&mut self) -> LinkEvent {
        match self.events.recv().await {
            Some(ev) => ev,
            None => std::future::pending().await,
        }
    }

    async fn send(&mut self, frame: &HostFrame) -> Result<(), ProtocolError> {
        let json = serde_json::to_vec(frame).map_err(|e| ProtocolError::Encode(e.to_string()))?;
        self.out
            .send(Msg::Send(json))
            .map_err(|_| ProtocolError::Io(std::io::Error::other(CONNECTION_LOST)))
    }

    fn worker_ready(&mut self, pid: u32, _rings: &[RingOffer]) -> WorkerIds {
        let pids = self.state.pids.lock().ok().and_then(|p| *p);
        let (pid, init_pid) = pids.map_or((pid, self.init_pid), |p| (p.pid, p.init_pid));
        self.worker_pid = pid;
        WorkerIds {
            pid,
            init_pid,
            output_rings: Vec::new(),
            process: None,
        }
    }

    fn interrupt(&mut self) -> Result<(), String> {
        // The agent runs `tgkill` on the node and reports the delivery
        // ([`interrupt_delivery`](WorkerLink::interrupt_delivery)); a
        // report of an earlier interrupt that came too late is dropped.
        while self.delivered.try_recv().is_ok() {}
        self.out
            .send(Msg::Interrupt)
            .map_err(|_| format!("{CONNECTION_LOST} to the node agent on {}", self.node))
    }

    async fn interrupt_delivery(&mut self) -> Option<Result<(), String>> {
        let node = &self.node;
        Some(
            match tokio::time::timeout(DELIVERY_WAIT, self.delivered.recv()).await {
                Ok(Some(InterruptDone { delivered: true, .. })) => Ok(()),
                Ok(Some(InterruptDone { reason, .. })) => Err(format!(
                    "the node agent on {node} could not signal the worker: {}",
                    reason.unwrap_or_else(|| "no reason given".into())
                )),
                Ok(None) => Err(format!("{CONNECTION_LOST} to the node agent on {node}")),
                Err(_) => Err(format!(
                    "the node agent on {node} did not report the delivery within {} s",
                    DELIVERY_WAIT.as_secs()
                )),
            },
        )
    }

    fn interrupt_target(&self) -> String {
        format!("{0}:{1}/{1}", self.node, self.worker_pid)
    }

    fn terminate(&mut self) {
        let _ = self.out.send(Msg::Terminate);
    }

    fn force_kill(&mut self) {
        let _ = self.out.send(Msg::ForceKill);
    }

    fn close_output(&mut self) {
        let _ = self.out.send(Msg::CloseOutput);
    }

    fn usage(&self) -> Option<&dyn TreeUsage> {
        self.state
            .has_usage
            .load(Ordering::Acquire)
            .then_some(&self.state.usage as &dyn TreeUsage)
    }

    fn release(&mut self) {
        if let Some(f) = self.on_release.take() {
            f();
        }
    }

    fn lost_reason(&self) -> Option<String> {
        self.state.lost.lock().ok().and_then(|l| l.clone())
    }
}

impl Drop for RemoteLink {
    fn drop(&mut self) {
        // Never leave the tree behind: the agent kills it at once on
        // `force_kill`, and also when the connection closes.
        if !self.state.exited.load(Ordering::Acquire) {
            let _ = self.out.send(Msg::ForceKill);
        }
        if let Some(f) = self.on_release.take() {
            f();
        }
    }
}
