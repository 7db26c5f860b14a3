//! The seam for a language: [`WorkerRuntime`].
//!
//! A runtime says how to start its worker (program and arguments, boot
//! files, environment), what its sandbox must let it read, which assets it
//! prepares once per interpreter, its hints for errors, and whether
//! templates (fork servers) apply. The worker it starts speaks protocol v1
//! on its control socket and renders its own results (MIME bundles), so
//! the host side needs nothing else. [`python::PythonRuntime`] and
//! [`r::RRuntime`] are the implementations; another language is another
//! file here plus a line in [`for_language`].

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::KernelError;
use crate::result::{CellError, CellResult};

pub mod python;
pub mod r;

/// The runtime of a [`KernelConfig`](crate::KernelConfig) that names none:
/// [`python::PythonRuntime`].
pub fn default_runtime() -> Arc<dyn WorkerRuntime> {
    Arc::new(python::PythonRuntime)
}

/// The runtime of the language named `name` (case-insensitive: `python`,
/// `py`, `python3`; `r`), or `None` when no runtime speaks it. Surfaces
/// look a language up here and nowhere else, so a language is added in
/// this module only.
pub fn for_language(name: &str) -> Option<Arc<dyn WorkerRuntime>> {
    match name.trim().to_ascii_lowercase().as_str() {
        "python" | "py" | "python3" | "ipython" => Some(Arc::new(python::PythonRuntime)),
        "r" => Some(Arc::new(r::RRuntime)),
        _ => None,
    }
}

/// The canonical names [`for_language`] knows, for error messages.
pub const LANGUAGES: &[&str] = &["python", "r"];

/// What a language needs from the host.
///
/// Contract: every method is cheap and side-effect free except
/// [`boot_dir`](WorkerRuntime::boot_dir) (writes the boot files once per
/// process) and [`sandbox_assets`](WorkerRuntime::sandbox_assets) (may
/// start a background build once per interpreter, never waiting for it).
/// The worker started from [`worker_argv`](WorkerRuntime::worker_argv)
/// must read its configuration message from its control socket (fd 3)
/// before anything else and answer with `ready` (protocol v1); the host
/// never puts configuration in its arguments or environment.
pub trait WorkerRuntime: Send + Sync + 'static {
    /// Short name of the language, lower case (`python`, `r`), as
    /// notebooks name it in `kernelspec.language` / `language_info.name`:
    /// [`for_language`] of it gives this runtime back; used in session
    /// keys, logs and errors.
    fn name(&self) -> &'static str;

    /// The interpreter to run: `explicit` (a path, or a bare name looked
    /// up on `PATH`) made absolute, or the language's default found on
    /// `PATH` when `None`.
    ///
    /// # Errors
    /// [`KernelError::Spawn`] when no interpreter can be found.
    fn resolve_interpreter(&self, explicit: Option<&Path>) -> Result<PathBuf, KernelError>;

    /// The directory of the worker's boot files, written on first use.
    ///
    /// # Errors
    /// The files cannot be written (cache directory unwritable).
    fn boot_dir(&self) -> io::Result<&'static Path>;

    /// The worker's argv (program first) for interpreter `interpreter`
    /// with its boot files in `boot_dir`.
    fn worker_argv(&self, interpreter: &Path, boot_dir: &Path) -> Vec<String>;

    /// Whether the worker reads control frames while a cell runs (a reader
    /// thread of its own). A worker that does (Python) acts on an
    /// `interrupt` frame that reached it before the cell's `started` (it
    /// cancels the cell or signals its own main thread). One that reads
    /// frames only between cells (R, which has no second thread) would
    /// never see that frame until the cell ended, so the driver sends the
    /// wake-up itself as soon as such a worker says `started`.
    fn reads_control_during_cells(&self) -> bool {
        true
    }

    /// The argv of a template (a fork server that preloads modules), or
    /// `None` when templates do not apply to this language.
    fn template_argv(&self, interpreter: &Path, boot_dir: &Path) -> Option<Vec<String>> {
        let _ = (interpreter, boot_dir);
        None
    }

    /// Whether the runtime's templates fork sandboxed kernels (apply the
    /// confinement steps of `cellhost_sandbox::forkplan`). When false, a
    /// template is started, and kernels forked, only with the sandbox off;
    /// sandboxed kernels start cold.
    fn templates_sandboxed(&self) -> bool {
        true
    }

    /// Variables the runtime adds to the worker's (allowlisted)
    /// environment.
    fn worker_env(&self) -> Vec<(OsString, OsString)> {
        Vec::new()
    }

    /// Directories to put first on the worker's `PATH` for `interpreter`
    /// (a venv's `bin`: activation semantics), and the `VIRTUAL_ENV` it
    /// belongs to, if any.
    fn path_env(&self, interpreter: &Path) -> (Vec<PathBuf>, Option<PathBuf>) {
        let _ = interpreter;
        (Vec::new(), None)
    }

    /// Variables a sandboxed template needs for the assets in `assets`.
    fn template_env(&self, assets: &Path) -> Vec<(OsString, OsString)> {
        let _ = assets;
        Vec::new()
    }

    /// Paths a sandboxed worker must be able to read to run `interpreter`
    /// (the interpreter and its libraries), besides the boot files.
    fn readonly_paths(&self, interpreter: &Path) -> Vec<PathBuf>;

    /// A directory of assets a sandboxed worker cannot build itself
    /// (compiled boot files, caches), mounted read-only; `None` until it
    /// is built (the build runs in the background) or when there is none.
    fn sandbox_assets(&self, interpreter: &Path, boot_dir: &Path) -> Option<PathBuf> {
        let _ = (interpreter, boot_dir);
        None
    }

    /// The typed error for a worker that exited before `ready` having
    /// written `stderr` (the first bytes of its standard error), when the
    /// runtime recognises the cause (an interpreter too old for the
    /// worker); `None` leaves the generic start failure.
    fn start_failure(&self, interpreter: &Path, stderr: &str) -> Option<KernelError> {
        let _ = (interpreter, stderr);
        None
    }

    /// A one-line hint for the error `error` of `result` (a missing
    /// module, a relative path, …), if one applies.
    fn error_hint(&self, error: &CellError, result: &CellResult, interpreter: &Path) -> Option<String> {
        let _ = (error, result, interpreter);
        None
    }
}

impl fmt::Debug for dyn WorkerRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_are_looked_up_by_name() {
        assert_eq!(for_language("Python").map(|r| r.name()), Some("python"));
        assert_eq!(for_language("R").map(|r| r.name()), Some("r"));
        assert_eq!(for_language(" r ").map(|r| r.name()), Some("r"));
        assert!(for_language("julia").is_none());
        for name in LANGUAGES {
            assert_eq!(for_language(name).map(|r| r.name()), Some(*name));
        }
    }
}
