//! Process checkpoints of a local kernel with CRIU: the whole tree under
//! the kernel init dumped into an image directory, and restored later as a
//! new child of this host, its channels to the host reconnected.
//!
//! The tree's only resources outside itself are the host's ends of its
//! control socket and its two output pipes. `criu dump` is told that the
//! socket's far end may go (`--external unix[INODE]`); `criu restore`
//! replaces the socket and both pipes with fresh ones this host holds the
//! other ends of (`--inherit-fd fd[N]:socket:[INODE]`, `…:pipe:[INODE]`,
//! criu's own fds 0/1/2), restores the tree as a sibling of criu (so as a
//! child of this host, forked from its spawner thread: the init's
//! parent-death signal keeps working) and leaves it running. The worker
//! never learns it was restored: its `ready` (pid, version, rings) is kept
//! in the image's [`ProcessMeta`] and replayed by the link.
//!
//! A kernel with cgroup limits comes back under them: the restore runs
//! inside the new generation's groups (CRIU's own cgroup handling is
//! off at both ends), so the tree and its restored memory are charged to
//! and limited by them. Only kernels without a sandbox are dumped (the
//! session layer refuses the rest, naming the layer): CRIU does not carry
//! Landlock domains across a restore, and a kernel must never come back
//! weaker than its sandbox.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cellhost_protocol::frame::RingOffer;
use serde::{Deserialize, Serialize};

/// The file in an image directory that describes the dumped kernel.
pub const META_FILE: &str = "cellhost-process.json";
/// CRIU's log of a dump, in the image directory.
pub const DUMP_LOG: &str = "dump.log";
/// CRIU's log of a restore, in the image directory.
pub const RESTORE_LOG: &str = "restore.log";
/// The pid file `criu restore` writes (the restored init's pid).
const PID_FILE: &str = "restored.pid";

/// What the host needs to take a dumped kernel back: the tree's pids, the
/// worker's `ready`, and the names CRIU gave the external descriptors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMeta {
    /// Host pid of the kernel init (CRIU restores the same pids).
    pub init_pid: u32,
    /// Host pid of the worker.
    pub worker_pid: u32,
    /// The pid the worker reported in its `ready`.
    pub ready_pid: u32,
    /// `sys.version` of the worker.
    pub python_version: String,
    /// The worker's output rings (descriptors are restored at the same numbers).
    pub rings: Vec<RingOffer>,
    /// The control socket, as `/proc/PID/fd` names it (`socket:[N]`).
    pub control: String,
    /// The stdout pipe (`pipe:[N]`).
    pub stdout: String,
    /// The stderr pipe (`pipe:[N]`).
    pub stderr: String,
}

/// The CRIU binary: `CELLHOST_CRIU` when set, else the first `criu` of
/// `/usr/local/sbin` (where `scripts/criu-build.sh` installs it),
/// `/usr/sbin`, `/sbin`, else `criu` on `PATH`.
pub fn criu_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CELLHOST_CRIU").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    ["/usr/local/sbin/criu", "/usr/sbin/criu", "/sbin/criu"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("criu"))
}

/// The last error lines of a CRIU log (at most 4, bounded), or its tail.
pub fn log_errors(dir: &Path, log: &str) -> String {
    let text = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("Error")).collect();
    let picked: Vec<&str> = if errors.is_empty() {
        text.lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect()
    } else {
        errors[errors.len().saturating_sub(4)..].to_vec()
    };
    picked.join("; ").chars().take(800).collect()
}

fn fd_name(pid: u32, fd: &str) -> Result<String, String> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| format!("/proc/{pid}/fd/{fd}: {e}"))
}

/// Checks that the worker still writes to the pipes the host reads (a
/// cell may have replaced its fd 1/2; the dump would then miss them).
pub(crate) fn check_channels(meta: &ProcessMeta) -> Result<(), String> {
    for (fd, want) in [("1", &meta.stdout), ("2", &meta.stderr)] {
        let got = fd_name(meta.worker_pid, fd)?;
        if &got != want {
            return Err(format!(
                "the worker's fd {fd} is {got}, not the host's pipe {want}"
            ));
        }
    }
    Ok(())
}

/// `socket:[N]` → `N`.
fn inode_of(name: &str) -> &str {
    name.trim_start_matches(|c: char| c != '[')
        .trim_start_matches('[')
        .trim_end_matches(']')
}

async fn run(mut cmd: std::process::Command, timeout: Duration, what: &str) -> Result<(), String> {
    cmd.stdin(std::process::Stdio::null());
    let child = super::spawn::spawn(cmd)
        .await
        .map_err(|e| format!("cannot run {}: {e}", criu_binary().display()))?;
    wait(child, timeout, what).await
}

async fn wait(mut child: std::process::Child, timeout: Duration, what: &str) -> Result<(), String> {
    let pid = child.id() as i32;
    let waited = tokio::time::timeout(timeout, tokio::task::spawn_blocking(move || child.wait())).await;
    match waited {
        Ok(Ok(Ok(st))) if st.success() => Ok(()),
        Ok(Ok(Ok(st))) => Err(format!("{what} failed ({st})")),
        Ok(Ok(Err(e))) => Err(format!("{what}: {e}")),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => {
            // The blocking wait reaps it once it is gone.
            let _ = cellhost_sandbox::signal::kill(pid, libc::SIGKILL);
            Err(format!("{what} did not finish within {} s", timeout.as_secs()))
        }
    }
}

/// CRIU runs in its unprivileged mode (`--unprivileged`): this host is
/// not root, so the binary must carry `CAP_CHECKPOINT_RESTORE` as a file
/// capability, and the tree runs under `no_new_privs`
/// ([`crate::KernelConfig::checkpointable`]).
pub fn unprivileged() -> bool {
    !rustix::process::geteuid().is_root()
}

/// `criu ACTION`, with `--unprivileged` when [`unprivileged`], its soft
/// descriptor limit raised to the hard one.
pub fn command(action: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(criu_binary());
    cellhost_sandbox::fds::raise_nofile_on_exec(&mut cmd);
    cmd.arg(action);
    if unprivileged() {
        cmd.arg("--unprivileged");
    }
    cmd
}

/// Dumps the tree under `meta.init_pid` into `dir` (which must exist and
/// be empty), and writes [`META_FILE`]. With `leave_running` the tree goes
/// on; without it CRIU kills it once the image is complete.
///
/// # Errors
/// Why CRIU could not dump (its log's error lines).
pub(crate) async fn dump(
    meta: &ProcessMeta,
    dir: &Path,
    leave_running: bool,
    timeout: Duration,
) -> Result<(), String> {
    let mut cmd = command("dump");
    cmd.arg("--tree")
        .arg(meta.init_pid.to_string())
        .arg("--images-dir")
        .arg(dir)
        .arg("--log-file")
        .arg(DUMP_LOG)
        .arg("-v2")
        .arg("--external")
        .arg(format!("unix[{}]", inode_of(&meta.control)))
        // The tree is restored into the new generation's own groups,
        // never into the dumped ones (ignored at both ends, as CRIU
        // requires for a restore into another cgroup).
        .arg("--manage-cgroups=ignore")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if leave_running {
        cmd.arg("--leave-running");
    }
    check_channels(meta)?;
    let json = serde_json::to_vec(meta).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(META_FILE), json).map_err(|e| format!("{}: {e}", dir.display()))?;
    run(cmd, timeout, "criu dump")
        .await
        .map_err(|e| format!("{e}: {}", log_errors(dir, DUMP_LOG)))
}

/// Reads an image directory's [`META_FILE`] (bounded).
///
/// # Errors
/// Missing, too large or not the expected JSON.
pub fn read_meta(dir: &Path) -> Result<ProcessMeta, String> {
    let path = dir.join(META_FILE);
    let m = std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !m.is_file() || m.len() > 1 << 20 {
        return Err(format!("{} is not the image's description", path.display()));
    }
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// A tree `criu restore` brought back: the init (a child of this host) and
/// the host's ends of its fresh channels.
pub(crate) struct Restored {
    pub init_pid: u32,
    pub host_end: std::os::unix::net::UnixStream,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Inode of the restored tree's end of the new control socket (what
    /// the next dump names).
    pub control_inode: Option<u64>,
}

/// Restores the image in `dir`; the tree runs when this returns. `groups`
/// (`cgroup.procs` files of the new generation's groups, empty for none):
/// `criu` joins them before it execs, so the tree it forks comes back
/// inside them, its restored memory charged to them.
///
/// # Errors
/// Why CRIU could not restore (its log's error lines), or a descriptor
/// could not be made, or a group could not be joined.
pub(crate) async fn restore(
    dir: &Path,
    meta: &ProcessMeta,
    groups: &[PathBuf],
    timeout: Duration,
) -> Result<Restored, String> {
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let (host_end, worker_end) = std::os::unix::net::UnixStream::pair().map_err(|e| io("socketpair", e))?;
    let (out_r, out_w) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io("pipe", e.into()))?;
    let (err_r, err_w) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io("pipe", e.into()))?;
    let control_inode = rustix::fs::fstat(&worker_end).ok().map(|st| st.st_ino);
    let _ = std::fs::remove_file(dir.join(PID_FILE));
    let mut cmd = command("restore");
    cmd.arg("--images-dir")
        .arg(dir)
        .arg("--log-file")
        .arg(RESTORE_LOG)
        .arg("-v2")
        .arg("--restore-sibling")
        .arg("--restore-detached")
        .arg("--pidfile")
        .arg(PID_FILE)
        .arg("--inherit-fd")
        .arg(format!("fd[0]:{}", meta.control))
        .arg("--inherit-fd")
        .arg(format!("fd[1]:{}", meta.stdout))
        .arg("--inherit-fd")
        .arg(format!("fd[2]:{}", meta.stderr))
        .arg("--manage-cgroups=ignore")
        .stdin(std::process::Stdio::from(OwnedFd::from(worker_end)))
        .stdout(std::process::Stdio::from(out_w))
        .stderr(std::process::Stdio::from(err_w));
    cellhost_sandbox::cgroup::join_on_exec(&mut cmd, groups).map_err(|e| io("the kernel's groups", e))?;
    let child = super::spawn::spawn(cmd).await.map_err(|e| {
        let place = if groups.is_empty() {
            ""
        } else {
            " in the kernel's groups"
        };
        format!("cannot run {}{place}: {e}", criu_binary().display())
    })?;
    wait(child, timeout, "criu restore")
        .await
        .map_err(|e| format!("{e}: {}", log_errors(dir, RESTORE_LOG)))?;
    let pid = std::fs::read_to_string(dir.join(PID_FILE))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .ok_or_else(|| "criu restore wrote no pid".to_string())?;
    if pid != meta.init_pid {
        return Err(format!(
            "criu restored pid {pid}, not the init's {}",
            meta.init_pid
        ));
    }
    Ok(Restored {
        init_pid: pid,
        host_end,
        stdout: out_r,
        stderr: err_r,
        control_inode,
    })
}

/// Bytes under `dir` (regular files, not following links).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inodes_come_out_of_proc_names() {
        assert_eq!(inode_of("socket:[7412339]"), "7412339");
        assert_eq!(inode_of("pipe:[5]"), "5");
    }
}
