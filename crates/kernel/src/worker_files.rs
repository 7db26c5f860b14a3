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

fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("CELLHOST_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("cellhost");
    }
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join(".cache").join("cellhost");
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
