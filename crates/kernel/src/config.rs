//! Configuration of one kernel and the interpreter it runs.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cellhost_capture::{Redactor, StreamLimits};
use cellhost_sandbox::cgroup::CgroupLimits;
use cellhost_sandbox::profile::SandboxProfile;

use crate::error::KernelError;
use crate::runtime::WorkerRuntime;
use crate::tools::ToolHost;

/// Everything needed to start one kernel.
#[derive(Clone)]
pub struct KernelConfig {
    /// Absolute path of the interpreter the runtime runs (any environment
    /// of it: a venv, a conda env).
    pub python: PathBuf,
    /// The language of the worker: how to start it, its boot files, its
    /// hints (default: [`default_runtime`](crate::runtime::default_runtime)).
    pub runtime: Arc<dyn WorkerRuntime>,
    /// Working directory of the worker (default: the host's).
    pub cwd: Option<PathBuf>,
    /// The worker's whole environment (already filtered by the allowlist).
    pub env: Vec<(OsString, OsString)>,
    /// Where figures and spill files of this kernel's cells go.
    pub session_dir: PathBuf,
    /// Session name, for results and error messages.
    pub session: String,
    /// Generation number of this kernel within its session.
    pub generation: u64,
    /// Binary that implements the kernel init (`__cellhost-kernel-init`);
    /// default: `CELLHOST_LAUNCHER`, else the running executable (through
    /// `/proc/self/exe`, so a binary replaced on disk keeps working).
    pub launcher: Option<PathBuf>,
    /// Inline caps for stdout.
    pub stdout_limits: StreamLimits,
    /// Inline caps for stderr.
    pub stderr_limits: StreamLimits,
    /// Masks secrets in everything a cell outputs.
    pub redactor: Arc<Redactor>,
    /// Bounds on the displays (and the last expression's bundle) one cell
    /// may leave on the host: count, bytes, inline text.
    pub display_limits: DisplayLimits,
    /// Default per-cell timeout (DESIGN.md: 300 s); `None` = no deadline.
    pub cell_timeout: Option<Duration>,
    /// Time between an interrupt and the kill of the whole tree (2 s).
    pub interrupt_grace: Duration,
    /// How long the worker may take to say `ready` (60 s: a cold venv import
    /// of a large site-packages can take seconds on a loaded machine).
    pub startup_timeout: Duration,
    /// Host tools the cells may call (`None`: no tools).
    pub tool_host: Option<Arc<dyn ToolHost>>,
    /// Host calls allowed per cell (DESIGN.md: 50).
    pub tool_budget: u32,
    /// cgroup limits of the kernel's whole tree (processes, memory, CPU);
    /// empty = no cgroup is made. Limits set here override the sandbox
    /// profile's defaults, and failing to apply them fails the spawn.
    pub limits: CgroupLimits,
    /// Confinement of the worker (default: mode `auto`, network off,
    /// memory 4 GiB, 512 processes); see [`SandboxProfile`].
    pub sandbox: SandboxProfile,
    /// Egress by allowlist (a session whose network policy is a list of
    /// rules): the kernel's network namespace reaches only the host-side
    /// proxy serving these rules, and each cell's result carries what it
    /// refused. Needs a sandbox with its own network namespace (network
    /// off in the profile); `None` (default): the profile's network.
    pub egress: Option<Arc<cellhost_egress::Egress>>,
    /// The session's package overlay (its root; the packages are in
    /// `<root>/site`), written by the host only: read-only in the kernel's
    /// view, and `site` goes on the worker's `sys.path` before
    /// site-packages. `None`: no overlay.
    pub packages_dir: Option<PathBuf>,
    /// Starts the worker somewhere else (a placement of the
    /// `cellhost-remote` crate); `None` (default): a local worker.
    pub starter: Option<Arc<dyn KernelStarter>>,
    /// The kernel may be dumped by a process checkpoint (CRIU): its init
    /// and worker run under `no_new_privs` (setuid and file-capability
    /// programs do not raise privileges in the tree). CRIU's unprivileged
    /// restore needs it on a host whose capability bounding set is
    /// reduced (a container's): it trims the restored tasks' bounding set
    /// without `CAP_SETPCAP` only when the image records `no_new_privs`.
    /// Default `false`.
    pub checkpointable: bool,
}

/// Starts a kernel's worker other than as a local process, for
/// [`Kernel::spawn`](crate::Kernel::spawn): builds a link to the worker and
/// completes the kernel with [`Kernel::attach`](crate::Kernel::attach).
/// The config it gets has `starter` cleared.
pub trait KernelStarter: Send + Sync {
    /// The placement's name (`[placement.<name>]`), for logs and results.
    fn name(&self) -> &str;

    /// Starts the worker and completes the kernel.
    ///
    /// # Errors
    /// [`KernelError::Remote`] with the placement's code, or any error of
    /// [`Kernel::attach`](crate::Kernel::attach).
    fn start(
        &self,
        config: KernelConfig,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<crate::Kernel, KernelError>> + Send + '_>>;
}

/// What one cell's displays may take on the host. Display frames are
/// written by the host, outside the kernel's rlimits and cgroup, so the
/// host bounds them: a display past `max_count`, or one whose data would
/// pass `max_bytes`, is dropped (counted in the result's
/// `displays_dropped`, and a note says so); the last expression's bundle
/// counts against the same budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisplayLimits {
    /// Displays kept per cell (default 100).
    pub max_count: usize,
    /// Bytes of display data kept per cell, files and inline text together
    /// (default 50,000,000: a stream's spill budget,
    /// [`StreamLimits::spill_bytes`]). Binary data counts as its base64 text.
    pub max_bytes: u64,
    /// Longest text entry (`text/html`, `text/plain`, …) kept inline, in
    /// bytes (default 1 MiB); a longer one is replaced by a note.
    pub max_inline_text: usize,
}

impl Default for DisplayLimits {
    fn default() -> Self {
        DisplayLimits {
            max_count: 100,
            max_bytes: 50_000_000,
            max_inline_text: 1 << 20,
        }
    }
}

impl std::fmt::Debug for KernelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelConfig")
            .field("python", &self.python)
            .field("runtime", &self.runtime.name())
            .field("cwd", &self.cwd)
            .field("session_dir", &self.session_dir)
            .field("session", &self.session)
            .field("generation", &self.generation)
            .field("cell_timeout", &self.cell_timeout)
            .field("interrupt_grace", &self.interrupt_grace)
            .field("sandbox", &self.sandbox.mode)
            .field("starter", &self.starter.as_ref().map(|s| s.name().to_string()))
            .finish_non_exhaustive()
    }
}

impl KernelConfig {
    /// Defaults of DESIGN.md for interpreter `python`, with the session's
    /// files under `session_dir` and the host's environment filtered by
    /// the allowlist (withheld secret values are registered with the redactor).
    pub fn new(python: impl Into<PathBuf>, session_dir: impl Into<PathBuf>) -> Self {
        let filtered = cellhost_sandbox::env::filter_env(std::env::vars_os(), &[]);
        let mut redactor = Redactor::new(Default::default()).unwrap_or_else(|_| Redactor::disabled());
        redactor.add_secrets(filtered.withheld_secret_values);
        KernelConfig {
            python: python.into(),
            runtime: crate::runtime::default_runtime(),
            cwd: None,
            env: filtered.pass,
            session_dir: session_dir.into(),
            session: "default".into(),
            generation: 1,
            launcher: None,
            stdout_limits: StreamLimits::stdout_default(),
            stderr_limits: StreamLimits::stderr_default(),
            redactor: Arc::new(redactor),
            display_limits: DisplayLimits::default(),
            cell_timeout: Some(Duration::from_secs(300)),
            interrupt_grace: Duration::from_secs(2),
            startup_timeout: Duration::from_secs(60),
            tool_host: None,
            tool_budget: 50,
            limits: CgroupLimits::default(),
            sandbox: SandboxProfile::default(),
            egress: None,
            packages_dir: None,
            starter: None,
            checkpointable: false,
        }
    }

    /// Registers an exact secret value: it is masked in everything the
    /// kernel's cells output (values shorter than 6 bytes are ignored, see
    /// [`Redactor::add_secrets`]).
    pub fn register_secret(&mut self, value: impl Into<String>) {
        Arc::make_mut(&mut self.redactor).add_secrets([value.into()]);
    }

    /// Names of the tools cells may call.
    pub fn tool_names(&self) -> Vec<String> {
        self.tool_host.as_ref().map(|t| t.names()).unwrap_or_default()
    }

    /// `session/generation`, as error messages name a kernel.
    pub fn label(&self) -> String {
        format!("{}/{}", self.session, self.generation)
    }

    /// The worker's configuration, sent as the second message on its control
    /// socket (never in its environment, which `/proc/self/environ` keeps):
    /// `{"tools": [..], "session_dir": .., "session": .., "generation": ..}`.
    pub fn worker_message(&self) -> serde_json::Value {
        serde_json::json!({
            "tools": self.tool_names(),
            "session_dir": self.session_dir,
            "session": self.session,
            "generation": self.generation,
            "packages": self.packages_dir.as_ref().map(|d| d.join("site")),
        })
    }

    /// The binary that implements the kernel init (and the other hidden
    /// subcommands of [`cellhost_sandbox`], such as the workdir holder):
    /// [`KernelConfig::launcher`], else `CELLHOST_LAUNCHER`, else the
    /// running executable.
    ///
    /// # Errors
    /// [`KernelError::Io`] when the running executable cannot be named.
    pub fn launcher_path(&self) -> Result<PathBuf, KernelError> {
        if let Some(p) = &self.launcher {
            return Ok(p.clone());
        }
        if let Some(p) = std::env::var_os("CELLHOST_LAUNCHER") {
            return Ok(PathBuf::from(p));
        }
        // `/proc/self/exe` still reaches this process's binary after the
        // file was replaced on disk (a rebuild, an upgrade), where the path
        // `current_exe()` names would be gone or a different program.
        let proc_exe = PathBuf::from("/proc/self/exe");
        if proc_exe.exists() {
            return Ok(proc_exe);
        }
        std::env::current_exe()
            .map_err(|e| KernelError::io(&self.label(), "locating the kernel init binary", e))
    }
}
