//! The seam between the driver and one running worker: [`WorkerLink`].
//!
//! The driver speaks the worker protocol and keeps the cell's rules
//! (markers, deadlines, escalation, settling); a link only moves things:
//! control frames in and out, the worker's two output byte streams, an
//! interrupt, a kill of the whole tree, the exit status and what the
//! tree used. [`local::LocalLink`] is today's local process (kernel init,
//! pidfd, pipes, output rings, cgroups); a remote worker is another
//! implementation of the same trait, and nothing above the link changes.

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use cellhost_protocol::frame::RingOffer;
use cellhost_protocol::{HostFrame, ProtocolError, WorkerFrame};
use cellhost_sandbox::cgroup::CgroupLimits;
use cellhost_sandbox::profile::LayerStatus;

#[cfg(test)]
pub(crate) mod fake;
pub mod local;

/// One of the worker's two output byte streams (its fd 1 and fd 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The worker's stdout.
    Stdout,
    /// The worker's stderr.
    Stderr,
}

impl Stream {
    /// Both streams, stdout first.
    pub const BOTH: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// 0 for stdout, 1 for stderr (the driver keeps per-stream state in
    /// two-element arrays).
    pub fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }

    /// `stdout` or `stderr`.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Something that happened on a link, in the order the link saw it.
#[derive(Debug)]
pub enum LinkEvent {
    /// A control frame from the worker (or from its init, `sandbox`).
    Frame(WorkerFrame),
    /// The control channel ended cleanly: no more frames.
    ControlClosed,
    /// The control channel broke (malformed or oversized frame, a frame
    /// cut in the middle, an I/O error): no more frames. The channel
    /// cannot be trusted after this.
    ControlError(ProtocolError),
    /// Raw bytes the worker's tree wrote to one stream (never empty).
    /// Hand the buffer back with [`WorkerLink::recycle`] once read.
    Output {
        /// Which stream.
        stream: Stream,
        /// The bytes, in order with everything else on that stream.
        bytes: Vec<u8>,
    },
    /// One output stream ended (every writer closed it, or the link
    /// stopped reading it): no more `Output` for it.
    OutputClosed(Stream),
    /// The worker's tree has ended with this status (at most once).
    Exited(ExitStatus),
}

/// What starting a link established before its worker runs: handed to
/// [`Kernel::attach`](crate::Kernel::attach) with the link. A link built
/// outside this crate (a remote worker) fills it from what the side that
/// started the worker reported (the node agent's own [`LocalLink`]).
///
/// [`LocalLink`]: local::LocalLink
#[derive(Debug, Clone)]
pub struct Launch {
    /// `session/generation`.
    pub label: String,
    /// A sandbox profile is active (the init reports its layers first).
    pub sandboxed: bool,
    /// Confinement layers applied by whoever started the init (cgroups),
    /// reported in `kernel.sandbox` next to the init's own.
    pub host_layers: Vec<LayerStatus>,
    /// Pid of the template the worker was forked from.
    pub template: Option<u32>,
    /// The limits in effect on the tree, when the link applies some.
    pub limits: Option<CgroupLimits>,
    /// Where the worker runs, for a worker on another node.
    pub placement: Option<crate::cell::KernelPlacement>,
}

/// What a link found out about its worker once the worker said `ready`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerIds {
    /// The worker's pid as the host sees it (pid namespaces translated).
    pub pid: u32,
    /// Pid of the process that supervises the worker's tree.
    pub init_pid: u32,
    /// Streams whose large writes come through a side channel of the link
    /// (the local link's shared-memory rings), by name.
    pub output_rings: Vec<String>,
    /// What a process checkpoint of this worker needs (a local kernel
    /// started cold; `None` for other links). Its `python_version` is
    /// filled in by the kernel.
    pub process: Option<local::criu::ProcessMeta>,
}

/// A connection to one running worker.
///
/// Contract:
/// * **Ordering.** [`next_event`](WorkerLink::next_event) returns events
///   of one source in the order they happened (frames in order, bytes of a
///   stream in order); events of different sources may interleave in any
///   order (the driver's end markers put output and frames back in order).
///   After `ControlClosed`/`ControlError` no frame comes; after
///   `OutputClosed(s)` no output of `s`; `Exited` comes at most once. When
///   nothing is left the future stays pending (it never busy-loops).
/// * **Cancellation.** `next_event` is cancel-safe: dropping its future
///   (it sits in a `select!`) loses no event and no byte. `send` is not
///   required to be: the driver always awaits it to the end.
/// * **Errors.** A link never panics on what the worker sends; a broken
///   control channel is an event (`ControlError`), a refused interrupt is
///   an `Err` with the reason, and [`send`](WorkerLink::send) fails with
///   the [`ProtocolError`] of the channel.
/// * **Kill.** [`terminate`](WorkerLink::terminate) asks for the whole
///   tree to end (it returns at once; `Exited` follows);
///   [`force_kill`](WorkerLink::force_kill) is the driver's last resort
///   when `Exited` did not come within its grace. Dropping a link whose
///   worker has not exited kills and reaps the tree.
pub trait WorkerLink: Send + 'static {
    /// The next event (see the trait's ordering and cancellation rules).
    fn next_event(&mut self) -> impl Future<Output = LinkEvent> + Send;

    /// Gives back the buffer of an [`LinkEvent::Output`] so that the next
    /// read needs no allocation (optional).
    fn recycle(&mut self, stream: Stream, buf: Vec<u8>) {
        let _ = (stream, buf);
    }

    /// Sends one control frame to the worker.
    ///
    /// # Errors
    /// The channel refused it ([`ProtocolError::Io`], usually the worker
    /// is gone).
    fn send(&mut self, frame: &HostFrame) -> impl Future<Output = Result<(), ProtocolError>> + Send;

    /// Called once, after the worker's `ready`: `pid` is the pid the worker
    /// reported (its own view), `rings` the side channels it offers.
    fn worker_ready(&mut self, pid: u32, rings: &[RingOffer]) -> WorkerIds;

    /// Wakes the worker's main thread for an interrupt (the local link:
    /// SIGINT to it). The `interrupt` frame, sent by the driver, is the
    /// authority; this only wakes code that sleeps or blocks.
    ///
    /// # Errors
    /// Why the wake-up was not delivered (the process is gone, …).
    fn interrupt(&mut self) -> Result<(), String>;

    /// After an [`interrupt`](WorkerLink::interrupt) that returned `Ok`:
    /// the delivery as reported by whoever sent the signal, when that is
    /// not this process (a remote kernel's node agent runs `tgkill` on its
    /// node and reports the result). `None` (the default): `interrupt`'s
    /// own result is the delivery. A link bounds its own wait.
    fn interrupt_delivery(&mut self) -> impl Future<Output = Option<Result<(), String>>> + Send {
        std::future::ready(None)
    }

    /// Where [`interrupt`](WorkerLink::interrupt) goes, as reported to the
    /// caller (`pid/tid` for the local link).
    fn interrupt_target(&self) -> String;

    /// Asks the supervisor to kill and reap the worker's whole tree;
    /// returns at once.
    fn terminate(&mut self);

    /// Kills whatever of the tree is left, without the supervisor's help.
    fn force_kill(&mut self);

    /// Stops reading both output streams (the driver drained them long
    /// enough after the exit); `OutputClosed` need not follow.
    fn close_output(&mut self);

    /// A cell starts; `nonce` is its marker's random part. Returns whether
    /// the worker may use the link's output side channels for this cell.
    fn begin_cell(&mut self, nonce: &str) -> bool {
        let _ = nonce;
        false
    }

    /// Passes bytes of the running cell (between its markers) to `sink`,
    /// with any side-channel references among them replaced by the bytes
    /// they stand for. Default: the bytes as they are.
    fn cell_output(&mut self, stream: Stream, bytes: &[u8], sink: &mut dyn FnMut(&[u8])) {
        let _ = stream;
        sink(bytes);
    }

    /// Passes on what [`cell_output`](WorkerLink::cell_output) still holds
    /// for the running cell (a reference cut at the end of a read).
    fn flush_cell_output(&mut self, stream: Stream, sink: &mut dyn FnMut(&[u8])) {
        let _ = (stream, sink);
    }

    /// The tree's resource accounting, when the link keeps one.
    fn usage(&self) -> Option<&dyn TreeUsage> {
        None
    }

    /// The worker is gone for good: release what the link holds for it
    /// (the local link removes its cgroups).
    fn release(&mut self) {}

    /// Why the link lost its worker without an exit status of the worker's
    /// own, e.g. `connection lost` for a remote worker whose connection
    /// broke (its `Exited` is then synthetic). `None` (the default): the
    /// exit status is the worker's.
    fn lost_reason(&self) -> Option<String> {
        None
    }
}

/// Resource accounting of a worker's tree (the local link: its cgroups).
pub trait TreeUsage: Send + Sync {
    /// Times the tree hit its process limit so far.
    fn pids_limit_hits(&self) -> u64;
    /// The tree's process limit, if any.
    fn pids_max(&self) -> Option<u64>;
    /// Processes killed by the out-of-memory killer in the tree.
    fn oom_kills(&self) -> u64;
    /// Processes in the tree now (its supervisor and the worker included).
    fn processes(&self) -> usize;
}

/// `exited with code 1` / `was killed by SIGSEGV (signal 11)`.
pub(crate) fn describe_exit(st: ExitStatus) -> String {
    if let Some(code) = st.code() {
        format!("exited with code {code}")
    } else if let Some(sig) = st.signal() {
        format!(
            "was killed by {} (signal {sig})",
            cellhost_sandbox::signal::signal_name(sig)
        )
    } else {
        "ended".into()
    }
}
