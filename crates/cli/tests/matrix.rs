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

mod serve_address;
use serve_address::serve_address;

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

// ---------------------------------------------------------------------------
// The surface table: one-shot `exec`, `exec --session` (the daemon), `run`,
// HTTP (`serve`) and MCP (`mcp` on stdio), all over the request layer.

/// What one cell came back as on a surface, in the same terms for all.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    /// `ok`, `timeout`, `error`, … or `refused:<code>` for a request the
    /// surface refused with an error code.
    status: String,
    /// The sandbox mode the kernel ran under.
    mode: Option<String>,
    /// The kernel generation within the session.
    generation: Option<u64>,
    /// The cell waited this long behind another (a queued cell).
    queued_ms: Option<u64>,
}

fn outcome_of_result(v: &Value) -> Outcome {
    if let Some(code) = v["error"]["code"].as_str() {
        return Outcome {
            status: format!("refused:{code}"),
            mode: None,
            generation: None,
            queued_ms: None,
        };
    }
    Outcome {
        status: v["status"].as_str().unwrap_or("?").to_string(),
        mode: v["kernel"]["sandbox"]["mode"].as_str().map(str::to_string),
        generation: v["kernel"]["generation"].as_u64(),
        queued_ms: v["queued_ms"].as_u64(),
    }
}

/// A cell submitted and not yet waited for.
enum Pending {
    Exec(Child),
    Run(Child, PathBuf),
    Thread(std::thread::JoinHandle<Value>),
    Mcp(u64),
}

/// A `cellhost serve` of the Env (killed on drop).
struct Serve {
    child: Child,
    addr: String,
    token: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request (`Connection: close`): status and JSON body.
fn http(addr: &str, token: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to serve");
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut rest = body;
        while let Some((len, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
            if n == 0 || tail.len() < n {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_string()
    };
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// `cellhost mcp` on stdio, spoken to as a JSON-RPC client (killed on drop).
struct Mcp {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    owner: String,
    answers: std::collections::HashMap<u64, Value>,
    next: u64,
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Mcp {
    fn start(env: &Env) -> Mcp {
        let py = python();
        let mut child = env
            .cmd(&["mcp", "--python", &py])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cellhost mcp");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        // A line on stderr names the owner.
        let mut first = String::new();
        let mut err = BufReader::new(stderr);
        while !first.contains("owner ") {
            first.clear();
            if err.read_line(&mut first).unwrap_or(0) == 0 {
                break;
            }
        }
        std::thread::spawn(move || for _ in err.lines().map_while(Result::ok) {});
        let owner = first
            .split("owner ")
            .nth(1)
            .and_then(|r| r.split(')').next())
            .unwrap_or_default()
            .to_string();
        let mut m = Mcp {
            child,
            stdin,
            lines,
            owner,
            answers: Default::default(),
            next: 1,
        };
        let id = m.send(
            "initialize",
            serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "matrix", "version": "0"}}),
        );
        let init = m.wait(id);
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        m.notify("notifications/initialized");
        m
    }

    fn write(&mut self, v: &Value) {
        use std::io::Write;
        writeln!(self.stdin, "{v}").expect("write to mcp");
        self.stdin.flush().expect("flush");
    }

    fn notify(&mut self, method: &str) {
        self.write(&serde_json::json!({"jsonrpc": "2.0", "method": method}));
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next;
        self.next += 1;
        self.write(&serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    fn wait(&mut self, id: u64) -> Value {
        let until = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(v) = self.answers.remove(&id) {
                return v;
            }
            let left = until.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no MCP answer to request {id}");
            let Ok(line) = self.lines.recv_timeout(left) else {
                panic!("cellhost mcp ended before answering request {id}");
            };
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if let Some(n) = v["id"].as_u64() {
                self.answers.insert(n, v);
            }
        }
    }

    fn call(&mut self, tool: &str, args: Value) -> u64 {
        self.send("tools/call", serde_json::json!({"name": tool, "arguments": args}))
    }
}

/// One row of the table.
enum Row {
    OneShot,
    Daemon,
    Run,
    Http(Serve),
    Mcp(Box<Mcp>),
}

impl Row {
    fn name(&self) -> &'static str {
        match self {
            Row::OneShot => "exec",
            Row::Daemon => "exec --session",
            Row::Run => "run",
            Row::Http(_) => "http",
            Row::Mcp(_) => "mcp",
        }
    }

    /// Whether cells of one session name share a kernel (and so the busy
    /// rule applies): not for one-shot commands, each its own kernel.
    fn has_sessions(&self) -> bool {
        !matches!(self, Row::OneShot | Row::Run)
    }

    fn submit(&mut self, env: &Env, session: &str, code: &str, timeout: Option<f64>, queue: bool) -> Pending {
        let py = python();
        let t = timeout.map(|t| t.to_string());
        match self {
            Row::OneShot | Row::Daemon => {
                let mut args = vec!["exec", "--python", &py, "--json"];
                if matches!(self, Row::Daemon) {
                    args.extend(["--session", session]);
                }
                if let Some(t) = &t {
                    args.extend(["--timeout", t]);
                }
                if queue {
                    args.push("--queue");
                }
                args.push(code);
                Pending::Exec(
                    env.cmd(&args)
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                        .expect("exec"),
                )
            }
            Row::Run => {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let nb = format!("row{n}.py");
                std::fs::write(env.work().join(&nb), format!("# %%\n{code}\n")).expect("nb");
                let mut args = vec!["run", &nb, "--python", &py];
                if let Some(t) = &t {
                    args.extend(["--timeout", t]);
                }
                let out = env.work().join(format!("row{n}.executed.ipynb"));
                Pending::Run(
                    env.cmd(&args)
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("run"),
                    out,
                )
            }
            Row::Http(s) => {
                let (addr, token) = (s.addr.clone(), s.token.clone());
                let mut body = serde_json::json!({"code": code, "queue": queue});
                if let Some(t) = timeout {
                    body["timeout_s"] = t.into();
                }
                let path = format!("/v1/sessions/{session}/execute");
                Pending::Thread(std::thread::spawn(move || {
                    let (status, v) = http(&addr, &token, "POST", &path, Some(&body));
                    assert!(status == 200 || v["error"]["code"].is_string(), "{status} {v}");
                    v
                }))
            }
            Row::Mcp(m) => {
                let mut args = serde_json::json!({"code": code, "session": session, "queue": queue});
                if let Some(t) = timeout {
                    args["timeout_s"] = t.into();
                }
                Pending::Mcp(m.call("execute_code", args))
            }
        }
    }

    fn wait(&mut self, p: Pending) -> Outcome {
        match p {
            Pending::Exec(c) => {
                let o = c.wait_with_output().expect("exec output");
                let v = serde_json::from_slice(&o.stdout)
                    .or_else(|_| serde_json::from_slice(&o.stderr))
                    .unwrap_or(Value::Null);
                outcome_of_result(&v)
            }
            Pending::Run(mut c, out) => {
                let st = c.wait().expect("run status");
                let nb: Value = std::fs::read_to_string(&out)
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or(Value::Null);
                Outcome {
                    status: match st.code() {
                        Some(0) => "ok",
                        Some(124) => "timeout",
                        _ => "error",
                    }
                    .to_string(),
                    mode: nb["metadata"]["cellhost"]["sandbox"]["mode"]
                        .as_str()
                        .map(str::to_string),
                    generation: None,
                    queued_ms: None,
                }
            }
            Pending::Thread(h) => outcome_of_result(&h.join().expect("http thread")),
            Pending::Mcp(id) => {
                let Row::Mcp(m) = self else {
                    panic!("an MCP call on another row")
                };
                let v = m.wait(id);
                outcome_of_result(&v["result"]["structuredContent"])
            }
        }
    }

    fn cell(&mut self, env: &Env, session: &str, code: &str, timeout: Option<f64>) -> Outcome {
        let p = self.submit(env, session, code, timeout, false);
        self.wait(p)
    }

    /// A request for a sandbox mode below the host's floor, where a surface
    /// can ask for one; `None` where it cannot (MCP: the server's mode) or
    /// there is no floor (one-shot commands: the command is the host).
    fn below_floor(&mut self, env: &Env, session: &str) -> Option<Outcome> {
        let py = python();
        match self {
            Row::Daemon => {
                let (_, v) = env.exec(Some(session), &["--sandbox", "off"], "1");
                Some(outcome_of_result(&v))
            }
            Row::Http(s) => {
                let body = serde_json::json!({"name": session, "sandbox": "off"});
                let (_, v) = http(&s.addr, &s.token, "POST", "/v1/sessions", Some(&body));
                Some(outcome_of_result(&v))
            }
            Row::OneShot => {
                let (_, v) = env.exec(None, &["--sandbox", "off"], "1");
                assert_eq!(
                    v["kernel"]["sandbox"]["mode"], "off",
                    "one-shot has no floor: {v}"
                );
                let _ = py;
                None
            }
            Row::Run | Row::Mcp(_) => None,
        }
    }
}

impl Row {
    /// The held cell runs: a session row's list says the session is busy;
    /// a one-shot row's cell made its `started` file.
    fn held_runs(&mut self, env: &Env, session: &str, started: &std::path::Path) -> bool {
        match self {
            Row::OneShot | Row::Run => started.exists(),
            Row::Daemon => {
                let o = env.run(&["sessions", "--json"]);
                let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
                v.as_array()
                    .is_some_and(|l| l.iter().any(|s| s["name"] == session && s["busy"] == true))
            }
            Row::Http(s) => {
                let (_, v) = http(&s.addr, &s.token, "GET", "/v1/sessions", None);
                v["sessions"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|s| s["name"] == session && s["busy"] == true))
            }
            Row::Mcp(m) => {
                let id = m.call("list_sessions", serde_json::json!({}));
                let v = m.wait(id);
                v["result"]["structuredContent"]["sessions"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|s| s["session"] == session && s["busy"] == true))
            }
        }
    }

    /// Ends the held cell: a session row interrupts it through its own
    /// surface; a one-shot row opens its gate.
    fn release(&mut self, env: &Env, session: &str, gate: &std::path::Path) {
        match self {
            Row::OneShot | Row::Run => std::fs::write(gate, "").expect("open the gate"),
            Row::Daemon => {
                let o = env.run(&["interrupt", session]);
                assert!(o.status.success(), "{}", text(&o));
            }
            Row::Http(s) => {
                let (status, v) = http(
                    &s.addr,
                    &s.token,
                    "POST",
                    &format!("/v1/sessions/{session}/interrupt"),
                    None,
                );
                assert_eq!((status, v["delivered"].as_bool()), (200, Some(true)), "{v}");
            }
            Row::Mcp(m) => {
                let id = m.call("interrupt", serde_json::json!({"session": session}));
                let v = m.wait(id);
                assert_eq!(v["result"]["structuredContent"]["delivered"], true, "{v}");
            }
        }
    }
}

fn start_serve(env: &Env) -> Serve {
    let py = python();
    let mut child = env
        .cmd(&["serve", "--listen", "127.0.0.1:0", "--python", &py])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let (addr, rx) = serve_address(&mut child, Duration::from_secs(60));
    std::thread::spawn(move || for _ in rx {});
    let tokens = std::fs::read_to_string(env.dir.path().join("state/server/tokens")).unwrap_or_default();
    let token = tokens
        .lines()
        .find(|l| l.starts_with("local "))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_default()
        .to_string();
    let s = Serve {
        child,
        addr: addr.unwrap_or_default(),
        token,
    };
    assert!(!s.addr.is_empty() && !s.token.is_empty(), "serve did not start");
    s
}

/// The table: every surface — one-shot `exec`, `exec --session`, `run`,
/// HTTP and MCP — honours the configured default deadline and an explicit
/// one, runs under the same sandbox mode (refusing one below the floor with
/// `sandbox_below_floor` where a request can ask for one), keeps its own
/// owner (`cli:<user>`, `http:<token owner>`, `mcp:<connection>`: one
/// session name on three surfaces is three sessions, each at generation 1,
/// with its own history), and applies one busy rule (`session_busy` unless
/// the request queues; a queued cell reports `queued_ms`).
///
/// Bug (regression): CLI (daemon) and `serve` sessions of one name shared
/// the owner `local`, so their journals and generations mixed.
#[test]
fn every_surface_honours_timeout_sandbox_owner_and_busy_alike() {
    let env = Env::new("cell_timeout_s = 2\n");
    let serve = start_serve(&env);
    let (status, v) = http(
        &serve.addr,
        &serve.token,
        "POST",
        "/v1/sessions",
        Some(&serde_json::json!({"name": "same"})),
    );
    assert_eq!(status, 201, "{v}");
    let (status, v) = http(
        &serve.addr,
        &serve.token,
        "POST",
        "/v1/sessions",
        Some(&serde_json::json!({"name": "busy"})),
    );
    assert_eq!(status, 201, "{v}");
    let mcp = Mcp::start(&env);
    assert!(mcp.owner.starts_with("mcp:"), "MCP owner {:?}", mcp.owner);
    let mut rows = vec![
        Row::OneShot,
        Row::Daemon,
        Row::Run,
        Row::Http(serve),
        Row::Mcp(Box::new(mcp)),
    ];
    let mut modes = Vec::new();
    for row in &mut rows {
        let name = row.name();
        // Deadline: the configured default (2 s) ...
        let o = row.cell(&env, "same", SLEEP, None);
        assert_eq!(o.status, "timeout", "{name}: default deadline: {o:?}");
        // ... and an explicit one over it.
        let o = row.cell(&env, "same", "import time; time.sleep(2.5); 'slept'", Some(30.0));
        assert_eq!(o.status, "ok", "{name}: explicit deadline: {o:?}");
        // Sandbox: the same mode everywhere by default.
        modes.push((name, o.mode.clone()));
        if row.has_sessions() {
            assert_eq!(o.generation, Some(1), "{name}: a session of its own owner: {o:?}");
        }
        let floor = o.mode.clone().unwrap_or_default();
        if floor != "off"
            && let Some(o) = row.below_floor(&env, "weak")
        {
            assert_eq!(o.status, "refused:sandbox_below_floor", "{name}: {o:?}");
        }
        // Busy: a held cell (a session row's until it is interrupted
        // through the surface, a one-shot row's until its gate opens).
        let tag = name.replace(' ', "_");
        let gate = env.work().join(format!("go-{tag}"));
        let started = env.work().join(format!("started-{tag}"));
        let held = if row.has_sessions() {
            "import time\ntime.sleep(600)".to_string()
        } else {
            format!(
                "import os, time\nopen({:?}, 'w').close()\nwhile not os.path.exists({:?}): time.sleep(0.02)\n'first'",
                started.display().to_string(),
                gate.display().to_string()
            )
        };
        let first = row.submit(&env, "busy", &held, Some(0.0), false);
        let until = Instant::now() + Duration::from_secs(120);
        while !row.held_runs(&env, "busy", &started) {
            assert!(Instant::now() < until, "{name}: the held cell never ran");
            std::thread::sleep(Duration::from_millis(50));
        }
        let second = row.cell(&env, "busy", "1 + 1", None);
        let queued = if row.has_sessions() {
            assert_eq!(second.status, "refused:session_busy", "{name}: {second:?}");
            Some(row.submit(&env, "busy", "2 + 2", None, true))
        } else {
            // Each one-shot command is its own kernel: nothing to be busy.
            assert_eq!(second.status, "ok", "{name}: {second:?}");
            None
        };
        row.release(&env, "busy", &gate);
        let o = row.wait(first);
        let want = if row.has_sessions() { "interrupted" } else { "ok" };
        assert_eq!(o.status, want, "{name}: the held cell: {o:?}");
        if let Some(q) = queued {
            // The queued request is never refused (it waits if the held
            // cell still runs; `queued_ms` is checked per surface).
            let o = row.wait(q);
            assert_eq!(o.status, "ok", "{name}: the queued cell: {o:?}");
        }
        // The host stays healthy: a later cell runs.
        assert_eq!(row.cell(&env, "same", "1", None).status, "ok", "{name}");
    }
    let first = modes[0].1.clone();
    assert!(first.is_some(), "{modes:?}");
    assert!(
        modes.iter().all(|(_, m)| *m == first),
        "one default mode: {modes:?}"
    );

    // Owners: the daemon's and the API's sessions named "same" never share a
    // journal.
    let (code, h) = env.history("same", None);
    assert_eq!(code, 0, "{h}");
    let cli_origins: Vec<&str> = h["cells"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["origin"].as_str()).collect())
        .unwrap_or_default();
    assert!(!cli_origins.is_empty(), "{h}");
    assert!(cli_origins.iter().all(|o| o.starts_with("cli:")), "{h}");
    let (code, h) = env.history("same", Some("http:local"));
    assert_eq!(code, 0, "{h}");
    let http_origins: Vec<&str> = h["cells"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["origin"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(http_origins, ["http", "http", "http"], "{h}");
    let Row::Http(serve) = &rows[3] else {
        panic!("row 3 is HTTP")
    };
    let (status, h) = http(
        &serve.addr,
        &serve.token,
        "GET",
        "/v1/sessions/same/history",
        None,
    );
    assert_eq!(status, 200, "{h}");
    assert_eq!(
        h["cells"].as_array().map(Vec::len),
        Some(3),
        "only the API's cells: {h}"
    );
    // The old shared owner holds nothing.
    let (code, h) = env.history("same", Some("local"));
    assert_eq!(code, 1, "{h}");
}
