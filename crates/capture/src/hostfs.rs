//! Host-side file operations inside directories a kernel can write.
//!
//! A session directory is bound read-write into its kernel, so anything in
//! it may be a symbolic link, a FIFO or a directory the kernel planted
//! (`cells/<id>/display-1.png -> /etc/cron.d/x`). The host, which may be
//! root, must never follow such a link when it writes a figure or a spill
//! file, nor when it later reads one back for a client. So:
//!
//! * [`create_beneath`] creates a file below a trusted root, creating or
//!   opening every directory in between with `O_NOFOLLOW`, and refuses
//!   anything but a regular file with one link;
//! * [`open_verified`] opens a file the host wrote, by the canonical path
//!   `create_beneath` returned, and refuses it unless the opened file is a
//!   regular file whose real path is still exactly that path (a component
//!   swapped for a link or a moved directory resolves elsewhere).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

fn refuse(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{}: {why}; the host does not follow links or open special files in a kernel's directory",
            path.display()
        ),
    )
}

fn regular_single(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    let st = rustix::fs::fstat(fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(refuse(path, "not a regular file"));
    }
    if st.st_nlink > 1 {
        return Err(refuse(path, "a file with more than one link"));
    }
    Ok(())
}

/// The components of `rel`, each a plain name (no `..`, `.`, root).
fn names(rel: &Path) -> io::Result<Vec<&std::ffi::OsStr>> {
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(refuse(rel, "not a plain relative path")),
        })
        .collect()
}

/// Creates (or truncates) the regular file `root/rel`, mode 0600, creating
/// the directories of `rel` (mode 0700) as needed, and returns it open for
/// writing with its canonical path (`root` canonicalized, then `rel`).
///
/// `root` is trusted and may contain links; no component of `rel` is
/// followed if it is a link, and the file must be a regular file with a
/// single link (never a FIFO, device or hard link into another directory).
///
/// # Errors
/// `PermissionDenied` when a component is a link or the file is not a
/// regular single-link file; `InvalidInput`-like refusal when `rel` is not
/// a plain relative path; any I/O error of the walk.
pub fn create_beneath(root: &Path, rel: &Path) -> io::Result<(File, PathBuf)> {
    let parts = names(rel)?;
    let Some((last, dirs)) = parts.split_last() else {
        return Err(refuse(rel, "an empty path"));
    };
    let canon = std::fs::canonicalize(root)?;
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir: OwnedFd = rustix::fs::open(
        &canon,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for d in dirs {
        match rustix::fs::mkdirat(&dir, *d, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        dir = rustix::fs::openat(&dir, *d, dir_flags, Mode::empty()).map_err(|e| match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => refuse(
                &canon.join(rel),
                "a directory on its path is a link or not a directory",
            ),
            e => e.into(),
        })?;
    }
    let path = canon.join(rel);
    let fd = rustix::fs::openat(
        dir.as_fd(),
        *last,
        OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::NOCTTY
            | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => refuse(&path, "a link"),
        rustix::io::Errno::NXIO => refuse(&path, "a FIFO"),
        e => e.into(),
    })?;
    regular_single(&fd, &path)?;
    rustix::fs::ftruncate(&fd, 0)?;
    Ok((File::from(fd), path))
}

/// Opens for reading a file the host wrote with [`create_beneath`], by the
/// canonical path that returned. Refused unless the opened file is a
/// regular, single-link file whose real path (`/proc/self/fd`) is `path`.
///
/// # Errors
/// `PermissionDenied` when `path` is not absolute, is a link, a special
/// file, or resolves anywhere else; any I/O error of the open.
pub fn open_verified(path: &Path) -> io::Result<File> {
    if !path.is_absolute() {
        return Err(refuse(path, "not an absolute path"));
    }
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => refuse(path, "a link"),
        e => e.into(),
    })?;
    regular_single(&fd, path)?;
    let real = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)))?;
    if real != path {
        return Err(refuse(path, "its path leads elsewhere"));
    }
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn creates_and_reads_back_below_a_root() {
        let d = tempfile::tempdir().expect("tmp");
        let (mut f, p) = create_beneath(d.path(), Path::new("cells/c1/stdout.txt")).expect("create");
        f.write_all(b"hello").expect("write");
        drop(f);
        let mut s = String::new();
        open_verified(&p)
            .expect("open")
            .read_to_string(&mut s)
            .expect("read");
        assert_eq!(s, "hello");
    }

    #[test]
    fn never_follows_a_planted_link() {
        let d = tempfile::tempdir().expect("tmp");
        let victim = tempfile::tempdir().expect("victim");
        std::fs::write(victim.path().join("v"), "keep").expect("victim file");
        std::fs::create_dir_all(d.path().join("cells/c1")).expect("dirs");
        std::os::unix::fs::symlink(victim.path().join("v"), d.path().join("cells/c1/x")).expect("link");
        assert!(create_beneath(d.path(), Path::new("cells/c1/x")).is_err());
        std::os::unix::fs::symlink(victim.path(), d.path().join("cells/c2")).expect("dir link");
        assert!(create_beneath(d.path(), Path::new("cells/c2/v")).is_err());
        assert_eq!(
            std::fs::read_to_string(victim.path().join("v")).expect("victim"),
            "keep"
        );
        // Reading back through a swapped directory is refused too.
        let (_, p) = create_beneath(d.path(), Path::new("cells/c3/v")).expect("create");
        std::fs::remove_dir_all(d.path().join("cells/c3")).expect("rm");
        std::os::unix::fs::symlink(victim.path(), d.path().join("cells/c3")).expect("swap");
        assert!(open_verified(&p).is_err());
        assert!(create_beneath(d.path(), Path::new("../v")).is_err());
    }

    #[test]
    fn refuses_fifos_and_hard_links() {
        let d = tempfile::tempdir().expect("tmp");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.path().join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("fifo");
        assert!(create_beneath(d.path(), Path::new("fifo")).is_err());
        assert!(open_verified(&d.path().join("fifo")).is_err());
        std::fs::write(d.path().join("a"), "a").expect("a");
        std::fs::hard_link(d.path().join("a"), d.path().join("b")).expect("link");
        assert!(create_beneath(d.path(), Path::new("b")).is_err());
        assert_eq!(std::fs::read_to_string(d.path().join("a")).expect("a"), "a");
    }
}
