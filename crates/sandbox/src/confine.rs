//! The confinement layers, applied by the kernel init (a fresh,
//! single-threaded process). The one order, for a cold kernel (the
//! launcher) and a forked one (the template's processes, `confine.py`):
//!
//! 1. rlimits;
//! 2. namespaces (user namespace first when not root; pid, net, ipc, uts,
//!    mount, cgroup);
//! 3. mounts: the fresh root ([`crate::rootfs`]), idmapped read-write
//!    paths, covered control plane, masks, own `/proc`;
//! 4. the capability bounding set cleared (needs `CAP_SETPCAP`, so before
//!    the uid changes);
//! 5. uid: `setgroups([])`, `setresgid`, `setresuid` to the kernel's uid
//!    when the host is root ([`crate::rootfs::take_kernel_id`]);
//! 6. Landlock;
//! 7. capabilities: ambient, effective, permitted, inheritable cleared;
//! 8. seccomp (last: it forbids the calls of the earlier steps).
//!
//! Each step returns what it did as a [`LayerStatus`]; nothing here runs
//! in the multi-threaded host.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::profile::{DEVICES_RW, InitSpec, LayerStatus, PRIVATE_MPL_DIR, Rlimits, SYSTEM_RO};
use crate::sys::{IdMapFile, LandlockOutcome, Limit, Linux, Sys};

/// Lowers the per-process limits (never raises a hard limit).
pub fn apply_rlimits(sys: &dyn Sys, r: &Rlimits) -> LayerStatus {
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for (name, res, want) in [
        ("core", Limit::Core, r.core),
        ("nofile", Limit::Nofile, r.nofile),
        ("fsize", Limit::Fsize, r.fsize),
        ("as", Limit::AddressSpace, r.address_space),
    ] {
        let Some(want) = want else { continue };
        let (_, max) = sys.getrlimit(res);
        let v = max.map_or(want, |m| want.min(m));
        match sys.setrlimit(res, Some(v), Some(v)) {
            Ok(()) => done.push(format!("{name}={want}")),
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    if failed.is_empty() {
        LayerStatus::on("rlimits", done.join(" "))
    } else {
        LayerStatus::missing("rlimits", format!("failed: {}", failed.join("; ")))
    }
}

/// The namespaces a profile asks for, as `(layer, clone flag, detail)`, and
/// the layers it leaves out (network on, or disabled by the profile).
pub(crate) fn wanted_namespaces(
    network: bool,
    disable: &[String],
) -> (Vec<(&'static str, libc::c_int, &'static str)>, Vec<LayerStatus>) {
    let mut layers = Vec::new();
    let mut wanted = vec![
        (
            "pidns",
            libc::CLONE_NEWPID,
            "own pid namespace: host processes are invisible",
        ),
        ("ipcns", libc::CLONE_NEWIPC, "own System V IPC and POSIX queues"),
        ("utsns", libc::CLONE_NEWUTS, "own hostname"),
        ("mountns", libc::CLONE_NEWNS, "own mount table"),
        (
            "cgroupns",
            libc::CLONE_NEWCGROUP,
            "own cgroup root: other kernels' groups are not visible",
        ),
    ];
    if network {
        layers.push(LayerStatus::skipped("netns", "network is on by the profile"));
    } else {
        wanted.insert(
            1,
            ("netns", libc::CLONE_NEWNET, "no network: only a private loopback"),
        );
    }
    let off: Vec<_> = wanted
        .iter()
        .filter(|w| disable.iter().any(|d| d == w.0))
        .map(|w| w.0)
        .collect();
    for name in &off {
        layers.push(LayerStatus::missing(name, "disabled by the sandbox profile"));
    }
    wanted.retain(|w| !off.contains(&w.0));
    (wanted, layers)
}

/// Unshares the namespaces (user only when not root). The caller must fork
/// afterwards: the next child is pid 1 of the new pid namespace.
pub fn unshare_namespaces(sys: &dyn Sys, network: bool, disable: &[String]) -> Vec<LayerStatus> {
    let mut layers = Vec::new();
    let (uid, gid) = (sys.geteuid(), sys.getegid());
    if uid == 0 {
        layers.push(LayerStatus::skipped(
            "userns",
            "not needed: the init runs as root and creates the other namespaces itself; \
             root's capabilities are dropped before Python starts",
        ));
    } else {
        match sys.unshare(libc::CLONE_NEWUSER) {
            Ok(()) => {
                let maps = sys
                    .write_id_map(IdMapFile::Setgroups, "deny")
                    .and_then(|()| sys.write_id_map(IdMapFile::UidMap, &format!("{uid} {uid} 1")))
                    .and_then(|()| sys.write_id_map(IdMapFile::GidMap, &format!("{gid} {gid} 1")));
                match maps {
                    Ok(()) => layers.push(LayerStatus::on("userns", format!("uid {uid} mapped to itself"))),
                    Err(e) => layers.push(LayerStatus::missing(
                        "userns",
                        format!("cannot write id maps: {e}"),
                    )),
                }
            }
            Err(e) => layers.push(LayerStatus::missing(
                "userns",
                format!("unshare(CLONE_NEWUSER): {e} (unprivileged user namespaces disabled?)"),
            )),
        }
    }
    let (wanted, skipped) = wanted_namespaces(network, disable);
    layers.extend(skipped);
    let all = wanted.iter().fold(0, |a, w| a | w.1);
    let together = sys.unshare(all).is_ok();
    for (name, flag, what) in wanted {
        match if together { Ok(()) } else { sys.unshare(flag) } {
            Ok(()) => layers.push(LayerStatus::on(
                name,
                format!("{what}{}", settle_namespace(sys, flag)),
            )),
            Err(e) => layers.push(LayerStatus::missing(name, format!("unshare: {e}"))),
        }
    }
    layers
}

/// Finishes a namespace just entered: names the host `cellhost` in a new
/// UTS namespace, brings the loopback up in a new network namespace.
/// Returns what to add to the layer's detail (`" (up)"` or `" (down)"` for
/// the network, else nothing).
pub fn settle_namespace(sys: &dyn Sys, flag: libc::c_int) -> &'static str {
    if flag == libc::CLONE_NEWNET {
        return if sys.loopback_up().is_ok() {
            " (up)"
        } else {
            " (down)"
        };
    }
    if flag == libc::CLONE_NEWUTS {
        let _ = sys.sethostname(b"cellhost");
    }
    ""
}

/// The directories the worker may write, the workdir included.
fn rw_paths(spec: &InitSpec) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = spec.rw.clone();
    v.extend(spec.workdir.clone());
    v
}

/// In the new mount namespace (called by pid 1 of the new pid namespace):
/// the kernel's fresh root ([`crate::rootfs::build_root`]): only the
/// allowed paths, the kernel's own `/proc`, `/dev`, `/tmp` and
/// `/dev/shm`, the host's control plane covered, the secret files under
/// `/etc` masked. `kernel_id`: the uid the read-write paths are idmapped
/// to (root host).
pub fn setup_mounts(sys: &dyn Sys, spec: &InitSpec, kernel_id: Option<u32>) -> crate::rootfs::RootOutcome {
    crate::rootfs::build_root(sys, spec, kernel_id)
}

/// The `MPLCONFIGDIR` of the worker, pointing at the host-built font
/// cache: a copy of its `fontlist-*.json` in the private `/tmp` when there
/// is one (matplotlib falls back to a fresh cache, and a font scan, when
/// `MPLCONFIGDIR` is not writable), given to the kernel's uid `kernel_id`
/// when there is one; else the cache itself, read-only. `None` without a
/// cache.
pub fn share_mpl_cache(spec: &InitSpec, private_tmp: bool, kernel_id: Option<u32>) -> Option<PathBuf> {
    let cache = spec.mpl_cache.as_ref()?;
    if private_tmp {
        let private = Path::new(PRIVATE_MPL_DIR);
        if fs::create_dir_all(private).is_ok() {
            for e in fs::read_dir(cache).into_iter().flatten().flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("fontlist") {
                    let _ = fs::copy(e.path(), private.join(&name));
                }
            }
            if let Some(k) = kernel_id {
                crate::rootfs::give_to(private, k);
            }
            return Some(private.to_path_buf());
        }
    }
    Some(cache.clone())
}

/// The Landlock ABI of the running kernel (0: none).
pub fn landlock_abi() -> i64 {
    Linux.landlock_abi()
}

/// The cgroup files joblib/loky, the JVM and Go read for their CPU and
/// memory quota, v2 then v1.
const QUOTA_FILES: &[&str] = &[
    "/sys/fs/cgroup/cpu.max",
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
    "/sys/fs/cgroup/cpu/cpu.cfs_period_us",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
];

/// The read-only and the read-write paths of the Landlock ruleset.
pub(crate) fn landlock_paths(spec: &InitSpec) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut ro: Vec<PathBuf> = SYSTEM_RO.iter().map(PathBuf::from).collect();
    ro.extend(spec.ro.iter().cloned());
    ro.extend(spec.cgroup_views.iter().map(|v| v.view.clone()));
    if spec.cgroup_views.is_empty() {
        // No groups of its own (and, without a mount namespace, the host's
        // /sys in view): the quota files libraries read exist only at the
        // top of each hierarchy, the machine's own; readable, so joblib and
        // the JVM fall back to the CPU count instead of failing.
        ro.extend(QUOTA_FILES.iter().map(PathBuf::from));
    }
    let mut rw: Vec<PathBuf> = DEVICES_RW.iter().map(PathBuf::from).collect();
    rw.push("/tmp".into());
    rw.extend(rw_paths(spec));
    (ro, rw)
}

/// Restricts the file system: read-only system and interpreter directories,
/// read-write session directory, workdir and private tmp; no access to
/// anything else (the host user's home, the journal, other sessions).
pub fn apply_landlock(sys: &dyn Sys, spec: &InitSpec) -> LayerStatus {
    let (ro, rw) = landlock_paths(spec);
    let result = sys.landlock_restrict(&ro, &rw);
    let version = sys.landlock_abi();
    match result {
        Ok(LandlockOutcome::Full) => LayerStatus::on(
            "landlock",
            format!(
                "ABI {version}: read-only {} paths, read-write {} paths, signals and abstract sockets scoped",
                ro.len(),
                rw.len()
            ),
        ),
        Ok(LandlockOutcome::Partial) => LayerStatus::on(
            "landlock",
            format!("ABI {version} (partial: this kernel lacks some access rights or scopes)"),
        ),
        Ok(LandlockOutcome::None) => LayerStatus::missing(
            "landlock",
            "the running kernel does not support Landlock (or it is not enabled at boot: lsm=landlock)",
        ),
        Err(e) => LayerStatus::missing("landlock", format!("ruleset failed: {e}")),
    }
}

/// Clears the capability bounding set, as far as this process may
/// (`CAP_SETPCAP`): before the uid changes.
pub fn drop_bounding_set(sys: &dyn Sys) {
    let mut cap = 0;
    while sys.capbset_read(cap).is_ok() {
        let _ = sys.capbset_drop(cap);
        cap += 1;
    }
}

/// Drops every capability (bounding, ambient, effective, permitted,
/// inheritable), so a root worker is root in name only. A bounding set
/// already cleared ([`drop_bounding_set`]) is checked, not dropped again.
pub fn drop_capabilities(sys: &dyn Sys) -> LayerStatus {
    let _ = sys.clear_ambient();
    let mut cap = 0;
    let first_err;
    loop {
        match sys.capbset_read(cap) {
            Err(e) => {
                first_err = e;
                break;
            }
            Ok(held) => {
                if held && let Err(e) = sys.capbset_drop(cap) {
                    return LayerStatus::missing("capabilities", format!("PR_CAPBSET_DROP({cap}): {e}"));
                }
            }
        }
        cap += 1;
    }
    if cap == 0 {
        return LayerStatus::missing("capabilities", format!("PR_CAPBSET_READ: {first_err}"));
    }
    if let Err(e) = sys.capset_clear() {
        return LayerStatus::missing("capabilities", format!("capset: {e}"));
    }
    LayerStatus::on("capabilities", "all dropped (bounding set cleared)")
}

/// Syscalls the worker never needs and that reach beyond its sandbox.
const DENIED: &[(&str, libc::c_long)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("fsopen", libc::SYS_fsopen),
    ("fsmount", libc::SYS_fsmount),
    ("fsconfig", libc::SYS_fsconfig),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("acct", libc::SYS_acct),
    ("syslog", libc::SYS_syslog),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("quotactl", libc::SYS_quotactl),
    ("kcmp", libc::SYS_kcmp),
    ("vhangup", libc::SYS_vhangup),
    // io_uring runs file, socket and other operations that seccomp never
    // sees: with it, every argument filter here (set-ID modes, openat2,
    // namespace flags) could be bypassed.
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
];

/// Every denied syscall: [`DENIED`].
fn denied() -> impl Iterator<Item = &'static (&'static str, libc::c_long)> {
    DENIED.iter()
}

/// `fchmodat2` (Linux 6.6): 452 on every architecture (the unified syscall
/// table); the libc crate names it for x86_64 only.
const SYS_FCHMODAT2: libc::c_long = 452;

/// Syscalls that end the calling process (`SIGSYS`, `SECCOMP_RET_KILL_PROCESS`)
/// instead of failing: machine administration (loading a kernel or a module,
/// rebooting, swap, port I/O) that no cell has a use for and no library
/// probes for a fallback, so a call is an attack or a bug, and the result
/// says so (`fault: seccomp`) rather than hiding an `EPERM` inside the cell.
const KILLED: &[(&str, libc::c_long)] = &[
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
];

/// The killed syscalls that exist on this architecture only (port I/O:
/// x86's `iopl` and `ioperm`; aarch64 has no such calls).
#[cfg(target_arch = "x86_64")]
const KILLED_ARCH: &[(&str, libc::c_long)] = &[("iopl", libc::SYS_iopl), ("ioperm", libc::SYS_ioperm)];
#[cfg(not(target_arch = "x86_64"))]
const KILLED_ARCH: &[(&str, libc::c_long)] = &[];

/// Every killed syscall of this architecture: [`KILLED`] and [`KILLED_ARCH`].
fn killed() -> impl Iterator<Item = &'static (&'static str, libc::c_long)> {
    KILLED.iter().chain(KILLED_ARCH)
}

const NEW_NS_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
    0x80, // CLONE_NEWTIME
];

/// The seccomp programs: the denied syscalls and namespace-creating
/// `clone` fail with `EPERM`; `clone3` fails with `ENOSYS`; the
/// [`KILLED`] ones end the process with `SIGSYS`.
pub(crate) fn seccomp_filters() -> Result<Vec<seccompiler::BpfProgram>, seccompiler::Error> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
        TargetArch,
    };
    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(seccompiler::Error::Backend)?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = denied().map(|(_, n)| (*n, Vec::new())).collect();
    let mut clone_rules = Vec::new();
    for f in NEW_NS_FLAGS {
        clone_rules.push(
            SeccompRule::new(vec![
                SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(*f as u64),
                    *f as u64,
                )
                .map_err(seccompiler::Error::Backend)?,
            ])
            .map_err(seccompiler::Error::Backend)?,
        );
    }
    rules.insert(libc::SYS_clone, clone_rules);
    for (nr, rule) in setid_mode_rules()? {
        rules.entry(nr).or_default().push(rule);
    }
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(seccompiler::Error::Backend)?;
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new()), (libc::SYS_openat2, Vec::new())]
            .into_iter()
            .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(seccompiler::Error::Backend)?;
    let kill = SeccompFilter::new(
        killed().map(|(_, n)| (*n, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::KillProcess,
        arch,
    )
    .map_err(seccompiler::Error::Backend)?;
    Ok(vec![
        deny.try_into().map_err(seccompiler::Error::Backend)?,
        clone3.try_into().map_err(seccompiler::Error::Backend)?,
        kill.try_into().map_err(seccompiler::Error::Backend)?,
    ])
}

/// Calls that would give a file the set-user-ID or set-group-ID bit, as
/// `(syscall, rule)`: `chmod`/`fchmod`/`fchmodat`/`fchmodat2` with either bit
/// in the mode, `open`/`openat`/`creat` creating a file (`O_CREAT` or
/// `O_TMPFILE`) with either bit, `mknod`/`mknodat` with either bit.
///
/// Why: the kernel's read-write paths are idmapped so that its files land
/// on disk owned by the directory's owner — root's, when cellhost runs as
/// root. A set-user-ID file made there would be a root set-user-ID program
/// on the host, runnable by any host user. `openat2` (whose mode sits in a
/// struct a filter cannot read) answers `ENOSYS` from the second program,
/// so callers fall back to `openat`.
fn setid_mode_rules() -> Result<Vec<(i64, seccompiler::SeccompRule)>, seccompiler::Error> {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
    let bit = |arg: u8, mask: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(mask), mask)
            .map_err(seccompiler::Error::Backend)
    };
    let mut out = Vec::new();
    for id_bit in [libc::S_ISUID as u64, libc::S_ISGID as u64] {
        // (syscall, mode argument, flags argument that must hold O_CREAT/O_TMPFILE)
        let mut calls: Vec<(i64, u8, Option<u8>)> = vec![
            (libc::SYS_fchmod, 1, None),
            (libc::SYS_fchmodat, 2, None),
            (SYS_FCHMODAT2, 2, None),
            (libc::SYS_mknodat, 2, None),
            (libc::SYS_openat, 3, Some(2)),
        ];
        // The legacy path calls of x86_64 (aarch64 has only the `*at` forms).
        #[cfg(target_arch = "x86_64")]
        calls.extend([
            (libc::SYS_chmod, 1, None),
            (libc::SYS_creat, 1, None),
            (libc::SYS_mknod, 1, None),
            (libc::SYS_open, 2, Some(1)),
        ]);
        for (nr, mode_arg, flags_arg) in calls {
            match flags_arg {
                None => out.push((
                    nr,
                    SeccompRule::new(vec![bit(mode_arg, id_bit)?]).map_err(seccompiler::Error::Backend)?,
                )),
                Some(f) => {
                    for create in [libc::O_CREAT as u64, libc::O_TMPFILE as u64] {
                        out.push((
                            nr,
                            SeccompRule::new(vec![bit(f, create)?, bit(mode_arg, id_bit)?])
                                .map_err(seccompiler::Error::Backend)?,
                        ));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// What the seccomp layer reports once installed.
pub(crate) fn seccomp_detail() -> String {
    format!(
        "EPERM for {} syscalls (ptrace, mount, bpf, keyctl, perf_event_open, unshare/setns, …), namespace-creating clone and set-user/group-ID file modes; SIGSYS for {} (kexec, modules, reboot, swap, port I/O)",
        denied().count(),
        killed().count()
    )
}

/// Installs the seccomp filters: the denied syscalls (ptrace, mount, bpf, …) and `clone` with
/// namespace flags fail with `EPERM`; `clone3` (whose flags a filter cannot
/// read) fails with `ENOSYS`, so the C library falls back to `clone`.
pub fn apply_seccomp(sys: &dyn Sys) -> LayerStatus {
    let _ = sys.set_no_new_privs();
    let installed = seccomp_filters()
        .map_err(std::io::Error::other)
        .and_then(|programs| programs.iter().try_for_each(|p| sys.seccomp_install(p)));
    match installed {
        Ok(()) => LayerStatus::on("seccomp", seccomp_detail()),
        Err(e) => LayerStatus::missing("seccomp", format!("cannot install the filter: {e}")),
    }
}
