//! Per-kernel control groups: process, memory and CPU limits, and an exact
//! list of every process of a kernel's tree.
//!
//! cgroup v2 is used where the unified hierarchy has the controllers
//! (`cgroup.controllers` lists `pids`/`memory`); otherwise the v1
//! hierarchies under `/sys/fs/cgroup/{pids,memory,cpu}` (this project's
//! machines have v1: no `memory.max`, but `memory.limit_in_bytes` and
//! `pids.max`). A kernel's groups are made *below the host's own group* in
//! each hierarchy, so the host's own limits keep applying to its kernels.
//!
//! The kernel init joins the groups (writes `0` to each `cgroup.procs`)
//! before it forks Python, so every descendant is inside from the start.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

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

/// Where a controller lives on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// `pids`, `memory`, `cpu`.
    pub controller: &'static str,
    /// Directory of the host's own group in that hierarchy.
    pub host_group: PathBuf,
    /// The hierarchy is cgroup v2.
    pub v2: bool,
}

fn own_group(hierarchy_id_match: impl Fn(&str, &str) -> bool) -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let id = parts.next()?;
        let ctrls = parts.next()?;
        let path = parts.next()?;
        hierarchy_id_match(id, ctrls).then(|| path.to_string())
    })
}

/// Finds the hierarchy for `controller`, or says why there is none.
pub fn hierarchy(controller: &'static str) -> Result<Hierarchy, CgroupError> {
    let unified_roots = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];
    for root in unified_roots {
        let ctrl_file = Path::new(root).join("cgroup.controllers");
        if let Ok(ctrls) = fs::read_to_string(&ctrl_file)
            && ctrls.split_whitespace().any(|c| c == controller)
            && let Some(rel) = own_group(|id, ctrls| id == "0" && ctrls.is_empty())
        {
            return Ok(Hierarchy {
                controller,
                host_group: Path::new(root).join(rel.trim_start_matches('/')),
                v2: true,
            });
        }
    }
    let v1_root = Path::new("/sys/fs/cgroup").join(controller);
    if v1_root.join("cgroup.procs").exists() {
        let rel =
            own_group(|_, ctrls| ctrls.split(',').any(|c| c == controller)).unwrap_or_else(|| "/".into());
        return Ok(Hierarchy {
            controller,
            host_group: v1_root.join(rel.trim_start_matches('/')),
            v2: false,
        });
    }
    Err(CgroupError::Unavailable {
        controller,
        reason: "no cgroup v2 hierarchy lists it and /sys/fs/cgroup/<controller> is not a v1 hierarchy"
            .into(),
    })
}

/// The groups of one kernel.
#[derive(Debug)]
pub struct KernelCgroup {
    groups: Vec<(Hierarchy, PathBuf)>,
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|e| io_err(path, e))
}

impl KernelCgroup {
    /// Makes `cellhost/<name>` below the host's group in each hierarchy a
    /// limit needs, and sets the limits.
    ///
    /// # Errors
    /// [`CgroupError::Unavailable`] when a needed controller is missing,
    /// [`CgroupError::Io`] when a group cannot be made or a limit written
    /// (not root, read-only cgroupfs).
    pub fn create(name: &str, limits: &CgroupLimits) -> Result<Self, CgroupError> {
        let mut cg = KernelCgroup { groups: Vec::new() };
        let mut add = |controller: &'static str| -> Result<PathBuf, CgroupError> {
            let h = hierarchy(controller)?;
            if let Some((_, dir)) = cg.groups.iter().find(|(x, _)| x.host_group == h.host_group) {
                return Ok(dir.clone());
            }
            let dir = h.host_group.join("cellhost").join(name);
            fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
            cg.groups.push((h, dir.clone()));
            Ok(dir)
        };
        let result = (|| {
            if let Some(n) = limits.pids_max {
                let dir = add("pids")?;
                write(&dir.join("pids.max"), &n.to_string())?;
            }
            if let Some(bytes) = limits.memory_bytes {
                let dir = add("memory")?;
                if dir.join("memory.max").exists() {
                    write(&dir.join("memory.max"), &bytes.to_string())?;
                    let _ = fs::write(dir.join("memory.swap.max"), "0");
                } else {
                    write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                    // Same cap for memory + swap, where swap accounting is on.
                    let _ = fs::write(dir.join("memory.memsw.limit_in_bytes"), bytes.to_string());
                }
            }
            if let Some(cores) = limits.cpu_cores {
                let dir = add("cpu")?;
                let period: u64 = 100_000;
                let quota = ((cores.max(0.01)) * period as f64) as u64;
                if dir.join("cpu.max").exists() {
                    write(&dir.join("cpu.max"), &format!("{quota} {period}"))?;
                } else {
                    write(&dir.join("cpu.cfs_period_us"), &period.to_string())?;
                    write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(cg),
            Err(e) => {
                cg.remove();
                Err(e)
            }
        }
    }

    /// The kernel's groups as the kernel sees them read-only: each group
    /// at its hierarchy's mount point (`/sys/fs/cgroup/<controller>` on
    /// v1, `/sys/fs/cgroup` on v2), which is where joblib/loky, the JVM
    /// and Go read their CPU and memory quota (the kernel's cgroup
    /// namespace makes `/proc/self/cgroup` say `/` for each).
    pub fn views(&self) -> Vec<crate::profile::CgroupView> {
        let mut out: Vec<crate::profile::CgroupView> = Vec::new();
        for (h, dir) in &self.groups {
            let view = if h.v2 {
                PathBuf::from("/sys/fs/cgroup")
            } else {
                Path::new("/sys/fs/cgroup").join(h.controller)
            };
            if !out.iter().any(|v| v.view == view) {
                out.push(crate::profile::CgroupView {
                    host: dir.clone(),
                    view,
                });
            }
        }
        out
    }

    /// The `cgroup.procs` files the kernel init must join.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.groups.iter().map(|(_, d)| d.join("cgroup.procs")).collect()
    }

    /// Every process in the kernel's groups.
    pub fn pids(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self
            .groups
            .iter()
            .filter_map(|(_, d)| fs::read_to_string(d.join("cgroup.procs")).ok())
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

    /// SIGKILLs every process in the groups, repeating until none is left
    /// or `rounds` sweeps were made. Returns the signals sent.
    pub fn kill_all(&self, rounds: usize) -> usize {
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

    fn counter(&self, controller: &str, file_v1: &str, file_v2: &str, key: &str) -> u64 {
        self.groups
            .iter()
            .filter(|(h, _)| h.controller == controller)
            .filter_map(|(h, d)| fs::read_to_string(d.join(if h.v2 { file_v2 } else { file_v1 })).ok())
            .flat_map(|t| {
                t.lines()
                    .filter_map(|l| {
                        let mut it = l.split_whitespace();
                        (it.next()? == key)
                            .then(|| it.next()?.parse::<u64>().ok())
                            .flatten()
                    })
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// Times a fork failed because the process limit was reached.
    pub fn pids_limit_hits(&self) -> u64 {
        self.counter("pids", "pids.events", "pids.events", "max")
    }

    /// Processes the out-of-memory killer killed in the group.
    pub fn oom_kills(&self) -> u64 {
        self.counter("memory", "memory.oom_control", "memory.events", "oom_kill")
    }

    /// The process limit, if one is set.
    pub fn pids_max(&self) -> Option<u64> {
        self.groups
            .iter()
            .find(|(h, _)| h.controller == "pids")
            .and_then(|(_, d)| fs::read_to_string(d.join("pids.max")).ok())
            .and_then(|t| t.trim().parse().ok())
    }

    /// Removes the groups (they must be empty: call after the tree is reaped).
    pub fn remove(&mut self) {
        for (_, dir) in self.groups.drain(..) {
            let _ = fs::remove_dir(&dir);
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

    #[test]
    fn creates_and_removes_a_pids_group_when_root() {
        let Ok(h) = hierarchy("pids") else {
            eprintln!("skipped: no pids controller here");
            return;
        };
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
                let dir = h.host_group.join("cellhost").join(&name);
                assert!(dir.is_dir());
                cg.remove();
                assert!(!dir.exists());
            }
            Err(e) => eprintln!("skipped: cannot create cgroups here: {e}"),
        }
    }
}
