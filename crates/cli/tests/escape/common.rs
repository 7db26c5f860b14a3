//! Shared set-up of the escape suite: an isolated state, runtime and config
//! directory per test, the `cellhost` binary, and helpers that run a cell
//! and return its JSON result.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// The kernels' interpreter.
pub fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The binary under test: `CELLHOST_TEST_BIN` when set (the non-root run
/// copies the binaries where its user can reach them), else the one cargo
/// built.
pub fn bin() -> String {
    std::env::var("CELLHOST_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_cellhost").to_string())
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// One test's private directories; stops its daemon on drop.
pub struct Env {
    pub dir: TempDir,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::Builder::new()
            .prefix("cellhost-escape-")
            .tempdir()
            .expect("tmp");
        std::fs::create_dir_all(dir.path().join("run")).expect("run dir");
        std::fs::write(dir.path().join("config.toml"), "").expect("config");
        Env { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `$XDG_RUNTIME_DIR/cellhost`, where the daemon's socket lives.
    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run/cellhost")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// A `cellhost` command with this test's directories.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args)
            .env("CELLHOST_STATE_DIR", self.state_dir())
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("CELLHOST_DAEMON_IDLE_S", "600")
            .env("CELLHOST_CONFIG", self.dir.path().join("config.toml"))
            .env_remove("CELLHOST_LOG")
            .stdin(Stdio::null())
            .current_dir(self.dir.path());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run cellhost")
    }

    /// `cellhost exec --json` with `extra` flags; the exit code and result.
    pub fn exec_json(&self, extra: &[&str], code: &str) -> (i32, Value) {
        let py = python();
        let mut args = vec!["exec", "--python", py.as_str(), "--json"];
        args.extend_from_slice(extra);
        args.push(code);
        let o = self.run(&args);
        let v: Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)));
        (o.status.code().unwrap_or(-1), v)
    }

    pub fn daemon_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.run_dir().join("daemon.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let pid = self.daemon_pid();
        if pid.is_some() {
            let _ = self.run(&["daemon", "stop"]);
        }
        if let Some(pid) = pid
            && !wait_gone(pid, Duration::from_secs(10))
        {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid).expect("pid"),
                rustix::process::Signal::KILL,
            );
        }
    }
}

pub fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z")
}

pub fn wait_gone(pid: i32, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    !alive(pid)
}

/// Exit status, stdout and stderr of a finished command, for messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
