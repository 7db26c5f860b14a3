//! `--memory`, `--pids`, `--cpus`, `--disk` of `cellhost exec`: the
//! session's limits ([`cellhost_sessions::limits`]), bounded by the
//! configuration's `[limits.max]`.

use cellhost_sessions::SessionLimits;

/// The limit options of `exec` (with `--session`: of the session the call
/// creates; a running session keeps its own).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LimitArgs {
    /// Memory of the kernel's whole process tree, in MiB (the OOM killer
    /// ends the cell past it: `fault: oom`).
    #[arg(long, value_name = "MB")]
    pub memory: Option<u64>,
    /// Processes and threads of the kernel's tree at once (`fault: pids`).
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// CPU time as a number of cores (e.g. 0.5).
    #[arg(long, value_name = "CORES")]
    pub cpus: Option<f64>,
    /// Disk cap of the session's files, in MiB (a write past it fails:
    /// `fault: disk`).
    #[arg(long, value_name = "MB")]
    pub disk: Option<u64>,
}

impl LimitArgs {
    /// The limits asked for (`cell_timeout_s` from `--timeout` is the
    /// call's deadline, not the session's).
    pub fn limits(&self) -> SessionLimits {
        SessionLimits {
            memory_mb: self.memory,
            pids: self.pids,
            cpu: self.cpus,
            disk_mb: self.disk,
            cell_timeout_s: None,
        }
    }
}
