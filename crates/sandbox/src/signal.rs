//! Signals aimed at one thread, and whole-tree kills.

use std::io;

use crate::procfs;

/// Sends `sig` to thread `tid` of thread group `tgid` (`tgkill(2)`).
///
/// A process-directed SIGINT may be taken by any thread that does not block
/// it (an OpenBLAS pool thread, say) while Python's main thread sleeps on;
/// aiming at the main thread is what makes Python raise KeyboardInterrupt.
///
/// # Errors
/// `ESRCH` when the thread is gone, `EPERM` without permission.
pub fn tgkill(tgid: i32, tid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: tgkill takes three integers and touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, tgid, tid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends `sig` to process `pid`.
///
/// # Errors
/// `ESRCH` when the process is gone.
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: kill takes two integers and touches no memory of ours.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// SIGKILLs every live descendant of `root` (not `root`), repeating until a
/// sweep finds none alive or `rounds` sweeps were made. Returns how many
/// signals were sent. Zombies are left for their parent (or subreaper).
pub fn kill_descendants(root: i32, rounds: usize) -> usize {
    let mut sent = 0;
    for _ in 0..rounds {
        let alive: Vec<_> = procfs::descendants(root)
            .into_iter()
            .filter(|p| p.state != 'Z')
            .collect();
        if alive.is_empty() {
            break;
        }
        for p in alive {
            if kill(p.pid, libc::SIGKILL).is_ok() {
                sent += 1;
            }
        }
    }
    sent
}

/// SIGKILL to every live descendant of `root` but the subtrees rooted at a
/// process `spare` accepts (one sweep). Returns how many processes of the
/// unspared tree are left: those signalled, and zombies not yet reaped
/// (0: nothing but spared subtrees is left).
///
/// A zombie counts because `/proc` shows a thread-group leader as `Z` as
/// soon as its own thread has exited, while the group is not waitable
/// until its other threads have (a killed worker with a BLAS pool and a
/// large heap takes a while): a caller that stops at "only zombies left"
/// exits before it can reap them, and leaves them to whichever process
/// adopts orphans (the pid stays taken until that one reaps).
pub fn kill_descendants_sparing(root: i32, spare: impl Fn(i32) -> bool) -> usize {
    let procs = procfs::all_processes();
    let mut children: std::collections::HashMap<i32, Vec<procfs::ProcStat>> =
        std::collections::HashMap::new();
    for p in &procs {
        children.entry(p.ppid).or_default().push(*p);
    }
    let mut left = 0;
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for k in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            if k.pid == root || (k.state != 'Z' && spare(k.pid)) {
                continue;
            }
            if k.state == 'Z' || kill(k.pid, libc::SIGKILL).is_ok() {
                left += 1;
            }
            stack.push(k.pid);
        }
    }
    left
}

/// Name of a signal number, e.g. `SIGSEGV` for 11.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// Makes the child of `cmd` get SIGKILL when the thread that spawns it
/// ends, or the whole process (`PR_SET_PDEATHSIG`, kept across `execve`);
/// a child whose parent is already gone by then exits at once. For helper
/// processes (the font-cache build) that must never outlive the command
/// that started them.
pub fn kill_with_spawning_thread(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as i32;
    // SAFETY: the hook runs in the child between fork and exec and makes
    // only async-signal-safe system calls (prctl, getppid, _exit), touching
    // no memory of the parent but the copied `parent` integer.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(0);
            }
            Ok(())
        });
    }
}
