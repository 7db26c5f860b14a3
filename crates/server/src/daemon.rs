//! The per-user daemon behind `cellhost exec --session NAME`: one
//! [`Registry`] kept alive across separate CLI invocations, reached over a
//! Unix socket (mode 0600, in a 0700 directory) with JSON lines: each
//! connection sends [`Request`] lines and reads [`Reply`] lines. The daemon
//! exits after an idle period with no connection open, or on `stop`,
//! SIGTERM or SIGINT — always through [`Registry::shutdown`] (every kernel
//! killed and reaped, the journal flushed).
//!
//! Who may talk to it: every connection's peer is identified
//! ([`cellhost_sandbox::peer::check_local_peer`]: `SO_PEERCRED` and a pidfd)
//! before a line is read; a process of another uid, in another pid
//! namespace, inside a kernel's cgroup or below a kernel init (any kernel,
//! also of mode `off`) gets one `error` reply with code `peer_refused` and
//! the connection is closed. A request's sandbox mode may raise the
//! daemon's floor (the mode it was started with), never lower it
//! (code `sandbox_below_floor`, see [`cellhost_sessions::floor`]).

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellhost_sandbox::profile::SandboxMode;
use cellhost_sessions::cell::{CellResult, DisplayOutput, InterruptOutcome, LiveEvent};
use cellhost_sessions::requests::{
    CwdScope, ExecuteRequest, FileWritten, ForkReport, ForkRequest, ForkThreads, InstallRequest,
    InterruptRequest, KillRequest, ListRequest, ReadFileRequest, RestoreRequest, SessionSpec, SubmitRequest,
    Submitted, WriteFileRequest,
};
use cellhost_sessions::{
    Deadline, EnvApplied, Key, Origin, Registry, RequestError, RestoreReport, SessionEnv,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Notify, mpsc};

/// The owner of every daemon session: the local user's CLI owner,
/// `cli:<user>` (the one-shot commands' too, so `history` and `restore`
/// find the daemon's sessions; never `serve`'s `http:` owners).
pub fn daemon_owner() -> String {
    cellhost_sessions::requests::cli_owner()
}

/// Default idle period after which the daemon exits (30 min).
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1800);

/// How long a starting daemon waits for a stopping one to exit.
pub const STOPPING_WAIT: Duration = Duration::from_secs(10);

/// Largest request line (the code of a cell included): 16 MiB.
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// A request line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Is the daemon there? Answers [`Reply::Ok`] with its pid.
    Ping,
    /// Run a cell in `session` (started on first use); answers `stream` and
    /// `display` replies while it runs (when `live`), then one `result`.
    Exec {
        /// Session name.
        session: String,
        /// The code.
        code: String,
        /// Deadline in seconds (0 = none; default: the daemon's).
        #[serde(default)]
        timeout_s: Option<f64>,
        /// Send live output.
        #[serde(default)]
        live: bool,
        /// Wait behind a running cell of the session instead of being
        /// refused with code `session_busy`.
        #[serde(default)]
        queue: bool,
        /// Interpreter of the session (default: the daemon's); a session
        /// is keyed by it, as by the sandbox mode.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        python: Option<PathBuf>,
        /// Language of the session (`python`, `r`; default: the live
        /// session's, else the daemon's); a session keeps the language it
        /// was created with (another one is refused with `bad_request`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        language: Option<String>,
        /// Where the session's kernels run (`local` or a `[placement.NAME]`
        /// of the daemon's config; default: the live session's, else the
        /// daemon's default); a session keeps the placement it was created
        /// with (another one is refused with `placement_mismatch`, an
        /// unknown one with `bad_request`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        placement: Option<String>,
        /// Sandbox mode of the session (`off`, `auto`, `enforce`; default:
        /// the daemon's). Never below the daemon's own mode: a weaker one is
        /// refused with code `sandbox_below_floor`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
        /// The caller's working directory (absolute; canonical): the
        /// session's, part of its key, so the same name run from two
        /// directories is two sessions and neither works in the other's
        /// directory. `None`: the session works in its session directory.
        /// Refused with `bad_request` unless an existing directory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
        /// Variables (`--env`, `--secret-env`) for a session this request
        /// creates; a session that already runs keeps its own, and a `note`
        /// reply says so.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<EnvVar>,
        /// Network policy (`--network`: `off`, `on`, or `HOST[:PORT]`
        /// rules separated by commas) for a session this request creates;
        /// a session that already runs with another keeps its own, and a
        /// `note` reply says so. `None`: the daemon's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<String>,
        /// Limits (`--memory`, `--pids`, `--cpus`, `--disk`, `--timeout`
        /// for the session) of a session this request creates; a session
        /// that already runs keeps its own, and a `note` reply says so. A
        /// value over the daemon's maximum is refused with `limit_over_max`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limits: Option<cellhost_sessions::SessionLimits>,
        /// Checkpoint mode of the session (`--checkpoint off|namespace|process`;
        /// default: the session's, else the daemon's for its name); `process`
        /// is refused with `checkpoint_unavailable` where CRIU cannot run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint: Option<cellhost_sessions::CheckpointMode>,
        /// What the session gets back after an unexpected death of its
        /// kernel (`--restore checkpoint|replay|none`; default: the
        /// session's, else the daemon's for its name).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        restore: Option<cellhost_sessions::RestoreMode>,
    },
    /// The sessions with a live kernel.
    Sessions,
    /// Pause a session (`cellhost pause SESSION`): a checkpoint, then its
    /// kernel stopped; its next `exec` resumes it. Answered by one
    /// `paused` reply.
    Pause {
        /// Session name.
        session: String,
        /// The caller's working directory, as for [`Request::Kill`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
    },
    /// Kill a session's kernel and forget it.
    Kill {
        /// Session name.
        session: String,
        /// The caller's working directory (as in `exec`): only the session
        /// of that name working there is killed (`None`: the one working in
        /// its session directory). Refused with `session_not_found`, naming
        /// the directories it runs in, when it runs only elsewhere.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
    },
    /// Interrupt a session's running cell.
    Interrupt {
        /// Session name.
        session: String,
        /// The caller's working directory, as for [`Request::Kill`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
    },
    /// Rebuild `session` in the daemon from the journal: replay the
    /// successful cells of the last journaled kernel of `from` (default:
    /// the same session) of `owner` (default: the daemon's), answered by
    /// one `restored` reply.
    Restore {
        /// The daemon session to rebuild.
        session: String,
        /// The journaled session to replay (default: `session`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        /// Whose journaled session (default: the daemon's owner).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
        /// Interpreter of the session (default: the daemon's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        python: Option<PathBuf>,
        /// Sandbox mode of the session (never below the daemon's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
        /// The caller's working directory, the rebuilt session's (as
        /// [`Request::Exec`]'s `cwd`, so `exec --session` from there finds it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
    },
    /// Fork the live, idle `session` into the new session `name`
    /// (`cellhost fork SESSION NEW`), answered by one `forked` reply.
    Fork {
        /// The parent session.
        session: String,
        /// The new session's name.
        name: String,
        /// What to do with the parent's threads (default: refuse).
        #[serde(default)]
        threads: ForkThreads,
        /// Interpreter of the parent session (default: the daemon's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        python: Option<PathBuf>,
        /// Sandbox mode of the parent session (never below the daemon's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
        /// The caller's working directory, as for [`Request::Kill`]: the
        /// parent is the session working there, and the fork is reached
        /// from there by name (it works in a copy of the directory).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
    },
    /// Write a file into a session's workdir (`cellhost cp LOCAL
    /// SESSION:PATH`), answered by one `file_written` reply.
    WriteFile {
        /// Session name.
        session: String,
        /// Path relative to the session's workdir.
        path: String,
        /// The content, base64 (at most [`MAX_FILE_BYTES`] decoded).
        data: String,
        /// The caller's working directory (as [`Request::Exec`]'s `cwd`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
    },
    /// Read a file of a session's workdir (`cellhost cp SESSION:PATH
    /// LOCAL`), answered by one `file` reply.
    ReadFile {
        /// Session name.
        session: String,
        /// Path relative to the session's workdir.
        path: String,
        /// The caller's working directory (as [`Request::Exec`]'s `cwd`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
    },
    /// Submit a cell that outlives the connection (`exec --session NAME
    /// --detach`), answered at once by one `submitted` reply.
    Submit {
        /// Session name.
        session: String,
        /// The code.
        code: String,
        /// Deadline in seconds (0 = none; default: the daemon's).
        #[serde(default)]
        timeout_s: Option<f64>,
        /// Interpreter of the session (as [`Request::Exec`]'s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        python: Option<PathBuf>,
        /// Sandbox mode of the session (as [`Request::Exec`]'s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
        /// The caller's working directory (as [`Request::Exec`]'s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
        /// Variables of a session this request creates (as
        /// [`Request::Exec`]'s `env`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<EnvVar>,
        /// Network policy of a session this request creates (as
        /// [`Request::Exec`]'s `network`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<String>,
        /// Limits of a session this request creates (as
        /// [`Request::Exec`]'s `limits`): checked before the cell is
        /// submitted, so a value over the maximum is refused at once with
        /// `limit_over_max`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limits: Option<cellhost_sessions::SessionLimits>,
    },
    /// Wait for a submitted cell (`cellhost wait CELL`): its result, or an
    /// error (`cell_not_found`, or the code it failed with; `cancelled`
    /// when it was dropped from the queue).
    Wait {
        /// The cell id `submit` answered.
        cell: String,
    },
    /// Install packages into a session (`cellhost install SESSION PKG…`):
    /// the host runs the installer into the session's overlay (see
    /// `cellhost_sessions::packages`); answers `stream` replies with the
    /// installer's output (when `live`), then one `installed` reply.
    Install {
        /// Session name.
        session: String,
        /// Requirement specs (names, extras, version specifiers only).
        packages: Vec<String>,
        /// Into the interpreter's own environment (refused with
        /// `shared_venv_refused` unless the config allows it).
        #[serde(default)]
        shared_venv: bool,
        /// Send live output.
        #[serde(default)]
        live: bool,
        /// Interpreter of the session (as [`Request::Exec`]'s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        python: Option<PathBuf>,
        /// Sandbox mode of the session (as [`Request::Exec`]'s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
        /// The caller's working directory (as [`Request::Exec`]'s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
    },
    /// Shut the daemon down.
    Stop,
}

/// Largest file a `write_file` or `read_file` request carries (12 MiB: its
/// base64 fits in one [`MAX_LINE`]).
pub const MAX_FILE_BYTES: u64 = 12 * 1024 * 1024;

/// One variable of [`Request::Exec`]'s `env`. Its `Debug` never shows a
/// value.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
    /// A secret (`--secret-env`): masked in everything the session outputs,
    /// never logged.
    #[serde(default)]
    pub secret: bool,
}

impl std::fmt::Debug for EnvVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvVar")
            .field("name", &self.name)
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

/// A session as `cellhost sessions` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Name.
    pub name: String,
    /// Kernel generation.
    pub generation: u64,
    /// `live` or `paused` (its kernel checkpointed and stopped; the next
    /// `exec --session` resumes it, also after the daemon restarted).
    #[serde(default = "live_state")]
    pub state: String,
    /// Worker pid (0 for a paused session).
    pub pid: u32,
    /// A cell is running or queued.
    pub busy: bool,
    /// Interpreter.
    pub python: PathBuf,
    /// Working directory (`None`: its session directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// Where a remote kernel runs (placement, kind, node, job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<cellhost_sessions::cell::KernelPlacement>,
    /// The limits the session runs under (each absent when not limited).
    #[serde(default)]
    pub limits: cellhost_sessions::SessionLimits,
    /// When a paused session was paused, milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_ms: Option<i64>,
    /// The checkpoint a paused session resumes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<cellhost_sessions::CheckpointSummary>,
}

fn live_state() -> String {
    "live".into()
}

/// A reply line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Reply {
    /// Live output of the running cell.
    Stream {
        /// `stdout` or `stderr`.
        name: String,
        /// Text.
        text: String,
    },
    /// A display of the running cell.
    Display {
        /// The display.
        display: DisplayOutput,
    },
    /// The cell's result (last reply of an `exec`).
    Result {
        /// The result.
        result: Box<CellResult>,
    },
    /// The sessions.
    Sessions {
        /// Sessions with a live kernel.
        sessions: Vec<SessionInfo>,
    },
    /// What an interrupt did.
    Interrupt {
        /// The outcome.
        outcome: InterruptOutcome,
        /// Cells submitted with `exec --detach` that were queued in the
        /// session and dropped by the interrupt.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        dropped: Vec<String>,
    },
    /// What a restore did.
    Restored {
        /// The report.
        report: RestoreReport,
    },
    /// What a fork made.
    Forked {
        /// The report.
        report: ForkReport,
    },
    /// What a pause did.
    Paused {
        /// The report.
        report: cellhost_sessions::PauseReport,
    },
    /// Something the caller should know about its request (printed on
    /// stderr by the CLI); an `exec` goes on, its `result` follows.
    Note {
        /// What.
        message: String,
    },
    /// A submitted cell's handle.
    Submitted {
        /// The handle.
        submitted: Submitted,
    },
    /// What a `write_file` did.
    FileWritten {
        /// The path (relative to the workdir) and size.
        written: FileWritten,
    },
    /// A file read by `read_file`.
    File {
        /// The path, relative to the workdir.
        path: String,
        /// Its size in bytes.
        size: u64,
        /// The content, base64.
        data: String,
    },
    /// What an `install` did.
    Installed {
        /// The installer's report.
        report: cellhost_sessions::packages::InstallReport,
        /// The `%pip install` cell's result.
        result: Box<CellResult>,
    },
    /// Done.
    Ok {
        /// What was done.
        message: String,
    },
    /// Failed.
    Error {
        /// Why.
        message: String,
        /// The request was malformed or named nothing (exit 2), rather than
        /// a failure of the daemon or kernel (exit 1).
        #[serde(default)]
        usage: bool,
        /// Stable error code, always present: `peer_refused` (the
        /// connecting process may not use the daemon), `bad_request`, and
        /// the request layer's ([`RequestError::code`]: `session_busy`,
        /// `session_not_found`, `sandbox_below_floor`, `kernel_failed`, …).
        #[serde(default)]
        code: String,
    },
}

/// The stable code of a refused peer.
pub const PEER_REFUSED: &str = "peer_refused";

/// Where the daemon's files live: `$XDG_RUNTIME_DIR/cellhost` when that
/// directory is usable, else `STATE_DIR/run`, else `/tmp/cellhost-<uid>`
/// ([`crate::rundir`]).
pub fn runtime_dir(state_dir: &Path) -> PathBuf {
    crate::rundir::runtime_dir(state_dir)
}

/// The socket in `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("daemon.sock")
}

struct Activity {
    open: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    fn touch(&self) {
        if let Ok(mut l) = self.last.lock() {
            *l = Instant::now();
        }
    }
    fn idle_for(&self) -> Duration {
        self.last.lock().map(|l| l.elapsed()).unwrap_or_default()
    }
}

struct OpenGuard(Arc<Activity>);
impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Idle past the idle period.
    Idle,
    /// A `stop` request.
    Requested,
    /// SIGTERM or SIGINT.
    Signal,
    /// Another daemon holds the lock: this one never started.
    AlreadyRunning,
}

/// Runs the daemon until it is idle for `idle`, asked to stop, or
/// signalled; then shuts `registry` down and removes the socket.
///
/// # Errors
/// I/O errors creating the directory, taking the lock or binding; each
/// names the path.
pub async fn run(registry: Arc<Registry>, dir: &Path, idle: Duration) -> std::io::Result<StopReason> {
    let named = |path: &Path| {
        let path = path.display().to_string();
        move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{path}: {e}"))
    };
    crate::rundir::prepare(dir)?;
    // One daemon per directory: an exclusive lock held for its lifetime.
    let lock_path = dir.join("daemon.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(named(&lock_path))?;
    // A daemon holding the lock and answering on the socket runs: this one
    // is not needed. One holding it without answering is stopping (it
    // closes the socket first, then shuts its kernels down): wait for it,
    // at most STOPPING_WAIT.
    let until = Instant::now() + STOPPING_WAIT;
    while rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        if UnixStream::connect(socket_path(dir)).await.is_ok() || Instant::now() >= until {
            registry.shutdown().await;
            return Ok(StopReason::AlreadyRunning);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid_path = dir.join("daemon.pid");
    std::fs::write(&pid_path, std::process::id().to_string()).map_err(named(&pid_path))?;
    let sock = socket_path(dir);
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).map_err(named(&sock))?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).map_err(named(&sock))?;
    let activity = Arc::new(Activity {
        open: AtomicUsize::new(0),
        last: Mutex::new(Instant::now()),
    });
    let stop = Arc::new(Notify::new());
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let tick_every = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let mut tick = tokio::time::interval(tick_every);
    let reason = loop {
        tokio::select! {
            acc = listener.accept() => {
                let Ok((stream, _)) = acc else { continue };
                // Who connected is decided before anything is read from it:
                // a kernel (or anything it started) gets one refusal.
                if let Err(why) = cellhost_sandbox::peer::check_local_peer(stream.as_fd()) {
                    tracing::warn!("daemon: refused a connection: {why}");
                    tokio::spawn(refuse(stream, why.to_string()));
                    continue;
                }
                activity.open.fetch_add(1, Ordering::SeqCst);
                activity.touch();
                let guard = OpenGuard(activity.clone());
                let reg = registry.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let _guard = guard;
                    if let Err(e) = serve_conn(stream, reg, stop).await {
                        tracing::debug!("daemon connection: {e}");
                    }
                });
            }
            _ = tick.tick() => {
                // A submitted cell still queued or running is activity.
                if registry.detached().any_pending() {
                    activity.touch();
                }
                if activity.open.load(Ordering::SeqCst) == 0 && activity.idle_for() >= idle {
                    break StopReason::Idle;
                }
            }
            _ = stop.notified() => break StopReason::Requested,
            _ = term.recv() => break StopReason::Signal,
            _ = int.recv() => break StopReason::Signal,
        }
    };
    drop(listener);
    let _ = std::fs::remove_file(&sock);
    registry.shutdown().await;
    let _ = std::fs::remove_file(dir.join("daemon.pid"));
    drop(lock);
    Ok(reason)
}

async fn send(w: &mut tokio::net::unix::OwnedWriteHalf, r: &Reply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line).await
}

fn usage_error(message: impl Into<String>) -> Reply {
    Reply::Error {
        message: message.into(),
        usage: true,
        code: "bad_request".into(),
    }
}

fn request_error(e: &RequestError) -> Reply {
    Reply::Error {
        message: e.to_string(),
        usage: e.is_usage(),
        code: e.code().into(),
    }
}

fn parse_sandbox(sandbox: Option<&str>) -> Result<Option<SandboxMode>, RequestError> {
    sandbox
        .map(str::parse::<SandboxMode>)
        .transpose()
        .map_err(RequestError::bad_request)
}

/// Answers a refused peer with one `peer_refused` error and closes. What
/// the peer sends is read and dropped unparsed (at most 1 MiB, for at most
/// 2 s), so its write does not fail before it can read the refusal.
async fn refuse(stream: UnixStream, why: String) {
    let (mut r, mut w) = stream.into_split();
    let reply = Reply::Error {
        message: format!("this daemon refuses the connecting process: {why}"),
        usage: false,
        code: PEER_REFUSED.into(),
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = send(&mut w, &reply).await;
        let _ = w.shutdown().await;
        let mut sink = tokio::io::sink();
        let _ = tokio::io::copy(&mut (&mut r).take(1 << 20), &mut sink).await;
    })
    .await;
}

async fn serve_conn(stream: UnixStream, reg: Arc<Registry>, stop: Arc<Notify>) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut r)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > MAX_LINE {
            send(&mut w, &usage_error("request line too long")).await?;
            return Ok(());
        }
        let req: Request = match serde_json::from_slice(&line) {
            Ok(q) => q,
            Err(e) => {
                // serde's message may quote a value of the line (a secret
                // of `env`): only its position is said then.
                let why = if line.windows(5).any(|x| x == b"\"env\"") {
                    format!("malformed at line {} column {}", e.line(), e.column())
                } else {
                    e.to_string()
                };
                send(&mut w, &usage_error(format!("bad request: {why}"))).await?;
                continue;
            }
        };
        handle(req, &reg, &stop, &mut w).await?;
    }
}

async fn handle(
    req: Request,
    reg: &Arc<Registry>,
    stop: &Notify,
    w: &mut tokio::net::unix::OwnedWriteHalf,
) -> std::io::Result<()> {
    let owner = daemon_owner();
    match req {
        Request::Ping => {
            send(
                w,
                &Reply::Ok {
                    message: format!("pid {}", std::process::id()),
                },
            )
            .await
        }
        Request::Exec {
            session,
            code,
            timeout_s,
            live,
            queue,
            python,
            language,
            placement,
            sandbox,
            cwd,
            env,
            network,
            limits,
            checkpoint,
            restore,
        } => {
            let parsed = Deadline::from_secs(timeout_s)
                .and_then(|d| parse_sandbox(sandbox.as_deref()).map(|m| (d, m)));
            let (deadline, requested) = match parsed {
                Ok(x) => x,
                Err(e) => return send(w, &request_error(&e)).await,
            };
            let spec = SessionSpec {
                python,
                language,
                sandbox: requested,
                placement,
                cwd,
                limits: limits.unwrap_or_default(),
                checkpoint,
                restore,
                ..SessionSpec::new(owner, session)
            };
            let Some(spec) = prepare_session(reg, w, spec, env, network.as_deref()).await? else {
                return Ok(());
            };
            let (tx, rx) = mpsc::unbounded_channel();
            let mut req = ExecuteRequest::new(spec, code, Origin::new("cli:daemon"));
            req.deadline = deadline;
            req.queue = queue;
            req.live = live.then_some(tx);
            let out = relay_live(w, rx, live, req.execute(reg)).await?;
            match out {
                Ok(done) => {
                    if let Some(e) = &done.journal_error {
                        tracing::warn!("cell {} not journaled: {e}", done.result.cell_id);
                    }
                    send(
                        w,
                        &Reply::Result {
                            result: Box::new(done.result),
                        },
                    )
                    .await
                }
                Err(e) => send(w, &request_error(&e)).await,
            }
        }
        Request::Install {
            session,
            packages,
            shared_venv,
            live,
            python,
            sandbox,
            cwd,
        } => {
            let requested = match parse_sandbox(sandbox.as_deref()) {
                Ok(m) => m,
                Err(e) => return send(w, &request_error(&e)).await,
            };
            // The live session of that name in that directory, unless the
            // request names another interpreter or mode.
            let mut spec = file_spec(reg, &owner, session, cwd);
            if python.is_some() {
                spec.python = python;
            }
            if requested.is_some() {
                spec.sandbox = requested;
            }
            let (tx, rx) = mpsc::unbounded_channel();
            let mut req = InstallRequest::new(spec, packages, Origin::new("cli:install"));
            req.shared_venv = shared_venv;
            req.live = live.then_some(tx);
            let out = relay_live(w, rx, live, req.execute(reg)).await?;
            match out {
                Ok(done) => {
                    send(
                        w,
                        &Reply::Installed {
                            report: done.report,
                            result: Box::new(done.result),
                        },
                    )
                    .await
                }
                Err(e) => send(w, &request_error(&e)).await,
            }
        }
        Request::Sessions => {
            let sessions = ListRequest { owner }
                .execute_with_paused(reg)
                .await
                .into_iter()
                .map(|s| SessionInfo {
                    name: s.name,
                    state: s.state.to_string(),
                    paused_ms: s.paused_ms,
                    checkpoint: s.checkpoint,
                    generation: s.generation,
                    pid: s.pid,
                    busy: s.busy,
                    python: s.python,
                    cwd: s.cwd,
                    placement: s.placement,
                    limits: s.limits,
                })
                .collect();
            send(w, &Reply::Sessions { sessions }).await
        }
        Request::Pause { session, cwd } => match (cellhost_sessions::requests::PauseRequest {
            owner,
            session,
            cwd: CwdScope::Exactly(cwd),
        })
        .execute(reg)
        .await
        {
            Ok(report) => send(w, &Reply::Paused { report }).await,
            Err(e) => send(w, &request_error(&e)).await,
        },
        Request::Kill { session, cwd } => match (KillRequest {
            owner,
            session,
            cwd: CwdScope::Exactly(cwd),
        })
        .execute(reg)
        .await
        {
            Ok(rep) => {
                send(
                    w,
                    &Reply::Ok {
                        message: format!("killed session {}", rep.session),
                    },
                )
                .await
            }
            Err(e) => send(w, &request_error(&e)).await,
        },
        Request::Interrupt { session, cwd } => match (InterruptRequest {
            owner,
            session,
            cwd: CwdScope::Exactly(cwd),
        })
        .execute_dropping_queued(reg)
        .await
        {
            Ok(i) => {
                let reply = Reply::Interrupt {
                    outcome: i.outcome,
                    dropped: i.dropped,
                };
                send(w, &reply).await
            }
            Err(e) => send(w, &request_error(&e)).await,
        },
        Request::Restore {
            session,
            from,
            owner: from_owner,
            python,
            sandbox,
            cwd,
        } => {
            let requested = match parse_sandbox(sandbox.as_deref()) {
                Ok(m) => m,
                Err(e) => return send(w, &request_error(&e)).await,
            };
            let source = (
                from_owner.unwrap_or_else(|| owner.clone()),
                from.unwrap_or_else(|| session.clone()),
            );
            let req = RestoreRequest {
                into: SessionSpec {
                    python,
                    sandbox: requested,
                    cwd,
                    ..SessionSpec::new(owner, session)
                },
                from: Some(source),
                force: false,
            };
            match req.execute(reg).await {
                Ok(report) => send(w, &Reply::Restored { report }).await,
                Err(e) => send(w, &request_error(&e)).await,
            }
        }
        Request::Fork {
            session,
            name,
            threads,
            python,
            sandbox,
            cwd,
        } => {
            let requested = match parse_sandbox(sandbox.as_deref()) {
                Ok(m) => m,
                Err(e) => return send(w, &request_error(&e)).await,
            };
            let req = ForkRequest {
                session: SessionSpec {
                    python,
                    sandbox: requested,
                    cwd,
                    ..SessionSpec::new(owner, session)
                },
                name,
                threads,
            };
            match req.execute(reg).await {
                Ok(report) => send(w, &Reply::Forked { report }).await,
                Err(e) => send(w, &request_error(&e)).await,
            }
        }
        Request::WriteFile {
            session,
            path,
            data,
            cwd,
        } => {
            use base64::Engine as _;
            let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data.as_bytes()) else {
                return send(w, &usage_error("data is not base64")).await;
            };
            let req = WriteFileRequest {
                session: file_spec(reg, &owner, session, cwd),
                path,
                max_bytes: MAX_FILE_BYTES,
            };
            match req.execute(reg, bytes.as_slice()).await {
                Ok(written) => send(w, &Reply::FileWritten { written }).await,
                Err(e) => send(w, &request_error(&e)).await,
            }
        }
        Request::ReadFile { session, path, cwd } => {
            use base64::Engine as _;
            let req = ReadFileRequest {
                session: file_spec(reg, &owner, session, cwd),
                path,
                offset: 0,
                length: None,
            };
            match req.read_to_vec(reg, MAX_FILE_BYTES).await {
                Ok((f, bytes)) => {
                    let reply = Reply::File {
                        path: f.path,
                        size: f.size,
                        data: base64::engine::general_purpose::STANDARD.encode(bytes),
                    };
                    send(w, &reply).await
                }
                Err(e) => send(w, &request_error(&e)).await,
            }
        }
        Request::Submit {
            session,
            code,
            timeout_s,
            python,
            sandbox,
            cwd,
            env,
            network,
            limits,
        } => {
            let parsed = Deadline::from_secs(timeout_s)
                .and_then(|d| parse_sandbox(sandbox.as_deref()).map(|m| (d, m)));
            let (deadline, requested) = match parsed {
                Ok(x) => x,
                Err(e) => return send(w, &request_error(&e)).await,
            };
            let spec = SessionSpec {
                python,
                sandbox: requested,
                cwd,
                limits: limits.unwrap_or_default(),
                ..SessionSpec::new(owner, session)
            };
            // The same rules as `exec --session` without `--detach`: the
            // settings are checked and applied before the handle is given,
            // so a bad value is the caller's error, not the cell's.
            let Some(spec) = prepare_session(reg, w, spec, env, network.as_deref()).await? else {
                return Ok(());
            };
            let req = SubmitRequest {
                session: spec,
                code,
                deadline,
                origin: Origin::new("cli:daemon"),
            };
            match req.execute(reg) {
                Ok(submitted) => send(w, &Reply::Submitted { submitted }).await,
                Err(e) => send(w, &request_error(&e)).await,
            }
        }
        Request::Wait { cell } => {
            let Some(t) = reg.detached().get(&owner, &cell) else {
                return send(w, &request_error(&RequestError::CellNotFound { cell })).await;
            };
            let mut follow = t.follow();
            while !t.status().is_final() {
                if follow.changed().await.is_err() {
                    break;
                }
            }
            let snap = t.snapshot();
            match (snap.result, snap.error) {
                (Some(result), _) => {
                    send(
                        w,
                        &Reply::Result {
                            result: Box::new(result),
                        },
                    )
                    .await
                }
                (None, Some(e)) => {
                    let reply = Reply::Error {
                        message: e["message"].as_str().unwrap_or("the cell could not run").into(),
                        usage: false,
                        code: e["code"].as_str().unwrap_or("kernel_failed").into(),
                    };
                    send(w, &reply).await
                }
                (None, None) => {
                    let reply = Reply::Error {
                        message: format!("cell {cell} was dropped from the queue before it ran"),
                        usage: false,
                        code: "cancelled".into(),
                    };
                    send(w, &reply).await
                }
            }
        }
        Request::Stop => {
            send(
                w,
                &Reply::Ok {
                    message: "stopping".into(),
                },
            )
            .await?;
            stop.notify_one();
            Ok(())
        }
    }
}

/// Checks and applies what an `exec` or a submit asks of its session —
/// variables, network policy, limits — sending a `note` reply for each a
/// running session keeps (its own). `None` when an error reply was sent
/// (a bad variable, policy or limit; `limit_over_max`).
async fn prepare_session(
    reg: &Registry,
    w: &mut tokio::net::unix::OwnedWriteHalf,
    mut spec: SessionSpec,
    env: Vec<EnvVar>,
    network: Option<&str>,
) -> std::io::Result<Option<SessionSpec>> {
    let network = match network.map(cellhost_sessions::network::parse_request) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            send(w, &request_error(&e)).await?;
            return Ok(None);
        }
    };
    let mut session_env = SessionEnv::new();
    for v in env {
        if v.name.is_empty() || v.name.contains('=') || v.name.contains('\0') || v.value.contains('\0') {
            send(w, &usage_error(format!("bad variable name {:?}", v.name))).await?;
            return Ok(None);
        }
        if v.secret {
            session_env.set_secret(v.name, v.value);
        } else {
            session_env.set(v.name, v.value);
        }
    }
    spec.env = session_env;
    let key = match spec.key(reg) {
        Ok(k) => k,
        Err(e) => {
            send(w, &request_error(&e)).await?;
            return Ok(None);
        }
    };
    for note in session_notes(reg, &key, &spec.env) {
        send(w, &Reply::Note { message: note }).await?;
    }
    match reg.set_session_network(&key, network.as_ref()) {
        Ok(EnvApplied::Applied) => {}
        Ok(EnvApplied::Kept) => {
            let message = format!(
                "session {} already runs with another network policy; --network applies to new sessions only",
                key.session
            );
            send(w, &Reply::Note { message }).await?;
        }
        Err(e) => {
            send(w, &request_error(&e)).await?;
            return Ok(None);
        }
    }
    match limits_note(reg, &key, &spec) {
        Ok(Some(note)) => send(w, &Reply::Note { message: note }).await?,
        Ok(None) => {}
        Err(e) => {
            send(w, &request_error(&e)).await?;
            return Ok(None);
        }
    }
    Ok(Some(spec))
}

/// The session a files request names: the live one of that name in the
/// caller's directory when there is one (whatever interpreter or mode it
/// runs), else the daemon's default key for it.
fn file_spec(reg: &Registry, owner: &str, session: String, cwd: Option<PathBuf>) -> SessionSpec {
    let live = reg
        .sessions_of(owner)
        .into_iter()
        .map(|(k, _)| k)
        .find(|k| k.session == session && k.cwd == cwd);
    SessionSpec {
        python: live.as_ref().map(|k| k.python.clone()),
        sandbox: live.as_ref().map(|k| k.sandbox),
        cwd,
        ..SessionSpec::new(owner, session)
    }
}

/// Applies the limits an `exec` asked for to `key`'s session; a note when
/// the session already runs under other limits (kept).
///
/// # Errors
/// `bad_request`, `limit_over_max`.
fn limits_note(reg: &Registry, key: &Key, spec: &SessionSpec) -> Result<Option<String>, RequestError> {
    Ok((!spec.apply_limits(reg, key, false)?).then(|| {
        format!(
            "session {} already runs with other limits; --memory/--pids/--cpus/--disk apply to new sessions only (kill it first)",
            key.session
        )
    }))
}

/// What the caller of an `exec` into `key` should know: that the session
/// runs already with another environment than the one it asked for (kept),
/// and that sessions of the same name work in other directories (each its
/// own session).
fn session_notes(reg: &Registry, key: &Key, env: &SessionEnv) -> Vec<String> {
    let mut notes = Vec::new();
    if reg.set_session_env(key, env) == EnvApplied::Kept {
        notes.push(format!(
            "session {} already runs; --env/--secret-env apply to new sessions only",
            key.session
        ));
    }
    let here = key.cwd.as_deref();
    let elsewhere: Vec<String> = reg
        .sessions_of(&key.owner)
        .into_iter()
        .filter(|(k, _)| k.session == key.session && k.cwd.as_deref() != here)
        .map(|(k, _)| {
            k.cwd
                .map_or_else(|| "its session directory".into(), |d| d.display().to_string())
        })
        .collect();
    if !elsewhere.is_empty() {
        notes.push(format!(
            "session {} works in {}; a session is per directory, so the one in {} is another",
            key.session,
            here.map_or_else(|| "its session directory".into(), |d| d.display().to_string()),
            elsewhere.join(", ")
        ));
    }
    notes
}

/// Awaits `run` while passing the live output it sends to `rx` on to the
/// client (when it asked for live output), then whatever is left of it.
///
/// # Errors
/// Writing to the client failed.
async fn relay_live<T>(
    w: &mut tokio::net::unix::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<LiveEvent>,
    live: bool,
    run: impl std::future::Future<Output = T>,
) -> std::io::Result<T> {
    tokio::pin!(run);
    let mut live_open = live;
    let out = loop {
        tokio::select! {
            ev = rx.recv(), if live_open => match ev {
                Some(ev) => send(w, &live_reply(ev)).await?,
                None => live_open = false,
            },
            r = &mut run => break r,
        }
    };
    while let Ok(ev) = rx.try_recv() {
        send(w, &live_reply(ev)).await?;
    }
    Ok(out)
}

fn live_reply(ev: LiveEvent) -> Reply {
    match ev {
        LiveEvent::Stdout(text) => Reply::Stream {
            name: "stdout".into(),
            text,
        },
        LiveEvent::Stderr(text) => Reply::Stream {
            name: "stderr".into(),
            text,
        },
        LiveEvent::Display(display) => Reply::Display { display },
    }
}

/// Waits until the process of `pidfd` exits (the pidfd turns readable);
/// `false` when `within` passed first.
///
/// # Errors
/// `poll` failed.
pub async fn wait_exit(pidfd: std::os::fd::OwnedFd, within: Duration) -> std::io::Result<bool> {
    tokio::task::spawn_blocking(move || {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let until = std::time::Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let ts = Timespec::try_from(left).map_err(std::io::Error::other)?;
            let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
            match poll(&mut fds, Some(&ts)) {
                Ok(0) => {}
                Ok(_) => return Ok(true),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    })
    .await
    .map_err(std::io::Error::other)?
}

/// A connection to a running daemon.
#[derive(Debug)]
pub struct Client {
    r: BufReader<tokio::net::unix::OwnedReadHalf>,
    w: tokio::net::unix::OwnedWriteHalf,
}

impl Client {
    /// Connects to the daemon whose socket is in `dir`.
    ///
    /// # Errors
    /// No daemon listens there (the message names the socket; the kind is
    /// the connect's).
    pub async fn connect(dir: &Path) -> std::io::Result<Client> {
        let path = socket_path(dir);
        let s = UnixStream::connect(&path)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let (r, w) = s.into_split();
        Ok(Client {
            r: BufReader::new(r),
            w,
        })
    }

    /// A pidfd of the daemon process this client is connected to.
    ///
    /// # Errors
    /// The daemon is gone.
    pub fn daemon_pidfd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        cellhost_sandbox::peer::peer_pidfd_of(self.w.as_ref().as_fd())
    }

    /// Connects, starting the daemon with `spawn` when none answers, and
    /// waiting up to `wait` for its socket. A daemon that exits with a
    /// failure before opening its socket is reported at once, with the
    /// end of `log` (its standard error) when given.
    ///
    /// # Errors
    /// The daemon could not be started or did not answer in time.
    pub async fn connect_or_start(
        dir: &Path,
        wait: Duration,
        log: Option<&Path>,
        spawn: impl FnOnce() -> std::io::Result<std::process::Child>,
    ) -> std::io::Result<Client> {
        if let Ok(c) = Client::connect(dir).await {
            return Ok(c);
        }
        let mut child = spawn()?;
        let until = Instant::now() + wait;
        loop {
            match Client::connect(dir).await {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() >= until => {
                    return Err(std::io::Error::other(format!(
                        "the daemon did not open {} within {:?}: {e}",
                        socket_path(dir).display(),
                        wait
                    )));
                }
                Err(_) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        // Exited before listening: a daemon that found
                        // another one answering exits 0, so one more try;
                        // otherwise it failed, and its log says why.
                        if let Ok(c) = Client::connect(dir).await {
                            return Ok(c);
                        }
                        let last = log
                            .and_then(|p| std::fs::read_to_string(p).ok())
                            .and_then(|t| t.lines().rev().find(|l| !l.trim().is_empty()).map(str::to_string))
                            .unwrap_or_else(|| "(no log)".into());
                        return Err(std::io::Error::other(format!(
                            "the daemon exited ({status}) before listening on {}: {last}",
                            socket_path(dir).display()
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    /// Sends a request.
    ///
    /// # Errors
    /// I/O errors.
    pub async fn send(&mut self, req: &Request) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(req).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.w.write_all(&line).await
    }

    /// The next reply (`None` when the daemon closed the connection).
    ///
    /// # Errors
    /// I/O errors or a malformed reply.
    pub async fn next(&mut self) -> std::io::Result<Option<Reply>> {
        let mut line = String::new();
        if self.r.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// Sends a request and returns its one reply.
    ///
    /// # Errors
    /// I/O errors, or the daemon closed the connection.
    pub async fn call(&mut self, req: &Request) -> std::io::Result<Reply> {
        self.send(req).await?;
        self.next()
            .await?
            .ok_or_else(|| std::io::Error::other("the daemon closed the connection"))
    }
}
