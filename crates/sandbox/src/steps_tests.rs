//! The cold path's confinement through the recording [`Sys`]: the order
//! of the calls, and every failure path of the init.

use std::path::PathBuf;

use crate::profile::{InitSpec, Rlimits, SandboxMode, kernel_id};
use crate::steps::{Confinement, Stage};
use crate::sys::record::Record;

fn spec(mode: SandboxMode) -> InitSpec {
    // A read-write path the fresh root binds (not /tmp, the kernel's own).
    let tmp = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    InitSpec {
        mode,
        network: false,
        ro: vec![PathBuf::from("/usr")],
        rw: vec![tmp.clone()],
        workdir: Some(tmp),
        rlimits: Rlimits::default(),
        disable: Vec::new(),
        mpl_cache: None,
        hidden: Vec::new(),
        cgroup_views: Vec::new(),
        egress_port: None,
        workdir_disk: None,
    }
}

/// Runs the whole cold confinement (init, then ns-init) as `euid` on
/// `sys`; returns it for inspection.
fn confine<'a>(sys: &'a Record, spec: &'a InitSpec) -> Confinement<'a> {
    let kid = (sys.euid == 0).then(|| kernel_id(4242));
    let mut init = Confinement::new(sys, spec, kid);
    init.run_stage(Stage::Init);
    let mut ns = Confinement::new(sys, spec, kid);
    ns.layers = init.layers;
    ns.run_stage(Stage::NsInit);
    ns.run_stage(Stage::Worker);
    ns
}

/// The index of the first call named `name`.
fn first(names: &[&str], name: &str) -> Option<usize> {
    names.iter().position(|n| *n == name)
}

#[test]
fn calls_follow_the_step_order_as_root() {
    let sys = Record::new(0);
    let s = spec(SandboxMode::Enforce);
    let c = confine(&sys, &s);
    let names = sys.names();
    let milestones = [
        "setrlimit",
        "unshare",
        "loopback_up",
        "sethostname",
        "pivot_root",
        "idmapped_bind",
        "umount_detach",
        "capbset_drop",
        "setgroups_empty",
        "setresgid",
        "setresuid",
        "landlock_restrict",
        "clear_ambient",
        "capset_clear",
        "set_no_new_privs",
        "seccomp_install",
    ];
    let at: Vec<Option<usize>> = milestones.iter().map(|m| first(&names, m)).collect();
    assert!(
        at.iter().all(Option::is_some),
        "{milestones:?} {at:?} in {names:?}"
    );
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?} in {names:?}");
    // Root needs no user namespace of its own: one unshare, no id maps.
    assert_eq!(names.iter().filter(|n| **n == "unshare").count(), 1, "{names:?}");
    assert!(first(&names, "write_id_map").is_none(), "{names:?}");
    // Seccomp is the last thing done.
    assert_eq!(names.last(), Some(&"seccomp_install"));
    assert!(!c.refuses(), "{:?}", c.layers);
}

#[test]
fn calls_follow_the_step_order_as_non_root() {
    let sys = Record::new(1001);
    let s = spec(SandboxMode::Enforce);
    let c = confine(&sys, &s);
    let names = sys.names();
    let milestones = [
        "setrlimit",
        "unshare",
        "write_id_map",
        "pivot_root",
        "umount_detach",
        "landlock_restrict",
        "clear_ambient",
        "capset_clear",
        "seccomp_install",
    ];
    let at: Vec<Option<usize>> = milestones.iter().map(|m| first(&names, m)).collect();
    assert!(
        at.iter().all(Option::is_some),
        "{milestones:?} {at:?} in {names:?}"
    );
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?} in {names:?}");
    // Not root: the user namespace first, its maps, then the others; the
    // uid stays the host's and nothing is idmapped.
    let calls = sys.calls.borrow();
    assert_eq!(
        calls[first(&names, "unshare").unwrap_or(0)].1,
        format!("{:#x}", libc::CLONE_NEWUSER)
    );
    for absent in ["setresuid", "setresgid", "idmap_userns", "idmapped_bind"] {
        assert!(first(&names, absent).is_none(), "{absent} in {names:?}");
    }
    let uid = c.layers.iter().find(|l| l.name == "uid").expect("uid layer");
    assert!(uid.enforced && uid.detail.contains("1001"), "{uid:?}");
    assert!(!c.refuses(), "{:?}", c.layers);
}

/// `(euid, failing call, layer reported missing)`.
const FAILURES: &[(u32, &str, &str)] = &[
    (0, "setrlimit", "rlimits"),
    (0, "unshare", "pidns"),
    (0, "unshare", "mountns"),
    (0, "mount", "mountns"),
    (0, "mount", "rootfs"),
    (0, "make_dir", "rootfs"),
    (0, "pivot_root", "rootfs"),
    (0, "umount_detach", "rootfs"),
    (0, "remove_dir", "rootfs"),
    (0, "mount_flags", "rootfs"),
    (0, "idmap_userns", "uid"),
    (0, "idmapped_bind", "uid"),
    (0, "setgroups_empty", "uid"),
    (0, "setresgid", "uid"),
    (0, "setresuid", "uid"),
    (0, "landlock_restrict", "landlock"),
    (0, "capbset_read", "capabilities"),
    (0, "capbset_drop", "capabilities"),
    (0, "capset_clear", "capabilities"),
    (0, "seccomp_install", "seccomp"),
    (1001, "setrlimit", "rlimits"),
    (1001, "unshare", "userns"),
    (1001, "unshare", "netns"),
    (1001, "write_id_map", "userns"),
    (1001, "mount", "rootfs"),
    (1001, "pivot_root", "rootfs"),
    (1001, "landlock_restrict", "landlock"),
    (1001, "capbset_read", "capabilities"),
    (1001, "capset_clear", "capabilities"),
    (1001, "seccomp_install", "seccomp"),
];

#[test]
fn every_failing_call_reports_its_layer_enforce_refuses_and_auto_goes_on() {
    for &(euid, call, layer) in FAILURES {
        for mode in [SandboxMode::Enforce, SandboxMode::Auto] {
            let sys = Record::failing(euid, &[call]);
            let s = spec(mode);
            let c = confine(&sys, &s);
            let l = c.layers.iter().find(|l| l.name == layer);
            assert!(
                l.is_some_and(|l| !l.enforced && !l.optional),
                "euid {euid}, {call} failing: {layer} should be missing: {:?}",
                c.layers
            );
            assert_eq!(
                c.refuses(),
                mode == SandboxMode::Enforce,
                "euid {euid}, {call}, {mode:?}"
            );
            // Best-effort: every step still ran, up to seccomp, the last.
            let names = sys.names();
            assert!(
                first(&names, "seccomp_install").is_some(),
                "euid {euid}, {call}: {names:?}"
            );
            if call != "seccomp_install" {
                let sc = c.layers.iter().find(|l| l.name == "seccomp");
                assert!(
                    sc.is_some_and(|l| l.enforced),
                    "euid {euid}, {call}: {:?}",
                    c.layers
                );
            }
        }
    }
}

#[test]
fn nothing_failing_reports_no_missing_layer() {
    for euid in [0, 1001] {
        let sys = Record::new(euid);
        let s = spec(SandboxMode::Enforce);
        let c = confine(&sys, &s);
        let missing: Vec<_> = c.layers.iter().filter(|l| !l.enforced && !l.optional).collect();
        assert!(missing.is_empty(), "euid {euid}: {missing:?}");
        let names: Vec<&str> = c.layers.iter().map(|l| l.name.as_str()).collect();
        for want in [
            "rlimits",
            "pidns",
            "netns",
            "mountns",
            "rootfs",
            "uid",
            "landlock",
            "capabilities",
            "seccomp",
        ] {
            assert!(names.contains(&want), "euid {euid}: {want} not in {names:?}");
        }
    }
}

#[test]
fn a_disabled_layer_makes_no_call() {
    let sys = Record::new(0);
    let mut s = spec(SandboxMode::Auto);
    s.disable = vec!["seccomp".into(), "landlock".into(), "rlimits".into()];
    let c = confine(&sys, &s);
    let names = sys.names();
    for absent in ["seccomp_install", "landlock_restrict", "setrlimit"] {
        assert!(first(&names, absent).is_none(), "{absent} in {names:?}");
    }
    for l in ["seccomp", "landlock", "rlimits"] {
        let l = c.layers.iter().find(|x| x.name == l).expect("layer");
        assert!(!l.enforced && l.detail.contains("disabled"), "{l:?}");
    }
}
