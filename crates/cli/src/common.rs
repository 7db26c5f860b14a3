//! Shared plumbing: session directories, kernel configuration, runtime.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::OnceLock;

use cellhost_kernel::{KernelConfig, KernelError, resolve_python};
use cellhost_sessions::Config;

use crate::KernelArgs;

/// Exit code for usage errors.
pub const EXIT_USAGE: u8 = 2;

/// Root of cellhost's per-user state (`$XDG_STATE_HOME/cellhost`, else
/// `~/.local/state/cellhost`, else a directory under the temp dir).
pub fn state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CELLHOST_STATE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("cellhost");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".local/state/cellhost");
    }
    std::env::temp_dir().join("cellhost-state")
}

static CONFIG_PATH: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Records `--config PATH` (called once, from `main`).
pub fn set_config_path(path: Option<PathBuf>) {
    let _ = CONFIG_PATH.set(path);
}

/// The `--config PATH` given, if any.
pub fn config_path() -> Option<PathBuf> {
    CONFIG_PATH.get().cloned().flatten()
}

/// The effective configuration: `--config`, else `CELLHOST_CONFIG`, else
/// the default file, with `CELLHOST_*` overrides.
pub fn config() -> Result<Config, String> {
    let explicit = CONFIG_PATH.get().and_then(|p| p.as_deref());
    Config::load(explicit).map_err(|e| e.to_string())
}

static NETWORK_DEFAULT: std::sync::Mutex<Option<cellhost_kernel::egress::NetworkPolicy>> =
    std::sync::Mutex::new(None);

/// The command's `--network`: the default policy of the sessions of the
/// registry it starts (over the config's `[egress] default`).
pub fn set_network_default(p: cellhost_kernel::egress::NetworkPolicy) {
    if let Ok(mut g) = NETWORK_DEFAULT.lock() {
        *g = Some(p);
    }
}

static CHECKPOINT_DEFAULT: std::sync::Mutex<Option<cellhost_sessions::CheckpointMode>> =
    std::sync::Mutex::new(None);

/// The command's `--checkpoint`: the default checkpoint mode of the
/// sessions of the registry it starts (over config `checkpoint.mode`).
pub fn set_checkpoint_default(m: cellhost_sessions::CheckpointMode) {
    if let Ok(mut g) = CHECKPOINT_DEFAULT.lock() {
        *g = Some(m);
    }
}

static RESTORE_DEFAULT: std::sync::Mutex<Option<cellhost_sessions::RestoreMode>> =
    std::sync::Mutex::new(None);

/// The command's `--restore`: the default restore mode of the sessions of
/// the registry it starts (over config `restore.mode`).
pub fn set_restore_default(m: cellhost_sessions::RestoreMode) {
    if let Ok(mut g) = RESTORE_DEFAULT.lock() {
        *g = Some(m);
    }
}

/// The journal file: `journal.sqlite3` in the state directory.
pub fn journal_path() -> PathBuf {
    state_dir().join("journal.sqlite3")
}

/// The owner of the sessions the CLI creates — one-shot commands and the
/// daemon alike: `cli:<user>` (never an owner of another surface, such as
/// `serve`'s `http:<token owner>`).
pub fn cli_owner() -> String {
    cellhost_sessions::requests::cli_owner()
}

/// Prints a request's error and returns its exit code: 2 for the caller's
/// mistake (a bad name or timeout, no such session), 1 otherwise.
pub fn request_failed(e: &cellhost_sessions::RequestError) -> u8 {
    eprintln!("cellhost: {e}");
    if e.is_usage() { EXIT_USAGE } else { 1 }
}

/// A fresh directory for a one-off session's files (figures, spills).
pub fn new_session_dir(prefix: &str) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let root = state_dir().join("sessions");
    sweep_old_sessions(&root, SESSION_DIR_MAX_AGE);
    // A random suffix, not the host's pid: the kernel sees this path.
    let nonce = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), stamp);
    root.join(format!("{prefix}-{stamp}-{nonce:016x}"))
}

/// Session directories of one-off commands (their figures and spilled
/// output, which the command names when it ends) are kept this long.
const SESSION_DIR_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Removes session directories under `root` not modified for `max_age`.
/// Returns how many went. Errors (a directory in use, no permission) keep
/// the directory.
pub fn sweep_old_sessions(root: &Path, max_age: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > max_age);
        if old && e.path().is_dir() && std::fs::remove_dir_all(e.path()).is_ok() {
            n += 1;
        }
    }
    n
}

/// Parses `--timeout SECONDS`: absent is the configured default
/// (`cell_timeout_s`), 0 is no deadline.
pub fn parse_timeout(secs: Option<f64>) -> Result<cellhost_sessions::Deadline, String> {
    cellhost_sessions::Deadline::from_secs(secs).map_err(|e| format!("--timeout: {e}"))
}

/// `--python PATH` as a daemon request carries it: `None` when not given
/// (the daemon picks its own), else resolved by
/// [`cellhost_kernel::resolve_python`] and made absolute, since the daemon
/// does not run in the caller's directory. Errors: the resolver's (no such
/// interpreter, not executable).
pub fn daemon_python(python: Option<&Path>) -> Result<Option<PathBuf>, KernelError> {
    let Some(p) = python else { return Ok(None) };
    let p = resolve_python(Some(p))?;
    Ok(Some(std::path::absolute(&p).unwrap_or(p)))
}

/// [`daemon_python`] of a command's `--python`, its error printed:
/// `Err` holds the exit code ([`EXIT_USAGE`]).
pub fn daemon_python_arg(args: &KernelArgs) -> Result<Option<PathBuf>, u8> {
    daemon_python(args.python.as_deref()).map_err(|e| {
        eprintln!("cellhost: {e}");
        EXIT_USAGE
    })
}

/// A daemon's reply, an error reply and a failed call printed and made
/// the exit code: 2 for an error reply that is the caller's mistake
/// (`usage`), 1 otherwise. The command matches the reply it wants and
/// hands any other to [`unexpected_reply`].
pub fn daemon_reply(
    reply: std::io::Result<cellhost_server::daemon::Reply>,
) -> Result<cellhost_server::daemon::Reply, u8> {
    use cellhost_server::daemon::Reply;
    match reply {
        Ok(Reply::Error { message, usage, .. }) => {
            eprintln!("cellhost: {message}");
            Err(if usage { EXIT_USAGE } else { 1 })
        }
        Ok(r) => Ok(r),
        Err(e) => {
            eprintln!("cellhost: {e}");
            Err(1)
        }
    }
}

/// Prints a reply the request does not answer with; exit code 1.
pub fn unexpected_reply(other: &cellhost_server::daemon::Reply) -> u8 {
    eprintln!("cellhost: unexpected reply {other:?}");
    1
}

/// The interpreter a command names for `language` (other than Python's):
/// `--r` or config `r` for R.
pub fn interpreter_arg(
    args: &KernelArgs,
    config: &cellhost_sessions::Config,
    language: &str,
) -> Option<PathBuf> {
    match language {
        "r" => args.r.clone().or_else(|| config.r()),
        _ => None,
    }
}

/// The kernel configuration for a CLI session.
pub fn kernel_config(args: &KernelArgs, session: &str, dir: &Path) -> Result<KernelConfig, KernelError> {
    let config = config().map_err(KernelError::InvalidRequest)?;
    if let Some(p) = &args.network {
        set_network_default(p.clone());
    }
    if let Some(m) = args.checkpoint {
        set_checkpoint_default(m);
    }
    if let Some(m) = args.restore {
        set_restore_default(m);
    }
    let runtime = match &args.language {
        Some(name) => cellhost_kernel::for_language(name).ok_or_else(|| {
            KernelError::InvalidRequest(format!(
                "--language {name}: unknown language (known: {})",
                cellhost_kernel::runtime::LANGUAGES.join(", ")
            ))
        })?,
        None => cellhost_kernel::runtime::default_runtime(),
    };
    let python = if runtime.name() == "python" {
        resolve_python(args.python.as_deref().or(config.python().as_deref()))?
    } else {
        runtime.resolve_interpreter(interpreter_arg(args, &config, runtime.name()).as_deref())?
    };
    if !python.exists() {
        return Err(KernelError::Spawn {
            python: python.display().to_string(),
            reason: "no such file".into(),
        });
    }
    let mut cfg = KernelConfig::new(python, dir);
    cfg.runtime = runtime;
    config.apply_to_kernel(&mut cfg);
    // The host's control plane stays out of every kernel's view, even when
    // the kernel's workdir holds it: the state directory (journal, tokens,
    // other sessions' files; the kernel's own session directory is bound
    // back on top) and the daemon's run directory with its socket.
    let state = state_dir();
    cfg.sandbox.hidden.extend([
        cellhost_server::daemon::runtime_dir(&state),
        state.join("run"),
        state,
    ]);
    if let Some(mode) = args.sandbox {
        cfg.sandbox.mode = mode;
    }
    if let Some(name) = &args.placement {
        cfg.starter = config
            .placements
            .starter(name)
            .map_err(|e| KernelError::InvalidRequest(format!("--placement {name}: {e}")))?;
    }
    cellhost_sessions::placement::keep_identity_in(state_dir().join("remote"));
    cfg.session = session.to_string();
    // Cells resolve relative paths against the directory cellhost was run
    // from (`run` uses the notebook's directory), as Jupyter does; the
    // sandbox makes that directory readable and writable for the kernel.
    // Never the home directory itself or a directory holding it: then the
    // kernel starts in its session directory and home stays out of reach.
    cfg.cwd = std::env::current_dir().ok().filter(|d| workdir_allowed(d));
    for spec in &args.env {
        let (name, value) = match spec.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => {
                let v = std::env::var(spec).map_err(|_| {
                    KernelError::InvalidRequest(format!("--env {spec}: not set in this environment"))
                })?;
                (spec.clone(), v)
            }
        };
        set_env(&mut cfg, name, value);
    }
    for name in &args.secret_env {
        let value = std::env::var(name).map_err(|_| {
            KernelError::InvalidRequest(format!("--secret-env {name}: not set in this environment"))
        })?;
        cfg.register_secret(value.clone());
        set_env(&mut cfg, name.clone(), value);
    }
    Ok(cfg)
}

/// The session registry of one CLI command: the effective configuration,
/// the journal in the state directory when `journal = true` (a journal that
/// cannot be opened is reported and the command goes on without it),
/// `pool_size` overriding the configured warm pool when given, and the
/// configured `preload` template unless `one_shot` (a command that runs
/// one kernel would only pay the template's imports on top), and a
/// workdir of its own for each session under `session_workdirs` if given.
///
/// # Errors
/// The configuration is invalid, or the registry cannot make its staging
/// directory (the message says which).
pub async fn start_registry(
    template: KernelConfig,
    pool_size: Option<usize>,
    one_shot: bool,
    session_workdirs: Option<PathBuf>,
) -> Result<std::sync::Arc<cellhost_sessions::Registry>, String> {
    start_registry_with(template, pool_size, one_shot, session_workdirs, true).await
}

/// The registry of a one-shot command (`exec`, `repl`, `run`): one kernel,
/// no warm pool, no template; journaled when `journal` (and the
/// configuration's `journal`) says so.
///
/// # Errors
/// As [`start_registry`].
pub async fn start_one_shot(
    template: KernelConfig,
    journal: bool,
) -> Result<std::sync::Arc<cellhost_sessions::Registry>, String> {
    start_registry_with(template, Some(0), true, None, journal).await
}

async fn start_registry_with(
    template: KernelConfig,
    pool_size: Option<usize>,
    one_shot: bool,
    session_workdirs: Option<PathBuf>,
    journal: bool,
) -> Result<std::sync::Arc<cellhost_sessions::Registry>, String> {
    use cellhost_sessions::{Journal, Registry, RegistryConfig};
    let config = config()?;
    let journal = if journal && config.bool("journal") {
        match Journal::open(journal_path(), config.durability()) {
            Ok(j) => {
                let j = std::sync::Arc::new(j);
                // Remote agents' credential nonces burn durably here.
                cellhost_sessions::placement::burn_nonces_in(j.clone());
                Some(j)
            }
            Err(e) => {
                eprintln!("cellhost: the journal is off: {e}");
                None
            }
        }
    } else {
        None
    };
    let mut rc = RegistryConfig::new(state_dir(), template);
    config.apply_to_registry(&mut rc);
    // The template's starter (the config's default, or `--placement`) is
    // the default placement's.
    rc.placements.default = rc.template.starter.as_ref().map_or_else(
        || cellhost_sessions::placement::LOCAL.to_string(),
        |s| s.name().to_string(),
    );
    if let Some(p) = NETWORK_DEFAULT.lock().ok().and_then(|g| g.clone()) {
        rc.network.default = Some(p);
    }
    if let Some(m) = CHECKPOINT_DEFAULT.lock().ok().and_then(|g| *g) {
        rc.checkpoint.default = m;
    }
    if let Some(m) = RESTORE_DEFAULT.lock().ok().and_then(|g| *g) {
        rc.restore.default = m;
    }
    if let Some(r) = config.r() {
        rc.interpreters.insert("r".into(), r);
    }
    if let Some(n) = pool_size {
        rc.pool_size = n;
    }
    if one_shot {
        rc.preload.clear();
        rc.r_preload.clear();
    }
    rc.session_workdirs = session_workdirs;
    let probe = (!one_shot).then(|| rc.template.clone());
    let registry = Registry::start(rc, journal)
        .await
        .map_err(|e| format!("cannot start the session registry: {e}"))?;
    if let Some(template) = probe {
        tokio::spawn(report_sandbox(template, registry.first_pooled_start()));
    }
    Ok(registry)
}

/// Says once on stderr, at the start of a long-running surface (`serve`,
/// `mcp`, the daemon) and whatever the log level, what sandbox its kernels
/// get — the layers not in force with their reasons, or the refusal of
/// mode `auto` without namespaces. Learnt from the warm pool's first
/// kernel (`first_pool`) when there is a pool; otherwise a probe kernel of
/// the template is started in the background for it.
async fn report_sandbox(
    mut template: KernelConfig,
    first_pool: Option<tokio::sync::oneshot::Receiver<cellhost_sessions::pool::FirstOutcome>>,
) {
    if template.sandbox.mode == cellhost_sandbox::profile::SandboxMode::Off {
        eprintln!("cellhost: sandbox off: kernels run unconfined (environment allowlist only)");
        return;
    }
    let outcome = match first_pool {
        // The pool closed before its first start (the surface shut down).
        Some(rx) => match rx.await {
            Ok(o) => o,
            Err(_) => return,
        },
        None => {
            let dir = new_session_dir("sandbox-probe");
            template.session_dir = dir.clone();
            template.session = "sandbox-probe".into();
            template.cwd = None;
            template.sandbox.workdir = None;
            let o = match cellhost_kernel::Kernel::spawn(template).await {
                Ok(k) => {
                    let status = k.info().sandbox.clone();
                    k.kill().await;
                    Ok(status)
                }
                Err(e) => Err(e.to_string()),
            };
            let _ = std::fs::remove_dir_all(&dir);
            o
        }
    };
    match outcome {
        Ok(status) => {
            let s = cellhost_kernel::result::SandboxRef::of(&status);
            match s.degradation() {
                Some(line) => eprintln!("cellhost: {line} (in force: {})", s.enforced.join(", ")),
                None => eprintln!(
                    "cellhost: sandbox {}: every layer in force ({})",
                    s.mode,
                    s.enforced.join(", ")
                ),
            }
        }
        Err(e) => eprintln!("cellhost: sandbox check: {e}"),
    }
}

/// A directory the CLI may hand to a kernel as its read-write working
/// directory: not `$HOME` and not one of its ancestors (`/`, `/home`).
pub fn workdir_allowed(dir: &Path) -> bool {
    match std::env::var_os("HOME").map(std::path::PathBuf::from) {
        Some(home) if home.is_absolute() => !home.starts_with(dir),
        _ => dir != Path::new("/"),
    }
}

fn set_env(cfg: &mut KernelConfig, name: String, value: String) {
    cfg.env.retain(|(k, _)| k.to_str() != Some(name.as_str()));
    cfg.env.push((name.into(), value.into()));
}

/// Runs a command's future on a fresh [`runtime`] and returns its exit
/// code; 1 when the runtime cannot be started (the reason goes to stderr).
pub fn block_on(fut: impl std::future::Future<Output = u8>) -> u8 {
    match runtime() {
        Ok(rt) => rt.block_on(fut),
        Err(e) => {
            eprintln!("cellhost: cannot start the runtime: {e}");
            1
        }
    }
}

/// A multi-threaded runtime for one command.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// When `exec CODE` was given a file's path instead of code (`cellhost exec
/// analysis.py` evaluates `analysis.py` and fails with a `NameError` or
/// `AttributeError`), the hint says how to run the file: `cellhost run
/// FILE` (cells, a notebook written) or `cellhost exec - < FILE`. An
/// existing hint is kept after it.
pub fn hint_file_as_code(code: &str, r: &mut cellhost_kernel::CellResult) {
    let arg = code.trim();
    let is_path = !arg.is_empty() && !arg.contains('\n') && Path::new(arg).is_file();
    let misread = r
        .error
        .as_ref()
        .is_some_and(|e| matches!(e.ename.as_str(), "NameError" | "AttributeError" | "SyntaxError"));
    if !is_path || !misread {
        return;
    }
    let hint = format!(
        "{arg:?} is a file: CODE is Python source, not a path; run the file with `cellhost run {arg}` \
         (cells, a notebook written) or `cellhost exec - < {arg}`"
    );
    r.hint = Some(match r.hint.take() {
        Some(h) => format!("{hint}; {h}"),
        None => hint,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_session_dirs_are_swept_and_recent_ones_kept() {
        let root = tempfile::tempdir().expect("tempdir");
        let recent = root.path().join("exec-recent");
        std::fs::create_dir_all(recent.join("cells")).expect("mkdir");
        assert_eq!(sweep_old_sessions(root.path(), Duration::from_secs(3600)), 0);
        assert!(recent.is_dir());
        // Everything is older than zero seconds once a moment has passed.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(sweep_old_sessions(root.path(), Duration::ZERO), 1);
        assert!(!recent.exists());
        assert_eq!(
            sweep_old_sessions(&root.path().join("missing"), Duration::ZERO),
            0
        );
    }

    #[test]
    fn daemon_python_is_absolute_and_absent_stays_absent() {
        assert!(matches!(daemon_python(None), Ok(None)));
        let cwd = std::env::current_dir().expect("cwd");
        let got = daemon_python(Some(Path::new("venv/bin/python"))).expect("relative path");
        assert_eq!(got, Some(cwd.join("venv/bin/python")));
        let got = daemon_python(Some(Path::new("/opt/py/bin/python3"))).expect("absolute path");
        assert_eq!(got, Some(PathBuf::from("/opt/py/bin/python3")));
    }

    #[test]
    fn home_and_its_ancestors_are_never_a_kernel_workdir() {
        assert!(!workdir_allowed(Path::new("/")));
        if let Some(home) = std::env::var_os("HOME")
            .map(std::path::PathBuf::from)
            .filter(|h| h.is_absolute())
        {
            assert!(!workdir_allowed(&home));
            assert!(workdir_allowed(&home.join("project")));
        }
        assert!(workdir_allowed(Path::new("/srv/data/project")));
    }
}
