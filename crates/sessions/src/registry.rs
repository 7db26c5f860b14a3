//! The registry: kernels keyed by (owner, session, interpreter, cwd, tool
//! set, sandbox mode), their lifecycle and the journal of every cell.
//!
//! - A [`Key`]'s session outlives its kernels: each new kernel is a new
//!   generation, and the first result after a lost kernel says
//!   `state_reset` and why.
//! - Concurrent first calls for one key spawn exactly one kernel: the slot's
//!   spawn lock is held while a kernel starts, and a kernel still starting
//!   is not "dead" (the others wait for it).
//! - At most `max_live` kernels live; making room evicts the least recently
//!   used kernel that is idle, unattached (no call in flight) and unpinned.
//! - An idle reaper runs on its own timer task (it needs no call to arrive).
//! - Kernels of delegated children ([`Registry::child_key`]) are pinned and
//!   disposed with the child ([`Registry::dispose`]).
//! - [`Registry::shutdown`] kills and reaps every kernel and flushes the
//!   journal.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cellhost_kernel::{CellResult, ExecOptions, Kernel, KernelConfig, KernelError, Lineage, ToolHost};
use cellhost_sandbox::profile::SandboxMode;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::checkpoint::{Checkpoint, CheckpointMode, CheckpointStore};
use crate::journal::{CellStart, Journal};
use crate::last_used::LastUsed;
use cellhost_kernel::RestoredState;

#[path = "registry_checkpoint.rs"]
mod checkpoints;
#[path = "registry_replay.rs"]
mod replays;
use crate::pool::{Pool, SessionTools};
use crate::templates::Templates;
use checkpoints::merge_background;
pub use checkpoints::{CheckpointSummary, PauseReport, PausedSession};

/// Errors of the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The kernel failed.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// Every live kernel is attached, busy or pinned: none can be evicted.
    #[error(
        "all {max} live kernels are busy, attached or pinned; none can be evicted to start another (raise max_live_kernels or dispose sessions)"
    )]
    Full {
        /// The cap.
        max: usize,
    },
    /// A restore could not be done.
    #[error("restore: {0}")]
    Restore(String),
    /// A checkpoint or a pause could not be taken: `code` is
    /// `checkpoint_unavailable` (the mode cannot work for this session or
    /// host: `process` without a working CRIU, a language without
    /// namespace checkpoints, a remote kernel) or `checkpoint_failed` (the
    /// kernel could not write one; the session keeps its kernel).
    #[error("{message}")]
    Checkpoint {
        /// `checkpoint_unavailable` or `checkpoint_failed`.
        code: &'static str,
        /// Why.
        message: String,
    },
    /// A `process` checkpoint refused because of one layer of the
    /// session's confinement that CRIU cannot restore exactly (`landlock`
    /// for a sandboxed kernel, `cgroup` for one with limits): code
    /// `checkpoint_unavailable`, with the layer.
    #[error("{message}")]
    CheckpointLayer {
        /// The layer (`landlock`, `cgroup`).
        layer: String,
        /// Why, and what works instead.
        message: String,
    },
    /// The registry was shut down.
    #[error("the session registry is shut down")]
    ShutDown,
    /// A request asked for a sandbox mode below the registry's floor.
    #[error(transparent)]
    SandboxBelowFloor(#[from] crate::floor::BelowFloor),
}

impl RegistryError {
    /// The stable error code of the error, as every surface reports it
    /// (`sandbox_below_floor`, `sandbox_unavailable`, `registry_full`,
    /// `shut_down`, `restore`, `kernel`, or a remote kernel's
    /// [`KernelError::Remote`] code such as `placement_rejected`).
    pub fn code(&self) -> &'static str {
        match self {
            RegistryError::SandboxBelowFloor(_) => crate::floor::BelowFloor::CODE,
            RegistryError::Kernel(
                KernelError::SandboxUnavailable { .. } | KernelError::WeakSandbox { .. },
            ) => "sandbox_unavailable",
            RegistryError::Kernel(KernelError::Remote { code, .. }) => code,
            RegistryError::Kernel(_) => "kernel",
            RegistryError::Full { .. } => "registry_full",
            RegistryError::Restore(_) => "restore",
            RegistryError::Checkpoint { code, .. } => code,
            RegistryError::CheckpointLayer { .. } => "checkpoint_unavailable",
            RegistryError::ShutDown => "shut_down",
        }
    }
}

/// What identifies a kernel. Owners never see each other's kernels: the
/// owner is part of every key and every lookup.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// Who owns the session (a user, an agent, an API token).
    pub owner: String,
    /// Session name within the owner.
    pub session: String,
    /// Interpreter.
    pub python: PathBuf,
    /// The language (a [`WorkerRuntime`](cellhost_kernel::WorkerRuntime)
    /// name, `python` or `r`): the session's kernels run that language's
    /// worker, and a session keeps the language it was created with.
    pub language: String,
    /// Working directory (`None`: the host's).
    pub cwd: Option<PathBuf>,
    /// Tools the session may call, sorted (`None`: every configured tool).
    pub tools: Option<Vec<String>>,
    /// The sandbox mode the session's kernels run under: part of the key,
    /// so a kernel of another mode (a pooled one included) is never handed
    /// to the session.
    pub sandbox: SandboxMode,
    /// Where the session's kernels run: `local` or the name of a
    /// `[placement.NAME]` table ([`RegistryConfig::placements`]). A
    /// session keeps the placement it was created with.
    pub placement: String,
}

impl Key {
    /// The same key with another working directory.
    pub fn with_cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// The same key limited to `tools`.
    pub fn with_tools(mut self, mut tools: Vec<String>) -> Self {
        tools.sort();
        tools.dedup();
        self.tools = Some(tools);
        self
    }

    fn tools_label(&self) -> String {
        self.tools.as_ref().map_or_else(|| "*".into(), |t| t.join(","))
    }
}

/// Settings of a registry (DESIGN.md defaults in [`RegistryConfig::new`]).
#[derive(Clone)]
pub struct RegistryConfig {
    /// The state directory: staging directories go under `root/staging`.
    pub root: PathBuf,
    /// Configuration every kernel starts from (interpreter, limits,
    /// timeouts, environment, tools).
    pub template: KernelConfig,
    /// Live kernels at most (16).
    pub max_live: usize,
    /// Idle time after which a kernel is reaped (1800 s).
    pub idle_timeout: Duration,
    /// How often the reaper looks (default: a quarter of the idle timeout,
    /// at most 60 s).
    pub reaper_interval: Option<Duration>,
    /// Prespawned kernels for the default configuration (2; 0 = no pool).
    pub pool_size: usize,
    /// Python modules a per-interpreter template imports before it forks
    /// Python kernels (pooled ones and the rest); empty: every Python
    /// kernel starts cold (config `preload`).
    pub preload: Vec<String>,
    /// R packages a per-interpreter R template attaches before it forks R
    /// kernels; empty: every R kernel starts cold (config `r_preload`).
    /// Each language's template gets its own list only.
    pub r_preload: Vec<String>,
    /// Give each session a working directory of its own under this root
    /// (`<root>/<owner>/<session>`, kept across its kernels) instead of the
    /// template's cwd; `None` (default): kernels work in the template's cwd,
    /// or in their session directory when it has none.
    pub session_workdirs: Option<PathBuf>,
    /// Staging directories of dead hosts older than this are swept (7 days).
    pub staging_max_age: Duration,
    /// Interpreters of languages other than the template's, by language
    /// name (`r` → `/usr/bin/R`); a language not listed runs the
    /// interpreter its runtime finds on `PATH`.
    pub interpreters: std::collections::BTreeMap<String, PathBuf>,
    /// Sessions' network policies: the default, per session-name pattern,
    /// the egress proxy's pinned names and bounds ([`crate::network`]).
    pub network: crate::NetworkSettings,
    /// Package installs (config `package_index`, `packages.*`).
    pub packages: crate::packages::PackageSettings,
    /// Limits per session: maximum, default and per-pattern rules
    /// ([`crate::limits`]; config `[limits]`).
    pub limits: crate::limits::LimitsPolicy,
    /// The configured placements (config `placement`,
    /// `[placement.NAME]`): a key's placement other than the default gets
    /// that placement's starter; the default's is the template's own.
    pub placements: crate::placement::Placements,
    /// Checkpoints: the mode per session pattern, the size cap and time
    /// bound ([`crate::checkpoint`]; config `[checkpoint]`).
    pub checkpoint: crate::checkpoint::CheckpointSettings,
    /// What a session gets back after an unexpected death: the mode per
    /// session pattern and the replay's bounds ([`crate::replay`]; config
    /// `[restore]`).
    pub restore: crate::replay::RestoreSettings,
}

impl std::fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("root", &self.root)
            .field("max_live", &self.max_live)
            .field("idle_timeout", &self.idle_timeout)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}

impl RegistryConfig {
    /// Defaults of DESIGN.md around `template`, state under `root`.
    pub fn new(root: impl Into<PathBuf>, template: KernelConfig) -> Self {
        RegistryConfig {
            root: root.into(),
            template,
            max_live: 16,
            idle_timeout: Duration::from_secs(1800),
            reaper_interval: None,
            pool_size: 2,
            preload: Vec::new(),
            r_preload: Vec::new(),
            session_workdirs: None,
            staging_max_age: Duration::from_secs(7 * 24 * 3600),
            interpreters: std::collections::BTreeMap::new(),
            network: crate::NetworkSettings::default(),
            packages: crate::packages::PackageSettings::default(),
            limits: crate::limits::LimitsPolicy::default(),
            placements: crate::placement::Placements::local(),
            checkpoint: crate::checkpoint::CheckpointSettings::default(),
            restore: crate::replay::RestoreSettings::default(),
        }
    }

    /// The interpreter of `language` (a runtime name): the template's for
    /// the template's language, else the configured one, else the one its
    /// runtime finds on `PATH`.
    ///
    /// # Errors
    /// [`KernelError::InvalidRequest`] for a language no runtime speaks;
    /// [`KernelError::Spawn`] when no interpreter can be found.
    pub fn interpreter(&self, language: &str) -> Result<PathBuf, KernelError> {
        let runtime = cellhost_kernel::for_language(language).ok_or_else(|| {
            KernelError::InvalidRequest(format!(
                "unknown language {language:?} (known: {})",
                cellhost_kernel::runtime::LANGUAGES.join(", ")
            ))
        })?;
        if runtime.name() == self.template.runtime.name() {
            return Ok(self.template.python.clone());
        }
        match self.interpreters.get(runtime.name()) {
            Some(p) => runtime.resolve_interpreter(Some(p)),
            None => runtime.resolve_interpreter(None),
        }
    }
}

/// What [`Registry::restore`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RestoreReport {
    /// The journaled generation that was replayed.
    pub from_generation: u64,
    /// The new kernel's generation.
    pub generation: u64,
    /// Cells replayed successfully, in order.
    pub replayed: Vec<String>,
    /// Cells not replayed (or whose replay failed), and why.
    pub skipped: Vec<RestoreSkip>,
}

/// A cell [`Registry::restore`] did not replay.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RestoreSkip {
    /// Cell id.
    pub cell: String,
    /// Its journaled status.
    pub status: String,
    /// Why it was skipped.
    pub reason: String,
}

/// Who asks for a cell and why (journaled with it).
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// `cli:run`, `mcp`, `http`, `restore`, `library`, …
    pub origin: String,
    /// Caller-provided audit context (a JSON object).
    pub context: Option<Value>,
}

impl Origin {
    /// An origin without context.
    pub fn new(origin: impl Into<String>) -> Self {
        Origin {
            origin: origin.into(),
            context: None,
        }
    }
}

#[derive(Default)]
struct SlotInner {
    /// The session's kernels and their generations (the one lifecycle
    /// rule, shared with [`cellhost_kernel::Session`]).
    lineage: Lineage,
    spawning: bool,
    /// The session's own environment, applied to each of its kernels.
    env: crate::SessionEnv,
    /// The session's own network policy (`None`: the configured one).
    network: Option<cellhost_kernel::egress::NetworkPolicy>,
    /// The session's limits as a request resolved them (`None`: the
    /// policy's for its name), applied to each of its kernels.
    limits: Option<crate::limits::ResolvedLimits>,
    /// The host path of the live kernel's working directory.
    workdir: Option<PathBuf>,
    /// The live kernel's own name for its working directory when that is
    /// not the host's (a pooled kernel keeps the path of the pool directory
    /// it was started in, which was moved to the session's): (the kernel's
    /// path, the host's path).
    cwd_alias: Option<(PathBuf, PathBuf)>,
    /// A fork's own working directory, in place of the key's cwd.
    fork_dir: Option<PathBuf>,
    /// The copy-on-write fork the slot's next kernel is made by: the
    /// invitation its parent's worker (host pid) connects to.
    cow: Option<(cellhost_kernel::CowInvite, u32)>,
    /// The session's checkpoint mode as a request (or the journal) set it
    /// (`None`: the configured one for its name).
    ckpt_mode: Option<CheckpointMode>,
    /// The session's latest checkpoint.
    ckpt: Option<Checkpoint>,
    /// The journal's checkpoint row was read (once per slot).
    ckpt_loaded: bool,
    /// When the session was paused (its kernel stopped after a checkpoint).
    paused: Option<i64>,
    /// The generation the checkpoint was last restored into.
    restored_into: u64,
    /// A generation whose kernel came from a process checkpoint: how the
    /// `criu restore` went (its wall time, milliseconds, or why it failed
    /// and a fresh kernel was started instead).
    process_restore: Option<(u64, Result<u64, String>)>,
    /// What the restore of a generation brought back, for that
    /// generation's next result: (generation, note).
    restored_note: Option<(u64, RestoredState)>,
    /// Background output a checkpoint cell saw, for the next result.
    carry_background: Option<cellhost_kernel::BackgroundOutput>,
    /// The execution_count of the session's latest cell.
    last_count: u64,
    /// A directory the live kernel writes and the host reads for
    /// checkpoints when `workdir` is not known (a pooled kernel of a
    /// session without a workdir): (the host's path, the kernel's path).
    ckpt_dir: Option<(PathBuf, PathBuf)>,
    /// The session's restore mode as a request (or the journal) set it
    /// (`None`: the configured one for its name).
    restore_mode: Option<crate::replay::RestoreMode>,
    /// The session's state was dropped on purpose (a restart, a kill of a
    /// paused session): its next kernel replays nothing.
    no_replay_next: bool,
    /// The session's workdir tmpfs (`disk_mb`), kept across its kernels
    /// ([`crate::session_disk`]).
    disk: Option<cellhost_sandbox::workdir_disk::WorkdirDisk>,
}

struct Slot {
    key: Key,
    spawn_lock: tokio::sync::Mutex<()>,
    /// Held while a checkpoint of the session is written: the session's
    /// next cell (and a pause) waits for it.
    ckpt_busy: Arc<tokio::sync::Mutex<()>>,
    inner: Mutex<SlotInner>,
    attached: AtomicUsize,
    /// When the session was last used; outside `inner`, so an
    /// [`Attach`]'s drop takes no lock.
    last_used: LastUsed,
    pinned: AtomicBool,
    parent: Option<Key>,
}

impl Slot {
    /// A slot of `key`, never used, without a kernel.
    fn new(key: Key, parent: Option<Key>) -> Self {
        Slot {
            key,
            spawn_lock: tokio::sync::Mutex::new(()),
            ckpt_busy: Arc::new(tokio::sync::Mutex::new(())),
            inner: Mutex::new(SlotInner::default()),
            attached: AtomicUsize::new(0),
            last_used: LastUsed::new(),
            pinned: AtomicBool::new(false),
            parent,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counters for tests and benches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Kernels of sessions alive now.
    pub live: usize,
    /// Kernels waiting in the warm pool.
    pub pooled: usize,
    /// Kernels spawned for sessions (not taken from the pool).
    pub spawned: u64,
    /// Kernels taken from the pool.
    pub from_pool: u64,
    /// Kernels evicted by the LRU cap.
    pub evicted: u64,
    /// Kernels reaped for idleness.
    pub reaped: u64,
}

/// The registry. Create with [`Registry::start`] inside a Tokio runtime.
pub struct Registry {
    cfg: RegistryConfig,
    journal: Option<Arc<Journal>>,
    slots: Mutex<HashMap<Key, Arc<Slot>>>,
    staging: PathBuf,
    pool: Option<Arc<Pool>>,
    templates: Arc<Templates>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    closed: AtomicBool,
    spawned: AtomicU64,
    from_pool: AtomicU64,
    evicted: AtomicU64,
    reaped: AtomicU64,
    /// Serializes "is there room?" decisions.
    room: Mutex<()>,
    /// What finished cells left on disk (spills, images), by cell id.
    cells: Mutex<crate::cell_index::CellIndex>,
    /// Submitted cells (cells that outlive a call).
    detached: crate::detached::DetachedCells,
    /// The built-in package installer's settings and outcomes.
    packages: Arc<crate::pool::PackageHost>,
    /// Where sessions' checkpoint files are kept.
    ckpt_store: CheckpointStore,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("cfg", &self.cfg)
            .field("staging", &self.staging)
            .finish_non_exhaustive()
    }
}

/// Characters safe in a directory name.
/// `s` as one path component: its safe characters and a hash of the whole,
/// so distinct names never share a directory (`a/b` and `a_b` differ).
fn path_name(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{}-{:08x}", sanitize(s), h as u32)
}

fn sanitize(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(60)
        .collect();
    if out.is_empty() {
        out.push('_');
    }
    out
}

fn pid_alive(pid: i32) -> bool {
    pid > 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes staging directories under `staging_root` whose host is gone and
/// that were last modified more than `max_age` ago; returns how many.
pub fn sweep_staging(staging_root: &Path, max_age: Duration, keep: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(staging_root) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let p = e.path();
        if p == keep || !p.is_dir() {
            continue;
        }
        let host_pid = std::fs::read_to_string(p.join("host.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if host_pid.is_some_and(pid_alive) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= max_age);
        if old && std::fs::remove_dir_all(&p).is_ok() {
            n += 1;
        }
    }
    n
}

impl Registry {
    /// Starts a registry: sweeps stale staging directories, creates this
    /// host's, starts the idle reaper and fills the warm pool.
    ///
    /// # Errors
    /// I/O errors creating the staging directory.
    pub async fn start(cfg: RegistryConfig, journal: Option<Arc<Journal>>) -> std::io::Result<Arc<Registry>> {
        let staging_root = cfg.root.join("staging");
        let cfg_root = cfg.root.clone();
        let stamp = crate::journal::now_ms();
        // Named with a random nonce, not the host's pid: kernels see the
        // path of their session directory below it.
        let mut nonce = [0u8; 8];
        let _ = getrandom::fill(&mut nonce);
        let staging = staging_root.join(format!("{stamp}-{:016x}", u64::from_le_bytes(nonce)));
        std::fs::create_dir_all(&staging)?;
        std::fs::write(staging.join("host.pid"), std::process::id().to_string())?;
        let swept = sweep_staging(&staging_root, cfg.staging_max_age, &staging);
        if swept > 0 {
            tracing::info!("swept {swept} staging directories of dead hosts");
        }
        let templates = Arc::new(Templates::new(
            [
                ("python".to_string(), cfg.preload.clone()),
                ("r".to_string(), cfg.r_preload.clone()),
            ]
            .into_iter()
            .collect(),
        ));
        let packages = Arc::new(crate::pool::PackageHost {
            settings: cfg.packages.clone(),
            log: Default::default(),
        });
        let pool = (cfg.pool_size > 0).then(|| {
            Arc::new(Pool::new(
                cfg.template.clone(),
                staging.join("pool"),
                cfg.pool_size,
                templates.clone(),
                cfg.session_workdirs.is_some(),
                packages.clone(),
            ))
        });
        let reg = Arc::new(Registry {
            cfg,
            journal,
            slots: Mutex::new(HashMap::new()),
            staging,
            pool,
            templates,
            tasks: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            spawned: AtomicU64::new(0),
            from_pool: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            reaped: AtomicU64::new(0),
            room: Mutex::new(()),
            cells: Mutex::new(crate::cell_index::CellIndex::default()),
            detached: crate::detached::DetachedCells::default(),
            packages,
            ckpt_store: CheckpointStore::new(&cfg_root),
        });
        let mut tasks = Vec::new();
        if let Some(pool) = &reg.pool {
            tasks.push(pool.clone().start_refill());
        }
        tasks.push(Self::start_reaper(Arc::downgrade(&reg), reg.reaper_interval()));
        if let Ok(mut t) = reg.tasks.lock() {
            t.extend(tasks);
        }
        Ok(reg)
    }

    fn reaper_interval(&self) -> Duration {
        self.cfg.reaper_interval.unwrap_or_else(|| {
            (self.cfg.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(60))
        })
    }

    fn start_reaper(weak: Weak<Registry>, every: Duration) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(reg) = weak.upgrade() else { break };
                if reg.closed.load(Ordering::SeqCst) {
                    break;
                }
                reg.reap_idle().await;
            }
        })
    }

    /// This host's staging directory (kernels' files live under it).
    pub fn staging_dir(&self) -> &Path {
        &self.staging
    }

    /// The journal, if any.
    pub fn journal(&self) -> Option<&Arc<Journal>> {
        self.journal.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    /// A key for `session` of `owner` with the default interpreter, cwd,
    /// tools and the template's sandbox mode (the registry's floor).
    pub fn key(&self, owner: &str, session: &str) -> Key {
        Key {
            owner: owner.to_string(),
            session: session.to_string(),
            python: self.cfg.template.python.clone(),
            language: self.cfg.template.runtime.name().to_string(),
            cwd: self.cfg.template.cwd.clone(),
            tools: None,
            sandbox: self.sandbox_floor(),
            placement: self.cfg.placements.default.clone(),
        }
    }

    /// The sandbox floor: the template's mode, which the registry was
    /// started with. No key a request asks for may be weaker
    /// ([`crate::floor`]).
    pub fn sandbox_floor(&self) -> SandboxMode {
        self.cfg.template.sandbox.mode
    }

    /// [`Registry::key`] with the sandbox mode a request asked for (`None`:
    /// the floor).
    ///
    /// # Errors
    /// [`RegistryError::SandboxBelowFloor`] when `requested` is weaker than
    /// the floor.
    pub fn key_with_sandbox(
        &self,
        owner: &str,
        session: &str,
        requested: Option<SandboxMode>,
    ) -> Result<Key, RegistryError> {
        let mut k = self.key(owner, session);
        k.sandbox = crate::floor::sandbox_for_request(self.sandbox_floor(), requested)?;
        Ok(k)
    }

    /// The key of a delegated child of `parent`: same owner and
    /// configuration, session `parent/child`, pinned (never evicted nor
    /// reaped) until [`Registry::dispose`] of the child.
    pub fn child_key(&self, parent: &Key, child: &str) -> Key {
        let mut k = parent.clone();
        k.session = format!("{}/{}", parent.session, child);
        let slot = self.slot(&k, Some(parent.clone()));
        slot.pinned.store(true, Ordering::SeqCst);
        k
    }

    /// Sets the environment of `key`'s session for the kernels it starts
    /// from now on, unless it has a live (or starting) kernel already: then
    /// the session keeps its environment, and [`EnvApplied::Kept`] says so
    /// when `env` asks for anything it does not have. An empty `env` never changes a session's.
    ///
    /// [`EnvApplied::Kept`]: crate::EnvApplied::Kept
    pub fn set_session_env(&self, key: &Key, env: &crate::SessionEnv) -> crate::EnvApplied {
        if env.is_empty() {
            return crate::EnvApplied::Applied;
        }
        let slot = self.slot(key, None);
        let mut g = slot.lock();
        if g.env.contains(env) {
            return crate::EnvApplied::Applied;
        }
        let running = g.spawning || g.lineage.live().is_some();
        if running {
            return crate::EnvApplied::Kept;
        }
        g.env = env.clone();
        crate::EnvApplied::Applied
    }

    /// Sets the network policy of `key`'s session for the kernels it starts
    /// from now on, unless it has a live (or starting) kernel with another
    /// policy: then the session keeps its own and [`EnvApplied::Kept`] says
    /// so. `None` never changes a session's.
    ///
    /// # Errors
    /// [`crate::RequestError::BadRequest`]: a list policy for a key of
    /// sandbox mode `off`.
    ///
    /// [`EnvApplied::Kept`]: crate::EnvApplied::Kept
    pub fn set_session_network(
        &self,
        key: &Key,
        policy: Option<&cellhost_kernel::egress::NetworkPolicy>,
    ) -> Result<crate::EnvApplied, crate::RequestError> {
        let Some(policy) = policy else {
            return Ok(crate::EnvApplied::Applied);
        };
        crate::network::check(policy, key.sandbox)?;
        let slot = self.slot(key, None);
        let mut g = slot.lock();
        let current = g
            .network
            .clone()
            .unwrap_or_else(|| self.configured_network(&key.session));
        if current == *policy {
            g.network = Some(policy.clone());
            return Ok(crate::EnvApplied::Applied);
        }
        if g.spawning || g.lineage.live().is_some() {
            return Ok(crate::EnvApplied::Kept);
        }
        g.network = Some(policy.clone());
        Ok(crate::EnvApplied::Applied)
    }

    /// The configured network policy of a session named `session`: its
    /// pattern's, the `[egress]` default, else the template's network.
    pub fn configured_network(&self, session: &str) -> cellhost_kernel::egress::NetworkPolicy {
        use cellhost_kernel::egress::NetworkPolicy;
        self.cfg
            .network
            .for_session(session)
            .unwrap_or(if self.cfg.template.sandbox.network {
                NetworkPolicy::On
            } else {
                NetworkPolicy::Off
            })
    }

    /// The network policy `key`'s session's kernels get.
    pub fn session_network(&self, key: &Key) -> cellhost_kernel::egress::NetworkPolicy {
        let own = self
            .slots
            .lock()
            .ok()
            .and_then(|s| s.get(key).and_then(|slot| slot.lock().network.clone()));
        own.unwrap_or_else(|| self.configured_network(&key.session))
    }

    /// The values a session gets when nothing is said of its limits: the
    /// template's (or its sandbox profile's) cgroup limits and cell
    /// deadline.
    pub fn host_limits(&self) -> crate::limits::SessionLimits {
        let t = &self.cfg.template;
        let (l, d) = (&t.limits, &t.sandbox.limits);
        crate::limits::SessionLimits {
            memory_mb: l.memory_bytes.or(d.memory_bytes).map(|b| b >> 20),
            pids: l.pids_max.or(d.pids_max),
            cpu: l.cpu_cores.or(d.cpu_cores),
            disk_mb: None,
            cell_timeout_s: Some(t.cell_timeout.map_or(0.0, |d| d.as_secs_f64())),
        }
    }

    /// Sets the limits of `key`'s session for the kernels it starts from
    /// now on, unless it has a live (or starting) kernel under other limits
    /// and `replace` is false (the daemon's `exec --session` on a running
    /// session): then the session keeps its limits and this answers
    /// `false`. Limits equal to the session's are always `true`.
    pub fn set_session_limits(
        &self,
        key: &Key,
        limits: crate::limits::ResolvedLimits,
        replace: bool,
    ) -> bool {
        let slot = self.slot(key, None);
        if self.slot_limits(&slot) == limits {
            return true;
        }
        let mut g = slot.lock();
        if !replace && (g.spawning || g.lineage.live().is_some()) {
            return false;
        }
        g.limits = Some(limits);
        true
    }

    /// The limits `key`'s session runs under (its kernels' next start
    /// included): every value that applies, host defaults filled in.
    pub fn session_limits(&self, key: &Key) -> crate::limits::SessionLimits {
        let slot = self.slots.lock().ok().and_then(|s| s.get(key).cloned());
        let resolved = match slot {
            Some(slot) => self.slot_limits(&slot),
            None => self
                .cfg
                .limits
                .resolve(&key.session, &Default::default(), &self.host_limits())
                .unwrap_or_default(),
        };
        resolved.effective().or(&self.host_limits())
    }

    /// The session's resolved limits: a request's, else the policy's for
    /// its name (validated when the configuration was loaded).
    fn slot_limits(&self, slot: &Slot) -> crate::limits::ResolvedLimits {
        if let Some(l) = slot.lock().limits {
            return l;
        }
        self.cfg
            .limits
            .resolve(&slot.key.session, &Default::default(), &self.host_limits())
            .unwrap_or_default()
    }

    /// Gives `slot`'s session the journaled `settings` it has none of its
    /// own for (a request of this host said nothing of them): the limits
    /// resolved again against this host's policy, the network policy
    /// checked against the session's sandbox mode. A journaled value this
    /// host refuses (over its maximum now, a list for mode `off`) is not
    /// applied (logged): the configured one is.
    fn adopt_settings(&self, slot: &Slot, settings: &crate::journal::SessionSettings) {
        let limits = settings.limits.and_then(|asked| {
            self.cfg
                .limits
                .resolve(&slot.key.session, &asked, &self.host_limits())
                .map_err(|e| {
                    tracing::warn!("session {}: journaled limits not applied: {e}", slot.key.session)
                })
                .ok()
        });
        let network = settings.network.as_deref().and_then(|text| {
            crate::network::parse_request(text)
                .and_then(|p| crate::network::check(&p, slot.key.sandbox).map(|()| p))
                .map_err(|e| {
                    tracing::warn!("session {}: journaled network not applied: {e}", slot.key.session)
                })
                .ok()
        });
        let mut g = slot.lock();
        if g.limits.is_none() {
            g.limits = limits;
        }
        if g.network.is_none() {
            g.network = network;
        }
        if g.restore_mode.is_none() {
            g.restore_mode = settings.restore;
        }
    }

    /// The network policy the journal keeps as `key`'s session's own (see
    /// [`Registry::adopt_settings`]): `None` when there is none, or this
    /// host refuses it.
    pub async fn journaled_network(&self, key: &Key) -> Option<cellhost_kernel::egress::NetworkPolicy> {
        let j = self.journal.as_ref()?;
        let text = j.session_settings(&key.owner, &key.session).await.ok()?.network?;
        crate::network::parse_request(&text)
            .and_then(|p| crate::network::check(&p, key.sandbox).map(|()| p))
            .map_err(|e| tracing::warn!("session {}: journaled network not applied: {e}", key.session))
            .ok()
    }

    /// Restores the journaled settings of `owner`'s session `session` into
    /// `key`'s session (see [`Registry::adopt_settings`]), for `restore`.
    async fn adopt_journaled(&self, owner: &str, session: &str, key: &Key) {
        let Some(j) = &self.journal else { return };
        match j.session_settings(owner, session).await {
            Ok(settings) => {
                let slot = self.slot(key, None);
                self.adopt_settings(&slot, &settings);
            }
            Err(e) => tracing::warn!("session {session}: journaled settings unread: {e}"),
        }
    }

    /// Pins or unpins a session's kernels.
    pub fn set_pinned(&self, key: &Key, pinned: bool) {
        self.slot(key, None).pinned.store(pinned, Ordering::SeqCst);
    }

    fn slot(&self, key: &Key, parent: Option<Key>) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Slot::new(key.clone(), parent)))
            .clone()
    }

    fn slot_if_any(&self, key: &Key) -> Option<Arc<Slot>> {
        self.slots.lock().ok()?.get(key).cloned()
    }

    fn all_slots(&self) -> Vec<Arc<Slot>> {
        self.slots
            .lock()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Counters.
    pub fn stats(&self) -> RegistryStats {
        let live = self
            .all_slots()
            .iter()
            .filter(|s| s.lock().lineage.live().is_some())
            .count();
        RegistryStats {
            live,
            pooled: self.pool.as_ref().map_or(0, |p| p.len()),
            spawned: self.spawned.load(Ordering::Relaxed),
            from_pool: self.from_pool.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            reaped: self.reaped.load(Ordering::Relaxed),
        }
    }

    /// Sessions of `owner` that have a live kernel (never another owner's).
    pub fn sessions_of(&self, owner: &str) -> Vec<(Key, u64)> {
        let mut v: Vec<(Key, u64)> = self
            .all_slots()
            .iter()
            .filter(|s| s.key.owner == owner)
            .filter_map(|s| {
                let g = s.lock();
                g.lineage.live().map(|_| (s.key.clone(), g.lineage.generation()))
            })
            .collect();
        v.sort();
        v
    }

    /// The keys the registry holds for the owner's session `name`, live
    /// or not: a session whose kernel crashed, was reaped or evicted is
    /// still known (and continues its generations) until it is disposed.
    pub fn known_keys(&self, owner: &str, name: &str) -> Vec<Key> {
        let mut v: Vec<Key> = self
            .all_slots()
            .iter()
            .filter(|s| s.key.owner == owner && s.key.session == name)
            .map(|s| s.key.clone())
            .collect();
        v.sort();
        v
    }

    /// The live kernel of a key, if any (for interrupt, inspect, …).
    pub fn kernel(&self, key: &Key) -> Option<Kernel> {
        let slots = self.slots.lock().ok()?;
        let slot = slots.get(key)?;
        let g = slot.lock();
        g.lineage.live().cloned()
    }

    /// The live kernel of a key with the session's generation (the
    /// session's count, which a pooled kernel's own
    /// [`cellhost_kernel::KernelInfo::generation`] does not know).
    pub fn kernel_and_generation(&self, key: &Key) -> Option<(Kernel, u64)> {
        let slots = self.slots.lock().ok()?;
        let slot = slots.get(key)?;
        let g = slot.lock();
        g.lineage.live().map(|k| (k.clone(), g.lineage.generation()))
    }

    /// Is the key's configuration the one the warm pool holds? (Pooled
    /// kernels run the host's default limits: a session with limits of its
    /// own never adopts one.)
    fn poolable(&self, slot: &Slot) -> bool {
        let key = &slot.key;
        let default_limits = self.slot_limits(slot).is_default();
        let g = slot.lock();
        let network = g
            .network
            .clone()
            .unwrap_or_else(|| self.configured_network(&key.session));
        // The pool's kernels have the template's network: on or off, never a list.
        let same_network = match network {
            cellhost_kernel::egress::NetworkPolicy::On => self.cfg.template.sandbox.network,
            cellhost_kernel::egress::NetworkPolicy::Off => !self.cfg.template.sandbox.network,
            cellhost_kernel::egress::NetworkPolicy::Allow(_) => false,
        };
        g.env.is_empty()
            && g.fork_dir.is_none()
            && same_network
            && default_limits
            && key.python == self.cfg.template.python
            && key.language == self.cfg.template.runtime.name()
            && key.cwd == self.cfg.template.cwd
            && key.tools.is_none()
            && key.sandbox == self.cfg.template.sandbox.mode
            && key.placement == self.cfg.placements.default
    }

    /// The session's own working directory, when the registry gives each
    /// session one (and the key names no cwd): `ROOT/<owner>/<session>`,
    /// each name made safe for a path and kept distinct by a hash.
    fn session_workdir(&self, key: &Key) -> Option<PathBuf> {
        let root = self.cfg.session_workdirs.as_ref()?;
        key.cwd
            .is_none()
            .then(|| root.join(path_name(&key.owner)).join(path_name(&key.session)))
    }

    /// The host path of the session's working directory: its live
    /// kernel's, else the one its next kernel gets (the key's cwd, or its
    /// own directory under `session_workdirs`). `None` when neither is
    /// known (a session without a cwd works in its per-generation session
    /// directory, which exists only while a kernel lives).
    pub fn workdir(&self, key: &Key) -> Option<PathBuf> {
        let live = self.slots.lock().ok().and_then(|s| {
            s.get(key).and_then(|slot| {
                let g = slot.lock();
                g.lineage.live().and_then(|_| g.workdir.clone())
            })
        });
        let fork_dir = self
            .slots
            .lock()
            .ok()
            .and_then(|s| s.get(key).and_then(|slot| slot.lock().fork_dir.clone()));
        live.or(fork_dir)
            .or_else(|| key.cwd.clone())
            .or_else(|| self.session_workdir(key))
    }

    /// Where the host reaches the files of the session's working directory:
    /// the view of its workdir tmpfs when it has one (`disk_mb`,
    /// [`crate::session_disk`]), else [`Registry::workdir`].
    pub fn workdir_files(&self, key: &Key) -> Option<PathBuf> {
        let view = self.slots.lock().ok().and_then(|s| {
            s.get(key)
                .and_then(|slot| slot.lock().disk.as_ref().map(|h| h.view()))
        });
        view.or_else(|| self.workdir(key))
    }

    /// The pid of the session's workdir holder, when it has one.
    pub fn disk_holder(&self, key: &Key) -> Option<u32> {
        self.slots.lock().ok().and_then(|s| {
            s.get(key)
                .and_then(|slot| slot.lock().disk.as_ref().map(|h| h.pid()))
        })
    }

    /// Sets `cfg`'s disk plan for a cold kernel of `slot`: the session's
    /// workdir tmpfs (started now, or the one its earlier kernels used),
    /// or the accounting with why there is no mount.
    async fn plan_disk(&self, slot: &Arc<Slot>, cfg: &mut KernelConfig) {
        use cellhost_sandbox::workdir_disk::DiskPlan;
        let bytes = self.slot_limits(slot).effective().disk_bytes();
        let own_dir = {
            let g = slot.lock();
            g.fork_dir.is_some() || (slot.key.cwd.is_none() && self.session_workdir(&slot.key).is_some())
        };
        let reason = match bytes {
            None => None,
            Some(_) if cfg.sandbox.mode == SandboxMode::Off => Some(
                "the sandbox is off: the cap is the host's accounting of its own writes (no mount, no file-size limit)"
                    .to_string(),
            ),
            Some(_) if cfg.cwd.is_none() => Some(
                "the session has no workdir of its own (no session_workdirs): \
                 the cap is the host's accounting"
                    .to_string(),
            ),
            Some(_) => crate::session_disk::no_mount_reason(cfg, own_dir),
        };
        let (Some(bytes), None, Some(dir)) = (bytes, &reason, cfg.cwd.clone()) else {
            // No cap, or no mount: a holder of earlier limits goes.
            let old = slot.lock().disk.take();
            if let Some(h) = old {
                self.retire_disk(h).await;
            }
            cfg.sandbox.disk = reason.map(crate::session_disk::accounting);
            return;
        };
        let canon = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
        let old = {
            let mut g = slot.lock();
            if let Some(h) = g.disk.as_mut()
                && h.is_alive()
                && h.bytes() == bytes
                && h.dir() == canon
            {
                cfg.sandbox.disk = Some(DiskPlan::Mounted(h.ns()));
                return;
            }
            g.disk.take()
        };
        if let Some(h) = old {
            self.retire_disk(h).await;
        }
        let program = match cfg.launcher_path() {
            Ok(p) => p,
            Err(e) => {
                cfg.sandbox.disk = Some(crate::session_disk::accounting(e.to_string()));
                return;
            }
        };
        let started = tokio::task::spawn_blocking(move || crate::session_disk::start(&program, &dir, bytes))
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        match started {
            Ok(h) => {
                cfg.sandbox.disk = Some(DiskPlan::Mounted(h.ns()));
                slot.lock().disk = Some(h);
            }
            Err(reason) => {
                tracing::warn!(
                    "session {}: no workdir tmpfs for disk_mb: {reason}",
                    slot.key.session
                );
                cfg.sandbox.disk = Some(crate::session_disk::accounting(reason));
            }
        }
    }

    /// Gives a workdir tmpfs's files back to the directory on disk and
    /// ends its holder.
    async fn retire_disk(&self, h: cellhost_sandbox::workdir_disk::WorkdirDisk) {
        let dir = h.dir().display().to_string();
        match tokio::task::spawn_blocking(move || crate::session_disk::retire(h)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("workdir {dir}: files of its tmpfs not kept: {e}"),
            Err(e) => tracing::warn!("workdir {dir}: {e}"),
        }
    }

    /// The key and working directory of a fork `child` of `parent`: the
    /// parent's key under the new name (reached from where the parent is),
    /// working in the child's own directory under `session_workdirs` when
    /// the registry gives each session one and the key names no cwd, else
    /// in `ROOT/forks/<owner>/<session>` (a fork never works in its
    /// parent's directory; [`Registry::set_fork_dir`] makes it the
    /// session's).
    pub fn fork_workdir(&self, parent: &Key, child: &str) -> (Key, PathBuf) {
        let mut key = parent.clone();
        key.session = child.to_string();
        if parent.cwd.is_none()
            && let Some(w) = self.session_workdir(&key)
        {
            return (key, w);
        }
        let dir = self
            .cfg
            .root
            .join("forks")
            .join(path_name(&key.owner))
            .join(path_name(child));
        (key, dir)
    }

    /// Makes `dir` the working directory of `key`'s kernels in place of
    /// the key's cwd (a fork's own copy of its parent's directory).
    pub fn set_fork_dir(&self, key: &Key, dir: &Path) {
        if self.session_workdir(key).as_deref() == Some(dir) {
            return;
        }
        self.slot(key, None).lock().fork_dir = Some(dir.to_path_buf());
    }

    /// Makes the next kernel of `key` a copy-on-write fork through
    /// `invite`, which the worker `worker_pid` (host pid of the parent
    /// session's worker, armed by `forkstate.cow_arm`) connects to; the
    /// next [`Registry::acquire`] of `key` takes it (and fails with the
    /// fork's error).
    pub fn set_cow_fork(&self, key: &Key, invite: cellhost_kernel::CowInvite, worker_pid: u32) {
        self.slot(key, None).lock().cow = Some((invite, worker_pid));
    }

    /// The live kernel of `key` with its generation, held attached (never
    /// evicted or reaped) until the [`Hold`] is dropped. `None` without a
    /// live kernel.
    pub fn hold_live(&self, key: &Key) -> Option<(Kernel, u64, Hold)> {
        let slot = self.slots.lock().ok()?.get(key)?.clone();
        let hold = Hold(Attach::new(&slot));
        // The slot's lock is let go before `hold` can be dropped: dropping
        // an attachment takes that lock.
        let live = {
            let g = slot.lock();
            g.lineage.live().map(|k| (k.clone(), g.lineage.generation()))
        };
        live.map(|(k, generation)| (k, generation, hold))
    }

    /// The live kernel's own name for the host path `host` below its
    /// working directory (a pooled kernel keeps the path of the pool
    /// directory it was started in); `host` itself otherwise.
    pub fn kernel_path(&self, key: &Key, host: &Path) -> PathBuf {
        let alias = self
            .slots
            .lock()
            .ok()
            .and_then(|s| s.get(key).and_then(|slot| slot.lock().cwd_alias.clone()));
        match alias {
            Some((seen, real)) => match host.strip_prefix(&real) {
                Ok(rest) => seen.join(rest),
                Err(_) => host.to_path_buf(),
            },
            None => host.to_path_buf(),
        }
    }

    /// Gives `child` the session environment, network policy and limits of
    /// `parent` (a fork runs as its parent does). Before `child`'s first
    /// kernel starts.
    pub fn inherit_session(&self, parent: &Key, child: &Key) {
        let from = self.slot(parent, None);
        let (env, network, limits) = {
            let g = from.lock();
            (g.env.clone(), g.network.clone(), g.limits)
        };
        let limits = limits.unwrap_or_else(|| self.slot_limits(&from));
        let to = self.slot(child, None);
        let mut g = to.lock();
        g.env = env;
        g.network = network;
        g.limits = Some(limits);
    }

    /// The outcome of the warm pool's first kernel start, once: the sandbox
    /// the registry's kernels get (or why they cannot start). `None`
    /// without a pool, or when taken already.
    pub fn first_pooled_start(&self) -> Option<tokio::sync::oneshot::Receiver<crate::pool::FirstOutcome>> {
        self.pool.as_ref()?.first_start()
    }

    /// The submitted cells ([`crate::requests::SubmitRequest`]).
    pub fn detached(&self) -> &crate::detached::DetachedCells {
        &self.detached
    }

    /// The spill file of `stream` (`stdout`, `stderr`) of cell `cell`, if
    /// `owner` ran it and the stream was spilled (see
    /// [`crate::cell_index`]).
    pub fn spill_of(&self, owner: &str, cell: &str, stream: &str) -> Option<PathBuf> {
        self.cells.lock().ok()?.spill(owner, cell, stream)
    }

    /// The image of display `id` ([`crate::cell_index::display_id`]) of a
    /// cell `owner` ran in `session`.
    pub fn display_of(&self, owner: &str, session: &str, id: &str) -> Option<crate::cell_index::DisplayFile> {
        self.cells.lock().ok()?.display(owner, session, id)
    }

    /// The session's package overlay on the host (see [`crate::packages`]):
    /// `STAGING/packages/<owner>/<session>-<hash>`, the hash over the
    /// session's interpreter, language and working directory (two
    /// sessions of one name in two directories never share one).
    pub fn overlay_dir(&self, key: &Key) -> PathBuf {
        let rest = format!(
            "{}\0{}\0{}\0{}",
            key.session,
            key.python.display(),
            key.language,
            key.cwd
                .as_ref()
                .map(|c| c.display().to_string())
                .unwrap_or_default()
        );
        self.staging
            .join("packages")
            .join(path_name(&key.owner))
            .join(path_name(&rest))
    }

    /// The built-in installer's settings and the outcomes of installs by
    /// cell id.
    pub fn package_host(&self) -> &Arc<crate::pool::PackageHost> {
        &self.packages
    }

    fn kernel_config(&self, slot: &Slot, generation: u64) -> (KernelConfig, Option<Arc<SessionTools>>) {
        let key = &slot.key;
        let mut cfg = self.cfg.template.clone();
        let (network, fork_dir) = {
            let g = slot.lock();
            g.env.apply(&mut cfg);
            (g.network.clone(), g.fork_dir.clone())
        };
        let network = network.unwrap_or_else(|| self.configured_network(&key.session));
        self.cfg.network.apply(&network, &mut cfg);
        crate::limits::apply_to_kernel(&self.slot_limits(slot), &mut cfg);
        cfg.python = key.python.clone();
        if let Some(runtime) = cellhost_kernel::for_language(&key.language) {
            cfg.runtime = runtime;
        }
        cfg.cwd = key.cwd.clone();
        if let Some(w) = self.session_workdir(key)
            && std::fs::create_dir_all(&w).is_ok()
        {
            cfg.cwd = Some(w);
        }
        if let Some(d) = fork_dir {
            cfg.cwd = Some(d);
        }
        cfg.session = key.session.clone();
        cfg.generation = generation;
        // The key's mode is the kernel's, always (never the template's or
        // the config's in its place).
        cfg.sandbox.mode = key.sandbox;
        // Named like the workdir, with a hash of the whole name: sessions
        // whose names differ only in characters a directory name cannot
        // hold (`a.b`, `a_b`) or past its 60th never share a directory.
        cfg.session_dir = self
            .staging
            .join(path_name(&key.owner))
            .join(format!("{}-g{generation}", path_name(&key.session)));
        let mut tools = SessionTools::new(cfg.tool_host.take(), key.tools.clone(), key.session.clone());
        if key.language == "python"
            && let Some(overlay) = crate::pool::make_overlay(&self.overlay_dir(key))
        {
            cfg.packages_dir = Some(overlay.clone());
            tools = tools.with_packages(
                self.packages.clone(),
                crate::packages::PackageTarget {
                    overlay,
                    python: key.python.clone(),
                    writable: crate::pool::writable_dirs(&cfg),
                },
            );
        }
        let tools = Arc::new(tools);
        cfg.tool_host = Some(tools.clone() as Arc<dyn ToolHost>);
        (cfg, Some(tools))
    }

    /// The live kernel of `key`, starting one (a new generation; from the
    /// warm pool when the key's configuration is the pool's) if there is
    /// none. The caller must hold an attachment.
    async fn ensure(&self, slot: &Arc<Slot>) -> Result<(Kernel, u64), RegistryError> {
        let _spawn = slot.spawn_lock.lock().await;
        if self.closed.load(Ordering::SeqCst) {
            return Err(RegistryError::ShutDown);
        }
        {
            let g = slot.lock();
            if let Some(k) = g.lineage.live() {
                return Ok((k.clone(), g.lineage.generation()));
            }
        }
        self.load_checkpoint(slot).await;
        let generation = {
            let mut g = slot.lock();
            if let Some(k) = g.lineage.live() {
                return Ok((k.clone(), g.lineage.generation()));
            }
            if let Some((gen_, why)) = g.lineage.forget_dead()
                && let Some(j) = &self.journal
            {
                j.kernel_ended(&slot.key.owner, &slot.key.session, gen_, &why);
            }
            g.spawning = true;
            g.lineage.next_generation()
        };
        let generation = match (&self.journal, generation) {
            // A session this host has not run yet continues the journal's
            // numbering (an earlier host may have run generations of it),
            // and its own limits and network policy, unless a request of
            // this host gave it its own.
            (Some(j), 1) => {
                match j.session_settings(&slot.key.owner, &slot.key.session).await {
                    Ok(settings) => self.adopt_settings(slot, &settings),
                    Err(e) => tracing::warn!("session {}: journaled settings unread: {e}", slot.key.session),
                }
                j.max_generation(&slot.key.owner, &slot.key.session)
                    .await
                    .unwrap_or(0)
                    + 1
            }
            (_, g) => g,
        };
        let result = self.start_kernel(slot, generation).await;
        let k = {
            let mut g = slot.lock();
            g.spawning = false;
            let k = result?;
            g.lineage.install(k.clone(), generation);
            slot.last_used.touch();
            if let Some(j) = &self.journal {
                let key = &slot.key;
                j.session_used(
                    &key.owner,
                    &key.session,
                    &key.python.display().to_string(),
                    &key.cwd
                        .as_ref()
                        .map(|c| c.display().to_string())
                        .unwrap_or_default(),
                    &key.tools_label(),
                    key.sandbox.as_str(),
                    &key.language,
                    &own_settings(&g),
                );
                j.kernel_started(
                    &key.owner,
                    &key.session,
                    generation,
                    k.info().pid,
                    k.info().placement.as_ref(),
                );
            }
            k
        };
        // Before any cell of the new generation: the session's state back
        // from its latest checkpoint (when it keeps checkpoints or was
        // paused) or its lost kernel's journaled cells (`restore = "replay"`).
        if let Some(note) = self.recover_into(slot, &k, generation).await {
            slot.lock().restored_note = Some((generation, note));
        }
        Ok((k, generation))
    }

    async fn start_kernel(&self, slot: &Arc<Slot>, generation: u64) -> Result<Kernel, RegistryError> {
        let victim = self.make_room(slot)?;
        if let Some((k, vslot)) = victim {
            self.process_checkpoint_before_stop(&vslot, &k).await;
            k.kill().await;
        }
        let cow = slot.lock().cow.take();
        if let Some((invite, worker_pid)) = cow {
            let (cfg, _tools) = self.kernel_config(slot, generation);
            {
                let mut g = slot.lock();
                g.workdir = Some(cfg.cwd.clone().unwrap_or_else(|| cfg.session_dir.clone()));
                g.cwd_alias = None;
                g.ckpt_dir = None;
            }
            let k = invite.fork(worker_pid, cfg).await?;
            self.spawned.fetch_add(1, Ordering::Relaxed);
            return Ok(k);
        }
        if let Some(k) = self.restore_process_kernel(slot, generation).await {
            return Ok(k);
        }
        let process_mode = self.effective_mode(slot) == CheckpointMode::Process;
        let workdir = self.session_workdir(&slot.key);
        // A pooled kernel's own directory becomes a new session's workdir;
        // a session that has one already gets a kernel started in it.
        let overlay = self.overlay_dir(&slot.key);
        // A session that keeps checkpoints (or resumes from one) gets a
        // kernel started for it, whose writable directory the host knows.
        let checkpointed = self.effective_mode(slot) != CheckpointMode::Off || slot.lock().paused.is_some();
        if self.poolable(slot)
            && !process_mode
            && !(checkpointed && workdir.is_none())
            && workdir.as_ref().is_none_or(|w| !w.exists())
            && crate::pool::overlay_is_empty(&overlay)
            && let Some(pool) = &self.pool
            && let Some(crate::pool::Pooled {
                kernel: k,
                tools,
                workdir: own,
                overlay: pool_overlay,
                session_dir: pooled_dir,
            }) = pool.take()
        {
            // The kernel names its directory by the real path it was
            // started in (taken before the move).
            let seen = own
                .as_ref()
                .map(|o| std::fs::canonicalize(o).unwrap_or_else(|_| o.clone()));
            let placed = match (&workdir, &own) {
                (None, _) => true,
                (Some(w), Some(own)) => {
                    w.parent().is_some_and(|p| std::fs::create_dir_all(p).is_ok())
                        && std::fs::rename(own, w).is_ok()
                }
                (Some(_), None) => false,
            };
            // The kernel's overlay becomes the session's (its view keeps the
            // directory it was started with). Runtimes without package
            // overlays (R) have none to move.
            let overlay_placed = match &pool_overlay {
                Some(po) => crate::pool::move_overlay(po, &overlay),
                None => slot.key.language != "python",
            };
            if placed && overlay_placed {
                if let Some(t) = tools {
                    t.set_session(&slot.key.session);
                    t.set_target(crate::packages::PackageTarget {
                        overlay: overlay.clone(),
                        python: slot.key.python.clone(),
                        writable: [Some(self.staging.clone()), workdir.clone(), slot.key.cwd.clone()]
                            .into_iter()
                            .flatten()
                            .collect(),
                    });
                }
                let mut g = slot.lock();
                // Where a checkpoint is written and read: the kernel's own
                // directory when the session has no workdir of its own.
                g.ckpt_dir = match (&workdir, &own, &seen) {
                    (None, Some(own), Some(seen)) if slot.key.cwd.is_none() => {
                        Some((own.clone(), seen.clone()))
                    }
                    // A pool without working directories of its own: the
                    // kernel works in its session directory, as a kernel
                    // started cold without a cwd does.
                    (None, None, _) if slot.key.cwd.is_none() => {
                        Some((pooled_dir.clone(), pooled_dir.clone()))
                    }
                    _ => None,
                };
                match (&workdir, seen) {
                    (Some(w), Some(seen)) => {
                        g.workdir = Some(w.clone());
                        g.cwd_alias = Some((seen, w.clone()));
                    }
                    _ => {
                        g.workdir = slot.key.cwd.clone();
                        g.cwd_alias = None;
                    }
                }
                drop(g);
                self.from_pool.fetch_add(1, Ordering::Relaxed);
                return Ok(k);
            }
            k.kill().await;
        }
        let (mut cfg, _tools) = self.kernel_config(slot, generation);
        // The default placement's starter is the template's; another one
        // the session was created with gets its own.
        if slot.key.placement != self.cfg.placements.default {
            cfg.starter = self
                .cfg
                .placements
                .starter(&slot.key.placement)
                .map_err(|message| {
                    RegistryError::Kernel(KernelError::Remote {
                        kernel: cfg.label(),
                        code: "placement_config",
                        message,
                    })
                })?;
        }
        self.plan_disk(slot, &mut cfg).await;
        {
            let mut g = slot.lock();
            g.workdir = Some(cfg.cwd.clone().unwrap_or_else(|| cfg.session_dir.clone()));
            g.cwd_alias = None;
            g.ckpt_dir = None;
        }
        // A session in `process` mode gets a kernel started cold (a forked
        // one shares its template's descriptors, which CRIU cannot detach).
        let k = if process_mode && cfg.starter.is_none() {
            cfg.checkpointable = true;
            Kernel::spawn(cfg).await?
        } else {
            self.templates.spawn(cfg).await?
        };
        self.spawned.fetch_add(1, Ordering::Relaxed);
        Ok(k)
    }

    /// Under the room lock: counts live and starting kernels; at the cap,
    /// picks the least recently used evictable one and detaches it (the
    /// caller kills it).
    #[allow(clippy::type_complexity)]
    fn make_room(&self, me: &Arc<Slot>) -> Result<Option<(Kernel, Arc<Slot>)>, RegistryError> {
        let _room = self.room.lock().unwrap_or_else(|e| e.into_inner());
        let slots = self.all_slots();
        let mut live = 0usize;
        let mut best: Option<(Instant, Arc<Slot>)> = None;
        for s in &slots {
            let g = s.lock();
            let alive = g.lineage.live().is_some();
            if alive || (g.spawning && !Arc::ptr_eq(s, me)) {
                live += 1;
            }
            let evictable = alive
                && !Arc::ptr_eq(s, me)
                && s.attached.load(Ordering::SeqCst) == 0
                && !s.pinned.load(Ordering::SeqCst)
                && !g.lineage.live().is_some_and(Kernel::is_busy);
            if evictable {
                let t = s.last_used.get().unwrap_or_else(Instant::now);
                if best.as_ref().is_none_or(|(bt, _)| t < *bt) {
                    best = Some((t, s.clone()));
                }
            }
        }
        if live < self.cfg.max_live {
            return Ok(None);
        }
        let Some((_, victim)) = best else {
            return Err(RegistryError::Full {
                max: self.cfg.max_live,
            });
        };
        let mut g = victim.lock();
        let why = format!(
            "was evicted to make room (at most {} live kernels; it was the least recently used idle one)",
            self.cfg.max_live
        );
        let Some(k) = g.lineage.retire(&why) else {
            return Ok(None);
        };
        if let Some(j) = &self.journal {
            j.kernel_ended(
                &victim.key.owner,
                &victim.key.session,
                g.lineage.generation(),
                "evicted (LRU cap)",
            );
        }
        drop(g);
        self.evicted.fetch_add(1, Ordering::Relaxed);
        Ok(Some((k, victim)))
    }

    /// Kills kernels idle for longer than the idle timeout (never attached
    /// or pinned ones, nor busy ones).
    pub async fn reap_idle(&self) {
        let now = Instant::now();
        let mut victims = Vec::new();
        for s in self.all_slots() {
            if s.attached.load(Ordering::SeqCst) > 0 || s.pinned.load(Ordering::SeqCst) {
                continue;
            }
            let mut g = s.lock();
            let idle = s
                .last_used
                .get()
                .is_some_and(|t| now.duration_since(t) >= self.cfg.idle_timeout);
            if !idle || g.lineage.held().is_none_or(Kernel::is_busy) {
                continue;
            }
            let why = format!("was reaped after {} s idle", self.cfg.idle_timeout.as_secs_f64());
            if let Some(k) = g.lineage.retire(&why) {
                if let Some(j) = &self.journal {
                    j.kernel_ended(
                        &s.key.owner,
                        &s.key.session,
                        g.lineage.generation(),
                        "idle timeout",
                    );
                }
                victims.push((k, s.clone()));
            }
        }
        self.reaped.fetch_add(victims.len() as u64, Ordering::Relaxed);
        for (k, s) in victims {
            self.process_checkpoint_before_stop(&s, &k).await;
            k.kill().await;
        }
    }

    /// Runs a cell in `key`'s session: journaled as `running` when it
    /// starts, committed when it settles (before this returns).
    ///
    /// # Errors
    /// [`RegistryError`]: the kernel could not start, no room, shut down,
    /// or the kernel died before the cell ran.
    pub async fn execute(
        &self,
        key: &Key,
        code: &str,
        options: ExecOptions,
        origin: &Origin,
    ) -> Result<CellResult, RegistryError> {
        let (r, journal_error) = self.execute_journaled(key, code, options, origin).await?;
        if let Some(e) = journal_error {
            tracing::warn!("cell {} not journaled: {e}", r.cell_id);
        }
        Ok(r)
    }

    /// [`Registry::execute`], and the journal's failure to record the
    /// settled cell when it failed (the cell ran: its result is returned
    /// beside the error, and the row is marked `failed` if the journal
    /// still takes that).
    ///
    /// # Errors
    /// As [`Registry::execute`].
    pub async fn execute_journaled(
        &self,
        key: &Key,
        code: &str,
        options: ExecOptions,
        origin: &Origin,
    ) -> Result<(CellResult, Option<crate::journal::JournalError>), RegistryError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(RegistryError::ShutDown);
        }
        let slot = self.slot(key, None);
        let _attach = Attach::new(&slot);
        // A checkpoint of the previous cell ends first (bounded by its timeout).
        drop(slot.ckpt_busy.lock().await);
        let (mut kernel, mut generation) = self.ensure(&slot).await?;
        let cancel = options.cancel.clone();
        let silent = options.silent;
        // A worker that died before it took the cell (killed while idle,
        // before the host saw it die: the cell comes back `crashed` with
        // reason "not started", or, still queued when the death is seen,
        // fails with `Dead`) ran none of its code: the cell runs once more,
        // on a fresh generation (restored as the session's settings say),
        // instead of coming back `crashed` or as an error.
        let mut retried = false;
        let (start, mut r) = loop {
            let handle = match kernel.submit(code, options.clone()) {
                // The kernel died between the check and the submit (an idle
                // worker killed from outside): one fresh generation, once.
                Err(KernelError::Dead { .. }) => {
                    (kernel, generation) = self.ensure(&slot).await?;
                    kernel.submit(code, options.clone())?
                }
                other => other?,
            };
            let start = CellStart {
                id: handle.id().to_string(),
                owner: key.owner.clone(),
                session: key.session.clone(),
                generation,
                code: code.to_string(),
                origin: origin.origin.clone(),
                context: origin.context.clone(),
            };
            if let Some(j) = &self.journal {
                j.cell_started(start.clone());
            }
            let cancelled = || {
                cancel
                    .as_ref()
                    .is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst))
            };
            if cancelled() {
                // Cancelled before or while it was submitted: the canceller's
                // interrupt may have found no cell, so this one is interrupted here.
                let _ = handle.interrupt().await;
            }
            let waited = handle.wait().await;
            let may_retry = !retried && !cancelled() && !self.closed.load(Ordering::SeqCst);
            match waited {
                Ok(r) => {
                    let not_started = r.status == cellhost_kernel::CellStatus::Crashed
                        && r.crash
                            .as_ref()
                            .is_some_and(|c| c.reason.as_deref() == Some(cellhost_kernel::CRASH_NOT_STARTED));
                    if !not_started || !may_retry {
                        break (start, r);
                    }
                    // The dead generation's end is the lineage's to tell the
                    // next one (its reset reason), as for any crash.
                    let mut dead = r;
                    slot.lock().lineage.settle(generation, false, &mut dead);
                }
                // Still queued when the kernel was found dead: the driver
                // failed it without sending it (the next `ensure` records
                // the dead generation's end).
                Err(KernelError::Dead { .. }) if may_retry => {}
                Err(e) => {
                    if let Some(j) = &self.journal
                        && let Err(je) = j.cell_failed(&start.id, "failed", &e.to_string()).await
                    {
                        tracing::warn!("{je}");
                    }
                    return Err(e.into());
                }
            }
            retried = true;
            tracing::info!(
                "session {}: the kernel of generation {generation} died before cell {} started; running it on a new generation",
                key.session,
                start.id
            );
            if let Some(j) = &self.journal
                && let Err(je) = j
                    .cell_failed(
                        &start.id,
                        "crashed",
                        "the kernel died before the cell started; it ran again on a new generation",
                    )
                    .await
            {
                tracing::warn!("{je}");
            }
            (kernel, generation) = self.ensure(&slot).await?;
        };
        r.kernel.session = key.session.clone();
        r.kernel.generation = generation;
        if r.status == cellhost_kernel::CellStatus::Crashed
            && let Some(h) = self.crash_hint(&slot)
        {
            r.hint = Some(h);
        }
        {
            let mut g = slot.lock();
            if let Some((seen, real)) = &g.cwd_alias {
                // The kernel's names of its workdir's paths, as the host's.
                let host = |p: &str| {
                    Path::new(p).strip_prefix(seen).ok().map(|rest| {
                        if rest.as_os_str().is_empty() {
                            real.display().to_string()
                        } else {
                            real.join(rest).display().to_string()
                        }
                    })
                };
                if let Some(c) = r.cwd.as_deref().and_then(host) {
                    r.cwd = Some(c);
                }
                if let Some(f) = r.files.as_mut() {
                    for p in f.read.iter_mut().chain(f.write.iter_mut()) {
                        if let Some(h) = host(p) {
                            *p = h;
                        }
                    }
                }
            }
            slot.last_used.touch();
            g.lineage.settle(generation, kernel.is_alive(), &mut r);
            if g.restored_note
                .as_ref()
                .is_some_and(|(gen_, _)| *gen_ == generation)
                && let Some((_, mut note)) = g.restored_note.take()
            {
                if !note.resumed {
                    note.reason = r
                        .kernel
                        .reset_reason
                        .clone()
                        .or_else(|| Some("the host that ran the previous kernel ended".to_string()));
                }
                r.restored = Some(note);
            }
            if let Some(b) = g.carry_background.take() {
                merge_background(&mut r, b);
            }
            if r.execution_count > 0 {
                g.last_count = r.execution_count;
            }
        }
        if !silent
            && r.status == cellhost_kernel::CellStatus::Ok
            && kernel.is_alive()
            && self.effective_mode(&slot) == CheckpointMode::Namespace
        {
            self.schedule_checkpoint(&slot, &kernel, generation, r.execution_count);
        }
        if let Ok(mut ix) = self.cells.lock() {
            ix.record(&key.owner, &key.session, &r);
        }
        let mut journal_error = None;
        if let Some(j) = &self.journal
            && let Err(e) = j.cell_settled(&start, &r).await
        {
            let why = format!("its journal row could not be written: {e}");
            if let Err(e2) = j.cell_failed(&start.id, "failed", &why).await {
                tracing::warn!("cell {} left unsettled in the journal: {e2}", r.cell_id);
            }
            journal_error = Some(e);
        }
        Ok((r, journal_error))
    }

    /// Makes sure `key` has a live kernel (for benches and warm-up) and
    /// returns it with its generation.
    ///
    /// # Errors
    /// As [`Registry::execute`].
    pub async fn acquire(&self, key: &Key) -> Result<(Kernel, u64), RegistryError> {
        let slot = self.slot(key, None);
        let _attach = Attach::new(&slot);
        self.ensure(&slot).await
    }

    /// Rebuilds a session from the journal: kills its kernel if one lives
    /// (`force`) and replays the successful cells of its last journaled
    /// generation, in order, into a new kernel (origin `restore`, context
    /// `{"replay_of": ID}`). Opt-in: nothing calls it on its own.
    ///
    /// # Errors
    /// [`RegistryError::Restore`] without a journal, without cells to
    /// replay, or with a live kernel and no `force`; kernel errors.
    pub async fn restore(&self, key: &Key, force: bool) -> Result<RestoreReport, RegistryError> {
        self.restore_from(&key.owner, &key.session, key, force).await
    }

    /// [`Registry::restore`] of the journaled session `session` of `owner`
    /// (that owner's only) into `key`'s session (which may be another
    /// owner's or name: the host whose kernels outlive the command, the
    /// CLI's daemon, rebuilds a session one-shot `run` journaled).
    ///
    /// # Errors
    /// As [`Registry::restore`].
    pub async fn restore_from(
        &self,
        owner: &str,
        session: &str,
        key: &Key,
        force: bool,
    ) -> Result<RestoreReport, RegistryError> {
        let Some(j) = &self.journal else {
            return Err(RegistryError::Restore("no journal is kept".into()));
        };
        let cells = j
            .history(owner, session)
            .await
            .map_err(|e| RegistryError::Restore(e.to_string()))?;
        let Some(last) = cells.iter().map(|c| c.generation).max() else {
            return Err(RegistryError::Restore(format!(
                "session {session} of owner {owner} has no journaled cells"
            )));
        };
        if let Some(k) = self.kernel(key) {
            if !force {
                return Err(RegistryError::Restore(format!(
                    "session {} has a live kernel (pid {}); nothing to restore",
                    key.session,
                    k.info().pid
                )));
            }
            let slot = self.slot(key, None);
            let taken = {
                let mut g = slot.lock();
                let gen_ = g.lineage.generation();
                g.lineage.take().map(|k| (k, gen_))
            };
            if let Some((k, gen_)) = taken {
                j.kernel_ended(&key.owner, &key.session, gen_, "replaced by restore");
                k.kill().await;
            }
        }
        // The replay runs under the limits and network policy the session
        // had (unless `key`'s session has its own on this host).
        self.adopt_journaled(owner, session, key).await;
        // The cells are run here: the new kernel replays nothing itself.
        self.skip_next_replay(&self.slot(key, None));
        let mut report = RestoreReport {
            from_generation: last,
            ..RestoreReport::default()
        };
        for c in cells.iter().filter(|c| c.generation == last) {
            if c.status != "ok" {
                report.skipped.push(RestoreSkip {
                    cell: c.id.clone(),
                    status: c.status.clone(),
                    reason: format!("its status was {}", c.status),
                });
                continue;
            }
            let origin = Origin {
                origin: "restore".into(),
                context: Some(serde_json::json!({"replay_of": c.id})),
            };
            let r = self
                .execute(key, &c.code, ExecOptions::default(), &origin)
                .await?;
            report.generation = r.kernel.generation;
            if r.status == cellhost_kernel::CellStatus::Ok {
                report.replayed.push(c.id.clone());
            } else {
                report.skipped.push(RestoreSkip {
                    cell: c.id.clone(),
                    status: c.status.clone(),
                    reason: format!("its replay ended {}", r.status.as_str()),
                });
            }
        }
        Ok(report)
    }

    /// Kills the key's kernel and forgets the session (and its delegated
    /// children's).
    pub async fn dispose(&self, key: &Key) {
        let mut victims = Vec::new();
        {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            let doomed: Vec<Key> = slots
                .iter()
                .filter(|(k, s)| *k == key || is_descendant(s, key, &slots))
                .map(|(k, _)| k.clone())
                .collect();
            for k in doomed {
                if let Some(s) = slots.remove(&k) {
                    victims.push(s);
                }
            }
        }
        // A disposed session is forgotten: its name, used again, is a new
        // session (the configured limits and network policy, not these).
        if let Some(j) = &self.journal {
            for s in &victims {
                j.session_forgotten(&s.key.owner, &s.key.session);
            }
        }
        self.kill_slots(victims, "disposed").await;
    }

    /// Kills every kernel of `owner` and forgets its sessions.
    pub async fn dispose_owner(&self, owner: &str) {
        let victims: Vec<Arc<Slot>> = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<Key> = slots.keys().filter(|k| k.owner == owner).cloned().collect();
            keys.iter().filter_map(|k| slots.remove(k)).collect()
        };
        self.kill_slots(victims, "owner disposed").await;
    }

    async fn kill_slots(&self, slots: Vec<Arc<Slot>>, why: &str) {
        let mut kills = Vec::new();
        let mut disks = Vec::new();
        for s in slots {
            let mut g = s.lock();
            disks.extend(g.disk.take());
            if let Some(k) = g.lineage.take() {
                if let Some(j) = &self.journal {
                    j.kernel_ended(&s.key.owner, &s.key.session, g.lineage.generation(), why);
                }
                kills.push(k);
            }
        }
        let futs: Vec<_> = kills
            .into_iter()
            .map(|k| tokio::spawn(async move { k.kill().await }))
            .collect();
        for f in futs {
            let _ = f.await;
        }
        // The kernels are gone: the workdir tmpfs's files go back to disk.
        for d in disks {
            self.retire_disk(d).await;
        }
    }

    /// Stops the reaper and the pool, kills and reaps every kernel (pooled
    /// ones too) and flushes the journal. Later calls fail with
    /// [`RegistryError::ShutDown`].
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Ok(mut t) = self.tasks.lock() {
            for h in t.drain(..) {
                h.abort();
            }
        }
        let slots: Vec<Arc<Slot>> = {
            let mut s = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            s.drain().map(|(_, v)| v).collect()
        };
        // Wait for kernels still starting, so none is left behind.
        for s in &slots {
            let _g = s.spawn_lock.lock().await;
        }
        self.kill_slots(slots, "host shutdown").await;
        if let Some(p) = &self.pool {
            p.shutdown().await;
        }
        self.templates.shutdown().await;
        if let Some(j) = &self.journal
            && let Err(e) = j.flush().await
        {
            tracing::warn!("{e}");
        }
    }
}

fn is_descendant(s: &Arc<Slot>, ancestor: &Key, slots: &HashMap<Key, Arc<Slot>>) -> bool {
    let mut p = s.parent.clone();
    let mut hops = 0;
    while let Some(k) = p {
        if &k == ancestor {
            return true;
        }
        hops += 1;
        if hops > 64 {
            return false;
        }
        p = slots.get(&k).and_then(|s| s.parent.clone());
    }
    false
}

/// Marks a slot attached while a call is in flight.
struct Attach(Arc<Slot>);

/// A session held attached by [`Registry::hold_live`]: its kernel is not
/// evicted or reaped while this lives.
pub struct Hold(#[allow(dead_code)] Attach);

impl Attach {
    fn new(slot: &Arc<Slot>) -> Self {
        slot.attached.fetch_add(1, Ordering::SeqCst);
        Attach(slot.clone())
    }
}

/// Dropping an attachment takes no lock (it may be dropped while the
/// slot's is held): the count and the use stamp are atomics.
impl Drop for Attach {
    fn drop(&mut self) {
        self.0.attached.fetch_sub(1, Ordering::SeqCst);
        self.0.last_used.touch();
    }
}

/// The settings a session has of its own (a request's limits and network
/// policy), as the journal keeps them.
fn own_settings(g: &SlotInner) -> crate::journal::SessionSettings {
    crate::journal::SessionSettings {
        limits: g.limits.map(|l| l.asked),
        network: g.network.as_ref().map(|n| n.to_text()),
        restore: g.restore_mode,
    }
}

#[cfg(test)]
mod attach_tests {
    use super::*;

    fn slot() -> Arc<Slot> {
        let key = Key {
            owner: "o".into(),
            session: "s".into(),
            python: PathBuf::from("python3"),
            language: "python".into(),
            cwd: None,
            tools: None,
            sandbox: SandboxMode::Off,
            placement: "local".into(),
        };
        Arc::new(Slot::new(key, None))
    }

    /// An attachment dropped while its slot's lock is held ends: its drop
    /// once took that lock and hung.
    #[test]
    fn an_attach_dropped_under_the_slot_lock_does_not_hang() {
        let slot = slot();
        let attach = Attach::new(&slot);
        assert_eq!(slot.attached.load(Ordering::SeqCst), 1);
        assert_eq!(slot.last_used.get(), None);
        let (tx, rx) = std::sync::mpsc::channel();
        let s = slot.clone();
        let dropper = std::thread::spawn(move || {
            let g = s.lock();
            drop(attach);
            drop(g);
            let _ = tx.send(());
        });
        // A hang guard, not a timing assertion: only a hang reaches it.
        if let Err(e) = rx.recv_timeout(Duration::from_secs(60)) {
            panic!("dropping an Attach while its slot's lock is held hung ({e})");
        }
        dropper.join().expect("the dropping thread");
        assert_eq!(slot.attached.load(Ordering::SeqCst), 0);
        assert!(slot.last_used.get().is_some(), "the drop marks the session used");
    }
}
