//! Per-kernel control groups: process, memory and CPU limits, an exact
//! list of every process of a kernel's tree, and the whole-tree kill.
//!
//! [`layout`] tells v1, v2 and hybrid hosts apart from `/proc/self/mountinfo`
//! and `/proc/self/cgroup`. Two implementations of one kernel's groups
//! ([`Groups`]):
//! * [`v2`] where the unified hierarchy has the controllers: as root a
//!   `cellhost` subtree at the hierarchy's root; as another user a subtree
//!   delegated by systemd ([`systemd`]: a transient user scope with
//!   `Delegate=yes` that adopts the host). `memory.max`, `memory.swap.max`,
//!   `memory.oom.group`, `pids.max`, `cpu.max`; `cgroup.kill` for the tree.
//! * [`v1`] otherwise: the controller hierarchies, below the host's own
//!   group in each; on a hybrid host also a plain v2 group beside them for
//!   `cgroup.kill`.
//!
//! A limit that cannot be applied is a [`MissingLimit`] with a layer name
//! (`cgroup.memory`, `cgroup.swap`, `cgroup.pids`, `cgroup.cpu`) and the
//! reason; the kernel reports it as a missing sandbox layer.
//!
//! The kernel init joins the groups (writes `0` to each `cgroup.procs`)
//! before it forks Python, so every descendant is inside from the start;
//! [`join_on_exec`] does the same for a host tool that forks a kernel's
//! tree itself (`criu restore`).

mod join;
pub mod layout;
pub mod systemd;
pub mod v1;
pub mod v2;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use join::join_on_exec;
use layout::{Layout, Mode, Mount};
use v1::V1Groups;
use v2::{Subtree, V2Group};

/// Limits for one kernel's tree. `None` leaves a resource unlimited.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CgroupLimits {
    /// Most processes (and threads) at once (`pids.max`).
    pub pids_max: Option<u64>,
    /// Most memory in bytes (`memory.limit_in_bytes` / `memory.max`);
    /// swap is capped to the same total where the kernel allows it.
    pub memory_bytes: Option<u64>,
    /// CPU time as a number of cores (e.g. 1.0 = one core), via CFS quota.
    pub cpu_cores: Option<f64>,
}

impl CgroupLimits {
    /// No limit is set.
    pub fn is_empty(&self) -> bool {
        self.pids_max.is_none() && self.memory_bytes.is_none() && self.cpu_cores.is_none()
    }
}

/// A cgroup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No usable hierarchy offers the controller.
    #[error("cgroup controller {controller} is not available: {reason}")]
    Unavailable {
        /// `pids`, `memory` or `cpu`.
        controller: &'static str,
        /// Why.
        reason: String,
    },
    /// Not one of the limits could be set (each one's reason inside).
    #[error("no cgroup limit could be set ({hierarchy}): {}", missing.iter().map(|m| format!("{}: {}", m.layer, m.reason)).collect::<Vec<_>>().join("; "))]
    NotApplied {
        /// `v1`, `v2`, `hybrid`.
        hierarchy: &'static str,
        /// Every limit asked for, with why it is missing.
        missing: Vec<MissingLimit>,
    },
    /// A cgroup file could not be written.
    #[error("cgroup {path}: {source}")]
    Io {
        /// File or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path, source: io::Error) -> CgroupError {
    CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A limit the host could not apply to a kernel: a missing sandbox layer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MissingLimit {
    /// `cgroup.memory`, `cgroup.swap`, `cgroup.pids` or `cgroup.cpu`.
    pub layer: &'static str,
    /// Why (the file and the error, or the controller that is missing).
    pub reason: String,
}

impl MissingLimit {
    fn new(layer: &'static str, reason: impl Into<String>) -> Self {
        MissingLimit {
            layer,
            reason: reason.into(),
        }
    }
}

/// A limit in force, as written (`pids.max 512`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied(pub String);

/// What [`KernelCgroup::create`] set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupReport {
    /// The host's cgroup setup.
    pub mode: Mode,
    /// The kernel's group directories.
    pub dirs: Vec<PathBuf>,
    /// Where the v2 subtree came from (root of the hierarchy, a delegated
    /// group, a systemd scope); empty on v1.
    pub origin: String,
    /// Limits in force.
    pub applied: Vec<String>,
    /// Limits asked for that are not in force.
    pub missing: Vec<MissingLimit>,
    /// `cgroup.kill`, or a repeated SIGKILL sweep of `cgroup.procs`.
    pub tree_kill: &'static str,
}

impl CgroupReport {
    /// One line for the sandbox report: hierarchy, limits, tree kill.
    pub fn describe(&self) -> String {
        let mut s = format!("cgroup {}", self.mode.as_str());
        if let Some(d) = self.dirs.first() {
            s.push_str(&format!(" {}", d.display()));
        }
        if !self.origin.is_empty() {
            s.push_str(&format!(" ({})", self.origin));
        }
        s.push_str(": ");
        s.push_str(&self.applied.join(", "));
        s.push_str(&format!("; whole-tree kill: {}", self.tree_kill));
        s
    }
}

/// One kernel's groups in one cgroup version.
pub trait Groups: Send + Sync + std::fmt::Debug {
    /// The `cgroup.procs` files the kernel init joins.
    fn procs_files(&self) -> Vec<PathBuf>;
    /// The group directories.
    fn dirs(&self) -> Vec<PathBuf>;
    /// Kills the whole tree from the kernel side (`cgroup.kill`); `false`
    /// when this version or kernel has no such file.
    fn kill_tree(&self) -> bool;
    /// Times a fork failed at the process limit.
    fn pids_limit_hits(&self) -> u64;
    /// Processes the out-of-memory killer killed.
    fn oom_kills(&self) -> u64;
    /// The process limit, if set.
    fn pids_max(&self) -> Option<u64>;
    /// Removes the (empty) groups.
    fn remove(&mut self);
    /// The groups as the kernel sees them read-only: each at its
    /// hierarchy's mount point (`/sys/fs/cgroup/<controller>` on v1,
    /// `/sys/fs/cgroup` on v2), where joblib/loky, the JVM and Go read
    /// their CPU and memory quota (the kernel's cgroup namespace makes
    /// `/proc/self/cgroup` say `/` for each).
    fn views(&self) -> Vec<crate::profile::CgroupView>;
}

/// The value after `key` on its line of a flat-keyed file
/// (`pids.events`, `memory.events`, `memory.oom_control`); 0 if absent.
fn read_counter(path: &Path, key: &str) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let mut it = l.split_whitespace();
                (it.next()? == key).then(|| it.next()?.parse::<u64>().ok())?
            })
        })
        .unwrap_or(0)
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|e| io_err(path, e))
}

/// The v2 subtree of this process, made once: moving the host into a
/// delegated scope happens at most once per process.
static SUBTREE: OnceLock<Result<Subtree, String>> = OnceLock::new();

/// The unified hierarchy carries the controllers (v2 host, or a hybrid one
/// that moved them there).
fn v2_usable(u: &Mount) -> bool {
    let c = layout::v2_controllers(&u.mount_point);
    c.iter().any(|c| c == "memory" || c == "pids")
}

fn writable(p: &Path) -> bool {
    rustix::fs::access(p, rustix::fs::Access::WRITE_OK).is_ok()
}

/// A group delegated to this user: writable with its `cgroup.procs` and
/// `cgroup.subtree_control`, and marked as delegated by the manager that
/// made it (systemd sets the `trusted.delegate` or `user.delegate` extended
/// attribute on a `Delegate=yes` unit's group). A group that is merely
/// writable (any unit inside the user manager's own subtree) stays the
/// manager's: cellhost makes no groups in it.
fn delegated(group: &Path) -> bool {
    let marked = ["trusted.delegate", "user.delegate"].iter().any(|name| {
        let mut buf = [0u8; 8];
        rustix::fs::getxattr(group, *name, &mut buf).is_ok_and(|n| buf.get(..n) == Some(b"1".as_slice()))
    });
    marked
        && writable(group)
        && writable(&group.join("cgroup.procs"))
        && writable(&group.join("cgroup.subtree_control"))
}

/// Moves this process into `<base>/host`, so `base` holds no process and
/// may enable controllers for its children.
fn move_self_to_leaf(base: &Path) -> Result<(), String> {
    let leaf = base.join("host");
    fs::create_dir_all(&leaf).map_err(|e| io_err(&leaf, e).to_string())?;
    write(&leaf.join("cgroup.procs"), "0").map_err(|e| e.to_string())
}

fn make_subtree(u: &Mount) -> Result<Subtree, String> {
    if rustix::process::geteuid().is_root() {
        return Subtree::prepare(&u.mount_point, "root of the cgroup v2 hierarchy")
            .map_err(|e| e.to_string());
    }
    let uid = rustix::process::geteuid().as_raw();
    let (base, origin) = if delegated(&u.own_group) {
        (u.own_group.clone(), "the host's delegated group".to_string())
    } else {
        let unit = format!("cellhost-{}.scope", std::process::id());
        systemd::adopt_self(&unit).map_err(|e| {
            format!(
                "uid {uid} cannot write its group {} (not delegated) and no delegated scope could be made: {e}",
                u.own_group.display()
            )
        })?;
        let now = Layout::read();
        let own = now
            .unified
            .map(|m| m.own_group)
            .filter(|g| g.file_name().is_some_and(|n| n == unit.as_str()))
            .ok_or_else(|| format!("systemd started {unit} but this process is not in it"))?;
        if !writable(&own.join("cgroup.subtree_control")) {
            return Err(format!("{} is not delegated to uid {uid}", own.display()));
        }
        (own, format!("systemd user scope {unit}, Delegate=yes"))
    };
    move_self_to_leaf(&base)?;
    Subtree::prepare(&base, origin).map_err(|e| e.to_string())
}

/// The groups of one kernel.
#[derive(Debug)]
pub struct KernelCgroup {
    groups: Box<dyn Groups>,
    /// Hybrid host: a plain v2 group beside the v1 ones, for `cgroup.kill`.
    killer: Option<V2Group>,
    report: CgroupReport,
}

fn done(
    mode: Mode,
    groups: Box<dyn Groups>,
    killer: Option<V2Group>,
    origin: String,
    applied: Vec<Applied>,
    missing: Vec<MissingLimit>,
) -> Result<KernelCgroup, CgroupError> {
    let mut cg = KernelCgroup {
        report: CgroupReport {
            mode,
            dirs: groups.dirs(),
            origin,
            applied: applied.into_iter().map(|a| a.0).collect(),
            missing,
            tree_kill: "",
        },
        groups,
        killer,
    };
    let has_kill = cg
        .groups
        .dirs()
        .iter()
        .chain(cg.killer.iter().map(|k| &k.dir))
        .any(|d| d.join("cgroup.kill").exists())
        && mode != Mode::V1;
    cg.report.tree_kill = if has_kill {
        "cgroup.kill"
    } else {
        "SIGKILL sweep of cgroup.procs"
    };
    if cg.report.applied.is_empty() {
        let missing = std::mem::take(&mut cg.report.missing);
        cg.remove();
        return Err(CgroupError::NotApplied {
            hierarchy: mode.as_str(),
            missing,
        });
    }
    Ok(cg)
}

fn all_missing(limits: &CgroupLimits, reason: &str) -> Vec<MissingLimit> {
    let mut v = Vec::new();
    if limits.memory_bytes.is_some() {
        v.push(MissingLimit::new("cgroup.memory", reason));
    }
    if limits.pids_max.is_some() {
        v.push(MissingLimit::new("cgroup.pids", reason));
    }
    if limits.cpu_cores.is_some() {
        v.push(MissingLimit::new("cgroup.cpu", reason));
    }
    v
}

impl KernelCgroup {
    /// Makes the kernel's group `name` where this host keeps its groups
    /// (see the module docs) and sets the limits. A limit that cannot be
    /// set is listed in [`KernelCgroup::report`]`.missing`.
    ///
    /// # Errors
    /// [`CgroupError::NotApplied`] when not one limit could be set,
    /// [`CgroupError::Unavailable`] without any cgroup hierarchy.
    pub fn create(name: &str, limits: &CgroupLimits) -> Result<Self, CgroupError> {
        let layout = Layout::read();
        match &layout.unified {
            Some(u) if v2_usable(u) => match SUBTREE.get_or_init(|| make_subtree(u)) {
                Ok(sub) => Self::in_subtree(sub, layout.mode, name, limits),
                Err(why) => Err(CgroupError::NotApplied {
                    hierarchy: layout.mode.as_str(),
                    missing: all_missing(limits, why),
                }),
            },
            _ if !layout.v1.is_empty() => Self::in_v1(&layout, name, limits),
            _ => Err(CgroupError::Unavailable {
                controller: "memory",
                reason:
                    "no cgroup hierarchy is mounted (/proc/self/mountinfo lists neither cgroup nor cgroup2)"
                        .into(),
            }),
        }
    }

    /// The kernel's group `name` in a prepared v2 subtree.
    ///
    /// # Errors
    /// As [`KernelCgroup::create`]; [`CgroupError::Io`] when the group
    /// cannot be made.
    pub fn in_subtree(
        sub: &Subtree,
        mode: Mode,
        name: &str,
        limits: &CgroupLimits,
    ) -> Result<Self, CgroupError> {
        let (g, applied, missing) = sub.create(name, limits)?;
        done(mode, Box::new(g), None, sub.origin.clone(), applied, missing)
    }

    /// The kernel's groups `name` in the v1 hierarchies of `layout` (and on
    /// a hybrid host a plain v2 group for `cgroup.kill`, where writable).
    ///
    /// # Errors
    /// As [`KernelCgroup::create`].
    pub fn in_v1(layout: &Layout, name: &str, limits: &CgroupLimits) -> Result<Self, CgroupError> {
        let (g, applied, missing) = V1Groups::create(layout, name, limits);
        let killer = match (&layout.unified, applied.is_empty()) {
            (Some(u), false) => V2Group::plain(u.own_group.join("cellhost").join(name)).ok(),
            _ => None,
        };
        done(layout.mode, Box::new(g), killer, String::new(), applied, missing)
    }

    /// What was set up, and what is missing.
    pub fn report(&self) -> &CgroupReport {
        &self.report
    }

    /// The kernel's groups as the kernel sees them read-only
    /// ([`Groups::views`]).
    pub fn views(&self) -> Vec<crate::profile::CgroupView> {
        // The hybrid host's plain v2 group has no controllers, hence no
        // quota to read: not shown.
        self.groups.views()
    }

    /// The `cgroup.procs` files the kernel init must join.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        let mut v = self.groups.procs_files();
        v.extend(self.killer.iter().flat_map(Groups::procs_files));
        v
    }

    /// Every process in the kernel's groups.
    pub fn pids(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self
            .procs_files()
            .iter()
            .filter_map(|f| fs::read_to_string(f).ok())
            .flat_map(|t| {
                t.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Kills every process in the groups: through `cgroup.kill` where the
    /// kernel has it (atomic against forks), else SIGKILL to every listed
    /// process, repeated until none is left or `rounds` sweeps were made.
    /// Returns the processes signalled.
    pub fn kill_all(&self, rounds: usize) -> usize {
        let listed = self.pids().len();
        if listed > 0 && (self.groups.kill_tree() || self.killer.as_ref().is_some_and(Groups::kill_tree)) {
            return listed;
        }
        let mut sent = 0;
        for _ in 0..rounds {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            for p in pids {
                if crate::signal::kill(p, libc::SIGKILL).is_ok() {
                    sent += 1;
                }
            }
        }
        sent
    }

    /// Times a fork failed because the process limit was reached.
    pub fn pids_limit_hits(&self) -> u64 {
        self.groups.pids_limit_hits()
    }

    /// Processes the out-of-memory killer killed in the group.
    pub fn oom_kills(&self) -> u64 {
        self.groups.oom_kills()
    }

    /// The process limit, if one is set.
    pub fn pids_max(&self) -> Option<u64> {
        self.groups.pids_max()
    }

    /// Removes the groups (they must be empty: call after the tree is reaped).
    pub fn remove(&mut self) {
        self.groups.remove();
        if let Some(k) = self.killer.as_mut() {
            k.remove();
        }
    }
}

impl Drop for KernelCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn empty_limits_are_empty() {
        assert!(CgroupLimits::default().is_empty());
        assert!(
            !CgroupLimits {
                pids_max: Some(1),
                ..Default::default()
            }
            .is_empty()
        );
    }

    fn all_limits() -> CgroupLimits {
        CgroupLimits {
            pids_max: Some(512),
            memory_bytes: Some(4 << 30),
            cpu_cores: Some(0.5),
        }
    }

    /// A v2 group as cgroupfs shows it: the controllers it offers and an
    /// empty `cgroup.subtree_control`.
    fn fake_v2_group(dir: &Path, controllers: &str) {
        fs::create_dir_all(dir).expect("mkdir");
        fs::write(dir.join("cgroup.controllers"), controllers).expect("controllers");
        fs::write(dir.join("cgroup.subtree_control"), "").expect("subtree_control");
        fs::write(dir.join("cgroup.procs"), "").expect("procs");
    }

    fn read(p: &Path) -> String {
        fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn v2_subtree_writes_every_limit_and_oom_group() {
        let t = tempfile::tempdir().expect("tempdir");
        let base = t.path().join("user@1000.service/app.slice/cellhost-9.scope");
        fake_v2_group(&base, "cpuset cpu io memory pids\n");
        let sub = Subtree::prepare(&base, "test scope").expect("prepare");
        assert_eq!(sub.enabled, vec!["memory", "pids", "cpu"]);
        assert!(sub.refused.is_empty(), "{:?}", sub.refused);
        // Controllers are enabled one by one, in the base and in cellhost/.
        assert_eq!(read(&base.join("cgroup.subtree_control")), "+cpu");
        assert_eq!(read(&base.join("cellhost/cgroup.subtree_control")), "+cpu");
        let mut cg = KernelCgroup::in_subtree(&sub, Mode::V2, "s1-g0-abc", &all_limits()).expect("create");
        let dir = base.join("cellhost/s1-g0-abc");
        assert_eq!(read(&dir.join("memory.max")), (4u64 << 30).to_string());
        assert_eq!(read(&dir.join("memory.swap.max")), "0");
        assert_eq!(read(&dir.join("memory.oom.group")), "1");
        assert_eq!(read(&dir.join("pids.max")), "512");
        assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
        assert_eq!(cg.pids_max(), Some(512));
        assert_eq!(cg.procs_files(), vec![dir.join("cgroup.procs")]);
        let r = cg.report();
        assert!(r.missing.is_empty(), "{:?}", r.missing);
        assert_eq!(r.dirs, vec![dir.clone()]);
        assert!(
            r.applied.contains(&"memory.max 4096 MiB".to_string()),
            "{:?}",
            r.applied
        );
        assert!(r.describe().starts_with("cgroup v2 "), "{}", r.describe());
        // Counters come from the v2 event files.
        fs::write(dir.join("pids.events"), "max 3\n").expect("events");
        fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n",
        )
        .expect("events");
        assert_eq!(cg.pids_limit_hits(), 3);
        assert_eq!(cg.oom_kills(), 1);
        // The fake group holds files, so removal leaves it; a real cgroupfs
        // directory goes with its rmdir.
        for f in [
            "memory.max",
            "memory.swap.max",
            "memory.oom.group",
            "pids.max",
            "cpu.max",
            "pids.events",
            "memory.events",
        ] {
            fs::remove_file(dir.join(f)).expect("rm");
        }
        cg.remove();
        assert!(!dir.exists());
    }

    #[test]
    fn v2_controller_not_delegated_is_a_named_missing_layer() {
        let t = tempfile::tempdir().expect("tempdir");
        // A user scope whose delegation has memory and pids, not cpu.
        fake_v2_group(t.path(), "memory pids");
        let sub = Subtree::prepare(t.path(), "test").expect("prepare");
        assert_eq!(sub.enabled, vec!["memory", "pids"]);
        let cg = KernelCgroup::in_subtree(&sub, Mode::V2, "k", &all_limits()).expect("create");
        let m = &cg.report().missing;
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m[0].layer, "cgroup.cpu");
        assert!(m[0].reason.contains("cgroup.controllers"), "{}", m[0].reason);
        assert!(t.path().join("cellhost/k/memory.max").exists());
        assert!(!t.path().join("cellhost/k/cpu.max").exists());
    }

    #[test]
    fn v2_without_controllers_applies_nothing_and_says_why() {
        let t = tempfile::tempdir().expect("tempdir");
        fake_v2_group(t.path(), "");
        let sub = Subtree::prepare(t.path(), "test").expect("prepare");
        let limits = CgroupLimits {
            pids_max: Some(5),
            memory_bytes: Some(1 << 20),
            cpu_cores: None,
        };
        match KernelCgroup::in_subtree(&sub, Mode::V2, "k", &limits) {
            Err(CgroupError::NotApplied { hierarchy, missing }) => {
                assert_eq!(hierarchy, "v2");
                let layers: Vec<_> = missing.iter().map(|m| m.layer).collect();
                assert_eq!(layers, vec!["cgroup.pids", "cgroup.memory"]);
            }
            other => panic!("{other:?}"),
        }
        // The group it could not use is gone again.
        assert!(!t.path().join("cellhost/k").exists());
    }

    #[test]
    fn no_delegation_names_every_limit_missing() {
        let m = all_missing(&all_limits(), "uid 1000 cannot write its group");
        let layers: Vec<_> = m.iter().map(|m| m.layer).collect();
        assert_eq!(layers, vec!["cgroup.memory", "cgroup.pids", "cgroup.cpu"]);
        let e = CgroupError::NotApplied {
            hierarchy: "v2",
            missing: m,
        };
        assert!(
            e.to_string()
                .contains("cgroup.cpu: uid 1000 cannot write its group"),
            "{e}"
        );
    }

    /// A real child, listed in a fake group's `cgroup.procs`.
    fn sleeper() -> std::process::Child {
        Command::new("sleep").arg("600").spawn().expect("sleep")
    }

    #[test]
    fn tree_kill_uses_cgroup_kill_where_the_group_has_it() {
        let t = tempfile::tempdir().expect("tempdir");
        fake_v2_group(t.path(), "pids");
        let sub = Subtree::prepare(t.path(), "test").expect("prepare");
        let limits = CgroupLimits {
            pids_max: Some(5),
            ..Default::default()
        };
        let dir = t.path().join("cellhost/k");
        fake_v2_group(&dir, "");
        fs::write(dir.join("cgroup.kill"), "").expect("kill file");
        let mut child = sleeper();
        fs::write(dir.join("cgroup.procs"), format!("{}\n", child.id())).expect("procs");
        let cg = KernelCgroup::in_subtree(&sub, Mode::V2, "k", &limits).expect("create");
        assert_eq!(cg.report().tree_kill, "cgroup.kill");
        assert_eq!(cg.pids(), vec![child.id() as i32]);
        assert_eq!(cg.kill_all(3), 1);
        // The kernel's side of the kill is the write; the fake group has
        // no kernel behind it, so the child lives on.
        assert_eq!(read(&dir.join("cgroup.kill")), "1");
        assert!(child.try_wait().expect("try_wait").is_none());
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn tree_kill_falls_back_to_the_sweep_without_cgroup_kill() {
        use std::os::unix::process::ExitStatusExt;
        let t = tempfile::tempdir().expect("tempdir");
        fake_v2_group(t.path(), "pids");
        let sub = Subtree::prepare(t.path(), "test").expect("prepare");
        let limits = CgroupLimits {
            pids_max: Some(5),
            ..Default::default()
        };
        let dir = t.path().join("cellhost/k");
        fake_v2_group(&dir, "");
        let mut child = sleeper();
        fs::write(dir.join("cgroup.procs"), format!("{}\n", child.id())).expect("procs");
        let cg = KernelCgroup::in_subtree(&sub, Mode::V2, "k", &limits).expect("create");
        assert_eq!(cg.report().tree_kill, "SIGKILL sweep of cgroup.procs");
        assert!(cg.kill_all(2) >= 1);
        let st = child.wait().expect("wait");
        assert_eq!(st.signal(), Some(libc::SIGKILL));
    }

    fn fake_v1(root: &Path, with_unified: bool) -> Layout {
        let mount = |ctrl: &str| {
            let mp = root.join(ctrl);
            Mount {
                own_group: mp.join("process_api/abc"),
                mount_point: mp,
                controllers: ctrl.split(',').map(str::to_string).collect(),
            }
        };
        let unified = with_unified.then(|| {
            let mp = root.join("unified");
            Mount {
                own_group: mp.clone(),
                mount_point: mp,
                controllers: Vec::new(),
            }
        });
        Layout {
            mode: if with_unified { Mode::Hybrid } else { Mode::V1 },
            unified,
            v1: vec![mount("pids"), mount("memory")],
        }
    }

    #[test]
    fn v1_groups_sit_below_the_hosts_group_and_name_what_is_missing() {
        let t = tempfile::tempdir().expect("tempdir");
        let layout = fake_v1(t.path(), false);
        let cg = KernelCgroup::in_v1(&layout, "k1", &all_limits()).expect("create");
        let pids = t.path().join("pids/process_api/abc/cellhost/k1");
        let mem = t.path().join("memory/process_api/abc/cellhost/k1");
        assert_eq!(read(&pids.join("pids.max")), "512");
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), (4u64 << 30).to_string());
        let files = cg.procs_files();
        assert!(
            files.contains(&pids.join("cgroup.procs")) && files.contains(&mem.join("cgroup.procs")),
            "{files:?}"
        );
        let m = &cg.report().missing;
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m[0].layer, "cgroup.cpu");
        assert!(
            m[0].reason
                .contains("no cgroup v1 hierarchy carries the cpu controller"),
            "{}",
            m[0].reason
        );
        assert_eq!(cg.report().tree_kill, "SIGKILL sweep of cgroup.procs");
        fs::write(pids.join("pids.events"), "max 4\n").expect("events");
        fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .expect("oom");
        assert_eq!(cg.pids_limit_hits(), 4);
        assert_eq!(cg.oom_kills(), 2);
    }

    #[test]
    fn hybrid_host_adds_a_plain_v2_group_for_the_tree_kill() {
        let t = tempfile::tempdir().expect("tempdir");
        let layout = fake_v1(t.path(), true);
        let limits = CgroupLimits {
            pids_max: Some(8),
            ..Default::default()
        };
        let cg = KernelCgroup::in_v1(&layout, "k2", &limits).expect("create");
        let plain = t.path().join("unified/cellhost/k2");
        assert!(plain.is_dir());
        assert!(cg.procs_files().contains(&plain.join("cgroup.procs")));
        // A real v2 group has cgroup.kill (Linux 5.14+); this fake one
        // does not, so the sweep stays the method.
        assert_eq!(cg.report().tree_kill, "SIGKILL sweep of cgroup.procs");
        assert_eq!(cg.report().mode, Mode::Hybrid);
    }

    #[test]
    fn creates_and_removes_a_group_on_this_host_when_root() {
        let name = format!("unit-{}", std::process::id());
        match KernelCgroup::create(
            &name,
            &CgroupLimits {
                pids_max: Some(7),
                ..Default::default()
            },
        ) {
            Ok(mut cg) => {
                assert_eq!(cg.pids_max(), Some(7));
                assert!(cg.pids().is_empty());
                let dirs = cg.report().dirs.clone();
                assert!(
                    dirs.iter()
                        .all(|d| d.is_dir() && d.ends_with(format!("cellhost/{name}"))),
                    "{dirs:?}"
                );
                cg.remove();
                assert!(dirs.iter().all(|d| !d.exists()));
            }
            Err(e) => eprintln!("skipped: cannot create cgroups here: {e}"),
        }
    }
}
