//! A scripted, in-memory [`WorkerLink`] for the driver's tests: the test
//! feeds the frames and output bytes a worker would send and reads the
//! frames the driver sends; no process is involved.

use std::collections::VecDeque;
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cellhost_protocol::frame::RingOffer;
use cellhost_protocol::{HostFrame, ProtocolError};
use tokio::sync::{mpsc, watch};

use super::{LinkEvent, Stream, WorkerIds, WorkerLink};

/// The worker side of a [`FakeLink`], held by the test.
pub(crate) struct Script {
    events: mpsc::UnboundedSender<LinkEvent>,
    sent: mpsc::UnboundedReceiver<HostFrame>,
    consumed: watch::Receiver<usize>,
    pushed: usize,
    /// Times the driver asked for the tree to be killed.
    pub(crate) terminations: Arc<AtomicUsize>,
    /// Times the driver sent the interrupt's wake-up (a signal).
    pub(crate) wakeups: Arc<AtomicUsize>,
}

impl Script {
    /// Queues one event for the driver.
    pub(crate) fn push(&mut self, ev: LinkEvent) {
        self.pushed += 1;
        self.events.send(ev).expect("the fake link is gone");
    }

    /// Queues raw bytes on one stream.
    pub(crate) fn output(&mut self, stream: Stream, bytes: impl Into<Vec<u8>>) {
        self.push(LinkEvent::Output {
            stream,
            bytes: bytes.into(),
        });
    }

    /// Waits until the driver has taken every queued event (it handles an
    /// event before it takes the next command).
    pub(crate) async fn drained(&mut self) {
        let pushed = self.pushed;
        self.consumed
            .wait_for(|n| *n >= pushed)
            .await
            .expect("the fake link is gone");
    }

    /// The next frame the driver sent.
    pub(crate) async fn sent(&mut self) -> HostFrame {
        self.sent.recv().await.expect("the driver sent nothing more")
    }
}

/// An in-memory link driven by a [`Script`].
pub(crate) struct FakeLink {
    events: mpsc::UnboundedReceiver<LinkEvent>,
    sent: mpsc::UnboundedSender<HostFrame>,
    consumed: watch::Sender<usize>,
    /// Events the link makes itself (a kill ends everything).
    own: VecDeque<LinkEvent>,
    interrupt: Result<(), String>,
    /// The status the tree ends with when the driver kills it.
    killed_with: ExitStatus,
    terminations: Arc<AtomicUsize>,
    wakeups: Arc<AtomicUsize>,
    exited: bool,
}

impl FakeLink {
    /// A link whose interrupts answer `interrupt` and whose tree, when
    /// killed, closes everything and exits with `killed_with`.
    pub(crate) fn new(interrupt: Result<(), String>, killed_with: ExitStatus) -> (FakeLink, Script) {
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let (sent_tx, sent_rx) = mpsc::unbounded_channel();
        let (consumed_tx, consumed_rx) = watch::channel(0);
        let terminations = Arc::new(AtomicUsize::new(0));
        let wakeups = Arc::new(AtomicUsize::new(0));
        (
            FakeLink {
                events: ev_rx,
                sent: sent_tx,
                consumed: consumed_tx,
                own: VecDeque::new(),
                interrupt,
                killed_with,
                terminations: terminations.clone(),
                wakeups: wakeups.clone(),
                exited: false,
            },
            Script {
                events: ev_tx,
                sent: sent_rx,
                consumed: consumed_rx,
                pushed: 0,
                terminations,
                wakeups,
            },
        )
    }

    fn kill(&mut self) {
        if self.exited {
            return;
        }
        self.exited = true;
        self.own.extend([
            LinkEvent::ControlClosed,
            LinkEvent::OutputClosed(Stream::Stdout),
            LinkEvent::OutputClosed(Stream::Stderr),
            LinkEvent::Exited(self.killed_with),
        ]);
    }
}

impl WorkerLink for FakeLink {
    async fn next_event(&mut self) -> LinkEvent {
        if let Some(ev) = self.own.pop_front() {
            return ev;
        }
        match self.events.recv().await {
            Some(ev) => {
                if matches!(ev, LinkEvent::Exited(_)) {
                    self.exited = true;
                }
                self.consumed.send_modify(|n| *n += 1);
                ev
            }
            None => std::future::pending().await,
        }
    }

    async fn send(&mut self, frame: &HostFrame) -> Result<(), ProtocolError> {
        self.sent
            .send(frame.clone())
            .map_err(|_| ProtocolError::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe)))
    }

    fn worker_ready(&mut self, pid: u32, _rings: &[RingOffer]) -> WorkerIds {
        WorkerIds {
            pid,
            init_pid: 0,
            output_rings: Vec::new(),
            process: None,
        }
    }

    fn interrupt(&mut self) -> Result<(), String> {
        self.wakeups.fetch_add(1, Ordering::SeqCst);
        self.interrupt.clone()
    }

    fn interrupt_target(&self) -> String {
        "fake".into()
    }

    fn terminate(&mut self) {
        self.terminations.fetch_add(1, Ordering::SeqCst);
        self.kill();
    }

    fn force_kill(&mut self) {
        self.kill();
    }

    fn close_output(&mut self) {}
}
