//! Packages at runtime: the host installs packages for a session while its
//! kernel stays offline.
//!
//! Every way in — `cellhost install`, HTTP `POST …/packages`, MCP
//! `install_packages`, `%pip install` (and `!pip install`) in a cell — ends
//! in [`install`], called by the kernel's built-in host tool
//! [`INSTALL_TOOL`]: the host runs the installer (`uv pip` when `uv` is on
//! the host's `PATH`, else `<session python> -I -m pip`) outside the
//! kernel's sandbox, with the configured index only (`--index-url`, no
//! user or environment configuration), into the session's **overlay**: a
//! directory the host owns, bound read-only into the kernel's view and put
//! on its `sys.path` before site-packages. The kernel's network namespace
//! has no route, so user code stays offline throughout.
//!
//! Rules (each from the threat model: specs come from cells and clients,
//! and the installer runs on the host with network):
//! - the installer's network is the index only: it runs behind an egress
//!   proxy of its own whose allowlist is the index's host (plus
//!   `files.pythonhosted.org` for PyPI), so a redirect or a dependency URL
//!   to another host is refused ([`crate::install_egress`]);
//! - a spec is a requirement name with optional extras and version
//!   specifiers ([`validate_spec`]); options (`-r`, `-e`, `--index-url`),
//!   environment markers, URLs and paths (also a name the installer would
//!   read as a local archive, `x.tar.gz`) are refused
//!   ([`PackageError::InvalidSpec`], `invalid_package_spec`); `name @
//!   https://…` only with `packages.allow_urls = true`;
//! - wheels only by default (`--only-binary :all:`): an sdist's build
//!   backend (`setup.py`) is code from the index and would run on the host,
//!   outside the sandbox, with network (`packages.only_binary = false`
//!   allows it);
//! - the interpreter's own environment (shared by every session using it)
//!   is written only with `packages.shared_venv = true`
//!   ([`PackageError::SharedVenvRefused`] otherwise).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

/// The built-in host tool a cell's `%pip install` calls (names starting
/// with `cellhost.` are built-in and always enabled).
pub const INSTALL_TOOL: &str = "cellhost.install_packages";

/// Specs in one install at most.
pub const MAX_SPECS: usize = 64;

/// Longest spec, in bytes.
pub const MAX_SPEC_LEN: usize = 256;

/// Bytes of the installer's output kept per stream (the tail).
pub const OUTPUT_KEEP: usize = 256 * 1024;

/// Bytes of the installer's stderr an [`PackageError::InstallFailed`]
/// carries (the tail).
pub const STDERR_TAIL: usize = 4000;

/// Settings of package installs (config `package_index`, `packages.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageSettings {
    /// The package index (`--index-url`), a PEP 503 simple index URL.
    pub index_url: String,
    /// Allow installing into the interpreter's own environment.
    pub shared_venv: bool,
    /// Wheels only (`--only-binary :all:`).
    pub only_binary: bool,
    /// Allow `name @ https://…` specs.
    pub allow_urls: bool,
    /// The installer's deadline; at the deadline its process group is
    /// killed.
    pub timeout: Duration,
    /// Names the installer's egress proxy resolves to these addresses
    /// (`[egress] hosts`): the way to reach an index on a private network
    /// by name (see [`crate::install_egress`]).
    pub egress_hosts: BTreeMap<String, Vec<std::net::IpAddr>>,
}

impl Default for PackageSettings {
    fn default() -> Self {
        PackageSettings {
            index_url: "https://pypi.org/simple".into(),
            shared_venv: false,
            only_binary: true,
            allow_urls: false,
            timeout: Duration::from_secs(600),
            egress_hosts: BTreeMap::new(),
        }
    }
}

/// Where an install goes: a session's overlay, for its interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageTarget {
    /// The overlay's root on the host (the kernel sees it read-only); the
    /// packages go to [`PackageTarget::site`].
    pub overlay: PathBuf,
    /// The session's interpreter.
    pub python: PathBuf,
    /// Directories the session's kernel can write (its workdir, its
    /// session directory): an interpreter inside one is never run by the
    /// host ([`PackageTarget::interpreter_writable`]).
    pub writable: Vec<PathBuf>,
}

impl PackageTarget {
    /// The directory on the kernel's `sys.path`: `<overlay>/site`.
    pub fn site(&self) -> PathBuf {
        self.overlay.join("site")
    }

    /// The interpreter lies in a directory the kernel can write (a venv in
    /// the workdir): the host running it — or its pip — would run code the
    /// kernel planted, outside the sandbox. Compared by the path as given
    /// and by its real path.
    pub fn interpreter_writable(&self) -> bool {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let py = [self.python.clone(), canon(&self.python)];
        self.writable.iter().any(|w| {
            let wc = canon(w);
            py.iter().any(|p| p.starts_with(w) || p.starts_with(&wc))
        })
    }
}

/// One distribution an install added.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstalledDist {
    /// Distribution name as its metadata spells it.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Top-level import names it provides.
    pub modules: Vec<String>,
}

/// What an install did.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallReport {
    /// The specs, as validated.
    pub packages: Vec<String>,
    /// `uv` or `pip`.
    pub installer: String,
    /// `overlay` (the session's own directory) or `shared_venv`.
    pub target: String,
    /// Distributions added (new, or at another version); empty when every
    /// requirement was already satisfied.
    pub installed: Vec<InstalledDist>,
    /// A module of an added distribution was already imported by the
    /// kernel: the new version is used only after a restart.
    pub restart_needed: bool,
    /// The imported modules that make a restart needed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_modules: Vec<String>,
    /// Milliseconds the installer ran.
    pub duration_ms: u64,
    /// The installer's stdout (its tail, at most [`OUTPUT_KEEP`] bytes).
    pub stdout: String,
    /// The installer's stderr (its tail, at most [`OUTPUT_KEEP`] bytes).
    pub stderr: String,
}

/// Why an install was refused or failed; each with a stable
/// [`PackageError::code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackageError {
    /// A spec is not a plain requirement.
    #[error("package spec {spec:?} refused: {reason}")]
    InvalidSpec {
        /// The spec as given (cut to 300 characters).
        spec: String,
        /// Why.
        reason: String,
    },
    /// The install asked for the shared environment, which the config does
    /// not allow.
    #[error(
        "installing into the interpreter's shared environment is refused (other sessions use it); packages go to the session's overlay, or set packages.shared_venv = true in the config"
    )]
    SharedVenvRefused,
    /// The installer ran and failed.
    #[error("the installer failed ({status}): {stderr_tail}")]
    InstallFailed {
        /// Its exit status.
        status: String,
        /// The tail of its stderr (at most [`STDERR_TAIL`] bytes).
        stderr_tail: String,
    },
    /// The installer could not be started, or ran past its deadline.
    #[error("{message}")]
    InstallerUnavailable {
        /// Why.
        message: String,
    },
}

impl PackageError {
    /// The stable code: `invalid_package_spec`, `shared_venv_refused`,
    /// `install_failed`, `installer_unavailable`.
    pub fn code(&self) -> &'static str {
        match self {
            PackageError::InvalidSpec { .. } => "invalid_package_spec",
            PackageError::SharedVenvRefused => "shared_venv_refused",
            PackageError::InstallFailed { .. } => "install_failed",
            PackageError::InstallerUnavailable { .. } => "installer_unavailable",
        }
    }

    /// The error as JSON: `{"code", "message", <fields>}`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({"code": self.code(), "message": self.to_string()});
        match self {
            PackageError::InvalidSpec { spec, reason } => {
                v["spec"] = spec.clone().into();
                v["reason"] = reason.clone().into();
            }
            PackageError::InstallFailed { status, stderr_tail } => {
                v["status"] = status.clone().into();
                v["stderr_tail"] = stderr_tail.clone().into();
            }
            _ => {}
        }
        v
    }

    /// Rebuilds an error from [`PackageError::to_json`] (the host tool's
    /// error reply); `None` when `v` is not one.
    pub fn from_json(v: &serde_json::Value) -> Option<PackageError> {
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_default().to_string();
        Some(match v.get("code")?.as_str()? {
            "invalid_package_spec" => PackageError::InvalidSpec {
                spec: s("spec"),
                reason: s("reason"),
            },
            "shared_venv_refused" => PackageError::SharedVenvRefused,
            "install_failed" => PackageError::InstallFailed {
                status: s("status"),
                stderr_tail: s("stderr_tail"),
            },
            "installer_unavailable" => PackageError::InstallerUnavailable {
                message: s("message"),
            },
            _ => return None,
        })
    }
}

/// Endings that make pip and uv read a requirement as a path to a local
/// archive (pip's `ARCHIVE_EXTENSIONS`) instead of a name to look up in
/// the index: `evil-1.0.tar.gz` is a file in the installer's working
/// directory, never a project.
const ARCHIVE_SUFFIXES: &[&str] = &[
    ".whl",
    ".zip",
    ".tar",
    ".tgz",
    ".tar.gz",
    ".tbz",
    ".tar.bz2",
    ".txz",
    ".tar.xz",
    ".tlz",
    ".tar.lz",
    ".tar.lzma",
];

fn refuse(spec: &str, reason: impl Into<String>) -> PackageError {
    PackageError::InvalidSpec {
        spec: spec.chars().take(300).collect(),
        reason: reason.into(),
    }
}

/// Checks one spec and returns it normalised (no whitespace):
/// `NAME[EXTRA,…](OP VERSION,…)?` with `NAME` a PEP 508 name, `OP` one
/// of `== != <= >= < > ~= ===`, `VERSION` of `[A-Za-z0-9.*+!_-]`; or, with
/// `allow_urls`, `NAME @ https://…` (no whitespace, quotes or `#` in the
/// URL). Anything else — options (`-e`, `--index-url=…`), markers (`;`),
/// paths, names the installer reads as a local archive (`x.whl`,
/// `x.tar.gz`: [`ARCHIVE_SUFFIXES`]), `file:` URLs, shell syntax — is
/// refused.
///
/// # Errors
/// [`PackageError::InvalidSpec`] naming the spec and why.
pub fn validate_spec(spec: &str, allow_urls: bool) -> Result<String, PackageError> {
    if spec.len() > MAX_SPEC_LEN {
        return Err(refuse(spec, format!("longer than {MAX_SPEC_LEN} bytes")));
    }
    let t = spec.trim();
    if t.is_empty() {
        return Err(refuse(spec, "empty"));
    }
    if t.starts_with('-') {
        return Err(refuse(
            spec,
            "installer options are not accepted (no -r, -e, --index-url, …); give requirement names only",
        ));
    }
    if t.chars().any(|c| c.is_control()) {
        return Err(refuse(spec, "control characters"));
    }
    if t.contains(';') {
        return Err(refuse(spec, "environment markers (`;`) are not accepted"));
    }
    let name_end = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .unwrap_or(t.len());
    let name = &t[..name_end];
    let name_ok = !name.is_empty()
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if !name_ok {
        return Err(refuse(
            spec,
            "not a requirement: a package name (letters, digits, `.`, `_`, `-`) comes first; paths and URLs are not accepted",
        ));
    }
    let lower = name.to_ascii_lowercase();
    if let Some(ext) = ARCHIVE_SUFFIXES.iter().find(|e| lower.ends_with(*e)) {
        return Err(refuse(
            spec,
            format!(
                "a name ending in {ext:?} is read by the installer as a local archive file, not a requirement"
            ),
        ));
    }
    let mut out = name.to_string();
    let mut rest = t[name_end..].trim_start();
    if let Some(r) = rest.strip_prefix('[') {
        let Some(close) = r.find(']') else {
            return Err(refuse(spec, "unclosed `[` of extras"));
        };
        let mut extras = Vec::new();
        for e in r[..close].split(',') {
            let e = e.trim();
            let ok = !e.is_empty()
                && e.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if !ok {
                return Err(refuse(spec, format!("bad extra {e:?}")));
            }
            extras.push(e);
        }
        out.push('[');
        out.push_str(&extras.join(","));
        out.push(']');
        rest = r[close + 1..].trim_start();
    }
    if let Some(url) = rest.strip_prefix('@') {
        let url = url.trim();
        if !allow_urls {
            return Err(refuse(
                spec,
                "direct URLs are not accepted (set packages.allow_urls = true to allow https URLs)",
            ));
        }
        let ok = url.starts_with("https://")
            && url.len() > "https://".len()
            && !url
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '#' | '\\' | '`' | '$' | '{' | '}'));
        if !ok {
            return Err(refuse(spec, "only https:// URLs without spaces, quotes or `#`"));
        }
        out.push_str(" @ ");
        out.push_str(url);
        return Ok(out);
    }
    if rest.is_empty() {
        return Ok(out);
    }
    for (i, clause) in rest.split(',').enumerate() {
        let c = clause.trim();
        let op = ["===", "==", "!=", "<=", ">=", "~=", "<", ">"]
            .into_iter()
            .find(|op| c.starts_with(op));
        let Some(op) = op else {
            return Err(refuse(
                spec,
                format!("expected a version specifier (==, >=, <=, !=, ~=, <, >) at {c:?}"),
            ));
        };
        let version = c[op.len()..].trim();
        let ok = !version.is_empty()
            && version
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '*' | '+' | '!' | '_' | '-'));
        if !ok {
            return Err(refuse(spec, format!("bad version {version:?}")));
        }
        if i > 0 {
            out.push(',');
        }
        out.push_str(op);
        out.push_str(version);
    }
    Ok(out)
}

/// Checks every spec ([`validate_spec`]): 1 to [`MAX_SPECS`] of them.
///
/// # Errors
/// [`PackageError::InvalidSpec`] for the first bad one (or none given).
pub fn validate_specs(specs: &[String], allow_urls: bool) -> Result<Vec<String>, PackageError> {
    if specs.is_empty() {
        return Err(refuse("", "no package given"));
    }
    if specs.len() > MAX_SPECS {
        return Err(refuse(
            &specs[MAX_SPECS],
            format!("at most {MAX_SPECS} packages per install"),
        ));
    }
    specs.iter().map(|s| validate_spec(s, allow_urls)).collect()
}

/// `uv` on the host's `PATH`, if any.
fn find_uv() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("uv"))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
}

/// The `*.dist-info` directories below `dir`, by name.
fn dist_infos(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".dist-info"))
                .collect()
        })
        .unwrap_or_default()
}

/// Name, version and import names of the distribution in `info`
/// (`NAME-VERSION.dist-info`): `top_level.txt`, else the first components
/// of `RECORD`.
fn read_dist(dir: &Path, info: &str) -> InstalledDist {
    let stem = info.trim_end_matches(".dist-info");
    let (name, version) = stem.rsplit_once('-').unwrap_or((stem, ""));
    let base = dir.join(info);
    let mut modules: BTreeSet<String> = BTreeSet::new();
    if let Ok(t) = std::fs::read_to_string(base.join("top_level.txt")) {
        modules.extend(
            t.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from),
        );
    } else if let Ok(r) = std::fs::read_to_string(base.join("RECORD")) {
        for line in r.lines() {
            let path = line.split(',').next().unwrap_or_default();
            let first = path.split('/').next().unwrap_or_default();
            if first.is_empty()
                || first.starts_with("..")
                || first.ends_with(".dist-info")
                || first.ends_with(".data")
                || first == "__pycache__"
                || first.ends_with(".pth")
            {
                continue;
            }
            modules.insert(first.trim_end_matches(".py").to_string());
        }
    }
    InstalledDist {
        name: name.to_string(),
        version: version.to_string(),
        modules: modules.into_iter().collect(),
    }
}

/// A distribution name as PEP 503 compares them.
fn normalise(name: &str) -> String {
    name.to_ascii_lowercase().replace(['-', '.'], "_")
}

fn tail_text(bytes: &[u8], keep: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.len() <= keep {
        return s.into_owned();
    }
    let mut cut = s.len() - keep;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("…{}", &s[cut..])
}

/// Environment variables the installer keeps from the host's (certificate
/// stores an operator set); everything else is cleared, the host's proxy
/// variables included: the installer's proxy is its own
/// ([`crate::install_egress`]).
const INSTALLER_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "XDG_CACHE_HOME",
    "UV_CACHE_DIR",
];

/// Bytes of each stream copied to its log for the cell to follow.
pub const LOG_CAP: u64 = 1024 * 1024;

/// The two files (`<nonce>.out`, `<nonce>.err`) in `<overlay>/logs` the
/// installer's output is copied to as it comes, for the calling cell to
/// follow (the overlay is read-only in the kernel's view). Earlier logs are
/// removed first. `None` for a nonce that is not 16-64 hex digits, or when
/// the files cannot be made.
fn open_logs(overlay: &Path, nonce: &str) -> Option<(std::fs::File, std::fs::File)> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let ok = (16..=64).contains(&nonce.len()) && nonce.bytes().all(|b| b.is_ascii_hexdigit());
    if !ok {
        return None;
    }
    let dir = overlay.join("logs");
    let _ = std::fs::DirBuilder::new().mode(0o755).create(&dir);
    if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return None;
    }
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.filter_map(Result::ok) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let open = |ext: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(dir.join(format!("{nonce}.{ext}")))
            .ok()
    };
    Some((open("out")?, open("err")?))
}

/// Reads a pipe to its end, keeping the last `keep` bytes, and copying the
/// first [`LOG_CAP`] bytes to `log`.
async fn read_tail(
    r: Option<impl tokio::io::AsyncRead + Unpin>,
    keep: usize,
    mut log: Option<std::fs::File>,
) -> Vec<u8> {
    use std::io::Write as _;
    let Some(mut r) = r else { return Vec::new() };
    let mut kept: Vec<u8> = Vec::new();
    let mut logged = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(f) = log.as_mut() {
                    let room = (LOG_CAP - logged).min(n as u64) as usize;
                    if room == 0 || f.write_all(&buf[..room]).is_err() {
                        log = None;
                    }
                    logged += room as u64;
                }
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * keep {
                    kept.drain(..kept.len() - keep);
                }
            }
        }
    }
    if kept.len() > keep {
        kept.drain(..kept.len() - keep);
    }
    kept
}

/// Installs `specs` (validated again here) for `target`, into its overlay
/// or, with `shared`, into the interpreter's environment. `imported` are
/// the top-level modules the kernel has imported (its own account): a
/// distribution added that provides one of them makes `restart_needed`.
/// With `log` (a nonce of 16-64 hex digits), the installer's stdout and
/// stderr are also copied, as they come, to `<overlay>/logs/<log>.out` and
/// `.err` (the first [`LOG_CAP`] bytes each), where the calling cell
/// follows them.
///
/// # Errors
/// [`PackageError`]: a bad spec, `shared` without the setting, the
/// installer missing, past its deadline, or failing.
pub async fn install(
    settings: &PackageSettings,
    target: &PackageTarget,
    specs: &[String],
    shared: bool,
    imported: &BTreeSet<String>,
    log: Option<&str>,
) -> Result<InstallReport, PackageError> {
    let specs = validate_specs(specs, settings.allow_urls)?;
    if shared && !settings.shared_venv {
        return Err(PackageError::SharedVenvRefused);
    }
    if target.interpreter_writable() {
        return Err(PackageError::InstallerUnavailable {
            message: format!(
                "the session's interpreter {} lies in a directory its kernel can write; the host does not run it (use an interpreter outside the session's workdir)",
                target.python.display()
            ),
        });
    }
    let site = target.site();
    std::fs::create_dir_all(&site).map_err(|e| PackageError::InstallerUnavailable {
        message: format!("cannot create the overlay {}: {e}", site.display()),
    })?;
    let proxy = crate::install_egress::InstallProxy::start(
        &crate::install_egress::allowlist(settings, &specs)?,
        settings,
    )
    .await?;
    let uv = find_uv();
    let mut cmd = match &uv {
        Some(uv) => {
            let mut c = std::process::Command::new(uv);
            c.args(["pip", "install", "--no-config", "--python"])
                .arg(&target.python);
            c
        }
        None => {
            let mut c = std::process::Command::new(&target.python);
            c.args([
                "-I",
                "-m",
                "pip",
                "install",
                "--isolated",
                "--no-input",
                "--disable-pip-version-check",
                "--no-warn-script-location",
                "--progress-bar",
                "off",
                "--proxy",
            ]);
            c.arg(&proxy.url);
            c
        }
    };
    if !shared {
        // `--upgrade`: a package already in the overlay is replaced (pip
        // otherwise leaves the old files and warns).
        cmd.arg("--target").arg(&site).arg("--upgrade");
    }
    cmd.arg("--index-url").arg(&settings.index_url);
    if settings.only_binary {
        cmd.args(["--only-binary", ":all:"]);
    }
    cmd.arg("--");
    cmd.args(&specs);
    cmd.env_clear();
    for k in INSTALLER_ENV {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    for (k, v) in proxy.env() {
        cmd.env(k, v);
    }
    cmd.env("PYTHONDONTWRITEBYTECODE", "1");
    // Not the kernel's workdir: nothing a cell wrote is in the installer's
    // current directory.
    cmd.current_dir(&target.overlay);
    cellhost_sandbox::fds::close_inherited_on_exec(&mut cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let installer = if uv.is_some() { "uv" } else { "pip" };
    let before = dist_infos(&site);
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| PackageError::InstallerUnavailable {
        message: format!(
            "cannot run the installer ({installer} for {}): {e}",
            target.python.display()
        ),
    })?;
    let pgid = child.id();
    let out = child.stdout.take();
    let err = child.stderr.take();
    let (log_out, log_err) = match log.and_then(|n| open_logs(&target.overlay, n)) {
        Some((o, e)) => (Some(o), Some(e)),
        None => (None, None),
    };
    let work = async {
        let (o, e) = tokio::join!(
            read_tail(out, OUTPUT_KEEP, log_out),
            read_tail(err, OUTPUT_KEEP, log_err)
        );
        (o, e, child.wait().await)
    };
    let (stdout, stderr, status) = match tokio::time::timeout(settings.timeout, work).await {
        Ok(x) => x,
        Err(_) => {
            if let Some(pid) = pgid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            return Err(PackageError::InstallerUnavailable {
                message: format!(
                    "the installer ran past its deadline of {} s (packages.timeout_s) and was killed",
                    settings.timeout.as_secs_f64()
                ),
            });
        }
    };
    let status = status.map_err(|e| PackageError::InstallerUnavailable {
        message: format!("waiting for the installer: {e}"),
    })?;
    if !status.success() {
        let mut stderr_tail = tail_text(&stderr, STDERR_TAIL).trim().to_string();
        let denied = proxy.denied();
        if !denied.is_empty() {
            // What the proxy refused is the likeliest cause: said last, so
            // the tail keeps it.
            stderr_tail.push_str(&format!(
                "\nthe installer's egress proxy refused (only the package index is reachable): {}",
                denied.join(", ")
            ));
        }
        return Err(PackageError::InstallFailed {
            status: status.to_string(),
            stderr_tail,
        });
    }
    drop(proxy);
    let installed: Vec<InstalledDist> = if shared {
        Vec::new()
    } else {
        let after = dist_infos(&site);
        let added: Vec<InstalledDist> = after.difference(&before).map(|i| read_dist(&site, i)).collect();
        // An upgrade in the overlay leaves the old version's metadata
        // beside the new one: it goes, so `importlib.metadata` sees one.
        for d in &added {
            for old in before.intersection(&after) {
                let (name, _) = old
                    .trim_end_matches(".dist-info")
                    .rsplit_once('-')
                    .unwrap_or((old, ""));
                if normalise(name) == normalise(&d.name) {
                    let _ = std::fs::remove_dir_all(site.join(old));
                }
            }
        }
        added
    };
    let restart_modules: Vec<String> = installed
        .iter()
        .flat_map(|d| d.modules.iter())
        .filter(|m| imported.contains(*m))
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    Ok(InstallReport {
        packages: specs,
        installer: installer.into(),
        target: if shared { "shared_venv" } else { "overlay" }.into(),
        installed,
        restart_needed: !restart_modules.is_empty(),
        restart_modules,
        duration_ms: started.elapsed().as_millis() as u64,
        stdout: tail_text(&stdout, OUTPUT_KEEP),
        stderr: tail_text(&stderr, OUTPUT_KEEP),
    })
}

/// The outcome of each install the built-in tool ran, by cell id, until
/// the request that made the cell takes it ([`InstallLog::take`]). Bounded:
/// the oldest entries go first.
#[derive(Debug, Default)]
pub struct InstallLog {
    entries: std::sync::Mutex<BTreeMap<String, (u64, Outcome)>>,
    seq: std::sync::atomic::AtomicU64,
}

/// What one install gave.
type Outcome = Result<InstallReport, PackageError>;

/// Entries an [`InstallLog`] keeps at most.
const LOG_MAX: usize = 256;

impl InstallLog {
    /// Records the outcome of an install made by cell `cell`.
    pub fn record(&self, cell: &str, outcome: Result<InstallReport, PackageError>) {
        let n = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut m) = self.entries.lock() {
            m.insert(cell.to_string(), (n, outcome));
            while m.len() > LOG_MAX {
                let oldest = m.iter().min_by_key(|(_, (n, _))| *n).map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => m.remove(&k),
                    None => break,
                };
            }
        }
    }

    /// Takes the outcome of cell `cell`'s install, if it made one.
    pub fn take(&self, cell: &str) -> Option<Result<InstallReport, PackageError>> {
        self.entries.lock().ok()?.remove(cell).map(|(_, o)| o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_requirements_pass_normalised() {
        assert_eq!(validate_spec("six", false).ok().as_deref(), Some("six"));
        assert_eq!(
            validate_spec(" tomli >= 2.0 , <3 ", false).ok().as_deref(),
            Some("tomli>=2.0,<3")
        );
        assert_eq!(
            validate_spec("requests[socks, security]==2.*", false)
                .ok()
                .as_deref(),
            Some("requests[socks,security]==2.*")
        );
        assert_eq!(
            validate_spec("zope.interface", false).ok().as_deref(),
            Some("zope.interface")
        );
    }

    #[test]
    fn injections_are_refused() {
        for bad in [
            "--index-url=https://evil.example/simple",
            "-e .",
            "-r requirements.txt",
            "six; rm -rf /",
            "six; python_version > '3'",
            "file:///etc",
            "./local",
            "/etc/passwd",
            ".",
            "six @ file:///etc",
            "six @ https://evil.example/x.whl",
            "six==1.0 --index-url=x",
            "six\n--index-url=x",
            "six`id`",
            "six$(id)",
            "",
            "_six",
            "six-",
            "evil-1.0-py3-none-any.whl",
            "evil-1.0.tar.gz",
            "Evil.ZIP",
            "evil.tgz[x]",
            "evil.tar.bz2==1.0",
        ] {
            let e = validate_spec(bad, false).expect_err(bad);
            assert_eq!(e.code(), "invalid_package_spec", "{bad}");
        }
        assert!(validate_spec("six @ https://example.org/six.whl", true).is_ok());
        assert!(validate_spec("six @ file:///etc", true).is_err());
        assert!(validate_spec("six @ https://x/a b", true).is_err());
    }

    #[test]
    fn errors_round_trip_as_json() {
        for e in [
            refuse("x y", "why"),
            PackageError::SharedVenvRefused,
            PackageError::InstallFailed {
                status: "exit status: 1".into(),
                stderr_tail: "no such package".into(),
            },
            PackageError::InstallerUnavailable { message: "m".into() },
        ] {
            assert_eq!(PackageError::from_json(&e.to_json()), Some(e.clone()));
        }
    }

    #[test]
    fn an_interpreter_the_kernel_can_write_is_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let work = d.path().join("work");
        std::fs::create_dir_all(work.join("v/bin")).expect("mkdir");
        let t = |python: PathBuf| PackageTarget {
            overlay: d.path().join("ov"),
            python,
            writable: vec![work.clone()],
        };
        assert!(t(work.join("v/bin/python")).interpreter_writable());
        assert!(!t(PathBuf::from("/usr/bin/python3")).interpreter_writable());
        // A link out of the workdir to a kernel-written file is caught by
        // its real path.
        std::fs::write(work.join("v/bin/py"), "").expect("write");
        std::os::unix::fs::symlink(work.join("v/bin/py"), d.path().join("py")).expect("link");
        assert!(t(d.path().join("py")).interpreter_writable());
    }

    #[test]
    fn dist_info_names_and_modules() {
        let d = tempfile::tempdir().expect("tempdir");
        let info = d.path().join("six-1.17.0.dist-info");
        std::fs::create_dir_all(&info).expect("mkdir");
        std::fs::write(
            info.join("RECORD"),
            "six.py,sha256=x,1\nsix-1.17.0.dist-info/METADATA,,\n__pycache__/six.cpython-311.pyc,,\n",
        )
        .expect("write");
        let dist = read_dist(d.path(), "six-1.17.0.dist-info");
        assert_eq!(dist.name, "six");
        assert_eq!(dist.version, "1.17.0");
        assert_eq!(dist.modules, vec!["six".to_string()]);
    }
}
