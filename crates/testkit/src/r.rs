//! The R interpreter of the R tests, or why they are skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// R for the tests: `CELLHOST_TEST_R`, else what `default` finds (the
/// crate's own resolver: `R` on PATH), with the `jsonlite` package the R
/// worker needs. `None`, the reason printed, when there is no R or it
/// lacks jsonlite.
pub fn r_interpreter<E: std::fmt::Display>(default: impl FnOnce() -> Result<PathBuf, E>) -> Option<PathBuf> {
    let path = match std::env::var_os("CELLHOST_TEST_R") {
        Some(p) => PathBuf::from(p),
        None => match default() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("skipped: no R to test with: {e}");
                return None;
            }
        },
    };
    if !has_package(&path, "jsonlite") {
        eprintln!(
            "skipped: R package jsonlite is not installed for {}",
            path.display()
        );
        return None;
    }
    Some(path)
}

/// [`r_interpreter`], also with the C compiler `R CMD SHLIB` builds an R
/// template's native part with. `None`, the reason printed, without one.
pub fn r_with_compiler<E: std::fmt::Display>(
    default: impl FnOnce() -> Result<PathBuf, E>,
) -> Option<PathBuf> {
    let path = r_interpreter(default)?;
    let cc = Command::new(&path)
        .args(["CMD", "config", "CC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let compiler = cc.split_whitespace().next().unwrap_or("");
    if compiler.is_empty()
        || !Command::new(compiler)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    {
        eprintln!("skipped: no C compiler for R CMD SHLIB ({cc:?})");
        return None;
    }
    Some(path)
}

/// Whether the R package `name` is installed for the interpreter `r`.
pub fn has_package(r: &Path, name: &str) -> bool {
    Command::new(r)
        .args([
            "--no-echo",
            "-e",
            &format!("quit(status = !requireNamespace('{name}', quietly = TRUE))"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
