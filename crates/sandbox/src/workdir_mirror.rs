//! The workdir holder's copy-out ([`crate::workdir_disk`]): the tmpfs's
//! tree mirrored into the workdir's directory on disk, the one way a
//! session's files get back to disk (the session's end, the host's
//! shutdown, and the host's death alike).
//!
//! Both trees are reached through directory descriptors only: the tmpfs's
//! root, and the directory on disk opened by the holder *before* it mounted
//! the tmpfs over it (a lookup relative to that descriptor reaches the
//! covered directory, not the mount). Every component is opened relative to
//! its parent's descriptor with `O_NOFOLLOW`, so the tree a cell wrote
//! cannot redirect a write anywhere: a symbolic link is copied as a link
//! (never followed, on either side), a name on disk that is a link is
//! replaced by `rename(2)`, which never follows the link it replaces.
//! FIFOs, sockets and devices are not copied (tmpfs is `nodev`; they are
//! left out of the directory on disk).
//!
//! Per file the update is atomic: the content is written under a temporary
//! name in the same directory and renamed over the old one, so a file on
//! disk is always either its old or its new version, whatever interrupts
//! the copy. Names on disk absent from the tmpfs are removed. An entry
//! that fails to copy keeps its old version on disk (never removed), and
//! the failure is counted in [`Mirrored::errors`].

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Deepest directory nesting mirrored (deeper directories are kept as
/// empty directories and counted in [`Mirrored::skipped`]).
pub const MAX_DEPTH: usize = 128;

/// Prefix of the temporary names files are written under before their
/// rename (such names in the tmpfs are not copied).
pub const TMP_PREFIX: &str = ".cellhost-mirror-";

/// What a mirror did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Mirrored {
    /// Regular files written.
    pub files: u64,
    /// Bytes of file data written.
    pub bytes: u64,
    /// Entries not copied: FIFOs, sockets, devices, too deep.
    pub skipped: u64,
    /// Entries that failed (their old version on disk kept).
    pub errors: u64,
    /// The first failure: the path relative to the workdir and the error.
    pub first_error: Option<String>,
}

impl Mirrored {
    fn fail(&mut self, path: &Path, e: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{}: {e}", path.display()));
        }
    }
}

/// Mirrors the tree below `src` into `dst` (both directory descriptors),
/// leaving out the top-level names in `skip_top` (and keeping no entry of
/// `dst` by those names), then syncs `dst`'s filesystem.
pub fn mirror(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, skip_top: &[&OsStr]) -> Mirrored {
    let mut out = Mirrored::default();
    mirror_dir(src, dst, Path::new(""), 0, skip_top, &mut out);
    if let Err(e) = rustix::fs::syncfs(dst) {
        out.fail(Path::new("."), format!("syncfs: {e}"));
    }
    out
}

fn names(fd: BorrowedFd<'_>) -> Result<Vec<OsString>, Errno> {
    let mut v = Vec::new();
    for entry in Dir::read_from(fd)? {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            v.push(name.to_os_string());
        }
    }
    v.sort();
    Ok(v)
}

fn open_dir(at: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn mirror_dir(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    rel: &Path,
    depth: usize,
    skip_top: &[&OsStr],
    out: &mut Mirrored,
) {
    let listed = match names(src) {
        Ok(n) => n,
        Err(e) => {
            // Nothing on disk below here is touched.
            out.fail(rel, e);
            return;
        }
    };
    let mut kept: HashSet<OsString> = HashSet::new();
    for name in listed {
        if (depth == 0 && skip_top.contains(&name.as_os_str()))
            || name.as_bytes().starts_with(TMP_PREFIX.as_bytes())
        {
            continue;
        }
        let path = rel.join(&name);
        let st = match rustix::fs::statat(src, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since the listing (a kernel still running).
            Err(Errno::NOENT) => continue,
            Err(e) => {
                kept.insert(name);
                out.fail(&path, e);
                continue;
            }
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                kept.insert(name.clone());
                let d = match dst_dir(dst, &name, depth) {
                    Ok(d) => d,
                    Err(e) => {
                        out.fail(&path, e);
                        continue;
                    }
                };
                if depth + 1 >= MAX_DEPTH {
                    out.skipped += 1;
                    continue;
                }
                match open_dir(src, &name) {
                    Ok(s) => mirror_dir(s.as_fd(), d.as_fd(), &path, depth + 1, skip_top, out),
                    Err(e) => out.fail(&path, e),
                }
                let _ = rustix::fs::fchmod(&d, Mode::from_raw_mode(st.st_mode & 0o7777));
            }
            FileType::RegularFile => {
                kept.insert(name.clone());
                match put_file(src, dst, &name, depth) {
                    Ok(n) => {
                        out.files += 1;
                        out.bytes += n;
                    }
                    Err(e) => out.fail(&path, e),
                }
            }
            FileType::Symlink => {
                kept.insert(name.clone());
                if let Err(e) = put_link(src, dst, &name, depth) {
                    out.fail(&path, e);
                }
            }
            _ => out.skipped += 1,
        }
    }
    let on_disk = match names(dst) {
        Ok(n) => n,
        Err(e) => {
            out.fail(rel, e);
            return;
        }
    };
    for name in on_disk {
        if !kept.contains(&name)
            && let Err(e) = remove(dst, &name, depth)
        {
            out.fail(&rel.join(&name), e);
        }
    }
}

/// The directory `name` in `dst`, made (replacing a non-directory) when
/// missing.
fn dst_dir(dst: BorrowedFd<'_>, name: &OsStr, depth: usize) -> Result<OwnedFd, Errno> {
    match rustix::fs::statat(dst, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
        Ok(_) => {
            remove(dst, name, depth)?;
            rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))?;
        }
        Err(Errno::NOENT) => rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))?,
        Err(e) => return Err(e),
    }
    open_dir(dst, name)
}

/// A fresh temporary name in a directory of this process.
fn tmp_name() -> OsString {
    static N: AtomicU64 = AtomicU64::new(0);
    OsString::from(format!(
        "{TMP_PREFIX}{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Renames `tmp` over `name` in `dst` (a directory there is removed first:
/// `rename(2)` does not replace a directory with a file); `tmp` is removed
/// on failure.
fn replace(dst: BorrowedFd<'_>, tmp: &OsStr, name: &OsStr, depth: usize) -> Result<(), Errno> {
    let done = (|| {
        if let Ok(st) = rustix::fs::statat(dst, name, AtFlags::SYMLINK_NOFOLLOW)
            && FileType::from_raw_mode(st.st_mode) == FileType::Directory
        {
            remove(dst, name, depth)?;
        }
        rustix::fs::renameat(dst, tmp, dst, name)
    })();
    if done.is_err() {
        let _ = rustix::fs::unlinkat(dst, tmp, AtFlags::empty());
    }
    done
}

fn put_file(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, name: &OsStr, depth: usize) -> std::io::Result<u64> {
    let s = rustix::fs::openat(
        src,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&s)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(std::io::Error::other("changed while copied"));
    }
    let tmp = tmp_name();
    let d = rustix::fs::openat(
        dst,
        &tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(st.st_mode & 0o777),
    )?;
    let mut sf = std::fs::File::from(s);
    let mut df = std::fs::File::from(d);
    let copied = std::io::copy(&mut sf, &mut df).and_then(|n| {
        rustix::fs::fchmod(&df, Mode::from_raw_mode(st.st_mode & 0o777))
            .map(|()| n)
            .map_err(Into::into)
    });
    drop(df);
    match copied {
        Ok(n) => {
            replace(dst, &tmp, name, depth)?;
            Ok(n)
        }
        Err(e) => {
            let _ = rustix::fs::unlinkat(dst, &tmp, AtFlags::empty());
            Err(e)
        }
    }
}

fn put_link(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, name: &OsStr, depth: usize) -> Result<(), Errno> {
    let target = rustix::fs::readlinkat(src, name, Vec::new())?;
    let tmp = tmp_name();
    rustix::fs::symlinkat(target.as_c_str(), dst, &tmp)?;
    replace(dst, &tmp, name, depth)
}

/// Removes `name` from `dst`: a link or file is unlinked (a link is never
/// followed), a directory emptied (through descriptors) and removed.
fn remove(dst: BorrowedFd<'_>, name: &OsStr, depth: usize) -> Result<(), Errno> {
    let st = match rustix::fs::statat(dst, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return rustix::fs::unlinkat(dst, name, AtFlags::empty());
    }
    if depth >= MAX_DEPTH * 2 {
        return Err(Errno::LOOP);
    }
    let d = open_dir(dst, name)?;
    for n in names(d.as_fd())? {
        remove(d.as_fd(), &n, depth + 1)?;
    }
    rustix::fs::unlinkat(dst, name, AtFlags::REMOVEDIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirfd(p: &Path) -> OwnedFd {
        rustix::fs::open(
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open")
    }

    #[test]
    fn mirrors_files_links_and_removals_without_following_links() {
        let t = tempfile::tempdir().expect("tmp");
        let (src, dst, outside) = (
            t.path().join("src"),
            t.path().join("dst"),
            t.path().join("outside"),
        );
        for d in [&src, &dst, &outside] {
            std::fs::create_dir(d).expect("mkdir");
        }
        std::fs::write(outside.join("victim"), b"untouched").expect("victim");
        std::fs::create_dir_all(src.join("sub/deep")).expect("sub");
        std::fs::write(src.join("a.txt"), b"new a").expect("a");
        std::fs::write(src.join("sub/deep/b.bin"), [0u8, 1, 2, 255]).expect("b");
        std::fs::write(src.join("victim"), b"through the link?").expect("v");
        std::os::unix::fs::symlink(outside.join("victim"), src.join("link")).expect("link");
        std::fs::write(src.join(".cellhost-copy-in"), b"x").expect("skip");
        // On disk: an old a.txt, a stale file and dir, `victim` a link out.
        std::fs::write(dst.join("a.txt"), b"old a").expect("old");
        std::fs::write(dst.join("stale"), b"s").expect("stale");
        std::fs::create_dir_all(dst.join("gone/x")).expect("gone");
        std::os::unix::fs::symlink(outside.join("victim"), dst.join("victim")).expect("dst link");
        std::os::unix::fs::symlink(&outside, dst.join("sub")).expect("dst sub link");

        let (s, d) = (dirfd(&src), dirfd(&dst));
        let m = mirror(s.as_fd(), d.as_fd(), &[OsStr::new(".cellhost-copy-in")]);
        assert_eq!(m.errors, 0, "{m:?}");
        assert_eq!(m.files, 3, "{m:?}");
        assert_eq!(std::fs::read(dst.join("a.txt")).expect("a"), b"new a");
        assert_eq!(
            std::fs::read(dst.join("sub/deep/b.bin")).expect("b"),
            [0u8, 1, 2, 255]
        );
        assert!(std::fs::symlink_metadata(dst.join("sub")).expect("sub").is_dir());
        assert_eq!(
            std::fs::read(dst.join("victim")).expect("v"),
            b"through the link?"
        );
        assert!(
            std::fs::symlink_metadata(dst.join("victim"))
                .expect("v")
                .is_file()
        );
        assert_eq!(
            std::fs::read_link(dst.join("link")).expect("link"),
            outside.join("victim")
        );
        assert_eq!(
            std::fs::read(outside.join("victim")).expect("victim"),
            b"untouched"
        );
        assert_eq!(std::fs::read_dir(&outside).expect("outside").count(), 1);
        for gone in ["stale", "gone", ".cellhost-copy-in"] {
            assert!(std::fs::symlink_metadata(dst.join(gone)).is_err(), "{gone} left");
        }
        let left: Vec<_> = std::fs::read_dir(&dst)
            .expect("dst")
            .flatten()
            .filter(|e| e.file_name().as_bytes().starts_with(TMP_PREFIX.as_bytes()))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
