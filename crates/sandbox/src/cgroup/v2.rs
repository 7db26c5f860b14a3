//! cgroup v2: a cellhost subtree (`<base>/cellhost`) with the controllers
//! enabled down to it, and one group per kernel below it with
//! `memory.max`, `memory.swap.max`, `memory.oom.group`, `pids.max` and
//! `cpu.max`; `cgroup.kill` ends a kernel's whole tree at once.
//!
//! `<base>` is the hierarchy's root for root (exempt from the rule that a
//! group with processes cannot enable controllers for its children, like
//! container runtimes' cgroupfs driver), and a subtree delegated to the
//! user otherwise (see [`super::systemd`]), into whose `host` leaf the host
//! moved itself so the base holds no process.

use std::fs;
use std::path::{Path, PathBuf};

use super::layout::v2_controllers;
use super::{Applied, CgroupError, CgroupLimits, Groups, MissingLimit, io_err, read_counter, write};

/// Controllers cellhost uses, in the order they are enabled.
pub const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// A writable v2 subtree with the controllers that could be enabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subtree {
    /// The delegated (or root) group; kernels go to `<base>/cellhost/<name>`.
    pub base: PathBuf,
    /// Controllers enabled for the kernels' groups.
    pub enabled: Vec<&'static str>,
    /// Per controller that could not be enabled: why.
    pub refused: Vec<(&'static str, String)>,
    /// How the base was obtained (for the report).
    pub origin: String,
}

/// Enables `ctrls` in `group`'s `cgroup.subtree_control`, one at a time
/// (one refused controller does not keep the others out). Returns the
/// enabled ones and the refused ones with the reason.
fn enable(group: &Path, ctrls: &[&'static str]) -> (Vec<&'static str>, Vec<(&'static str, String)>) {
    let file = group.join("cgroup.subtree_control");
    let mut on = Vec::new();
    let mut off = Vec::new();
    for c in ctrls {
        match fs::write(&file, format!("+{c}")) {
            Ok(()) => on.push(*c),
            Err(e) => {
                let why = if e.raw_os_error() == Some(libc::EBUSY) {
                    format!(
                        "{}: {e} (the group holds processes, so it cannot enable controllers for its children)",
                        file.display()
                    )
                } else {
                    format!("{}: {e}", file.display())
                };
                off.push((*c, why));
            }
        }
    }
    (on, off)
}

impl Subtree {
    /// Makes `<base>/cellhost` and enables every controller of
    /// [`CONTROLLERS`] that `<base>/cgroup.controllers` offers in `base`
    /// and in `<base>/cellhost`.
    ///
    /// # Errors
    /// [`CgroupError::Io`] when `<base>/cellhost` cannot be made.
    pub fn prepare(base: &Path, origin: impl Into<String>) -> Result<Subtree, CgroupError> {
        let offered = v2_controllers(base);
        let mut refused = Vec::new();
        let mut want = Vec::new();
        for c in CONTROLLERS {
            if offered.iter().any(|o| o == c) {
                want.push(c);
            } else {
                refused.push((
                    c,
                    format!(
                        "{} does not offer the {c} controller (not delegated here)",
                        base.join("cgroup.controllers").display()
                    ),
                ));
            }
        }
        let (on, off) = enable(base, &want);
        refused.extend(off);
        let top = base.join("cellhost");
        fs::create_dir_all(&top).map_err(|e| io_err(&top, e))?;
        let (on, off) = enable(&top, &on);
        refused.extend(off);
        Ok(Subtree {
            base: base.to_path_buf(),
            enabled: on,
            refused,
            origin: origin.into(),
        })
    }

    fn refusal(&self, c: &str) -> String {
        self.refused.iter().find(|(x, _)| *x == c).map_or_else(
            || format!("the {c} controller is not enabled"),
            |(_, w)| w.clone(),
        )
    }

    /// Makes `<base>/cellhost/<name>` and writes the limits the enabled
    /// controllers allow; a limit that cannot be written is a
    /// [`MissingLimit`].
    ///
    /// # Errors
    /// [`CgroupError::Io`] when the group itself cannot be made.
    pub fn create(
        &self,
        name: &str,
        limits: &CgroupLimits,
    ) -> Result<(V2Group, Vec<Applied>, Vec<MissingLimit>), CgroupError> {
        let dir = self.base.join("cellhost").join(name);
        fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let group = V2Group { dir: dir.clone() };
        let on = |c: &str| self.enabled.contains(&c);
        let mut applied = Vec::new();
        let mut missing = Vec::new();
        let set = |applied: &mut Vec<Applied>,
                   missing: &mut Vec<MissingLimit>,
                   layer: &'static str,
                   ctrl: &str,
                   file: &str,
                   value: String,
                   what: String| {
            if !on(ctrl) {
                missing.push(MissingLimit::new(layer, self.refusal(ctrl)));
                return false;
            }
            match write(&dir.join(file), &value) {
                Ok(()) => {
                    applied.push(Applied(what));
                    true
                }
                Err(e) => {
                    missing.push(MissingLimit::new(layer, e.to_string()));
                    false
                }
            }
        };
        if let Some(n) = limits.pids_max {
            set(
                &mut applied,
                &mut missing,
                "cgroup.pids",
                "pids",
                "pids.max",
                n.to_string(),
                format!("pids.max {n}"),
            );
        }
        if let Some(bytes) = limits.memory_bytes {
            let mib = bytes >> 20;
            if set(
                &mut applied,
                &mut missing,
                "cgroup.memory",
                "memory",
                "memory.max",
                bytes.to_string(),
                format!("memory.max {mib} MiB"),
            ) {
                // No swap beyond the memory cap (v1 caps memory + swap to
                // the same total). Without swap on the host there is
                // nothing to cap.
                let swap = dir.join("memory.swap.max");
                match write(&swap, "0") {
                    Ok(()) => applied.push(Applied("memory.swap.max 0".into())),
                    Err(e) if host_swap_bytes() > 0 => {
                        missing.push(MissingLimit::new("cgroup.swap", e.to_string()))
                    }
                    Err(_) => {}
                }
                // An out-of-memory kill ends the whole tree, never leaving
                // a kernel with half its processes.
                if write(&dir.join("memory.oom.group"), "1").is_ok() {
                    applied.push(Applied("memory.oom.group 1".into()));
                }
            }
        }
        if let Some(cores) = limits.cpu_cores {
            let (quota, period) = cpu_quota(cores);
            set(
                &mut applied,
                &mut missing,
                "cgroup.cpu",
                "cpu",
                "cpu.max",
                format!("{quota} {period}"),
                format!("cpu.max {quota} {period} ({cores} cores)"),
            );
        }
        Ok((group, applied, missing))
    }
}

/// CFS quota and period (µs) for `cores` CPUs: period 100 ms, quota at
/// least 1 % of one CPU.
pub fn cpu_quota(cores: f64) -> (u64, u64) {
    let period: u64 = 100_000;
    ((cores.max(0.01) * period as f64) as u64, period)
}

/// Swap configured on the host, in bytes (`SwapTotal` of `/proc/meminfo`).
fn host_swap_bytes() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("SwapTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// One kernel's v2 group.
#[derive(Debug)]
pub struct V2Group {
    /// Its directory.
    pub dir: PathBuf,
}

impl V2Group {
    /// A group without controllers at `dir` (made if missing): on a hybrid
    /// host, for the exact process list and `cgroup.kill` beside the v1
    /// limits.
    ///
    /// # Errors
    /// [`CgroupError::Io`] when it cannot be made.
    pub fn plain(dir: PathBuf) -> Result<V2Group, CgroupError> {
        fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        Ok(V2Group { dir })
    }
}

impl Groups for V2Group {
    fn views(&self) -> Vec<crate::profile::CgroupView> {
        vec![crate::profile::CgroupView {
            host: self.dir.clone(),
            view: PathBuf::from("/sys/fs/cgroup"),
        }]
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        vec![self.dir.join("cgroup.procs")]
    }

    fn dirs(&self) -> Vec<PathBuf> {
        vec![self.dir.clone()]
    }

    fn kill_tree(&self) -> bool {
        // Linux 5.14+: SIGKILL to every process of the group, atomically
        // with respect to forks.
        let kill = self.dir.join("cgroup.kill");
        kill.exists() && write(&kill, "1").is_ok()
    }

    fn pids_limit_hits(&self) -> u64 {
        read_counter(&self.dir.join("pids.events"), "max")
    }

    fn oom_kills(&self) -> u64 {
        read_counter(&self.dir.join("memory.events"), "oom_kill")
    }

    fn pids_max(&self) -> Option<u64> {
        fs::read_to_string(self.dir.join("pids.max"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
    }

    fn remove(&mut self) {
        let _ = fs::remove_dir(&self.dir);
    }
}
