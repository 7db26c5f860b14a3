//! The mount behind a session's disk cap (`disk_mb`): the session's workdir
//! on a size-limited tmpfs held by a process of its own
//! ([`cellhost_sandbox::workdir_disk`]), started with the session's first
//! cold kernel and kept across its kernels (restarts, crashes, OOM kills,
//! idle reaps), and given back to the directory on disk when the session
//! ends or the host shuts down.
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
//! instead) and the tmpfs's files replace them when the holder is retired:
//! a copy made beside the directory, then swapped in with two renames.

use std::ffi::OsStr;
use std::path::Path;

use cellhost_sandbox::workdir_disk::{DiskPlan, WorkdirDisk};

use crate::workdir_copy::{CopyError, copy_tree};

/// Where the tmpfs's files are first copied, inside the tmpfs.
const COPY_IN: &str = ".cellhost-copy-in";

/// Starts a holder for `dir` with a cap of `bytes` and copies `dir`'s files
/// into it. Blocking (run it off the async threads).
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
    Ok(holder)
}

/// Gives the tmpfs's files back to the directory on disk: copied beside
/// it, then swapped in; the holder ends after. Blocking.
///
/// # Errors
/// The copy failed (the directory on disk keeps the files it had).
pub(crate) fn retire(holder: WorkdirDisk) -> Result<(), String> {
    let dir = holder.dir().to_path_buf();
    let view = holder.view();
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(format!("{}: no parent directory", dir.display()));
    };
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    let tag = format!("{:016x}", u64::from_le_bytes(b));
    let side = |what: &str| {
        let mut n = std::ffi::OsString::from(".");
        n.push(name);
        n.push(format!(".cellhost-{what}-{tag}"));
        parent.join(n)
    };
    let (fresh, old) = (side("out"), side("old"));
    copy_tree(&view, &fresh, &[] as &[&OsStr], None).map_err(|e| e.to_string())?;
    drop(holder);
    if let Ok(m) = std::fs::metadata(&dir) {
        let _ = std::fs::set_permissions(&fresh, m.permissions());
    }
    let swapped = std::fs::rename(&dir, &old).and_then(|()| std::fs::rename(&fresh, &dir));
    if let Err(e) = swapped {
        // The directory on disk is put back as it was.
        if !dir.exists() {
            let _ = std::fs::rename(&old, &dir);
        }
        let _ = std::fs::remove_dir_all(&fresh);
        return Err(format!(
            "swapping the tmpfs's files into {} failed: {e}",
            dir.display()
        ));
    }
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
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
    None
}

/// The plan of a kernel with no mount.
pub(crate) fn accounting(reason: String) -> DiskPlan {
    DiskPlan::Accounting { reason }
}
