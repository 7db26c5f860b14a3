//! The matplotlib font cache of one-shot commands: the first `cellhost
//! exec` of an interpreter finishes the host's build before it exits and
//! leaves no build process behind; the next one plots without a font scan
//! of its own and without matplotlib's cache warnings in its output.
//!
//! Drives the real binary with `CELLHOST_TEST_PYTHON` (else `python3`) and
//! a fresh `CELLHOST_CACHE_DIR` and `CELLHOST_STATE_DIR`; skipped (with a
//! message) when the interpreter has no matplotlib.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn python() -> PathBuf {
    std::env::var_os("CELLHOST_TEST_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

fn has_matplotlib() -> bool {
    Command::new(python())
        .args(["-c", "import matplotlib"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn exec(cache: &Path, state: &Path, code: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .arg("exec")
        .arg("--python")
        .arg(python())
        .arg(code)
        .env("CELLHOST_CACHE_DIR", cache)
        .env("CELLHOST_STATE_DIR", state)
        .current_dir(state)
        .output()
        .expect("cellhost exec runs")
}

/// Pids of live processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline"))
            && String::from_utf8_lossy(&cmd).contains(needle)
        {
            out.push(name);
        }
    }
    out
}

fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn one_shot_exec_finishes_the_font_cache_and_leaves_no_build_behind() {
    if !has_matplotlib() {
        eprintln!("skipped: matplotlib is not installed in {}", python().display());
        return;
    }
    let cache = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let out = exec(cache.path(), state.path(), "print('first')");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "first\n");
    // Nothing started for this cache directory outlives the command.
    let left = processes_mentioning(&cache.path().to_string_lossy());
    assert!(left.is_empty(), "processes left behind: {left:?}");
    let mpl: Vec<PathBuf> = std::fs::read_dir(cache.path())
        .expect("cache dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("mpl-"))
        })
        .collect();
    assert_eq!(mpl.len(), 1, "{:?}", files_in(cache.path()));
    let names = files_in(&mpl[0]);
    assert!(names.iter().any(|n| n.starts_with(".done-")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("fontlist")), "{names:?}");
    // The next one-shot command plots with that cache: no warnings about
    // cache directories, no font cache of its own.
    let out = exec(
        cache.path(),
        state.path(),
        "import matplotlib, matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint('plotted')",
    );
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("plotted"), "{stdout}");
    for noise in [
        "Could not save font_manager cache",
        "Matplotlib created a temporary",
        "building the font cache",
    ] {
        assert!(
            !stdout.contains(noise) && !stderr.contains(noise),
            "{noise}: {stdout}\n{stderr}"
        );
    }
}
