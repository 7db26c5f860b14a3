//! Session checkpoints: the modes, their settings, the host's store of
//! checkpoint files and the cells that write and read them in a kernel.
//!
//! A `namespace` checkpoint is the picklable part of a Python session's
//! namespace, written by the worker (`cellhost_worker.checkpoint`) as a
//! silent cell after a successful cell, off the cell's critical path: the
//! result goes to the caller first, and the session's next cell waits for
//! the checkpoint to end (bounded by [`CheckpointSettings::timeout`]).
//!
//! Trust: a checkpoint is data a cell can shape, so the host never
//! interprets its bytes. The worker writes it to a fresh, randomly named
//! file in its workdir; the host opens that name without following links,
//! takes it only if it is a regular file with one link and within the cap,
//! copies it into its own store ([`CheckpointStore`], outside every
//! kernel's writable directories) and removes the original. A restore copies
//! the stored file into the new kernel's workdir (a new name, never over an
//! existing file) and unpickles it there, inside the new kernel's sandbox.
//! The report each side prints (`CELLHOST-CHECKPOINT <json>`) is parsed as
//! bounded JSON into typed fields.
//!
//! A `process` checkpoint is the whole kernel process tree dumped by CRIU
//! into an image directory of the store (see
//! [`cellhost_kernel::criu`]); it is taken only where
//! [`process_available`] holds and only of kernels without a sandbox or
//! cgroup limits (the registry refuses the rest, naming the layer).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cellhost_kernel::LostName;
use serde::{Deserialize, Serialize};

/// Default cap on a checkpoint file (256 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// Default time a checkpoint (or a restore) may take (60 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Names listed in a report at most (the worker lists 100).
const MAX_NAMES: usize = 200;
/// The line prefix of the worker's report.
const REPORT_PREFIX: &str = "CELLHOST-CHECKPOINT ";

/// What a session keeps of its kernels between deaths.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointMode {
    /// No checkpoints: a lost kernel leaves an empty namespace.
    #[default]
    Off,
    /// The picklable part of the namespace after each successful cell.
    Namespace,
    /// The whole kernel process with CRIU (refused where CRIU cannot run).
    Process,
}

impl CheckpointMode {
    /// The wire name (`off`, `namespace`, `process`).
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointMode::Off => "off",
            CheckpointMode::Namespace => "namespace",
            CheckpointMode::Process => "process",
        }
    }

    /// Parses a wire name.
    ///
    /// # Errors
    /// A message naming the accepted values.
    pub fn parse(s: &str) -> Result<CheckpointMode, String> {
        match s {
            "off" => Ok(CheckpointMode::Off),
            "namespace" => Ok(CheckpointMode::Namespace),
            "process" => Ok(CheckpointMode::Process),
            other => Err(format!(
                "checkpoint is one of off, namespace, process; got {other:?}"
            )),
        }
    }
}

impl std::str::FromStr for CheckpointMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        CheckpointMode::parse(s)
    }
}

/// Checkpoint settings (config `[checkpoint]`).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointSettings {
    /// The mode of sessions no pattern and no request names (`off`).
    pub default: CheckpointMode,
    /// Modes by session-name pattern (`*` matches any run of characters;
    /// the exact name, then the most specific pattern wins).
    pub sessions: Vec<(String, CheckpointMode)>,
    /// Largest checkpoint file, bytes ([`DEFAULT_MAX_BYTES`]); names that
    /// would pass it are left out and named.
    pub max_bytes: u64,
    /// Longest a checkpoint or a restore may run ([`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings {
            default: CheckpointMode::Off,
            sessions: Vec::new(),
            max_bytes: DEFAULT_MAX_BYTES,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl CheckpointSettings {
    /// The configured mode of a session named `session`.
    pub fn for_session(&self, session: &str) -> CheckpointMode {
        self.sessions
            .iter()
            .filter(|(p, _)| crate::network::glob_match(p, session))
            .max_by_key(|(p, _)| (p == session, p.chars().filter(|c| *c != '*').count()))
            .map_or(self.default, |(_, m)| *m)
    }
}

/// A session's latest checkpoint, as the host stores and journals it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The mode it was taken in (`namespace`).
    pub mode: CheckpointMode,
    /// The kernel generation it was taken from.
    pub generation: u64,
    /// Taken after the cell of this execution_count.
    pub execution_count: u64,
    /// When, milliseconds since the Unix epoch.
    pub taken_ms: i64,
    /// The file in the host's store.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Names saved (variables, then modules).
    pub saved: Vec<String>,
    /// Names left out, and why.
    pub lost: Vec<LostName>,
    /// Wall time the kernel took to write it, milliseconds.
    pub write_ms: u64,
}

/// The store of checkpoint files: `ROOT/checkpoints/<owner>/<session>/`,
/// outside every kernel's writable directories.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    root: PathBuf,
}

impl CheckpointStore {
    /// The store under the registry's state directory `root`.
    pub fn new(root: &Path) -> Self {
        CheckpointStore {
            root: root.join("checkpoints"),
        }
    }

    /// The directory of one session's checkpoints (created, mode 0700).
    ///
    /// # Errors
    /// I/O errors creating it.
    pub fn session_dir(&self, owner_dir: &str, session_dir: &str) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        let d = self.root.join(owner_dir).join(session_dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&d)?;
        Ok(d)
    }
}

/// A fresh random name for a file in a kernel's workdir.
pub fn fresh_name(prefix: &str) -> String {
    let mut b = [0u8; 12];
    let _ = getrandom::fill(&mut b);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(".cellhost-{prefix}-{hex}")
}

/// A Python string literal of `p` (its bytes as UTF-8; a path that is not
/// UTF-8 is refused by the caller).
fn py_str(p: &str) -> String {
    serde_json::Value::String(p.to_string()).to_string()
}

/// The silent cell that writes the namespace to `kernel_path` (the path as
/// the kernel sees it).
pub fn save_code(kernel_path: &str, max_bytes: u64, execution_count: u64) -> String {
    format!(
        "__import__('cellhost_worker.checkpoint').checkpoint.save({}, {max_bytes}, {execution_count})",
        py_str(kernel_path)
    )
}

/// The silent cell that loads the checkpoint at `kernel_path`.
pub fn restore_code(kernel_path: &str) -> String {
    format!(
        "__import__('cellhost_worker.checkpoint').checkpoint.restore({})",
        py_str(kernel_path)
    )
}

/// The worker's report of a save or a restore.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Report {
    /// It worked.
    #[serde(default)]
    pub ok: bool,
    /// Why not.
    #[serde(default)]
    pub error: Option<String>,
    /// Size written (save).
    #[serde(default)]
    pub bytes: u64,
    /// Variables saved (save).
    #[serde(default)]
    pub saved: Vec<String>,
    /// Modules saved by name (save).
    #[serde(default)]
    pub modules: Vec<String>,
    /// Names bound again (restore).
    #[serde(default)]
    pub restored: Vec<String>,
    /// Names not saved or not loaded.
    #[serde(default)]
    pub lost: Vec<LostName>,
    /// Wall time in the kernel, milliseconds.
    #[serde(default)]
    pub ms: u64,
}

/// The last report line in a silent cell's stdout, its lists capped.
///
/// # Errors
/// A message when there is none or it is not the report's JSON.
pub fn parse_report(stdout: &str) -> Result<Report, String> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(REPORT_PREFIX))
        .ok_or_else(|| "the kernel wrote no checkpoint report".to_string())?;
    let mut r: Report = serde_json::from_str(line)
        .map_err(|e| format!("the kernel's checkpoint report is not valid: {e}"))?;
    for v in [&mut r.saved, &mut r.modules, &mut r.restored] {
        v.truncate(MAX_NAMES);
        for n in v.iter_mut() {
            cut(n, 200);
        }
    }
    r.lost.truncate(MAX_NAMES);
    for l in &mut r.lost {
        cut(&mut l.name, 200);
        cut(&mut l.type_name, 200);
        cut(&mut l.reason, 400);
    }
    Ok(r)
}

fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let at = s.floor_char_boundary(max);
        s.truncate(at);
    }
}

/// Takes the file a kernel wrote at `from` (in its workdir) into the
/// store at `to`: opened without following a link, only a regular file
/// with one link and at most `max_bytes` (plus the index's slack) bytes;
/// `from` is removed whatever happens.
///
/// # Errors
/// Why the file was refused, or an I/O error.
pub fn collect(from: &Path, to: &Path, max_bytes: u64) -> Result<u64, String> {
    let out = collect_inner(from, to, max_bytes);
    let _ = std::fs::remove_file(from);
    if out.is_err() {
        let _ = std::fs::remove_file(to);
    }
    out
}

fn collect_inner(from: &Path, to: &Path, max_bytes: u64) -> Result<u64, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_flags())
        .open(from)
        .map_err(|e| format!("the checkpoint file cannot be opened: {e}"))?;
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.file_type().is_file() {
        return Err("the checkpoint is not a regular file".into());
    }
    if m.nlink() != 1 {
        return Err("the checkpoint file has other links".into());
    }
    // The index and framing come on top of the values' cap.
    let cap = max_bytes.saturating_add(1 << 20);
    if m.len() > cap {
        return Err(format!(
            "the checkpoint is {} bytes, over the cap of {cap}",
            m.len()
        ));
    }
    let tmp = to.with_extension("part");
    let mut w = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut n = 0u64;
    let copied = (|| -> std::io::Result<()> {
        let mut r = f.take(cap + 1);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let k = r.read(&mut buf)?;
            if k == 0 {
                break;
            }
            n += k as u64;
            if n > cap {
                return Err(std::io::Error::other("the checkpoint grew past its cap"));
            }
            w.write_all(&buf[..k])?;
        }
        w.sync_all()
    })();
    if let Err(e) = copied.and_then(|()| std::fs::rename(&tmp, to)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.to_string());
    }
    Ok(n)
}

fn libc_flags() -> i32 {
    (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::CLOEXEC).bits() as i32
}

/// Copies a stored checkpoint to `to` in a new kernel's workdir (a new
/// file: an existing one, or a link, at that name is an error).
///
/// # Errors
/// I/O errors.
pub fn stage(from: &Path, to: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut r = std::fs::File::open(from)?;
    let mut w = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    let n = std::io::copy(&mut r, &mut w);
    if n.is_err() {
        let _ = std::fs::remove_file(to);
    }
    n
}

/// Removes a stored checkpoint: a file (`namespace`) or an image
/// directory (`process`), never following a link.
pub fn remove_stored(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// Whether `process` checkpoints can be taken on this host: CRIU
/// ([`cellhost_kernel::criu::criu_binary`]) runs and `criu check` passes
/// — as root, or as another user in CRIU's unprivileged mode, for which
/// the binary must carry the `CAP_CHECKPOINT_RESTORE` file capability.
/// Asked once per process.
///
/// # Errors
/// Why not: CRIU missing, `criu check`'s own error lines (with the
/// kernel's release), or, not as root, how to give CRIU the capability.
pub fn process_available() -> Result<(), String> {
    static WHY: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    WHY.get_or_init(|| {
        let criu = cellhost_kernel::criu::criu_binary();
        let unprivileged = cellhost_kernel::criu::unprivileged();
        let out = match cellhost_kernel::criu::command("check")
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                return Err(format!(
                    "process checkpoints need CRIU, which cannot be run here ({}: {e}); install it \
                     (Debian: apt-get install criu, or scripts/criu-build.sh for a newer one)",
                    criu.display()
                ));
            }
        };
        if out.status.success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
        let errors: Vec<&str> = text.lines().filter(|l| l.contains("Error")).take(4).collect();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let what = if errors.is_empty() {
            text.trim().to_string()
        } else {
            errors.join("; ")
        };
        if unprivileged {
            return Err(format!(
                "process checkpoints as a user other than root need a CRIU binary with the CAP_CHECKPOINT_RESTORE \
                 file capability (as root: `install -m 0755 {criu} /usr/local/libexec/criu-unprivileged && setcap \
                 cap_checkpoint_restore+eip /usr/local/libexec/criu-unprivileged`, then CELLHOST_CRIU names that copy; \
                 with Yama's ptrace_scope at 1 or more also cap_sys_ptrace): `criu check --unprivileged` failed: {}",
                what.chars().take(600).collect::<String>(),
                criu = criu.display(),
            ));
        }
        Err(format!(
            "CRIU ({}) cannot checkpoint on this host (kernel {}): `criu check` failed: {}",
            criu.display(),
            kernel.trim(),
            what.chars().take(600).collect::<String>()
        ))
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_patterns_pick_the_most_specific() {
        assert_eq!(CheckpointMode::parse("namespace"), Ok(CheckpointMode::Namespace));
        assert!(CheckpointMode::parse("vm").is_err());
        let s = CheckpointSettings {
            sessions: vec![
                ("ana-*".into(), CheckpointMode::Namespace),
                ("ana-x".into(), CheckpointMode::Off),
            ],
            ..Default::default()
        };
        assert_eq!(s.for_session("ana-1"), CheckpointMode::Namespace);
        assert_eq!(s.for_session("ana-x"), CheckpointMode::Off);
        assert_eq!(s.for_session("bob"), CheckpointMode::Off);
    }

    #[test]
    fn reports_are_parsed_bounded_and_garbage_is_refused() {
        let long = "x".repeat(5000);
        let out = format!(
            "noise\nCELLHOST-CHECKPOINT {{\"ok\":true,\"bytes\":9,\"saved\":[\"{long}\"],\"lost\":[{{\"name\":\"g\",\"type\":\"generator\",\"reason\":\"no\"}}]}}\n"
        );
        let r = parse_report(&out).expect("report");
        assert!(r.ok);
        assert_eq!(r.saved[0].len(), 200);
        assert_eq!(r.lost[0].type_name, "generator");
        assert!(parse_report("CELLHOST-CHECKPOINT {not json").is_err());
        assert!(parse_report("nothing").is_err());
    }

    #[test]
    fn collect_refuses_links_and_oversized_files() {
        let d = tempfile::tempdir().expect("dir");
        let secret = d.path().join("secret");
        std::fs::write(&secret, b"host data").expect("write");
        let link = d.path().join("ck");
        std::os::unix::fs::symlink(&secret, &link).expect("link");
        let to = d.path().join("stored");
        assert!(collect(&link, &to, 100).is_err());
        assert!(!to.exists(), "nothing stored through a link");
        assert!(secret.exists(), "the link's target is untouched");
        let hard = d.path().join("hard");
        std::fs::hard_link(&secret, &hard).expect("hard link");
        assert!(
            collect(&hard, &to, 100).is_err(),
            "a file with other links is refused"
        );
        let big = d.path().join("big");
        std::fs::write(&big, vec![0u8; (2 << 20) + 10]).expect("write");
        assert!(collect(&big, &to, 10).is_err());
        let ok = d.path().join("ok");
        std::fs::write(&ok, b"bytes").expect("write");
        assert_eq!(collect(&ok, &to, 100), Ok(5));
        assert!(!ok.exists(), "the kernel's file is removed");
        let staged = d.path().join("staged");
        std::fs::write(&staged, b"planted").expect("write");
        assert!(stage(&to, &staged).is_err(), "never over an existing file");
    }
}
