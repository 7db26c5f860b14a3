//! The Python worker package, embedded in the binary and written once per
//! content hash to a cache directory the interpreter imports it from.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

include!(concat!(env!("OUT_DIR"), "/worker_files.rs"));

/// FNV-1a over every file name and source: names the cache directory.
fn content_hash() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, src) in WORKER_FILES {
        for b in name.bytes().chain([0u8]).chain(src.bytes()).chain([0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The cache directory: `$CELLHOST_CACHE_DIR`, `$XDG_CACHE_HOME/cellhost`,
/// `~/.cache/cellhost`, else under the temp dir. Empty or relative values
/// are skipped: the cache must never depend on the caller's cwd.
pub fn cache_root() -> PathBuf {
    let absolute = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(dir) = absolute(std::env::var_os("CELLHOST_CACHE_DIR")) {
        return dir;
    }
    if let Some(dir) = absolute(std::env::var_os("XDG_CACHE_HOME")) {
        return dir.join("cellhost");
    }
    if let Some(home) = absolute(std::env::var_os("HOME")) {
        return home.join(".cache").join("cellhost");
    }
    std::env::temp_dir().join("cellhost-cache")
}

fn write_package(dir: &Path) -> io::Result<()> {
    let parent = dir.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(".tmp-{}-{}", std::process::id(), content_hash()));
    let pkg = tmp.join("cellhost_worker");
    fs::create_dir_all(&pkg)?;
    for (name, src) in WORKER_FILES {
        fs::write(pkg.join(name), src)?;
    }
    match fs::rename(&tmp, dir) {
        Ok(()) => Ok(()),
        // Another process won the race: its copy is identical.
        Err(_) if dir.join("cellhost_worker").is_dir() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Directory to put on `sys.path` (it holds `cellhost_worker/`), written on
/// first use.
///
/// # Errors
/// The cache directory cannot be created or written.
pub fn worker_path() -> io::Result<&'static Path> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    static WRITING: Mutex<()> = Mutex::new(());
    if let Some(d) = DIR.get() {
        return Ok(d);
    }
    // One writer per process; other processes are handled by the atomic
    // rename in `write_package`.
    let _guard = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = DIR.get() {
        return Ok(d);
    }
    let dir = cache_root().join(format!("worker-{:016x}", content_hash()));
    if !dir.join("cellhost_worker").join("main.py").is_file() {
        write_package(&dir)?;
    }
    Ok(DIR.get_or_init(|| dir))
}

/// Prepares what a sandboxed worker cannot make itself, once per
/// interpreter: the worker package compiled to bytecode (the sandbox makes
/// the package read-only) and matplotlib's font cache, built in a
/// `mpl-<hash of the interpreter path>` directory of the cellhost cache.
///
/// Returns that directory, to be passed read-only as `MPLCONFIGDIR`, once it
/// is built; until then `None`, and the build runs on a background thread
/// (started at most once per interpreter and process), so no spawn waits
/// for it. The build process writes the `.done-<worker hash>` marker itself
/// and only when the font cache is there (or matplotlib is not installed),
/// so a build cut short is started again, never taken for done. It dies
/// with the thread that started it (`PR_SET_PDEATHSIG`): a command that
/// exits leaves no build behind; one-shot commands wait for it first
/// ([`wait_for_asset_builds`]) so the next one finds the cache.
pub(crate) fn sandbox_assets(python: &Path, worker_dir: &Path) -> Option<PathBuf> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in python.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let dir = cache_root().join(format!("mpl-{h:016x}"));
    let marker = dir.join(format!(".done-{:016x}", content_hash()));
    if marker.is_file() {
        return Some(dir);
    }
    {
        let mut started = builds().lock().unwrap_or_else(|p| p.into_inner());
        if started.dirs.contains(&dir) {
            return None;
        }
        started.dirs.push(dir.clone());
        started.running += 1;
    }
    let (python, worker_dir) = (python.to_path_buf(), worker_dir.to_path_buf());
    let spawned = std::thread::Builder::new()
        .name("cellhost-mpl-cache".into())
        .spawn(move || {
            build_assets(&python, &worker_dir, &dir, &marker);
            build_finished();
        });
    if spawned.is_err() {
        build_finished();
    }
    None
}

/// Asset builds started by this process and how many still run.
struct Builds {
    dirs: Vec<PathBuf>,
    running: usize,
}

fn builds() -> &'static Mutex<Builds> {
    static BUILDS: Mutex<Builds> = Mutex::new(Builds {
        dirs: Vec::new(),
        running: 0,
    });
    &BUILDS
}

fn builds_done() -> &'static std::sync::Condvar {
    static DONE: std::sync::Condvar = std::sync::Condvar::new();
    &DONE
}

fn build_finished() {
    let mut b = builds().lock().unwrap_or_else(|p| p.into_inner());
    b.running = b.running.saturating_sub(1);
    builds_done().notify_all();
}

/// Waits until the asset builds this process started have ended, at most
/// `timeout`; true when none is left running. One-shot commands call it
/// before exiting, so the build started by the first of them completes
/// (once per interpreter) instead of being cut short by every exit.
pub fn wait_for_asset_builds(timeout: std::time::Duration) -> bool {
    let guard = builds().lock().unwrap_or_else(|p| p.into_inner());
    let (guard, _) = builds_done()
        .wait_timeout_while(guard, timeout, |b| b.running > 0)
        .unwrap_or_else(|p| p.into_inner());
    guard.running == 0
}

/// The build: compile the worker package, read (build) matplotlib's font
/// cache, then write the marker when the cache file exists. It first asks
/// the kernel to kill it when the thread that started it ends.
const BUILD_SCRIPT: &str = r#"import sys, os
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)
    if os.getppid() != int(sys.argv[3]):
        sys.exit(0)
except Exception:
    pass
import compileall
compileall.compile_dir(sys.argv[1], quiet=1)
try:
    import matplotlib.font_manager
except ImportError:
    ok = True
except Exception:
    ok = True
else:
    ok = any(n.startswith('fontlist') for n in os.listdir(os.environ['MPLCONFIGDIR']))
if ok:
    open(sys.argv[2], 'wb').close()
"#;

fn build_assets(python: &Path, worker_dir: &Path, dir: &Path, marker: &Path) {
    if fs::create_dir_all(dir).is_err() {
        return;
    }
    let mut cmd = std::process::Command::new(python);
    cmd.args(["-c", BUILD_SCRIPT])
        .arg(worker_dir)
        .arg(marker)
        .arg(std::process::id().to_string())
        .env("MPLCONFIGDIR", dir)
        .env("MPLBACKEND", "agg")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // Also for an interpreter that is a wrapper script: it dies with us.
    cellhost_sandbox::signal::kill_with_spawning_thread(&mut cmd);
    let child = cmd.spawn();
    let Ok(mut child) = child else { return };
    // A font scan takes seconds; an interpreter that hangs is given up on.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeds_the_whole_package() {
        let names: Vec<_> = WORKER_FILES.iter().map(|(n, _)| *n).collect();
        for needed in [
            "main.py",
            "channel.py",
            "streams.py",
            "execute.py",
            "display.py",
            "mpl_backend.py",
        ] {
            assert!(names.contains(&needed), "{needed} missing from {names:?}");
        }
    }
}
