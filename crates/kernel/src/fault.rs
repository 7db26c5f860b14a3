//! Which resource limit a cell ran into ([`Fault`]): the one typed answer
//! to "why did my cell die or fail" when the cause is a limit rather than
//! the code, reported as the result's `fault` on every surface.
//!
//! Each fault comes from evidence the host holds, never from the cell's
//! word alone:
//! - `oom`: the kernel's cgroup counted an OOM kill during the cell
//!   (`memory.events` `oom_kill`, v1 `memory.oom_control`);
//! - `pids`: the cgroup's process limit refused a fork or thread during the
//!   cell (`pids.events` `max`);
//! - `seccomp`: the worker died of `SIGSYS`, the signal a seccomp filter's
//!   kill and trap actions raise;
//! - `disk`: the cell's error is the system's "no space" (`ENOSPC`: the
//!   session's workdir tmpfs full at `disk_mb`, in total), "quota exceeded"
//!   (`EDQUOT`) or "file too large" (`EFBIG`, the `RLIMIT_FSIZE` a
//!   session's `disk_mb` sets; a child process it killed with `SIGXFSZ`)
//!   — the error the cell's own write got (a cell can only claim a disk
//!   fault for itself);
//! - `timeout`: the cell passed its deadline.

use serde::{Deserialize, Serialize};

use crate::result::{CellError, CellStatus};

/// A resource limit a cell hit.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// The kernel's memory limit (`memory_mb`): the OOM killer ended a
    /// process of the kernel's tree.
    Oom,
    /// The kernel's process limit (`pids`): a fork or thread was refused.
    Pids,
    /// The session's disk cap (`disk_mb`), or the disk itself, refused a
    /// write (`ENOSPC`, `EDQUOT`, `EFBIG`).
    Disk,
    /// The cell passed its deadline (`cell_timeout_s` or the call's).
    Timeout,
    /// A system call the sandbox forbids ended the worker (`SIGSYS`).
    Seccomp,
}

impl Fault {
    /// The wire name (`oom`, `pids`, `disk`, `timeout`, `seccomp`).
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Oom => "oom",
            Fault::Pids => "pids",
            Fault::Disk => "disk",
            Fault::Timeout => "timeout",
            Fault::Seccomp => "seccomp",
        }
    }

    /// One line for a reader: which limit, and what to do about it.
    pub fn explain(self) -> &'static str {
        match self {
            Fault::Oom => "the kernel's memory limit was reached (memory_mb)",
            Fault::Pids => "the kernel's process limit was reached (pids)",
            Fault::Disk => "the session's disk cap was reached (disk_mb)",
            Fault::Timeout => "the cell passed its deadline (cell_timeout_s)",
            Fault::Seccomp => "the sandbox forbids a system call the cell made (seccomp)",
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the host saw of one cell, the input of [`classify`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Evidence<'a> {
    /// OOM kills the cgroup counted during the cell.
    pub oom_kills: u64,
    /// Process-limit refusals the cgroup counted during the cell.
    pub pids_hits: u64,
    /// The signal that ended the worker, when one did.
    pub signal: Option<i32>,
    /// The cell's error, when it raised.
    pub error: Option<&'a CellError>,
}

/// The fault of a cell, the strongest evidence first: a limit that killed
/// (oom, pids, seccomp) over a refused write over the deadline (a cell that
/// forked until the limit and then timed out hit `pids`).
pub(crate) fn classify(status: CellStatus, ev: &Evidence<'_>) -> Option<Fault> {
    if ev.oom_kills > 0 {
        return Some(Fault::Oom);
    }
    if ev.pids_hits > 0 {
        return Some(Fault::Pids);
    }
    if ev.signal == Some(libc::SIGSYS) {
        return Some(Fault::Seccomp);
    }
    if ev.error.is_some_and(is_disk_error) {
        return Some(Fault::Disk);
    }
    (status == CellStatus::Timeout).then_some(Fault::Timeout)
}

/// `ENOSPC`, `EDQUOT` or `EFBIG` as the runtimes spell an error's value:
/// Python's `OSError` (`[Errno 28] No space left on device`), R's
/// `cannot open file … : No space left on device`, the C library's text
/// anywhere in the value, or a child process the file-size limit killed
/// (`SIGXFSZ`: `subprocess.CalledProcessError` of `dd` past the cap).
fn is_disk_error(e: &CellError) -> bool {
    let v = e.evalue.as_str();
    let coded = v
        .strip_prefix("[Errno ")
        .and_then(|r| r.split_once(']').map(|(n, _)| n))
        .and_then(|n| n.parse::<i32>().ok())
        .is_some_and(|n| n == libc::ENOSPC || n == libc::EDQUOT || n == libc::EFBIG);
    coded
        || [
            "No space left on device",
            "Disk quota exceeded",
            "File too large",
            "SIGXFSZ",
        ]
        .iter()
        .any(|t| v.contains(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(evalue: &str) -> CellError {
        CellError {
            ename: "OSError".into(),
            evalue: evalue.into(),
            traceback: Vec::new(),
        }
    }

    #[test]
    fn strongest_evidence_wins() {
        let e = err("[Errno 28] No space left on device");
        let all = Evidence {
            oom_kills: 1,
            pids_hits: 1,
            signal: Some(libc::SIGSYS),
            error: Some(&e),
        };
        assert_eq!(classify(CellStatus::Timeout, &all), Some(Fault::Oom));
        let pids = Evidence {
            oom_kills: 0,
            ..all.clone()
        };
        assert_eq!(classify(CellStatus::Timeout, &pids), Some(Fault::Pids));
        let sys = Evidence { pids_hits: 0, ..pids };
        assert_eq!(classify(CellStatus::Crashed, &sys), Some(Fault::Seccomp));
        let disk = Evidence { signal: None, ..sys };
        assert_eq!(classify(CellStatus::Error, &disk), Some(Fault::Disk));
        let none = Evidence::default();
        assert_eq!(classify(CellStatus::Timeout, &none), Some(Fault::Timeout));
        assert_eq!(classify(CellStatus::Error, &none), None);
        assert_eq!(classify(CellStatus::Ok, &none), None);
    }

    #[test]
    fn disk_errors_by_errno_or_text() {
        for v in [
            "[Errno 28] No space left on device",
            "[Errno 122] Disk quota exceeded",
            "[Errno 27] File too large",
            "cannot open file 'x': No space left on device",
            "Command '['dd']' died with <Signals.SIGXFSZ: 25>.",
        ] {
            assert!(is_disk_error(&err(v)), "{v}");
        }
        for v in ["[Errno 2] No such file or directory", "[Errno 28", "disk"] {
            assert!(!is_disk_error(&err(v)), "{v}");
        }
    }

    #[test]
    fn wire_names() {
        let names: Vec<String> = [
            Fault::Oom,
            Fault::Pids,
            Fault::Disk,
            Fault::Timeout,
            Fault::Seccomp,
        ]
        .iter()
        .map(|f| serde_json::to_value(f).map(|v| v.to_string()).unwrap_or_default())
        .collect();
        assert_eq!(
            names,
            ["\"oom\"", "\"pids\"", "\"disk\"", "\"timeout\"", "\"seccomp\""]
        );
    }
}
