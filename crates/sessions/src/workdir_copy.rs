//! Copying a session's working directory for a fork, safely against the
//! files a cell made.
//!
//! The source directory is written by sandboxed code, so the host treats
//! every entry as hostile: it never follows a symbolic link (a link is
//! copied as a link, resolved later inside the fork's own sandbox), opens
//! each component with `O_NOFOLLOW` relative to its parent's descriptor (a
//! directory swapped for a link mid-copy is not entered), opens files
//! non-blocking (a FIFO cannot stall the copy) and copies regular files
//! with one link only (a hard link could name a file the kernel could not
//! read; the files requests refuse them the same way). Sockets, FIFOs,
//! devices and hard-linked files are skipped and named in
//! [`Copied::skipped`].
//!
//! File data goes through [`std::io::copy`], which on Linux uses
//! `copy_file_range(2)`: a reflink (shared extents, copy-on-write) where the
//! filesystem does that (Btrfs, XFS), an in-kernel copy otherwise.
//!
//! The copy is bounded: past `max_bytes` of file data it stops with
//! [`CopyError::OverCap`] and removes what it made.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

/// Deepest directory nesting copied.
pub const MAX_DEPTH: usize = 128;

/// What a copy made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Copied {
    /// Regular files copied.
    pub files: u64,
    /// Bytes of file data copied.
    pub bytes: u64,
    /// Paths (relative to the source) not copied, with why.
    pub skipped: Vec<(String, String)>,
}

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The files pass the cap.
    #[error("{path}: copying passes the cap of {max_bytes} bytes ({bytes} bytes so far)")]
    OverCap {
        /// The file that passed it.
        path: String,
        /// Bytes counted with it.
        bytes: u64,
        /// The cap.
        max_bytes: u64,
    },
    /// Reading the source or writing the copy failed.
    #[error("{path}: {source}")]
    Io {
        /// The path, relative to the source.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io(path: &Path, e: impl Into<std::io::Error>) -> CopyError {
    CopyError::Io {
        path: path.display().to_string(),
        source: e.into(),
    }
}

/// Copies the tree below `src` into `dst` (created, must not exist),
/// leaving out the entries of `src`'s top level named in `exclude`.
/// `max_bytes`: the cap on file data (`None`: none).
///
/// # Errors
/// [`CopyError`]; `dst` is removed again on any error.
pub fn copy_tree(
    src: &Path,
    dst: &Path,
    exclude: &[&OsStr],
    max_bytes: Option<u64>,
) -> Result<Copied, CopyError> {
    let mut out = Copied::default();
    let result = (|| {
        let s = rustix::fs::open(
            src,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(Path::new("."), e))?;
        std::fs::create_dir_all(dst.parent().unwrap_or(Path::new("/"))).map_err(|e| io(dst, e))?;
        std::fs::create_dir(dst).map_err(|e| io(dst, e))?;
        let d = rustix::fs::open(
            dst,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(dst, e))?;
        // `dst` may lie inside `src` (a workdir holding the host's state
        // directory): the walk never descends into the copy itself.
        let own = rustix::fs::fstat(&d).map_err(|e| io(dst, e))?;
        let walk = Walk {
            exclude,
            max_bytes,
            own: (own.st_dev, own.st_ino),
        };
        copy_dir(&s, &d, Path::new(""), &walk, 0, &mut out)
    })();
    match result {
        Ok(()) => Ok(out),
        Err(e) => {
            let _ = std::fs::remove_dir_all(dst);
            Err(e)
        }
    }
}

/// What stays the same over one copy's walk.
struct Walk<'a> {
    /// Top-level names left out.
    exclude: &'a [&'a OsStr],
    /// The cap on file data.
    max_bytes: Option<u64>,
    /// The destination's (device, inode): never copied into itself.
    own: (u64, u64),
}

fn copy_dir(
    src: &OwnedFd,
    dst: &OwnedFd,
    rel: &Path,
    walk: &Walk<'_>,
    depth: usize,
    out: &mut Copied,
) -> Result<(), CopyError> {
    let (exclude, max_bytes) = (walk.exclude, walk.max_bytes);
    let mut names: Vec<OsString> = Vec::new();
    let dir = Dir::read_from(src).map_err(|e| io(rel, e))?;
    for entry in dir {
        let entry = entry.map_err(|e| io(rel, e))?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." || (depth == 0 && exclude.contains(&name)) {
            continue;
        }
        names.push(name.to_os_string());
    }
    names.sort();
    for name in names {
        let path: PathBuf = rel.join(&name);
        let st = match rustix::fs::statat(src, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since the listing (a background process of the cell).
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(io(&path, e)),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                if (st.st_dev as u64, st.st_ino as u64) == walk.own {
                    out.skipped
                        .push((path.display().to_string(), "the copy itself".into()));
                    continue;
                }
                if depth + 1 >= MAX_DEPTH {
                    out.skipped.push((
                        path.display().to_string(),
                        format!("nested deeper than {MAX_DEPTH}"),
                    ));
                    continue;
                }
                let s = rustix::fs::openat(
                    src,
                    name.as_os_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io(&path, e))?;
                rustix::fs::mkdirat(dst, name.as_os_str(), Mode::from_raw_mode(0o700))
                    .map_err(|e| io(&path, e))?;
                let d = rustix::fs::openat(
                    dst,
                    name.as_os_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io(&path, e))?;
                copy_dir(&s, &d, &path, walk, depth + 1, out)?;
                let _ = rustix::fs::fchmod(&d, Mode::from_raw_mode(st.st_mode & 0o7777));
            }
            FileType::Symlink => {
                let target =
                    rustix::fs::readlinkat(src, name.as_os_str(), Vec::new()).map_err(|e| io(&path, e))?;
                rustix::fs::symlinkat(target.as_c_str(), dst, name.as_os_str()).map_err(|e| io(&path, e))?;
            }
            FileType::RegularFile if st.st_nlink == 1 => {
                let size = st.st_size.max(0) as u64;
                if let Some(max) = max_bytes
                    && out.bytes + size > max
                {
                    return Err(CopyError::OverCap {
                        path: path.display().to_string(),
                        bytes: out.bytes + size,
                        max_bytes: max,
                    });
                }
                let s = rustix::fs::openat(
                    src,
                    name.as_os_str(),
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io(&path, e))?;
                let fst = rustix::fs::fstat(&s).map_err(|e| io(&path, e))?;
                if FileType::from_raw_mode(fst.st_mode) != FileType::RegularFile || fst.st_nlink != 1 {
                    out.skipped
                        .push((path.display().to_string(), "changed while copied".into()));
                    continue;
                }
                let d = rustix::fs::openat(
                    dst,
                    name.as_os_str(),
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(fst.st_mode & 0o777),
                )
                .map_err(|e| io(&path, e))?;
                let mut sf = std::fs::File::from(s);
                let mut df = std::fs::File::from(d);
                // At most what was counted: a file growing meanwhile is cut
                // at its counted size rather than passing the cap.
                let mut limited = std::io::Read::take(&mut sf, size);
                let n = std::io::copy(&mut limited, &mut df).map_err(|e| io(&path, e))?;
                out.files += 1;
                out.bytes += n;
            }
            FileType::RegularFile => out
                .skipped
                .push((path.display().to_string(), "a hard-linked file".into())),
            other => out.skipped.push((
                path.display().to_string(),
                format!("not a regular file ({other:?})"),
            )),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_inside_the_source_is_never_copied_into_itself() {
        let t = tempfile::tempdir().expect("tmp");
        let src = t.path().join("work");
        std::fs::create_dir_all(src.join("state/forks")).expect("dirs");
        std::fs::write(src.join("data.txt"), b"d").expect("data");
        let dst = src.join("state/forks/copy");
        let c = copy_tree(&src, &dst, &[], None).expect("copy");
        assert_eq!(c.files, 1, "{c:?}");
        assert_eq!(std::fs::read(dst.join("data.txt")).expect("data"), b"d");
        assert!(!dst.join("state/forks/copy").exists(), "copied into itself");
        assert_eq!(c.skipped.len(), 1, "{c:?}");
        assert_eq!(c.skipped[0].0, "state/forks/copy", "{c:?}");
    }

    #[test]
    fn copies_files_and_links_never_follows_them_and_skips_the_rest() {
        let t = tempfile::tempdir().expect("tmp");
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("sub/deeper")).expect("dirs");
        std::fs::write(src.join("a.txt"), b"alpha").expect("a");
        std::fs::write(src.join("sub/deeper/b.bin"), vec![7u8; 10_000]).expect("b");
        std::fs::write(src.join("skip.me"), b"x").expect("skip");
        std::fs::write(t.path().join("secret"), b"host only").expect("secret");
        std::os::unix::fs::symlink(t.path().join("secret"), src.join("link")).expect("link");
        std::fs::hard_link(t.path().join("secret"), src.join("hard")).expect("hard");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            src.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("fifo");
        let dst = t.path().join("dst");
        let c = copy_tree(&src, &dst, &[OsStr::new("skip.me")], None).expect("copy");
        assert_eq!(c.files, 2);
        assert_eq!(c.bytes, 10_005);
        assert_eq!(std::fs::read(dst.join("a.txt")).expect("a"), b"alpha");
        assert_eq!(
            std::fs::read(dst.join("sub/deeper/b.bin")).expect("b").len(),
            10_000
        );
        assert!(!dst.join("skip.me").exists());
        // The link is a link (to where it pointed), not a copy of the host file.
        let meta = std::fs::symlink_metadata(dst.join("link")).expect("link");
        assert!(meta.file_type().is_symlink());
        assert!(!dst.join("hard").exists() && !dst.join("fifo").exists());
        let skipped: Vec<&str> = c.skipped.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(skipped, ["fifo", "hard"]);
    }

    #[test]
    fn over_the_cap_is_refused_and_leaves_nothing() {
        let t = tempfile::tempdir().expect("tmp");
        let src = t.path().join("src");
        std::fs::create_dir_all(&src).expect("dir");
        std::fs::write(src.join("a"), vec![0u8; 600]).expect("a");
        std::fs::write(src.join("b"), vec![0u8; 600]).expect("b");
        let dst = t.path().join("dst");
        match copy_tree(&src, &dst, &[], Some(1000)) {
            Err(CopyError::OverCap {
                bytes: 1200,
                max_bytes: 1000,
                ..
            }) => {}
            other => panic!("expected OverCap, got {other:?}"),
        }
        assert!(!dst.exists());
    }
}
