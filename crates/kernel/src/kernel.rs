//! The handle of one kernel (one worker incarnation): a channel to its
//! driver task and the facts the handshake established.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::cell::new_cell_id;
pub use crate::cell::{
    CellProgress, ExecOptions, InterruptOutcome, KernelInfo, KernelPlacement, LiveEvent, PlacementStart,
    Variables,
};
use crate::config::KernelConfig;
use crate::driver::{Command, Driver, QueuedCell, Shared};
use crate::error::KernelError;
use crate::handshake;
use crate::link::local::LocalLink;
use crate::link::local::criu::{self, ProcessMeta};
use crate::link::{Launch, WorkerLink};
use crate::result::CellResult;

struct Inner {
    tx: mpsc::UnboundedSender<Command>,
    info: KernelInfo,
    shared: Arc<Mutex<Shared>>,
    label: String,
    /// What a process checkpoint needs (a local kernel that can be dumped).
    process: Option<ProcessMeta>,
}

/// One running kernel. Cloning gives another handle to the same kernel;
/// when the last handle is dropped the kernel's whole process tree is killed
/// and reaped.
#[derive(Clone)]
pub struct Kernel {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("info", &self.inner.info)
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// Starts a kernel (a local worker process under a kernel init, with
    /// the configuration's runtime) and waits for the worker's `ready`.
    ///
    /// # Errors
    /// [`KernelError::Spawn`] (interpreter missing or dying at start, with its
    /// stderr), [`KernelError::StartupTimeout`], [`KernelError::ProtocolMismatch`],
    /// [`KernelError::SandboxUnavailable`], [`KernelError::Io`].
    ///
    /// With [`KernelConfig::starter`] set, the starter starts the worker
    /// (on another node) instead.
    pub async fn spawn(config: KernelConfig) -> Result<Kernel, KernelError> {
        if let Some(starter) = config.starter.clone() {
            let mut config = config;
            config.starter = None;
            return starter.start(config).await;
        }
        let (link, launch) = LocalLink::spawn(&config).await?;
        Kernel::attach(config, link, launch).await
    }

    /// Completes a kernel over `link`, whose worker runs: the handshake
    /// (`sandbox`, then `ready`), then the driver task. A failed handshake
    /// drops the link (which kills the worker's tree).
    ///
    /// The seam for links built outside this crate (a remote worker's):
    /// `launch` says what started the worker established (its sandbox
    /// layers, limits, where it runs); everything above the link (cells,
    /// deadlines, interrupts, escalation, results) is the same as for a
    /// local worker. Must run inside a Tokio runtime (the driver is a task).
    ///
    /// # Errors
    /// As [`Kernel::spawn`] after the start: [`KernelError::StartupTimeout`],
    /// [`KernelError::Spawn`] (the worker died first),
    /// [`KernelError::ProtocolMismatch`], [`KernelError::SandboxUnavailable`].
    pub async fn attach<L: WorkerLink>(
        config: KernelConfig,
        mut link: L,
        launch: Launch,
    ) -> Result<Kernel, KernelError> {
        let began = std::time::Instant::now();
        let ready = handshake::handshake(&mut link, &config, &launch).await?;
        let mut placement = launch.placement.clone();
        if let Some(start) = placement.as_mut().and_then(|p| p.start.as_mut()) {
            start.add_handshake(began.elapsed());
        }
        let ids = link.worker_ready(ready.pid, &ready.rings);
        let process = ids.process.clone().map(|mut m| {
            m.python_version = ready.version.clone();
            m
        });
        let info = KernelInfo {
            output_rings: ids.output_rings,
            session: config.session.clone(),
            generation: config.generation,
            pid: ids.pid,
            init_pid: ids.init_pid,
            python: config.python.clone(),
            python_version: ready.version,
            sandbox: ready.sandbox,
            template: launch.template,
            placement,
        };
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (tx, rx) = mpsc::unbounded_channel();
        // The driver names the limits in effect (the profile's defaults
        // included) when it explains a kill.
        let mut config = config;
        if let Some(limits) = launch.limits {
            config.limits = limits;
        }
        let driver = Driver::new(config, link, rx, shared.clone(), info.clone(), ready.early);
        tokio::spawn(driver.run());
        Ok(Kernel {
            inner: Arc::new(Inner {
                tx,
                info,
                shared,
                label: launch.label,
                process,
            }),
        })
    }

    /// Takes back a kernel a process checkpoint dumped into `dir`
    /// ([`Kernel::dump_process`]): `criu restore` brings its whole tree back
    /// (memory, threads, open files, the execution count) as a new child of
    /// this host, with fresh channels; `config` (the session's next
    /// generation, no sandbox, no cgroup limits) describes the kernel.
    ///
    /// # Errors
    /// [`KernelError::Spawn`] when CRIU cannot restore the image (its log's
    /// error lines); [`KernelError::InvalidRequest`] for a configuration
    /// with a sandbox or limits; as [`Kernel::attach`].
    pub async fn restore_process(config: KernelConfig, dir: &std::path::Path) -> Result<Kernel, KernelError> {
        let (link, launch) = LocalLink::restore(&config, dir).await?;
        Kernel::attach(config, link, launch).await
    }

    /// Why this kernel cannot be dumped by a process checkpoint (`None`:
    /// it can): a remote kernel, one forked from a template, or one with
    /// sandbox layers.
    pub fn process_checkpoint_refusal(&self) -> Option<String> {
        if self.inner.process.is_some() {
            return None;
        }
        let info = &self.inner.info;
        Some(if info.placement.is_some() {
            "process checkpoints are taken of local kernels only".into()
        } else if info.template.is_some() {
            "the kernel was forked from a template; process checkpoints are taken of kernels started cold"
                .into()
        } else if let Some(l) = info.sandbox.layers.iter().find(|l| l.enforced) {
            format!(
                "the kernel runs in a sandbox ({} and more); CRIU cannot restore its confinement exactly",
                l.name
            )
        } else {
            "the kernel's channels to the host could not be named for a checkpoint".into()
        })
    }

    /// Dumps this kernel's whole process tree (its init as the root) into
    /// `dir`, an empty directory, with CRIU. With `leave_running` the
    /// kernel goes on; otherwise CRIU kills the tree once the image is
    /// complete (a pause). The caller makes sure no cell runs.
    ///
    /// # Errors
    /// [`Kernel::process_checkpoint_refusal`]'s reason, or CRIU's error
    /// lines when the dump fails (the kernel keeps running with
    /// `leave_running`).
    pub async fn dump_process(
        &self,
        dir: &std::path::Path,
        leave_running: bool,
        timeout: Duration,
    ) -> Result<(), String> {
        let Some(meta) = &self.inner.process else {
            return Err(self.process_checkpoint_refusal().unwrap_or_default());
        };
        if !self.is_alive() {
            return Err(format!("kernel {} is not running", self.inner.label));
        }
        criu::dump(meta, dir, leave_running, timeout).await
    }

    /// Facts about this kernel.
    pub fn info(&self) -> &KernelInfo {
        &self.inner.info
    }

    /// `session/generation`.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// The worker process is alive.
    pub fn is_alive(&self) -> bool {
        self.inner
            .shared
            .lock()
            .map(|s| s.exit.is_none())
            .unwrap_or(false)
    }

    /// A cell is running or queued.
    pub fn is_busy(&self) -> bool {
        self.inner
            .shared
            .lock()
            .map(|s| s.running.is_some() || s.queued > 0)
            .unwrap_or(false)
    }

    /// Cells submitted and not yet taken by the worker (waiting behind the
    /// running one, or not yet sent).
    pub fn queued(&self) -> usize {
        self.inner.shared.lock().map(|s| s.queued).unwrap_or(0)
    }

    /// Cells this kernel has settled.
    pub fn cells_settled(&self) -> u64 {
        self.inner.shared.lock().map(|s| s.cells_settled).unwrap_or(0)
    }

    /// How the worker died, if it did.
    pub fn exit_reason(&self) -> Option<String> {
        self.inner.shared.lock().ok().and_then(|s| s.exit.clone())
    }

    /// Starts a cell without waiting for it. Cells run one at a time, in
    /// submission order.
    ///
    /// # Errors
    /// [`KernelError::KernelBusy`] with `fail_if_busy` while another cell
    /// runs or waits; [`KernelError::Dead`] when the worker is gone.
    pub fn submit(&self, code: impl Into<String>, options: ExecOptions) -> Result<CellHandle, KernelError> {
        {
            let shared = self
                .inner
                .shared
                .lock()
                .map_err(|_| self.dead("state lock poisoned"))?;
            if let Some(reason) = &shared.exit {
                // Not `self.dead()`: it would take the lock held here.
                return Err(KernelError::Dead {
                    kernel: self.inner.label.clone(),
                    reason: reason.clone(),
                });
            }
            if options.fail_if_busy
                && let Some(cell) = shared
                    .running
                    .clone()
                    .or_else(|| (shared.queued > 0).then(|| "queued".into()))
            {
                return Err(KernelError::KernelBusy {
                    kernel: self.inner.label.clone(),
                    cell,
                });
            }
        }
        let id = new_cell_id();
        let (reply, rx) = oneshot::channel();
        let cell = QueuedCell {
            id: id.clone(),
            code: code.into(),
            options,
            submitted: Instant::now(),
            reply,
        };
        if let Ok(mut s) = self.inner.shared.lock() {
            s.queued += 1;
        }
        self.inner
            .tx
            .send(Command::Execute(Box::new(cell)))
            .map_err(|_| self.dead("driver stopped"))?;
        Ok(CellHandle {
            id,
            kernel: self.clone(),
            rx: Some(rx),
            done: None,
        })
    }

    /// Runs a cell and waits for its result.
    ///
    /// # Errors
    /// As [`Kernel::submit`]; [`KernelError::Dead`] when the worker died
    /// before the cell started, [`KernelError::Protocol`] on a broken frame.
    /// A cell that crashes the worker is a *result* (status `crashed`).
    pub async fn execute(
        &self,
        code: impl Into<String>,
        options: ExecOptions,
    ) -> Result<CellResult, KernelError> {
        self.submit(code, options)?.wait().await
    }

    /// Interrupts the running cell (SIGINT to the worker's main thread, then
    /// escalation to a kill of the whole tree after the grace).
    pub async fn interrupt(&self) -> InterruptOutcome {
        self.interrupt_cell(None).await
    }

    pub(crate) async fn interrupt_cell(&self, cell: Option<String>) -> InterruptOutcome {
        let (reply, rx) = oneshot::channel();
        if self.inner.tx.send(Command::Interrupt { cell, reply }).is_err() {
            return InterruptOutcome {
                delivered: false,
                target: None,
                cell: None,
                reason: Some("kernel is dead".into()),
            };
        }
        rx.await.unwrap_or(InterruptOutcome {
            delivered: false,
            target: None,
            cell: None,
            reason: Some("kernel is dead".into()),
        })
    }

    /// Lists the user namespace: `limit` 1..=500 entries, idle kernels only.
    ///
    /// # Errors
    /// [`KernelError::InvalidRequest`] for a limit out of range,
    /// [`KernelError::KernelBusy`] while a cell runs (answered at once: a
    /// busy worker is never asked), [`KernelError::Dead`].
    pub async fn inspect_variables(&self, limit: u32) -> Result<Variables, KernelError> {
        if !(1..=500).contains(&limit) {
            return Err(KernelError::InvalidRequest(format!(
                "limit must be 1..=500, got {limit}"
            )));
        }
        let (reply, rx) = oneshot::channel();
        self.inner
            .tx
            .send(Command::Inspect { limit, reply })
            .map_err(|_| self.dead("driver stopped"))?;
        rx.await.map_err(|_| self.dead("driver stopped"))?
    }

    /// Kills the whole process tree and waits until it is reaped. Cells
    /// still running settle as `crashed`; queued ones fail with `Dead`.
    pub async fn kill(&self) {
        let (reply, rx) = oneshot::channel();
        if self.inner.tx.send(Command::Kill { reply }).is_ok() {
            let _ = rx.await;
        }
    }

    pub(crate) async fn peek(&self, cell: &str) -> Option<CellProgress> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .tx
            .send(Command::Peek {
                cell: cell.to_string(),
                reply,
            })
            .ok()?;
        rx.await.ok().flatten()
    }

    fn dead(&self, reason: &str) -> KernelError {
        let reason = self.exit_reason().unwrap_or_else(|| reason.to_string());
        KernelError::Dead {
            kernel: self.inner.label.clone(),
            reason,
        }
    }
}

/// A submitted cell.
pub struct CellHandle {
    id: String,
    kernel: Kernel,
    rx: Option<oneshot::Receiver<Result<CellResult, KernelError>>>,
    done: Option<Result<CellResult, KernelError>>,
}

impl std::fmt::Debug for CellHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellHandle")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl CellHandle {
    /// The cell's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Waits for the result.
    ///
    /// # Errors
    /// As [`Kernel::execute`].
    pub async fn wait(mut self) -> Result<CellResult, KernelError> {
        if let Some(done) = self.done.take() {
            return done;
        }
        let Some(rx) = self.rx.take() else {
            return Err(self.kernel.dead("result already taken"));
        };
        rx.await
            .unwrap_or_else(|_| Err(self.kernel.dead("driver stopped")))
    }

    /// Waits at most `timeout`; `None` if the cell has not settled by then
    /// (the handle stays usable).
    pub async fn wait_timeout(&mut self, timeout: Duration) -> Option<&Result<CellResult, KernelError>> {
        if self.done.is_none() {
            let rx = self.rx.as_mut()?;
            let got = tokio::time::timeout(timeout, rx).await.ok()?;
            self.rx = None;
            self.done = Some(got.unwrap_or_else(|_| Err(self.kernel.dead("driver stopped"))));
        }
        self.done.as_ref()
    }

    /// Status and output so far.
    pub async fn peek(&self) -> Option<CellProgress> {
        if self.done.is_some() {
            return Some(CellProgress {
                cell_id: self.id.clone(),
                state: "settled".into(),
                stdout_tail: String::new(),
                stderr_tail: String::new(),
                elapsed_ms: 0,
            });
        }
        self.kernel.peek(&self.id).await
    }

    /// Interrupts this cell (a no-op report if it is not running).
    pub async fn interrupt(&self) -> InterruptOutcome {
        self.kernel.interrupt_cell(Some(self.id.clone())).await
    }
}
