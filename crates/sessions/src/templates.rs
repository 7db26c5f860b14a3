//! Templates of the registry: one fork server per interpreter (and sandbox
//! on/off) that has imported its language's configured preload list
//! (`preload` for Python modules, `r_preload` for R packages), so a
//! session's kernel — from the warm pool or beyond it — appears with that
//! stack ready in milliseconds ([`cellhost_kernel::Template`]).
//!
//! A template is started in the background the first time a kernel of its
//! interpreter is needed; kernels wait for it during its first 5 s at most
//! (a preload list that imports slowly, or hangs, never holds kernels up
//! longer) and start cold otherwise. When a template cannot start, or a fork fails (user
//! namespaces disabled for a user that is not root; a template that stopped
//! answering or refused to fork), the kernel starts cold and the reason is
//! logged at `warn` (shown by default); such a
//! template is retired and tried again after 60 s. A template that died is
//! replaced by the next kernel that needs it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellhost_kernel::{Kernel, KernelConfig, KernelError, Template};
use cellhost_sandbox::profile::SandboxMode;
use tokio::sync::watch;

/// How long a template that failed to start is not tried again.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long a kernel waits for a template that is still starting.
const WAIT_FOR_TEMPLATE: Duration = Duration::from_secs(5);

type Key = (PathBuf, bool);

/// `None` while starting; then the template, or `None` if it failed.
type Started = Option<Option<Template>>;

enum Entry {
    /// Started at that instant.
    Starting(watch::Receiver<Started>, Instant),
    Ready(Template),
    Failed(Instant),
}

/// The templates of one registry.
pub struct Templates {
    /// Preload lists by runtime name ([`cellhost_kernel::WorkerRuntime::name`]).
    preload: BTreeMap<String, Vec<String>>,
    map: Mutex<HashMap<Key, Entry>>,
    closed: AtomicBool,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates")
            .field("preload", &self.preload)
            .finish_non_exhaustive()
    }
}

impl Templates {
    /// Templates importing, for each runtime name (`python`, `r`), that
    /// language's list: a kernel of a language whose list is empty or
    /// absent starts cold, and no list reaches another language's template.
    pub fn new(preload: BTreeMap<String, Vec<String>>) -> Self {
        Templates {
            preload,
            map: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// What a template of the runtime named `language` imports (empty:
    /// none is started).
    pub fn preload(&self, language: &str) -> &[String] {
        self.preload.get(language).map_or(&[], Vec::as_slice)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a kernel for `cfg`: forked from its template when there is a
    /// preload list, else (or when the template cannot help) cold.
    ///
    /// # Errors
    /// The errors of [`Kernel::spawn`].
    pub async fn spawn(self: &Arc<Self>, cfg: KernelConfig) -> Result<Kernel, KernelError> {
        // Templates apply only where the runtime has them, to sandboxed
        // kernels only where its templates confine their forks, and to
        // local kernels only (a placement starts its own worker; an egress
        // allowlist needs a cold kernel's init).
        if !self.preload(cfg.runtime.name()).is_empty()
            && cfg.egress.is_none()
            && cfg.starter.is_none()
            // A workdir tmpfs is entered by a cold kernel's init only.
            && !matches!(cfg.sandbox.disk, Some(cellhost_sandbox::workdir_disk::DiskPlan::Mounted(_)))
            && cfg
                .runtime
                .template_argv(&cfg.python, std::path::Path::new(""))
                .is_some()
            && (cfg.sandbox.mode == SandboxMode::Off || cfg.runtime.templates_sandboxed())
            && let Some(t) = self.template_for(&cfg).await
        {
            match t.fork(cfg.clone()).await {
                Ok(k) => return Ok(k),
                Err(e) => {
                    tracing::warn!("template fork failed, starting a cold kernel: {e}");
                    // A template that cannot fork (say a preloaded module
                    // started threads) is retired and retried after 60 s:
                    // kernels meanwhile start cold without waiting for it.
                    let mut map = self.map();
                    if let Some(Entry::Ready(cur)) = map.get(&key_of(&cfg))
                        && cur.info().pid == t.info().pid
                    {
                        map.insert(key_of(&cfg), Entry::Failed(Instant::now()));
                    }
                }
            }
        }
        Kernel::spawn(cfg).await
    }

    /// The template of `cfg`'s interpreter: a ready one, or one started now
    /// (waited for at most 5 s); `None` when there is none to use.
    pub async fn template_for(self: &Arc<Self>, cfg: &KernelConfig) -> Option<Template> {
        let key = key_of(cfg);
        let (mut rx, since) = {
            let mut map = self.map();
            match map.get(&key) {
                Some(Entry::Ready(t)) if t.is_alive() => return Some(t.clone()),
                Some(Entry::Ready(_)) => {
                    tracing::warn!("the template of {} died: starting another", cfg.python.display());
                    self.start(&mut map, key, cfg)
                }
                Some(Entry::Failed(at)) if at.elapsed() < RETRY_AFTER => return None,
                Some(Entry::Starting(rx, since)) => (rx.clone(), *since),
                _ => self.start(&mut map, key, cfg),
            }
        };
        // Only the first 5 s of a template's start are waited for: later
        // kernels go cold at once while a slow one is still importing.
        let wait = WAIT_FOR_TEMPLATE.saturating_sub(since.elapsed());
        match tokio::time::timeout(wait, rx.wait_for(Option::is_some)).await {
            Ok(Ok(v)) => v.clone().flatten(),
            _ => None,
        }
    }

    /// Starts a template in the background; its entry says when it is ready.
    fn start(
        self: &Arc<Self>,
        map: &mut HashMap<Key, Entry>,
        key: Key,
        cfg: &KernelConfig,
    ) -> (watch::Receiver<Started>, Instant) {
        let (tx, rx) = watch::channel(None);
        let now = Instant::now();
        map.insert(key.clone(), Entry::Starting(rx.clone(), now));
        let mut base = cfg.clone();
        base.session = "template".into();
        base.tool_host = None;
        let me = self.clone();
        tokio::spawn(async move {
            let preload = me.preload(base.runtime.name()).to_vec();
            let started = Template::start(base, preload).await;
            let out = {
                let mut map = me.map();
                match started {
                    Ok(t) if !me.closed.load(Ordering::SeqCst) => {
                        if !t.info().failed.is_empty() {
                            tracing::warn!("template: modules not preloaded: {:?}", t.info().failed);
                        }
                        map.insert(key, Entry::Ready(t.clone()));
                        Some(t)
                    }
                    // Shut down meanwhile: the template goes with this value.
                    Ok(_) => None,
                    Err(e) => {
                        tracing::warn!("cannot start a template for {}: {e}", key.0.display());
                        map.insert(key, Entry::Failed(Instant::now()));
                        None
                    }
                }
            };
            let _ = tx.send(Some(out));
        });
        (rx, now)
    }

    /// Retires every template (kernels forked from them live on); a
    /// template still starting is retired when it is ready.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let all: Vec<Entry> = self.map().drain().map(|(_, e)| e).collect();
        drop(all);
    }
}

fn key_of(cfg: &KernelConfig) -> Key {
    (cfg.python.clone(), cfg.sandbox.mode != SandboxMode::Off)
}
