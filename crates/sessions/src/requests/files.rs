//! `write_file`, `read_file`, `list_files`, `delete_file`: a session's files,
//! by paths relative to its working directory.
//!
//! The working directory is bound read-write into the session's kernels, so
//! anything in it may be a link, a FIFO or a directory the cell planted or
//! swaps while a request runs; the host (which may be root) must never
//! reach outside it. Every path is therefore:
//!
//! - checked as text first ([`validate_path`]): relative, no `..`, no NUL,
//!   at most [`MAX_PATH_BYTES`] bytes and [`MAX_NAME_BYTES`] a component;
//! - resolved by the kernel, not by us: `openat2(2)` from a descriptor of
//!   the workdir with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, so `..`,
//!   absolute links, links leading out and `/proc/self/root`-style magic
//!   links fail in the kernel's own path walk, atomically — a link swapped
//!   in mid-request cannot redirect an open that already resolved, and the
//!   parent descriptor a write or delete holds is the directory that was
//!   checked;
//! - written atomically: a temporary file in the same directory, then
//!   `renameat` over the name (a link at the name is replaced, never
//!   followed); a reader sees the old file or the new one, never half;
//! - read only when it is a regular file with one link (a hard link may be
//!   another name of a file outside the workdir).
//!
//! A file a cell wrote is visible at once: requests read the directory
//! itself, with no cache in between.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{RequestError, SessionSpec};
use crate::registry::Registry;

/// Longest path a request may name, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;

/// Longest component of a path, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// Default size cap of a written file, in bytes (100 MiB).
pub const DEFAULT_MAX_WRITE: u64 = 100 * 1024 * 1024;

/// Most entries a listing returns.
pub const MAX_LIST_ENTRIES: usize = 10_000;

fn refused(path: &str, reason: impl Into<String>) -> RequestError {
    RequestError::PathRefused {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// Checks a path a request names, relative to the workdir, and returns its
/// plain components. An empty path (or `.`) is the workdir itself and is
/// allowed only where `allow_root`.
///
/// # Errors
/// [`RequestError::PathRefused`]: absolute, `..`, NUL, too long.
pub fn validate_path(path: &str, allow_root: bool) -> Result<PathBuf, RequestError> {
    if path.len() > MAX_PATH_BYTES {
        return Err(refused(
            &path[..path.floor_char_boundary(64)],
            format!("longer than {MAX_PATH_BYTES} bytes"),
        ));
    }
    if path.contains('\0') {
        return Err(refused(path, "contains a NUL byte"));
    }
    if path.starts_with('/') {
        return Err(refused(
            path,
            "absolute; paths are relative to the session's workdir",
        ));
    }
    let mut out = PathBuf::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(n) if n.len() > MAX_NAME_BYTES => {
                return Err(refused(
                    path,
                    format!("a component is longer than {MAX_NAME_BYTES} bytes"),
                ));
            }
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(refused(path, "contains `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(refused(
                    path,
                    "absolute; paths are relative to the session's workdir",
                ));
            }
        }
    }
    if out.as_os_str().is_empty() && !allow_root {
        return Err(refused(path, "names the workdir itself, not a file"));
    }
    Ok(out)
}

/// The session's workdir, open as a directory.
fn open_workdir(reg: &Registry, spec: &SessionSpec) -> Result<(OwnedFd, PathBuf), RequestError> {
    let key = spec.key(reg)?;
    let Some(dir) = reg.workdir_files(&key) else {
        return Err(RequestError::bad_request(format!(
            "session {:?} has no working directory yet (run a cell first)",
            spec.session
        )));
    };
    let fd = rustix::fs::open(
        &dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOENT => RequestError::SessionNotFound {
            session: spec.session.clone(),
            live: false,
        },
        e => io_error("the workdir", e),
    })?;
    Ok((fd, dir))
}

/// A failed write of `size` bytes so far into `path`: with a disk cap
/// (`budget`: the cap and the bytes used, both in bytes), a full workdir
/// tmpfs (`ENOSPC`) is the cap (`disk_full`), not an I/O failure.
fn write_error(path: String, size: u64, budget: Option<(u64, u64)>, e: std::io::Error) -> RequestError {
    match budget {
        Some((cap, used)) if e.raw_os_error() == Some(Errno::NOSPC.raw_os_error()) => {
            RequestError::DiskFull {
                path,
                bytes: size,
                used,
                max_mb: cap >> 20,
            }
        }
        _ => io_error(&path, e),
    }
}

fn io_error(path: &str, e: impl std::fmt::Display) -> RequestError {
    RequestError::FileIo {
        path: path.to_string(),
        message: e.to_string(),
    }
}

/// The resolution of every open below the workdir.
fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

/// Maps an error of a resolution below the workdir.
fn resolve_error(shown: &str, e: Errno) -> RequestError {
    match e {
        Errno::NOENT => RequestError::FileNotFound {
            path: shown.to_string(),
        },
        Errno::XDEV | Errno::LOOP | Errno::PERM | Errno::ACCESS => refused(
            shown,
            "it resolves outside the session's workdir (a link or mount leads out)",
        ),
        Errno::NOTDIR => refused(shown, "a component of the path is not a directory"),
        Errno::NAMETOOLONG => refused(shown, "too long"),
        Errno::NXIO => refused(shown, "a FIFO or socket"),
        Errno::NOSYS => io_error(shown, "this kernel has no openat2 (Linux 5.6 or later is needed)"),
        e => io_error(shown, e),
    }
}

/// Opens `rel` below `root` as `flags`, resolved by the kernel beneath it.
fn open_beneath(root: &OwnedFd, rel: &Path, flags: OFlags, shown: &str) -> Result<OwnedFd, RequestError> {
    let rel: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    rustix::fs::openat2(
        root,
        rel,
        flags | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
        beneath(),
    )
    .map_err(|e| resolve_error(shown, e))
}

/// The parent directory of `rel` (created, mode 0700, when `create`) and
/// the last component.
fn parent_of<'a>(
    root: &OwnedFd,
    rel: &'a Path,
    create: bool,
    shown: &str,
) -> Result<(OwnedFd, &'a OsStr), RequestError> {
    let Some(name) = rel.file_name() else {
        return Err(refused(shown, "names the workdir itself, not a file"));
    };
    let mut dir = open_beneath(root, Path::new("."), OFlags::RDONLY | OFlags::DIRECTORY, shown)?;
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            let Component::Normal(n) = c else { continue };
            if create {
                match rustix::fs::mkdirat(&dir, n, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(resolve_error(shown, e)),
                }
            }
            // One component at a time, each beneath the directory before
            // it, so a link anywhere on the way fails.
            dir = rustix::fs::openat2(
                &dir,
                n,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
                beneath() | ResolveFlags::NO_SYMLINKS,
            )
            .map_err(|e| resolve_error(shown, e))?;
        }
    }
    Ok((dir, name))
}

/// Milliseconds since the Unix epoch of a stat's mtime.
fn mtime_ms(st: &rustix::fs::Stat) -> i64 {
    st.st_mtime.saturating_mul(1000) + i64::try_from(st.st_mtime_nsec / 1_000_000).unwrap_or(0)
}

/// What a file is, as a listing says.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

impl FileKind {
    fn of(mode: u32) -> FileKind {
        match FileType::from_raw_mode(mode) {
            FileType::RegularFile => FileKind::File,
            FileType::Directory => FileKind::Dir,
            FileType::Symlink => FileKind::Symlink,
            _ => FileKind::Other,
        }
    }
}

/// Write a file into a session's workdir, atomically (all or nothing).
#[derive(Debug, Clone)]
pub struct WriteFileRequest {
    /// The session (its workdir).
    pub session: SessionSpec,
    /// Path relative to the workdir; missing directories are created.
    pub path: String,
    /// Refuse a body larger than this many bytes ([`DEFAULT_MAX_WRITE`]
    /// unless the surface is configured otherwise).
    pub max_bytes: u64,
}

/// What a write did.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FileWritten {
    /// The path, relative to the workdir.
    pub path: String,
    /// Bytes written.
    pub size: u64,
    /// A file existed at the path and was replaced.
    pub replaced: bool,
}

/// A random temporary name beside the target.
fn temp_name(name: &OsStr) -> std::ffi::OsString {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    let mut s = std::ffi::OsString::from(".cellhost-");
    s.push(format!("{:016x}-", u64::from_le_bytes(b)));
    let short: Vec<u8> = name.as_bytes().iter().copied().take(64).collect();
    s.push(OsStr::from_bytes(&short));
    s.push(".tmp");
    s
}

impl WriteFileRequest {
    /// Streams `body` into the file: a temporary file in the target's
    /// directory, synced, then renamed over the target. At most
    /// `max_bytes` are accepted; past that nothing is written.
    ///
    /// # Errors
    /// `path_refused`, `file_too_large` (`max_bytes` exceeded; the file is
    /// untouched), `bad_request` (a directory at the path, no workdir),
    /// `file_io_failed` (reading the body or writing failed; the file is
    /// untouched), and the session's key errors.
    pub async fn execute<R: AsyncRead + Unpin>(
        &self,
        reg: &Registry,
        mut body: R,
    ) -> Result<FileWritten, RequestError> {
        let rel = validate_path(&self.path, false)?;
        let shown = rel.display().to_string();
        let (root, root_path) = open_workdir(reg, &self.session)?;
        let (dir, name) = parent_of(&root, &rel, true, &shown)?;
        let existing = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).ok();
        // The session's disk cap (`disk_mb`) bounds the workdir after the
        // write: what it holds now, less the file this one replaces.
        let budget = match reg.session_limits(&self.session.key(reg)?).disk_bytes() {
            Some(cap) => {
                let replaced = existing
                    .as_ref()
                    .filter(|st| FileKind::of(st.st_mode) == FileKind::File)
                    .map_or(0, |st| st.st_size as u64);
                let used = tokio::task::spawn_blocking(move || {
                    crate::limits::disk_usage(&root_path, crate::limits::USAGE_MAX_ENTRIES)
                })
                .await
                .unwrap_or(0);
                Some((cap, used.saturating_sub(replaced)))
            }
            None => None,
        };
        if existing
            .as_ref()
            .is_some_and(|st| FileKind::of(st.st_mode) == FileKind::Dir)
        {
            return Err(RequestError::bad_request(format!(
                "{shown}: a directory is at that path"
            )));
        }
        let tmp = temp_name(name);
        let fd = rustix::fs::openat(
            &dir,
            &tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| resolve_error(&shown, e))?;
        let cleanup = |dir: &OwnedFd| {
            let _ = rustix::fs::unlinkat(dir, &tmp, AtFlags::empty());
        };
        let mut file = tokio::fs::File::from_std(std::fs::File::from(fd));
        let mut size: u64 = 0;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match body.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    cleanup(&dir);
                    return Err(io_error(&shown, format!("reading the body failed: {e}")));
                }
            };
            size += n as u64;
            if size > self.max_bytes {
                cleanup(&dir);
                return Err(RequestError::FileTooLarge {
                    path: shown,
                    max_bytes: self.max_bytes,
                });
            }
            if let Some((cap, used)) = budget
                && used.saturating_add(size) > cap
            {
                cleanup(&dir);
                return Err(RequestError::DiskFull {
                    path: shown,
                    bytes: size,
                    used,
                    max_mb: cap >> 20,
                });
            }
            if let Err(e) = file.write_all(&buf[..n]).await {
                cleanup(&dir);
                return Err(write_error(shown, size, budget, e));
            }
        }
        if let Err(e) = async {
            file.flush().await?;
            file.sync_all().await
        }
        .await
        {
            cleanup(&dir);
            return Err(write_error(shown, size, budget, e));
        }
        drop(file);
        if let Err(e) = rustix::fs::renameat(&dir, &tmp, &dir, name) {
            cleanup(&dir);
            return Err(match e {
                Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST => {
                    RequestError::bad_request(format!("{shown}: a directory is at that path"))
                }
                e => io_error(&shown, e),
            });
        }
        Ok(FileWritten {
            path: shown,
            size,
            replaced: existing.is_some(),
        })
    }
}

/// Read a file of a session's workdir (a byte range of it).
#[derive(Debug, Clone)]
pub struct ReadFileRequest {
    /// The session (its workdir).
    pub session: SessionSpec,
    /// Path relative to the workdir.
    pub path: String,
    /// First byte to read.
    pub offset: u64,
    /// Bytes to read at most (`None`: to the end).
    pub length: Option<u64>,
}

/// An open file of a session, positioned at the asked offset.
#[derive(Debug)]
pub struct OpenedFile {
    /// The file, positioned at `offset`.
    pub file: tokio::fs::File,
    /// The path, relative to the workdir.
    pub path: String,
    /// The file's whole size in bytes.
    pub size: u64,
    /// Its modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
    /// Where the range starts.
    pub offset: u64,
    /// Bytes of the range (`offset + length <= size`).
    pub length: u64,
}

impl ReadFileRequest {
    /// Opens the file for the asked range.
    ///
    /// # Errors
    /// `path_refused` (outside the workdir, a link leading out, a hard
    /// link, a special file), `file_not_found`, `bad_request` (a
    /// directory), `range_not_satisfiable` (`offset` past the end),
    /// `file_io_failed`, and the session's key errors.
    pub async fn execute(&self, reg: &Registry) -> Result<OpenedFile, RequestError> {
        use std::io::Seek;
        let rel = validate_path(&self.path, false)?;
        let shown = rel.display().to_string();
        let (root, _) = open_workdir(reg, &self.session)?;
        let fd = open_beneath(&root, &rel, OFlags::RDONLY | OFlags::NONBLOCK, &shown)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_error(&shown, e))?;
        match FileKind::of(st.st_mode) {
            FileKind::File => {}
            FileKind::Dir => {
                return Err(RequestError::bad_request(format!(
                    "{shown} is a directory (list it instead)"
                )));
            }
            _ => return Err(refused(&shown, "not a regular file")),
        }
        if st.st_nlink > 1 {
            return Err(refused(
                &shown,
                "a file with more than one hard link (it may be a file outside the workdir)",
            ));
        }
        let size = st.st_size.max(0) as u64;
        if self.offset > size || (self.offset == size && size > 0 && self.length != Some(0)) {
            return Err(RequestError::RangeNotSatisfiable {
                path: shown,
                offset: self.offset,
                size,
            });
        }
        let length = self
            .length
            .map_or(size - self.offset, |l| l.min(size - self.offset));
        // The file was opened non-blocking (a FIFO planted at the path must
        // not hang the open); a regular file reads the same either way.
        rustix::fs::fcntl_setfl(&fd, OFlags::empty()).map_err(|e| io_error(&shown, e))?;
        let mut f = std::fs::File::from(fd);
        f.seek(std::io::SeekFrom::Start(self.offset))
            .map_err(|e| io_error(&shown, e))?;
        Ok(OpenedFile {
            file: tokio::fs::File::from_std(f),
            path: shown,
            size,
            mtime_ms: mtime_ms(&st),
            offset: self.offset,
            length,
        })
    }

    /// Reads the whole range into memory, refusing more than `max_bytes`.
    ///
    /// # Errors
    /// As [`ReadFileRequest::execute`], and `file_too_large` when the
    /// range is longer than `max_bytes`.
    pub async fn read_to_vec(
        &self,
        reg: &Registry,
        max_bytes: u64,
    ) -> Result<(OpenedFile, Vec<u8>), RequestError> {
        let mut opened = self.execute(reg).await?;
        if opened.length > max_bytes {
            return Err(RequestError::FileTooLarge {
                path: opened.path,
                max_bytes,
            });
        }
        let mut buf = Vec::with_capacity(opened.length as usize);
        (&mut opened.file)
            .take(opened.length)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| io_error(&opened.path, e))?;
        Ok((opened, buf))
    }
}

/// List a directory of a session's workdir.
#[derive(Debug, Clone)]
pub struct ListFilesRequest {
    /// The session (its workdir).
    pub session: SessionSpec,
    /// Directory relative to the workdir (empty: the workdir).
    pub path: String,
}

/// One entry of a listing.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileEntry {
    /// Its name (lossily UTF-8).
    pub name: String,
    /// Its path relative to the workdir.
    pub path: String,
    /// What it is (links are reported, not followed).
    #[serde(rename = "type")]
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
}

/// A directory's listing.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileListing {
    /// The directory, relative to the workdir (`""`: the workdir).
    pub path: String,
    /// Its entries by name.
    pub entries: Vec<FileEntry>,
    /// More than [`MAX_LIST_ENTRIES`] entries existed; the first are shown.
    pub truncated: bool,
}

impl ListFilesRequest {
    /// Lists the directory.
    ///
    /// # Errors
    /// `path_refused`, `file_not_found`, `bad_request` (not a directory),
    /// `file_io_failed`, and the session's key errors.
    pub async fn execute(&self, reg: &Registry) -> Result<FileListing, RequestError> {
        let rel = validate_path(&self.path, true)?;
        let shown = rel.display().to_string();
        let (root, _) = open_workdir(reg, &self.session)?;
        let fd =
            open_beneath(&root, &rel, OFlags::RDONLY | OFlags::DIRECTORY, &shown).map_err(|e| match e {
                RequestError::PathRefused { reason, .. } if reason.contains("not a directory") => {
                    RequestError::bad_request(format!("{shown} is not a directory"))
                }
                e => e,
            })?;
        let mut dir = rustix::fs::Dir::read_from(&fd).map_err(|e| io_error(&shown, e))?;
        let mut entries = Vec::new();
        let mut truncated = false;
        while let Some(ent) = dir.read() {
            let ent = ent.map_err(|e| io_error(&shown, e))?;
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if entries.len() >= MAX_LIST_ENTRIES {
                truncated = true;
                break;
            }
            let os = OsStr::from_bytes(name);
            // Gone since the read (a cell deletes as we list): skipped.
            let Ok(st) = rustix::fs::statat(fd.as_fd(), os, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let name = String::from_utf8_lossy(name).into_owned();
            entries.push(FileEntry {
                path: rel.join(&name).display().to_string(),
                name,
                kind: FileKind::of(st.st_mode),
                size: st.st_size.max(0) as u64,
                mtime_ms: mtime_ms(&st),
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(FileListing {
            path: shown,
            entries,
            truncated,
        })
    }
}

/// Delete a file (or an empty directory) of a session's workdir.
#[derive(Debug, Clone)]
pub struct DeleteFileRequest {
    /// The session (its workdir).
    pub session: SessionSpec,
    /// Path relative to the workdir.
    pub path: String,
}

/// What a delete removed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileDeleted {
    /// The path, relative to the workdir.
    pub path: String,
    /// What it was (a link is removed itself, never its target).
    #[serde(rename = "type")]
    pub kind: FileKind,
}

impl DeleteFileRequest {
    /// Removes the entry (a link itself, never what it points to; a
    /// directory only when empty).
    ///
    /// # Errors
    /// `path_refused`, `file_not_found`, `bad_request` (a directory that
    /// is not empty), `file_io_failed`, and the session's key errors.
    pub async fn execute(&self, reg: &Registry) -> Result<FileDeleted, RequestError> {
        let rel = validate_path(&self.path, false)?;
        let shown = rel.display().to_string();
        let (root, _) = open_workdir(reg, &self.session)?;
        let (dir, name) = parent_of(&root, &rel, false, &shown)?;
        let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| resolve_error(&shown, e))?;
        let kind = FileKind::of(st.st_mode);
        let flags = if kind == FileKind::Dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&dir, name, flags).map_err(|e| match e {
            Errno::NOTEMPTY | Errno::EXIST => {
                RequestError::bad_request(format!("{shown}: the directory is not empty"))
            }
            e => resolve_error(&shown, e),
        })?;
        Ok(FileDeleted { path: shown, kind })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked_as_text() {
        assert_eq!(
            validate_path("a/b.txt", false).ok(),
            Some(PathBuf::from("a/b.txt"))
        );
        assert_eq!(validate_path("./a//b", false).ok(), Some(PathBuf::from("a/b")));
        assert_eq!(validate_path("", true).ok(), Some(PathBuf::new()));
        for bad in ["", ".", "../x", "a/../../x", "/etc/passwd", "a\0b"] {
            let e = validate_path(bad, false).expect_err(bad);
            assert_eq!(e.code(), "path_refused", "{bad}");
        }
        assert!(validate_path(&"a/".repeat(3000), false).is_err());
        assert!(validate_path(&"x".repeat(256), false).is_err());
    }
}
