//! The warm pool: kernels prespawned for the default configuration, so that
//! handing one out is a queue pop. A background task refills it. A kernel
//! is handed out once: it leaves the pool when taken and never comes back,
//! and a kernel that has run any cell (or is running one) is never handed
//! out.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellhost_kernel::{Kernel, KernelConfig, ToolCall, ToolFuture, ToolHost};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::templates::Templates;

/// A kernel's view of the host tools: the session's name (set when a pooled
/// kernel is handed to a session), the session's tool subset, and the
/// built-in package installer ([`crate::packages::INSTALL_TOOL`]) with the
/// session's overlay.
pub struct SessionTools {
    inner: Option<Arc<dyn ToolHost>>,
    allowed: Option<Vec<String>>,
    session: Mutex<String>,
    packages: Option<Arc<PackageHost>>,
    target: Mutex<Option<crate::packages::PackageTarget>>,
}

/// What the built-in installer needs from the registry: its settings and
/// where outcomes go for the request that made the cell.
#[derive(Debug, Default)]
pub struct PackageHost {
    /// The settings (config `package_index`, `packages.*`).
    pub settings: crate::packages::PackageSettings,
    /// Outcomes by cell id.
    pub log: crate::packages::InstallLog,
}

impl SessionTools {
    /// Wraps `inner` for `session`, limited to `allowed` when given.
    pub fn new(inner: Option<Arc<dyn ToolHost>>, allowed: Option<Vec<String>>, session: String) -> Self {
        SessionTools {
            inner,
            allowed,
            session: Mutex::new(session),
            packages: None,
            target: Mutex::new(None),
        }
    }

    /// The same with the built-in installer, installing for `target`.
    pub fn with_packages(mut self, host: Arc<PackageHost>, target: crate::packages::PackageTarget) -> Self {
        self.packages = Some(host);
        self.target = Mutex::new(Some(target));
        self
    }

    /// Names the session that owns the kernel from now on.
    pub fn set_session(&self, session: &str) {
        if let Ok(mut s) = self.session.lock() {
            *s = session.to_string();
        }
    }

    /// Where installs of this kernel go from now on.
    pub fn set_target(&self, target: crate::packages::PackageTarget) {
        if let Ok(mut t) = self.target.lock() {
            *t = Some(target);
        }
    }
}

impl ToolHost for SessionTools {
    fn names(&self) -> Vec<String> {
        let all = self.inner.as_ref().map(|i| i.names()).unwrap_or_default();
        match &self.allowed {
            Some(a) => all.into_iter().filter(|n| a.contains(n)).collect(),
            None => all,
        }
    }

    fn call(&self, mut call: ToolCall) -> ToolFuture {
        if let Ok(s) = self.session.lock() {
            call.session = s.clone();
        }
        if call.name == crate::packages::INSTALL_TOOL {
            let host = self.packages.clone();
            let target = self.target.lock().ok().and_then(|t| t.clone());
            return Box::pin(async move {
                let (Some(host), Some(target)) = (host, target) else {
                    return Err("package installs are not available in this kernel".to_string());
                };
                install_call(&host, &target, &call).await
            });
        }
        match &self.inner {
            Some(inner) => inner.call(call),
            None => {
                let name = call.name.clone();
                Box::pin(async move { Err(format!("tool '{name}' is not declared")) })
            }
        }
    }
}

/// One `%pip install` call: `args` = `{"packages": [..], "shared": bool,
/// "imported": [..]}`. The outcome is logged for the cell and answered:
/// the report, or an error whose text is the error's JSON.
async fn install_call(
    host: &PackageHost,
    target: &crate::packages::PackageTarget,
    call: &ToolCall,
) -> Result<serde_json::Value, String> {
    let strings = |k: &str| -> Vec<String> {
        call.args
            .get(k)
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let specs = strings("packages");
    let imported: std::collections::BTreeSet<String> = strings("imported").into_iter().collect();
    let shared = call.args.get("shared").and_then(|v| v.as_bool()).unwrap_or(false);
    let log = call.args.get("log").and_then(|v| v.as_str());
    let outcome = crate::packages::install(&host.settings, target, &specs, shared, &imported, log).await;
    host.log.record(&call.cell, outcome.clone());
    match outcome {
        Ok(report) => serde_json::to_value(&report).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_json().to_string()),
    }
}

/// A ready kernel of the warm pool, with what becomes its session's when
/// a session takes it ([`Pool::take`]).
pub struct Pooled {
    /// The kernel: alive, idle, no cell run yet.
    pub kernel: Kernel,
    /// Its tool host, to be renamed to the session and pointed at the
    /// session's package overlay.
    pub tools: Option<Arc<SessionTools>>,
    /// Its own working directory, when the pool gives each kernel one (to
    /// be moved to the session's).
    pub workdir: Option<PathBuf>,
    /// Its own package overlay (to be moved to the session's); `None` for
    /// a runtime without overlays (R) or when it could not be made.
    pub overlay: Option<PathBuf>,
    /// Its session directory: where it works without a working directory
    /// of its own.
    pub session_dir: PathBuf,
}

/// Creates a package overlay at `root` (with its `site` directory) and
/// returns its canonical path; `None` when it cannot be made (the kernel
/// then has none). Directories are created 0755: the kernel reads them,
/// only the host writes them.
pub fn make_overlay(root: &std::path::Path) -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true).mode(0o755);
    b.create(root.join("site")).ok()?;
    let real = std::fs::canonicalize(root).ok()?;
    std::fs::symlink_metadata(&real).ok()?.is_dir().then_some(real)
}

/// The host directories a kernel of `cfg` can write: its session
/// directory, its workdir and the profile's extras.
pub fn writable_dirs(cfg: &KernelConfig) -> Vec<PathBuf> {
    let mut v = vec![cfg.session_dir.clone()];
    v.extend(cfg.cwd.clone());
    v.extend(cfg.sandbox.extra_rw.iter().cloned());
    v
}

/// Whether the overlay at `root` holds no package (absent, or its `site`
/// empty): a pooled kernel's empty overlay may then take its place.
pub fn overlay_is_empty(root: &std::path::Path) -> bool {
    match std::fs::read_dir(root.join("site")) {
        Ok(mut rd) => rd.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Moves a pooled kernel's overlay `from` to its session's place `to` (an
/// empty overlay there, of an earlier kernel, is replaced), and leaves a
/// link at `from` for a kernel that sees the host's paths (no mount
/// namespace: it names the overlay by the path it started with).
pub fn move_overlay(from: &std::path::Path, to: &std::path::Path) -> bool {
    if !overlay_is_empty(to) {
        return false;
    }
    if std::fs::symlink_metadata(to).is_ok() && std::fs::remove_dir_all(to).is_err() {
        return false;
    }
    let moved =
        to.parent().is_some_and(|p| std::fs::create_dir_all(p).is_ok()) && std::fs::rename(from, to).is_ok();
    if moved {
        let _ = std::os::unix::fs::symlink(to, from);
    }
    moved
}

/// Prespawned kernels of one configuration.
pub struct Pool {
    template: KernelConfig,
    dir: PathBuf,
    target: usize,
    ready: Mutex<VecDeque<Pooled>>,
    wake: Notify,
    seq: AtomicU64,
    closed: std::sync::atomic::AtomicBool,
    templates: Arc<Templates>,
    own_workdirs: bool,
    packages: Arc<PackageHost>,
    /// The first start's outcome (its kernel's sandbox, or why it could
    /// not start), sent once to whoever took [`Pool::first_start`].
    first: Mutex<Option<FirstStart>>,
    first_rx: Mutex<Option<tokio::sync::oneshot::Receiver<FirstOutcome>>>,
}

/// What the pool's first kernel start gave: the kernel's sandbox status,
/// or the start's error as text.
pub type FirstOutcome = Result<cellhost_sandbox::profile::SandboxStatus, String>;
type FirstStart = tokio::sync::oneshot::Sender<FirstOutcome>;

impl Pool {
    /// A pool of `target` kernels of `template`, their files under `dir`,
    /// started by `templates` (forked when it has a preload list).
    ///
    /// With `own_workdirs`, each kernel works in a directory of its own
    /// (`<dir>/work-k<n>`), handed out with it.
    pub fn new(
        template: KernelConfig,
        dir: PathBuf,
        target: usize,
        templates: Arc<Templates>,
        own_workdirs: bool,
        packages: Arc<PackageHost>,
    ) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel();
        Pool {
            template,
            dir,
            target,
            ready: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            seq: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            templates,
            own_workdirs,
            packages,
            first: Mutex::new(Some(tx)),
            first_rx: Mutex::new(Some(rx)),
        }
    }

    /// The outcome of the pool's first kernel start, once (a second call
    /// gets `None`): the sandbox its kernels get, learnt without a kernel
    /// of its own.
    pub fn first_start(&self) -> Option<tokio::sync::oneshot::Receiver<FirstOutcome>> {
        self.first_rx.lock().ok()?.take()
    }

    fn tell_first(&self, outcome: impl FnOnce() -> FirstOutcome) {
        if let Some(tx) = self.first.lock().ok().and_then(|mut f| f.take()) {
            let _ = tx.send(outcome());
        }
    }

    /// Kernels ready now.
    pub fn len(&self) -> usize {
        self.ready.lock().map(|q| q.len()).unwrap_or(0)
    }

    /// No kernel is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes a fresh kernel (a queue pop) and wakes the refill.
    pub fn take(&self) -> Option<Pooled> {
        let got = {
            let mut q = self.ready.lock().ok()?;
            let mut got = None;
            while let Some(p) = q.pop_front() {
                let k = &p.kernel;
                if k.is_alive() && k.cells_settled() == 0 && !k.is_busy() {
                    got = Some(p);
                    break;
                }
                // A dead or used kernel is dropped (and so killed).
            }
            got
        };
        self.wake.notify_one();
        got
    }

    fn config(
        &self,
    ) -> (
        KernelConfig,
        Option<Arc<SessionTools>>,
        Option<PathBuf>,
        Option<PathBuf>,
    ) {
        let n = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut cfg = self.template.clone();
        cfg.session = format!("pool-{n}");
        cfg.generation = 1;
        cfg.session_dir = self.dir.join(format!("k{n}"));
        // Beside the session directory, not inside it: a sandbox binds both
        // into a private /tmp when they live there, and a directory nested
        // in another bind could not be moved away later.
        let workdir = self
            .own_workdirs
            .then(|| self.dir.join(format!("work-k{n}")))
            .filter(|w| std::fs::create_dir_all(w).is_ok());
        if workdir.is_some() {
            cfg.cwd = workdir.clone();
        }
        let mut tools = SessionTools::new(cfg.tool_host.take(), None, cfg.session.clone());
        let overlay = (cfg.runtime.name() == "python")
            .then(|| make_overlay(&self.dir.join(format!("pkgs-k{n}"))))
            .flatten();
        if let Some(o) = &overlay {
            cfg.packages_dir = Some(o.clone());
            tools = tools.with_packages(
                self.packages.clone(),
                crate::packages::PackageTarget {
                    overlay: o.clone(),
                    python: cfg.python.clone(),
                    writable: writable_dirs(&cfg),
                },
            );
        }
        let tools = Arc::new(tools);
        cfg.tool_host = Some(tools.clone() as Arc<dyn ToolHost>);
        (cfg, Some(tools), workdir, overlay)
    }

    /// Starts the refill task: keeps `target` kernels ready, one spawn at a
    /// time (so a refill never competes with many spawns at once).
    pub fn start_refill(self: Arc<Self>) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                if self.closed.load(Ordering::SeqCst) {
                    break;
                }
                if self.len() >= self.target {
                    self.wake.notified().await;
                    continue;
                }
                let (cfg, tools, workdir, overlay) = self.config();
                let session_dir = cfg.session_dir.clone();
                match self.templates.spawn(cfg).await {
                    Ok(k) => {
                        self.tell_first(|| Ok(k.info().sandbox.clone()));
                        failures = 0;
                        if self.closed.load(Ordering::SeqCst) {
                            k.kill().await;
                            break;
                        }
                        if let Ok(mut q) = self.ready.lock() {
                            q.push_back(Pooled {
                                kernel: k,
                                tools,
                                workdir,
                                overlay,
                                session_dir,
                            });
                        }
                    }
                    Err(e) => {
                        self.tell_first(|| Err(e.to_string()));
                        failures += 1;
                        tracing::warn!("warm pool: cannot start a kernel: {e}");
                        // Back off: a broken interpreter must not spin.
                        let wait = Duration::from_millis(200u64 << failures.min(8));
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        })
    }

    /// Kills every pooled kernel and stops refilling.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        let all: Vec<Pooled> = self
            .ready
            .lock()
            .map(|mut q| q.drain(..).collect())
            .unwrap_or_default();
        for p in all {
            p.kernel.kill().await;
        }
    }
}
