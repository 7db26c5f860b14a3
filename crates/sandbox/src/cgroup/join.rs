//! A host-side child started inside a kernel's groups: it writes `0` to
//! each `cgroup.procs` between `fork` and `exec`, so everything it forks
//! is charged to, and limited by, the kernel's groups from its first page.
//!
//! What a process checkpoint's restore needs: `criu restore` forks the
//! kernel's tree and the restored pages are faulted in by the tree
//! itself, so a `criu` already inside the new generation's groups brings
//! the tree back under its limits (moving the tree afterwards would leave
//! the restored memory charged to the host's group: charges do not move
//! with a task on v2, nor on v1 without `memory.move_charge_at_immigrate`).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// Makes `cmd`'s child join every group of `procs` (`cgroup.procs` files,
/// as [`super::KernelCgroup::procs_files`] gives them) before it execs.
/// The child fails to start, with the error of the first write that
/// failed, when it cannot join one (the limits would not hold).
///
/// # Errors
/// A path holds a NUL byte.
pub fn join_on_exec(cmd: &mut std::process::Command, procs: &[PathBuf]) -> io::Result<()> {
    let paths: Vec<CString> = procs
        .iter()
        .map(|p| CString::new(p.as_os_str().as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: the hook runs in the child between fork and exec and makes
    // only async-signal-safe system calls (open, write, close) on the
    // CStrings built above, which the child's copy of this closure owns;
    // it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for p in &paths {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_that_cannot_be_joined_fails_the_start() {
        let dir = tempfile::tempdir().expect("tmp");
        let missing = dir.path().join("no-such-group/cgroup.procs");
        let mut cmd = std::process::Command::new("true");
        join_on_exec(&mut cmd, &[missing]).expect("hook");
        let e = cmd.status().expect_err("the child must not start");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn a_nul_in_a_path_is_an_error() {
        let mut cmd = std::process::Command::new("true");
        let bad = PathBuf::from(std::ffi::OsStr::from_bytes(b"a\0b"));
        assert!(join_on_exec(&mut cmd, &[bad]).is_err());
    }
}
