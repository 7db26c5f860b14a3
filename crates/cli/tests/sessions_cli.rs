//! The sessions commands of the `cellhost` binary: `run` journaling under a
//! session, `history`, `restore`, `config` with `--config` and `CELLHOST_*`.
//!
//! Each test has its own `CELLHOST_STATE_DIR` and working directory and an
//! explicit `--python` (`CELLHOST_TEST_PYTHON`, else `python3`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CELLHOST_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let out = Command::new("python3")
        .args(["-c", "import sys;print(sys.executable)"])
        .output()
        .expect("python3");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn cellhost(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(args)
        .current_dir(dir)
        .env("CELLHOST_STATE_DIR", dir.join("state"))
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .env_remove("CELLHOST_CONFIG")
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .output()
        .expect("cellhost")
}

fn text(o: &Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Stops the test's daemon (`restore` starts one) when the test ends,
/// passed or failed.
struct StopDaemon<'a>(&'a Path);

impl Drop for StopDaemon<'_> {
    fn drop(&mut self) {
        let _ = cellhost(self.0, &["daemon", "stop"]);
    }
}

#[test]
fn run_journals_history_shows_and_restore_replays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let _stop = StopDaemon(d);
    std::fs::write(
        d.join("nb.py"),
        "# %%\nx = 41\nprint('hello')\n# %%\nopen('data.txt', 'w').write('x')\n# %%\ny = x + 1\ny\n",
    )
    .expect("write");
    let py = python().display().to_string();
    let o = cellhost(d, &["run", "nb.py", "--python", &py]);
    assert!(o.status.success(), "{}", text(&o));
    let o = cellhost(d, &["run", "nb.py", "--python", &py, "--session", "named"]);
    assert!(o.status.success(), "{}", text(&o));

    let o = cellhost(d, &["history", "nb", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let cells = v["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 3, "{v}");
    assert!(
        cells
            .iter()
            .all(|c| c["status"] == "ok" && c["origin"] == "cli:run")
    );
    assert_eq!(cells[0]["stdout_head"], "hello\n");
    // (The kernel's working directory is the sandbox's workdir.)
    let written = cells[1]["files_written"][0].as_str().unwrap_or_default();
    assert!(written.ends_with("/data.txt"), "{v}");
    assert!(
        cells[0]["context"]["input"]
            .as_str()
            .is_some_and(|s| s.ends_with("nb.py"))
    );
    assert_eq!(v["kernels"][0]["end_reason"], "host shutdown");

    let o = cellhost(d, &["history", "named"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("3 cells"),
        "{}",
        text(&o)
    );
    let o = cellhost(d, &["history", "nope"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    let o = cellhost(d, &["restore", "nb", "--python", &py, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let rep: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(rep["replayed"].as_array().map(Vec::len), Some(3), "{rep}");
    assert_eq!(rep["generation"], 2);
    let o = cellhost(d, &["history", "nb", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["cells"].as_array().map(Vec::len), Some(6));
    assert_eq!(v["kernels"].as_array().map(Vec::len), Some(2));
    // The rebuilt kernel is the daemon's: the session goes on there.
    let o = cellhost(d, &["exec", "--python", &py, "--session", "nb", "--json", "y"]);
    assert!(o.status.success(), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(r["result"]["text/plain"], "42", "{r}");
    assert_eq!(r["kernel"]["generation"], 2, "{r}");
}

#[test]
fn config_reports_values_and_their_sources() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(
        d.join("c.toml"),
        "pool_size = 3\ncell_timeout_s = 12\n[tools.lookup]\ncommand = [\"cat\"]\ntimeout_s = 4\ndescription = \"echo\"\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(["config", "--config", "c.toml", "--json"])
        .current_dir(d)
        .env("CELLHOST_MAX_LIVE_KERNELS", "5")
        .output()
        .expect("cellhost");
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["values"]["pool_size"]["value"], 3);
    assert_eq!(v["values"]["pool_size"]["source"]["kind"], "file");
    assert_eq!(v["values"]["max_live_kernels"]["value"], 5);
    assert_eq!(
        v["values"]["max_live_kernels"]["source"]["from"],
        "CELLHOST_MAX_LIVE_KERNELS"
    );
    assert_eq!(v["values"]["tool_budget"]["source"]["kind"], "default");
    assert_eq!(v["tools"]["lookup"]["timeout_s"], 4.0);
    // CELLHOST_CONFIG works too, and a typo is a usage error that names it.
    std::fs::write(d.join("bad.toml"), "pool_sise = 1\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(["config"])
        .current_dir(d)
        .env("CELLHOST_CONFIG", d.join("bad.toml"))
        .output()
        .expect("cellhost");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pool_sise"));
}
