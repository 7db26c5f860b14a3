//! Inherited file descriptors: nothing a host process holds open without
//! close-on-exec may reach a kernel or a host tool.
//!
//! A process that starts cellhost may hand it any number of open
//! descriptors (`cellhost exec ... 7<secret`); `std::process::Command`
//! passes every descriptor without `FD_CLOEXEC` on to the child. So the
//! kernel init closes everything but its protocol descriptors first thing
//! ([`close_all_except`]), and host-side children (the detached daemon,
//! host tools) are started with [`close_inherited_on_exec`].
//!
//! Every function here is async-signal-safe (no allocation, only system
//! calls), so it may run between `fork` and `exec`.

use std::os::unix::process::CommandExt;

/// Descriptors below this are the standard streams and always kept.
pub const FIRST_NON_STD: i32 = 3;

/// The highest descriptor number the fallback loop (kernels without
/// `close_range`, before Linux 5.9) closes when `RLIMIT_NOFILE` says
/// nothing smaller.
const FALLBACK_MAX: u64 = 1 << 16;

/// `close_range(first, last, flags)`; falls back to closing one by one
/// (or setting `FD_CLOEXEC` one by one) where the system call is missing.
fn range(first: i32, last: i32, cloexec: bool) {
    if first > last || first < 0 {
        return;
    }
    let flags = if cloexec { libc::CLOSE_RANGE_CLOEXEC } else { 0 };
    // SAFETY: close_range takes integers only; closing (or marking) fds this
    // process owns cannot touch memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            last as libc::c_uint,
            flags as libc::c_uint,
        )
    };
    if rc == 0 {
        return;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into a live struct.
    let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(FALLBACK_MAX)
    } else {
        FALLBACK_MAX
    };
    let last = (last as u64).min(max.saturating_sub(1)) as i32;
    for fd in first..=last {
        // SAFETY: plain fd operations on numbers this process may own; a
        // number that is not open fails with EBADF, which is ignored.
        unsafe {
            if cloexec {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            } else {
                libc::close(fd);
            }
        }
    }
}

/// Closes every descriptor from 3 up except those in `keep` (unsorted,
/// duplicates and numbers below 3 allowed). Async-signal-safe.
///
/// Only for a process that owns no descriptor it still means to use
/// besides `keep` and the standard streams: the kernel init at its start,
/// or a child between `fork` and `exec`.
pub fn close_all_except(keep: &[i32]) {
    each_gap(keep, |a, b| range(a, b, false));
}

/// Marks every descriptor from 3 up close-on-exec (none is closed), so no
/// child this process execs inherits one. Async-signal-safe; safe to call
/// in a process whose own code still uses those descriptors.
pub fn cloexec_all() {
    range(FIRST_NON_STD, i32::MAX, true);
}

/// Calls `f(first, last)` for each maximal range of descriptors ≥ 3 not in
/// `keep`, without allocating.
fn each_gap(keep: &[i32], mut f: impl FnMut(i32, i32)) {
    let mut next = FIRST_NON_STD;
    loop {
        // The smallest kept fd at or above `next`.
        let k = keep.iter().copied().filter(|&k| k >= next).min();
        match k {
            Some(k) => {
                if k > next {
                    f(next, k - 1);
                }
                if k == i32::MAX {
                    return;
                }
                next = k + 1;
            }
            None => {
                f(next, i32::MAX);
                return;
            }
        }
    }
}

/// Makes `cmd`'s child close every descriptor but 0, 1 and 2 before it
/// execs, so it inherits nothing this process holds without close-on-exec
/// (what the process that started cellhost gave it, or a descriptor
/// another thread opened without `O_CLOEXEC`). The standard streams set on
/// `cmd` are in place by then and kept.
pub fn close_inherited_on_exec(cmd: &mut std::process::Command) {
    // SAFETY: the hook runs in the child between fork and exec and makes
    // only async-signal-safe system calls (close_range, or close in a loop),
    // touching no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            close_all_except(&[]);
            Ok(())
        });
    }
}

/// Makes `cmd`'s child raise its soft `RLIMIT_NOFILE` to the hard limit
/// before it execs. For `criu`: it keeps its own descriptors above the
/// largest descriptor table of the tree it restores, and refuses
/// (`Can't chose service_fd_base`) when the soft limit leaves no room;
/// as root it raises the limit itself, in its unprivileged mode it cannot
/// go past the hard limit, and the usual soft 1024 is too little.
pub fn raise_nofile_on_exec(cmd: &mut std::process::Command) {
    // SAFETY: the hook runs in the child between fork and exec and makes
    // only async-signal-safe system calls (getrlimit, setrlimit) on a
    // stack value; a failure leaves the limit as it was.
    unsafe {
        cmd.pre_exec(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
                lim.rlim_cur = lim.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(keep: &[i32]) -> Vec<(i32, i32)> {
        let mut v = Vec::new();
        each_gap(keep, |a, b| v.push((a, b)));
        v
    }

    #[test]
    fn the_soft_descriptor_limit_is_raised_to_the_hard_one() {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "ulimit -Sn; ulimit -Hn"]);
        raise_nofile_on_exec(&mut cmd);
        let out = cmd.output().expect("sh");
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<&str> = text.lines().collect();
        assert_eq!(v.len(), 2, "{text}");
        assert_eq!(v[0], v[1], "soft = hard: {text}");
    }

    #[test]
    fn gaps_skip_kept_descriptors_and_the_standard_streams() {
        assert_eq!(gaps(&[]), vec![(3, i32::MAX)]);
        assert_eq!(gaps(&[0, 1, 2]), vec![(3, i32::MAX)]);
        assert_eq!(gaps(&[3]), vec![(4, i32::MAX)]);
        assert_eq!(gaps(&[9, 5, 5]), vec![(3, 4), (6, 8), (10, i32::MAX)]);
        assert_eq!(gaps(&[6, 7]), vec![(3, 5), (8, i32::MAX)]);
        assert_eq!(gaps(&[i32::MAX]), vec![(3, i32::MAX - 1)]);
    }

    #[test]
    fn a_child_started_with_the_hook_inherits_no_descriptor() {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open("/proc/self/status").expect("open");
        let fd = f.as_raw_fd();
        // Clear close-on-exec, as a shell's `7<file` would have it.
        // SAFETY: fcntl on a descriptor this test owns.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        let probe = format!("test -e /proc/self/fd/{fd} && echo open || echo closed");
        let run = |hook: bool| {
            let mut c = std::process::Command::new("/bin/sh");
            c.args(["-c", &probe]);
            if hook {
                close_inherited_on_exec(&mut c);
            }
            String::from_utf8_lossy(&c.output().expect("sh").stdout)
                .trim()
                .to_string()
        };
        assert_eq!(run(false), "open", "the probe must see an inherited fd");
        assert_eq!(run(true), "closed");
    }
}
