//! Who is on the other end of a local Unix socket, and whether it may talk
//! to a cellhost control socket (the per-user daemon's).
//!
//! A kernel must never reach the daemon: a request from inside a kernel
//! could ask for an unconfined kernel, or read, run code in and kill every
//! other session. [`check_local_peer`] identifies the peer with
//! `SO_PEERCRED` and a pidfd of the very process that connected
//! (`SO_PEERPIDFD`; `pidfd_open` of the pid where the kernel lacks it), and
//! refuses, failing closed on anything it cannot read:
//!
//! * another uid than this process's effective uid;
//! * a process in another pid namespace than this process's (a sandboxed
//!   kernel's worker and ns-init, and everything they start);
//! * a process inside a cellhost kernel's control group
//!   (`<host group>/cellhost/<kernel>`, see [`crate::cgroup`]);
//! * a process that descends from a cellhost kernel init or ns-init (its
//!   command line's first argument is [`crate::launcher::INIT_ARG`] or
//!   [`crate::launcher::NS_INIT_ARG`]): this also catches kernels of mode
//!   `off`, which have neither namespace nor cgroup.
//!
//! After reading `/proc`, the pidfd is checked again: a peer that exited
//! meanwhile (its pid free to be reused by another process, whose files
//! would have been read) is refused.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::launcher::{INIT_ARG, NS_INIT_ARG};

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected.
const SO_PEERPIDFD: libc::c_int = 77;

/// Most parent links followed from the peer towards pid 1.
const MAX_HOPS: usize = 4096;

/// The peer a socket was refused for, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerRefused {
    /// The socket has no peer credentials (not a connected Unix socket).
    #[error("the peer's credentials cannot be read: {reason}")]
    NoCredentials {
        /// The system's error.
        reason: String,
    },
    /// The peer runs as another user.
    #[error("peer pid {pid} runs as uid {uid}, not {expected}")]
    OtherUser {
        /// Host pid of the peer.
        pid: i32,
        /// Its uid.
        uid: u32,
        /// This process's effective uid.
        expected: u32,
    },
    /// The peer exited (or cannot be pinned by a pidfd): its pid may
    /// already name another process.
    #[error("peer pid {pid} is gone or cannot be pinned: {reason}")]
    Gone {
        /// Host pid the credentials named.
        pid: i32,
        /// What failed.
        reason: String,
    },
    /// The peer lives in another pid namespace (a sandboxed kernel).
    #[error("peer pid {pid} is in another pid namespace ({theirs}, not {ours}): a sandboxed kernel")]
    OtherPidNamespace {
        /// Host pid of the peer.
        pid: i32,
        /// Its pid namespace (`pid:[inode]`).
        theirs: String,
        /// This process's.
        ours: String,
    },
    /// The peer is inside a cellhost kernel's control group.
    #[error("peer pid {pid} is inside a cellhost kernel's cgroup {group}")]
    KernelCgroup {
        /// Host pid of the peer.
        pid: i32,
        /// The group (`/proc/<pid>/cgroup` path).
        group: String,
    },
    /// The peer descends from a cellhost kernel init.
    #[error("peer pid {pid} descends from the cellhost kernel init pid {init}")]
    KernelDescendant {
        /// Host pid of the peer.
        pid: i32,
        /// Host pid of the kernel init (or ns-init) above it.
        init: i32,
    },
    /// `/proc` could not tell enough about the peer to let it in.
    #[error("peer pid {pid}: cannot read {what}: {reason}")]
    Unreadable {
        /// Host pid of the peer (or the ancestor being read).
        pid: i32,
        /// The file.
        what: String,
        /// The error.
        reason: String,
    },
}

/// A peer [`check_local_peer`] let in.
#[derive(Debug)]
pub struct Peer {
    /// Host pid of the process that connected.
    pub pid: i32,
    /// Its uid.
    pub uid: u32,
    /// A pidfd of that process (it cannot name another one).
    pub pidfd: OwnedFd,
}

/// Identifies the peer of the connected Unix socket `sock` and decides
/// whether it may use a cellhost control socket (see the module docs).
///
/// # Errors
/// [`PeerRefused`], naming the peer and the rule it broke (or what could
/// not be read: every doubt refuses).
pub fn check_local_peer(sock: BorrowedFd<'_>) -> Result<Peer, PeerRefused> {
    let cred = rustix::net::sockopt::socket_peercred(sock).map_err(|e| PeerRefused::NoCredentials {
        reason: e.to_string(),
    })?;
    let pid = cred.pid.as_raw_nonzero().get();
    let uid = cred.uid.as_raw();
    let expected = rustix::process::geteuid().as_raw();
    if uid != expected {
        return Err(PeerRefused::OtherUser { pid, uid, expected });
    }
    let gone = |reason: String| PeerRefused::Gone { pid, reason };
    let pidfd = peer_pidfd(sock, pid).map_err(|e| gone(e.to_string()))?;
    match pidfd_pid(&pidfd) {
        Some(p) if p == pid => {}
        Some(p) => return Err(gone(format!("its pidfd names pid {p}"))),
        None => return Err(gone("it has exited".into())),
    }
    inspect(pid)?;
    // Everything above was read from a live process: the pidfd pins it,
    // and it has not exited (so its pid was never free for another).
    if !alive(&pidfd) {
        return Err(gone("it exited while being checked".into()));
    }
    Ok(Peer { pid, uid, pidfd })
}

fn unreadable(pid: i32, what: &str, e: std::io::Error) -> PeerRefused {
    PeerRefused::Unreadable {
        pid,
        what: what.to_string(),
        reason: e.to_string(),
    }
}

/// The checks made through `/proc` on a live `pid`.
fn inspect(pid: i32) -> Result<(), PeerRefused> {
    let ours = std::fs::read_link("/proc/self/ns/pid").map_err(|e| unreadable(0, "/proc/self/ns/pid", e))?;
    let theirs_path = format!("/proc/{pid}/ns/pid");
    let theirs = std::fs::read_link(&theirs_path).map_err(|e| unreadable(pid, &theirs_path, e))?;
    if theirs != ours {
        return Err(PeerRefused::OtherPidNamespace {
            pid,
            theirs: theirs.display().to_string(),
            ours: ours.display().to_string(),
        });
    }
    let own_cg =
        std::fs::read_to_string("/proc/self/cgroup").map_err(|e| unreadable(0, "/proc/self/cgroup", e))?;
    let cg_path = format!("/proc/{pid}/cgroup");
    let their_cg = std::fs::read_to_string(&cg_path).map_err(|e| unreadable(pid, &cg_path, e))?;
    if let Some(group) = kernel_cgroup(&their_cg, &own_cg) {
        return Err(PeerRefused::KernelCgroup { pid, group });
    }
    let mut p = pid;
    for _ in 0..MAX_HOPS {
        let cmd_path = format!("/proc/{p}/cmdline");
        let cmdline = std::fs::read(&cmd_path).map_err(|e| unreadable(p, &cmd_path, e))?;
        if is_kernel_init(&cmdline) {
            return Err(PeerRefused::KernelDescendant { pid, init: p });
        }
        if p <= 1 {
            return Ok(());
        }
        let stat_path = format!("/proc/{p}/stat");
        let stat = std::fs::read_to_string(&stat_path).map_err(|e| unreadable(p, &stat_path, e))?;
        let Some(s) = crate::procfs::parse_stat(p, &stat) else {
            return Err(PeerRefused::Unreadable {
                pid: p,
                what: stat_path,
                reason: "unparsable".into(),
            });
        };
        if s.ppid <= 0 {
            // The parent lies outside this pid namespace's view.
            return Ok(());
        }
        p = s.ppid;
    }
    Err(PeerRefused::Unreadable {
        pid,
        what: "its ancestry".into(),
        reason: format!("more than {MAX_HOPS} parent links"),
    })
}

/// A command line (NUL-separated) whose first argument is the kernel
/// init's or the ns-init's hidden subcommand.
pub fn is_kernel_init(cmdline: &[u8]) -> bool {
    let arg1 = cmdline.split(|&b| b == 0).nth(1).unwrap_or_default();
    arg1 == INIT_ARG.as_bytes() || arg1 == NS_INIT_ARG.as_bytes()
}

/// The group of `theirs` (a `/proc/<pid>/cgroup` text) that lies inside a
/// cellhost kernel's group (`…/cellhost/<kernel>…`) and is not this
/// process's own group in that hierarchy (`ours`).
pub fn kernel_cgroup(theirs: &str, ours: &str) -> Option<String> {
    for line in theirs.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let in_kernel = comps.windows(2).any(|w| w[0] == "cellhost" && !w[1].is_empty());
        if !in_kernel {
            continue;
        }
        let prefix = format!("{id}:{ctrls}:");
        let own = ours.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
        if own != Some(path) {
            return Some(path.to_string());
        }
    }
    None
}

/// A pidfd of the process at the other end of the connected Unix socket
/// `sock` (`SO_PEERPIDFD`, else `pidfd_open` of its `SO_PEERCRED` pid, which
/// cannot be reused while the connection keeps the peer's socket open) —
/// for waiting until that process exits.
///
/// # Errors
/// Not a connected Unix socket, or the peer is gone.
pub fn peer_pidfd_of(sock: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    let cred = rustix::net::sockopt::socket_peercred(sock)?;
    peer_pidfd(sock, cred.pid.as_raw_nonzero().get())
}

/// A pidfd of the socket's peer: `SO_PEERPIDFD`, else `pidfd_open(pid)`.
fn peer_pidfd(sock: BorrowedFd<'_>, pid: i32) -> std::io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into a live c_int.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 && fd >= 0 {
        // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let err = std::io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::ENOPROTOOPT) | Some(libc::EINVAL)) {
        return Err(err);
    }
    let p = rustix::process::Pid::from_raw(pid).ok_or_else(|| std::io::Error::other("pid 0"))?;
    Ok(rustix::process::pidfd_open(
        p,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// The pid a pidfd names in this pid namespace (`None`: it has exited or
/// is not visible here).
fn pidfd_pid(pidfd: &OwnedFd) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    let pid: i32 = info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))?
        .trim()
        .parse()
        .ok()?;
    (pid > 0).then_some(pid)
}

/// The pidfd's process has not exited (a pidfd polls readable once it has).
fn alive(pidfd: &OwnedFd) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_inits_are_recognised_by_their_first_argument() {
        assert!(is_kernel_init(
            b"/usr/bin/cellhost\0__cellhost-kernel-init\0--host-pid\x001\0"
        ));
        assert!(is_kernel_init(b"/x/cellhost\0__cellhost-ns-init\0--go-fd\x003\0"));
        assert!(!is_kernel_init(
            b"/usr/bin/cellhost\0exec\0__cellhost-kernel-init\0"
        ));
        assert!(!is_kernel_init(b"bash\0"));
        assert!(!is_kernel_init(b""));
    }

    #[test]
    fn a_kernel_group_is_one_below_a_cellhost_component() {
        let ours = "4:memory:/user/me\n0::/user/me\n";
        let kernel = "4:memory:/user/me/cellhost/k-12-3\n0::/user/me\n";
        assert_eq!(
            kernel_cgroup(kernel, ours).as_deref(),
            Some("/user/me/cellhost/k-12-3")
        );
        assert_eq!(kernel_cgroup(ours, ours), None);
        // A directory merely named cellhost, with no kernel below it.
        assert_eq!(kernel_cgroup("0::/srv/cellhost\n", "0::/\n"), None);
        // Our own group is never held against a peer that shares it.
        assert_eq!(kernel_cgroup(kernel, kernel), None);
    }

    #[test]
    fn a_peer_of_this_process_is_let_in_with_its_pid() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let p = check_local_peer(std::os::fd::AsFd::as_fd(&a)).expect("own peer");
        assert_eq!(p.pid, std::process::id() as i32);
    }
}
