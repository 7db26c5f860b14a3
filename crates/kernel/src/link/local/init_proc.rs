//! The kernel init as the host sees it: a child of the host (a cold
//! kernel), or the child of a template (a forked kernel), which the host
//! cannot wait for and learns the end of through a status pipe.

use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::time::Duration;

use cellhost_sandbox::signal;

/// A pidfd for `pid` (which need not be a child of this process).
///
/// # Errors
/// `pid` is 0, or the process is gone.
pub(crate) fn pidfd_of(pid: u32) -> io::Result<OwnedFd> {
    let p = rustix::process::Pid::from_raw(pid as i32).ok_or_else(|| io::Error::other("pid 0"))?;
    Ok(rustix::process::pidfd_open(
        p,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// The process that supervises one kernel's tree.
pub(crate) enum InitProc {
    /// Started by the host: waited for with `waitpid`.
    Child(Child),
    /// Forked by a template: its parent is the template, which reaps it.
    /// The init writes the worker's raw wait status (4 bytes, native order) to
    /// `status` just before it exits; signals go through `pidfd`, so a
    /// recycled pid is never hit.
    Adopted {
        pid: u32,
        pidfd: OwnedFd,
        status: std::fs::File,
        exit: Option<ExitStatus>,
    },
    /// Brought back by `criu restore` as a child of this host (not a
    /// `std::process::Child`): waited for through its pidfd.
    Restored {
        pid: u32,
        pidfd: OwnedFd,
        exit: Option<ExitStatus>,
    },
}

impl InitProc {
    /// Host-side pid of the init.
    pub(crate) fn id(&self) -> u32 {
        match self {
            InitProc::Child(c) => c.id(),
            InitProc::Adopted { pid, .. } | InitProc::Restored { pid, .. } => *pid,
        }
    }

    /// The init's status once it has exited (for a forked kernel: the
    /// status of the worker it mirrors; an init that died without reporting,
    /// which only SIGKILL can cause, reads as killed by SIGKILL).
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self {
            InitProc::Child(c) => c.try_wait(),
            InitProc::Restored { pidfd, exit, .. } => {
                if exit.is_none() {
                    use rustix::process::{WaitId, WaitIdOptions, waitid};
                    let got = waitid(
                        WaitId::PidFd(std::os::fd::AsFd::as_fd(pidfd)),
                        WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
                    )?;
                    if let Some(st) = got {
                        let raw = match (st.exit_status(), st.terminating_signal()) {
                            (Some(code), _) => (code & 0xff) << 8,
                            (None, Some(sig)) => sig & 0x7f,
                            (None, None) => libc::SIGKILL,
                        };
                        *exit = Some(ExitStatus::from_raw(raw));
                    }
                }
                Ok(*exit)
            }
            InitProc::Adopted {
                status, exit, pidfd, ..
            } => {
                if exit.is_some() {
                    return Ok(*exit);
                }
                let st = read_status(status)?;
                if st.is_some() {
                    *exit = st;
                    reap_if_ours(pidfd);
                }
                Ok(st)
            }
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        match self {
            InitProc::Child(c) => {
                let _ = signal::kill(c.id() as i32, sig.as_raw());
            }
            InitProc::Adopted { pidfd, .. } | InitProc::Restored { pidfd, .. } => {
                let _ = rustix::process::pidfd_send_signal(pidfd, sig);
            }
        }
    }

    /// SIGTERM to the init (which kills and reaps its tree); after ~1 s
    /// SIGKILL to its tree, the init left to reap it; after ~1 s more
    /// SIGKILL to the init; for a child of the host, reaps it. Blocks for
    /// at most ~2.5 s.
    pub(crate) fn kill_and_reap(&mut self) {
        if matches!(self.try_wait(), Ok(Some(_))) {
            return;
        }
        let init = self.id() as i32;
        self.signal(rustix::process::Signal::TERM);
        for round in 0..400 {
            if let Ok(Some(_)) = self.try_wait() {
                return;
            }
            if round == 200 {
                // Killed before the tree, the init would leave whatever is
                // still exiting to whoever adopts orphans.
                signal::kill_descendants(init, 20);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        signal::kill_descendants(init, 20);
        self.signal(rustix::process::Signal::KILL);
        match self {
            InitProc::Child(c) => {
                let _ = c.wait();
            }
            InitProc::Restored { pidfd, exit, .. } if exit.is_none() => {
                use rustix::process::{WaitId, WaitIdOptions, waitid};
                let _ = waitid(
                    WaitId::PidFd(std::os::fd::AsFd::as_fd(pidfd)),
                    WaitIdOptions::EXITED,
                );
                *exit = Some(ExitStatus::from_raw(libc::SIGKILL));
            }
            _ => {}
        }
    }
}

/// The raw wait status an adopted init wrote to its status pipe, once it
/// has exited (an init that died without reporting, which only SIGKILL can
/// cause, reads as killed by SIGKILL); `None` while it runs.
fn read_status(status: &mut std::fs::File) -> io::Result<Option<ExitStatus>> {
    let mut raw = [0u8; 4];
    let mut got = 0;
    loop {
        match status.read(&mut raw[got..]) {
            Ok(0) => {
                let st = if got == 4 {
                    i32::from_ne_bytes(raw)
                } else {
                    libc::SIGKILL
                };
                return Ok(Some(ExitStatus::from_raw(st)));
            }
            Ok(n) => {
                got += n;
                if got == 4 {
                    return Ok(Some(ExitStatus::from_raw(i32::from_ne_bytes(raw))));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Not finished (a partial report cannot happen:
                // 4 bytes are written in one atomic pipe write).
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reaps an adopted init that has become this process's child (the init of
/// a copy-on-write fork, orphaned when its parent kernel ended, with the
/// host a child subreaper). Its status pipe closes as it exits: waits up
/// to 100 ms for the exit to complete; a process that is not our child is
/// left to its parent.
fn reap_if_ours(pidfd: &OwnedFd) {
    use rustix::event::{PollFd, PollFlags, poll};
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let wait = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    let _ = poll(&mut fds, Some(&wait));
    let _ = waitid(
        WaitId::PidFd(std::os::fd::AsFd::as_fd(pidfd)),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
    );
}
