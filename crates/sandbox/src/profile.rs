//! What a kernel's sandbox should be ([`SandboxProfile`]), what the kernel
//! init is told to apply ([`InitSpec`], one `--sandbox JSON` argument), and
//! what it reports back ([`SandboxStatus`]).
//!
//! Defaults of mode `auto` (and `enforce`):
//!
//! * network off (a fresh network namespace holding only loopback);
//! * cgroup limits: memory 4 GiB and 512 processes/threads for the whole
//!   tree: enough for pandas/numpy work and a process pool, while a runaway
//!   allocation or a fork bomb stays inside the kernel. No CPU cap: a cap
//!   slows every honest numpy cell to protect against nothing the scheduler
//!   does not already share fairly; set `cpu_cores` to have one;
//! * rlimits: no core files, 8192 open files, 16 GiB per written file; no
//!   address-space limit unless configured (`RLIMIT_AS` counts *reserved*
//!   virtual memory, which BLAS pools, JITs and Go/Java runtimes reserve by
//!   the gigabyte: the memory cgroup is the real limit).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupLimits;

/// How much confinement a kernel gets. Ordered by strength: `Off < Auto <
/// Enforce` (the order a sandbox floor compares in).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// No confinement beyond the environment allowlist (the pre-sandbox
    /// behaviour, byte for byte).
    Off,
    /// Apply every layer this machine supports; record what is missing.
    #[default]
    Auto,
    /// Refuse to start a kernel when any layer is missing.
    Enforce,
}

impl SandboxMode {
    /// `off`, `auto` or `enforce`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Off => "off",
            SandboxMode::Auto => "auto",
            SandboxMode::Enforce => "enforce",
        }
    }
}

impl std::fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SandboxMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(SandboxMode::Off),
            "auto" => Ok(SandboxMode::Auto),
            "enforce" => Ok(SandboxMode::Enforce),
            other => Err(format!(
                "sandbox mode must be off, auto or enforce, not {other:?}"
            )),
        }
    }
}

/// Per-process resource limits set by the kernel init (inherited by every
/// process of the kernel). `None` leaves the host's limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    /// `RLIMIT_CORE` (0: no core dumps, which could hold secrets).
    pub core: Option<u64>,
    /// `RLIMIT_NOFILE`.
    pub nofile: Option<u64>,
    /// `RLIMIT_FSIZE` in bytes (largest file the kernel can write).
    pub fsize: Option<u64>,
    /// `RLIMIT_AS` in bytes: only when configured (see the module docs).
    pub address_space: Option<u64>,
}

impl Default for Rlimits {
    fn default() -> Self {
        Rlimits {
            core: Some(0),
            nofile: Some(8192),
            fsize: Some(16 << 30),
            address_space: None,
        }
    }
}

/// The sandbox wanted for a kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxProfile {
    /// `off`, `auto` (default) or `enforce`.
    pub mode: SandboxMode,
    /// Network access (default off: only a private loopback).
    pub network: bool,
    /// Extra directories or files the kernel may write.
    pub extra_rw: Vec<PathBuf>,
    /// Extra directories or files the kernel may read.
    pub extra_ro: Vec<PathBuf>,
    /// Working directory (read-write) when the kernel config names no cwd;
    /// when neither does, the session directory is the working directory.
    pub workdir: Option<PathBuf>,
    /// cgroup limits applied unless the kernel config sets its own.
    pub limits: CgroupLimits,
    /// Per-process limits.
    pub rlimits: Rlimits,
    /// Layers to leave out (`landlock`, `seccomp`, `netns`, ...), for a
    /// workload a layer breaks, or to see mode `enforce` refuse: they are
    /// reported as missing, "disabled by the profile".
    #[serde(default)]
    pub disable: Vec<String>,
    /// Host paths the kernel must never see, even inside an allowed path:
    /// the host's control plane (the daemon's run directory, the state
    /// directory with the journal and tokens, `$XDG_RUNTIME_DIR`). Each one
    /// that lies inside the kernel's view is covered (an empty read-only
    /// directory, or `/dev/null` for a file); allowed paths deeper than it
    /// (the kernel's own session directory) are bound back on top.
    #[serde(default)]
    pub hidden: Vec<PathBuf>,
    /// Mode `auto` may start a kernel without its namespaces (user
    /// namespaces unavailable to a non-root user, or a namespace the host
    /// refuses): Landlock and seccomp only, where the kernel reaches the
    /// host's loopback services, sees host processes and writes the host's
    /// `/tmp`. Off by default: such a kernel is refused
    /// ([`WEAK_LAYERS`]); config key `allow_weak_sandbox`.
    #[serde(default)]
    pub allow_weak: bool,
    /// The session's disk cap (`disk_mb`) as a mount or as accounting
    /// only ([`crate::workdir_disk`]); `None`: no cap.
    #[serde(default)]
    pub disk: Option<crate::workdir_disk::DiskPlan>,
}

/// The layers without which mode `auto` refuses a kernel unless the
/// profile allows a weak sandbox ([`SandboxProfile::allow_weak`]): what
/// keeps the kernel off the host's network, processes and files.
pub const WEAK_LAYERS: &[&str] = &["userns", "netns", "pidns", "mountns"];

/// The config key that accepts a sandbox without [`WEAK_LAYERS`].
pub const ALLOW_WEAK_KEY: &str = "allow_weak_sandbox";

impl Default for SandboxProfile {
    fn default() -> Self {
        SandboxProfile {
            mode: SandboxMode::Auto,
            network: false,
            extra_rw: Vec::new(),
            extra_ro: Vec::new(),
            workdir: None,
            limits: CgroupLimits {
                memory_bytes: Some(4 << 30),
                pids_max: Some(512),
                cpu_cores: None,
            },
            rlimits: Rlimits::default(),
            disable: Vec::new(),
            hidden: Vec::new(),
            allow_weak: false,
            disk: None,
        }
    }
}

impl SandboxProfile {
    /// No sandbox at all.
    pub fn off() -> Self {
        SandboxProfile {
            mode: SandboxMode::Off,
            ..Default::default()
        }
    }

    /// The defaults with another mode.
    pub fn with_mode(mode: SandboxMode) -> Self {
        SandboxProfile {
            mode,
            ..Default::default()
        }
    }
}

/// Read-only system directories every kernel gets (not `/sys/fs/cgroup`:
/// it names every other kernel's group, and so its session). `/etc` holds
/// `/etc/shadow` and friends: Landlock cannot carve a file out of an allowed
/// directory, so the init hides them in its mount namespace instead
/// ([`MASKED_FILES`]).
pub const SYSTEM_RO: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc",
    "/proc",
    "/sys/devices/system/cpu",
];

/// Device files every kernel may read and write.
pub const DEVICES_RW: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/shm",
];

/// Files the init covers with `/dev/null` in its mount namespace.
pub const MASKED_FILES: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
];

/// What the kernel init applies, resolved by the host (serialised as the
/// value of the init's `--sandbox` argument).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InitSpec {
    /// `auto` or `enforce`.
    pub mode: SandboxMode,
    /// Keep the host's network.
    pub network: bool,
    /// Read-only (and executable) paths.
    pub ro: Vec<PathBuf>,
    /// Read-write paths.
    pub rw: Vec<PathBuf>,
    /// Directory the worker starts in.
    pub workdir: Option<PathBuf>,
    /// Per-process limits.
    pub rlimits: Rlimits,
    /// Layers left out by the profile.
    #[serde(default)]
    pub disable: Vec<String>,
    /// matplotlib's font cache built by the host: copied into the private
    /// `/tmp` (matplotlib wants a writable `MPLCONFIGDIR`) and named by
    /// `MPLCONFIGDIR`.
    #[serde(default)]
    pub mpl_cache: Option<PathBuf>,
    /// Host paths covered inside the kernel's view (see
    /// [`SandboxProfile::hidden`]).
    #[serde(default)]
    pub hidden: Vec<PathBuf>,
    /// The kernel's own cgroups, each bound read-only where a library
    /// looks for its quota ([`crate::cgroup::KernelCgroup::views`]): the
    /// rest of `/sys/fs/cgroup` (other kernels' groups, the host's) is not
    /// in the kernel's view.
    #[serde(default)]
    pub cgroup_views: Vec<CgroupView>,
    /// Egress by allowlist: the port of the proxy's listener the kernel
    /// init binds on the loopback of the kernel's network namespace and
    /// hands to the host ([`crate::egress`]); `None`: no listener.
    #[serde(default)]
    pub egress_port: Option<u16>,
    /// The session's workdir holder to enter before the namespaces are
    /// unshared ([`crate::workdir_disk::enter`]): the workdir is its
    /// size-limited tmpfs. `None`: the workdir is the host's directory.
    #[serde(default)]
    pub workdir_disk: Option<crate::workdir_disk::HolderNs>,
}

/// One of the kernel's cgroup directories and where the kernel sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupView {
    /// The group's directory on the host
    /// (`/sys/fs/cgroup/memory/cellhost/<kernel>`).
    pub host: PathBuf,
    /// Where the kernel sees it: the hierarchy's mount point
    /// (`/sys/fs/cgroup/memory` on v1, `/sys/fs/cgroup` on v2), the root
    /// of the kernel's cgroup namespace.
    pub view: PathBuf,
}

/// First uid (and gid) of the range a kernel runs as when cellhost runs as
/// root: kernel `n` runs as `KERNEL_ID_BASE + n`, where `n` is the host pid
/// of its kernel init (unique among live kernels, below `pid_max` ≤ 2²²).
///
/// Why a per-kernel uid and not `nobody`: two kernels never share a uid,
/// so a file one kernel leaves world-writable in a shared directory is not
/// a channel to the host's own `nobody` daemons, and no host account owns
/// anything under these ids (`0x7f80_0000`..`0x7fc0_0000` stays below
/// 2³¹, clear of the ranges `useradd` and `/etc/subuid` hand out, and of
/// `(uid_t)-1` and the overflow id 65534). The kernel's writable
/// directories are idmapped to it, so its files land on disk under their
/// directory's owner.
pub const KERNEL_ID_BASE: u32 = 0x7f80_0000;

/// The uid and gid of the kernel whose init has host pid `init_pid`.
pub fn kernel_id(init_pid: u32) -> u32 {
    KERNEL_ID_BASE + (init_pid & 0x3f_ffff)
}

/// What the host hands a kernel init on its launch channel (fd 0, see
/// [`crate::launcher`]) instead of on its command line or in its
/// environment, which every process of the kernel could read through
/// `/proc/1/cmdline` and `/proc/1/environ`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// Pid of the host process that starts the init (the init exits when
    /// its parent is another).
    pub host_pid: i32,
    /// `cgroup.procs` files the init joins before it forks anything.
    #[serde(default)]
    pub cgroup_procs: Vec<PathBuf>,
    /// The sandbox to apply (`None`: mode off).
    #[serde(default)]
    pub sandbox: Option<InitSpec>,
    /// The worker's argv: the interpreter and its arguments.
    pub program: Vec<String>,
    /// The worker's whole environment (the init itself runs with none).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// A template's init: forked kernels outlive the template.
    #[serde(default)]
    pub keep_tree: bool,
    /// When the init kills its tree, it spares the subtrees of adopted
    /// kernel inits (copy-on-write forks of its worker, each a kernel of its
    /// own with its own init): set for sandbox-off kernels only, whose
    /// worker the host may fork (`cellhost_kernel::cow`).
    #[serde(default)]
    pub spare_forks: bool,
    /// The init sets `no_new_privs` before it forks anything, so the whole
    /// tree runs under it (a sandbox sets it anyway; for sandbox-off
    /// kernels a process checkpoint may dump).
    #[serde(default)]
    pub no_new_privs: bool,
}

/// Where a sandboxed kernel's `MPLCONFIGDIR` is, in its private `/tmp`.
pub const PRIVATE_MPL_DIR: &str = "/tmp/.cellhost-matplotlib";

impl InitSpec {
    /// The profile leaves layer `name` out.
    pub fn disabled(&self, name: &str) -> bool {
        self.disable.iter().any(|d| d == name)
    }
}

/// Directories an interpreter needs to read: the prefix of its real
/// executable (`<prefix>/bin/python3.x` → `<prefix>`) and the virtual
/// environment holding `pyvenv.cfg`, if `python` is in one. An executable
/// outside a `bin` directory gives no prefix.
pub fn interpreter_dirs(python: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let bin_parent = |p: &Path| {
        let bin = p.parent()?;
        (bin.file_name()? == "bin").then(|| bin.parent().map(Path::to_path_buf))?
    };
    if let Some(venv) = bin_parent(python)
        && venv.join("pyvenv.cfg").is_file()
    {
        out.push(venv);
    }
    if let Ok(real) = std::fs::canonicalize(python)
        && let Some(prefix) = bin_parent(&real)
        && !matches!(prefix.to_str(), Some("/" | "/tmp" | "/home" | "/root"))
    {
        out.push(prefix);
    }
    out.dedup();
    out
}

/// One confinement layer as applied to a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerStatus {
    /// `env`, `rlimits`, `userns`, `pidns`, `netns`, `ipcns`, `utsns`,
    /// `mountns`, `cgroupns`, `rootfs`, `uid`, `landlock`, `capabilities`,
    /// `seccomp`, `cgroup`.
    pub name: String,
    /// In force for the worker.
    pub enforced: bool,
    /// What was applied, or why not.
    pub detail: String,
    /// Not required by `enforce` (not applicable, or turned off by the
    /// profile, e.g. the network namespace when network is on).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

impl LayerStatus {
    /// An enforced layer.
    pub fn on(name: &str, detail: impl Into<String>) -> Self {
        LayerStatus {
            name: name.into(),
            enforced: true,
            detail: detail.into(),
            optional: false,
        }
    }

    /// A missing layer.
    pub fn missing(name: &str, detail: impl Into<String>) -> Self {
        LayerStatus {
            name: name.into(),
            enforced: false,
            detail: detail.into(),
            optional: false,
        }
    }

    /// A layer that does not apply here.
    pub fn skipped(name: &str, detail: impl Into<String>) -> Self {
        LayerStatus {
            name: name.into(),
            enforced: false,
            detail: detail.into(),
            optional: true,
        }
    }
}

/// What confines one kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SandboxStatus {
    /// The profile's mode.
    pub mode: SandboxMode,
    /// Layers in the order applied.
    pub layers: Vec<LayerStatus>,
}

impl SandboxStatus {
    /// The status of a kernel started with mode `off`.
    pub fn off() -> Self {
        SandboxStatus {
            mode: SandboxMode::Off,
            layers: Vec::new(),
        }
    }

    /// Required layers that are not in force.
    pub fn missing(&self) -> impl Iterator<Item = &LayerStatus> {
        self.layers.iter().filter(|l| !l.enforced && !l.optional)
    }

    /// The layer named `name`.
    pub fn layer(&self, name: &str) -> Option<&LayerStatus> {
        self.layers.iter().find(|l| l.name == name)
    }

    /// The first of [`WEAK_LAYERS`] that is missing for a reason other
    /// than the profile disabling it (a layer the profile leaves out, or
    /// network on, is the user's choice, not a degradation).
    pub fn weak_layer(&self) -> Option<&LayerStatus> {
        self.missing()
            .filter(|l| WEAK_LAYERS.contains(&l.name.as_str()))
            .find(|l| !l.detail.starts_with(DISABLED_BY_PROFILE))
    }
}

/// The detail of a layer the profile leaves out (`sandbox_disable`).
pub const DISABLED_BY_PROFILE: &str = "disabled by the sandbox profile";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [SandboxMode::Off, SandboxMode::Auto, SandboxMode::Enforce] {
            assert_eq!(m.as_str().parse::<SandboxMode>(), Ok(m));
        }
        assert!("strict".parse::<SandboxMode>().is_err());
        assert_eq!(SandboxProfile::default().mode, SandboxMode::Auto);
    }

    #[test]
    fn init_spec_round_trips_as_json() {
        let spec = InitSpec {
            mode: SandboxMode::Enforce,
            network: false,
            ro: vec!["/usr".into()],
            rw: vec!["/tmp/x".into()],
            workdir: Some("/tmp/x".into()),
            rlimits: Rlimits::default(),
            disable: vec!["seccomp".into()],
            mpl_cache: None,
            hidden: vec!["/run/user/0".into()],
            cgroup_views: Vec::new(),
            egress_port: None,
            workdir_disk: None,
        };
        let text = serde_json::to_string(&spec).expect("json");
        assert_eq!(serde_json::from_str::<InitSpec>(&text).expect("parse"), spec);
    }

    #[test]
    fn interpreter_dirs_are_prefix_and_venv_only() {
        let d = std::env::temp_dir().join(format!("cellhost-interp-{}", std::process::id()));
        let bin = d.join("venv/bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::write(d.join("venv/pyvenv.cfg"), "home = /usr/bin\n").expect("cfg");
        std::fs::write(bin.join("python"), "").expect("python");
        std::fs::write(d.join("fake-python"), "").expect("fake");
        let dirs = interpreter_dirs(&bin.join("python"));
        assert!(dirs.contains(&d.join("venv")), "{dirs:?}");
        assert!(interpreter_dirs(&d.join("fake-python")).is_empty());
        assert_eq!(
            interpreter_dirs(Path::new("/usr/bin/python3"))
                .first()
                .map(PathBuf::as_path),
            Some(Path::new("/usr"))
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn missing_skips_optional_layers() {
        let s = SandboxStatus {
            mode: SandboxMode::Auto,
            layers: vec![
                LayerStatus::on("seccomp", "x"),
                LayerStatus::skipped("userns", "root"),
                LayerStatus::missing("landlock", "no"),
            ],
        };
        let names: Vec<_> = s.missing().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["landlock"]);
    }
}
