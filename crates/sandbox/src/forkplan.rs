//! The confinement of a kernel forked from a template, as data.
//!
//! A template (a Python process that has already imported a
//! configuration's modules) cannot run the kernel init's Rust code between
//! its `fork` and the worker's first instruction, so the host computes
//! everything the forked processes must do and sends it along:
//!
//! 1. the first child (the future kernel init) lowers the rlimits and
//!    unshares the namespaces in [`ForkPlan::unshare`] (all but the cgroup
//!    namespace) — when the host is not root, in a user namespace of its
//!    own first ([`ForkPlan::user_ns`], see [`UserNsPlan`]); it starts the
//!    ns-init in *fork* mode with `posix_spawn`
//!    (pid 1 of the new pid namespace, no copy of the template), forks the
//!    worker (pid 2) and execs the kernel init in *adopt* mode
//!    ([`crate::launcher`]);
//! 2. the ns-init (started with an empty environment; its
//!    [`crate::launcher::ForkNsSpec`] comes on a memfd, not its command
//!    line) builds the kernel's fresh root exactly as for a cold kernel
//!    ([`crate::confine::setup_mounts`]), tells the worker to go on and
//!    takes the kernel's uid; meanwhile the worker joins the kernel's
//!    cgroups and unshares its cgroup namespace (rooted at its own group);
//! 3. the worker clears its capability bounding set, takes the kernel's
//!    uid ([`ForkPlan::uid_base`] plus the kernel init's host pid, see
//!    [`crate::profile::kernel_id`]), applies Landlock with the rules of
//!    [`LandlockPlan`] (the access masks are the `landlock` crate's,
//!    computed here), drops every capability, and installs the seccomp
//!    programs of [`ForkPlan::seccomp`] (compiled here by `seccompiler`,
//!    the same programs a cold kernel gets) — the order of
//!    [`crate::confine`].
//!
//! A step that fails ends the fork (the worker exits with status 72 and the
//! reason on its stderr): the caller then starts a cold kernel, whose init
//! applies the layers best-effort as usual.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::confine;
use crate::profile::{InitSpec, KERNEL_ID_BASE, LayerStatus, SandboxMode};
use crate::steps::{ORDER, Step};

/// What the processes of a forked kernel apply to themselves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkPlan {
    /// `off`, `auto` or `enforce`.
    pub mode: SandboxMode,
    /// `CLONE_NEW*` flags for `unshare(2)` in the first child (0: none).
    pub unshare: i32,
    /// Limits the first child lowers: `(name, value)` with name `core`,
    /// `nofile`, `fsize` or `as`; never above the current hard limit.
    pub rlimits: Vec<(String, u64)>,
    /// The rlimit and namespace layers as they stand once those steps
    /// succeed (a failing step ends the fork instead).
    pub layers: Vec<LayerStatus>,
    /// Landlock, when the profile and the running kernel have it.
    pub landlock: Option<LandlockPlan>,
    /// Why Landlock is not applied, when it is not.
    pub landlock_missing: Option<String>,
    /// Drop every capability.
    pub drop_capabilities: bool,
    /// Seccomp programs as hex of their `struct sock_filter` array (native
    /// byte order), installed in order.
    pub seccomp: Vec<String>,
    /// Detail of the seccomp layer once installed.
    pub seccomp_detail: String,
    /// `SYS_capset` on this architecture.
    pub capset_nr: i64,
    /// The kernel runs as `uid_base + (its kernel init's host pid)` (uid
    /// and gid, see [`crate::profile::kernel_id`]); `None` keeps the
    /// template's uid (sandbox off, the host not root, or the `uid` layer
    /// disabled).
    #[serde(default)]
    pub uid_base: Option<u32>,
    /// Why the kernel keeps the template's uid, when `uid_base` is `None`
    /// with a sandbox.
    #[serde(default)]
    pub uid_missing: Option<String>,
    /// The user namespace the first child enters before the others when
    /// the host is not root (`None` as root: it creates the namespaces
    /// itself).
    #[serde(default)]
    pub user_ns: Option<UserNsPlan>,
    /// The confinement steps, in the order to apply them: always
    /// [`crate::steps::ORDER`]. `confine.py` runs them as given (each in
    /// its process) and refuses a step it does not know.
    pub steps: Vec<Step>,
}

/// The user namespace of a kernel forked by a template that is not root.
///
/// Each fork gets its own: the first child (a copy of the template, single
/// threaded) calls `unshare(CLONE_NEWUSER)` and writes its own maps —
/// `deny` to `/proc/self/setgroups`, then `"{uid} {uid} 1"` to `uid_map` and
/// `"{gid} {gid} 1"` to `gid_map` — the one mapping an unprivileged process
/// may write for itself (user_namespaces(7)), the same a cold kernel's init
/// writes. The host writes nothing: the child needs no round trip, and the
/// kernel sees the host user's own uid, as a cold kernel does. The other
/// namespaces are then created inside it, owned by it.
///
/// The ns-init (pid 1 of the new pid namespace) is started with
/// `posix_spawn`, and an `execve` by a process whose uid is not 0 clears
/// its capabilities: the first child raises every capability it holds in
/// the new namespace into its inheritable and ambient sets just for that
/// spawn, and clears the ambient set again before anything else is
/// started. The ns-init drops them all once the kernel's root and `/proc`
/// are mounted; the worker, a fork, drops them in its `capabilities` step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserNsPlan {
    /// The host uid mapped to itself (the template's effective uid).
    pub uid: u32,
    /// The host gid mapped to itself (the template's effective gid).
    pub gid: u32,
}

/// A Landlock ruleset: what is handled and one `path_beneath` rule per path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockPlan {
    /// `handled_access_fs` of the ruleset.
    pub handled_fs: u64,
    /// `scoped` of the ruleset (signals, abstract sockets).
    pub scoped: u64,
    /// `(path, allowed_access)`; for a file the mask holds file rights only.
    pub rules: Vec<(PathBuf, u64)>,
    /// Detail of the layer once applied.
    pub detail: String,
}

/// Detail of the capabilities layer once applied.
pub const CAPABILITIES_DETAIL: &str = "all dropped (bounding set cleared)";

/// Builds the plan of a forked kernel for a template of this process's
/// effective uid and gid; `spec` is `None` with the sandbox off.
pub fn fork_plan(spec: Option<&InitSpec>) -> ForkPlan {
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    fork_plan_as(spec, uid, gid)
}

/// [`fork_plan`] for a template running as `uid` and `gid` (0: root).
pub fn fork_plan_as(spec: Option<&InitSpec>, uid: u32, gid: u32) -> ForkPlan {
    let Some(spec) = spec else {
        return ForkPlan {
            mode: SandboxMode::Off,
            unshare: 0,
            rlimits: Vec::new(),
            layers: Vec::new(),
            landlock: None,
            landlock_missing: None,
            drop_capabilities: false,
            seccomp: Vec::new(),
            seccomp_detail: String::new(),
            capset_nr: libc::SYS_capset,
            uid_base: None,
            uid_missing: None,
            user_ns: None,
            steps: ORDER.to_vec(),
        };
    };
    let root = uid == 0;
    let mut layers = Vec::new();
    let mut rlimits = Vec::new();
    if spec.disabled("rlimits") {
        layers.push(LayerStatus::missing("rlimits", "disabled by the sandbox profile"));
    } else {
        let r = &spec.rlimits;
        for (name, v) in [
            ("core", r.core),
            ("nofile", r.nofile),
            ("fsize", r.fsize),
            ("as", r.address_space),
        ] {
            if let Some(v) = v {
                rlimits.push((name.to_string(), v));
            }
        }
        let text: Vec<String> = rlimits.iter().map(|(n, v)| format!("{n}={v}")).collect();
        layers.push(LayerStatus::on("rlimits", text.join(" ")));
    }
    let user_ns = (!root).then_some(UserNsPlan { uid, gid });
    if root {
        layers.push(LayerStatus::skipped(
            "userns",
            "not needed: the template runs as root and creates the other namespaces itself; \
             root's capabilities are dropped before the worker runs",
        ));
    } else {
        layers.push(LayerStatus::on(
            "userns",
            format!("uid {uid} mapped to itself (one user namespace per forked kernel)"),
        ));
    }
    let (wanted, skipped) = confine::wanted_namespaces(spec.network, &spec.disable);
    layers.extend(skipped);
    let mut unshare = 0;
    for (name, flag, what) in wanted {
        unshare |= flag;
        layers.push(LayerStatus::on(name, what));
    }
    let (landlock, landlock_missing) = if spec.disabled("landlock") {
        (None, Some("disabled by the sandbox profile".to_string()))
    } else {
        match landlock_plan(spec) {
            Ok(p) => (Some(p), None),
            Err(why) => (None, Some(why)),
        }
    };
    let (seccomp, seccomp_detail) = if spec.disabled("seccomp") {
        (Vec::new(), String::new())
    } else {
        // The programs depend on nothing but the architecture: compile once.
        static PROGRAMS: std::sync::OnceLock<Result<Vec<String>, String>> = std::sync::OnceLock::new();
        let built = PROGRAMS.get_or_init(|| {
            confine::seccomp_filters()
                .map(|programs| programs.iter().map(program_hex).collect())
                .map_err(|e| e.to_string())
        });
        match built {
            Ok(p) => (p.clone(), confine::seccomp_detail()),
            Err(e) => (Vec::new(), format!("cannot build the filter: {e}")),
        }
    };
    ForkPlan {
        mode: spec.mode,
        unshare,
        rlimits,
        layers,
        landlock,
        landlock_missing,
        drop_capabilities: !spec.disabled("capabilities"),
        seccomp,
        seccomp_detail,
        capset_nr: libc::SYS_capset,
        // Only root can take a kernel uid; another user's kernel keeps the
        // user's own (the `uid` layer says so).
        uid_base: (root && !spec.disabled("uid")).then_some(KERNEL_ID_BASE),
        uid_missing: (root && spec.disabled("uid"))
            .then(|| "disabled by the sandbox profile: the kernel runs as root".to_string()),
        user_ns,
        steps: ORDER.to_vec(),
    }
}

fn program_hex(p: &seccompiler::BpfProgram) -> String {
    let mut out = String::with_capacity(p.len() * 16);
    for f in p {
        let mut bytes = Vec::with_capacity(8);
        bytes.extend_from_slice(&f.code.to_ne_bytes());
        bytes.push(f.jt);
        bytes.push(f.jf);
        bytes.extend_from_slice(&f.k.to_ne_bytes());
        for b in bytes {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

/// The ruleset a cold kernel's init builds with the `landlock` crate, as
/// masks: read-only system and interpreter paths, read-write session
/// directory, workdir and private tmp.
fn landlock_plan(spec: &InitSpec) -> Result<LandlockPlan, String> {
    use landlock::{ABI, Access, AccessFs, Scope};
    let version = confine::landlock_abi();
    if version < 1 {
        return Err(
            "the running kernel does not support Landlock (or it is not enabled at boot: lsm=landlock)"
                .into(),
        );
    }
    // The masks of the highest ABI both this build and the kernel know.
    let abi = ABI::from(version.min(6) as i32);
    let handled = AccessFs::from_all(abi);
    let ro_access = AccessFs::from_read(abi);
    let rw_access = handled & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let file_only = AccessFs::from_file(abi);
    let (ro, rw) = confine::landlock_paths(spec);
    let mut rules = Vec::new();
    for (paths, access) in [(&ro, ro_access), (&rw, rw_access)] {
        for p in paths.iter() {
            let Ok(meta) = std::fs::metadata(p) else { continue };
            let mask = if meta.is_dir() { access } else { access & file_only };
            rules.push((p.clone(), mask.bits()));
        }
    }
    let scoped = Scope::from_all(abi).bits();
    let detail = if scoped != 0 {
        format!(
            "ABI {version}: read-only {} paths, read-write {} paths, signals and abstract sockets scoped",
            ro.len(),
            rw.len()
        )
    } else {
        format!(
            "ABI {version}: read-only {} paths, read-write {} paths",
            ro.len(),
            rw.len()
        )
    };
    Ok(LandlockPlan {
        handled_fs: handled.bits(),
        scoped,
        rules,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Rlimits;

    fn spec() -> InitSpec {
        InitSpec {
            mode: SandboxMode::Auto,
            network: false,
            ro: vec!["/usr".into()],
            rw: vec![std::env::temp_dir()],
            workdir: Some(std::env::temp_dir()),
            rlimits: Rlimits::default(),
            disable: Vec::new(),
            mpl_cache: None,
            hidden: Vec::new(),
            cgroup_views: Vec::new(),
            egress_port: None,
            workdir_disk: None,
        }
    }

    #[test]
    fn plan_carries_the_one_step_list() {
        for p in [fork_plan(None), fork_plan(Some(&spec()))] {
            assert_eq!(p.steps, ORDER);
            let json = serde_json::to_value(&p).expect("plan as JSON");
            let names: Vec<&str> = ORDER.iter().map(|s| s.as_str()).collect();
            assert_eq!(json["steps"], serde_json::json!(names));
        }
    }

    #[test]
    fn off_plan_applies_nothing() {
        let p = fork_plan(None);
        assert_eq!(p.unshare, 0);
        assert!(p.seccomp.is_empty() && p.landlock.is_none() && !p.drop_capabilities);
    }

    #[test]
    fn plan_unshares_what_a_cold_kernel_unshares() {
        let p = fork_plan_as(Some(&spec()), 0, 0);
        for f in [
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
        ] {
            assert_ne!(p.unshare & f, 0, "flag {f:#x} missing");
        }
        assert_eq!(p.unshare & libc::CLONE_NEWUSER, 0);
        let names: Vec<&str> = p.layers.iter().map(|l| l.name.as_str()).collect();
        assert!(names.contains(&"netns") && names.contains(&"pidns") && names.contains(&"rlimits"));
        assert!(p.rlimits.iter().any(|(n, v)| n == "core" && *v == 0));
        assert_eq!(p.uid_base, Some(KERNEL_ID_BASE));
        let mut s = spec();
        s.disable = vec!["uid".into()];
        let p = fork_plan_as(Some(&s), 0, 0);
        assert!(p.uid_base.is_none() && p.uid_missing.is_some());
        assert!(p.user_ns.is_none());
    }

    #[test]
    fn another_user_gets_a_user_namespace_per_fork_and_keeps_its_uid() {
        let p = fork_plan_as(Some(&spec()), 1002, 1003);
        assert_eq!(p.user_ns, Some(UserNsPlan { uid: 1002, gid: 1003 }));
        // CLONE_NEWUSER is its own step, before the rest: never in `unshare`.
        assert_eq!(p.unshare & libc::CLONE_NEWUSER, 0);
        assert_ne!(p.unshare & libc::CLONE_NEWPID, 0);
        let userns = p
            .layers
            .iter()
            .find(|l| l.name == "userns")
            .expect("userns layer");
        assert!(userns.enforced && userns.detail.contains("1002"), "{userns:?}");
        // No kernel uid: only root may take one.
        assert!(p.uid_base.is_none() && p.uid_missing.is_none());
        assert!(fork_plan_as(None, 1002, 1003).user_ns.is_none());
        let json = serde_json::to_value(&p).expect("plan as JSON");
        assert_eq!(json["user_ns"], serde_json::json!({"uid": 1002, "gid": 1003}));
    }

    #[test]
    fn network_and_disabled_layers_leave_their_flags_out() {
        let mut s = spec();
        s.network = true;
        s.disable = vec!["ipcns".into(), "seccomp".into(), "landlock".into()];
        let p = fork_plan(Some(&s));
        assert_eq!(p.unshare & libc::CLONE_NEWNET, 0);
        assert_eq!(p.unshare & libc::CLONE_NEWIPC, 0);
        assert!(p.seccomp.is_empty());
        assert!(p.landlock.is_none() && p.landlock_missing.is_some());
        assert!(p.layers.iter().any(|l| l.name == "ipcns" && !l.enforced));
    }

    #[test]
    fn seccomp_programs_are_whole_sock_filters() {
        let p = fork_plan_as(Some(&spec()), 1002, 1002);
        assert_eq!(p.seccomp.len(), 3);
        for prog in &p.seccomp {
            assert!(!prog.is_empty());
            assert_eq!(prog.len() % 16, 0, "8 bytes per instruction");
        }
    }

    #[test]
    fn landlock_rules_keep_file_rights_for_files() {
        let mut s = spec();
        s.ro.push("/etc/hostname".into());
        let p = fork_plan(Some(&s));
        let Some(l) = p.landlock else {
            return; // no Landlock on this kernel: nothing to check
        };
        use landlock::{ABI, AccessFs};
        let file_only = AccessFs::from_file(ABI::V6).bits();
        let (_, m) = l
            .rules
            .iter()
            .find(|(p, _)| p == std::path::Path::new("/etc/hostname"))
            .expect("rule for the file");
        assert_eq!(m & !file_only, 0);
        assert_ne!(l.handled_fs, 0);
    }
}
