//! A session's working directory on a size-limited tmpfs that outlives its
//! kernels: the mount behind `disk_mb` caps the workdir **in total** (a
//! cell writing many files, each under the cap, gets `ENOSPC` once their
//! sum reaches it).
//!
//! # Design
//!
//! A *holder* process per session (`cellhost __cellhost-disk-holder`, a
//! hidden subcommand of the binary that embeds cellhost, like the kernel
//! init) owns a mount namespace — and, when the host is not root, the user
//! namespace that owns it — in which a tmpfs of the cap's size
//! (`size=<disk_mb>m`, `nr_inodes` bounded too) is mounted over the
//! workdir's own path. Nothing else of the host's mount tree changes there
//! (`/` is made a slave first, so the tmpfs never propagates back to the
//! host).
//!
//! - **Kernels** enter the holder's namespaces before they unshare their own
//!   ([`enter`], step `namespaces` of a cold kernel's init): the kernel's
//!   mount namespace is then a copy of the holder's, so the fresh root
//!   ([`crate::rootfs`]) binds the tmpfs at the workdir path with no other
//!   change (idmapped to the kernel's uid on a root host, as any workdir).
//!   A kernel's restart, crash, OOM kill or `SIGKILL` loses nothing: the
//!   files live in the holder's tmpfs, not in the kernel.
//! - **The host** reaches the files through the holder's root,
//!   `/proc/<holder>/root/<workdir>` ([`WorkdirDisk::view`]): the files
//!   routes open that directory and resolve every path below it with
//!   `openat2(RESOLVE_BENEATH)`, as they do a plain workdir. For a
//!   non-root host the holder's user namespace is a child of the host's and
//!   maps only the host's uid, so `/proc/<holder>/root` is the host's to
//!   open (same uid, dumpable) and every file in the tmpfs is the host
//!   user's.
//! - **Lifetime**: the holder is the host's child with its stdin a pipe
//!   the host holds; it ends when that pipe closes — the host retired the
//!   [`WorkdirDisk`] ([`WorkdirDisk::finish`], or its `Drop`: the session
//!   ended, the host shuts down) or the host itself died (`SIGKILL`, a
//!   crash). The host reaps it when it is alive to.
//! - **Durability**: the workdir's files on disk are copied into the tmpfs
//!   by the host when the holder starts, and the host then *arms* the
//!   holder ([`WorkdirDisk::keep`]). An armed holder whose stdin closes
//!   copies the tmpfs back itself before it exits
//!   ([`crate::workdir_mirror`]): through a descriptor of the directory on
//!   disk it opened before mounting over it, each file written under a
//!   temporary name and renamed over its old version (atomic per file),
//!   names absent from the tmpfs removed, no symbolic link followed. That
//!   is the only copy-out, so a session's files reach the disk the same way
//!   whether its session ended, the host shut down, or the host was
//!   `SIGKILL`ed: what the cells wrote survives the host's death (except a
//!   file written in the very moment, which is on disk in its old or new
//!   version). The copy is bounded by [`MIRROR_LIMIT_SECS`] (the holder is
//!   killed by `SIGALRM` past it, files not reached yet keep their old
//!   version); on the graceful path the host waits for the holder's exit,
//!   so nothing races the copy. Not survived: the machine's own crash or
//!   power loss (the tmpfs is memory), or the holder killed together with
//!   the host (a whole cgroup or process group killed at once).
//!
//! Why not the alternatives: a tmpfs in the kernel's own mount namespace
//! dies with the kernel (a `SIGKILL` or OOM kill would lose the files
//! unless copied out first, which a killed kernel cannot do); a loop image
//! or a project quota needs root; `RLIMIT_FSIZE` bounds one file only.
//! The price of a tmpfs: its pages are memory (charged to the memory cgroup
//! of the kernel that wrote them, so `memory_mb` bounds them too; with no
//! swap they stay resident), which is why only a session with a `disk_mb`
//! gets one, sized to it.
//!
//! Without the namespaces (sandbox off, or no user namespaces for a
//! non-root host) there is no holder: the cap is the host's accounting and
//! `RLIMIT_FSIZE` only, and the kernel's sandbox reports layer `disk` as
//! missing with the reason.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::profile::LayerStatus;
use crate::sys::Sys;

/// The hidden subcommand that turns the process into a workdir holder.
pub const HOLDER_ARG: &str = "__cellhost-disk-holder";

/// Bytes of the cap per tmpfs inode allowed (one inode per KiB of the cap,
/// at least [`MIN_INODES`]): a cell cannot exhaust the host's memory with
/// millions of empty files either.
pub const BYTES_PER_INODE: u64 = 1024;

/// Fewest inodes a workdir tmpfs allows.
pub const MIN_INODES: u64 = 4096;

/// Longest the holder's copy-out may take, in seconds (then `SIGALRM` ends
/// it; the host waiting on the graceful path waits no longer). A tmpfs is
/// at most `disk_mb` of memory, copied at disk speed: minutes are room for
/// the operator's largest cap.
pub const MIRROR_LIMIT_SECS: u32 = 300;

/// The top-level name in the tmpfs the host stages its copy-in under
/// (never copied out).
pub const COPY_IN: &str = ".cellhost-copy-in";

/// What the host writes on the holder's stdin to arm it (the tmpfs holds
/// the workdir's files: copy them back when stdin closes).
const KEEP_LINE: &[u8] = b"keep\n";

/// Why a tmpfs cannot be idmapped on this host (`None`: it can): Linux
/// before 6.3 has no idmapped mounts of tmpfs. As root the kernel runs as
/// a uid of its own and writes its workdir through an idmapped mount; on
/// such a host a tmpfs workdir would be unwritable to it, so the session
/// keeps the uid layer and the cap is the host's accounting instead.
/// Read once per process.
pub fn tmpfs_idmap_missing() -> Option<String> {
    static WHY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    WHY.get_or_init(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
        tmpfs_idmap_missing_on(release.trim())
    })
    .clone()
}

/// [`tmpfs_idmap_missing`] for the kernel release `release` (`6.1.0-28-amd64`).
/// A release that does not parse is taken as able.
pub fn tmpfs_idmap_missing_on(release: &str) -> Option<String> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    ((major, minor) < (6, 3)).then(|| format!("Linux {release} cannot idmap a tmpfs (6.3 and later can)"))
}

/// The holder a kernel enters ([`crate::profile::InitSpec::workdir_disk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderNs {
    /// The holder's pid (the host's unreaped child, so the number names it
    /// for as long as the kernel starts).
    pub pid: u32,
    /// The holder has a user namespace of its own (non-root host): the
    /// kernel enters it before the mount namespace.
    pub user: bool,
    /// The cap in bytes (the tmpfs's size), for the layer's detail.
    pub bytes: u64,
}

/// What a kernel's profile says of the session's disk cap
/// ([`crate::profile::SandboxProfile::disk`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DiskPlan {
    /// The workdir is the holder's tmpfs: the kernel enters it.
    Mounted(HolderNs),
    /// No mount: the cap is the host's accounting and `RLIMIT_FSIZE`
    /// (reported as the missing layer `disk`, with why).
    Accounting {
        /// Why there is no mount.
        reason: String,
    },
}

/// Enters the holder's namespaces (its user namespace first when it has
/// one, then its mount namespace), so the namespaces the kernel unshares
/// next are made from them. Returns layer `disk`.
pub fn enter(sys: &dyn Sys, h: &HolderNs) -> LayerStatus {
    let ns = |what: &str| PathBuf::from(format!("/proc/{}/ns/{what}", h.pid));
    let done = (if h.user {
        sys.setns_path(&ns("user"), libc::CLONE_NEWUSER)
    } else {
        Ok(())
    })
    .and_then(|()| sys.setns_path(&ns("mnt"), libc::CLONE_NEWNS));
    match done {
        Ok(()) => LayerStatus::on(
            "disk",
            format!(
                "workdir on a tmpfs of {} MiB held for the session (disk_mb: the sum of its files is capped)",
                h.bytes >> 20
            ),
        ),
        Err(e) => LayerStatus::missing("disk", format!("cannot enter the workdir holder {}: {e}", h.pid)),
    }
}

/// Why a holder could not be started.
#[derive(Debug, thiserror::Error)]
#[error("workdir holder for {dir}: {reason}")]
pub struct HolderError {
    /// The workdir.
    pub dir: PathBuf,
    /// What failed (the holder's own message when it said one).
    pub reason: String,
}

/// A running holder: the session's workdir tmpfs. Dropping it closes the
/// holder's stdin and reaps it: an armed holder ([`WorkdirDisk::keep`])
/// copies the tmpfs back to disk first (waited for, at most
/// [`MIRROR_LIMIT_SECS`]), one not armed is killed.
#[derive(Debug)]
pub struct WorkdirDisk {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    armed: bool,
    dir: PathBuf,
    bytes: u64,
    user: bool,
}

impl WorkdirDisk {
    /// Starts a holder for `dir` (an existing directory, its path
    /// canonical) with a cap of `bytes`, running `program` (the binary that
    /// embeds cellhost and dispatches [`HOLDER_ARG`]). Returns once the
    /// tmpfs is mounted.
    ///
    /// # Errors
    /// [`HolderError`]: the holder could not start, or said why it could
    /// not mount (no user namespaces, a directory it cannot own).
    pub fn start(program: &Path, dir: &Path, bytes: u64) -> Result<WorkdirDisk, HolderError> {
        use std::os::unix::process::CommandExt;
        let err = |reason: String| HolderError {
            dir: dir.to_path_buf(),
            reason,
        };
        let mut cmd = Command::new(program);
        cmd.arg0("cellhost")
            .arg(HOLDER_ARG)
            .arg("--bytes")
            .arg(bytes.to_string())
            .arg("--dir")
            .arg(dir)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(|e| err(format!("cannot start it: {e}")))?;
        let stdin = child.stdin.take();
        let Some(out) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err("no stdout".into()));
        };
        let mut out = BufReader::new(out);
        let mut line = String::new();
        let read = out.read_line(&mut line).map(drop);
        let trimmed = line.trim();
        let user = match (read, trimmed) {
            (Ok(()), "ready user") => true,
            (Ok(()), "ready") => false,
            (r, said) => {
                drop(stdin);
                let _ = child.kill();
                let _ = child.wait();
                let why = match r {
                    Err(e) => e.to_string(),
                    Ok(()) if said.is_empty() => "it exited without a word".into(),
                    Ok(()) => said.trim_start_matches("error: ").to_string(),
                };
                return Err(err(why));
            }
        };
        Ok(WorkdirDisk {
            child,
            stdin,
            stdout: out,
            armed: false,
            dir: dir.to_path_buf(),
            bytes,
            user,
        })
    }

    /// The holder's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What a kernel's init is told to enter.
    pub fn ns(&self) -> HolderNs {
        HolderNs {
            pid: self.pid(),
            user: self.user,
            bytes: self.bytes,
        }
    }

    /// The cap in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The workdir's path (on the host, the directory on disk; in the
    /// holder's and its kernels' view, the tmpfs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the host reaches the tmpfs: `/proc/<holder>/root/<dir>`.
    pub fn view(&self) -> PathBuf {
        let rel = self.dir.strip_prefix("/").unwrap_or(&self.dir);
        PathBuf::from(format!("/proc/{}/root", self.pid())).join(rel)
    }

    /// The holder still runs.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Arms the holder: the tmpfs now holds the workdir's files, so from
    /// here on the holder copies them back to the directory on disk when
    /// its stdin closes — when the host retires it, and when the host dies.
    /// Call it once the copy-in is complete (a holder not armed copies
    /// nothing back: a partial copy-in never replaces the files on disk).
    ///
    /// # Errors
    /// [`HolderError`]: the holder is gone (its stdin pipe is broken).
    pub fn keep(&mut self) -> Result<(), HolderError> {
        let done = match self.stdin.as_mut() {
            Some(s) => s.write_all(KEEP_LINE).and_then(|()| s.flush()),
            None => Err(std::io::Error::other("stdin already closed")),
        };
        done.map_err(|e| HolderError {
            dir: self.dir.clone(),
            reason: format!("cannot arm it: {e}"),
        })?;
        self.armed = true;
        Ok(())
    }

    /// Ends the holder: closes its stdin, waits for its copy-out (armed) and
    /// its exit, and reaps it. Blocking, at most [`MIRROR_LIMIT_SECS`].
    ///
    /// # Errors
    /// [`HolderError`]: the copy-out left entries out (their old versions
    /// stay on disk; the holder's count and first failure in the reason),
    /// ran past its time, or the holder died otherwise.
    pub fn finish(mut self) -> Result<(), HolderError> {
        drop(self.stdin.take());
        if !self.armed {
            let _ = self.child.kill();
        }
        let mut line = String::new();
        let said = self.stdout.read_line(&mut line);
        let status = self.child.wait();
        let err = |reason: String| HolderError {
            dir: self.dir.clone(),
            reason,
        };
        if !self.armed {
            return Ok(());
        }
        let line = line.trim();
        match status {
            Ok(st) if st.success() && line.starts_with("done") => Ok(()),
            Ok(_) if line.starts_with("error: ") => Err(err(line.trim_start_matches("error: ").to_string())),
            Ok(st) if st.signal() == Some(libc::SIGALRM) => Err(err(format!(
                "copying the tmpfs back took longer than {MIRROR_LIMIT_SECS} s: files not reached keep their old version"
            ))),
            Ok(st) => Err(err(format!(
                "the holder ended ({st}) before it said its copy-out was done{}",
                said.err().map(|e| format!(": {e}")).unwrap_or_default()
            ))),
            Err(e) => Err(err(format!("cannot reap the holder: {e}"))),
        }
    }
}

impl Drop for WorkdirDisk {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if !self.armed {
            let _ = self.child.kill();
        }
        // An armed holder copies its tmpfs back and exits (bounded by its
        // own alarm); a finished one is reaped already.
        let _ = self.child.wait();
    }
}

/// The holder's tmpfs options for a cap of `bytes` on a directory of
/// `mode`, `uid` and `gid`.
pub fn tmpfs_options(bytes: u64, mode: u32, uid: u32, gid: u32) -> String {
    let inodes = (bytes / BYTES_PER_INODE).max(MIN_INODES);
    format!(
        "size={bytes},nr_inodes={inodes},mode={:o},uid={uid},gid={gid}",
        mode & 0o7777
    )
}

/// The holder's body: a descriptor of `--dir` on disk, its own namespaces,
/// the tmpfs over `--dir`, `ready` (or `error: …`) on stdout, then a wait
/// for its stdin to close; armed (a line came first), the copy-out, `done
/// …` or `error: …` on stdout.
fn holder_main(args: &[OsString]) -> ! {
    let sys = crate::sys::Linux;
    let say = |line: &str| {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    let fail = |msg: String| -> ! {
        say(&format!("error: {msg}"));
        std::process::exit(70)
    };
    crate::fds::close_all_except(&[]);
    let mut dir: Option<PathBuf> = None;
    let mut bytes: Option<u64> = None;
    let mut i = 0;
    while i < args.len() {
        let val = args.get(i + 1);
        match args[i].to_str() {
            Some("--dir") => dir = val.map(|v| PathBuf::from(v.clone())),
            Some("--bytes") => bytes = val.and_then(|v| v.to_str()).and_then(|v| v.parse().ok()),
            _ => fail("usage: __cellhost-disk-holder --bytes N --dir PATH".into()),
        }
        i += 2;
    }
    let (Some(dir), Some(bytes)) = (dir, bytes) else {
        fail("usage: __cellhost-disk-holder --bytes N --dir PATH".into())
    };
    // SAFETY: setting a signal's disposition to SIG_IGN runs no handler;
    // the holder writes its last line to a host that may be gone (EPIPE,
    // not death, then).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // The directory on disk, before anything covers it: the copy-out's
    // destination.
    let on_disk = match rustix::fs::open(
        &dir,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => fail(format!("{}: {e}", dir.display())),
    };
    let (uid, gid) = (sys.geteuid(), sys.getegid());
    let user = uid != 0;
    if user {
        use crate::sys::IdMapFile;
        if let Err(e) = sys.unshare(libc::CLONE_NEWUSER) {
            fail(format!(
                "unshare(CLONE_NEWUSER): {e} (unprivileged user namespaces disabled?)"
            ));
        }
        let maps = sys
            .write_id_map(IdMapFile::Setgroups, "deny")
            .and_then(|()| sys.write_id_map(IdMapFile::UidMap, &format!("{uid} {uid} 1")))
            .and_then(|()| sys.write_id_map(IdMapFile::GidMap, &format!("{gid} {gid} 1")));
        if let Err(e) = maps {
            fail(format!("cannot write id maps: {e}"));
        }
    }
    if let Err(e) = sys.unshare(libc::CLONE_NEWNS) {
        fail(format!("unshare(CLONE_NEWNS): {e}"));
    }
    if let Err(e) = sys.mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_SLAVE, None) {
        fail(format!("cannot make / a slave: {e}"));
    }
    let meta = match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => m,
        Ok(_) => fail(format!("{} is not a directory", dir.display())),
        Err(e) => fail(format!("{}: {e}", dir.display())),
    };
    let data = tmpfs_options(bytes, meta.mode(), meta.uid(), meta.gid());
    if let Err(e) = sys.mount(
        Some(Path::new("tmpfs")),
        &dir,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&data),
    ) {
        fail(format!("cannot mount a tmpfs on {}: {e}", dir.display()));
    }
    let tmpfs = match rustix::fs::open(
        &dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => fail(format!("cannot open the tmpfs on {}: {e}", dir.display())),
    };
    say(if user { "ready user" } else { "ready" });
    // Until the host closes our stdin (or dies): then, armed, the files go
    // back to disk, and the mount goes with this namespace (kernels still in
    // their copies keep theirs until they end).
    let mut buf = [0u8; 64];
    let mut armed = false;
    loop {
        match rustix::io::read(rustix::stdio::stdin(), &mut buf) {
            Err(rustix::io::Errno::INTR) => continue,
            Ok(0) | Err(_) => break,
            Ok(_) => armed = true,
        }
    }
    if !armed {
        std::process::exit(0);
    }
    // SAFETY: alarm(2) only schedules SIGALRM, whose default action ends
    // the process: the copy-out's bound.
    unsafe {
        libc::alarm(MIRROR_LIMIT_SECS);
    }
    let m = crate::workdir_mirror::mirror(tmpfs.as_fd(), on_disk.as_fd(), &[std::ffi::OsStr::new(COPY_IN)]);
    match &m.first_error {
        None => {
            say(&format!("done {} files {} bytes", m.files, m.bytes));
            std::process::exit(0)
        }
        Some(first) => {
            say(&format!(
                "error: {} entries not copied back (their old versions kept), first {first}",
                m.errors
            ));
            std::process::exit(75)
        }
    }
}

/// Becomes a holder (and never returns) when `args[1]` is [`HOLDER_ARG`].
pub(crate) fn dispatch(args: &[OsString]) {
    if args.get(1).is_some_and(|a| a.as_bytes() == HOLDER_ARG.as_bytes()) {
        holder_main(&args[2..]);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tmpfs_idmaps_from_linux_6_3() {
        use super::tmpfs_idmap_missing_on as missing;
        assert!(missing("6.1.0-28-amd64").is_some_and(|w| w.contains("6.1.0-28-amd64")));
        assert!(missing("5.15.0").is_some());
        assert_eq!(missing("6.3.0"), None);
        assert_eq!(missing("6.18.2-generic"), None);
        assert_eq!(missing("7.0"), None);
        assert_eq!(missing("garbage"), None, "an unknown release is taken as able");
    }

    use super::*;

    #[test]
    fn options_bound_size_and_inodes() {
        assert_eq!(
            tmpfs_options(20 << 20, 0o40700, 1002, 1002),
            "size=20971520,nr_inodes=20480,mode=700,uid=1002,gid=1002"
        );
        assert!(tmpfs_options(1 << 20, 0o755, 0, 0).contains("nr_inodes=4096"));
    }

    #[test]
    fn enter_reports_the_layer() {
        let sys = crate::sys::record::Record::new(1002);
        let l = enter(
            &sys,
            &HolderNs {
                pid: 42,
                user: true,
                bytes: 8 << 20,
            },
        );
        assert!(l.enforced, "{l:?}");
        assert!(l.detail.contains("8 MiB"), "{l:?}");
        assert_eq!(
            *sys.calls.borrow(),
            [
                ("setns", format!("/proc/42/ns/user {:#x}", libc::CLONE_NEWUSER)),
                ("setns", format!("/proc/42/ns/mnt {:#x}", libc::CLONE_NEWNS)),
            ]
        );
        let failing = crate::sys::record::Record::failing(0, &["setns"]);
        let l = enter(
            &failing,
            &HolderNs {
                pid: 7,
                user: false,
                bytes: 1 << 20,
            },
        );
        assert!(!l.enforced && !l.optional, "{l:?}");
        assert_eq!(failing.names(), ["setns"]);
    }
}
