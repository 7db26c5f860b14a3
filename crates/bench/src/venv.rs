//! The bench venv: `--peers` measures ipykernel, jupyter_client and nbclient
//! and runs the penguins notebook, so it needs those packages at the pinned
//! versions of `python/requirements.txt` (embedded here). When the chosen
//! interpreter lacks them, the bench builds a venv from it once, under the
//! cache directory, named after a hash of the pins and the interpreter.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The pinned packages (the project venv's).
const REQUIREMENTS: &str = include_str!("../../../python/requirements.txt");

/// pip version the venv is brought to before installing.
const PIP: &str = "26.3";

/// Modules the peers and the workloads import.
const NEEDED: &str =
    "import ipykernel, jupyter_client, nbclient, nbformat, numpy, pandas, matplotlib, palmerpenguins";

/// `python` can run every peer and workload.
pub fn has_peers(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", NEEDED])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let st = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("{what}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({st})"))
    }
}

/// The bench venv's interpreter, built from `base` if it is not there yet.
///
/// # Errors
/// `base` cannot make a venv, or pip cannot install the pins (no network to
/// PyPI, no wheel for this platform); the message says which step.
pub fn ensure(base: &Path) -> Result<PathBuf, String> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in REQUIREMENTS
        .bytes()
        .chain(base.as_os_str().as_encoded_bytes().iter().copied())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let dir = cellhost_kernel::worker_files::cache_root().join(format!("bench-venv-{h:016x}"));
    let python = dir.join("bin").join("python");
    let ready = dir.join(".ready");
    if ready.is_file() && python.is_file() {
        return Ok(python);
    }
    eprintln!(
        "cellhost-bench: {} lacks the peers; setting up the bench venv {} (pinned packages, once)",
        base.display(),
        dir.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
    run(
        Command::new(base).arg("-m").arg("venv").arg(&dir),
        "creating the bench venv",
    )?;
    let reqs = dir.join("requirements.txt");
    std::fs::write(&reqs, REQUIREMENTS).map_err(|e| format!("writing {}: {e}", reqs.display()))?;
    let pip = |args: &[&str]| {
        let mut c = Command::new(&python);
        c.args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "-q",
        ])
        .args(args)
        .env_remove("PIP_USER")
        .env_remove("PYTHONPATH");
        c
    };
    run(
        &mut pip(&[&format!("pip=={PIP}")]),
        "upgrading pip in the bench venv",
    )?;
    run(
        &mut pip(&["-r", &reqs.display().to_string()]),
        "installing the pinned packages",
    )?;
    if !has_peers(&python) {
        return Err(format!("the bench venv {} still lacks the peers", dir.display()));
    }
    std::fs::write(&ready, "").map_err(|e| format!("writing {}: {e}", ready.display()))?;
    Ok(python)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interpreter_has_no_peers() {
        assert!(!has_peers(Path::new("/nonexistent/bin/python")));
    }

    #[test]
    fn the_pins_name_every_peer() {
        for m in [
            "ipykernel==",
            "jupyter_client==",
            "nbclient==",
            "numpy==",
            "pandas==",
            "matplotlib==",
        ] {
            assert!(REQUIREMENTS.contains(m), "{m} is not pinned");
        }
    }
}
