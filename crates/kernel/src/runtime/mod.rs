//! The seam for a language: [`WorkerRuntime`].
//!
//! A runtime says how to start its worker (program and arguments, boot
//! files, environment), what its sandbox must let it read, which assets it
//! prepares once per interpreter, its hints for errors, and whether
//! templates (fork servers) apply. The worker it starts speaks protocol v1
//! on its control socket and renders its own results (MIME bundles), so
//! the host side needs nothing else. [`python::PythonRuntime`] is the first
//! implementation; another language is another file here.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::KernelError;
use crate::result::{CellError, CellResult};

pub mod python;

/// The runtime of a [`KernelConfig`](crate::KernelConfig) that names none:
/// [`python::PythonRuntime`].
pub fn default_runtime() -> Arc<dyn WorkerRuntime> {
    Arc::new(python::PythonRuntime)
}

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
    /// Short name of the language, lower case, as notebooks name it in
    /// `kernelspec.language` / `language_info.name` (`python`): the key of
    /// [`runtime_for_language`], and used in logs and errors.
    fn name(&self) -> &'static str;

    /// The directory of the worker's boot files, written on first use.
    ///
    /// # Errors
    /// The files cannot be written (cache directory unwritable).
    fn boot_dir(&self) -> io::Result<&'static Path>;

    /// The worker's argv (program first) for interpreter `interpreter`
    /// with its boot files in `boot_dir`.
    fn worker_argv(&self, interpreter: &Path, boot_dir: &Path) -> Vec<String>;

    /// The argv of a template (a fork server that preloads modules), or
    /// `None` when templates do not apply to this language.
    fn template_argv(&self, interpreter: &Path, boot_dir: &Path) -> Option<Vec<String>> {
        let _ = (interpreter, boot_dir);
        None
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

/// Every runtime this build has, one per language: the list a notebook's
/// language is looked up in ([`runtime_for_language`]). A new language's
/// runtime is added here.
pub fn known_runtimes() -> Vec<Arc<dyn WorkerRuntime>> {
    vec![Arc::new(python::PythonRuntime)]
}

/// The runtime whose [`WorkerRuntime::name`] is `language` (a notebook's
/// `kernelspec.language` or `language_info.name`; ASCII case and
/// surrounding blanks ignored), or `None` when this build has none.
pub fn runtime_for_language(language: &str) -> Option<Arc<dyn WorkerRuntime>> {
    let language = language.trim();
    known_runtimes()
        .into_iter()
        .find(|r| r.name().eq_ignore_ascii_case(language))
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
    fn languages_are_looked_up_by_runtime_name() {
        assert_eq!(runtime_for_language("python").map(|r| r.name()), Some("python"));
        assert_eq!(runtime_for_language(" Python ").map(|r| r.name()), Some("python"));
        assert!(runtime_for_language("julia").is_none());
        assert!(runtime_for_language("").is_none());
        let names: Vec<&str> = known_runtimes().iter().map(|r| r.name()).collect();
        assert!(names.contains(&"python"));
        // Every known runtime is found under its own name.
        for r in known_runtimes() {
            assert_eq!(runtime_for_language(r.name()).map(|x| x.name()), Some(r.name()));
        }
    }
}
