//! The local link: a worker process on this machine, under a kernel init.
//!
//! Everything about the process lives here: the init (a child of the host,
//! or of a template), its pidfd, the two output pipes and their bulk mode,
//! the worker's shared-memory output rings, the kernel's cgroups, signals.

pub mod criu;
mod egress;
mod init_proc;
pub(crate) mod ring;
pub(crate) mod spawn;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicUsize, Ordering};

use cellhost_protocol::frame::RingOffer;
use cellhost_protocol::{FrameReader, FrameWriter, HostFrame, ProtocolError, WorkerFrame};
use cellhost_sandbox::cgroup::{CgroupError, CgroupLimits, KernelCgroup};
use cellhost_sandbox::profile::{InitSpec, LaunchSpec, LayerStatus, SandboxMode};
use cellhost_sandbox::signal;
use tokio::io::AsyncReadExt;

use crate::cell::CELLS_DIR;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

pub(crate) use init_proc::{InitProc, pidfd_of};
use ring::{OutputRing, Piece, RingTokens};

use super::{Launch, LinkEvent, Stream, TreeUsage, WorkerIds, WorkerLink};
use crate::config::KernelConfig;
use crate::error::KernelError;

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

/// A worker process on this machine: its init, control socket, pipes,
/// output rings and cgroups. Built by [`LocalLink::spawn`]; the node agent
/// of a remote kernel runs its worker through one.
pub struct LocalLink {
    label: String,
    init: InitProc,
    init_pid: u32,
    pidfd: AsyncFd<OwnedFd>,
    reader: FrameReader<OwnedReadHalf>,
    writer: FrameWriter<OwnedWriteHalf>,
    ctl_open: bool,
    pipes: [Option<pipe::Receiver>; 2],
    /// Per stream: the read buffer (empty while the driver holds it).
    bufs: [Vec<u8>; 2],
    /// Per stream: in bulk mode (big read buffer).
    bulk: [bool; 2],
    /// Per stream: the pipe is grown to `READ_BUF_BULK`.
    grown: [Option<PipeGrant>; 2],
    /// The worker's output rings, when the host could take them.
    rings: [Option<OutputRing>; 2],
    /// Ring tokens of the running cell per stream.
    tokens: [Option<RingTokens>; 2],
    cgroup: Option<KernelCgroup>,
    /// The worker runs in its own pid namespace (sandbox) or was forked by
    /// a template: its reported pid needs translating.
    translate_pid: bool,
    worker_pid: u32,
    exit: Option<ExitStatus>,
    /// The egress proxy serving the kernel's namespace (allowlist policy).
    egress: Option<egress::ProxyTask>,
    /// Inode of the worker's end of the control socket (a kernel started
    /// cold or restored: what a process checkpoint names).
    control_inode: Option<u64>,
    /// A frame handed out before anything the worker sends (the `ready` of
    /// a restored worker, which said it before its dump).
    replay: Option<WorkerFrame>,
    /// How many times [`WorkerLink::force_kill`] ran.
    force_kills: u8,
}

impl LocalLink {
    /// Starts a cold kernel: the init from the spawner thread, its launch
    /// message, the worker under it.
    ///
    /// # Errors
    /// As `Prepared::new` ([`KernelError::Io`] for boot files and the
    /// session directory, [`KernelError::SandboxUnavailable`],
    /// [`KernelError::Spawn`] for limits that cannot be set);
    /// [`KernelError::Spawn`] when the init cannot start; [`KernelError::Io`].
    pub async fn spawn(config: &KernelConfig) -> Result<(LocalLink, Launch), KernelError> {
        let prep = Prepared::new(config)?;
        let label = prep.label.clone();
        let (host_end, worker_end) =
            std::os::unix::net::UnixStream::pair().map_err(|e| KernelError::io(&label, "socketpair", e))?;
        let launcher = config.launcher_path()?;
        let control_inode = rustix::fs::fstat(&worker_end).ok().map(|st| st.st_ino);
        let launch = LaunchSpec {
            host_pid: std::process::id() as i32,
            cgroup_procs: prep.cgroup.iter().flat_map(KernelCgroup::procs_files).collect(),
            sandbox: prep.spec.clone(),
            program: config.runtime.worker_argv(&config.python, prep.boot_dir),
            env: spawn::env_strings(&worker_env(config, prep.spec.is_some())),
            keep_tree: false,
            spare_forks: prep.spec.is_none(),
            no_new_privs: config.checkpointable,
        };
        let mut cmd = spawn::init_command(&launcher, OwnedFd::from(worker_end));
        if let Some(cwd) = &config.cwd {
            cmd.current_dir(cwd);
        }
        let mut child = spawn::spawn(cmd).await.map_err(|e| KernelError::Spawn {
            python: config.python.display().to_string(),
            reason: format!("cannot start the kernel init {}: {e}", launcher.display()),
        })?;
        if let Err(e) = spawn::write_launch(&host_end, &launch, Some(&config.worker_message())) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(KernelError::io(&label, "launch message", e));
        }
        let proxy = match (&config.egress, &launch.sandbox) {
            (Some(e), Some(_)) => {
                match egress::start(&host_end, e.clone(), &label, config.startup_timeout).await {
                    Ok(p) => Some(p),
                    Err(err) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(err);
                    }
                }
            }
            _ => None,
        };
        let stdout = child.stdout.take().map(OwnedFd::from);
        let stderr = child.stderr.take().map(OwnedFd::from);
        let init = InitProc::Child(child);
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            InitGuard(Some(init)).kill();
            return Err(KernelError::io(
                &label,
                "output pipes",
                std::io::Error::other("missing"),
            ));
        };
        let (mut link, launch) = LocalLink::attach(prep, init, host_end, stdout, stderr)?;
        link.egress = proxy;
        // Only a kernel without sandbox layers is ever dumped.
        link.control_inode = control_inode.filter(|_| !launch.sandboxed);
        Ok((link, launch))
    }

    /// Takes back a kernel dumped into `dir` by a process checkpoint:
    /// `criu restore` brings the tree back as a child of this host, with
    /// fresh channels, inside this generation's own groups when the
    /// configuration has limits; the worker's `ready` comes from the image.
    ///
    /// # Errors
    /// [`KernelError::InvalidRequest`] for a configuration with a sandbox
    /// (never dumped); [`KernelError::Spawn`] when the limits cannot be
    /// set up, or CRIU cannot restore (its log's errors) or the image is
    /// unreadable; [`KernelError::Io`].
    pub async fn restore(config: &KernelConfig, dir: &Path) -> Result<(LocalLink, Launch), KernelError> {
        let fail = |reason: String| KernelError::Spawn {
            python: config.python.display().to_string(),
            reason: format!("the process checkpoint could not be restored: {reason}"),
        };
        let prep = Prepared::new(config)?;
        if prep.spec.is_some() {
            return Err(KernelError::InvalidRequest(
                "a process checkpoint is restored only into a kernel without a sandbox".into(),
            ));
        }
        let meta = criu::read_meta(dir).map_err(fail)?;
        let groups: Vec<PathBuf> = prep.cgroup.iter().flat_map(KernelCgroup::procs_files).collect();
        let restored = criu::restore(
            dir,
            &meta,
            &groups,
            config.startup_timeout.max(std::time::Duration::from_secs(30)),
        )
        .await
        .map_err(fail)?;
        let pidfd = pidfd_of(restored.init_pid).map_err(|e| KernelError::io(&prep.label, "pidfd_open", e))?;
        let init = InitProc::Restored {
            pid: restored.init_pid,
            pidfd,
            exit: None,
        };
        let control_inode = restored.control_inode;
        let (mut link, launch) =
            LocalLink::attach(prep, init, restored.host_end, restored.stdout, restored.stderr)?;
        link.control_inode = control_inode;
        link.replay = Some(WorkerFrame::Ready {
            pid: meta.ready_pid,
            python: meta.python_version.clone(),
            executable: String::new(),
            protocol: cellhost_protocol::PROTOCOL_VERSION,
            rings: meta.rings.clone(),
        });
        Ok((link, launch))
    }

    /// The link of a kernel whose init runs (a cold one, or one a template
    /// forked).
    ///
    /// # Errors
    /// [`KernelError::Io`] (pipes, socket or pidfd unusable); the init is
    /// killed then.
    pub(crate) fn attach(
        prep: Prepared,
        init: InitProc,
        host_end: std::os::unix::net::UnixStream,
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) -> Result<(LocalLink, Launch), KernelError> {
        let Prepared {
            label,
            host_layers,
            limits,
            cgroup,
            spec,
            template,
            ..
        } = prep;
        let init_pid = init.id();
        let forked = matches!(init, InitProc::Adopted { .. });
        let mut guard = InitGuard(Some(init));
        let io_err = |ctx: &str, e: std::io::Error| KernelError::io(&label, ctx, e);
        let stdout = pipe::Receiver::from_owned_fd(stdout).map_err(|e| io_err("stdout pipe", e))?;
        let stderr = pipe::Receiver::from_owned_fd(stderr).map_err(|e| io_err("stderr pipe", e))?;
        host_end
            .set_nonblocking(true)
            .map_err(|e| io_err("control socket", e))?;
        let ctl = tokio::net::UnixStream::from_std(host_end).map_err(|e| io_err("control socket", e))?;
        let pidfd = pidfd_of(init_pid).map_err(|e| io_err("pidfd_open", e))?;
        // `AsyncFd::new` is deprecated because an arbitrary `AsRawFd` may close
        // its fd early; an `OwnedFd` keeps it open for the AsyncFd's whole
        // life, which is exactly the condition `register` asks for.
        #[allow(deprecated)]
        let pidfd = AsyncFd::new(pidfd).map_err(|e| io_err("pidfd", e))?;
        let (rd, wr) = ctl.into_split();
        let Some(init) = guard.0.take() else {
            return Err(io_err("init", std::io::Error::other("lost")));
        };
        let sandboxed = spec.is_some();
        let launch = Launch {
            label: label.clone(),
            sandboxed,
            host_layers,
            template,
            // The driver names the limits in effect (the profile's defaults
            // included) when it explains a kill.
            limits: cgroup.is_some().then_some(limits),
            placement: None,
        };
        Ok((
            LocalLink {
                label,
                init,
                init_pid,
                pidfd,
                reader: FrameReader::new(rd),
                writer: FrameWriter::new(wr),
                ctl_open: true,
                pipes: [Some(stdout), Some(stderr)],
                bufs: [Vec::new(), Vec::new()],
                bulk: [false, false],
                grown: [None, None],
                rings: [None, None],
                tokens: [None, None],
                cgroup,
                translate_pid: sandboxed || forked,
                worker_pid: 0,
                exit: None,
                egress: None,
                control_inode: None,
                replay: None,
                force_kills: 0,
            },
            launch,
        ))
    }

    /// What a process checkpoint needs, when this worker can be dumped:
    /// its channels named as `/proc` names them (the pipes by the host's
    /// read ends, which share the inode).
    fn process_meta(&self, ready_pid: u32, offers: &[RingOffer]) -> Option<criu::ProcessMeta> {
        let control = self.control_inode?;
        let pipe = |s: usize| {
            self.pipes[s]
                .as_ref()
                .and_then(|p| rustix::fs::fstat(p).ok())
                .map(|st| format!("pipe:[{}]", st.st_ino))
        };
        Some(criu::ProcessMeta {
            init_pid: self.init_pid,
            worker_pid: self.worker_pid,
            ready_pid,
            python_version: String::new(),
            rings: offers.to_vec(),
            control: format!("socket:[{control}]"),
            stdout: pipe(0)?,
            stderr: pipe(1)?,
        })
    }

    fn on_read(&mut self, stream: Stream, n: std::io::Result<usize>) -> LinkEvent {
        let s = stream.index();
        match n {
            Ok(0) | Err(_) => {
                self.pipes[s] = None;
                LinkEvent::OutputClosed(stream)
            }
            Ok(n) => {
                self.adapt_read_size(s, n);
                LinkEvent::Output {
                    stream,
                    bytes: std::mem::take(&mut self.bufs[s]),
                }
            }
        }
    }

    /// Enters bulk mode when a read filled the small buffer: a big read
    /// buffer, and a big pipe while the process-wide budget allows (the
    /// kernel may refuse too: then the bigger reads alone help). Leaves it
    /// when a read is small; the pipe shrinks back once it holds less than
    /// the small size (retried at each read until then).
    fn adapt_read_size(&mut self, stream: usize, n: usize) {
        if !self.bulk[stream] && n >= READ_BUF {
            self.bulk[stream] = true;
            if let Some(grant) = BULK_PIPES.take()
                && let Some(p) = &self.pipes[stream]
                && rustix::pipe::fcntl_setpipe_size(p, READ_BUF_BULK).is_ok()
            {
                self.grown[stream] = Some(grant);
            }
        } else if self.bulk[stream] && n < SMALL_READ {
            self.bulk[stream] = false;
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

    /// Makes each open stream's buffer empty with room for one read of the
    /// current size (no zero-filling: reads go to the spare capacity).
    fn prepare_buffers(&mut self) {
        for s in 0..2 {
            if self.pipes[s].is_none() {
                continue;
            }
            let want = if self.bulk[s] { READ_BUF_BULK } else { READ_BUF };
            let buf = &mut self.bufs[s];
            buf.clear();
            if buf.capacity() > want {
                buf.shrink_to(want);
            } else if buf.capacity() < want {
                buf.reserve_exact(want);
            }
        }
    }
}

impl WorkerLink for LocalLink {
    async fn next_event(&mut self) -> LinkEvent {
        if let Some(f) = self.replay.take() {
            return LinkEvent::Frame(f);
        }
        self.prepare_buffers();
        loop {
            let alive = self.exit.is_none();
            let [out_pipe, err_pipe] = &mut self.pipes;
            let [out_buf, err_buf] = &mut self.bufs;
            tokio::select! {
                f = self.reader.next::<WorkerFrame>(), if self.ctl_open => {
                    return match f {
                        Ok(Some(f)) => LinkEvent::Frame(f),
                        Ok(None) => {
                            self.ctl_open = false;
                            LinkEvent::ControlClosed
                        }
                        Err(e) => {
                            self.ctl_open = false;
                            LinkEvent::ControlError(e)
                        }
                    };
                }
                n = read_opt(out_pipe, out_buf) => return self.on_read(Stream::Stdout, n),
                n = read_opt(err_pipe, err_buf) => return self.on_read(Stream::Stderr, n),
                _ = self.pidfd.readable(), if alive => match self.init.try_wait() {
                    Ok(Some(status)) => {
                        self.exit = Some(status);
                        return LinkEvent::Exited(status);
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(kernel = %self.label, "waiting for the kernel init: {e}"),
                },
                else => std::future::pending::<()>().await,
            }
        }
    }

    fn recycle(&mut self, stream: Stream, buf: Vec<u8>) {
        let slot = &mut self.bufs[stream.index()];
        if slot.capacity() == 0 {
            *slot = buf;
        }
    }

    async fn send(&mut self, frame: &HostFrame) -> Result<(), ProtocolError> {
        self.writer.send(frame).await
    }

    fn worker_ready(&mut self, pid: u32, offers: &[RingOffer]) -> WorkerIds {
        // The worker's own pid is the host pid unless it runs in a pid
        // namespace; the init's only child is authoritative.
        // In a sandbox the worker is pid 2 of its own pid namespace, below an
        // ns-init: find it by its namespace pid.
        let init = self.init_pid as i32;
        let host_pid = self
            .translate_pid
            .then(|| cellhost_sandbox::procfs::host_pid_of(init, pid as i32))
            .flatten()
            .map(|p| p as u32)
            .or_else(|| {
                cellhost_sandbox::procfs::children(init)
                    .first()
                    .map(|p| *p as u32)
            })
            .unwrap_or(pid);
        self.worker_pid = host_pid;
        self.rings = open_rings(host_pid, offers, &self.label);
        let process = self.process_meta(pid, offers);
        let output_rings = Stream::BOTH
            .iter()
            .zip(&self.rings)
            .filter(|(_, r)| r.is_some())
            .map(|(s, _)| s.name().to_string())
            .collect();
        WorkerIds {
            pid: host_pid,
            init_pid: self.init_pid,
            output_rings,
            process,
        }
    }

    fn interrupt(&mut self) -> Result<(), String> {
        let pid = self.worker_pid as i32;
        signal::tgkill(pid, pid, libc::SIGINT).map_err(|e| format!("tgkill failed: {e}"))
    }

    fn interrupt_target(&self) -> String {
        format!("{0}/{0}", self.worker_pid)
    }

    fn terminate(&mut self) {
        let _ = signal::kill(self.init_pid as i32, libc::SIGTERM);
    }

    fn force_kill(&mut self) {
        // The init did not finish in time. First its tree is swept from
        // here and the init left alive to reap it (killed first, the init
        // would hand every process still exiting — a large worker takes a
        // while — to whoever adopts orphans, the pid taken until that one
        // reaps). The next grace over: the init and its groups too.
        let init = self.init_pid as i32;
        self.force_kills = self.force_kills.saturating_add(1);
        signal::kill_descendants(init, 20);
        if self.force_kills == 1 {
            return;
        }
        if let Some(cg) = &self.cgroup {
            cg.kill_all(20);
        }
        let _ = signal::kill(init, libc::SIGKILL);
    }

    fn close_output(&mut self) {
        self.pipes = [None, None];
    }

    fn begin_cell(&mut self, nonce: &str) -> bool {
        self.tokens = [0, 1].map(|s| self.rings[s].as_ref().map(|_| RingTokens::new(nonce)));
        self.rings.iter().any(Option::is_some)
    }

    fn cell_output(&mut self, stream: Stream, bytes: &[u8], sink: &mut dyn FnMut(&[u8])) {
        let s = stream.index();
        let Some(tokens) = self.tokens[s].as_mut() else {
            sink(bytes);
            return;
        };
        let ring = &mut self.rings[s];
        for piece in tokens.feed(bytes) {
            match piece {
                Piece::Bytes(b) => sink(&b),
                Piece::Ring { pos, len, raw } => {
                    let taken = match ring.as_mut() {
                        Some(r) => r.consume(pos, len, &mut *sink),
                        None => Ok(false),
                    };
                    match taken {
                        Ok(true) => {}
                        Ok(false) => sink(&raw),
                        Err(e) => {
                            // The ring is unusable from now on; the worker
                            // falls back to the pipe when it gets no room.
                            tracing::warn!("output ring failed, back to the pipe only: {e}");
                            *ring = None;
                            sink(&raw);
                        }
                    }
                }
            }
        }
    }

    fn flush_cell_output(&mut self, stream: Stream, sink: &mut dyn FnMut(&[u8])) {
        if let Some(t) = self.tokens[stream.index()].as_mut() {
            let held = t.take_held();
            sink(&held);
        }
    }

    fn usage(&self) -> Option<&dyn TreeUsage> {
        self.cgroup.as_ref().map(|c| c as &dyn TreeUsage)
    }

    fn release(&mut self) {
        if let Some(cg) = self.cgroup.as_mut() {
            cg.kill_all(5);
            cg.remove();
        }
    }
}

impl Drop for LocalLink {
    fn drop(&mut self) {
        // Runtime shutdown, a failed handshake or a panic: never leave the
        // tree behind.
        if self.exit.is_none() {
            self.init.kill_and_reap();
        }
    }
}

impl TreeUsage for KernelCgroup {
    fn pids_limit_hits(&self) -> u64 {
        KernelCgroup::pids_limit_hits(self)
    }

    fn pids_max(&self) -> Option<u64> {
        KernelCgroup::pids_max(self)
    }

    fn oom_kills(&self) -> u64 {
        KernelCgroup::oom_kills(self)
    }

    fn processes(&self) -> usize {
        self.pids().len()
    }
}

async fn read_opt(pipe: &mut Option<pipe::Receiver>, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    match pipe {
        // Into the spare capacity: `prepare_buffers` left it empty.
        Some(p) => p.read_buf(buf).await,
        None => std::future::pending().await,
    }
}

/// Takes the worker's output rings; a ring the host cannot take is left
/// unused (its stream goes through the pipe only).
fn open_rings(worker: u32, offers: &[RingOffer], label: &str) -> [Option<OutputRing>; 2] {
    let mut rings = [None, None];
    if offers.is_empty() {
        return rings;
    }
    let pidfd = match pidfd_of(worker) {
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
        match OutputRing::open(&pidfd, offer) {
            Ok(r) => rings[slot] = Some(r),
            Err(e) => tracing::debug!(kernel = %label, "no {} ring: {e}", offer.stream),
        }
    }
    rings
}

/// What a local kernel needs before its processes start: the worker's boot
/// files, the session directory, the cgroup with the limits in effect, and
/// the sandbox spec (`None` with the sandbox off).
pub(crate) struct Prepared {
    pub(crate) label: String,
    pub(crate) boot_dir: &'static Path,
    pub(crate) host_layers: Vec<LayerStatus>,
    pub(crate) limits: CgroupLimits,
    pub(crate) cgroup: Option<KernelCgroup>,
    pub(crate) spec: Option<InitSpec>,
    /// Pid of the template forking this kernel.
    pub(crate) template: Option<u32>,
}

impl Prepared {
    /// # Errors
    /// [`KernelError::Io`] (boot files, session directory),
    /// [`KernelError::SandboxUnavailable`] (enforce without cgroups),
    /// [`KernelError::Spawn`] (configured limits that cannot be set up).
    pub(crate) fn new(config: &KernelConfig) -> Result<Prepared, KernelError> {
        let label = config.label();
        let boot_dir = config
            .runtime
            .boot_dir()
            .map_err(|e| KernelError::io(&label, "writing the worker package", e))?;
        std::fs::create_dir_all(&config.session_dir)
            .map_err(|e| KernelError::io(&label, format!("creating {}", config.session_dir.display()), e))?;
        let cells = config.session_dir.join(CELLS_DIR);
        host_only_dir(&cells)
            .map_err(|e| KernelError::io(&label, format!("creating {}", cells.display()), e))?;
        let mode = config.sandbox.mode;
        let sandboxed = mode != SandboxMode::Off;
        let mut host_layers: Vec<LayerStatus> = Vec::new();
        if config.egress.is_some() {
            if !sandboxed || config.sandbox.network || config.sandbox.disable.iter().any(|d| d == "netns") {
                return Err(KernelError::InvalidRequest(
                    "a network allowlist needs a sandbox (mode auto or enforce) with its own network namespace: \
                     with --sandbox off, network on or netns disabled the kernel would have the host's network"
                        .into(),
                ));
            }
            host_layers.push(LayerStatus::on(
                "egress",
                format!(
                    "allowlist only, through the host's proxy at 127.0.0.1:{}",
                    cellhost_egress::PROXY_PORT
                ),
            ));
        }
        if let Some(cellhost_sandbox::workdir_disk::DiskPlan::Accounting { reason }) = &config.sandbox.disk {
            // No mount behind the session's disk cap: the host's accounting
            // and `RLIMIT_FSIZE` only, named as the missing layer (with the
            // sandbox off too: the one layer such a kernel reports).
            host_layers.push(LayerStatus::missing("disk", reason.clone()));
        }
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
                crate::cell::new_cell_id()
            );
            match KernelCgroup::create(&name, &limits) {
                Ok(cg) => {
                    let report = cg.report();
                    if sandboxed {
                        host_layers.push(LayerStatus::on("cgroup", report.describe()));
                    }
                    for m in &report.missing {
                        // A limit the caller asked for by name is never
                        // silently dropped; the profile's defaults are a
                        // named missing layer (refused under enforce).
                        if !config.limits.is_empty() || mode == SandboxMode::Enforce {
                            return Err(limit_unavailable(config, &label, m.layer, m.reason.clone()));
                        }
                        if sandboxed {
                            host_layers.push(LayerStatus::missing(m.layer, m.reason.clone()));
                        }
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
                    if let CgroupError::NotApplied { missing, .. } = &e {
                        host_layers.extend(
                            missing
                                .iter()
                                .map(|m| LayerStatus::missing(m.layer, m.reason.clone())),
                        );
                    }
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
            let assets = config.runtime.sandbox_assets(&config.python, boot_dir);
            let mut spec = init_spec(config, boot_dir, assets.as_deref());
            spec.cgroup_views = cgroup.iter().flat_map(KernelCgroup::views).collect();
            spec
        });
        Ok(Prepared {
            label,
            boot_dir,
            host_layers,
            limits,
            cgroup,
            spec,
            template: None,
        })
    }
}

/// The worker's environment: the allowlisted variables, the runtime's own,
/// and with a sandbox `TMPDIR=/tmp` (the private `/tmp` is the only
/// temporary directory it can write).
pub(crate) fn worker_env(
    config: &KernelConfig,
    sandboxed: bool,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut env = config.env.clone();
    env.extend(config.runtime.worker_env());
    apply_path_env(&mut env, config);
    if sandboxed {
        env.push(("TMPDIR".into(), "/tmp".into()));
    }
    if config.egress.is_some() {
        // The proxy's address wins over any the caller's environment names.
        let vars = cellhost_egress::proxy_env();
        env.retain(|(k, _)| !vars.iter().any(|(n, _)| k.to_str() == Some(n.as_str())));
        env.extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
    }
    env
}

/// The runtime's directories first on `PATH` (without repeating them
/// later) and its `VIRTUAL_ENV`, replacing what the host passed.
fn apply_path_env(env: &mut Vec<(std::ffi::OsString, std::ffi::OsString)>, config: &KernelConfig) {
    let (dirs, venv) = config.runtime.path_env(&config.python);
    if !dirs.is_empty() {
        let old = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        let rest = std::env::split_paths(&old).filter(|p| !dirs.contains(p));
        if let Ok(path) = std::env::join_paths(dirs.iter().cloned().chain(rest)) {
            env.retain(|(k, _)| k != "PATH");
            env.push(("PATH".into(), path));
        }
    }
    if let Some(venv) = venv {
        env.retain(|(k, _)| k != "VIRTUAL_ENV");
        env.push(("VIRTUAL_ENV".into(), venv.into_os_string()));
    }
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

/// A limit that could not be set, for a kernel that must have it: the
/// caller's own limits (`KernelError::Spawn`) or `enforce`.
fn limit_unavailable(config: &KernelConfig, label: &str, layer: &str, reason: String) -> KernelError {
    if config.limits.is_empty() {
        KernelError::SandboxUnavailable {
            kernel: label.to_string(),
            layer: layer.into(),
            reason,
        }
    } else {
        KernelError::Spawn {
            python: config.python.display().to_string(),
            reason: format!("cannot set up the kernel's resource limits: {layer}: {reason}"),
        }
    }
}

/// What the kernel init must apply: read-only interpreter, boot files and
/// the runtime's prepared assets; read-write session directory, workdir
/// and extras.
fn init_spec(config: &KernelConfig, boot_dir: &Path, assets: Option<&Path>) -> InitSpec {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut ro = config.runtime.readonly_paths(&config.python);
    ro.push(canon(boot_dir));
    ro.extend(assets.map(canon));
    ro.extend(config.sandbox.extra_ro.iter().map(|p| canon(p)));
    ro.extend(config.packages_dir.as_deref().map(canon));
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
        mpl_cache: assets.map(canon),
        hidden: hidden_paths(config),
        cgroup_views: Vec::new(),
        egress_port: config.egress.as_ref().map(|_| cellhost_egress::PROXY_PORT),
        workdir_disk: match &config.sandbox.disk {
            Some(cellhost_sandbox::workdir_disk::DiskPlan::Mounted(h)) => Some(*h),
            _ => None,
        },
    }
}

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
fn hidden_paths(config: &KernelConfig) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = config.sandbox.hidden.clone();
    v.push(config.session_dir.join(CELLS_DIR));
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        v.push(d.into());
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for p in v {
        for q in [p.clone(), std::fs::canonicalize(&p).unwrap_or(p)] {
            if q.is_absolute() && !out.contains(&q) {
                out.push(q);
            }
        }
    }
    out
}

/// Kills and reaps the init if the link cannot be made.
struct InitGuard(Option<InitProc>);

impl InitGuard {
    fn kill(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
