//! cgroup v1: one group per kernel in each controller's hierarchy, below
//! the host's own group there (`<own>/cellhost/<name>`), so the host's own
//! limits keep applying to its kernels. Making groups needs write access to
//! the host's group: root, on a host without a delegating manager.

use std::fs;
use std::path::{Path, PathBuf};

use super::layout::Layout;
use super::v2::cpu_quota;
use super::{Applied, CgroupError, CgroupLimits, Groups, MissingLimit, io_err, read_counter, write};

/// One kernel's v1 groups: `(controller, directory)`; controllers mounted
/// together (`cpu,cpuacct`) share a directory.
#[derive(Debug, Default)]
pub struct V1Groups {
    groups: Vec<(&'static str, PathBuf)>,
}

impl V1Groups {
    fn group(&mut self, layout: &Layout, controller: &'static str, name: &str) -> Result<PathBuf, String> {
        let m = layout
            .v1_for(controller)
            .ok_or_else(|| format!("no cgroup v1 hierarchy carries the {controller} controller"))?;
        let dir = m.own_group.join("cellhost").join(name);
        if !self.groups.iter().any(|(_, d)| *d == dir) {
            fs::create_dir_all(&dir).map_err(|e| {
                let mut why = io_err(&dir, e).to_string();
                if !rustix::process::geteuid().is_root() {
                    why.push_str(" (cgroup v1 groups are made by root only)");
                }
                why
            })?;
        }
        self.groups.push((controller, dir.clone()));
        Ok(dir)
    }

    /// Makes the groups the limits need and writes the limits; a limit that
    /// cannot be set is a [`MissingLimit`].
    pub fn create(
        layout: &Layout,
        name: &str,
        limits: &CgroupLimits,
    ) -> (V1Groups, Vec<Applied>, Vec<MissingLimit>) {
        let mut g = V1Groups::default();
        let mut applied = Vec::new();
        let mut missing = Vec::new();
        let mut run = |g: &mut V1Groups,
                       layer: &'static str,
                       ctrl: &'static str,
                       f: &dyn Fn(&PathBuf) -> Result<String, CgroupError>| {
            match g.group(layout, ctrl, name) {
                Ok(dir) => match f(&dir) {
                    Ok(what) => applied.push(Applied(what)),
                    Err(e) => missing.push(MissingLimit::new(layer, e.to_string())),
                },
                Err(why) => missing.push(MissingLimit::new(layer, why)),
            }
        };
        if let Some(n) = limits.pids_max {
            run(&mut g, "cgroup.pids", "pids", &|d| {
                write(&d.join("pids.max"), &n.to_string()).map(|()| format!("pids.max {n}"))
            });
        }
        if let Some(bytes) = limits.memory_bytes {
            run(&mut g, "cgroup.memory", "memory", &|d| {
                write(&d.join("memory.limit_in_bytes"), &bytes.to_string())?;
                // Same cap for memory + swap, where swap accounting is on.
                let memsw = fs::write(d.join("memory.memsw.limit_in_bytes"), bytes.to_string()).is_ok();
                Ok(format!(
                    "memory.limit_in_bytes {} MiB{}",
                    bytes >> 20,
                    if memsw { " (memory + swap)" } else { "" }
                ))
            });
        }
        if let Some(cores) = limits.cpu_cores {
            run(&mut g, "cgroup.cpu", "cpu", &|d| {
                let (quota, period) = cpu_quota(cores);
                write(&d.join("cpu.cfs_period_us"), &period.to_string())?;
                write(&d.join("cpu.cfs_quota_us"), &quota.to_string())?;
                Ok(format!("cpu.cfs_quota_us {quota}/{period} ({cores} cores)"))
            });
        }
        (g, applied, missing)
    }

    fn dir_of(&self, controller: &str) -> Option<&PathBuf> {
        self.groups.iter().find(|(c, _)| *c == controller).map(|(_, d)| d)
    }
}

impl Groups for V1Groups {
    fn views(&self) -> Vec<crate::profile::CgroupView> {
        let mut out: Vec<crate::profile::CgroupView> = Vec::new();
        for (controller, dir) in &self.groups {
            let view = Path::new("/sys/fs/cgroup").join(controller);
            if !out.iter().any(|v| v.view == view) {
                out.push(crate::profile::CgroupView {
                    host: dir.clone(),
                    view,
                });
            }
        }
        out
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs().iter().map(|d| d.join("cgroup.procs")).collect()
    }

    fn dirs(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.groups.iter().map(|(_, d)| d.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    fn kill_tree(&self) -> bool {
        false
    }

    fn pids_limit_hits(&self) -> u64 {
        self.dir_of("pids")
            .map_or(0, |d| read_counter(&d.join("pids.events"), "max"))
    }

    fn oom_kills(&self) -> u64 {
        self.dir_of("memory")
            .map_or(0, |d| read_counter(&d.join("memory.oom_control"), "oom_kill"))
    }

    fn pids_max(&self) -> Option<u64> {
        self.dir_of("pids")
            .and_then(|d| fs::read_to_string(d.join("pids.max")).ok())
            .and_then(|t| t.trim().parse().ok())
    }

    fn remove(&mut self) {
        for d in self.dirs() {
            let _ = fs::remove_dir(&d);
        }
        self.groups.clear();
    }
}
