//! The kernel's file-system view: a fresh root holding only what the
//! kernel may see (bubblewrap's design), and the kernel's own uid.
//!
//! Pid 1 of a kernel's namespaces (the ns-init, in its own mount
//! namespace) calls [`build_root`]:
//!
//! 1. `/` becomes a private mount tree; every allowed path is opened
//!    (`O_PATH`) while the host's root is still the root, so symlinks
//!    resolve as the host resolves them;
//! 2. a tmpfs is mounted on `/tmp` and `pivot_root` makes it the root; the
//!    host's root hangs below it at [`OLD_ROOT`] for the next steps only;
//! 3. the kernel's own `/proc`, a `/dev` holding only the device nodes of
//!    [`DEVICES_RW`] (bound from the host) and a private `/dev/shm`, and a
//!    private `/tmp`;
//! 4. the allowed paths, shallow ones first, each bound at its host path:
//!    [`SYSTEM_RO`] and the spec's read-only paths read-only, the
//!    workdir, the session directory and the extra read-write paths
//!    read-write — idmapped to the kernel's uid when the host runs as root
//!    ([`crate::profile::KERNEL_ID_BASE`]); a top-level symlink (`/lib` →
//!    `usr/lib`) is recreated as a symlink;
//! 5. the spec's hidden paths (the host's control plane: the daemon's run
//!    directory, the state directory, `$XDG_RUNTIME_DIR`) that lie inside
//!    an allowed path are covered — an empty read-only directory, or
//!    `/dev/null` for a file — with the allowed paths deeper than them
//!    (the kernel's own session directory) bound back on top;
//! 6. the secret files of [`MASKED_FILES`] are covered with `/dev/null`;
//! 7. the old root is detached and the new root made read-only.
//!
//! A path that is not allowed does not exist in the kernel's view: the
//! host's home, `/run`, `/var/run`, every other socket. Every directory
//! above a bound path is a directory of the new root (mode 0755), so the
//! kernel can reach a workdir under `/root` without reading `/root`.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use crate::profile::{DEVICES_RW, InitSpec, LayerStatus, MASKED_FILES, SYSTEM_RO};
use crate::sys::Sys;

/// Where the host's root hangs below the new root while the new root is
/// built (it is detached before the worker starts).
pub const OLD_ROOT: &str = "/.cellhost-oldroot";

/// Paths never bound from the host even when a spec names them: the
/// kernel gets its own (`/tmp`, `/dev`, `/proc`) or none (`/run`).
const NEVER_BOUND: &[&str] = &["/", "/tmp", "/dev", "/proc", "/sys", "/run", "/var/run"];

/// What [`build_root`] did.
#[derive(Debug)]
pub struct RootOutcome {
    /// The `mountns` layer (private `/tmp`, `/dev/shm`, masks, `/proc`).
    pub mountns: LayerStatus,
    /// The `rootfs` layer (the fresh root and its bound paths).
    pub rootfs: LayerStatus,
    /// Read-write paths that could not be idmapped to the kernel's uid
    /// (path and reason): the kernel cannot write them.
    pub idmap_failures: Vec<String>,
    /// The new root is in place (the private `/tmp` exists).
    pub private_tmp: bool,
}

fn tmpfs(sys: &dyn Sys, target: &Path, flags: libc::c_ulong, data: &str) -> io::Result<()> {
    sys.mount(Some(Path::new("tmpfs")), target, Some("tmpfs"), flags, Some(data))
}

/// Remounts the bind at `target` read-only (or not) with `nosuid` and
/// `nodev`, keeping the flags a user namespace may not clear.
fn remount(sys: &dyn Sys, target: &Path, read_only: bool, nodev: bool) -> io::Result<()> {
    let mut flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | sys.mount_flags(target)?;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    if nodev {
        flags |= libc::MS_NODEV;
    }
    sys.mount(None, target, None, flags, None)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    ReadOnly,
    ReadWrite,
    Device,
    Hidden,
}

/// One path of the new root, resolved in the host's root.
struct Entry {
    path: PathBuf,
    kind: Kind,
    /// `O_PATH` handle on the host's file (none for a symlink).
    fd: Option<OwnedFd>,
    /// The host path is a symlink with this target.
    link: Option<PathBuf>,
    is_dir: bool,
    owner: (u32, u32),
}

fn depth(p: &Path) -> usize {
    p.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count()
}

fn resolve(path: &Path, kind: Kind) -> Option<Entry> {
    let meta = fs::symlink_metadata(path).ok()?;
    if meta.file_type().is_symlink() && kind != Kind::Hidden && depth(path) == 1 {
        return Some(Entry {
            path: path.to_path_buf(),
            kind,
            fd: None,
            link: fs::read_link(path).ok(),
            is_dir: false,
            owner: (meta.uid(), meta.gid()),
        });
    }
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    Some(Entry {
        path: path.to_path_buf(),
        kind,
        fd: Some(OwnedFd::from(file)),
        link: None,
        is_dir: meta.is_dir(),
        owner: (meta.uid(), meta.gid()),
    })
}

/// The paths of the new root, in the order they are mounted: shallow
/// first, and at one depth the bound paths before the covered ones.
fn entries(spec: &InitSpec, notes: &mut Vec<String>) -> Vec<Entry> {
    let mut wanted: Vec<(PathBuf, Kind)> = Vec::new();
    wanted.extend(
        SYSTEM_RO
            .iter()
            .filter(|p| **p != "/proc")
            .map(|p| (PathBuf::from(p), Kind::ReadOnly)),
    );
    wanted.extend(spec.ro.iter().map(|p| (p.clone(), Kind::ReadOnly)));
    wanted.extend(spec.rw.iter().map(|p| (p.clone(), Kind::ReadWrite)));
    wanted.extend(spec.workdir.iter().map(|p| (p.clone(), Kind::ReadWrite)));
    wanted.extend(
        DEVICES_RW
            .iter()
            .filter(|p| **p != "/dev/shm")
            .map(|p| (PathBuf::from(p), Kind::Device)),
    );
    wanted.extend(spec.hidden.iter().map(|p| (p.clone(), Kind::Hidden)));
    let mut out: Vec<Entry> = Vec::new();
    for (p, kind) in wanted {
        if !p.is_absolute() {
            continue;
        }
        if kind != Kind::Device && kind != Kind::Hidden && NEVER_BOUND.iter().any(|n| Path::new(n) == p) {
            notes.push(format!("{} not bound (the kernel has its own)", p.display()));
            continue;
        }
        if out.iter().any(|e| e.path == p && e.kind == kind) {
            continue;
        }
        if let Some(e) = resolve(&p, kind) {
            out.push(e);
        }
    }
    out.sort_by_key(|e| (depth(&e.path), e.kind == Kind::Hidden));
    out
}

fn make_dirs(sys: &dyn Sys, p: &Path) -> io::Result<()> {
    sys.make_dir(p, 0o755, true)
}

/// Creates the mount point `p` (a directory, or an empty file) in the new
/// root, or in a covering tmpfs; never inside a bound host directory.
fn mount_point(
    sys: &dyn Sys,
    p: &Path,
    is_dir: bool,
    bound: &[PathBuf],
    covered: &[PathBuf],
) -> io::Result<()> {
    if fs::symlink_metadata(p).is_ok() {
        return Ok(());
    }
    let deepest = |list: &[PathBuf]| list.iter().filter(|b| p.starts_with(b)).map(|b| depth(b)).max();
    if let Some(host) = deepest(bound)
        && deepest(covered).is_none_or(|c| c < host)
    {
        return Err(io::Error::other("missing inside a bound host directory"));
    }
    if is_dir {
        make_dirs(sys, p)
    } else {
        if let Some(parent) = p.parent() {
            make_dirs(sys, parent)?;
        }
        sys.make_file(p)
    }
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Builds the kernel's root (see the module docs). `kernel_id` is the uid
/// the kernel will run as when it is not the host's (root host): the
/// read-write paths are idmapped to it.
pub fn build_root(sys: &dyn Sys, spec: &InitSpec, kernel_id: Option<u32>) -> RootOutcome {
    let mut notes = Vec::new();
    let fail = |what: String| RootOutcome {
        mountns: LayerStatus::missing("mountns", what.clone()),
        rootfs: LayerStatus::missing("rootfs", what),
        idmap_failures: Vec::new(),
        private_tmp: false,
    };
    if let Err(e) = sys.mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE, None) {
        return fail(format!("cannot make / private: {e}"));
    }
    let list = entries(spec, &mut notes);
    // The kernel's own cgroups, opened while the host's root is the root.
    let views: Vec<(PathBuf, Option<OwnedFd>)> = spec
        .cgroup_views
        .iter()
        .filter(|v| v.view.starts_with("/sys/fs/cgroup"))
        .map(|v| {
            (
                v.view.clone(),
                resolve(&v.host, Kind::ReadOnly).and_then(|e| e.fd),
            )
        })
        .collect();
    if let Err(e) = enter_new_root(sys) {
        return fail(format!("cannot build a fresh root: {e}"));
    }
    let mut mountns = Vec::new();
    if let Err(e) = base_mounts(sys, &mut mountns) {
        return fail(e);
    }
    let mut bound: Vec<PathBuf> = Vec::new();
    let mut bound_kinds: Vec<(PathBuf, Kind, (u32, u32))> = Vec::new();
    let mut covered = Vec::new();
    let mut idmap_failures = Vec::new();
    let mut userns: Vec<((u32, u32), OwnedFd)> = Vec::new();
    let (mut n_ro, mut n_rw) = (0, 0);
    for e in &list {
        if let Some(target) = &e.link {
            if fs::symlink_metadata(&e.path).is_err()
                && let Err(err) = sys.symlink(target, &e.path)
            {
                return fail(format!("cannot recreate the symlink {}: {err}", e.path.display()));
            }
            continue;
        }
        let Some(fd) = &e.fd else { continue };
        // A path inside one already bound the same way adds nothing.
        if e.kind != Kind::Hidden
            && bound_kinds.iter().any(|(b, k, o)| {
                e.path.starts_with(b) && *k == e.kind && (*k != Kind::ReadWrite || *o == e.owner)
            })
        {
            continue;
        }
        if e.kind == Kind::Hidden {
            if !bound.iter().any(|b| e.path.starts_with(b))
                || covered.iter().any(|c| e.path.starts_with(c))
                || fs::symlink_metadata(&e.path).is_err()
            {
                continue; // not inside the kernel's view anyway
            }
            let done = if e.is_dir {
                tmpfs(
                    sys,
                    &e.path,
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    "mode=0755,size=16k",
                )
            } else {
                sys.mount(Some(Path::new("/dev/null")), &e.path, None, libc::MS_BIND, None)
            };
            if let Err(err) = done {
                return fail(format!("cannot cover {}: {err}", e.path.display()));
            }
            if e.is_dir {
                covered.push(e.path.clone());
            }
            notes.push(format!("{} covered", e.path.display()));
            continue;
        }
        if let Err(err) = mount_point(sys, &e.path, e.is_dir, &bound, &covered) {
            notes.push(format!("{} not bound: {err}", e.path.display()));
            continue;
        }
        let src = fd_path(fd);
        let res = match (e.kind, kernel_id) {
            (Kind::ReadWrite, Some(k)) => {
                let ns = match userns.iter().find(|(o, _)| *o == e.owner) {
                    Some((_, fd)) => Ok(fd),
                    None => sys.idmap_userns(e.owner, k).map(|fd| {
                        userns.push((e.owner, fd));
                        &userns[userns.len() - 1].1
                    }),
                };
                match ns.and_then(|ns| sys.idmapped_bind(fd.as_fd(), ns.as_fd(), &e.path)) {
                    Ok(()) => Ok(()),
                    Err(err) => {
                        idmap_failures.push(format!("{}: {err}", e.path.display()));
                        sys.mount(Some(&src), &e.path, None, libc::MS_BIND | libc::MS_REC, None)
                            .and_then(|_| remount(sys, &e.path, false, true))
                    }
                }
            }
            (Kind::Device, _) => sys.mount(Some(&src), &e.path, None, libc::MS_BIND, None),
            (kind, _) => sys
                .mount(Some(&src), &e.path, None, libc::MS_BIND | libc::MS_REC, None)
                .and_then(|_| remount(sys, &e.path, kind == Kind::ReadOnly, true)),
        };
        if let Err(err) = res {
            return fail(format!("cannot bind {}: {err}", e.path.display()));
        }
        match e.kind {
            Kind::ReadOnly => n_ro += 1,
            Kind::ReadWrite => n_rw += 1,
            _ => {}
        }
        if e.is_dir {
            bound.push(e.path.clone());
        }
        bound_kinds.push((e.path.clone(), e.kind, e.owner));
    }
    drop(list);
    drop(userns);
    let mut own_cgroups = Vec::new();
    for (view, fd) in &views {
        let Some(fd) = fd else {
            notes.push(format!(
                "own cgroup at {} not bound: cannot open it",
                view.display()
            ));
            continue;
        };
        let res = mount_point(sys, view, true, &bound, &covered)
            .and_then(|()| sys.mount(Some(&fd_path(fd)), view, None, libc::MS_BIND, None))
            .and_then(|()| remount(sys, view, true, true));
        match res {
            Ok(()) => own_cgroups.push(view.display().to_string()),
            Err(err) => {
                return fail(format!(
                    "cannot bind the kernel's cgroup at {}: {err}",
                    view.display()
                ));
            }
        }
    }
    if !own_cgroups.is_empty() {
        mountns.push(format!("own cgroups read-only at {}", own_cgroups.join(", ")));
    }
    drop(views);
    let mut masked = 0;
    for f in MASKED_FILES {
        let p = Path::new(f);
        if p.exists() {
            if let Err(e) = sys.mount(Some(Path::new("/dev/null")), p, None, libc::MS_BIND, None) {
                return fail(format!("cannot mask {f}: {e}"));
            }
            masked += 1;
        }
    }
    mountns.push(format!("{masked} secret files under /etc masked"));
    for c in &covered {
        if let Err(e) = remount(sys, c, true, true) {
            return fail(format!("cannot seal {}: {e}", c.display()));
        }
    }
    if let Err(e) = leave_old_root(sys) {
        return fail(format!("cannot detach the host's root: {e}"));
    }
    let mut detail = format!(
        "fresh root: {n_ro} read-only and {n_rw} read-write host paths bound, nothing else of the host (old root detached)"
    );
    if kernel_id.is_some() && n_rw > 0 {
        detail.push_str(", read-write paths idmapped to the kernel's uid");
    }
    if !notes.is_empty() {
        detail.push_str("; ");
        detail.push_str(&notes.join("; "));
    }
    RootOutcome {
        mountns: LayerStatus::on("mountns", mountns.join(", ")),
        rootfs: LayerStatus::on("rootfs", detail),
        idmap_failures,
        private_tmp: true,
    }
}

/// A tmpfs on `/tmp` becomes the root; the host's root hangs at
/// [`OLD_ROOT`].
fn enter_new_root(sys: &dyn Sys) -> io::Result<()> {
    let base = Path::new("/tmp");
    tmpfs(sys, base, libc::MS_NOSUID | libc::MS_NODEV, "mode=0755,size=1m")?;
    let old = base.join(OLD_ROOT.trim_start_matches('/'));
    sys.make_dir(&old, 0o700, false)?;
    sys.pivot_root(base, &old)
}

/// `/proc`, `/dev` (with `/dev/shm` and the usual symlinks) and `/tmp`.
fn base_mounts(sys: &dyn Sys, notes: &mut Vec<String>) -> Result<(), String> {
    let proc_ = Path::new("/proc");
    make_dirs(sys, proc_).map_err(|e| format!("cannot create /proc: {e}"))?;
    sys.mount(
        Some(Path::new("proc")),
        proc_,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(|e| format!("cannot mount the kernel's own /proc: {e}"))?;
    let dev = Path::new("/dev");
    make_dirs(sys, dev).map_err(|e| format!("cannot create /dev: {e}"))?;
    tmpfs(sys, dev, libc::MS_NOSUID | libc::MS_NOEXEC, "mode=0755,size=64k")
        .map_err(|e| format!("cannot mount /dev: {e}"))?;
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let _ = sys.symlink(Path::new(target), &dev.join(name));
    }
    let shm = Path::new("/dev/shm");
    make_dirs(sys, shm).map_err(|e| format!("cannot create /dev/shm: {e}"))?;
    tmpfs(sys, shm, libc::MS_NOSUID | libc::MS_NODEV, "mode=1777")
        .map_err(|e| format!("cannot mount a private /dev/shm: {e}"))?;
    let tmp = Path::new("/tmp");
    make_dirs(sys, tmp).map_err(|e| format!("cannot create /tmp: {e}"))?;
    tmpfs(sys, tmp, libc::MS_NOSUID | libc::MS_NODEV, "mode=1777")
        .map_err(|e| format!("cannot mount a private /tmp: {e}"))?;
    notes.push("private /tmp (tmpfs)".into());
    notes.push("private /dev/shm".into());
    notes.push("own /proc".into());
    Ok(())
}

/// Detaches the host's root and makes the new root read-only.
fn leave_old_root(sys: &dyn Sys) -> io::Result<()> {
    sys.umount_detach(Path::new(OLD_ROOT))?;
    sys.remove_dir(Path::new(OLD_ROOT))?;
    remount(sys, Path::new("/"), true, true)
}

/// Takes the kernel's uid: as root, `setgroups([])`, `setresgid(k)` and
/// `setresuid(k)` (which also clears the effective and permitted
/// capabilities: the bounding set must be cleared before); as another user
/// nothing changes (the user namespace maps the host uid to itself).
/// `idmap_failures` (from [`build_root`]) make the layer missing: the
/// kernel could not write those paths.
pub fn take_kernel_id(
    sys: &dyn Sys,
    kernel_id: Option<u32>,
    disabled: bool,
    idmap_failures: &[String],
) -> LayerStatus {
    let euid = sys.geteuid();
    if euid != 0 {
        return LayerStatus::on("uid", format!("runs as host uid {euid}, not root"));
    }
    if disabled {
        return LayerStatus::missing("uid", "disabled by the sandbox profile: the kernel runs as root");
    }
    let Some(k) = kernel_id else {
        return LayerStatus::missing("uid", "no kernel uid was chosen: the kernel runs as root");
    };
    if let Err(e) = become_id(sys, k) {
        return LayerStatus::missing("uid", format!("cannot take uid {k}: {e}"));
    }
    if !idmap_failures.is_empty() {
        return LayerStatus::missing(
            "uid",
            format!(
                "runs as uid {k}, but cannot write {} (no idmapped mount)",
                idmap_failures.join("; ")
            ),
        );
    }
    LayerStatus::on(
        "uid",
        format!(
            "runs as uid {k} and gid {k} (one per kernel, no host account, not root), \
             no supplementary groups; read-write paths idmapped to it"
        ),
    )
}

/// `setgroups([])`, `setresgid(k, k, k)`, `setresuid(k, k, k)`, then
/// marks the process not dumpable (its `/proc` files stay root's).
pub fn become_id(sys: &dyn Sys, k: u32) -> io::Result<()> {
    sys.setgroups_empty()?;
    sys.setresgid(k)?;
    sys.setresuid(k)?;
    if sys.ids() != (k, k, k) {
        return Err(io::Error::other("the ids did not change"));
    }
    let _ = sys.set_dumpable(false);
    Ok(())
}

/// Gives `path` and everything below it to the kernel's id (the font
/// cache copy in the private `/tmp`, made by root).
pub fn give_to(path: &Path, k: u32) {
    let _ = std::os::unix::fs::lchown(path, Some(k), Some(k));
    if let Ok(rd) = fs::read_dir(path) {
        for e in rd.flatten() {
            give_to(&e.path(), k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Rlimits, SandboxMode};

    fn spec() -> InitSpec {
        InitSpec {
            mode: SandboxMode::Auto,
            network: false,
            ro: vec!["/usr/lib".into(), "/tmp".into()],
            rw: vec!["/proc".into()],
            workdir: None,
            rlimits: Rlimits::default(),
            disable: Vec::new(),
            mpl_cache: None,
            hidden: vec!["/usr".into()],
            cgroup_views: Vec::new(),
            egress_port: None,
            workdir_disk: None,
        }
    }

    #[test]
    fn entries_are_shallow_first_and_never_bind_the_kernels_own_dirs() {
        let mut notes = Vec::new();
        let list = entries(&spec(), &mut notes);
        assert!(
            list.iter()
                .all(|e| e.path != Path::new("/tmp") && e.path != Path::new("/proc"))
        );
        assert!(notes.iter().any(|n| n.starts_with("/tmp")), "{notes:?}");
        let depths: Vec<usize> = list.iter().map(|e| depth(&e.path)).collect();
        assert!(depths.windows(2).all(|w| w[0] <= w[1]), "{depths:?}");
        // At one depth the covered path comes after the bound one.
        let usr: Vec<Kind> = list
            .iter()
            .filter(|e| e.path == Path::new("/usr"))
            .map(|e| e.kind)
            .collect();
        assert_eq!(usr, [Kind::ReadOnly, Kind::Hidden]);
    }

    #[test]
    fn kernel_ids_stay_in_their_range() {
        use crate::profile::{KERNEL_ID_BASE, kernel_id};
        assert_eq!(kernel_id(0), KERNEL_ID_BASE);
        assert!(kernel_id(u32::MAX) < 0x8000_0000);
        assert_ne!(kernel_id(100), kernel_id(101));
    }
}
