//! Templates of the registry: one fork server per interpreter (and sandbox
//! on/off) that has imported the configured `preload` modules, so a
//! session's kernel — from the warm pool or beyond it — appears with that
//! stack ready in milliseconds ([`cellhost_kernel::Template`]).
//!
//! A template is started the first time a kernel of its interpreter is
//! needed. When a template cannot start, or a fork fails (a sandboxed
//! template needs root), the kernel is started cold instead and the reason
//! is logged; a template that failed to start is retried after 60 s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellhost_kernel::{Kernel, KernelConfig, KernelError, Template};
use cellhost_sandbox::profile::SandboxMode;

/// How long a template that failed to start is not tried again.
const RETRY_AFTER: Duration = Duration::from_secs(60);

type Key = (PathBuf, bool);

/// The templates of one registry.
pub struct Templates {
    preload: Vec<String>,
    map: tokio::sync::Mutex<HashMap<Key, Result<Template, Instant>>>,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates")
            .field("preload", &self.preload)
            .finish_non_exhaustive()
    }
}

impl Templates {
    /// Templates importing `preload` (no template at all when empty).
    pub fn new(preload: Vec<String>) -> Self {
        Templates {
            preload,
            map: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Modules a template imports.
    pub fn preload(&self) -> &[String] {
        &self.preload
    }

    /// Starts a kernel for `cfg`: forked from its template when there is a
    /// preload list, else (or when the template cannot help) cold.
    ///
    /// # Errors
    /// The errors of [`Kernel::spawn`].
    pub async fn spawn(&self, cfg: KernelConfig) -> Result<Kernel, KernelError> {
        if !self.preload.is_empty()
            && let Some(t) = self.template_for(&cfg).await
        {
            match t.fork(cfg.clone()).await {
                Ok(k) => return Ok(k),
                Err(e) => tracing::warn!("template fork failed, starting a cold kernel: {e}"),
            }
        }
        Kernel::spawn(cfg).await
    }

    /// The template of `cfg`'s interpreter, started if needed.
    pub async fn template_for(&self, cfg: &KernelConfig) -> Option<Template> {
        let key = (cfg.python.clone(), cfg.sandbox.mode != SandboxMode::Off);
        let mut map = self.map.lock().await;
        if let Some(entry) = map.get(&key) {
            match entry {
                Ok(t) if t.is_alive() => return Some(t.clone()),
                Ok(_) => tracing::warn!("the template of {} died: starting another", cfg.python.display()),
                Err(at) if at.elapsed() < RETRY_AFTER => return None,
                Err(_) => {}
            }
        }
        let mut base = cfg.clone();
        base.session = "template".into();
        base.tool_host = None;
        match Template::start(base, self.preload.clone()).await {
            Ok(t) => {
                if !t.info().failed.is_empty() {
                    tracing::warn!("template: modules not preloaded: {:?}", t.info().failed);
                }
                map.insert(key, Ok(t.clone()));
                Some(t)
            }
            Err(e) => {
                tracing::warn!("cannot start a template for {}: {e}", cfg.python.display());
                map.insert(key, Err(Instant::now()));
                None
            }
        }
    }

    /// Retires every template (kernels forked from them live on).
    pub async fn shutdown(&self) {
        self.map.lock().await.clear();
    }
}
