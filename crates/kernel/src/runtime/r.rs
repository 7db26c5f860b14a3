//! The R runtime: GNU R (`R`, 4.x) running the embedded worker script
//! `r/cellhost_worker.R`.
//!
//! * Start: `sh -c 'exec "$0" --no-echo --no-restore --no-save -f "$1"
//!   0<&3 3<&-' R <boot dir>/cellhost_worker.R`. R can open a descriptor
//!   only as `file("stdin")` (a `dup` of fd 0), so the control socket is
//!   handed over as fd 0; the worker opens both ends of the channel from it,
//!   closes fd 0 and opens `/dev/null` in its place before any cell runs.
//!   `sh` `exec`s R, so the worker's pid is R's (the interrupt's target).
//! * The worker needs the `jsonlite` package (Debian: `r-cran-jsonlite`).
//! * Console semantics: each top-level expression in order, visible values
//!   printed as the console prints them, the last one the cell's `result`
//!   (`text/plain`, plus `text/html` for data frames); warnings after the
//!   cell as the console's "Warning message:"; `q()`/`quit()` end the cell;
//!   `readline()`/`menu()` fail at once. Plots go to a PNG device per
//!   `options(device=)`, one file per page, sent as `image/png` displays at
//!   the cell's end.
//! * Interrupt: R's own SIGINT handler (it sets R's pending interrupt,
//!   checked between R operations and in `Sys.sleep`). R code cannot replace
//!   it; native code of a package can (`signal(SIGINT, SIG_IGN)`, a handler
//!   of its own, a blocked SIGINT), so the worker records R's handler at its
//!   start and puts it back (and unblocks SIGINT) before every cell and on
//!   every `interrupt` frame, through the native part (`r/cellhost_fork.c`,
//!   `ch_sigint_save`/`ch_sigint_rearm`). A cell that replaces the handler
//!   and then computes is ended by the escalation (the handler is back for
//!   the next cell); the response's `sigint_handler` says what
//!   `/proc/self/status` shows at the cell's end. The worker reads control
//!   frames only between cells (R
//!   has no second thread, [`WorkerRuntime::reads_control_during_cells`] is
//!   false): an interrupt that reached the host before the cell's `started`
//!   is delivered by the wake-up the driver sends on `started`, and a stuck
//!   cell is ended by the driver's escalation.
//! * Sandbox: `R_HOME` (from `R RHOME`) and R's library directories
//!   read-only, besides the interpreter's prefix.
//! * Native part: `r/cellhost_fork.c` (descriptor passing, `fork`,
//!   `dup2`, `posix_spawn`, the confinement steps, the SIGINT re-arm),
//!   found or built with `R CMD SHLIB` (a C compiler) into the boot
//!   directory by `r/cellhost_native.R`: by the template on its first
//!   start, by an unsandboxed worker whose boot directory is writable, and
//!   for sandboxed workers by the host in the background
//!   ([`WorkerRuntime::sandbox_assets`]). Without a compiler templates fail
//!   to start (kernels start cold) and workers run without the re-arm.
//! * Templates: `r/cellhost_template.R` attaches the configured packages
//!   (`library()`) and forks a kernel per request over the Python
//!   template's wire protocol, so the host side ([`crate::template`]) is
//!   shared. The forked worker (C) gets the control socket, stdout and
//!   stderr on fds 0, 1, 2 and every other descriptor closed, the kernel's
//!   environment (plus the `R_*` variables R's front end sets), its cwd, a
//!   session temporary directory of its own (`tempdir()`; the template's
//!   would be removed by the first kernel to quit) and no `.Random.seed`
//!   (R seeds afresh from the time and the new pid), then evaluates the
//!   worker script as a cold worker does. Sandboxed kernels are forked too
//!   ([`WorkerRuntime::templates_sandboxed`] is true): the forked processes
//!   apply the steps of `cellhost_sandbox::forkplan` in the plan's order,
//!   as the Python template does — rlimits and namespaces (a user
//!   namespace of the kernel's own first when the host is not root) in
//!   the kernel init, the mounts in the ns-init, then in the worker its
//!   cgroups and cgroup namespace, bounding set, uid, Landlock,
//!   capabilities and seccomp — and the worker reports the layers in a
//!   `sandbox` frame (mode `enforce` ends a fork with a layer missing).
//! * Hints: a missing package (install it for that R), a file that is not
//!   there (relative to the kernel's cwd), a tool error.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use cellhost_sandbox::profile::interpreter_dirs;

use super::WorkerRuntime;
use crate::error::KernelError;
use crate::result::{CellError, CellResult};

/// The worker script.
const WORKER: &str = include_str!("../../../../r/cellhost_worker.R");

/// The file name of the worker script in its boot directory.
const WORKER_FILE: &str = "cellhost_worker.R";

/// The template script.
const TEMPLATE: &str = include_str!("../../../../r/cellhost_template.R");

/// The native part of the template and the worker (built with `R CMD SHLIB`).
const FORK_C: &str = include_str!("../../../../r/cellhost_fork.c");

/// The file name of the script that finds or builds the native part.
const NATIVE_FILE: &str = "cellhost_native.R";

/// The script that finds or builds the native part.
const NATIVE: &str = include_str!("../../../../r/cellhost_native.R");

/// The boot files: name and content.
const FILES: &[(&str, &str)] = &[
    (WORKER_FILE, WORKER),
    ("cellhost_template.R", TEMPLATE),
    ("cellhost_fork.c", FORK_C),
    (NATIVE_FILE, NATIVE),
];

/// The shell line that starts a template like the worker; `$2` is the boot
/// directory.
const TEMPLATE_BOOT: &str = "exec \"$0\" --no-echo --no-restore --no-save -f \"$1\" --args \"$2\" 0<&3 3<&-";

/// The shell line that hands the control socket to R as fd 0 (see the
/// module docs); `$0` is R, `$1` the worker script.
const BOOT: &str = "exec \"$0\" --no-echo --no-restore --no-save -f \"$1\" 0<&3 3<&-";

/// GNU R with the embedded worker script.
#[derive(Debug, Clone, Copy, Default)]
pub struct RRuntime;

impl WorkerRuntime for RRuntime {
    fn name(&self) -> &'static str {
        "r"
    }

    fn boot_dir(&self) -> io::Result<&'static Path> {
        worker_dir()
    }

    fn reads_control_during_cells(&self) -> bool {
        false
    }

    fn worker_argv(&self, interpreter: &Path, boot_dir: &Path) -> Vec<String> {
        vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            BOOT.to_string(),
            interpreter.display().to_string(),
            boot_dir.join(WORKER_FILE).display().to_string(),
        ]
    }

    fn template_argv(&self, interpreter: &Path, boot_dir: &Path) -> Option<Vec<String>> {
        Some(vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            TEMPLATE_BOOT.to_string(),
            interpreter.display().to_string(),
            boot_dir.join("cellhost_template.R").display().to_string(),
            boot_dir.display().to_string(),
        ])
    }

    fn templates_sandboxed(&self) -> bool {
        true
    }

    fn sandbox_assets(&self, interpreter: &Path, boot_dir: &Path) -> Option<PathBuf> {
        // A sandboxed worker cannot write its boot directory: the native
        // part it loads (R's SIGINT handler re-armed) is built here, in
        // the background, once per interpreter and process. It lives in
        // the boot directory, which the sandbox already reads.
        build_native_in_background(interpreter, boot_dir);
        None
    }

    fn readonly_paths(&self, interpreter: &Path) -> Vec<PathBuf> {
        let mut ro = interpreter_dirs(interpreter);
        ro.push(interpreter.to_path_buf());
        ro.push(PathBuf::from("/bin/sh"));
        if let Some(home) = r_home(interpreter) {
            ro.push(home);
        }
        for dir in ["/usr/lib/R", "/usr/local/lib/R", "/usr/share/R", "/etc/R"] {
            ro.push(PathBuf::from(dir));
        }
        for var in ["R_LIBS", "R_LIBS_USER", "R_LIBS_SITE"] {
            if let Some(v) = std::env::var_os(var) {
                ro.extend(std::env::split_paths(&v).filter(|p| p.is_absolute()));
            }
        }
        if let Some(home) = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
        {
            ro.push(home.join("R"));
        }
        ro.retain(|p| p.exists());
        ro.sort();
        ro.dedup();
        ro
    }

    fn resolve_interpreter(&self, explicit: Option<&Path>) -> Result<PathBuf, KernelError> {
        resolve_r(explicit)
    }

    fn error_hint(&self, error: &CellError, result: &CellResult, interpreter: &Path) -> Option<String> {
        error_hint(error, result, interpreter)
    }
}

/// The directory holding the worker script, written once per content hash
/// to the cellhost cache on first use.
///
/// # Errors
/// The cache directory cannot be created or written.
fn worker_dir() -> io::Result<&'static Path> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    static WRITING: Mutex<()> = Mutex::new(());
    if let Some(d) = DIR.get() {
        return Ok(d);
    }
    let _guard = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = DIR.get() {
        return Ok(d);
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (_, text) in FILES {
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    let dir = super::python::files::cache_root().join(format!("r-worker-{h:016x}"));
    fs::create_dir_all(&dir)?;
    for (name, text) in FILES {
        if !dir.join(name).is_file() {
            // Written under a temporary name and renamed: a concurrent start
            // in another process never sees half a file.
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            fs::write(&tmp, text)?;
            fs::rename(&tmp, dir.join(name))?;
        }
    }
    Ok(DIR.get_or_init(|| dir))
}

/// Starts `R -f cellhost_native.R --args <boot dir>` (which builds the
/// native part unless it is there) in a thread of its own, once per
/// interpreter and process; its outcome is only logged.
fn build_native_in_background(interpreter: &Path, boot_dir: &Path) {
    static STARTED: Mutex<Option<std::collections::HashSet<PathBuf>>> = Mutex::new(None);
    {
        let mut guard = STARTED.lock().unwrap_or_else(|p| p.into_inner());
        if !guard
            .get_or_insert_with(Default::default)
            .insert(interpreter.to_path_buf())
        {
            return;
        }
    }
    let (r, boot) = (interpreter.to_path_buf(), boot_dir.to_path_buf());
    std::thread::spawn(move || {
        let out = Command::new(&r)
            .args(["--no-echo", "--no-restore", "--no-save", "-f"])
            .arg(boot.join(NATIVE_FILE))
            .arg("--args")
            .arg(&boot)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => tracing::warn!(
                "cannot build cellhost's native part for {}: {}",
                r.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => tracing::warn!("cannot run {} to build cellhost's native part: {e}", r.display()),
        }
    });
}

/// `R_HOME` of `interpreter` as `R RHOME` prints it (no R session is
/// started), once per interpreter and process; `None` when it cannot run.
fn r_home(interpreter: &Path) -> Option<PathBuf> {
    static CACHE: Mutex<Option<HashMap<PathBuf, Option<PathBuf>>>> = Mutex::new(None);
    let mut guard = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(found) = map.get(interpreter) {
        return found.clone();
    }
    let found = Command::new(interpreter)
        .arg("RHOME")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.is_absolute());
    map.insert(interpreter.to_path_buf(), found.clone());
    found
}

/// Resolves the R to run: an explicit path is made absolute (a bare name
/// that is not a file in the current directory is looked up on `PATH`);
/// `None` finds `R` on `PATH`.
///
/// # Errors
/// [`KernelError::Spawn`] when no R can be found.
pub fn resolve_r(explicit: Option<&Path>) -> Result<PathBuf, KernelError> {
    let spawn_error = |name: &str, reason: String| KernelError::Spawn {
        python: name.to_string(),
        reason,
    };
    match explicit {
        Some(p) if p.components().count() == 1 && !p.exists() => {
            let name = p.display().to_string();
            find_on_path(&name).ok_or_else(|| spawn_error(&name, format!("{name} is not on PATH")))
        }
        Some(p) => std::path::absolute(p).map_err(|e| spawn_error(&p.display().to_string(), e.to_string())),
        None => find_on_path("R").ok_or_else(|| {
            spawn_error(
                "R",
                "R is not on PATH; install R (Debian: apt-get install r-base-core r-cran-jsonlite) or pass --r PATH"
                    .into(),
            )
        }),
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Hints for R's errors.
fn error_hint(e: &CellError, r: &CellResult, interpreter: &Path) -> Option<String> {
    let msg = e.evalue.as_str();
    if let Some(rest) = msg.strip_prefix("there is no package called ") {
        let package = rest.trim_matches(|c| matches!(c, '‘' | '’' | '\'' | '"'));
        return Some(format!(
            "'{package}' is not installed for the kernel's R {}; install it there (e.g. `install.packages(\"{package}\")` or the distribution's r-cran-{} package) or use another --r.",
            interpreter.display(),
            package.to_lowercase()
        ));
    }
    if msg.contains("No such file or directory") || msg.contains("cannot open file") {
        let cwd = r.cwd.as_deref().unwrap_or("(deleted)");
        return Some(format!(
            "Relative paths resolve against the kernel's current directory {cwd}; check the path or use an absolute one."
        ));
    }
    if e.ename == "cellhost_tool_error" && msg.contains("not enabled") {
        return Some(
            "That tool is not enabled for this session; list tools with `ls(cellhost::tools)`.".into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_hands_the_socket_over_as_fd_0() {
        let argv = RRuntime.worker_argv(Path::new("/usr/bin/R"), Path::new("/cache/r"));
        assert_eq!(argv[0], "/bin/sh");
        assert!(argv[2].contains("0<&3 3<&-"), "{argv:?}");
        assert_eq!(argv[3], "/usr/bin/R");
        assert_eq!(argv[4], "/cache/r/cellhost_worker.R");
    }

    #[test]
    fn template_argv_names_the_template_script_and_its_boot_dir() {
        let argv = RRuntime
            .template_argv(Path::new("/usr/bin/R"), Path::new("/cache/r"))
            .expect("R has templates");
        assert_eq!(argv[0], "/bin/sh");
        assert!(argv[2].contains("--args \"$2\" 0<&3 3<&-"), "{argv:?}");
        assert_eq!(argv[3], "/usr/bin/R");
        assert_eq!(argv[4], "/cache/r/cellhost_template.R");
        assert_eq!(argv[5], "/cache/r");
        assert!(RRuntime.templates_sandboxed());
    }

    #[test]
    fn boot_files_are_written() {
        let dir = worker_dir().expect("cache");
        for (name, text) in FILES {
            assert_eq!(fs::read_to_string(dir.join(name)).expect("file"), *text, "{name}");
        }
    }

    #[test]
    fn worker_script_is_written_once() {
        let dir = worker_dir().expect("cache");
        let text = fs::read_to_string(dir.join(WORKER_FILE)).expect("script");
        assert_eq!(text, WORKER);
    }
}
