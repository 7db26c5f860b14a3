//! Shared plumbing: session directories, kernel configuration, runtime.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cellhost_kernel::{KernelConfig, KernelError, resolve_python};

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

/// A fresh directory for a one-off session's files (figures, spills).
pub fn new_session_dir(prefix: &str) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    state_dir()
        .join("sessions")
        .join(format!("{prefix}-{stamp}-{}", std::process::id()))
}

/// Parses `--timeout SECONDS` (0 = no deadline).
pub fn parse_timeout(secs: Option<f64>) -> Result<Option<Duration>, String> {
    match secs {
        None => Ok(Some(Duration::from_secs(300))),
        Some(s) if !s.is_finite() || s < 0.0 => {
            Err(format!("--timeout must be a number of seconds >= 0, got {s}"))
        }
        Some(0.0) => Ok(None),
        Some(s) => Ok(Some(Duration::from_secs_f64(s))),
    }
}

/// The kernel configuration for a CLI session.
pub fn kernel_config(args: &KernelArgs, session: &str, dir: &Path) -> Result<KernelConfig, KernelError> {
    let python = resolve_python(args.python.as_deref())?;
    if !python.exists() {
        return Err(KernelError::Spawn {
            python: python.display().to_string(),
            reason: "no such file".into(),
        });
    }
    let mut cfg = KernelConfig::new(python, dir);
    cfg.session = session.to_string();
    Ok(cfg)
}

/// A multi-threaded runtime for one command.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}
