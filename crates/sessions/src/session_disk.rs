//! The mount behind a session's disk cap (`disk_mb`): the session's workdir
//! on a size-limited tmpfs held by a process of its own
//! ([`cellhost_sandbox::workdir_disk`]), started with the session's first
//! cold kernel and kept across its kernels (restarts, crashes, OOM kills,
//! idle reaps), and given back to the directory on disk by the holder when
//! the session ends, the host shuts down or the host dies.
//!
//! A session gets one when it has a cap, a sandbox (mode auto or enforce),
//! a local kernel and a workdir of the registry's own (its directory under
//! `session_workdirs`, or a fork's): a cwd the caller named is the caller's
//! directory, which the host never swaps for a copy. Otherwise — and when
//! the holder cannot start (no user namespaces for a non-root host) — the
//! cap is the host's accounting and `RLIMIT_FSIZE`, and the kernel's
//! sandbox names layer `disk` as missing, with the reason.
//!
//! The workdir's files on disk are copied into the tmpfs when the holder
//! starts (a workdir holding more than the cap keeps the accounting
//! instead), then the holder is armed: from then on the holder itself
//! copies the tmpfs's files back into the directory on disk when it ends —
//! when the host retires it ([`retire`]: the session's end, the host's
//! shutdown, waited for) and equally when the host dies (`SIGKILL`, a
//! crash), file by file, each renamed over its old version
//! ([`cellhost_sandbox::workdir_mirror`]).

use std::path::Path;

use cellhost_sandbox::workdir_disk::{COPY_IN, DiskPlan, WorkdirDisk};

use crate::workdir_copy::{CopyError, copy_tree};

/// Starts a holder for `dir` with a cap of `bytes`, copies `dir`'s files
/// into it and arms it (it copies them back when it ends). Blocking (run it
/// off the async threads).
///
/// # Errors
/// Why there is no mount, as the `disk` layer's reason.
pub(crate) fn start(program: &Path, dir: &Path, bytes: u64) -> Result<WorkdirDisk, String> {
    let dir = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let holder = WorkdirDisk::start(program, &dir, bytes).map_err(|e| e.to_string())?;
    let view = holder.view();
    let staged = view.join(COPY_IN);
    match copy_tree(&dir, &staged, &[], Some(bytes)) {
        Ok(_) => {}
        Err(CopyError::OverCap { max_bytes, .. }) => {
            return Err(format!(
                "the workdir already holds more than the cap ({max_bytes} bytes): \
                 the cap is the host's accounting for this session"
            ));
        }
        Err(e) => return Err(format!("copying the workdir into its tmpfs failed: {e}")),
    }
    let moved = (|| -> std::io::Result<()> {
        for e in std::fs::read_dir(&staged)? {
            let e = e?;
            std::fs::rename(e.path(), view.join(e.file_name()))?;
        }
        std::fs::remove_dir(&staged)
    })();
    moved.map_err(|e| format!("placing the workdir's files in its tmpfs failed: {e}"))?;
    let mut holder = holder;
    holder.keep().map_err(|e| e.to_string())?;
    Ok(holder)
}

/// Gives the tmpfs's files back to the directory on disk: the holder's
/// copy-out, waited for, then the holder reaped. Blocking.
///
/// # Errors
/// Entries the copy-out left out (their old versions stay on disk), or
/// the holder ending otherwise.
pub(crate) fn retire(holder: WorkdirDisk) -> Result<(), String> {
    holder.finish().map_err(|e| e.to_string())
}

/// Why a session with a cap gets no mount, when that is already known from
/// its kernel's configuration (`None`: try a holder).
pub(crate) fn no_mount_reason(cfg: &cellhost_kernel::KernelConfig, own_dir: bool) -> Option<String> {
    if cfg.starter.is_some() {
        return Some("the kernel runs through a placement: the cap is the host's accounting".into());
    }
    if cfg.sandbox.disable.iter().any(|d| d == "disk") {
        return Some(cellhost_sandbox::profile::DISABLED_BY_PROFILE.into());
    }
    if !own_dir {
        return Some(
            "the workdir is the caller's own directory (cwd), not one of the registry's: \
             the cap is the host's accounting and RLIMIT_FSIZE (each file)"
                .into(),
        );
    }
    let own_uid = rustix::process::geteuid().is_root()
        && cfg.sandbox.mode != cellhost_sandbox::profile::SandboxMode::Off
        && !cfg.sandbox.disable.iter().any(|d| d == "uid");
    if own_uid && let Some(why) = cellhost_sandbox::workdir_disk::tmpfs_idmap_missing() {
        return Some(format!(
            "{why}: on a tmpfs the kernel's own uid could not write its workdir, and that layer is kept; \
             the cap is the host's accounting and RLIMIT_FSIZE (each file)"
        ));
    }
    None
}

/// The plan of a kernel with no mount.
pub(crate) fn accounting(reason: String) -> DiskPlan {
    DiskPlan::Accounting { reason }
}
