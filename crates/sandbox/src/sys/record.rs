//! A [`Sys`] that records every call and makes none: for unit tests of the
//! order of the confinement steps and of every failure path of the init.

use std::cell::RefCell;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::{IdMapFile, LandlockOutcome, Limit, MountFlags, Sys};

/// Records the calls made through it, by name (`"unshare"`,
/// `"mount"`, …) with their arguments, and fails with `EPERM` every call
/// whose name is in [`Record::fail`].
#[derive(Debug)]
pub struct Record {
    /// The effective uid (and gid) the process pretends to have.
    pub euid: u32,
    /// The names of the calls that fail.
    pub fail: Vec<&'static str>,
    /// The calls made so far: `(name, arguments)`.
    pub calls: RefCell<Vec<(&'static str, String)>>,
    /// Ids after a `setresuid`/`setresgid` (what [`Sys::ids`] reports).
    ids: RefCell<(u32, u32, u32)>,
    /// What [`Sys::getppid`] reports.
    pub ppid: i32,
}

impl Record {
    /// A process running as `euid` where every call succeeds.
    pub fn new(euid: u32) -> Self {
        Record {
            euid,
            fail: Vec::new(),
            calls: RefCell::new(Vec::new()),
            ids: RefCell::new((euid, euid, euid)),
            ppid: 1,
        }
    }

    /// The same, where the calls named in `fail` fail.
    pub fn failing(euid: u32, fail: &[&'static str]) -> Self {
        Record {
            fail: fail.to_vec(),
            ..Record::new(euid)
        }
    }

    /// The names of the calls made, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.calls.borrow().iter().map(|(n, _)| *n).collect()
    }

    fn call(&self, name: &'static str, args: String) -> io::Result<()> {
        self.calls.borrow_mut().push((name, args));
        if self.fail.contains(&name) {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        } else {
            Ok(())
        }
    }
}

fn dev_null() -> io::Result<OwnedFd> {
    Ok(OwnedFd::from(std::fs::File::open("/dev/null")?))
}

impl Sys for Record {
    fn geteuid(&self) -> u32 {
        self.euid
    }

    fn getegid(&self) -> u32 {
        self.euid
    }

    fn ids(&self) -> (u32, u32, u32) {
        *self.ids.borrow()
    }

    fn getrlimit(&self, _limit: Limit) -> (Option<u64>, Option<u64>) {
        (None, None)
    }

    fn setrlimit(&self, limit: Limit, soft: Option<u64>, hard: Option<u64>) -> io::Result<()> {
        self.call("setrlimit", format!("{limit:?} {soft:?} {hard:?}"))
    }

    fn unshare(&self, flags: libc::c_int) -> io::Result<()> {
        self.call("unshare", format!("{flags:#x}"))
    }

    fn write_id_map(&self, file: IdMapFile, text: &str) -> io::Result<()> {
        self.call("write_id_map", format!("{} {text}", file.path()))
    }

    fn sethostname(&self, name: &[u8]) -> io::Result<()> {
        self.call("sethostname", String::from_utf8_lossy(name).into_owned())
    }

    fn loopback_up(&self) -> io::Result<()> {
        self.call("loopback_up", String::new())
    }

    fn mount(
        &self,
        src: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MountFlags,
        _data: Option<&str>,
    ) -> io::Result<()> {
        self.call(
            "mount",
            format!("{src:?} {} {fstype:?} {flags:#x}", target.display()),
        )
    }

    fn mount_flags(&self, target: &Path) -> io::Result<MountFlags> {
        self.call("mount_flags", target.display().to_string()).map(|()| 0)
    }

    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()> {
        self.call(
            "pivot_root",
            format!("{} {}", new_root.display(), put_old.display()),
        )
    }

    fn umount_detach(&self, target: &Path) -> io::Result<()> {
        self.call("umount_detach", target.display().to_string())
    }

    fn idmap_userns(&self, owner: (u32, u32), k: u32) -> io::Result<OwnedFd> {
        self.call("idmap_userns", format!("{owner:?} {k}"))?;
        dev_null()
    }

    fn idmapped_bind(&self, _src: BorrowedFd<'_>, _userns: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
        self.call("idmapped_bind", target.display().to_string())
    }

    fn make_dir(&self, p: &Path, mode: u32, recursive: bool) -> io::Result<()> {
        self.call("make_dir", format!("{} {mode:o} {recursive}", p.display()))
    }

    fn make_file(&self, p: &Path) -> io::Result<()> {
        self.call("make_file", p.display().to_string())
    }

    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        self.call("symlink", format!("{} {}", target.display(), link.display()))
    }

    fn remove_dir(&self, p: &Path) -> io::Result<()> {
        self.call("remove_dir", p.display().to_string())
    }

    fn capbset_read(&self, cap: u32) -> io::Result<bool> {
        // Two capabilities, so loops over the set are short.
        if cap >= 2 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.call("capbset_read", cap.to_string())
            .map(|()| self.euid == 0)
    }

    fn capbset_drop(&self, cap: u32) -> io::Result<()> {
        self.call("capbset_drop", cap.to_string())
    }

    fn clear_ambient(&self) -> io::Result<()> {
        self.call("clear_ambient", String::new())
    }

    fn capset_clear(&self) -> io::Result<()> {
        self.call("capset_clear", String::new())
    }

    fn setgroups_empty(&self) -> io::Result<()> {
        self.call("setgroups_empty", String::new())
    }

    fn setresgid(&self, g: u32) -> io::Result<()> {
        self.call("setresgid", g.to_string())?;
        self.ids.borrow_mut().2 = g;
        Ok(())
    }

    fn setresuid(&self, u: u32) -> io::Result<()> {
        self.call("setresuid", u.to_string())?;
        let mut ids = self.ids.borrow_mut();
        ids.0 = u;
        ids.1 = u;
        Ok(())
    }

    fn set_dumpable(&self, dumpable: bool) -> io::Result<()> {
        self.call("set_dumpable", dumpable.to_string())
    }

    fn set_pdeathsig(&self, sig: libc::c_int) -> io::Result<()> {
        self.call("set_pdeathsig", sig.to_string())
    }

    fn set_child_subreaper(&self) -> io::Result<()> {
        self.call("set_child_subreaper", String::new())
    }

    fn set_no_new_privs(&self) -> io::Result<()> {
        self.call("set_no_new_privs", String::new())
    }

    fn landlock_abi(&self) -> i64 {
        6
    }

    fn landlock_restrict(&self, ro: &[PathBuf], rw: &[PathBuf]) -> io::Result<LandlockOutcome> {
        self.call("landlock_restrict", format!("{} ro, {} rw", ro.len(), rw.len()))
            .map(|()| LandlockOutcome::Full)
    }

    fn seccomp_install(&self, program: &seccompiler::BpfProgram) -> io::Result<()> {
        self.call("seccomp_install", program.len().to_string())
    }

    fn join_cgroup(&self, procs: &Path) -> io::Result<()> {
        self.call("join_cgroup", procs.display().to_string())
    }

    fn getppid(&self) -> i32 {
        self.calls.borrow_mut().push(("getppid", String::new()));
        self.ppid
    }

    fn setsid(&self) -> io::Result<()> {
        self.call("setsid", String::new())
    }

    fn setns_path(&self, path: &Path, nstype: libc::c_int) -> io::Result<()> {
        self.call("setns", format!("{} {nstype:#x}", path.display()))
    }
}
