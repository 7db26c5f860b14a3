//! Copy-on-write forks of a live worker whose sandbox is off.
//!
//! A worker that no sandbox confines (mode `off`: no namespaces, mounts,
//! Landlock domain, seccomp filter or kernel uid of its own) can be forked
//! with `fork(2)` into a kernel no weaker than a cold kernel of that mode:
//! the copy shares its parent's pages until either writes them. A
//! confined worker cannot (see `cellhost_sessions::requests::fork`).
//!
//! The fork is the template's ([`crate::template`]), with the live worker
//! as the forking process:
//!
//! 1. The host opens a [`CowInvite`]: a Unix socket in a fresh directory
//!    only the host's user can enter, and a random token.
//! 2. A silent cell of the parent (`cellhost_worker.forkstate.cow_arm`)
//!    names the socket and token; once that cell's response is sent, the
//!    worker's main loop (no cell running) connects, says the token and its
//!    pid, and the host checks both (and the peer's pid by `SO_PEERCRED`).
//! 3. The host sends the template's `fork` request, marked `resume`, with
//!    the new kernel's four descriptors; the worker forks the new kernel's
//!    init (A), which joins the new kernel's cgroups, spawns the ns-init and
//!    forks the worker's copy (C), then execs the kernel init in adopt mode
//!    with `--watch-host` (it ends its tree when the host is gone). C closes
//!    every inherited descriptor but the new ones (the parent's control
//!    channel included), takes the environment and working directory of the
//!    new kernel, reseeds `random` and numpy, and goes on as a worker on the
//!    new channel with the parent's namespace.
//!
//! Memory accounting: the pages C shares with its parent stay charged to
//! the parent's cgroup (a page is charged to the cgroup that first touched
//! it); the pages C writes are copied and charged to C's own. A fork's
//! memory limit bounds what it adds, not what it shares.
//!
//! Supervision: C's init is a descendant of the parent kernel's init until
//! the parent ends. That init spares subtrees of adopted kernel inits when
//! it kills its tree (`LaunchSpec::spare_forks`, set for sandbox-off
//! kernels only), so ending the parent leaves the fork alone; the fork's
//! init is then an orphan, and the host (a child subreaper once it has made
//! a copy-on-write fork) becomes its parent and reaps it when its kernel
//! ends ([`crate::link`]'s adopted init).

use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::KernelConfig;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::template::{fork_kernel, read_line, send_fork_request};

/// How long the worker may take to connect once invited.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the worker may take to answer the fork request.
const FORK_REPLY: Duration = Duration::from_secs(30);

/// The host's side of one copy-on-write fork: the socket the parent's
/// worker connects to and the token it must say. Dropping it removes the
/// socket and its directory.
#[derive(Debug)]
pub struct CowInvite {
    dir: PathBuf,
    path: PathBuf,
    token: String,
    listener: UnixListener,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl CowInvite {
    /// A fresh socket under the system's temporary directory (a directory
    /// of mode 0700 with a random name; short enough for `sun_path`).
    ///
    /// # Errors
    /// The directory or socket cannot be made, or no random bytes.
    pub fn new() -> std::io::Result<CowInvite> {
        let mut raw = [0u8; 24];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
        let dir = std::env::temp_dir().join(format!("cellhost-cow-{}", hex(&raw[..8])));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let path = dir.join("s");
        let listener = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                return Err(e);
            }
        };
        Ok(CowInvite {
            dir,
            path,
            token: hex(&raw[8..]),
            listener,
        })
    }

    /// The socket the worker connects to (a host path; a sandbox-off
    /// worker sees the host's filesystem).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The token the worker must say first.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Waits for the worker `worker_pid` (host pid of the parent's worker)
    /// to connect, then forks the kernel `config` through it and waits for
    /// the new kernel's `ready`.
    ///
    /// # Errors
    /// [`KernelError::InvalidRequest`] for a sandboxed configuration, one
    /// with an egress allowlist, or a runtime other than Python's;
    /// [`KernelError::Spawn`] when the worker does not connect within 30 s,
    /// says another token, or the fork fails (with why); the errors of the
    /// new kernel's handshake.
    pub async fn fork(self, worker_pid: u32, config: KernelConfig) -> Result<Kernel, KernelError> {
        if config.sandbox.mode != cellhost_sandbox::profile::SandboxMode::Off {
            return Err(KernelError::InvalidRequest(
                "a copy-on-write fork is of a kernel whose sandbox is off only".into(),
            ));
        }
        if config.egress.is_some() {
            return Err(KernelError::InvalidRequest(
                "a kernel with an egress allowlist is not forked copy-on-write".into(),
            ));
        }
        if config.runtime.name() != "python" {
            return Err(KernelError::InvalidRequest(format!(
                "copy-on-write forks are of Python kernels, not {}",
                config.runtime.name()
            )));
        }
        become_subreaper();
        let mut extra = serde_json::Map::new();
        extra.insert("watch_host".into(), Value::from(std::process::id()));
        let exchange = move |req: Value, fds: [OwnedFd; 4]| -> std::io::Result<Value> {
            let sock = self.accept(worker_pid)?;
            send_fork_request(&sock, &req, fds, FORK_REPLY)?;
            let line = read_line(&sock)?;
            serde_json::from_str(&line).map_err(std::io::Error::other)
        };
        fork_kernel(config, worker_pid, 1, extra, exchange).await
    }

    /// The worker's connection: the first one whose peer is `worker_pid`
    /// and whose first line carries the token (others are dropped).
    fn accept(&self, worker_pid: u32) -> std::io::Result<UnixStream> {
        use rustix::event::{PollFd, PollFlags, poll};
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the worker did not connect for its copy-on-write fork",
                ));
            }
            let ts = rustix::event::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&self.listener, PollFlags::IN)];
            match poll(&mut fds, Some(&ts)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let (sock, _) = self.listener.accept()?;
            let peer = rustix::net::sockopt::socket_peercred(&sock)?;
            if peer.pid.as_raw_nonzero().get() as u32 != worker_pid {
                tracing::warn!(
                    pid = peer.pid.as_raw_nonzero().get(),
                    "copy-on-write fork: a connection not from the worker was dropped"
                );
                continue;
            }
            sock.set_read_timeout(Some(FORK_REPLY))?;
            let hello: Value = serde_json::from_str(&read_line(&sock)?).map_err(std::io::Error::other)?;
            if hello.get("type").and_then(Value::as_str) != Some("cow_hello")
                || hello.get("token").and_then(Value::as_str) != Some(self.token.as_str())
            {
                return Err(std::io::Error::other(
                    "the worker's copy-on-write connection carried another token",
                ));
            }
            return Ok(sock);
        }
    }
}

impl Drop for CowInvite {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Makes the host a child subreaper (once): the init of a copy-on-write
/// fork outlives the parent kernel's init, and becomes the host's child
/// then, which reaps it when its kernel ends.
fn become_subreaper() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
            tracing::warn!("copy-on-write fork: cannot become a child subreaper: {e}");
        }
    });
}
