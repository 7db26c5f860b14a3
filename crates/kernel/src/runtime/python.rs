//! The Python runtime: CPython (any venv or conda env) running the
//! embedded `cellhost_worker` package.
//!
//! * Start: `python -c <boot> <boot dir>`; the boot line puts the package
//!   on `sys.path` and runs it without binding any name in `__main__`.
//! * Boot files: the package, embedded with `include_str!` ([`files`]) and
//!   written once per content hash to the cellhost cache.
//! * Sandbox: the interpreter's prefixes read-only; the package compiled to
//!   bytecode and matplotlib's font cache built once per interpreter
//!   (`MPLCONFIGDIR`, read-only); `MPLBACKEND` names the worker's backend,
//!   which sends figures as `display` frames.
//! * Templates apply: a template imports the worker and the modules to
//!   preload (numpy, pandas, matplotlib) and then only forks. The random
//!   state of `random` (CPython reseeds it at fork) and of numpy's global
//!   generator (reseeded by the worker) differs per kernel; the string hash
//!   seed (`PYTHONHASHSEED`) is the template's, shared by its kernels;
//!   OpenBLAS parks its threads in its own `pthread_atfork` handler, and
//!   the template refuses to fork while it has more than one Python thread.
//! * Environment: the interpreter's directory comes first on `PATH` and a
//!   venv's root is `VIRTUAL_ENV` (activation semantics), so `!pip`,
//!   `subprocess.run(["pip", ...])` and the venv's console scripts are the
//!   kernel's own.
//! * Hints: `ModuleNotFoundError` (install into that interpreter),
//!   `FileNotFoundError` (relative to the kernel's cwd), `ToolError`.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use cellhost_sandbox::profile::interpreter_dirs;

use super::WorkerRuntime;
use crate::error::KernelError;
use crate::result::{CellError, CellResult};

pub mod files;
mod hints;

/// The oldest interpreter the worker supports (`PyCF_ALLOW_TOP_LEVEL_AWAIT`,
/// `threading.get_native_id` and the `ast` shapes it compiles are 3.8's).
pub const MIN_PYTHON: (u32, u32) = (3, 8);

/// The first statement of every boot line: an interpreter older than
/// [`MIN_PYTHON`] writes [`UNSUPPORTED_MARK`] and its version on stderr and
/// exits 87 before any of the worker's code is imported. Valid Python 2.
const VERSION_GATE: &str = "__import__('sys').version_info[:2]<(3,8) and (__import__('sys').stderr.write('cellhost-unsupported-python %d.%d.%d\\n' % tuple(__import__('sys').version_info[:3])), __import__('sys').exit(87));";

/// The line [`VERSION_GATE`] writes, before the version.
const UNSUPPORTED_MARK: &str = "cellhost-unsupported-python ";

/// The boot line given to `python -c`: checks the version, puts the worker
/// package on `sys.path` and runs it without binding any name in
/// `__main__`.
const BOOT: &str = "__import__('sys').path.append(__import__('sys').argv.pop(1));__import__('cellhost_worker.main').main.run()";

/// The boot line of a template.
const TEMPLATE_BOOT: &str = "__import__('sys').path.append(__import__('sys').argv.pop(1));__import__('cellhost_worker.template').template.run()";

/// CPython with the embedded worker package.
#[derive(Debug, Clone, Copy, Default)]
pub struct PythonRuntime;

impl WorkerRuntime for PythonRuntime {
    fn name(&self) -> &'static str {
        "python"
    }

    fn resolve_interpreter(&self, explicit: Option<&Path>) -> Result<PathBuf, KernelError> {
        resolve_python(explicit)
    }

    fn boot_dir(&self) -> io::Result<&'static Path> {
        files::worker_path()
    }

    fn worker_argv(&self, interpreter: &Path, boot_dir: &Path) -> Vec<String> {
        argv(interpreter, BOOT, boot_dir)
    }

    fn template_argv(&self, interpreter: &Path, boot_dir: &Path) -> Option<Vec<String>> {
        Some(argv(interpreter, TEMPLATE_BOOT, boot_dir))
    }

    fn worker_env(&self) -> Vec<(OsString, OsString)> {
        vec![("MPLBACKEND".into(), "module://cellhost_worker.mpl_backend".into())]
    }

    fn path_env(&self, interpreter: &Path) -> (Vec<PathBuf>, Option<PathBuf>) {
        // The directory of the interpreter as named (not its symlink
        // target): a venv's `bin`, a conda env's `bin`.
        let Some(bin) = interpreter.parent().filter(|b| !b.as_os_str().is_empty()) else {
            return (Vec::new(), None);
        };
        let venv = bin
            .parent()
            .filter(|root| root.join("pyvenv.cfg").is_file())
            .map(Path::to_path_buf);
        (vec![bin.to_path_buf()], venv)
    }

    fn template_env(&self, assets: &Path) -> Vec<(OsString, OsString)> {
        vec![("MPLCONFIGDIR".into(), assets.as_os_str().to_owned())]
    }

    fn readonly_paths(&self, interpreter: &Path) -> Vec<PathBuf> {
        let mut ro = interpreter_dirs(interpreter);
        ro.push(interpreter.to_path_buf());
        ro
    }

    fn sandbox_assets(&self, interpreter: &Path, boot_dir: &Path) -> Option<PathBuf> {
        files::sandbox_assets(interpreter, boot_dir)
    }

    fn start_failure(&self, interpreter: &Path, stderr: &str) -> Option<KernelError> {
        unsupported_version(stderr).map(|found| KernelError::UnsupportedInterpreter {
            python: interpreter.display().to_string(),
            found,
            needs: format!("{}.{}", MIN_PYTHON.0, MIN_PYTHON.1),
        })
    }

    fn error_hint(&self, error: &CellError, result: &CellResult, interpreter: &Path) -> Option<String> {
        hints::error_hint(error, result, interpreter)
    }
}

/// The version [`VERSION_GATE`] reported in `stderr`, if it did (a line
/// that is exactly the mark and a dotted version).
fn unsupported_version(stderr: &str) -> Option<String> {
    stderr.lines().find_map(|line| {
        let v = line.trim_end().strip_prefix(UNSUPPORTED_MARK)?;
        let ok = !v.is_empty() && v.len() <= 32 && v.chars().all(|c| c.is_ascii_digit() || c == '.');
        ok.then(|| v.to_string())
    })
}

fn argv(interpreter: &Path, boot: &str, boot_dir: &Path) -> Vec<String> {
    vec![
        interpreter.display().to_string(),
        "-c".to_string(),
        format!("{VERSION_GATE}{boot}"),
        boot_dir.display().to_string(),
    ]
}

/// Resolves the interpreter to run: an explicit path is made absolute (a
/// bare name that is not a file in the current directory is looked up on
/// `PATH`);
/// `None` finds `python3` on `PATH` and asks it for `sys.executable`, so a
/// pyenv shim (a shell script costing ~100 ms per start) is never used.
/// The answer for `None` is computed once per process.
///
/// # Errors
/// [`KernelError::Spawn`] when no interpreter can be found or run.
pub fn resolve_python(explicit: Option<&Path>) -> Result<PathBuf, KernelError> {
    if let Some(p) = explicit {
        // A bare name (`python3.12`) is looked up on PATH, like a shell would.
        if p.components().count() == 1
            && !p.exists()
            && let Some(found) = p.to_str().and_then(find_on_path)
        {
            return real_executable(&found);
        }
        return std::path::absolute(p).map_err(|e| KernelError::Spawn {
            python: p.display().to_string(),
            reason: e.to_string(),
        });
    }
    static CACHE: OnceLock<Mutex<Option<PathBuf>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(None));
    if let Ok(guard) = cache.lock()
        && let Some(p) = guard.as_ref()
    {
        return Ok(p.clone());
    }
    let found = find_on_path("python3").ok_or_else(|| KernelError::Spawn {
        python: "python3".into(),
        reason: "python3 is not on PATH; pass --python PATH".into(),
    })?;
    let path = real_executable(&found)?;
    if let Ok(mut guard) = cache.lock() {
        *guard = Some(path.clone());
    }
    Ok(path)
}

/// Asks an interpreter found on PATH for `sys.executable`, so a wrapper
/// such as a pyenv shim (a shell script costing ~100 ms a start) is
/// replaced by the real binary.
fn real_executable(found: &Path) -> Result<PathBuf, KernelError> {
    let out = Command::new(found)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .map_err(|e| KernelError::Spawn {
            python: found.display().to_string(),
            reason: e.to_string(),
        })?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || text.is_empty() {
        return Err(KernelError::Spawn {
            python: found.display().to_string(),
            reason: format!(
                "it did not report sys.executable ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    let path = PathBuf::from(text);
    Ok(path)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
