//! The configuration: one TOML file plus `CELLHOST_*` environment
//! overrides for every default of DESIGN.md, and where each value came from.
//!
//! ```toml
//! python = "/opt/venvs/ds/bin/python"
//! cell_timeout_s = 120
//! max_live_kernels = 8
//!
//! [tools.search]
//! command = ["/usr/local/bin/search", "--json"]
//! timeout_s = 20
//! description = "Search the docs"
//! ```
//!
//! Precedence: environment (`CELLHOST_` + the key in upper case, e.g.
//! `CELLHOST_CELL_TIMEOUT_S=60`) over the file over the default. The file is
//! `--config PATH`, else `CELLHOST_CONFIG`, else
//! `$XDG_CONFIG_HOME/cellhost/config.toml` (or `~/.config/…`) when it
//! exists. `CELLHOST_TOOLS` holds `[tools]` entries in TOML
//! (`search = { command = ["x"] }`) and replaces the file's tools.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cellhost_kernel::KernelConfig;
use serde::Serialize;

use crate::journal::Durability;
use crate::tools::ToolSpec;

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "from", rename_all = "snake_case")]
pub enum Source {
    /// The built-in default.
    Default,
    /// The config file.
    File(PathBuf),
    /// An environment variable.
    Env(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env(v) => write!(f, "env {v}"),
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Int,
    Float,
    Bool,
    Str,
}

/// (key, kind, default as TOML, meaning)
const SETTINGS: &[(&str, Kind, &str, &str)] = &[
    (
        "python",
        Kind::Str,
        "\"\"",
        "interpreter (empty: python3 on PATH)",
    ),
    (
        "r",
        Kind::Str,
        "\"\"",
        "R interpreter for R sessions (empty: R on PATH)",
    ),
    (
        "stdout_inline_bytes",
        Kind::Int,
        "50000",
        "inline stdout per cell",
    ),
    (
        "stderr_inline_bytes",
        Kind::Int,
        "10000",
        "inline stderr per cell",
    ),
    (
        "head_fraction",
        Kind::Float,
        "0.4",
        "share of the inline bytes kept at the head",
    ),
    (
        "spill_bytes",
        Kind::Int,
        "50000000",
        "spill file cap per stream and cell",
    ),
    ("cell_timeout_s", Kind::Float, "300.0", "cell deadline (0 = none)"),
    (
        "interrupt_grace_s",
        Kind::Float,
        "2.0",
        "interrupt grace before the kill",
    ),
    ("tool_budget", Kind::Int, "50", "host calls per cell"),
    ("max_live_kernels", Kind::Int, "16", "live kernels (LRU cap)"),
    (
        "idle_timeout_s",
        Kind::Float,
        "1800.0",
        "idle time before a kernel is reaped",
    ),
    (
        "pool_size",
        Kind::Int,
        "2",
        "warm kernels for the default configuration",
    ),
    (
        "preload",
        Kind::Str,
        "\"\"",
        "Python modules a template imports before forking Python kernels, comma-separated (empty: no template)",
    ),
    (
        "r_preload",
        Kind::Str,
        "\"\"",
        "R packages a template attaches before forking R kernels, comma-separated (empty: no template)",
    ),
    (
        "staging_max_age_days",
        Kind::Float,
        "7.0",
        "age of dead hosts' staging dirs to sweep",
    ),
    (
        "package_index",
        Kind::Str,
        "\"https://pypi.org/simple\"",
        "package index installs use (--index-url)",
    ),
    (
        "packages.shared_venv",
        Kind::Bool,
        "false",
        "let installs write the interpreter's own environment (shared by its sessions)",
    ),
    (
        "packages.only_binary",
        Kind::Bool,
        "true",
        "wheels only: no sdist build code runs on the host",
    ),
    (
        "packages.allow_urls",
        Kind::Bool,
        "false",
        "accept `name @ https://…` specs",
    ),
    ("packages.timeout_s", Kind::Float, "600.0", "installer deadline"),
    (
        "checkpoint.mode",
        Kind::Str,
        "\"off\"",
        "checkpoints of sessions no pattern names: off, namespace or process ([checkpoint.sessions] by name pattern)",
    ),
    (
        "checkpoint.max_mb",
        Kind::Int,
        "256",
        "largest namespace checkpoint, MiB",
    ),
    (
        "checkpoint.timeout_s",
        Kind::Float,
        "60.0",
        "longest a checkpoint or a restore may run",
    ),
    (
        "restore.mode",
        Kind::Str,
        "\"checkpoint\"",
        "after a kernel's unexpected death: checkpoint, replay (the checkpoint, then the lost kernel's journaled cells) or none ([restore.sessions] by name pattern)",
    ),
    (
        "restore.max_cells",
        Kind::Int,
        "200",
        "most cells one replay runs",
    ),
    (
        "restore.timeout_s",
        Kind::Float,
        "300.0",
        "longest one replay may run",
    ),
    ("sandbox_mode", Kind::Str, "\"auto\"", "off, auto or enforce"),
    ("network", Kind::Bool, "false", "network inside the sandbox"),
    (
        "allow_weak_sandbox",
        Kind::Bool,
        "false",
        "let mode auto start kernels without namespaces (no user namespaces for a non-root user): Landlock and seccomp only",
    ),
    (
        "sandbox_disable",
        Kind::Str,
        "\"\"",
        "sandbox layers to leave out, comma-separated (reported missing; mode enforce then refuses kernels)",
    ),
    ("journal", Kind::Bool, "true", "keep the SQLite journal"),
    (
        "journal_sync",
        Kind::Str,
        "\"normal\"",
        "normal (survives a process kill) or full (fsync per cell)",
    ),
    (
        "serve_header_timeout_s",
        Kind::Float,
        "10.0",
        "serve: time for a request's head to arrive (from accept, or from its first byte)",
    ),
    (
        "serve_idle_timeout_s",
        Kind::Float,
        "60.0",
        "serve: keep-alive time of a connection with no request in flight",
    ),
    (
        "serve_body_timeout_s",
        Kind::Float,
        "30.0",
        "serve: time for a request's body to arrive after its head",
    ),
    (
        "serve_max_connections",
        Kind::Int,
        "1024",
        "serve: connections served at once (more are answered 503 and closed)",
    ),
    (
        "file_max_mb",
        Kind::Int,
        "100",
        "files: largest file written into a session (HTTP PUT, MCP write_file, cp), in MiB",
    ),
    (
        "mcp_file_max_kb",
        Kind::Int,
        "1024",
        "mcp: largest file read_file returns and write_file takes inline, in KiB",
    ),
    (
        "mcp_image_max_kb",
        Kind::Int,
        "256",
        "mcp: larger images are sent as a resource link instead of inline base64, in KiB",
    ),
];

/// Layer names `sandbox_disable` accepts.
pub const SANDBOX_LAYERS: &[&str] = &[
    "rlimits",
    "pidns",
    "netns",
    "ipcns",
    "utsns",
    "mountns",
    "cgroupns",
    "landlock",
    "capabilities",
    "seccomp",
    "cgroup",
];

/// Errors of the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config {path}: {source}")]
    Read {
        /// File.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A value is wrong.
    #[error("config: {0}")]
    Invalid(String),
}

/// One effective value.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// The value.
    pub value: toml::Value,
    /// Where it came from.
    pub source: Source,
}

/// The effective configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// The file read, if any.
    pub file: Option<PathBuf>,
    /// Every setting by key.
    pub values: BTreeMap<String, Entry>,
    /// Declared tools.
    pub tools: BTreeMap<String, ToolSpec>,
    /// Where the tools came from.
    pub tools_source: Source,
    /// The `[egress]` table: network policies per session pattern, the
    /// egress proxy's settings ([`crate::config_egress`]).
    #[serde(skip)]
    pub egress: crate::NetworkSettings,
    /// Where kernels run: `placement` and the `[placement.<name>]` tables.
    pub placements: crate::placement::Placements,
    /// Limits per session (`[limits.max]`, `[limits.default]`,
    /// `[[limits.session]]`; see [`crate::limits`]).
    pub limits: crate::limits::LimitsPolicy,
    /// Checkpoint modes by session-name pattern (`[checkpoint.sessions]`).
    pub checkpoint_sessions: Vec<(String, crate::checkpoint::CheckpointMode)>,
    /// Restore modes by session-name pattern (`[restore.sessions]`).
    pub restore_sessions: Vec<(String, crate::replay::RestoreMode)>,
}

fn parse_env(key: &str, kind: Kind, raw: &str) -> Result<toml::Value, ConfigError> {
    let bad = |what: &str| {
        ConfigError::Invalid(format!(
            "CELLHOST_{}={raw:?}: expected {what}",
            key.to_uppercase()
        ))
    };
    Ok(match kind {
        Kind::Int => toml::Value::Integer(raw.trim().parse().map_err(|_| bad("an integer"))?),
        Kind::Float => toml::Value::Float(raw.trim().parse().map_err(|_| bad("a number"))?),
        Kind::Bool => toml::Value::Boolean(match raw.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            _ => return Err(bad("true or false")),
        }),
        Kind::Str => toml::Value::String(raw.to_string()),
    })
}

fn check_kind(key: &str, kind: Kind, v: toml::Value, path: &Path) -> Result<toml::Value, ConfigError> {
    let ok = match (kind, &v) {
        (Kind::Int, toml::Value::Integer(_))
        | (Kind::Bool, toml::Value::Boolean(_))
        | (Kind::Str, toml::Value::String(_)) => true,
        (Kind::Float, toml::Value::Float(_)) => true,
        (Kind::Float, toml::Value::Integer(i)) => return Ok(toml::Value::Float(*i as f64)),
        _ => false,
    };
    if ok {
        Ok(v)
    } else {
        Err(ConfigError::Invalid(format!(
            "{}: `{key}` has the wrong type ({})",
            path.display(),
            v.type_str()
        )))
    }
}

/// The default config file path, if it exists.
pub fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    let p = base.join("cellhost").join("config.toml");
    p.is_file().then_some(p)
}

/// Takes the table `[NAME]` out of `table`: its keys go back as settings
/// named `NAME.KEY`, but for `[NAME.sessions]` (session-name pattern =
/// mode, each mode read by `parse`), which is returned in its order.
///
/// # Errors
/// [`ConfigError::Invalid`] when `NAME` or `NAME.sessions` is not a table or a
/// mode is not a string `parse` takes.
fn sessions_section<M>(
    table: &mut toml::Table,
    name: &str,
    parse: impl Fn(&str) -> Result<M, String>,
) -> Result<Vec<(String, M)>, ConfigError> {
    let mut sessions = Vec::new();
    match table.remove(name) {
        Some(toml::Value::Table(mut t)) => {
            match t.remove("sessions") {
                Some(toml::Value::Table(pats)) => {
                    for (pat, mode) in pats {
                        let m = mode
                            .as_str()
                            .ok_or_else(|| format!("a mode is a string, got {mode}"))
                            .and_then(&parse)
                            .map_err(|e| ConfigError::Invalid(format!("[{name}.sessions] {pat:?}: {e}")))?;
                        sessions.push((pat, m));
                    }
                }
                Some(_) => {
                    return Err(ConfigError::Invalid(format!("`{name}.sessions` must be a table")));
                }
                None => {}
            }
            for (k, v) in t {
                table.insert(format!("{name}.{k}"), v);
            }
        }
        Some(_) => return Err(ConfigError::Invalid(format!("`{name}` must be a table"))),
        None => {}
    }
    Ok(sessions)
}

fn parse_tools(table: toml::Table, origin: &str) -> Result<BTreeMap<String, ToolSpec>, ConfigError> {
    let mut out = BTreeMap::new();
    for (name, v) in table {
        let spec: ToolSpec = v
            .try_into()
            .map_err(|e| ConfigError::Invalid(format!("{origin}: [tools.{name}]: {e}")))?;
        if spec.command.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "{origin}: [tools.{name}]: `command` is empty"
            )));
        }
        if !(spec.timeout_s > 0.0 && spec.timeout_s.is_finite()) {
            return Err(ConfigError::Invalid(format!(
                "{origin}: [tools.{name}]: `timeout_s` must be > 0"
            )));
        }
        out.insert(name, spec);
    }
    Ok(out)
}

impl Config {
    /// Loads `explicit`, else `CELLHOST_CONFIG`, else the default file if
    /// it exists, then applies `CELLHOST_*` from `env`.
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable file, unknown keys or bad values.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_with(explicit, |k| std::env::var(k).ok())
    }

    /// As [`Config::load`] with an explicit environment (for tests).
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn load_with(
        explicit: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let file = explicit
            .map(Path::to_path_buf)
            .or_else(|| {
                env("CELLHOST_CONFIG")
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
            })
            .or_else(default_config_path);
        let mut table = toml::Table::new();
        if let Some(p) = &file {
            let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.display().to_string(),
                source,
            })?;
            table = text
                .parse::<toml::Table>()
                .map_err(|e| ConfigError::Invalid(format!("{}: {e}", p.display())))?;
        }
        let file_tools = match table.remove("tools") {
            Some(toml::Value::Table(t)) => Some(t),
            Some(_) => {
                return Err(ConfigError::Invalid(
                    "`tools` must be a table of [tools.NAME]".into(),
                ));
            }
            None => None,
        };
        let egress = match (table.remove("egress"), &file) {
            (Some(toml::Value::Table(t)), Some(p)) => {
                crate::config_egress::parse(t, &p.display().to_string())?
            }
            (Some(_), _) => return Err(ConfigError::Invalid("`egress` must be a table ([egress])".into())),
            (None, _) => crate::NetworkSettings::default(),
        };
        // `[checkpoint]`: its keys are settings named `checkpoint.KEY`, but
        // for `[checkpoint.sessions]` (session-name pattern = mode).
        let checkpoint_sessions =
            sessions_section(&mut table, "checkpoint", crate::checkpoint::CheckpointMode::parse)?;
        // `[restore]`: as `[checkpoint]` (`[restore.sessions]`: pattern = mode).
        let restore_sessions = sessions_section(&mut table, "restore", crate::replay::RestoreMode::parse)?;
        // `[packages]` (or `packages.KEY = …`): its keys are settings named
        // `packages.KEY`.
        match table.remove("packages") {
            Some(toml::Value::Table(t)) => {
                for (k, v) in t {
                    table.insert(format!("packages.{k}"), v);
                }
            }
            Some(_) => {
                return Err(ConfigError::Invalid("`packages` must be a table".into()));
            }
            None => {}
        }
        let placement_raw = match env("CELLHOST_PLACEMENT").filter(|s| !s.is_empty()) {
            Some(name) => {
                // The name from the environment; the tables from the file.
                let mut v = table.remove("placement");
                match &mut v {
                    Some(toml::Value::Table(t)) => {
                        t.insert("default".into(), toml::Value::String(name));
                    }
                    _ => v = Some(toml::Value::String(name)),
                }
                v
            }
            None => table.remove("placement"),
        };
        let placements = crate::placement::Placements::parse(placement_raw)
            .map_err(|e| ConfigError::Invalid(format!("placement: {e}")))?;
        let limits = match (table.remove("limits"), &file) {
            (Some(v), Some(p)) => {
                let policy: crate::limits::LimitsPolicy = v
                    .try_into()
                    .map_err(|e| ConfigError::Invalid(format!("{}: [limits]: {e}", p.display())))?;
                policy
                    .validate()
                    .map_err(|e| ConfigError::Invalid(format!("{}: {e}", p.display())))?;
                policy
            }
            _ => crate::limits::LimitsPolicy::default(),
        };
        let mut values = BTreeMap::new();
        for (key, kind, default, _) in SETTINGS {
            let envk = format!("CELLHOST_{}", key.to_uppercase().replace('.', "_"));
            let in_file = table.remove(*key);
            let entry = if let Some(raw) = env(&envk) {
                Entry {
                    value: parse_env(key, *kind, &raw)?,
                    source: Source::Env(envk),
                }
            } else if let (Some(v), Some(p)) = (in_file, &file) {
                Entry {
                    value: check_kind(key, *kind, v, p)?,
                    source: Source::File(p.clone()),
                }
            } else {
                let v: toml::Table = format!("v = {default}")
                    .parse()
                    .map_err(|e| ConfigError::Invalid(format!("default of {key}: {e}")))?;
                Entry {
                    value: v.get("v").cloned().unwrap_or(toml::Value::Boolean(false)),
                    source: Source::Default,
                }
            };
            values.insert(key.to_string(), entry);
        }
        if let Some((k, _)) = table.iter().next() {
            let known: Vec<&str> = SETTINGS.iter().map(|s| s.0).collect();
            return Err(ConfigError::Invalid(format!(
                "{}: unknown key `{k}` (known: {}, placement, [tools.NAME], [egress], [limits], [placement.NAME])",
                file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                known.join(", ")
            )));
        }
        let (tools, tools_source) = if let Some(raw) = env("CELLHOST_TOOLS").filter(|s| !s.trim().is_empty())
        {
            let t: toml::Table = raw
                .parse()
                .map_err(|e| ConfigError::Invalid(format!("CELLHOST_TOOLS: {e}")))?;
            (
                parse_tools(t, "CELLHOST_TOOLS")?,
                Source::Env("CELLHOST_TOOLS".into()),
            )
        } else if let (Some(t), Some(p)) = (file_tools, &file) {
            (parse_tools(t, &p.display().to_string())?, Source::File(p.clone()))
        } else {
            (BTreeMap::new(), Source::Default)
        };
        let cfg = Config {
            file,
            values,
            tools,
            tools_source,
            egress,
            placements,
            limits,
            checkpoint_sessions,
            restore_sessions,
        };
        crate::replay::RestoreMode::parse(&cfg.string("restore.mode"))
            .map_err(|e| ConfigError::Invalid(format!("restore.mode: {e}")))?;
        crate::checkpoint::CheckpointMode::parse(&cfg.string("checkpoint.mode"))
            .map_err(|e| ConfigError::Invalid(format!("checkpoint.mode: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        for k in [
            "stdout_inline_bytes",
            "stderr_inline_bytes",
            "spill_bytes",
            "tool_budget",
            "max_live_kernels",
            "pool_size",
        ] {
            if self.int(k) < 0 {
                return Err(ConfigError::Invalid(format!("{k} must be >= 0")));
            }
        }
        for k in [
            "cell_timeout_s",
            "interrupt_grace_s",
            "idle_timeout_s",
            "staging_max_age_days",
            "head_fraction",
        ] {
            let v = self.float(k);
            if !v.is_finite() || v < 0.0 {
                return Err(ConfigError::Invalid(format!("{k} must be a number >= 0")));
            }
        }
        for k in [
            "serve_header_timeout_s",
            "serve_idle_timeout_s",
            "serve_body_timeout_s",
        ] {
            let v = self.float(k);
            if !v.is_finite() || v <= 0.0 || v > 86_400.0 {
                return Err(ConfigError::Invalid(format!(
                    "{k} must be a number of seconds > 0 and at most 86400"
                )));
            }
        }
        if !(1..=1 << 20).contains(&self.int("serve_max_connections")) {
            return Err(ConfigError::Invalid(
                "serve_max_connections must be between 1 and 1048576".into(),
            ));
        }
        for (key, max) in [
            ("file_max_mb", 1 << 20),
            ("mcp_file_max_kb", 1 << 20),
            ("mcp_image_max_kb", 1 << 20),
        ] {
            if !(1..=max).contains(&self.int(key)) {
                return Err(ConfigError::Invalid(format!("{key} must be between 1 and {max}")));
            }
        }
        let index = self.string("package_index");
        if !(index.starts_with("https://") || index.starts_with("http://"))
            || index.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ConfigError::Invalid(format!(
                "package_index must be an http(s) URL of a simple index, got {index:?}"
            )));
        }
        if self.int("max_live_kernels") == 0 {
            return Err(ConfigError::Invalid("max_live_kernels must be at least 1".into()));
        }
        if !["off", "auto", "enforce"].contains(&self.string("sandbox_mode").as_str()) {
            return Err(ConfigError::Invalid(
                "sandbox_mode must be off, auto or enforce".into(),
            ));
        }
        for layer in self.sandbox_disable() {
            if !SANDBOX_LAYERS.contains(&layer.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "sandbox_disable: unknown layer {layer:?} (one of {})",
                    SANDBOX_LAYERS.join(", ")
                )));
            }
        }
        if !["normal", "full"].contains(&self.string("journal_sync").as_str()) {
            return Err(ConfigError::Invalid("journal_sync must be normal or full".into()));
        }
        Ok(())
    }

    /// An integer setting (0 if unknown).
    pub fn int(&self, key: &str) -> i64 {
        self.values
            .get(key)
            .and_then(|e| e.value.as_integer())
            .unwrap_or(0)
    }

    /// A number setting.
    pub fn float(&self, key: &str) -> f64 {
        self.values
            .get(key)
            .and_then(|e| e.value.as_float())
            .unwrap_or(0.0)
    }

    /// A boolean setting.
    pub fn bool(&self, key: &str) -> bool {
        self.values
            .get(key)
            .and_then(|e| e.value.as_bool())
            .unwrap_or(false)
    }

    /// A string setting.
    pub fn string(&self, key: &str) -> String {
        self.values
            .get(key)
            .and_then(|e| e.value.as_str())
            .unwrap_or_default()
            .to_string()
    }

    /// The sandbox layers `sandbox_disable` leaves out.
    pub fn sandbox_disable(&self) -> Vec<String> {
        self.string("sandbox_disable")
            .split(',')
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// R's interpreter (`r = "/usr/bin/R"`), if one is configured.
    pub fn r(&self) -> Option<PathBuf> {
        Some(self.string("r"))
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    }

    /// The interpreter, if one is configured.
    pub fn python(&self) -> Option<PathBuf> {
        Some(self.string("python"))
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    }

    /// The journal's durability.
    pub fn durability(&self) -> Durability {
        if self.string("journal_sync") == "full" {
            Durability::Full
        } else {
            Durability::Normal
        }
    }

    fn secs(&self, key: &str) -> Duration {
        Duration::from_secs_f64(self.float(key).max(0.0))
    }

    /// A number-of-seconds setting as a duration (negative: zero).
    pub fn duration(&self, key: &str) -> Duration {
        self.secs(key)
    }

    /// The cell timeout (`None`: no deadline).
    pub fn cell_timeout(&self) -> Option<Duration> {
        Some(self.secs("cell_timeout_s")).filter(|d| !d.is_zero())
    }

    /// Applies the kernel settings (limits, timeouts, budget, tools) to `cfg`.
    pub fn apply_to_kernel(&self, cfg: &mut KernelConfig) {
        cfg.stdout_limits.inline_bytes = self.int("stdout_inline_bytes") as usize;
        cfg.stderr_limits.inline_bytes = self.int("stderr_inline_bytes") as usize;
        for l in [&mut cfg.stdout_limits, &mut cfg.stderr_limits] {
            l.head_fraction = self.float("head_fraction");
            l.spill_bytes = self.int("spill_bytes") as u64;
        }
        cfg.cell_timeout = self.cell_timeout();
        cfg.interrupt_grace = self.secs("interrupt_grace_s");
        cfg.tool_budget = self.int("tool_budget") as u32;
        if let Ok(mode) = self.string("sandbox_mode").parse() {
            cfg.sandbox.mode = mode;
        }
        cfg.sandbox.network = self.bool("network");
        cfg.sandbox.allow_weak = self.bool("allow_weak_sandbox");
        cfg.sandbox.disable = self.sandbox_disable();
        if !self.tools.is_empty() {
            cfg.tool_host = Some(std::sync::Arc::new(crate::tools::CommandTools::new(
                self.tools.clone(),
            )));
        }
        // Checked at load: the default names a configured placement.
        if let Ok(starter) = self.placements.starter(&self.placements.default) {
            cfg.starter = starter;
        }
    }

    /// Applies the registry settings (cap, idle timeout, pool, staging age).
    pub fn apply_to_registry(&self, rc: &mut crate::registry::RegistryConfig) {
        rc.max_live = self.int("max_live_kernels") as usize;
        rc.idle_timeout = self.secs("idle_timeout_s");
        rc.pool_size = self.int("pool_size") as usize;
        let list = |key: &str| -> Vec<String> {
            self.string(key)
                .split(',')
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .collect()
        };
        // One list per language: a Python module name never reaches R.
        rc.preload = list("preload");
        rc.r_preload = list("r_preload");
        rc.staging_max_age = Duration::from_secs_f64(self.float("staging_max_age_days") * 86400.0);
        rc.network = self.egress.clone();
        rc.packages = crate::packages::PackageSettings {
            index_url: self.string("package_index"),
            shared_venv: self.bool("packages.shared_venv"),
            only_binary: self.bool("packages.only_binary"),
            allow_urls: self.bool("packages.allow_urls"),
            timeout: Duration::from_secs_f64(self.float("packages.timeout_s").clamp(1.0, 86400.0)),
            egress_hosts: self.egress.hosts.clone(),
        };
        rc.limits = self.limits.clone();
        rc.placements = self.placements.clone();
        rc.checkpoint = crate::checkpoint::CheckpointSettings {
            default: crate::checkpoint::CheckpointMode::parse(&self.string("checkpoint.mode"))
                .unwrap_or_default(),
            sessions: self.checkpoint_sessions.clone(),
            max_bytes: (self.int("checkpoint.max_mb").max(1) as u64) << 20,
            timeout: Duration::from_secs_f64(self.float("checkpoint.timeout_s").clamp(1.0, 86400.0)),
        };
        rc.restore = crate::replay::RestoreSettings {
            default: crate::replay::RestoreMode::parse(&self.string("restore.mode")).unwrap_or_default(),
            sessions: self.restore_sessions.clone(),
            max_cells: self.int("restore.max_cells").clamp(0, 100_000) as usize,
            timeout: Duration::from_secs_f64(self.float("restore.timeout_s").clamp(1.0, 86400.0)),
        };
    }

    /// `key = value  # source` lines, then the tools.
    pub fn render(&self) -> String {
        let mut out = String::new();
        match &self.file {
            Some(p) => out.push_str(&format!("# config file: {}\n", p.display())),
            None => out.push_str("# config file: none\n"),
        }
        for (key, _, _, doc) in SETTINGS {
            if let Some(e) = self.values.get(*key) {
                out.push_str(&format!("{key} = {}  # {} ({doc})\n", e.value, e.source));
            }
        }
        let l = &self.limits;
        if !l.max.is_empty() || !l.default.is_empty() || !l.rules.is_empty() {
            let table = |l: &crate::limits::SessionLimits| toml::to_string(l).unwrap_or_default();
            out.push_str(&format!("\n[limits.max]\n{}", table(&l.max)));
            out.push_str(&format!("\n[limits.default]\n{}", table(&l.default)));
            for r in &l.rules {
                out.push_str(&format!(
                    "\n[[limits.session]]\nmatch = {}\n{}",
                    toml::Value::String(r.pattern.clone()),
                    table(&r.limits)
                ));
            }
        } else {
            out.push_str("# limits: host defaults, no maximum ([limits] not configured)\n");
        }
        if self.tools.is_empty() {
            out.push_str(&format!("# tools: none ({})\n", self.tools_source));
        }
        for (name, t) in &self.tools {
            out.push_str(&format!("\n[tools.{name}]  # {}\n", self.tools_source));
            out.push_str(&format!(
                "command = {}\ntimeout_s = {}\ndescription = {}\n",
                toml::Value::Array(t.command.iter().map(|c| toml::Value::String(c.clone())).collect()),
                t.timeout_s,
                toml::Value::String(t.description.clone())
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry's configuration of state under `dir`, to apply a
    /// [`Config`] to.
    fn registry_config(dir: &Path) -> crate::registry::RegistryConfig {
        crate::registry::RegistryConfig::new(
            dir.join("state"),
            cellhost_kernel::KernelConfig::new(std::path::PathBuf::from("python3"), dir.join("s")),
        )
    }

    #[test]
    fn preload_lists_are_kept_per_language() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "preload = \"numpy, pandas\"\nr_preload = \"dplyr,  ggplot2 ,\"\n",
        )
        .expect("write");
        let c = Config::load_with(Some(&p), |_| None).expect("load");
        let mut rc = registry_config(dir.path());
        c.apply_to_registry(&mut rc);
        assert_eq!(rc.preload, vec!["numpy", "pandas"]);
        assert_eq!(rc.r_preload, vec!["dplyr", "ggplot2"]);
        let env = |k: &str| (k == "CELLHOST_R_PRELOAD").then(|| "data.table".to_string());
        let c = Config::load_with(None, env).expect("load");
        c.apply_to_registry(&mut rc);
        assert!(rc.preload.is_empty());
        assert_eq!(rc.r_preload, vec!["data.table"]);
    }

    #[test]
    fn restore_table_is_read_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[restore]\nmode = \"replay\"\nmax_cells = 7\ntimeout_s = 9\n[restore.sessions]\n\"scratch-*\" = \"none\"\n",
        )
        .expect("write");
        let c = Config::load_with(Some(&p), |_| None).expect("load");
        let mut rc = registry_config(dir.path());
        c.apply_to_registry(&mut rc);
        assert_eq!(rc.restore.default, crate::replay::RestoreMode::Replay);
        assert_eq!(rc.restore.max_cells, 7);
        assert_eq!(rc.restore.timeout, Duration::from_secs(9));
        assert_eq!(
            rc.restore.for_session("scratch-1"),
            crate::replay::RestoreMode::None
        );
        assert_eq!(rc.restore.for_session("ana"), crate::replay::RestoreMode::Replay);
        let env = |k: &str| (k == "CELLHOST_RESTORE_MODE").then(|| "none".to_string());
        let c = Config::load_with(None, env).expect("env");
        c.apply_to_registry(&mut rc);
        assert_eq!(rc.restore.default, crate::replay::RestoreMode::None);
        for bad in [
            "[restore]\nmode = \"sometimes\"\n",
            "[restore.sessions]\nx = \"maybe\"\n",
            "restore = 3\n",
        ] {
            std::fs::write(&p, bad).expect("write");
            assert!(Config::load_with(Some(&p), |_| None).is_err(), "{bad}");
        }
    }

    #[test]
    fn precedence_env_over_file_over_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "cell_timeout_s = 60\nmax_live_kernels = 4\n[tools.grep]\ncommand = [\"grep\", \"-r\"]\ntimeout_s = 5\n",
        )
        .expect("write");
        let env = |k: &str| match k {
            "CELLHOST_MAX_LIVE_KERNELS" => Some("8".to_string()),
            _ => None,
        };
        let c = Config::load_with(Some(&p), env).expect("load");
        assert_eq!(c.float("cell_timeout_s"), 60.0);
        assert_eq!(c.values["cell_timeout_s"].source, Source::File(p.clone()));
        assert_eq!(c.int("max_live_kernels"), 8);
        assert_eq!(
            c.values["max_live_kernels"].source,
            Source::Env("CELLHOST_MAX_LIVE_KERNELS".into())
        );
        assert_eq!(c.int("tool_budget"), 50);
        assert_eq!(c.values["tool_budget"].source, Source::Default);
        assert_eq!(c.tools["grep"].command, vec!["grep", "-r"]);
        let text = c.render();
        assert!(
            text.contains("max_live_kernels = 8  # env CELLHOST_MAX_LIVE_KERNELS"),
            "{text}"
        );
        assert!(text.contains("[tools.grep]"), "{text}");
    }

    #[test]
    fn serve_limits_are_checked() {
        let c = Config::load_with(None, |_| None).expect("defaults");
        assert_eq!(c.duration("serve_header_timeout_s"), Duration::from_secs(10));
        assert_eq!(c.int("serve_max_connections"), 1024);
        let env = |k: &str| (k == "CELLHOST_SERVE_HEADER_TIMEOUT_S").then(|| "0.5".to_string());
        let c = Config::load_with(None, env).expect("env");
        assert_eq!(c.duration("serve_header_timeout_s"), Duration::from_millis(500));
        for (k, v) in [
            ("CELLHOST_SERVE_IDLE_TIMEOUT_S", "0"),
            ("CELLHOST_SERVE_BODY_TIMEOUT_S", "-1"),
            ("CELLHOST_SERVE_MAX_CONNECTIONS", "0"),
            ("CELLHOST_SERVE_MAX_CONNECTIONS", "2000000"),
        ] {
            let e = Config::load_with(None, |x| (x == k).then(|| v.to_string())).expect_err(k);
            assert!(
                e.to_string().contains(&k["CELLHOST_".len()..].to_lowercase()),
                "{e}"
            );
        }
    }

    #[test]
    fn limits_tables_are_read_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[limits.max]\nmemory_mb = 2048\npids = 256\n[limits.default]\ncpu = 1.0\n[[limits.session]]\nmatch = \"agent-*\"\nmemory_mb = 512\n",
        )
        .expect("write");
        let c = Config::load_with(Some(&p), |_| None).expect("load");
        assert_eq!(c.limits.max.memory_mb, Some(2048));
        assert_eq!(c.limits.rules[0].pattern, "agent-*");
        let text = c.render();
        assert!(
            text.contains("[[limits.session]]") && text.contains("\"agent-*\""),
            "{text}"
        );
        std::fs::write(
            &p,
            "[limits.max]\npids = 64\n[[limits.session]]\nmatch = \"a\"\npids = 65\n",
        )
        .expect("write");
        let e = Config::load_with(Some(&p), |_| None).expect_err("rule over max");
        assert!(e.to_string().contains("pids"), "{e}");
        std::fs::write(&p, "[limits.max]\nmemory = 64\n").expect("write");
        let e = Config::load_with(Some(&p), |_| None).expect_err("unknown field");
        assert!(e.to_string().contains("memory"), "{e}");
    }

    #[test]
    fn mistakes_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "cel_timeout_s = 1\n").expect("write");
        let e = Config::load_with(Some(&p), |_| None).expect_err("unknown");
        assert!(e.to_string().contains("cel_timeout_s"), "{e}");
        std::fs::write(&p, "tool_budget = \"x\"\n").expect("write");
        assert!(Config::load_with(Some(&p), |_| None).is_err());
        let e = Config::load_with(None, |k| (k == "CELLHOST_POOL_SIZE").then(|| "two".into()))
            .expect_err("bad env");
        assert!(e.to_string().contains("CELLHOST_POOL_SIZE"), "{e}");
        let c = Config::load_with(None, |k| {
            (k == "CELLHOST_TOOLS").then(|| "echo = { command = [\"cat\"] }".into())
        })
        .expect("tools env");
        assert_eq!(c.tools["echo"].timeout_s, 30.0);
    }
}
