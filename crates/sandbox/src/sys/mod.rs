//! The privileged calls of the kernel init, the ns-init and the fork plan,
//! behind one trait (youki's `Syscall` model).
//!
//! * [`Linux`] makes the calls, on rustix's safe wrappers wherever rustix
//!   has them;
//! * [`record::Record`] (tests) records every call and fails the ones it is
//!   told to, so the order of the confinement steps and every failure path
//!   of the init can be checked without privileges.
//!
//! Every call returns [`std::io::Result`]: the layer that made it turns a
//! failure into a missing [`crate::profile::LayerStatus`].

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

mod linux;
pub mod record;

pub use linux::Linux;

/// A per-process resource limit the init lowers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `RLIMIT_CORE` (bytes).
    Core,
    /// `RLIMIT_NOFILE` (descriptors).
    Nofile,
    /// `RLIMIT_FSIZE` (bytes).
    Fsize,
    /// `RLIMIT_AS` (bytes).
    AddressSpace,
}

/// One of the files of `/proc/self` a new user namespace's maps are
/// written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdMapFile {
    /// `/proc/self/setgroups`.
    Setgroups,
    /// `/proc/self/uid_map`.
    UidMap,
    /// `/proc/self/gid_map`.
    GidMap,
}

impl IdMapFile {
    /// The file's path.
    pub fn path(self) -> &'static str {
        match self {
            IdMapFile::Setgroups => "/proc/self/setgroups",
            IdMapFile::UidMap => "/proc/self/uid_map",
            IdMapFile::GidMap => "/proc/self/gid_map",
        }
    }
}

/// The flags of [`Sys::mount`], as `mount(2)`'s `MS_*` bits.
pub type MountFlags = libc::c_ulong;

/// The privileged calls of a kernel's confinement. All of them act on the
/// calling process, which must be single-threaded (a fresh init, or the
/// ns-init).
pub trait Sys {
    /// The effective uid.
    fn geteuid(&self) -> u32;
    /// The effective gid.
    fn getegid(&self) -> u32;
    /// The real, effective uid and effective gid (checked after an id change).
    fn ids(&self) -> (u32, u32, u32);
    /// The `(soft, hard)` limit; `None` is `RLIM_INFINITY`.
    fn getrlimit(&self, limit: Limit) -> (Option<u64>, Option<u64>);
    /// Sets the `(soft, hard)` limit.
    fn setrlimit(&self, limit: Limit, soft: Option<u64>, hard: Option<u64>) -> io::Result<()>;
    /// `unshare(2)` with `CLONE_NEW*` flags (never `CLONE_FILES`).
    fn unshare(&self, flags: libc::c_int) -> io::Result<()>;
    /// Writes one of the id-map files of a new user namespace.
    fn write_id_map(&self, file: IdMapFile, text: &str) -> io::Result<()>;
    /// `sethostname(2)`.
    fn sethostname(&self, name: &[u8]) -> io::Result<()>;
    /// Brings the loopback interface `lo` up (two interface ioctls).
    fn loopback_up(&self) -> io::Result<()>;
    /// `mount(2)`.
    fn mount(
        &self,
        src: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MountFlags,
        data: Option<&str>,
    ) -> io::Result<()>;
    /// The `MS_*` flags of the mount at `target` a bind remount must keep
    /// (`statvfs(3)`'s `ST_*` mapped to `MS_*`).
    fn mount_flags(&self, target: &Path) -> io::Result<MountFlags>;
    /// `pivot_root(new_root, put_old)`, then `chdir("/")`.
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()>;
    /// `umount2(target, MNT_DETACH)`.
    fn umount_detach(&self, target: &Path) -> io::Result<()>;
    /// A user namespace mapping the host owner `(uid, gid)` to `k`, as a
    /// descriptor for an idmapped mount (a helper child enters it).
    fn idmap_userns(&self, owner: (u32, u32), k: u32) -> io::Result<OwnedFd>;
    /// `open_tree(OPEN_TREE_CLONE)` of `src`, `mount_setattr` with
    /// `MOUNT_ATTR_IDMAP` (by `userns`), `nosuid` and `nodev`, and
    /// `move_mount` onto `target`.
    fn idmapped_bind(&self, src: BorrowedFd<'_>, userns: BorrowedFd<'_>, target: &Path) -> io::Result<()>;
    /// Creates the directory `p` and its parents (mode 0755), or the
    /// directory `p` alone with `mode` when `recursive` is false.
    fn make_dir(&self, p: &Path, mode: u32, recursive: bool) -> io::Result<()>;
    /// Creates the empty file `p` (mode 0644) unless it exists.
    fn make_file(&self, p: &Path) -> io::Result<()>;
    /// Creates the symlink `link` → `target`.
    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()>;
    /// Removes the empty directory `p`.
    fn remove_dir(&self, p: &Path) -> io::Result<()>;
    /// `PR_CAPBSET_READ`: `Ok(held)`, or an error once `cap` is past the
    /// last capability the running kernel knows.
    fn capbset_read(&self, cap: u32) -> io::Result<bool>;
    /// `PR_CAPBSET_DROP`.
    fn capbset_drop(&self, cap: u32) -> io::Result<()>;
    /// `PR_CAP_AMBIENT_CLEAR_ALL`.
    fn clear_ambient(&self) -> io::Result<()>;
    /// `capset(2)` with empty effective, permitted and inheritable sets.
    fn capset_clear(&self) -> io::Result<()>;
    /// `setgroups(0, NULL)`.
    fn setgroups_empty(&self) -> io::Result<()>;
    /// `setresgid(g, g, g)`.
    fn setresgid(&self, g: u32) -> io::Result<()>;
    /// `setresuid(u, u, u)`.
    fn setresuid(&self, u: u32) -> io::Result<()>;
    /// `PR_SET_DUMPABLE`.
    fn set_dumpable(&self, dumpable: bool) -> io::Result<()>;
    /// `PR_SET_PDEATHSIG` with the signal number `sig`.
    fn set_pdeathsig(&self, sig: libc::c_int) -> io::Result<()>;
    /// `PR_SET_CHILD_SUBREAPER`.
    fn set_child_subreaper(&self) -> io::Result<()>;
    /// `PR_SET_NO_NEW_PRIVS`.
    fn set_no_new_privs(&self) -> io::Result<()>;
    /// The Landlock ABI of the running kernel (0: none).
    fn landlock_abi(&self) -> i64;
    /// Restricts this process with a Landlock ruleset: `ro` paths
    /// read-only, `rw` paths read-write (no device nodes).
    fn landlock_restrict(
        &self,
        ro: &[std::path::PathBuf],
        rw: &[std::path::PathBuf],
    ) -> io::Result<LandlockOutcome>;
    /// Installs one seccomp program.
    fn seccomp_install(&self, program: &seccompiler::BpfProgram) -> io::Result<()>;
    /// Joins a control group by writing `0` to its `cgroup.procs`.
    fn join_cgroup(&self, procs: &Path) -> io::Result<()>;
    /// The parent's pid (0 when the parent is outside this pid namespace).
    fn getppid(&self) -> i32;
    /// `setsid`: a new session and process group led by this process.
    fn setsid(&self) -> io::Result<()>;
    /// `setns` into the namespace file `path` (`/proc/<pid>/ns/<kind>`) of
    /// type `nstype` (`CLONE_NEWUSER`, `CLONE_NEWNS`).
    fn setns_path(&self, path: &Path, nstype: libc::c_int) -> io::Result<()>;
}

/// How far a Landlock ruleset took hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockOutcome {
    /// Every handled right and scope is enforced.
    Full,
    /// The running kernel lacks some rights or scopes.
    Partial,
    /// The running kernel has no Landlock.
    None,
}
