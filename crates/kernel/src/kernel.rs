//! The handle of one kernel (one worker process incarnation).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellhost_protocol::{FrameReader, FrameWriter, PROTOCOL_VERSION, WorkerFrame};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

use crate::config::KernelConfig;
use crate::driver::{Command, Driver, QueuedCell, Shared};
use crate::error::KernelError;
use crate::init_proc::InitProc;
use crate::result::{CellResult, DisplayOutput};
use crate::{spawn, worker_files};
use cellhost_sandbox::cgroup::{CgroupLimits, KernelCgroup};
use cellhost_sandbox::profile::{
    InitSpec, LaunchSpec, LayerStatus, SandboxMode, SandboxStatus, interpreter_dirs,
};

/// Options of one cell.
#[derive(Debug, Default, Clone)]
pub struct ExecOptions {
    /// Deadline of this cell: `None` uses the kernel's default
    /// ([`KernelConfig::cell_timeout`]); `Some(Duration::ZERO)` means none.
    /// The deadline counts from the moment the cell starts running (a queued
    /// cell's wait does not count).
    pub timeout: Option<Duration>,
    /// Jupyter's `silent`: do not bump `execution_count`.
    pub silent: bool,
    /// Fail at once with [`KernelError::KernelBusy`] instead of queueing
    /// behind a running cell.
    pub fail_if_busy: bool,
    /// Receives rendered, redacted output while the cell runs.
    pub live: Option<mpsc::UnboundedSender<LiveEvent>>,
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

/// The answer of [`Kernel::inspect_variables`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variables {
    /// One object per variable: `name`, `type`, and where known `len`,
    /// `shape`, `dtype`, `size_bytes`, `preview`.
    pub variables: Vec<Value>,
    /// More variables existed than the limit.
    pub truncated: bool,
}

/// State of a cell seen through [`CellHandle::peek`].
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
    /// Host-side pid of the Python worker (its main thread's tid too).
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
    /// Host pid of the template this kernel was forked from (`None`: a
    /// cold start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<u32>,
}

struct Inner {
    tx: mpsc::UnboundedSender<Command>,
    info: KernelInfo,
    shared: Arc<Mutex<Shared>>,
    label: String,
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

static CELL_SEQ: AtomicU64 = AtomicU64::new(1);

fn new_cell_id() -> String {
    let mut r = [0u8; 4];
    let _ = getrandom::fill(&mut r);
    format!(
        "c{}-{:08x}",
        CELL_SEQ.fetch_add(1, Ordering::Relaxed),
        u32::from_le_bytes(r)
    )
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect()
}

/// The boot line given to `python -c`: puts the worker package on `sys.path`
/// and runs it without binding any name in `__main__`.
const BOOT: &str = "__import__('sys').path.append(__import__('sys').argv.pop(1));__import__('cellhost_worker.main').main.run()";

impl Kernel {
    /// Starts a kernel and waits for the worker's `ready`.
    ///
    /// # Errors
    /// [`KernelError::Spawn`] (interpreter missing or dying at start, with its
    /// stderr), [`KernelError::StartupTimeout`], [`KernelError::ProtocolMismatch`],
    /// [`KernelError::Io`].
    pub async fn spawn(config: KernelConfig) -> Result<Kernel, KernelError> {
        let prep = Prepared::new(&config)?;
        let label = prep.label.clone();
        let (host_end, worker_end) =
            std::os::unix::net::UnixStream::pair().map_err(|e| KernelError::io(&label, "socketpair", e))?;
        let launcher = config.launcher_path()?;
        let launch = LaunchSpec {
            host_pid: std::process::id() as i32,
            cgroup_procs: prep.cgroup.iter().flat_map(KernelCgroup::procs_files).collect(),
            sandbox: prep.spec.clone(),
            program: vec![
                config.python.display().to_string(),
                "-c".to_string(),
                BOOT.to_string(),
                prep.worker_dir.display().to_string(),
            ],
            env: spawn::env_strings(&worker_env(&config, prep.spec.is_some())),
            keep_tree: false,
        };
        let mut cmd = spawn::init_command(&launcher, OwnedFd::from(worker_end));
        if let Some(cwd) = &config.cwd {
            cmd.current_dir(cwd);
        }
        let mut child = spawn::spawn(cmd).await.map_err(|e| KernelError::Spawn {
            python: config.python.display().to_string(),
            reason: format!("cannot start the kernel init {}: {e}", launcher.display()),
        })?;
        if let Err(e) = spawn::write_launch(&host_end, &launch, Some(&worker_config(&config))) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(KernelError::io(&label, "launch message", e));
        }
        let stdout = child.stdout.take().map(OwnedFd::from);
        let stderr = child.stderr.take().map(OwnedFd::from);
        let init = InitProc::Child(child);
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            let mut guard = InitGuard(Some(init));
            guard.kill();
            return Err(KernelError::io(
                &label,
                "output pipes",
                std::io::Error::other("missing"),
            ));
        };
        Kernel::attach(config, prep, init, host_end, stdout, stderr).await
    }

    /// Completes a kernel whose init runs: the handshake (`sandbox`, then
    /// `ready`), then the driver.
    pub(crate) async fn attach(
        config: KernelConfig,
        prep: Prepared,
        init: InitProc,
        host_end: std::os::unix::net::UnixStream,
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) -> Result<Kernel, KernelError> {
        let Prepared {
            label,
            host_layers,
            limits,
            cgroup,
            spec,
            template,
            ..
        } = prep;
        let mode = config.sandbox.mode;
        let sandboxed = spec.is_some();
        let init_pid = init.id();
        let forked = matches!(init, InitProc::Adopted { .. });
        let mut guard = InitGuard(Some(init));
        let python_str = config.python.display().to_string();
        let io_err = |ctx: &str, e: std::io::Error| KernelError::io(&label, ctx, e);
        let stdout = pipe::Receiver::from_owned_fd(stdout).map_err(|e| io_err("stdout pipe", e))?;
        let stderr = pipe::Receiver::from_owned_fd(stderr).map_err(|e| io_err("stderr pipe", e))?;
        host_end
            .set_nonblocking(true)
            .map_err(|e| io_err("control socket", e))?;
        let ctl = tokio::net::UnixStream::from_std(host_end).map_err(|e| io_err("control socket", e))?;
        let pidfd = crate::init_proc::pidfd_of(init_pid).map_err(|e| io_err("pidfd_open", e))?;
        // `AsyncFd::new` is deprecated because an arbitrary `AsRawFd` may close
        // its fd early; an `OwnedFd` keeps it open for the AsyncFd's whole
        // life, which is exactly the condition `register` asks for.
        #[allow(deprecated)]
        let pidfd = AsyncFd::new(pidfd).map_err(|e| io_err("pidfd", e))?;
        let (rd, wr) = ctl.into_split();
        let mut reader = FrameReader::new(rd);
        let writer = FrameWriter::new(wr);

        // Handshake: the first frame must be `ready`; the init dying first
        // means the interpreter could not run.
        let mut stderr_early = Vec::new();
        let mut stderr_rx = stderr;
        let mut sandbox_frame: Option<Vec<cellhost_protocol::SandboxLayer>> = None;
        let ready = tokio::time::timeout(config.startup_timeout, async {
            let mut buf = vec![0u8; 8192];
            loop {
                tokio::select! {
                    f = reader.next::<WorkerFrame>() => match f {
                        // The kernel init's report comes before `ready`.
                        Ok(Some(WorkerFrame::Sandbox { layers, .. })) if sandboxed => {
                            sandbox_frame = Some(layers);
                        }
                        // A worker that died without reading its configuration
                        // message resets the socket: it is gone, as at EOF.
                        Err(cellhost_protocol::ProtocolError::Io(e))
                            if e.kind() == std::io::ErrorKind::ConnectionReset =>
                        {
                            return Ok(Ok(None));
                        }
                        f => return Ok(f),
                    },
                    n = tokio::io::AsyncReadExt::read(&mut stderr_rx, &mut buf) => match n {
                        Ok(n) if n > 0 && stderr_early.len() < 65536 => stderr_early.extend_from_slice(&buf[..n]),
                        Ok(0) | Err(_) => {
                            // Worker tree gone: wait for the init to report.
                            let _ = pidfd.readable().await;
                            return Err(());
                        }
                        Ok(_) => {}
                    },
                    _ = pidfd.readable() => return Err(()),
                }
            }
        })
        .await;
        if matches!(ready, Ok(Err(())) | Ok(Ok(Ok(None)))) && sandboxed && sandbox_frame.is_none() {
            // The init may have reported its layers and then refused to go
            // on (enforce): the report is still in the socket.
            let _ = tokio::time::timeout(Duration::from_millis(300), async {
                while let Ok(Some(f)) = reader.next::<WorkerFrame>().await {
                    if let WorkerFrame::Sandbox { layers, .. } = f {
                        sandbox_frame = Some(layers);
                        break;
                    }
                }
            })
            .await;
        }
        if matches!(ready, Ok(Err(())) | Ok(Ok(Ok(None)))) {
            // The worker is gone: its last words may still sit in the pipe.
            let _ = tokio::time::timeout(Duration::from_millis(500), async {
                let mut buf = vec![0u8; 8192];
                while let Ok(n) = tokio::io::AsyncReadExt::read(&mut stderr_rx, &mut buf).await {
                    if n == 0 || stderr_early.len() >= 65536 {
                        break;
                    }
                    stderr_early.extend_from_slice(&buf[..n]);
                }
            })
            .await;
        }
        let early = || cellhost_capture::render_once(&stderr_early).trim().to_string();
        let mut sandbox = SandboxStatus::off();
        if sandboxed {
            sandbox.mode = mode;
            sandbox.layers.push(LayerStatus::on(
                "env",
                "environment by allowlist; secret-looking names withheld",
            ));
            match sandbox_frame {
                Some(layers) => sandbox.layers.extend(layers.into_iter().map(|l| LayerStatus {
                    name: l.name,
                    enforced: l.enforced,
                    detail: l.detail,
                    optional: l.optional,
                })),
                None => sandbox.layers.push(LayerStatus::missing(
                    "init",
                    "the kernel init reported no sandbox layers",
                )),
            }
            sandbox.layers.extend(host_layers);
            let reported = sandbox.layer("init").is_none();
            if mode == SandboxMode::Enforce
                && (reported || matches!(ready, Ok(Ok(Ok(Some(WorkerFrame::Ready { .. }))))))
                && let Some(l) = sandbox.missing().next()
            {
                return Err(KernelError::SandboxUnavailable {
                    kernel: label,
                    layer: l.name.clone(),
                    reason: l.detail.clone(),
                });
            }
        }
        let (pid, python_version, ring_offers) = match ready {
            Err(_) => {
                return Err(KernelError::StartupTimeout {
                    kernel: label,
                    timeout_ms: config.startup_timeout.as_millis() as u64,
                });
            }
            Ok(Err(())) | Ok(Ok(Ok(None))) => {
                let status = guard.wait_briefly();
                return Err(KernelError::Spawn {
                    python: python_str,
                    reason: format!("the worker exited before it was ready ({status}): {}", early()),
                });
            }
            Ok(Ok(Err(e))) => {
                return Err(KernelError::Protocol {
                    kernel: label,
                    source: e,
                });
            }
            Ok(Ok(Ok(Some(WorkerFrame::Ready {
                pid,
                python,
                protocol,
                rings,
                ..
            })))) => {
                if protocol != PROTOCOL_VERSION {
                    return Err(KernelError::ProtocolMismatch {
                        kernel: label,
                        worker: protocol,
                        host: PROTOCOL_VERSION,
                    });
                }
                (pid, python, rings)
            }
            Ok(Ok(Ok(Some(other)))) => {
                return Err(KernelError::Spawn {
                    python: python_str,
                    reason: format!("the worker's first frame was `{}`, not `ready`", other.kind()),
                });
            }
        };
        // The worker's own pid is the host pid unless it runs in a pid
        // namespace; the init's only child is authoritative.
        // In a sandbox the worker is pid 2 of its own pid namespace, below an
        // ns-init: find it by its namespace pid.
        let host_pid = (sandboxed || forked)
            .then(|| cellhost_sandbox::procfs::host_pid_of(init_pid as i32, pid as i32))
            .flatten()
            .map(|p| p as u32)
            .or_else(|| {
                cellhost_sandbox::procfs::children(init_pid as i32)
                    .first()
                    .map(|p| *p as u32)
            })
            .unwrap_or(pid);
        let rings = open_rings(host_pid, &ring_offers, &label);
        let output_rings = ["stdout", "stderr"]
            .iter()
            .zip(&rings)
            .filter(|(_, r)| r.is_some())
            .map(|(n, _)| n.to_string())
            .collect();
        let info = KernelInfo {
            output_rings,
            session: config.session.clone(),
            generation: config.generation,
            pid: host_pid,
            init_pid,
            python: config.python.clone(),
            python_version,
            sandbox,
            template,
        };
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (tx, rx) = mpsc::unbounded_channel();
        let Some(init) = guard.0.take() else {
            return Err(io_err("init", std::io::Error::other("lost")));
        };
        // The driver names the limits in effect (the profile's defaults
        // included) when it explains a kill.
        let mut config = config;
        if cgroup.is_some() {
            config.limits = limits;
        }
        let driver = Driver::new(
            config,
            init,
            pidfd,
            reader,
            writer,
            stdout,
            stderr_rx,
            rx,
            shared.clone(),
            info.clone(),
            stderr_early,
            cgroup,
            rings,
        );
        tokio::spawn(driver.run());
        Ok(Kernel {
            inner: Arc::new(Inner {
                tx,
                info,
                shared,
                label,
            }),
        })
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

/// What a kernel needs before its processes start: the worker package, the
/// session directory, the cgroup with the limits in effect, and the sandbox
/// spec (`None` with the sandbox off).
pub(crate) struct Prepared {
    pub(crate) label: String,
    pub(crate) worker_dir: &'static std::path::Path,
    pub(crate) host_layers: Vec<LayerStatus>,
    pub(crate) limits: CgroupLimits,
    pub(crate) cgroup: Option<KernelCgroup>,
    pub(crate) spec: Option<InitSpec>,
    /// Pid of the template forking this kernel.
    pub(crate) template: Option<u32>,
}

impl Prepared {
    /// # Errors
    /// [`KernelError::Io`] (worker package, session directory),
    /// [`KernelError::SandboxUnavailable`] (enforce without cgroups),
    /// [`KernelError::Spawn`] (configured limits that cannot be set up).
    pub(crate) fn new(config: &KernelConfig) -> Result<Prepared, KernelError> {
        let label = config.label();
        let worker_dir = worker_files::worker_path()
            .map_err(|e| KernelError::io(&label, "writing the worker package", e))?;
        std::fs::create_dir_all(&config.session_dir)
            .map_err(|e| KernelError::io(&label, format!("creating {}", config.session_dir.display()), e))?;
        let cells = config.session_dir.join(CELLS_DIR);
        host_only_dir(&cells)
            .map_err(|e| KernelError::io(&label, format!("creating {}", cells.display()), e))?;
        let mode = config.sandbox.mode;
        let sandboxed = mode != SandboxMode::Off;
        let mut host_layers: Vec<LayerStatus> = Vec::new();
        let mut limits = config.limits.clone();
        let cgroup_off = sandboxed && config.sandbox.disable.iter().any(|d| d == "cgroup");
        if sandboxed && !cgroup_off {
            let d = &config.sandbox.limits;
            limits.pids_max = limits.pids_max.or(d.pids_max);
            limits.memory_bytes = limits.memory_bytes.or(d.memory_bytes);
            limits.cpu_cores = limits.cpu_cores.or(d.cpu_cores);
        }
        let cgroup = if limits.is_empty() {
            if cgroup_off {
                host_layers.push(LayerStatus::missing("cgroup", "disabled by the sandbox profile"));
            } else if sandboxed {
                host_layers.push(LayerStatus::skipped("cgroup", "no limits configured"));
            }
            None
        } else {
            let name = format!(
                "{}-g{}-{}",
                sanitize(&config.session),
                config.generation,
                new_cell_id()
            );
            match KernelCgroup::create(&name, &limits) {
                Ok(cg) => {
                    if sandboxed {
                        host_layers.push(LayerStatus::on("cgroup", describe_limits(&limits)));
                    }
                    Some(cg)
                }
                Err(e) if sandboxed && config.limits.is_empty() => {
                    if mode == SandboxMode::Enforce {
                        return Err(KernelError::SandboxUnavailable {
                            kernel: label,
                            layer: "cgroup".into(),
                            reason: e.to_string(),
                        });
                    }
                    host_layers.push(LayerStatus::missing("cgroup", e.to_string()));
                    None
                }
                Err(e) => {
                    return Err(KernelError::Spawn {
                        python: config.python.display().to_string(),
                        reason: format!("cannot set up the kernel's resource limits: {e}"),
                    });
                }
            }
        };
        let spec = sandboxed.then(|| {
            let mpl_dir = worker_files::sandbox_assets(&config.python, worker_dir);
            init_spec(config, worker_dir, mpl_dir.as_deref())
        });
        Ok(Prepared {
            label,
            worker_dir,
            host_layers,
            limits,
            cgroup,
            spec,
            template: None,
        })
    }
}

/// The worker's configuration, sent as the second message on its control
/// socket (never in its environment, which `/proc/self/environ` keeps).
pub(crate) fn worker_config(config: &KernelConfig) -> serde_json::Value {
    serde_json::json!({
        "tools": config.tool_names(),
        "session_dir": config.session_dir,
        "session": config.session,
        "generation": config.generation,
    })
}

/// The worker's environment: the allowlisted variables and the matplotlib
/// backend; with a sandbox, `TMPDIR=/tmp` (the private `/tmp` is the only
/// temporary directory it can write).
pub(crate) fn worker_env(
    config: &KernelConfig,
    sandboxed: bool,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut env = config.env.clone();
    env.push(("MPLBACKEND".into(), "module://cellhost_worker.mpl_backend".into()));
    if sandboxed {
        env.push(("TMPDIR".into(), "/tmp".into()));
    }
    env
}

/// Takes the worker's output rings; a ring the host cannot take is left
/// unused (its stream goes through the pipe only).
fn open_rings(
    worker: u32,
    offers: &[cellhost_protocol::frame::RingOffer],
    label: &str,
) -> [Option<crate::ring::OutputRing>; 2] {
    let mut rings = [None, None];
    if offers.is_empty() {
        return rings;
    }
    let pidfd = match crate::init_proc::pidfd_of(worker) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::debug!(kernel = %label, "no output rings: {e}");
            return rings;
        }
    };
    for offer in offers {
        let slot = match offer.stream.as_str() {
            "stdout" => 0,
            "stderr" => 1,
            _ => continue,
        };
        match crate::ring::OutputRing::open(&pidfd, offer) {
            Ok(r) => rings[slot] = Some(r),
            Err(e) => tracing::debug!(kernel = %label, "no {} ring: {e}", offer.stream),
        }
    }
    rings
}

fn describe_limits(l: &CgroupLimits) -> String {
    let mut v = Vec::new();
    if let Some(b) = l.memory_bytes {
        v.push(format!("memory {} MiB", b >> 20));
    }
    if let Some(n) = l.pids_max {
        v.push(format!("{n} processes"));
    }
    if let Some(c) = l.cpu_cores {
        v.push(format!("{c} CPU cores"));
    }
    v.join(", ")
}

/// What the kernel init must apply: read-only interpreter, worker package
/// and font cache; read-write session directory, workdir and extras.
fn init_spec(
    config: &KernelConfig,
    worker_dir: &std::path::Path,
    mpl_dir: Option<&std::path::Path>,
) -> InitSpec {
    let canon = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut ro = interpreter_dirs(&config.python);
    ro.push(config.python.clone());
    ro.push(canon(worker_dir));
    ro.extend(mpl_dir.map(canon));
    ro.extend(config.sandbox.extra_ro.iter().map(|p| canon(p)));
    let workdir = config
        .cwd
        .clone()
        .or_else(|| config.sandbox.workdir.clone())
        .unwrap_or_else(|| config.session_dir.clone());
    let mut rw = vec![canon(&config.session_dir), canon(&workdir)];
    rw.extend(config.sandbox.extra_rw.iter().map(|p| canon(p)));
    InitSpec {
        mode: config.sandbox.mode,
        network: config.sandbox.network,
        ro,
        rw,
        workdir: Some(canon(&workdir)),
        rlimits: config.sandbox.rlimits.clone(),
        disable: config.sandbox.disable.clone(),
        mpl_cache: mpl_dir.map(canon),
        hidden: hidden_paths(config),
    }
}

/// The directory of the session directory where the host keeps each
/// cell's spill files and figures (`cells/<cell id>/`). It is covered in
/// the kernel's view, so a kernel can neither read nor replace what the
/// host wrote there, nor plant links in it.
pub(crate) const CELLS_DIR: &str = "cells";

/// Makes `dir` a real directory of the host: anything else at that path (a
/// link or file a kernel of an earlier generation left) is removed first.
fn host_only_dir(dir: &std::path::Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_dir() => return Ok(()),
        Ok(_) => std::fs::remove_file(dir)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(dir)
}

/// The host paths a kernel must never see (the profile's, the host's
/// `$XDG_RUNTIME_DIR` with the sockets of its session, and the session
/// directory's [`CELLS_DIR`]), canonical.
fn hidden_paths(config: &KernelConfig) -> Vec<std::path::PathBuf> {
    let mut v: Vec<std::path::PathBuf> = config.sandbox.hidden.clone();
    v.push(config.session_dir.join(CELLS_DIR));
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        v.push(d.into());
    }
    let mut out: Vec<std::path::PathBuf> = Vec::new();
    for p in v {
        for q in [p.clone(), std::fs::canonicalize(&p).unwrap_or(p)] {
            if q.is_absolute() && !out.contains(&q) {
                out.push(q);
            }
        }
    }
    out
}

/// Kills and reaps the init if the handshake fails.
pub(crate) struct InitGuard(pub(crate) Option<InitProc>);

impl InitGuard {
    fn wait_briefly(&mut self) -> String {
        let Some(init) = self.0.as_mut() else {
            return "unknown".into();
        };
        for _ in 0..200 {
            if let Ok(Some(st)) = init.try_wait() {
                return crate::driver::describe_exit(st);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        "still running".into()
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut init) = self.0.take() {
            init.kill_and_reap();
        }
    }
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        self.kill();
    }
}
