//! The daemon's runtime directory (its socket, lock, pid file and log),
//! chosen so that a set but unusable `XDG_RUNTIME_DIR` (another user's
//! after `su` or `sudo -u`, a wrong mode, a directory that does not exist)
//! never breaks the daemon.
//!
//! In order, the first that is usable:
//! 1. `$XDG_RUNTIME_DIR/cellhost`, when `$XDG_RUNTIME_DIR` is a directory
//!    (not a symlink) owned by this effective uid, writable by us and by
//!    no group or other user (who could replace `cellhost` in it);
//! 2. `STATE_DIR/run` (the per-user state directory);
//! 3. `$TMPDIR/cellhost-<uid>` (`/tmp/cellhost-<uid>`).
//!
//! Each is created mode 0700 and must then be a directory owned by us with
//! mode 0700 ([`prepare`]); one that someone else made first is refused,
//! never used. Every error names the directory.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why `$XDG_RUNTIME_DIR` (`path`) cannot hold the daemon's files, or
/// `None` when it can.
pub fn xdg_problem(path: &Path) -> Option<String> {
    let euid = rustix::process::geteuid().as_raw();
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => return Some(format!("{}: {e}", path.display())),
    };
    if !m.file_type().is_dir() {
        return Some(format!("{} is not a directory", path.display()));
    }
    if m.uid() != euid {
        return Some(format!(
            "{} belongs to uid {}, not to this user (uid {euid})",
            path.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Some(format!(
            "{} has mode {:o}: others may write to it",
            path.display(),
            m.mode() & 0o7777
        ));
    }
    if rustix::fs::access(path, rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK).is_err() {
        return Some(format!("{} is not writable", path.display()));
    }
    None
}

/// The daemon's directory (see the module documentation), created when it
/// is one of the fallbacks. The reason `$XDG_RUNTIME_DIR` was passed over
/// is logged at `info`.
pub fn runtime_dir(state_dir: &Path) -> PathBuf {
    if let Some(xdg) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let xdg = PathBuf::from(xdg);
        match xdg_problem(&xdg) {
            None => return xdg.join("cellhost"),
            Some(why) => tracing::info!("XDG_RUNTIME_DIR is not usable ({why}); using a fallback"),
        }
    }
    let state_run = state_dir.join("run");
    if prepare(&state_run).is_ok() {
        return state_run;
    }
    let uid = rustix::process::geteuid().as_raw();
    std::env::temp_dir().join(format!("cellhost-{uid}"))
}

/// Creates `dir` (and its parents) if needed, mode 0700, and checks that
/// it is a directory (not a symlink) owned by this effective uid; sets its
/// mode to 0700.
///
/// # Errors
/// The directory cannot be created or is not ours; the message names it.
pub fn prepare(dir: &Path) -> io::Result<()> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("runtime directory {}: {e}", dir.display()));
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(named)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(named(e)),
    }
    let m = std::fs::symlink_metadata(dir).map_err(named)?;
    let euid = rustix::process::geteuid().as_raw();
    if !m.file_type().is_dir() || m.uid() != euid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "runtime directory {}: not a directory owned by uid {euid} (someone else made it); remove it or set XDG_RUNTIME_DIR",
                dir.display()
            ),
        ));
    }
    if m.mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(named)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdg_dirs_of_others_or_open_modes_are_refused() {
        let t = tempfile::tempdir().expect("tempdir");
        let ok = t.path().join("ok");
        std::fs::DirBuilder::new().mode(0o700).create(&ok).expect("mkdir");
        assert_eq!(xdg_problem(&ok), None);
        let open = t.path().join("open");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&open)
            .expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        assert!(xdg_problem(&open).expect("refused").contains("mode 1777"));
        let missing = t.path().join("missing");
        assert!(xdg_problem(&missing).expect("refused").contains("missing"));
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&ok, &link).expect("symlink");
        assert!(xdg_problem(&link).expect("refused").contains("not a directory"));
        if rustix::process::geteuid().is_root() {
            assert!(xdg_problem(Path::new("/proc/1/fdinfo")).is_some());
        }
    }

    #[test]
    fn prepare_makes_a_private_directory_and_names_it_in_errors() {
        let t = tempfile::tempdir().expect("tempdir");
        let d = t.path().join("a/run");
        prepare(&d).expect("prepare");
        let m = std::fs::metadata(&d).expect("stat");
        assert_eq!(m.mode() & 0o7777, 0o700);
        prepare(&d).expect("again");
        let file = t.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        let err = prepare(&file.join("run")).expect_err("under a file");
        assert!(err.to_string().contains(&file.display().to_string()), "{err}");
        let f2 = t.path().join("plain");
        std::fs::write(&f2, b"x").expect("write");
        let err = prepare(&f2).expect_err("a file");
        assert!(err.to_string().contains("plain"), "{err}");
    }
}
