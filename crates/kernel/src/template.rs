//! Templates: per-configuration fork servers that hand out kernels with a
//! configuration's modules already imported.
//!
//! A [`Template`] is a worker process of the configuration's runtime
//! (where [`WorkerRuntime::template_argv`](crate::runtime::WorkerRuntime::template_argv)
//! says templates apply), started like a kernel (through a kernel init,
//! with the configuration's interpreter and environment), that imports the
//! worker and the modules to preload and then only forks. [`Template::fork`]
//! gives a [`Kernel`] like [`Kernel::spawn`] does — own session directory,
//! generation, cgroup and, with a sandbox, own namespaces, mounts, Landlock
//! domain, capabilities and seccomp filter (`cellhost_sandbox::forkplan`) —
//! in milliseconds instead of the imports' hundreds. Templates are local
//! processes: the forked kernel's link is the local one.
//!
//! ```text
//! host ──▶ template init (--keep-tree) ──▶ template (interpreter, preloaded)
//!                                            └─fork─▶ kernel init (adopt) ─▶ ns-init ─▶ worker
//! ```
//!
//! Caveats (the runtime's own, such as random state and thread pools at
//! fork, are in its module's documentation):
//! * The template runs no user code, so nothing of one session reaches the
//!   template or another session; each kernel is a fresh fork.
//! * Environment read at import time is the template's: fork only with the
//!   configuration it was started with ([`Template::fork`] refuses another
//!   interpreter).
//! * As root, the forked processes create each kernel's namespaces
//!   themselves; as another user, each forked kernel first enters a user
//!   namespace of its own, mapped to the user's uid, that owns the others
//!   (`cellhost_sandbox::forkplan::UserNsPlan`): the same layers either
//!   way, but for the kernel uid only root can take. A fork that fails
//!   (the worker exits with status 72 and says why on stderr, say where
//!   user namespaces are disabled) is an error: callers start a cold
//!   kernel instead.
//! * A runtime whose template cannot confine its forks
//!   ([`WorkerRuntime::templates_sandboxed`](crate::runtime::WorkerRuntime::templates_sandboxed)
//!   false; Python's and R's both confine them) has templates for
//!   unsandboxed configurations only;
//!   [`Template::start`] and [`Template::fork`] refuse a sandboxed one
//!   ([`KernelError::InvalidRequest`]) and callers start it cold.
//! * Retiring a template (dropping the last handle) kills the template
//!   only; kernels forked from it live on. The host's death kills them all.

use std::collections::BTreeMap;
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use cellhost_sandbox::forkplan::fork_plan;

use crate::config::KernelConfig;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::link::local::{InitProc, LocalLink, Prepared, pidfd_of, spawn, worker_env};

/// How long a template may take to import its modules.
const TEMPLATE_STARTUP: Duration = Duration::from_secs(120);

/// How long a template may take to answer a fork request.
const FORK_REPLY: Duration = Duration::from_secs(10);

/// Facts about a running template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateInfo {
    /// Host pid of the template (the worker process that forks).
    pub pid: u32,
    /// Interpreter.
    pub python: PathBuf,
    /// Modules imported.
    pub preloaded: Vec<String>,
    /// Modules that failed to import, with the error.
    pub failed: BTreeMap<String, String>,
    /// Milliseconds the template spent importing (worker and preload).
    pub import_ms: f64,
    /// Threads of the template once it was ready (BLAS pools included).
    pub threads: i64,
}

struct Inner {
    base: KernelConfig,
    info: TemplateInfo,
    sock: Mutex<UnixStream>,
    pidfd: OwnedFd,
    seq: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Only the template: kernels forked from it live on under its init.
        let _ = rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL);
    }
}

/// A fork server for one kernel configuration. Cloning gives another handle;
/// the template is killed when the last one is dropped.
#[derive(Clone)]
pub struct Template {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Template")
            .field("info", &self.inner.info)
            .finish_non_exhaustive()
    }
}

fn io_err(label: &str, ctx: &str, e: std::io::Error) -> KernelError {
    KernelError::io(label, ctx, e)
}

impl Template {
    /// Starts a template for `config` (interpreter, environment, cwd,
    /// sandbox profile) that imports `preload` (module names of the
    /// runtime's language). A module that fails to
    /// import is reported in [`TemplateInfo::failed`], not an error.
    ///
    /// # Errors
    /// [`KernelError::InvalidRequest`] (templates do not apply to the
    /// runtime, or not to a sandboxed configuration of it), [`KernelError::Spawn`] (the interpreter cannot run or the template
    /// died, with its stderr), [`KernelError::StartupTimeout`] (no answer
    /// within 120 s), [`KernelError::Io`].
    pub async fn start(config: KernelConfig, preload: Vec<String>) -> Result<Template, KernelError> {
        let label = format!("template:{}", config.python.display());
        let runtime = config.runtime.clone();
        let worker_dir = runtime
            .boot_dir()
            .map_err(|e| io_err(&label, "writing the worker package", e))?;
        let Some(program) = runtime.template_argv(&config.python, worker_dir) else {
            return Err(KernelError::InvalidRequest(format!(
                "templates do not apply to the {} runtime",
                runtime.name()
            )));
        };
        let sandboxed = config.sandbox.mode != cellhost_sandbox::profile::SandboxMode::Off;
        if sandboxed && !runtime.templates_sandboxed() {
            return Err(KernelError::InvalidRequest(format!(
                "templates of the {} runtime fork unsandboxed kernels only",
                runtime.name()
            )));
        }
        let (host_end, worker_end) = UnixStream::pair().map_err(|e| io_err(&label, "socketpair", e))?;
        let launcher = config.launcher_path()?;
        let mut cmd = spawn::init_command(&launcher, OwnedFd::from(worker_end));
        cmd.stdout(Stdio::null());
        let mut env = worker_env(&config, sandboxed);
        if sandboxed && let Some(assets) = runtime.sandbox_assets(&config.python, worker_dir) {
            env.extend(runtime.template_env(&assets));
        }
        let launch = cellhost_sandbox::profile::LaunchSpec {
            host_pid: std::process::id() as i32,
            cgroup_procs: Vec::new(),
            sandbox: None,
            program,
            env: spawn::env_strings(&env),
            keep_tree: true,
            spare_forks: false,
            no_new_privs: false,
        };
        if let Some(cwd) = &config.cwd {
            cmd.current_dir(cwd);
        }
        let python = config.python.display().to_string();
        let mut child = spawn::spawn(cmd).await.map_err(|e| KernelError::Spawn {
            python: python.clone(),
            reason: format!("cannot start the template's init {}: {e}", launcher.display()),
        })?;
        let template_config = serde_json::json!({ "preload": preload });
        if let Err(e) = spawn::write_launch(&host_end, &launch, Some(&template_config)) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io_err(&label, "launch message", e));
        }
        let stderr = child.stderr.take();
        let mut init = InitProc::Child(child);
        let ready = tokio::task::spawn_blocking(move || -> Result<(Value, UnixStream), std::io::Error> {
            host_end.set_read_timeout(Some(TEMPLATE_STARTUP))?;
            let line = read_line(&host_end)?;
            let v: Value = serde_json::from_str(&line).map_err(std::io::Error::other)?;
            Ok((v, host_end))
        })
        .await
        .map_err(|e| io_err(&label, "template start", std::io::Error::other(e)))?;
        let (v, sock) = match ready {
            Ok(x) => x,
            Err(e) => {
                let timed_out = matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
                init.kill_and_reap();
                if timed_out {
                    return Err(KernelError::StartupTimeout {
                        kernel: label,
                        timeout_ms: TEMPLATE_STARTUP.as_millis() as u64,
                    });
                }
                let mut said = String::new();
                if let Some(mut s) = stderr {
                    let _ = s.read_to_string(&mut said);
                }
                if let Some(err) = runtime.start_failure(&config.python, &said) {
                    return Err(err);
                }
                return Err(KernelError::Spawn {
                    python,
                    reason: format!("the template ended before it was ready ({e}): {}", said.trim()),
                });
            }
        };
        if let Some(mut s) = stderr {
            // Drain whatever the template says later, so it never blocks.
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink);
            });
        }
        let pid = v.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32;
        let info = TemplateInfo {
            pid,
            python: config.python.clone(),
            preloaded: serde_json::from_value(v.get("preloaded").cloned().unwrap_or_default())
                .unwrap_or_default(),
            failed: serde_json::from_value(v.get("failed").cloned().unwrap_or_default()).unwrap_or_default(),
            import_ms: v.get("import_ms").and_then(Value::as_f64).unwrap_or(0.0),
            threads: v.get("threads").and_then(Value::as_i64).unwrap_or(-1),
        };
        let pidfd = match pidfd_of(pid) {
            Ok(fd) => fd,
            Err(e) => {
                init.kill_and_reap();
                return Err(io_err(&label, "pidfd of the template", e));
            }
        };
        // The template's init outlives the template while forked kernels
        // live; reap it whenever it ends.
        std::thread::spawn(move || {
            if let InitProc::Child(mut c) = init {
                let _ = c.wait();
            }
        });
        Ok(Template {
            inner: Arc::new(Inner {
                base: config,
                info,
                sock: Mutex::new(sock),
                pidfd,
                seq: AtomicU64::new(1),
            }),
        })
    }

    /// The template process is still there (it may be killed or die like
    /// any process; [`Template::fork`] then fails).
    pub fn is_alive(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, poll};
        // A pidfd polls readable once its process has exited.
        let mut fds = [PollFd::new(&self.inner.pidfd, PollFlags::IN)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(poll(&mut fds, Some(&zero)), Ok(0))
    }

    /// Facts about the template.
    pub fn info(&self) -> &TemplateInfo {
        &self.inner.info
    }

    /// The configuration the template was started with.
    pub fn config(&self) -> &KernelConfig {
        &self.inner.base
    }

    /// Forks a kernel for `config` (session, generation, session
    /// directory, limits, tools, secrets; the interpreter must be the
    /// template's) and waits for its `ready`.
    ///
    /// # Errors
    /// [`KernelError::InvalidRequest`] for another interpreter, or a
    /// sandboxed configuration of a runtime whose templates cannot confine
    /// their forks;
    /// [`KernelError::Spawn`] when the template is gone or the fork failed
    /// (with the reason the forked processes gave); the errors of
    /// [`Kernel::spawn`]'s handshake.
    pub async fn fork(&self, config: KernelConfig) -> Result<Kernel, KernelError> {
        if config.egress.is_some() {
            // The proxy's listener is bound by a cold kernel's init only.
            return Err(KernelError::InvalidRequest(
                "a kernel with an egress allowlist starts cold, not from a template".into(),
            ));
        }
        if config.sandbox.mode != cellhost_sandbox::profile::SandboxMode::Off
            && !config.runtime.templates_sandboxed()
        {
            return Err(KernelError::InvalidRequest(format!(
                "templates of the {} runtime fork unsandboxed kernels only",
                config.runtime.name()
            )));
        }
        if config.python != self.inner.base.python {
            return Err(KernelError::InvalidRequest(format!(
                "template of {} cannot fork a kernel of {}",
                self.inner.base.python.display(),
                config.python.display()
            )));
        }
        let inner = self.inner.clone();
        let exchange = move |req: Value, fds: [OwnedFd; 4]| -> std::io::Result<Value> {
            let id = req.get("id").and_then(Value::as_u64);
            let sock = inner
                .sock
                .lock()
                .map_err(|_| std::io::Error::other("template socket lock poisoned"))?;
            send_fork_request(&sock, &req, fds, FORK_REPLY)?;
            // A reply that came too late for an earlier request is skipped.
            loop {
                let line = read_line(&sock)?;
                let v: Value = serde_json::from_str(&line).map_err(std::io::Error::other)?;
                if v.get("id").and_then(Value::as_u64) == id {
                    return Ok(v);
                }
                tracing::debug!("template: skipping a stale reply: {line}");
            }
        };
        let id = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        fork_kernel(config, self.inner.info.pid, id, serde_json::Map::new(), exchange).await
    }
}

/// Forks a kernel for `config` through a process that runs the template's
/// fork code (`cellhost_worker.template`): a template, or a live worker
/// asked for a copy-on-write fork ([`crate::cow`]). `forker` is that
/// process's host pid; `extra` goes into the fork request beside the
/// plan, spec, cgroups, environment and cwd; `exchange` sends the request
/// with its four descriptors (the worker's control socket, its stdout and
/// stderr pipes, the init's status pipe) and returns the forker's reply.
///
/// # Errors
/// [`KernelError::Spawn`] when the exchange fails or the forker refused
/// (with its reason); the errors of `Prepared::new` and of the handshake.
pub(crate) async fn fork_kernel<F>(
    config: KernelConfig,
    forker: u32,
    id: u64,
    extra: serde_json::Map<String, Value>,
    exchange: F,
) -> Result<Kernel, KernelError>
where
    F: FnOnce(Value, [OwnedFd; 4]) -> std::io::Result<Value> + Send + 'static,
{
    let mut prep = Prepared::new(&config)?;
    prep.template = Some(forker);
    let label = prep.label.clone();
    // The forked processes exec the launcher from the template's view:
    // `/proc/self/exe` would name the interpreter there.
    let launcher = config.launcher_path()?;
    let launcher = std::fs::read_link(&launcher).unwrap_or(launcher);
    let (host_end, worker_end) = UnixStream::pair().map_err(|e| io_err(&label, "socketpair", e))?;
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(std::io::Error::from);
    let (out_r, out_w) = pipe().map_err(|e| io_err(&label, "stdout pipe", e))?;
    let (err_r, err_w) = pipe().map_err(|e| io_err(&label, "stderr pipe", e))?;
    let (st_r, st_w) = pipe().map_err(|e| io_err(&label, "status pipe", e))?;
    let plan = fork_plan(prep.spec.as_ref());
    let cwd = prep
        .spec
        .as_ref()
        .and_then(|s| s.workdir.clone())
        .or_else(|| config.cwd.clone());
    let env: BTreeMap<String, String> = worker_env(&config, prep.spec.is_some())
        .into_iter()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .collect();
    let cgroup_procs: Vec<PathBuf> = prep
        .cgroup
        .iter()
        .flat_map(cellhost_sandbox::cgroup::KernelCgroup::procs_files)
        .collect();
    let mut req = serde_json::json!({
        "type": "fork",
        "id": id,
        "launcher": launcher,
        "plan": plan,
        "spec": prep.spec,
        "cgroup_procs": cgroup_procs,
        "env": env,
        "cwd": cwd,
    });
    if let Some(obj) = req.as_object_mut() {
        obj.extend(extra);
    }
    // The worker reads its configuration from its control socket before
    // anything else (never from its environment).
    spawn::write_launch_config(&host_end, &config.worker_message())
        .map_err(|e| io_err(&label, "worker configuration", e))?;
    let started = Instant::now();
    let fds = [OwnedFd::from(worker_end), out_w, err_w, st_w];
    let reply = tokio::task::spawn_blocking(move || exchange(req, fds))
        .await
        .map_err(|e| io_err(&label, "fork request", std::io::Error::other(e)))?
        .map_err(|e| KernelError::Spawn {
            python: config.python.display().to_string(),
            reason: format!("the forking process did not answer the fork request: {e}"),
        })?;
    let pid = match reply.get("type").and_then(Value::as_str) {
        Some("forked") => reply.get("pid").and_then(Value::as_u64).unwrap_or(0) as i32,
        _ => {
            return Err(KernelError::Spawn {
                python: config.python.display().to_string(),
                reason: format!(
                    "the forking process refused to fork: {}",
                    reply
                        .get("error")
                        .and_then(Value::as_str)
                        .unwrap_or("no reason given")
                ),
            });
        }
    };
    tracing::debug!(kernel = %label, pid, ms = started.elapsed().as_secs_f64() * 1e3, "forked");
    let pidfd = pidfd_of(pid as u32).map_err(|e| io_err(&label, "pidfd of the forked init", e))?;
    rustix::io::ioctl_fionbio(&st_r, true).map_err(|e| io_err(&label, "status pipe", e.into()))?;
    let init = InitProc::Adopted {
        pid: pid as u32,
        pidfd,
        status: std::fs::File::from(st_r),
        exit: None,
    };
    let (link, launch) = LocalLink::attach(prep, init, host_end, out_r, err_r)?;
    Kernel::attach(config, link, launch).await
}

/// One line from the template, read byte by byte so nothing after it is
/// consumed (at most 1 MiB).
pub(crate) fn read_line(sock: &UnixStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    let mut r = sock;
    loop {
        match r.read(&mut byte) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the template closed its control socket",
                ));
            }
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => {
                line.push(byte[0]);
                if line.len() > 1 << 20 {
                    return Err(std::io::Error::other("the template sent a line over 1 MiB"));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(line).map_err(std::io::Error::other)
}

/// Sends one fork request (`req` as a JSON line) with the child's four
/// channel ends attached, closes this process's copies of them (EOF must
/// mean the child), and bounds the wait for the reply by `reply_timeout`.
pub(crate) fn send_fork_request(
    sock: &UnixStream,
    req: &Value,
    fds: [OwnedFd; 4],
    reply_timeout: Duration,
) -> std::io::Result<()> {
    let [a, b, c, d] = &fds;
    send_with_fds(
        sock,
        format!("{req}\n").as_bytes(),
        &[a.as_fd(), b.as_fd(), c.as_fd(), d.as_fd()],
    )?;
    drop(fds);
    sock.set_read_timeout(Some(reply_timeout))
}

/// Sends `bytes` with `fds` attached to the first byte (SCM_RIGHTS).
pub(crate) fn send_with_fds(
    sock: &UnixStream,
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many descriptors for one message"));
    }
    let n = sendmsg(sock, &[IoSlice::new(bytes)], &mut anc, SendFlags::empty())?;
    let mut w = sock;
    w.write_all(&bytes[n.min(bytes.len())..])
}
