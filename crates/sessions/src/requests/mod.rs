//! The request layer: one typed request per operation, validated once and
//! executed against the [`Registry`]. Every surface — the CLI (one-shot
//! `exec`, `run`, `repl`, and the daemon behind `exec --session`), HTTP and
//! MCP — parses its input into one of these, calls its `execute`, and only
//! renders what comes back; so a timeout, a sandbox mode, an owner and the
//! busy rule mean the same on every surface.
//!
//! - A deadline is a [`Deadline`]: the configured default, none, or a
//!   duration — one spelling of "no deadline".
//! - Owners are namespaced by surface ([`Surface::owner`]): `cli:<user>`
//!   (one-shot commands and the daemon), `http:<token owner>`,
//!   `mcp:<connection>`, so sessions of one name on two surfaces never share
//!   a journal or a generation count.
//! - The busy rule: an execute on a session whose kernel runs (or queues) a
//!   cell is refused with [`RequestError::SessionBusy`] (`session_busy`)
//!   unless the request asks to queue; a queued cell's `duration_ms` counts
//!   its own run only, and its `queued_ms` says how long it waited.
//! - Every failure is a [`RequestError`] with a stable [`RequestError::code`].

mod checkpoint;
mod execute;
pub mod files;
mod fork;
mod history;
mod install;
mod interrupt;
mod kill;
mod list;
mod pause;
mod read_display;
mod read_output;
mod restart;
mod restore;
mod run_notebook;
mod submit;
mod variables;

use std::path::PathBuf;
use std::time::Duration;

use cellhost_kernel::KernelError;
use cellhost_sandbox::profile::SandboxMode;

pub use checkpoint::CheckpointRequest;
pub use execute::{ExecuteRequest, Executed};
pub use files::{
    DeleteFileRequest, FileDeleted, FileEntry, FileKind, FileListing, FileWritten, ListFilesRequest,
    OpenedFile, ReadFileRequest, WriteFileRequest,
};
pub use fork::{ForkMethod, ForkReport, ForkRequest, ForkThreads};
pub use history::{History, HistoryRequest};
pub use install::{InstallRequest, Installed};
pub use interrupt::{InterruptRequest, Interrupted};
pub use kill::{KillReport, KillRequest};
pub use list::{ListRequest, SessionSummary};
pub use pause::PauseRequest;
pub use read_display::ReadDisplayRequest;
pub use read_output::{OutputPage, ReadOutputRequest};
pub use restart::{RestartReport, RestartRequest};
pub use restore::RestoreRequest;
pub use run_notebook::{
    MAX_NOTEBOOK_CELLS, NotebookInput, RegistryRunner, RunNotebookRequest, parameters_from_json, summary_json,
};
pub use submit::{CancelCellRequest, CellCancelled, SubmitRequest, Submitted};
pub use variables::VariablesRequest;

use crate::registry::{Key, Registry, RegistryError};

/// Longest session name, in bytes.
pub const MAX_SESSION_NAME: usize = 128;

/// A cell's deadline as a request gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Deadline {
    /// The registry's configured default (`cell_timeout_s`, 300 s unless
    /// configured).
    #[default]
    Default,
    /// No deadline: the cell runs until it ends or is interrupted.
    None,
    /// Interrupt the cell this long after it starts running.
    After(Duration),
}

impl Deadline {
    /// The deadline of a `timeout_s` field or `--timeout SECONDS` option:
    /// absent is [`Deadline::Default`], `0` is [`Deadline::None`].
    ///
    /// # Errors
    /// [`RequestError::BadRequest`] for a negative, non-finite or too large
    /// number.
    pub fn from_secs(secs: Option<f64>) -> Result<Deadline, RequestError> {
        match secs {
            None => Ok(Deadline::Default),
            Some(s) if !s.is_finite() || s < 0.0 => Err(RequestError::bad_request(format!(
                "a timeout is a number of seconds >= 0 (0 = none), got {s}"
            ))),
            Some(0.0) => Ok(Deadline::None),
            Some(s) => Duration::try_from_secs_f64(s).map(Deadline::After).map_err(|_| {
                RequestError::bad_request(format!("timeout {s:e} s is too large (0 means none)"))
            }),
        }
    }

    /// The deadline as the kernel's [`cellhost_kernel::ExecOptions::timeout`]
    /// spells it (`None`: the kernel's default; `Some(ZERO)`: none).
    pub fn as_exec_timeout(self) -> Option<Duration> {
        match self {
            Deadline::Default => None,
            Deadline::None => Some(Duration::ZERO),
            Deadline::After(d) => Some(d),
        }
    }

    /// The effective deadline against a default (`None`: no deadline).
    pub fn resolve(self, default: Option<Duration>) -> Option<Duration> {
        match self {
            Deadline::Default => default.filter(|d| !d.is_zero()),
            Deadline::None => None,
            Deadline::After(d) => Some(d),
        }
    }
}

/// The surface a request came through; it namespaces owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Surface {
    /// The `cellhost` command: one-shot commands and the daemon.
    Cli,
    /// The HTTP API (`serve`).
    Http,
    /// The MCP server.
    Mcp,
    /// A library caller.
    Library,
}

impl Surface {
    /// The prefix of the surface's owners (`cli`, `http`, `mcp`, `lib`).
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Cli => "cli",
            Surface::Http => "http",
            Surface::Mcp => "mcp",
            Surface::Library => "lib",
        }
    }

    /// The owner of `principal`'s sessions on this surface:
    /// `<surface>:<principal>` (`cli:alice`, `http:local`).
    pub fn owner(self, principal: &str) -> String {
        format!("{}:{principal}", self.as_str())
    }
}

/// The name of the user this process runs as (from the passwd database,
/// else the uid as a number): the principal of CLI owners.
pub fn local_user() -> String {
    let uid = rustix::process::getuid().as_raw();
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| {
            p.lines().find_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                let _pw = f.next()?;
                (f.next()?.parse::<u32>().ok()? == uid && !name.is_empty()).then(|| name.to_string())
            })
        })
        .unwrap_or_else(|| uid.to_string())
}

/// The owner of the CLI's sessions (one-shot commands and the daemon):
/// `cli:<user>`.
pub fn cli_owner() -> String {
    Surface::Cli.owner(&local_user())
}

/// Errors of a request, each with a stable [`RequestError::code`] that
/// every surface reports (HTTP derives its status from it, the daemon and
/// MCP send it as is).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The request is malformed (a bad name, timeout, limit, mode).
    #[error("{message}")]
    BadRequest {
        /// Why.
        message: String,
    },
    /// The owner has no such session (or no live kernel where one is
    /// needed).
    #[error("no session named {session:?}{}", if *.live { " with a live kernel" } else { "" })]
    SessionNotFound {
        /// The session asked for.
        session: String,
        /// Whether a live kernel was what was missing.
        live: bool,
    },
    /// The owner's session of that name runs only in other working
    /// directories than the one the request named (the daemon keys a
    /// session by its directory, so `kill NAME` in one directory never
    /// reaches a same-named session of another).
    #[error(
        "no session named {session:?} works in {}; it runs in {}: run the command from there",
        dir_label(.cwd),
        .elsewhere.iter().map(dir_label).collect::<Vec<_>>().join(", ")
    )]
    SessionInOtherDirectory {
        /// The session asked for.
        session: String,
        /// The directory the request named (`None`: the session directory).
        cwd: Option<PathBuf>,
        /// The directories the owner's sessions of that name work in.
        elsewhere: Vec<Option<PathBuf>>,
    },
    /// The session's kernel is running (or queueing) a cell and the request
    /// did not ask to queue.
    #[error(
        "session {session:?} is busy running cell {cell}; ask to queue (queue: true, --queue) or interrupt it"
    )]
    SessionBusy {
        /// The session.
        session: String,
        /// The cell it runs (`queued` when only queued ones wait).
        cell: String,
    },
    /// The journal could not be read or written.
    #[error("journal: {message}")]
    Journal {
        /// Why.
        message: String,
    },
    /// A path a files request named is not below the session's workdir
    /// (absolute, `..`, a link or mount leading out, NUL, too long) or is
    /// not a file the host reads (a special file, a hard link).
    #[error("path {path:?} refused: {reason}")]
    PathRefused {
        /// The path as asked.
        path: String,
        /// Why.
        reason: String,
    },
    /// No file at that path of the workdir.
    #[error("no file {path:?} in the session's workdir")]
    FileNotFound {
        /// The path, relative to the workdir.
        path: String,
    },
    /// A file (or a byte range of one) is larger than the surface's cap.
    #[error("{path:?} is larger than the cap of {max_bytes} bytes")]
    FileTooLarge {
        /// The path, relative to the workdir.
        path: String,
        /// The cap.
        max_bytes: u64,
    },
    /// A byte range starts past the end of the file.
    #[error("offset {offset} is past the end of {path:?} ({size} bytes)")]
    RangeNotSatisfiable {
        /// The path, relative to the workdir.
        path: String,
        /// The asked offset.
        offset: u64,
        /// The file's size.
        size: u64,
    },
    /// No image display of that id among the owner's cells of the session.
    #[error("no image display {id:?} in this session")]
    DisplayNotFound {
        /// The display id asked for.
        id: String,
    },
    /// No submitted cell of that id for this owner.
    #[error("no submitted cell {cell:?}")]
    CellNotFound {
        /// The cell asked for.
        cell: String,
    },
    /// Reading or writing a file of the workdir failed.
    #[error("{path:?}: {message}")]
    FileIo {
        /// The path, relative to the workdir.
        path: String,
        /// Why.
        message: String,
    },
    /// A notebook's language has no runtime here (`kernelspec.language` /
    /// `language_info.name`), or not the one the host's kernels run.
    #[error(
        "the notebook's language is {language:?}; cellhost runs {} notebooks here (runtimes: {})",
        runtime,
        supported.join(", ")
    )]
    UnsupportedLanguage {
        /// The notebook's language, lower-cased.
        language: String,
        /// The languages this build has runtimes for.
        supported: Vec<String>,
        /// The language of the runtime the host's kernels run.
        runtime: String,
    },
    /// A package install was refused or failed
    /// ([`crate::packages::PackageError::code`]).
    #[error(transparent)]
    Package(#[from] crate::packages::PackageError),
    /// A session's limit asked for more than the operator's maximum
    /// (`[limits.max]`, see [`crate::limits`]).
    #[error("limits.{field} = {value} is over the maximum of {max} this host allows")]
    LimitOverMax {
        /// The field (`memory_mb`, `pids`, `cpu`, `disk_mb`, `cell_timeout_s`).
        field: &'static str,
        /// The value asked for (0 for `cell_timeout_s`: no deadline).
        value: f64,
        /// The maximum.
        max: f64,
    },
    /// A write into the session's workdir would pass its disk cap
    /// (`disk_mb`).
    #[error(
        "{path:?}: writing {bytes} bytes would pass the session's disk cap of {max_mb} MiB ({used} bytes used)"
    )]
    DiskFull {
        /// The path, relative to the workdir.
        path: String,
        /// Bytes the write brings.
        bytes: u64,
        /// Bytes the workdir holds now.
        used: u64,
        /// The cap, in MiB.
        max_mb: u64,
    },
    /// A session of that name exists already (a live kernel, journaled
    /// cells or a working directory with files): a fork never takes over
    /// another session.
    #[error("session {session:?} exists already; fork to a new name")]
    SessionExists {
        /// The name asked for.
        session: String,
    },
    /// The session runs Python threads of its cells that a fork cannot
    /// carry into another kernel; the request did not accept dropping them
    /// (`threads: "drop"`).
    #[error(
        "session {session:?} runs threads a fork cannot carry ({}); stop them, or fork with threads \"drop\" to start the fork without them",
        .threads.join(", ")
    )]
    ThreadsRunning {
        /// The session.
        session: String,
        /// The threads, `name (native id)`.
        threads: Vec<String>,
    },
    /// The fork could not be made (the snapshot or its restore failed).
    #[error("fork of session {session:?} failed: {reason}")]
    ForkFailed {
        /// The parent session.
        session: String,
        /// Why.
        reason: String,
    },
    /// The session runs on another placement than the request named: a
    /// session keeps the placement it was created with.
    #[error(
        "session {session:?} runs on placement {placement:?}; a session keeps the placement it was created with (use another session name for {asked:?}, or kill this one first)"
    )]
    PlacementMismatch {
        /// The session.
        session: String,
        /// The placement its live kernel runs on.
        placement: String,
        /// The placement the request asked for.
        asked: String,
    },
    /// The registry refused or the kernel failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl RequestError {
    /// A [`RequestError::BadRequest`].
    pub fn bad_request(message: impl Into<String>) -> Self {
        RequestError::BadRequest {
            message: message.into(),
        }
    }

    /// The stable code: `bad_request`, `session_not_found`, `session_busy`,
    /// the package codes (`invalid_package_spec`, `shared_venv_refused`,
    /// `install_failed`, `installer_unavailable`),
    /// `limit_over_max`, `disk_full`, `session_exists`, `threads_running`,
    /// `fork_failed`, `placement_mismatch`, `journal_failed`, `unsupported_language`, `kernel_failed`, `stale_generation` (a request
    /// named a replaced kernel generation), `restore_failed`,
    /// `checkpoint_unavailable` (a checkpoint mode this host or session
    /// cannot have: `process` without a working CRIU, with CRIU's error, or
    /// with a layer CRIU cannot restore, with `layer`),
    /// `checkpoint_failed`, or the
    /// registry's ([`RegistryError::code`]: `sandbox_below_floor`,
    /// `sandbox_unavailable`, `registry_full`, `shut_down`). The one
    /// mapping of errors to codes: the daemon and MCP send it as is, HTTP
    /// derives its status from it.
    pub fn code(&self) -> &'static str {
        match self {
            RequestError::BadRequest { .. } => "bad_request",
            RequestError::SessionNotFound { .. } | RequestError::SessionInOtherDirectory { .. } => {
                "session_not_found"
            }
            RequestError::SessionBusy { .. } => "session_busy",
            RequestError::Journal { .. } => "journal_failed",
            RequestError::PathRefused { .. } => "path_refused",
            RequestError::FileNotFound { .. } => "file_not_found",
            RequestError::FileTooLarge { .. } => "file_too_large",
            RequestError::RangeNotSatisfiable { .. } => "range_not_satisfiable",
            RequestError::FileIo { .. } => "file_io_failed",
            RequestError::DisplayNotFound { .. } => "display_not_found",
            RequestError::CellNotFound { .. } => "cell_not_found",
            RequestError::UnsupportedLanguage { .. } => "unsupported_language",
            RequestError::Package(e) => e.code(),
            RequestError::LimitOverMax { .. } => "limit_over_max",
            RequestError::DiskFull { .. } => "disk_full",
            RequestError::SessionExists { .. } => "session_exists",
            RequestError::ThreadsRunning { .. } => "threads_running",
            RequestError::ForkFailed { .. } => "fork_failed",
            RequestError::PlacementMismatch { .. } => "placement_mismatch",
            RequestError::Registry(RegistryError::Kernel(KernelError::KernelBusy { .. })) => "session_busy",
            RequestError::Registry(RegistryError::Kernel(KernelError::InvalidRequest(_))) => "bad_request",
            RequestError::Registry(RegistryError::Kernel(KernelError::StaleGeneration { .. })) => {
                "stale_generation"
            }
            RequestError::Registry(e) => match e.code() {
                "kernel" => "kernel_failed",
                "restore" => "restore_failed",
                c => c,
            },
        }
    }

    /// The caller's mistake (exit 2 on the CLI, 4xx on HTTP) rather than
    /// a failure of the host or the kernel.
    pub fn is_usage(&self) -> bool {
        matches!(
            self.code(),
            "bad_request"
                | "session_not_found"
                | "sandbox_below_floor"
                | "path_refused"
                | "file_not_found"
                | "file_too_large"
                | "range_not_satisfiable"
                | "display_not_found"
                | "cell_not_found"
                | "unsupported_language"
                | "invalid_package_spec"
                | "shared_venv_refused"
                | "limit_over_max"
                | "disk_full"
                | "session_exists"
                | "threads_running"
                | "placement_mismatch"
        )
    }

    /// The error as every surface's envelope carries it:
    /// `{"code", "message", <fields>}`.
    pub fn to_json(&self) -> serde_json::Value {
        if let RequestError::Package(e) = self {
            return e.to_json();
        }
        let mut v = serde_json::json!({"code": self.code(), "message": self.to_string()});
        match self {
            RequestError::SessionNotFound { session, .. } => v["session"] = session.clone().into(),
            RequestError::PlacementMismatch {
                session,
                placement,
                asked,
            } => {
                v["session"] = session.clone().into();
                v["placement"] = placement.clone().into();
                v["asked"] = asked.clone().into();
            }
            RequestError::SessionInOtherDirectory {
                session,
                cwd,
                elsewhere,
            } => {
                v["session"] = session.clone().into();
                v["cwd"] = cwd.as_ref().map(|c| c.display().to_string()).into();
                v["elsewhere"] = elsewhere
                    .iter()
                    .map(|d| d.as_ref().map(|c| c.display().to_string()))
                    .collect::<Vec<_>>()
                    .into();
            }
            RequestError::PathRefused { path, reason } => {
                v["path"] = path.clone().into();
                v["reason"] = reason.clone().into();
            }
            RequestError::FileNotFound { path } | RequestError::FileIo { path, .. } => {
                v["path"] = path.clone().into()
            }
            RequestError::DisplayNotFound { id } => v["id"] = id.clone().into(),
            RequestError::CellNotFound { cell } => v["cell"] = cell.clone().into(),
            RequestError::FileTooLarge { path, max_bytes } => {
                v["path"] = path.clone().into();
                v["max_bytes"] = (*max_bytes).into();
            }
            RequestError::RangeNotSatisfiable { path, offset, size } => {
                v["path"] = path.clone().into();
                v["offset"] = (*offset).into();
                v["size"] = (*size).into();
            }
            RequestError::SessionBusy { session, cell } => {
                v["session"] = session.clone().into();
                v["cell"] = cell.clone().into();
            }
            RequestError::SessionExists { session } | RequestError::ForkFailed { session, .. } => {
                v["session"] = session.clone().into();
            }
            RequestError::ThreadsRunning { session, threads } => {
                v["session"] = session.clone().into();
                v["threads"] = threads.clone().into();
            }
            RequestError::Registry(RegistryError::Kernel(KernelError::KernelBusy { kernel, cell })) => {
                v["kernel"] = kernel.clone().into();
                v["cell"] = cell.clone().into();
            }
            RequestError::Registry(RegistryError::Kernel(
                KernelError::SandboxUnavailable { layer, .. } | KernelError::WeakSandbox { layer, .. },
            )) => {
                v["layer"] = layer.clone().into();
            }
            RequestError::Registry(RegistryError::CheckpointLayer { layer, .. }) => {
                v["layer"] = layer.clone().into();
            }
            RequestError::Registry(RegistryError::SandboxBelowFloor(b)) => {
                v["requested"] = b.requested.as_str().into();
                v["floor"] = b.floor.as_str().into();
            }
            RequestError::UnsupportedLanguage {
                language,
                supported,
                runtime,
            } => {
                v["language"] = language.clone().into();
                v["supported"] = supported.clone().into();
                v["runtime"] = runtime.clone().into();
            }
            RequestError::LimitOverMax { field, value, max } => {
                v["field"] = (*field).into();
                v["value"] = (*value).into();
                v["max"] = (*max).into();
            }
            RequestError::DiskFull {
                path,
                bytes,
                used,
                max_mb,
            } => {
                v["path"] = path.clone().into();
                v["bytes"] = (*bytes).into();
                v["used"] = (*used).into();
                v["max_mb"] = (*max_mb).into();
            }
            RequestError::Registry(RegistryError::Full { max }) => {
                v["max_live_kernels"] = (*max as u64).into()
            }
            _ => {}
        }
        v
    }
}

/// A registry error as a request's: a busy kernel is `session_busy` of
/// `session`.
pub(crate) fn busy_as_session_busy(session: &str) -> impl FnOnce(RegistryError) -> RequestError + '_ {
    move |e| match e {
        RegistryError::Kernel(KernelError::KernelBusy { cell, .. }) => RequestError::SessionBusy {
            session: session.to_string(),
            cell,
        },
        e => e.into(),
    }
}

/// Checks a session name: 1-128 bytes, no control characters.
///
/// # Errors
/// [`RequestError::BadRequest`].
pub fn validate_session(name: &str) -> Result<(), RequestError> {
    if name.is_empty() || name.len() > MAX_SESSION_NAME {
        return Err(RequestError::bad_request(format!(
            "a session name is 1-{MAX_SESSION_NAME} bytes, got {}",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(RequestError::bad_request(
            "a session name has no control characters",
        ));
    }
    Ok(())
}

/// What names a session's kernel: owner, session, and the optional
/// interpreter and sandbox mode a request asks for (each defaulting to the
/// registry's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSpec {
    /// The owner (see [`Surface::owner`]).
    pub owner: String,
    /// The session name.
    pub session: String,
    /// Interpreter (`None`: the registry's for the language).
    pub python: Option<PathBuf>,
    /// Language (a name [`cellhost_kernel::for_language`] knows: `python`,
    /// `r`). `None`: the language of the owner's live session of that name,
    /// else the registry's. A language other than the live session's is a
    /// [`RequestError::BadRequest`]: a session keeps the language it was
    /// created with.
    pub language: Option<String>,
    /// Sandbox mode (`None`: the registry's floor; never below it).
    pub sandbox: Option<SandboxMode>,
    /// Where the session's kernels run: `local` or the name of a
    /// configured `[placement.NAME]` table. `None`: the placement of the
    /// owner's live session of that name, else the configured default. An
    /// unknown name is a [`RequestError::BadRequest`]; another placement
    /// than the live session's is [`RequestError::PlacementMismatch`].
    pub placement: Option<String>,
    /// Working directory (`None`: the registry's). Part of the key: the
    /// same name in two directories is two sessions, so a session never
    /// works in another caller's directory. Must be an absolute path to an
    /// existing directory ([`RequestError::BadRequest`] otherwise).
    pub cwd: Option<PathBuf>,
    /// The session's own environment, applied when the session's kernels
    /// start ([`Registry::set_session_env`]); a session that already runs
    /// keeps its own.
    pub env: crate::SessionEnv,
    /// The limits the request asks for ([`crate::limits`]); empty: the
    /// configured ones for the session's name. Applied when the session's
    /// kernels start: a session that already runs keeps its limits unless
    /// the request restarts it.
    pub limits: crate::limits::SessionLimits,
    /// The session's checkpoint mode (`None`: what it has, else the
    /// configured one for its name); set from this request on
    /// ([`Registry::set_checkpoint_mode`]).
    pub checkpoint: Option<crate::checkpoint::CheckpointMode>,
    /// What the session gets back after an unexpected death of its kernel
    /// (`None`: what it has, else the configured one for its name); set
    /// from this request on ([`Registry::set_restore_mode`]).
    pub restore: Option<crate::replay::RestoreMode>,
}

impl SessionSpec {
    /// `session` of `owner` with the registry's interpreter and mode.
    pub fn new(owner: impl Into<String>, session: impl Into<String>) -> Self {
        SessionSpec {
            owner: owner.into(),
            session: session.into(),
            python: None,
            language: None,
            sandbox: None,
            placement: None,
            cwd: None,
            env: crate::SessionEnv::new(),
            limits: crate::limits::SessionLimits::default(),
            checkpoint: None,
            restore: None,
        }
    }

    /// Resolves the request's limits against the configured policy and
    /// sets them as the session's ([`Registry::set_session_limits`]);
    /// `replace`: also for a session that runs (its next kernel gets them).
    /// `false` when a running session kept other limits. A request without
    /// limits changes nothing (a session keeps what it was created with).
    ///
    /// # Errors
    /// `bad_request` (a value out of range), `limit_over_max`.
    pub fn apply_limits(&self, reg: &Registry, key: &Key, replace: bool) -> Result<bool, RequestError> {
        if self.limits.is_empty() {
            return Ok(true);
        }
        let resolved = reg
            .config()
            .limits
            .resolve(&key.session, &self.limits, &reg.host_limits())?;
        Ok(reg.set_session_limits(key, resolved, replace))
    }

    /// The registry key, validated.
    ///
    /// # Errors
    /// [`RequestError::BadRequest`] for a bad name;
    /// `sandbox_below_floor` for a mode weaker than the registry's.
    pub fn key(&self, reg: &Registry) -> Result<Key, RequestError> {
        validate_session(&self.session)?;
        let mut key = reg.key_with_sandbox(&self.owner, &self.session, self.sandbox)?;
        if let Some(d) = &self.cwd {
            key.cwd = Some(validate_cwd(d)?);
        }
        // The live session of this name in this directory (a same-named
        // session of another directory is another session).
        let live = live_keys(
            reg,
            &self.owner,
            &self.session,
            &CwdScope::Exactly(key.cwd.clone()),
        )
        .unwrap_or_default();
        let language = match &self.language {
            Some(asked) => {
                let runtime = cellhost_kernel::for_language(asked).ok_or_else(|| {
                    RequestError::bad_request(format!(
                        "unknown language {asked:?} (known: {})",
                        cellhost_kernel::runtime::LANGUAGES.join(", ")
                    ))
                })?;
                let name = runtime.name().to_string();
                if let Some(other) = live.iter().find(|k| k.language != name) {
                    return Err(RequestError::bad_request(format!(
                        "session {:?} runs {}; a session keeps the language it was created with (use another session name for {name}, or kill this one first)",
                        self.session, other.language
                    )));
                }
                name
            }
            None => live
                .first()
                .map_or_else(|| key.language.clone(), |k| k.language.clone()),
        };
        if language != key.language {
            key.python = reg
                .config()
                .interpreter(&language)
                .map_err(|e| RequestError::Registry(RegistryError::Kernel(e)))?;
            key.language = language;
        }
        if let Some(p) = &self.python {
            key.python = p.clone();
        }
        key.placement = match &self.placement {
            Some(asked) => {
                reg.config()
                    .placements
                    .check(asked)
                    .map_err(RequestError::bad_request)?;
                if let Some(other) = live.iter().find(|k| k.placement != *asked) {
                    return Err(RequestError::PlacementMismatch {
                        session: self.session.clone(),
                        placement: other.placement.clone(),
                        asked: asked.clone(),
                    });
                }
                asked.clone()
            }
            // The live session's, else the one this session ran on before
            // its kernel died (the same session otherwise), else the
            // default.
            None => live
                .first()
                .map(|k| k.placement.clone())
                .or_else(|| {
                    reg.known_keys(&self.owner, &self.session)
                        .into_iter()
                        .find(|k| {
                            Key {
                                placement: key.placement.clone(),
                                ..k.clone()
                            } == key
                        })
                        .map(|k| k.placement)
                })
                .unwrap_or_else(|| key.placement.clone()),
        };
        if let Some(mode) = self.checkpoint {
            reg.set_checkpoint_mode(&key, mode)?;
        }
        if let Some(mode) = self.restore {
            reg.set_restore_mode(&key, mode);
        }
        Ok(key)
    }
}

/// A requested working directory: absolute, an existing directory (links
/// resolved), never `/`.
///
/// # Errors
/// [`RequestError::BadRequest`] naming the path and why.
pub fn validate_cwd(dir: &std::path::Path) -> Result<PathBuf, RequestError> {
    let bad = |why: &str| RequestError::bad_request(format!("working directory {}: {why}", dir.display()));
    if !dir.is_absolute() {
        return Err(bad("not an absolute path"));
    }
    let real = std::fs::canonicalize(dir).map_err(|e| bad(&e.to_string()))?;
    if !std::fs::metadata(&real).is_ok_and(|m| m.is_dir()) {
        return Err(bad("not a directory"));
    }
    if real == std::path::Path::new("/") {
        return Err(bad("the root directory is never a kernel's workdir"));
    }
    Ok(real)
}

/// A session's working directory as an error names it.
fn dir_label(d: &Option<PathBuf>) -> String {
    d.as_deref().map_or_else(
        || "its session directory".to_string(),
        |c| c.display().to_string(),
    )
}

/// Which working directories a request by session name reaches.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CwdScope {
    /// Every directory the owner's session of that name works in (HTTP
    /// and MCP sessions have one: their session directory).
    #[default]
    Any,
    /// Only the session working in this directory (`None`: in its session
    /// directory) — the daemon's sessions, keyed by the caller's directory.
    Exactly(Option<PathBuf>),
}

impl CwdScope {
    /// Whether a session working in `cwd` is within the scope.
    pub fn admits(&self, cwd: &Option<PathBuf>) -> bool {
        match self {
            CwdScope::Any => true,
            CwdScope::Exactly(d) => d == cwd,
        }
    }
}

/// The key a request on one live kernel of the owner's session `name`
/// acts on (a checkpoint, a pause): the name checked, then the first of
/// [`live_keys`] within `scope`.
///
/// # Errors
/// `bad_request` for the name ([`validate_session`]); `session_not_found`
/// as [`live_keys`].
pub(crate) fn live_key(
    reg: &Registry,
    owner: &str,
    name: &str,
    scope: &CwdScope,
) -> Result<Key, RequestError> {
    validate_session(name)?;
    live_keys(reg, owner, name, scope)?
        .into_iter()
        .next()
        .ok_or_else(|| RequestError::SessionNotFound {
            session: name.to_string(),
            live: true,
        })
}

/// The owner's keys of session `name` with a live kernel (any interpreter
/// or mode) within `scope`.
///
/// # Errors
/// `session_not_found`: none is live ([`RequestError::SessionNotFound`]),
/// or only in other directories than the scope's
/// ([`RequestError::SessionInOtherDirectory`], naming them).
pub(crate) fn live_keys(
    reg: &Registry,
    owner: &str,
    name: &str,
    scope: &CwdScope,
) -> Result<Vec<Key>, RequestError> {
    let all: Vec<Key> = reg
        .sessions_of(owner)
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.session == name)
        .collect();
    if all.is_empty() {
        return Err(RequestError::SessionNotFound {
            session: name.to_string(),
            live: true,
        });
    }
    let (mine, other): (Vec<Key>, Vec<Key>) = all.into_iter().partition(|k| scope.admits(&k.cwd));
    if let (true, CwdScope::Exactly(cwd)) = (mine.is_empty(), scope) {
        let mut elsewhere: Vec<Option<PathBuf>> = other.into_iter().map(|k| k.cwd).collect();
        elsewhere.sort();
        elsewhere.dedup();
        return Err(RequestError::SessionInOtherDirectory {
            session: name.to_string(),
            cwd: cwd.clone(),
            elsewhere,
        });
    }
    Ok(mine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_has_one_spelling_of_none() {
        assert_eq!(Deadline::from_secs(None).ok(), Some(Deadline::Default));
        assert_eq!(Deadline::from_secs(Some(0.0)).ok(), Some(Deadline::None));
        assert_eq!(
            Deadline::from_secs(Some(1.5)).ok(),
            Some(Deadline::After(Duration::from_millis(1500)))
        );
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e300] {
            let e = Deadline::from_secs(Some(bad)).expect_err("refused");
            assert_eq!(e.code(), "bad_request");
        }
        assert_eq!(Deadline::None.as_exec_timeout(), Some(Duration::ZERO));
        assert_eq!(Deadline::Default.as_exec_timeout(), None);
        let d = Some(Duration::from_secs(7));
        assert_eq!(Deadline::Default.resolve(d), d);
        assert_eq!(Deadline::Default.resolve(Some(Duration::ZERO)), None);
        assert_eq!(Deadline::None.resolve(d), None);
    }

    #[test]
    fn owners_are_namespaced_by_surface() {
        assert_eq!(Surface::Cli.owner("local"), "cli:local");
        assert_eq!(Surface::Http.owner("local"), "http:local");
        assert_ne!(Surface::Cli.owner("local"), Surface::Http.owner("local"));
        assert!(cli_owner().starts_with("cli:"));
    }

    #[test]
    fn session_names_are_validated() {
        assert!(validate_session("ana").is_ok());
        assert!(validate_session("").is_err());
        assert!(validate_session(&"x".repeat(129)).is_err());
        assert!(validate_session("a\nb").is_err());
    }

    #[test]
    fn errors_carry_codes_and_fields() {
        let e = RequestError::SessionBusy {
            session: "s".into(),
            cell: "c1".into(),
        };
        assert_eq!(e.code(), "session_busy");
        let v = e.to_json();
        assert_eq!(v["code"], "session_busy");
        assert_eq!(v["cell"], "c1");
        let e = RequestError::SessionNotFound {
            session: "s".into(),
            live: false,
        };
        assert!(e.is_usage());
        assert_eq!(e.to_json()["session"], "s");
        let e = RequestError::PlacementMismatch {
            session: "s".into(),
            placement: "slurm".into(),
            asked: "local".into(),
        };
        assert_eq!(e.code(), "placement_mismatch");
        assert!(e.is_usage());
        let v = e.to_json();
        assert_eq!(
            (&v["session"], &v["placement"], &v["asked"]),
            (&"s".into(), &"slurm".into(), &"local".into())
        );
    }
}
