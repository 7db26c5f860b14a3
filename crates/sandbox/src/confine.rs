//! The confinement layers, applied by the kernel init (a fresh,
//! single-threaded process) in this order: rlimits → namespaces → mounts →
//! Landlock → capabilities → seccomp. Each step returns what it did as a
//! [`LayerStatus`]; nothing here runs in the multi-threaded host.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::profile::{DEVICES_RW, InitSpec, LayerStatus, MASKED_FILES, PRIVATE_MPL_DIR, Rlimits, SYSTEM_RO};

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn cpath(p: &Path) -> Option<CString> {
    CString::new(p.as_os_str().as_bytes()).ok()
}

/// Lowers the per-process limits (never raises a hard limit).
pub fn apply_rlimits(r: &Rlimits) -> LayerStatus {
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for (name, res, want) in [
        ("core", libc::RLIMIT_CORE, r.core),
        ("nofile", libc::RLIMIT_NOFILE, r.nofile),
        ("fsize", libc::RLIMIT_FSIZE, r.fsize),
        ("as", libc::RLIMIT_AS, r.address_space),
    ] {
        let Some(want) = want else { continue };
        // SAFETY: getrlimit/setrlimit read and write one valid rlimit struct.
        let rc = unsafe {
            let mut cur: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(res, &mut cur) != 0 {
                -1
            } else {
                let v = if cur.rlim_max == libc::RLIM_INFINITY {
                    want
                } else {
                    want.min(cur.rlim_max)
                };
                let lim = libc::rlimit {
                    rlim_cur: v,
                    rlim_max: v,
                };
                libc::setrlimit(res, &lim)
            }
        };
        if rc == 0 {
            done.push(format!("{name}={want}"));
        } else {
            failed.push(format!("{name}: {}", errno()));
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
pub fn unshare_namespaces(network: bool, disable: &[String]) -> Vec<LayerStatus> {
    let mut layers = Vec::new();
    // SAFETY: geteuid/getegid take no arguments.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        layers.push(LayerStatus::skipped(
            "userns",
            "not needed: the init runs as root and creates the other namespaces itself; \
             root's capabilities are dropped before Python starts",
        ));
    } else {
        // SAFETY: unshare takes flags only.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0 {
            let maps = (|| -> std::io::Result<()> {
                fs::write("/proc/self/setgroups", "deny")?;
                fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
                fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
                Ok(())
            })();
            match maps {
                Ok(()) => layers.push(LayerStatus::on("userns", format!("uid {uid} mapped to itself"))),
                Err(e) => layers.push(LayerStatus::missing(
                    "userns",
                    format!("cannot write id maps: {e}"),
                )),
            }
        } else {
            layers.push(LayerStatus::missing(
                "userns",
                format!(
                    "unshare(CLONE_NEWUSER): {} (unprivileged user namespaces disabled?)",
                    errno()
                ),
            ));
        }
    }
    let (wanted, skipped) = wanted_namespaces(network, disable);
    layers.extend(skipped);
    let all = wanted.iter().fold(0, |a, w| a | w.1);
    // SAFETY: unshare takes flags only; this process is single-threaded.
    let together = unsafe { libc::unshare(all) } == 0;
    for (name, flag, what) in wanted {
        // SAFETY: as above.
        if together || unsafe { libc::unshare(flag) } == 0 {
            layers.push(LayerStatus::on(name, format!("{what}{}", settle_namespace(flag))));
        } else {
            layers.push(LayerStatus::missing(name, format!("unshare: {}", errno())));
        }
    }
    layers
}

/// Finishes a namespace just entered: names the host `cellhost` in a new
/// UTS namespace, brings the loopback up in a new network namespace.
/// Returns what to add to the layer's detail (`" (up)"` or `" (down)"` for
/// the network, else nothing).
pub fn settle_namespace(flag: libc::c_int) -> &'static str {
    if flag == libc::CLONE_NEWNET {
        return if loopback_up() { " (up)" } else { " (down)" };
    }
    if flag == libc::CLONE_NEWUTS {
        let name = b"cellhost";
        // SAFETY: the pointer and length describe a live byte array.
        unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    }
    ""
}

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    pad: [u8; 22],
}

fn loopback_up() -> bool {
    let mut req = IfReq {
        name: [0; 16],
        flags: 0,
        pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    // SAFETY: a datagram socket used for two interface ioctls on a live,
    // correctly sized ifreq, then closed.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return false;
        }
        let mut ok = libc::ioctl(s, 0x8913 /* SIOCGIFFLAGS */, &mut req) == 0;
        if ok {
            req.flags |= libc::IFF_UP as libc::c_short;
            ok = libc::ioctl(s, 0x8914 /* SIOCSIFFLAGS */, &req) == 0;
        }
        libc::close(s);
        ok
    }
}

fn mount(
    src: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> std::io::Result<()> {
    let c = |s: Option<&str>| s.and_then(|s| CString::new(s).ok());
    let (src, fstype, data) = (c(src), c(fstype), c(data));
    let target = cpath(target).ok_or_else(|| std::io::Error::other("NUL in path"))?;
    let p = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a live NUL-terminated string.
    let rc = unsafe { libc::mount(p(&src), target.as_ptr(), p(&fstype), flags, p(&data).cast()) };
    if rc == 0 { Ok(()) } else { Err(errno()) }
}

/// The directories the worker may write, the workdir included.
fn rw_paths(spec: &InitSpec) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = spec.rw.clone();
    v.extend(spec.workdir.clone());
    v
}

/// In the new mount namespace (called by pid 1 of the new pid namespace):
/// private `/tmp` and `/dev/shm`, the kernel's own `/proc`, secret files
/// covered with `/dev/null`; paths under `/tmp` the worker needs (its
/// workdir, or an interpreter or cache that lives there) are bound back in.
pub fn setup_mounts(spec: &InitSpec) -> LayerStatus {
    if let Err(e) = mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE, None) {
        return LayerStatus::missing("mountns", format!("cannot make / private: {e}"));
    }
    let mut notes = Vec::new();
    // Keep a handle on every needed path under /tmp before covering it.
    // (Landlock, applied next, keeps the read-only ones read-only.)
    // Read-only ones are bound read-only: Landlock's read-write rule for
    // the private /tmp would cover them. Shallow paths first, so a deeper
    // bind lands on top of the one that contains it.
    let mut keep: Vec<(PathBuf, bool, fs::File)> = rw_paths(spec)
        .into_iter()
        .map(|p| (p, false))
        .chain(spec.ro.iter().cloned().map(|p| (p, true)))
        .filter(|(p, _)| p.starts_with("/tmp") && p != Path::new("/tmp"))
        .filter_map(|(p, ro)| {
            let f = fs::OpenOptions::new()
                .read(true)
                .custom_flags_path()
                .open(&p)
                .ok()?;
            Some((p, ro, f))
        })
        .collect();
    keep.sort_by_key(|(p, _, _)| p.components().count());
    match mount(
        Some("tmpfs"),
        Path::new("/tmp"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777"),
    ) {
        Ok(()) => {
            for (p, ro, f) in &keep {
                let is_dir = f.metadata().map(|m| m.is_dir()).unwrap_or(true);
                // Never truncate: an earlier bind may already show the real file here.
                let made = if p.exists() {
                    Ok(())
                } else if is_dir {
                    fs::create_dir_all(p)
                } else {
                    p.parent()
                        .map_or(Ok(()), fs::create_dir_all)
                        .and_then(|_| fs::OpenOptions::new().append(true).create(true).open(p).map(drop))
                };
                let src = format!("/proc/self/fd/{}", f.as_raw_fd());
                let bound = made.and_then(|_| mount(Some(&src), p, None, libc::MS_BIND | libc::MS_REC, None));
                let sealed = bound.and_then(|_| {
                    if *ro {
                        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID;
                        mount(None, p, None, flags, None)
                    } else {
                        Ok(())
                    }
                });
                if let Err(e) = sealed {
                    return LayerStatus::missing(
                        "mountns",
                        format!("cannot bind {} into the private /tmp: {e}", p.display()),
                    );
                }
            }
            notes.push("private /tmp (tmpfs)".to_string());
        }
        Err(e) => return LayerStatus::missing("mountns", format!("cannot mount a private /tmp: {e}")),
    }
    drop(keep);
    if Path::new("/dev/shm").is_dir() {
        match mount(
            Some("tmpfs"),
            Path::new("/dev/shm"),
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some("mode=1777"),
        ) {
            Ok(()) => notes.push("private /dev/shm".into()),
            Err(e) => notes.push(format!("shared /dev/shm ({e})")),
        }
    }
    let mut masked = 0;
    for f in MASKED_FILES {
        let p = Path::new(f);
        if p.exists() {
            if let Err(e) = mount(Some("/dev/null"), p, None, libc::MS_BIND, None) {
                return LayerStatus::missing("mountns", format!("cannot mask {f}: {e}"));
            }
            masked += 1;
        }
    }
    notes.push(format!("{masked} secret files under /etc masked"));
    match mount(
        Some("proc"),
        Path::new("/proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    ) {
        Ok(()) => notes.push("own /proc".into()),
        Err(e) => {
            return LayerStatus::missing("mountns", format!("cannot mount the kernel's own /proc: {e}"));
        }
    }
    LayerStatus::on("mountns", notes.join(", "))
}

trait PathOpen {
    fn custom_flags_path(&mut self) -> &mut Self;
}

impl PathOpen for fs::OpenOptions {
    fn custom_flags_path(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_PATH | libc::O_CLOEXEC)
    }
}

/// Points `MPLCONFIGDIR` at the host-built font cache: a copy of its
/// `fontlist-*.json` in the private `/tmp` when there is one (matplotlib
/// falls back to a fresh cache, and a font scan, when `MPLCONFIGDIR` is not
/// writable), else the cache itself, read-only.
pub fn share_mpl_cache(spec: &InitSpec, private_tmp: bool) {
    let Some(cache) = &spec.mpl_cache else { return };
    let mut dir = cache.clone();
    if private_tmp {
        let private = Path::new(PRIVATE_MPL_DIR);
        if fs::create_dir_all(private).is_ok() {
            for e in fs::read_dir(cache).into_iter().flatten().flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("fontlist") {
                    let _ = fs::copy(e.path(), private.join(&name));
                }
            }
            dir = private.to_path_buf();
        }
    }
    // SAFETY: the kernel init is single-threaded: no other thread reads
    // the environment concurrently.
    unsafe { std::env::set_var("MPLCONFIGDIR", dir) };
}

/// The Landlock ABI of the running kernel (0: none).
pub fn landlock_abi() -> i64 {
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    v.max(0)
}

/// The read-only and the read-write paths of the Landlock ruleset.
pub(crate) fn landlock_paths(spec: &InitSpec) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut ro: Vec<PathBuf> = SYSTEM_RO.iter().map(PathBuf::from).collect();
    ro.extend(spec.ro.iter().cloned());
    let mut rw: Vec<PathBuf> = DEVICES_RW.iter().map(PathBuf::from).collect();
    rw.push("/tmp".into());
    rw.extend(rw_paths(spec));
    (ro, rw)
}

/// Restricts the file system: read-only system and interpreter directories,
/// read-write session directory, workdir and private tmp; no access to
/// anything else (the host user's home, the journal, other sessions).
pub fn apply_landlock(spec: &InitSpec) -> LayerStatus {
    use landlock::{
        ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr,
        RulesetStatus, Scope, path_beneath_rules,
    };
    let abi = ABI::V6;
    let ro_access = AccessFs::from_read(abi);
    // No device nodes, even where writing is allowed.
    let rw_access = AccessFs::from_all(abi) & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let (ro, rw) = landlock_paths(spec);
    let result = (|| -> Result<_, landlock::RulesetError> {
        Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(abi))?
            .scope(Scope::from_all(abi))?
            .create()?
            .add_rules(path_beneath_rules(&ro, ro_access))?
            .add_rules(path_beneath_rules(&rw, rw_access))?
            .restrict_self()
    })();
    let version = landlock_abi();
    match result {
        Ok(s) => match s.ruleset {
            RulesetStatus::FullyEnforced => LayerStatus::on(
                "landlock",
                format!(
                    "ABI {version}: read-only {} paths, read-write {} paths, signals and abstract sockets scoped",
                    ro.len(),
                    rw.len()
                ),
            ),
            RulesetStatus::PartiallyEnforced => LayerStatus::on(
                "landlock",
                format!("ABI {version} (partial: this kernel lacks some access rights or scopes)"),
            ),
            RulesetStatus::NotEnforced => LayerStatus::missing(
                "landlock",
                "the running kernel does not support Landlock (or it is not enabled at boot: lsm=landlock)",
            ),
        },
        Err(e) => LayerStatus::missing("landlock", format!("ruleset failed: {e}")),
    }
}

/// Drops every capability (bounding, ambient, effective, permitted,
/// inheritable), so a root worker is root in name only.
pub fn drop_capabilities() -> LayerStatus {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // SAFETY: prctl with integer arguments; capset reads one header and two
    // data structs, all live on this stack frame.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
        let mut cap = 0;
        while libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) == 0 {
            cap += 1;
        }
        let mut h = Header {
            version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
            pid: 0,
        };
        let d = [
            Data {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
            Data {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
        ];
        if libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) != 0 {
            return LayerStatus::missing("capabilities", format!("capset: {}", errno()));
        }
        if cap == 0 {
            return LayerStatus::missing("capabilities", format!("PR_CAPBSET_DROP: {}", errno()));
        }
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
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
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
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("vhangup", libc::SYS_vhangup),
];

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

/// The two seccomp programs: the denied syscalls and namespace-creating
/// `clone` fail with `EPERM`; `clone3` fails with `ENOSYS`.
pub(crate) fn seccomp_filters()
-> Result<(seccompiler::BpfProgram, seccompiler::BpfProgram), seccompiler::Error> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
        TargetArch,
    };
    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(seccompiler::Error::Backend)?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|(_, n)| (*n, Vec::new())).collect();
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
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(seccompiler::Error::Backend)?;
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(seccompiler::Error::Backend)?;
    Ok((
        deny.try_into().map_err(seccompiler::Error::Backend)?,
        clone3.try_into().map_err(seccompiler::Error::Backend)?,
    ))
}

/// What the seccomp layer reports once installed.
pub(crate) fn seccomp_detail() -> String {
    format!(
        "EPERM for {} syscalls (ptrace, mount, bpf, kexec, keyctl, perf_event_open, unshare/setns, modules, …) and namespace-creating clone",
        DENIED.len()
    )
}

/// Installs the seccomp filters: the denied syscalls (ptrace, mount, bpf, …) and `clone` with
/// namespace flags fail with `EPERM`; `clone3` (whose flags a filter cannot
/// read) fails with `ENOSYS`, so the C library falls back to `clone`.
pub fn apply_seccomp() -> LayerStatus {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) };
    match seccomp_filters().and_then(|(a, b)| {
        seccompiler::apply_filter(&a)?;
        seccompiler::apply_filter(&b)
    }) {
        Ok(()) => LayerStatus::on("seccomp", seccomp_detail()),
        Err(e) => LayerStatus::missing("seccomp", format!("cannot install the filter: {e}")),
    }
}
