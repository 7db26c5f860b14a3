//! Surface × request: one-shot `exec`, `exec --session` (the daemon) and
//! `run` go through the same request layer, so each honours the deadline
//! (the configured `cell_timeout_s` and `--timeout`), the sandbox mode, the
//! owner (`cli:<user>`) and the busy rule identically; plus the regression
//! tests of the bugs the old per-surface paths had (a configured timeout
//! ignored by one-shot commands, `restore` dying with the command, CLI and
//! `serve` sessions sharing an owner, a silent wait behind a busy session,
//! a journal failure ending `run` with exit 0).
//!
//! Each test has its own state, runtime and config directories and stops
//! the daemon it started (a Drop guard). The interpreter is
//! `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// One isolated cellhost user: state, runtime and config directories.
struct Env {
    dir: TempDir,
    vars: Vec<(String, String)>,
}

impl Env {
    fn new(config: &str) -> Env {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("run")).expect("run dir");
        std::fs::create_dir_all(dir.path().join("work")).expect("work dir");
        std::fs::write(dir.path().join("config.toml"), config).expect("config");
        Env {
            dir,
            vars: Vec::new(),
        }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        c.args(args)
            .env("CELLHOST_STATE_DIR", self.dir.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("CELLHOST_CONFIG", self.dir.path().join("config.toml"))
            .env("CELLHOST_DAEMON_IDLE_S", "120")
            .env_remove("CELLHOST_CELL_TIMEOUT_S")
            .env_remove("CELLHOST_LOG")
            .current_dir(self.work());
        for (k, v) in &self.vars {
            c.env(k, v);
        }
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run cellhost")
    }

    /// `exec` one-shot (`session: None`) or in a daemon session, `--json`.
    fn exec(&self, session: Option<&str>, extra: &[&str], code: &str) -> (i32, Value) {
        let py = python();
        let mut args = vec!["exec", "--python", &py, "--json"];
        if let Some(s) = session {
            args.extend(["--session", s]);
        }
        args.extend(extra);
        args.push(code);
        let o = self.run(&args);
        // A result on stdout; an error envelope on stderr.
        let v = serde_json::from_slice(&o.stdout)
            .or_else(|_| serde_json::from_slice(&o.stderr))
            .unwrap_or(Value::Null);
        (o.status.code().unwrap_or(-1), v)
    }

    /// `run` of a one-cell notebook: exit code and the cell's outputs.
    fn run_cell(&self, extra: &[&str], code: &str) -> (i32, Value, String) {
        let nb = self.work().join("nb.py");
        std::fs::write(&nb, format!("# %%\n{code}\n")).expect("write nb");
        let py = python();
        let mut args = vec!["run", "nb.py", "--python", &py];
        args.extend(extra);
        let o = self.run(&args);
        let out = std::fs::read_to_string(self.work().join("nb.executed.ipynb")).unwrap_or_default();
        let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        (
            o.status.code().unwrap_or(-1),
            v["cells"][0]["outputs"].clone(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    fn history(&self, session: &str, owner: Option<&str>) -> (i32, Value) {
        let mut args = vec!["history", session, "--json"];
        if let Some(o) = owner {
            args.extend(["--owner", o]);
        }
        let o = self.run(&args);
        let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        (o.status.code().unwrap_or(-1), v)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.run(&["daemon", "stop"]);
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const SLEEP: &str = "import time; time.sleep(60)";

/// Bug: `cell_timeout_s` from the config file was shown by `cellhost
/// config` but ignored by one-shot `exec` and `run` (a missing `--timeout`
/// became 300 s). Every CLI surface now takes the configured default, and
/// `--timeout` (0 = none) over it.
#[test]
fn config_cell_timeout_is_honoured_by_exec_run_and_exec_session() {
    let env = Env::new("cell_timeout_s = 1\n");
    let (code, v) = env.exec(None, &[], SLEEP);
    assert_eq!(code, 124, "one-shot exec: {v}");
    assert_eq!(v["status"], "timeout");
    let (code, v) = env.exec(Some("t"), &[], SLEEP);
    assert_eq!(code, 124, "exec --session: {v}");
    assert_eq!(v["status"], "timeout");
    let (code, outputs, err) = env.run_cell(&[], SLEEP);
    assert_eq!(code, 124, "run: {err}");
    let out = outputs.to_string();
    assert!(
        out.contains("CellTimeout") && out.contains("1 s timeout"),
        "{out}"
    );
    // The flag wins over the configuration, on every surface.
    let cell = "import time; time.sleep(1.5); 'slept'";
    let (code, v) = env.exec(None, &["--timeout", "0"], cell);
    assert_eq!(code, 0, "one-shot exec --timeout 0: {v}");
    let (code, v) = env.exec(Some("t"), &["--timeout", "30"], cell);
    assert_eq!(code, 0, "exec --session --timeout 30: {v}");
    let (code, _, err) = env.run_cell(&["--timeout", "0"], cell);
    assert_eq!(code, 0, "run --timeout 0: {err}");
}

/// The same bug through `CELLHOST_CELL_TIMEOUT_S`.
#[test]
fn env_cell_timeout_is_honoured_by_one_shot_exec_and_run() {
    let mut env = Env::new("");
    env.vars.push(("CELLHOST_CELL_TIMEOUT_S".into(), "1".into()));
    let (code, v) = env.exec(None, &[], SLEEP);
    assert_eq!(code, 124, "{v}");
    let (code, _, err) = env.run_cell(&[], SLEEP);
    assert_eq!(code, 124, "{err}");
    // The host is healthy: the next cell runs.
    let (code, v) = env.exec(None, &[], "1 + 1");
    assert_eq!(code, 0, "{v}");
}

/// Every surface runs the kernel under the mode asked for, and the result
/// says which.
#[test]
fn sandbox_mode_is_the_same_on_every_cli_surface() {
    let env = Env::new("");
    let (code, v) = env.exec(None, &["--sandbox", "off"], "1");
    assert_eq!(
        (code, v["kernel"]["sandbox"]["mode"].as_str()),
        (0, Some("off")),
        "{v}"
    );
    let (code, v) = env.exec(None, &[], "1");
    assert_eq!(
        (code, v["kernel"]["sandbox"]["mode"].as_str()),
        (0, Some("auto")),
        "{v}"
    );
    // The daemon starts with the first call's mode as its floor.
    let (code, v) = env.exec(Some("m"), &[], "1");
    assert_eq!(
        (code, v["kernel"]["sandbox"]["mode"].as_str()),
        (0, Some("auto")),
        "{v}"
    );
    let (code, v) = env.exec(Some("m2"), &["--sandbox", "off"], "1");
    assert_eq!(code, 2, "below the daemon's floor: {v}");
    assert_eq!(v["error"]["code"], "sandbox_below_floor", "{v}");
    let py = python();
    let o = env.run(&["run", "--python", &py, "--sandbox", "off", "nb.py"]);
    assert_eq!(o.status.code(), Some(2), "no notebook yet: {}", text(&o));
    std::fs::write(env.work().join("nb.py"), "# %%\n1\n").expect("nb");
    let o = env.run(&["run", "--python", &py, "--sandbox", "off", "nb.py"]);
    assert!(o.status.success(), "{}", text(&o));
    let nb: Value =
        serde_json::from_str(&std::fs::read_to_string(env.work().join("nb.executed.ipynb")).expect("output"))
            .expect("json");
    assert_eq!(
        nb["metadata"]["cellhost"]["sandbox"]["mode"], "off",
        "{}",
        nb["metadata"]
    );
}

/// Bug: CLI (daemon) and `serve` sessions of one name shared the owner
/// `local`, so their journals and generations mixed. The CLI's owner is
/// now `cli:<user>` (one-shot `run` and the daemon alike); `history
/// --owner` still reads any owner.
#[test]
fn cli_sessions_have_their_own_owner_namespace() {
    let env = Env::new("");
    let (code, v) = env.exec(Some("same"), &[], "x = 1");
    assert_eq!(code, 0, "{v}");
    let (code, _, err) = env.run_cell(&["--session", "same"], "y = 2");
    assert_eq!(code, 0, "{err}");
    let (code, h) = env.history("same", None);
    assert_eq!(code, 0, "{h}");
    let owner = h["owner"].as_str().unwrap_or_default().to_string();
    assert!(owner.starts_with("cli:"), "{h}");
    let origins: Vec<&str> = h["cells"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["origin"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(origins, ["cli:daemon", "cli:run"], "{h}");
    // `serve`'s token owner `local` (and the old shared owner) is another
    // namespace: nothing of the CLI's session is there.
    let (code, h) = env.history("same", Some("local"));
    assert_eq!(code, 1, "{h}");
    let (code, h) = env.history("same", Some(&owner));
    assert_eq!(code, 0, "{h}");
}

/// Bug: a second cell on a busy session silently waited behind the first
/// (and its `duration_ms` counted the wait). It is refused with
/// `session_busy` unless `--queue` is given; a queued cell reports its
/// wait as `queued_ms` and its own run as `duration_ms`.
#[test]
fn busy_session_refuses_a_second_exec_unless_queued() {
    let env = Env::new("");
    let go = env.work().join("go");
    let first_code = format!(
        "import os, time\nprint('started', flush=True)\nwhile not os.path.exists({:?}): time.sleep(0.02)\n'first'",
        go.display().to_string()
    );
    let py = python();
    let mut first: Child = env
        .cmd(&["exec", "--python", &py, "--session", "b", &first_code])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("first exec");
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = first.stdout.take().expect("stdout");
    let first = Reap(&mut first);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "started");

    let (code, v) = env.exec(Some("b"), &[], "1 + 1");
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["error"]["code"], "session_busy", "{v}");

    let mut queued = env
        .cmd(&[
            "exec",
            "--python",
            &py,
            "--session",
            "b",
            "--queue",
            "--json",
            "2 + 2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("queued exec");
    let q = Reap(&mut queued);
    // The queued cell is journaled (as running) once it is submitted.
    let t0 = Instant::now();
    loop {
        let (_, h) = env.history("b", None);
        if h["cells"].as_array().map_or(0, Vec::len) >= 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the queued cell never arrived: {h}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(&go, "").expect("go");
    let out = q.0.wait_with_output_ref();
    let v: Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["result"]["text/plain"], "4", "{v}");
    assert!(v["queued_ms"].as_u64().is_some_and(|q| q > 0), "{v}");
    let status = first.0.wait().expect("first");
    assert!(status.success());
    // The journal row records the run, not the wait.
    let (_, h) = env.history("b", None);
    let cells = h["cells"].as_array().cloned().unwrap_or_default();
    assert_eq!(cells.len(), 2, "the refused cell is not journaled: {h}");
    assert_eq!(cells[1]["duration_ms"], v["duration_ms"], "{h}");
    assert!(
        cells[1]["started_ms"].as_i64() >= cells[0]["ended_ms"].as_i64(),
        "{h}"
    );
    // Healthy: the session takes the next cell without --queue.
    let (code, v) = env.exec(Some("b"), &[], "3");
    assert_eq!(code, 0, "{v}");
}

trait WaitOutput {
    fn wait_with_output_ref(&mut self) -> Vec<u8>;
}

impl WaitOutput for Child {
    fn wait_with_output_ref(&mut self) -> Vec<u8> {
        use std::io::Read;
        let mut buf = Vec::new();
        if let Some(mut s) = self.stdout.take() {
            let _ = s.read_to_end(&mut buf);
        }
        let _ = self.wait();
        buf
    }
}

/// Bug: `cellhost restore NAME` reported "2 replayed" but the rebuilt
/// kernel died with the command, and a later `exec --session NAME` found
/// nothing. Restore lands in the daemon; it replays that owner's session.
#[test]
fn restore_lands_in_the_daemon_and_exec_session_goes_on() {
    let env = Env::new("");
    assert_eq!(env.exec(Some("r"), &[], "x = 5").0, 0);
    assert_eq!(env.exec(Some("r"), &[], "y = x + 1").0, 0);
    let o = env.run(&["daemon", "stop"]);
    assert!(o.status.success(), "{}", text(&o));
    let py = python();
    let o = env.run(&["restore", "r", "--python", &py, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let rep: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(rep["replayed"].as_array().map(Vec::len), Some(2), "{rep}");
    let (code, v) = env.exec(Some("r"), &[], "y");
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["result"]["text/plain"], "6", "{v}");
    assert_eq!(v["kernel"]["generation"], rep["generation"], "{v}");
    // Another owner's journal is never replayed into this one's session.
    let o = env.run(&[
        "restore",
        "r2",
        "--from",
        "r",
        "--owner",
        "http:local",
        "--python",
        &py,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no journaled cells"),
        "{}",
        text(&o)
    );
}

/// Bug: a journal that failed while `run` wrote its cells left exit 0 and
/// the cell `running`. The run now stops at that cell and fails.
#[test]
fn journal_failure_during_run_fails_the_run() {
    let env = Env::new("");
    let (code, _, err) = env.run_cell(&[], "1");
    assert_eq!(code, 0, "{err}");
    // Break the journal: every settled-cell write is refused.
    let db = env.dir.path().join("state/journal.sqlite3");
    let o = Command::new(python())
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(\"CREATE TRIGGER boom BEFORE UPDATE ON cells BEGIN SELECT RAISE(ABORT, 'journal broken'); END\"); c.commit()",
            &db.display().to_string(),
        ])
        .output()
        .expect("python");
    assert!(o.status.success(), "{}", text(&o));
    let (code, _, err) = env.run_cell(&[], "2");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("journal"), "{err}");
    // The host is healthy: a one-shot exec still runs.
    let (code, v) = env.exec(None, &[], "3");
    assert_eq!(code, 0, "{v}");
}
