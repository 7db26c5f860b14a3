//! Limits per session: memory, processes, CPU, disk and the cell deadline a
//! session's kernels run under, as a request asks for them
//! (`POST /v1/sessions {"limits": {…}}`, `exec --session --memory …`), as
//! the configuration gives them per session-name pattern, and bounded by
//! the operator's maximum.
//!
//! ```toml
//! [limits.max]              # no session may ask for more (each key optional)
//! memory_mb = 8192
//! pids = 1024
//! cpu = 2.0
//! disk_mb = 10240
//! cell_timeout_s = 3600
//!
//! [limits.default]          # every session, unless a rule or the request says otherwise
//! memory_mb = 2048
//!
//! [[limits.session]]        # the first rule whose pattern matches the session name
//! match = "agent-*"         # `*` any run of characters, `?` one character
//! memory_mb = 1024
//! disk_mb = 512
//! ```
//!
//! Resolution, per field: the request's value, else the first matching
//! rule's, else `[limits.default]`'s, else the host's default (the sandbox
//! profile's memory 4 GiB and 512 processes, the configured
//! `cell_timeout_s`, no CPU or disk cap). A field of `[limits.max]` bounds
//! every value: a request over it is refused with
//! [`RequestError::LimitOverMax`] (`limit_over_max`, naming the field and the
//! maximum), and a host default over it is lowered to it.
//!
//! How each limit is enforced:
//! - `memory_mb`, `pids`, `cpu`: the kernel's cgroup
//!   ([`cellhost_sandbox::cgroup::CgroupLimits`]; v1 or v2), over its whole
//!   process tree. A value the session asked for (request, rule or default
//!   table) must be in force: a host that cannot set it refuses the kernel
//!   (`kernel_failed`), never starts it unlimited.
//! - `disk_mb`: the workdir **in total**, by a mount: the session's
//!   workdir is a tmpfs of the cap's size (`size=<disk_mb>m`, inodes
//!   bounded too) held by a process of the session's own, which its cold
//!   kernels enter before they make their namespaces
//!   ([`cellhost_sandbox::workdir_disk`], [`crate::session_disk`]): a cell
//!   writing past the sum gets `ENOSPC` (`OSError: [Errno 28] No space left
//!   on device`, fault `disk`), whatever the number of files. The holder
//!   outlives the session's kernels (a restart, crash, OOM kill or
//!   `SIGKILL` of a kernel loses no file), the host's files routes reach the
//!   tmpfs through `/proc/<holder>/root` (still resolved beneath the workdir
//!   with `openat2`), and the files go back to the directory on disk when
//!   the session ends or the host shuts down. It holds for root and non-root
//!   hosts alike (a non-root holder owns a user namespace mapping only the
//!   host's uid), with the sandbox in mode auto or enforce; the tmpfs's pages
//!   are memory, charged to the writing kernel's cgroup (`memory_mb`).
//!   Besides: `RLIMIT_FSIZE` of the kernel's processes (no one file past the
//!   cap: `EFBIG`, `[Errno 27] File too large`), the spill files of its
//!   streams (each at most the cap), and the host's own writes into the
//!   workdir (`PUT …/files`, MCP `write_file`, `cp`), refused with
//!   `disk_full` when the workdir would pass the cap (also when the tmpfs
//!   itself answers `ENOSPC`). Without the mount — sandbox off, no user
//!   namespaces for a non-root host, a cwd the caller named (the caller's
//!   directory is never swapped for a copy), a placement's kernel — the cap
//!   is only that accounting (each file a cell writes, and everything the
//!   host writes; with the sandbox off, which sets no rlimits, only what
//!   the host writes), and the kernel's sandbox names layer `disk` as
//!   missing, with the reason (also with the sandbox off).
//! - `cell_timeout_s`: the kernel's default deadline for a cell (a call's
//!   own `timeout_s` still applies to that call).
//!
//! Each limit hit reaches the result as its [`cellhost_kernel::Fault`].

use std::path::Path;
use std::time::Duration;

use cellhost_kernel::KernelConfig;
use serde::{Deserialize, Serialize};

use crate::requests::RequestError;

/// The limits of one session. Every field is optional: absent means "not
/// said here" (the next source of the resolution decides, see the `limits`
/// module).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionLimits {
    /// Memory of the kernel's whole process tree, in MiB (16 and up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 16, maximum = 16777216))]
    pub memory_mb: Option<u64>,
    /// Processes and threads of the kernel's tree at once (8 and up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 8, maximum = 4194304))]
    pub pids: Option<u64>,
    /// CPU time as a number of cores (0.01 and up; `1.5` = one and a half).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.01, maximum = 1024.0))]
    pub cpu: Option<f64>,
    /// Disk the session may fill, in MiB (1 and up; the `limits` module says what it
    /// bounds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 16777216))]
    pub disk_mb: Option<u64>,
    /// A cell's default deadline, in seconds (0 = none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 604800.0))]
    pub cell_timeout_s: Option<f64>,
}

// Validated values are finite (no NaN), so equality is an equivalence.
impl Eq for SessionLimits {}

/// The field names, as the wire, the config and the errors spell them.
pub const FIELDS: &[&str] = &["memory_mb", "pids", "cpu", "disk_mb", "cell_timeout_s"];

impl SessionLimits {
    /// Nothing is said.
    pub fn is_empty(&self) -> bool {
        *self == SessionLimits::default()
    }

    /// `self`'s values, each absent one taken from `under`.
    pub fn or(self, under: &SessionLimits) -> SessionLimits {
        SessionLimits {
            memory_mb: self.memory_mb.or(under.memory_mb),
            pids: self.pids.or(under.pids),
            cpu: self.cpu.or(under.cpu),
            disk_mb: self.disk_mb.or(under.disk_mb),
            cell_timeout_s: self.cell_timeout_s.or(under.cell_timeout_s),
        }
    }

    /// Each value within its range (memory 16 MiB…16 TiB, pids 8…4194304,
    /// cpu 0.01…1024 cores, disk 1 MiB…16 TiB, timeout 0…604800 s).
    ///
    /// # Errors
    /// [`RequestError::BadRequest`] naming the field.
    pub fn validate(&self) -> Result<(), RequestError> {
        let int = |name: &str, v: Option<u64>, lo: u64, hi: u64| match v {
            Some(n) if !(lo..=hi).contains(&n) => Err(RequestError::bad_request(format!(
                "limits.{name} must be between {lo} and {hi}, got {n}"
            ))),
            _ => Ok(()),
        };
        let float = |name: &str, v: Option<f64>, lo: f64, hi: f64| match v {
            Some(x) if !(x.is_finite() && (lo..=hi).contains(&x)) => Err(RequestError::bad_request(format!(
                "limits.{name} must be a number between {lo} and {hi}, got {x}"
            ))),
            _ => Ok(()),
        };
        int("memory_mb", self.memory_mb, 16, 16 << 20)?;
        int("pids", self.pids, 8, 1 << 22)?;
        float("cpu", self.cpu, 0.01, 1024.0)?;
        int("disk_mb", self.disk_mb, 1, 16 << 20)?;
        float("cell_timeout_s", self.cell_timeout_s, 0.0, 604_800.0)
    }

    /// The first field over its maximum in `max`, as the error a request
    /// gets (`None`: every value is within).
    fn over(&self, max: &SessionLimits) -> Option<RequestError> {
        let over = |field: &'static str, v: Option<f64>, m: Option<f64>| match (v, m) {
            // A timeout of 0 is "no deadline": over any maximum.
            (Some(v), Some(m)) if v > m || (field == "cell_timeout_s" && v == 0.0) => {
                Some(RequestError::LimitOverMax {
                    field,
                    value: v,
                    max: m,
                })
            }
            _ => None,
        };
        let f = |x: Option<u64>| x.map(|n| n as f64);
        over("memory_mb", f(self.memory_mb), f(max.memory_mb))
            .or_else(|| over("pids", f(self.pids), f(max.pids)))
            .or_else(|| over("cpu", self.cpu, max.cpu))
            .or_else(|| over("disk_mb", f(self.disk_mb), f(max.disk_mb)))
            .or_else(|| over("cell_timeout_s", self.cell_timeout_s, max.cell_timeout_s))
    }

    /// The disk cap in bytes.
    pub fn disk_bytes(&self) -> Option<u64> {
        self.disk_mb.map(|m| m.saturating_mul(1 << 20))
    }
}

/// One `[[limits.session]]` rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitRule {
    /// The session-name pattern (`*` any run, `?` one character).
    #[serde(rename = "match")]
    pub pattern: String,
    /// Its limits.
    #[serde(flatten)]
    pub limits: SessionLimits,
}

/// The operator's limits: maximum, default and per-pattern rules
/// (config `[limits]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsPolicy {
    /// No session may ask for more (`[limits.max]`).
    #[serde(default)]
    pub max: SessionLimits,
    /// Every session's, unless a rule or the request says otherwise
    /// (`[limits.default]`).
    #[serde(default)]
    pub default: SessionLimits,
    /// Per session-name pattern, the first match wins (`[[limits.session]]`).
    #[serde(default, rename = "session")]
    pub rules: Vec<LimitRule>,
}

/// The limits a session runs under, resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResolvedLimits {
    /// What the request, a rule or the default table said: must be in force.
    pub asked: SessionLimits,
    /// The maximum's values standing in for host defaults above it (applied
    /// where the host can, like the host defaults they replace).
    pub ceiling: SessionLimits,
}

impl ResolvedLimits {
    /// Every value that applies (asked over ceiling).
    pub fn effective(&self) -> SessionLimits {
        self.asked.or(&self.ceiling)
    }

    /// Nothing differs from a session of the host's defaults.
    pub fn is_default(&self) -> bool {
        self.asked.is_empty() && self.ceiling.is_empty()
    }
}

impl LimitsPolicy {
    /// Checks the tables: every value in range, no default or rule over the
    /// maximum, patterns non-empty.
    ///
    /// # Errors
    /// A message naming the table and the field.
    pub fn validate(&self) -> Result<(), String> {
        self.max.validate().map_err(|e| format!("[limits.max]: {e}"))?;
        let check = |what: &str, l: &SessionLimits| {
            l.validate().map_err(|e| format!("{what}: {e}"))?;
            match l.over(&self.max) {
                Some(e) => Err(format!("{what}: {e}")),
                None => Ok(()),
            }
        };
        check("[limits.default]", &self.default)?;
        for r in &self.rules {
            if r.pattern.is_empty() {
                return Err("[[limits.session]]: `match` is empty".into());
            }
            check(&format!("[[limits.session]] match = {:?}", r.pattern), &r.limits)?;
        }
        Ok(())
    }

    /// The limits of session `name` when a request asks for `asked`, given
    /// the host's defaults (`host`: the values a session gets when nothing
    /// is said).
    ///
    /// # Errors
    /// [`RequestError::BadRequest`] for a value out of range;
    /// [`RequestError::LimitOverMax`] for one over the maximum.
    pub fn resolve(
        &self,
        name: &str,
        asked: &SessionLimits,
        host: &SessionLimits,
    ) -> Result<ResolvedLimits, RequestError> {
        asked.validate()?;
        if let Some(e) = asked.over(&self.max) {
            return Err(e);
        }
        let rule = self
            .rules
            .iter()
            .find(|r| glob_match(&r.pattern, name))
            .map(|r| r.limits)
            .unwrap_or_default();
        let said = asked.or(&rule).or(&self.default);
        // Host defaults over the maximum give way to it.
        let mut ceiling = SessionLimits::default();
        let m = &self.max;
        let lower = |h: Option<u64>, m: Option<u64>| match (h, m) {
            (Some(h), Some(m)) if h > m => Some(m),
            (None, Some(m)) => Some(m),
            _ => None,
        };
        if said.memory_mb.is_none() {
            ceiling.memory_mb = lower(host.memory_mb, m.memory_mb);
        }
        if said.pids.is_none() {
            ceiling.pids = lower(host.pids, m.pids);
        }
        if said.disk_mb.is_none() {
            ceiling.disk_mb = lower(host.disk_mb, m.disk_mb);
        }
        if said.cpu.is_none() {
            ceiling.cpu = match (host.cpu, m.cpu) {
                (Some(h), Some(m)) if h > m => Some(m),
                (None, Some(m)) => Some(m),
                _ => None,
            };
        }
        if said.cell_timeout_s.is_none() {
            ceiling.cell_timeout_s = match (host.cell_timeout_s, m.cell_timeout_s) {
                (Some(h), Some(m)) if h > m || h == 0.0 => Some(m),
                (None, Some(m)) => Some(m),
                _ => None,
            };
        }
        Ok(ResolvedLimits { asked: said, ceiling })
    }
}

/// Applies resolved limits to a kernel's configuration: asked values as
/// limits that must be in force ([`KernelConfig::limits`]), ceilings in
/// place of the sandbox profile's defaults, the disk cap as
/// `RLIMIT_FSIZE` and the spill cap of each stream (its mount is the
/// registry's, [`crate::session_disk`]), the deadline as the kernel's
/// default.
pub(crate) fn apply_to_kernel(l: &ResolvedLimits, cfg: &mut KernelConfig) {
    let (a, c) = (&l.asked, &l.ceiling);
    let mib = |m: u64| m.saturating_mul(1 << 20);
    if let Some(m) = a.memory_mb {
        cfg.limits.memory_bytes = Some(mib(m));
    }
    if let Some(p) = a.pids {
        cfg.limits.pids_max = Some(p);
    }
    if let Some(x) = a.cpu {
        cfg.limits.cpu_cores = Some(x);
    }
    if let Some(m) = c.memory_mb {
        cfg.sandbox.limits.memory_bytes = Some(mib(m));
        cfg.limits.memory_bytes = cfg.limits.memory_bytes.map(|b| b.min(mib(m)));
    }
    if let Some(p) = c.pids {
        cfg.sandbox.limits.pids_max = Some(p);
        cfg.limits.pids_max = cfg.limits.pids_max.map(|n| n.min(p));
    }
    if let Some(x) = c.cpu {
        cfg.sandbox.limits.cpu_cores = Some(x);
        cfg.limits.cpu_cores = cfg.limits.cpu_cores.map(|n| n.min(x));
    }
    let e = l.effective();
    if let Some(d) = e.disk_bytes() {
        cfg.sandbox.rlimits.fsize = Some(cfg.sandbox.rlimits.fsize.map_or(d, |f| f.min(d)));
        for s in [&mut cfg.stdout_limits, &mut cfg.stderr_limits] {
            s.spill_bytes = s.spill_bytes.min(d);
        }
    }
    if let Some(t) = e.cell_timeout_s {
        cfg.cell_timeout = (t > 0.0).then(|| Duration::from_secs_f64(t));
    }
}

/// Bytes the files below `root` hold (their sizes; links and special
/// files count 0, links never followed), counting at most `max_entries`
/// entries (a workdir of more is counted as far as that).
///
/// The kernel may swap any directory below `root` for a link while the
/// walk runs: each directory is opened from `root`'s descriptor with no
/// link allowed on the way (`openat2`, `RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS`), and each entry is looked at without following
/// it, so the walk never leaves `root` (a directory that became a link is
/// skipped).
pub fn disk_usage(root: &Path, max_entries: usize) -> u64 {
    use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
    use std::os::unix::ffi::OsStrExt;
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    // `root` itself is the host's own path (it may be a link the operator made).
    let Ok(root_fd) = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut stack = vec![std::path::PathBuf::from(".")];
    while let Some(rel) = stack.pop() {
        let Ok(fd) = rustix::fs::openat2(
            &root_fd,
            &rel,
            dir_flags,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) else {
            continue;
        };
        let Ok(entries) = Dir::read_from(&fd) else {
            continue;
        };
        for ent in entries.flatten() {
            let name = ent.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            seen += 1;
            if seen > max_entries {
                return total;
            }
            let Ok(st) = rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    stack.push(rel.join(std::ffi::OsStr::from_bytes(name.to_bytes())));
                }
                FileType::RegularFile => total = total.saturating_add(st.st_size.max(0) as u64),
                _ => {}
            }
        }
    }
    total
}

/// Entries [`disk_usage`] counts at most for a disk-cap check.
pub const USAGE_MAX_ENTRIES: usize = 200_000;

/// Whether `name` matches `pattern` (`*` any run of characters, `?` one).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Iterative matching with one backtrack point per star: linear in
    // practice, never exponential on hostile patterns.
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_usage_counts_files_below_and_follows_no_link() {
        let d = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("big"), vec![0u8; 50_000]).expect("big");
        std::fs::create_dir_all(d.path().join("a/b")).expect("dirs");
        std::fs::write(d.path().join("top"), b"12345").expect("top");
        std::fs::write(d.path().join("a/b/deep"), b"123").expect("deep");
        std::os::unix::fs::symlink(outside.path(), d.path().join("a/link")).expect("dir link");
        std::os::unix::fs::symlink(outside.path().join("big"), d.path().join("flink")).expect("file link");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.path().join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("fifo");
        assert_eq!(disk_usage(d.path(), 1000), 8);
        // Counted only as far as the bound.
        assert!(disk_usage(d.path(), 1) <= 8);
    }

    fn policy() -> LimitsPolicy {
        LimitsPolicy {
            max: SessionLimits {
                memory_mb: Some(2048),
                pids: Some(256),
                cpu: Some(2.0),
                disk_mb: Some(1024),
                cell_timeout_s: Some(600.0),
            },
            default: SessionLimits {
                cpu: Some(1.0),
                ..Default::default()
            },
            rules: vec![LimitRule {
                pattern: "agent-*".into(),
                limits: SessionLimits {
                    memory_mb: Some(512),
                    disk_mb: Some(64),
                    ..Default::default()
                },
            }],
        }
    }

    fn host() -> SessionLimits {
        SessionLimits {
            memory_mb: Some(4096),
            pids: Some(512),
            cell_timeout_s: Some(300.0),
            ..Default::default()
        }
    }

    #[test]
    fn request_over_rule_over_default_under_max() {
        let p = policy();
        assert!(p.validate().is_ok());
        let r = p
            .resolve(
                "agent-7",
                &SessionLimits {
                    memory_mb: Some(1024),
                    ..Default::default()
                },
                &host(),
            )
            .expect("resolve");
        let e = r.effective();
        assert_eq!(e.memory_mb, Some(1024));
        assert_eq!(e.disk_mb, Some(64));
        assert_eq!(e.cpu, Some(1.0));
        // Host defaults over the maximum give way to it.
        assert_eq!(e.pids, Some(256));
        assert_eq!(r.ceiling.pids, Some(256));
        assert_eq!(e.cell_timeout_s, None);
        let other = p
            .resolve("ana", &SessionLimits::default(), &host())
            .expect("resolve");
        assert_eq!(other.effective().memory_mb, Some(2048));
        assert_eq!(other.effective().disk_mb, Some(1024));
    }

    #[test]
    fn over_max_names_field_and_max() {
        let p = policy();
        let e = p
            .resolve(
                "ana",
                &SessionLimits {
                    pids: Some(300),
                    ..Default::default()
                },
                &host(),
            )
            .expect_err("over");
        assert_eq!(e.code(), "limit_over_max");
        let v = e.to_json();
        assert_eq!(v["field"], "pids");
        assert_eq!(v["max"], 256.0);
        assert_eq!(v["value"], 300.0);
        let e = p
            .resolve(
                "ana",
                &SessionLimits {
                    cell_timeout_s: Some(0.0),
                    ..Default::default()
                },
                &host(),
            )
            .expect_err("no deadline is over a maximum");
        assert_eq!(e.to_json()["field"], "cell_timeout_s");
        let e = p
            .resolve(
                "ana",
                &SessionLimits {
                    memory_mb: Some(1),
                    ..Default::default()
                },
                &host(),
            )
            .expect_err("too small");
        assert_eq!(e.code(), "bad_request");
    }

    #[test]
    fn config_tables_are_checked() {
        let mut p = policy();
        p.rules[0].limits.memory_mb = Some(4096);
        assert!(p.validate().expect_err("rule over max").contains("agent-*"));
        let t: LimitsPolicy =
            toml::from_str("[max]\nmemory_mb = 10\n[[session]]\nmatch = \"a*\"\npids = 64\n").expect("toml");
        assert_eq!(t.rules[0].limits.pids, Some(64));
        assert!(t.validate().expect_err("max below range").contains("memory_mb"));
        assert!(toml::from_str::<LimitsPolicy>("[max]\nmemroy_mb = 1\n").is_err());
    }

    #[test]
    fn globs() {
        for (p, n, m) in [
            ("agent-*", "agent-1", true),
            ("agent-*", "agent-", true),
            ("agent-*", "agen", false),
            ("*", "", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*b*b*", "abab", true),
            ("*b*b*", "ab", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob_match(p, n), m, "{p} {n}");
        }
    }
}
