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
/// kernel is handed to a session) and the session's tool subset.
pub struct SessionTools {
    inner: Arc<dyn ToolHost>,
    allowed: Option<Vec<String>>,
    session: Mutex<String>,
}

impl SessionTools {
    /// Wraps `inner` for `session`, limited to `allowed` when given.
    pub fn new(inner: Arc<dyn ToolHost>, allowed: Option<Vec<String>>, session: String) -> Self {
        SessionTools {
            inner,
            allowed,
            session: Mutex::new(session),
        }
    }

    /// Names the session that owns the kernel from now on.
    pub fn set_session(&self, session: &str) {
        if let Ok(mut s) = self.session.lock() {
            *s = session.to_string();
        }
    }
}

impl ToolHost for SessionTools {
    fn names(&self) -> Vec<String> {
        let all = self.inner.names();
        match &self.allowed {
            Some(a) => all.into_iter().filter(|n| a.contains(n)).collect(),
            None => all,
        }
    }

    fn call(&self, mut call: ToolCall) -> ToolFuture {
        if let Ok(s) = self.session.lock() {
            call.session = s.clone();
        }
        self.inner.call(call)
    }
}

/// A ready kernel, its tools, and its own working directory when the pool
/// gives each kernel one (to become its session's).
type Pooled = (Kernel, Option<Arc<SessionTools>>, Option<PathBuf>);

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
            while let Some((k, t, w)) = q.pop_front() {
                if k.is_alive() && k.cells_settled() == 0 && !k.is_busy() {
                    got = Some((k, t, w));
                    break;
                }
                // A dead or used kernel is dropped (and so killed).
            }
            got
        };
        self.wake.notify_one();
        got
    }

    fn config(&self) -> (KernelConfig, Option<Arc<SessionTools>>, Option<PathBuf>) {
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
        let tools = cfg
            .tool_host
            .take()
            .map(|inner| Arc::new(SessionTools::new(inner, None, cfg.session.clone())));
        cfg.tool_host = tools.clone().map(|t| t as Arc<dyn ToolHost>);
        (cfg, tools, workdir)
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
                let (cfg, tools, workdir) = self.config();
                match self.templates.spawn(cfg).await {
                    Ok(k) => {
                        self.tell_first(|| Ok(k.info().sandbox.clone()));
                        failures = 0;
                        if self.closed.load(Ordering::SeqCst) {
                            k.kill().await;
                            break;
                        }
                        if let Ok(mut q) = self.ready.lock() {
                            q.push_back((k, tools, workdir));
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
        for (k, _, _) in all {
            k.kill().await;
        }
    }
}
