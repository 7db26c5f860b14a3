//! End-to-end tests of the `cellhost` binary: `exec`, `run`, `repl` and
//! what happens to a kernel when its host dies (`cellhost bench` is tested
//! with the bench, in crates/bench/tests).
//!
//! Every test drives the real binary (`CARGO_BIN_EXE_cellhost`) with an
//! explicit `--python`: `CELLHOST_TEST_PYTHON` (scripts/test.sh sets it to
//! the project venv), else `python3` resolved to its real executable. Each
//! test has its own temporary `CELLHOST_STATE_DIR` and working directory.
//! Tests wait on events (process exit, output that a cell printed, files
//! and `/proc` entries) with bounded deadlines, never on fixed sleeps, and a
//! guard kills every process a test started — and their descendants — when
//! the test fails.
//!
//! Parts that need optional packages (matplotlib, nbformat, pandas,
//! palmerpenguins) or `script` (util-linux) check for them and say on stderr
//! what they skipped.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// Interpreter and optional packages

/// The interpreter for kernels.
fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Some(p) = std::env::var_os("CELLHOST_TEST_PYTHON").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        let out = Command::new("python3")
            .args(["-c", "import sys;print(sys.executable)"])
            .output()
            .expect("CELLHOST_TEST_PYTHON is not set and python3 cannot be run");
        assert!(out.status.success(), "python3 -c failed: {out:?}");
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(!p.is_empty(), "python3 did not print sys.executable");
        PathBuf::from(p)
    })
}

/// True when every module in `mods` imports in the test interpreter.
fn has_modules(mods: &[&str]) -> bool {
    static CACHE: OnceLock<Mutex<HashMap<String, bool>>> = OnceLock::new();
    let key = mods.join(",");
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(v) = cache.lock().expect("cache lock").get(&key) {
        return *v;
    }
    let ok = Command::new(python())
        .args(["-c", &format!("import {key}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    cache.lock().expect("cache lock").insert(key, ok);
    ok
}

fn skip(test: &str, what: &str) {
    eprintln!("note: {test}: skipped {what}");
}

/// Validates a notebook with the real `nbformat` when it is importable.
/// Returns false (and says so) when nbformat is missing.
fn validate_notebook(test: &str, path: &Path) -> bool {
    if !has_modules(&["nbformat"]) {
        skip(test, "nbformat validation (nbformat is not importable)");
        return false;
    }
    let out = Command::new(python())
        .args([
            "-c",
            "import nbformat,sys; nbformat.validate(nbformat.read(sys.argv[1], as_version=4))",
        ])
        .arg(path)
        .output()
        .expect("run python for nbformat");
    assert!(
        out.status.success(),
        "{} is not a valid notebook:\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

// ---------------------------------------------------------------------------
// /proc helpers

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    state: char,
    ppid: i32,
    session: i32,
    starttime: u64,
}

fn proc_stat(pid: i32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        starttime: f.get(19)?.parse().ok()?,
    })
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every live descendant of `root` with its start time (to tell a pid that
/// was reused from the process we saw).
fn descendants(root: i32) -> Vec<(i32, u64)> {
    let stats: Vec<(i32, ProcStat)> = all_pids()
        .into_iter()
        .filter_map(|p| proc_stat(p).map(|s| (p, s)))
        .collect();
    let mut found: HashSet<i32> = HashSet::from([root]);
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for (pid, st) in &stats {
            if found.contains(&st.ppid) && found.insert(*pid) {
                out.push((*pid, st.starttime));
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

/// The host pid of the descendant of `root` whose pid in its innermost pid
/// namespace is `inner` (a sandboxed kernel's process), else `inner`.
fn host_pid(root: i32, inner: i32) -> i32 {
    descendants(root)
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            let ns: Vec<&str> = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .map(|v| v.split_whitespace().collect())
                .unwrap_or_default();
            ns.len() > 1 && ns.last() == Some(&inner.to_string().as_str())
        })
        .unwrap_or(inner)
}

/// A process that was seen alive, identified by pid and start time.
#[derive(Debug, Clone, Copy)]
struct Seen {
    pid: i32,
    starttime: u64,
}

impl Seen {
    fn now(pid: i32) -> Option<Seen> {
        proc_stat(pid).map(|s| Seen {
            pid,
            starttime: s.starttime,
        })
    }

    /// The process as it is now: `None` when it is gone (or the pid now
    /// names another process).
    fn stat(&self) -> Option<ProcStat> {
        proc_stat(self.pid).filter(|s| s.starttime == self.starttime)
    }

    fn running(&self) -> bool {
        self.stat().is_some_and(|s| s.state != 'Z' && s.state != 'X')
    }

    fn kill(&self) {
        if self.running() {
            send_signal(self.pid, "KILL");
        }
    }
}

fn send_signal(pid: i32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

// ---------------------------------------------------------------------------
// Running the binary

/// Bytes a child wrote to one pipe, collected by a thread.
#[derive(Default)]
struct Captured {
    buf: Mutex<(Vec<u8>, bool)>,
    cv: Condvar,
}

impl Captured {
    fn start(mut src: impl Read + Send + 'static) -> Arc<Captured> {
        let cap = Arc::new(Captured::default());
        let c = cap.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                let n = src.read(&mut chunk).unwrap_or(0);
                let mut g = c.buf.lock().expect("capture lock");
                if n == 0 {
                    g.1 = true;
                    c.cv.notify_all();
                    return;
                }
                g.0.extend_from_slice(&chunk[..n]);
                c.cv.notify_all();
            }
        });
        cap
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf.lock().expect("capture lock").0).into_owned()
    }

    /// Waits until `needle` occurs at or after byte `from`; returns the
    /// offset just past it, or `None` at the deadline or EOF.
    fn wait_for(&self, needle: &str, from: usize, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        let mut g = self.buf.lock().expect("capture lock");
        loop {
            if let Some(i) = find(&g.0, needle.as_bytes(), from) {
                return Some(i + needle.len());
            }
            let now = Instant::now();
            if g.1 || now >= deadline {
                return None;
            }
            g = self.cv.wait_timeout(g, deadline - now).expect("capture lock").0;
        }
    }

    fn wait_eof(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = self.buf.lock().expect("capture lock");
        while !g.1 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = self.cv.wait_timeout(g, deadline - now).expect("capture lock").0;
        }
        true
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > hay.len() || needle.is_empty() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

/// A running process; on drop (a failed test included) it and everything
/// below it are killed and reaped.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Arc<Captured>,
    stderr: Arc<Captured>,
    started: Instant,
    /// Further processes to kill on drop (seen in /proc or named by a cell).
    also: Vec<Seen>,
}

impl Running {
    fn spawn(mut cmd: Command) -> Running {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().expect("spawn the cellhost binary");
        let stdout = Captured::start(child.stdout.take().expect("stdout pipe"));
        let stderr = Captured::start(child.stderr.take().expect("stderr pipe"));
        let stdin = child.stdin.take();
        Running {
            child,
            stdin,
            stdout,
            stderr,
            started,
            also: Vec::new(),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn write(&mut self, s: &str) {
        let w = self.stdin.as_mut().expect("stdin still open");
        w.write_all(s.as_bytes()).expect("write to the child's stdin");
        w.flush().expect("flush the child's stdin");
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Remembers the current descendants so that drop can kill them too.
    fn track_descendants(&mut self) {
        for (pid, starttime) in descendants(self.pid()) {
            self.also.push(Seen { pid, starttime });
        }
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for exit and for both pipes to close; panics with everything
    /// the process wrote when it takes longer than `timeout`.
    fn finish(mut self, what: &str, timeout: Duration) -> Finished {
        self.close_stdin();
        let Some(status) = self.wait_exit(timeout) else {
            panic!(
                "{what}: still running after {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                self.stdout.text(),
                self.stderr.text()
            );
        };
        let elapsed = self.started.elapsed();
        // Pipes close once the last writer (possibly a leaked descendant) is
        // gone; a bounded wait keeps a leak from hanging the test.
        let closed =
            self.stdout.wait_eof(Duration::from_secs(5)) && self.stderr.wait_eof(Duration::from_secs(5));
        assert!(
            closed,
            "{what}: exited but something still holds its stdout/stderr open"
        );
        Finished {
            status,
            stdout: self.stdout.text(),
            stderr: self.stderr.text(),
            elapsed,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stdin = None;
        let alive = self.child.try_wait().ok().flatten().is_none();
        if alive {
            self.track_descendants();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for s in &self.also {
            s.kill();
        }
    }
}

/// A process that ended.
#[derive(Debug)]
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Finished {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    fn expect_code(&self, what: &str, code: i32) {
        assert_eq!(
            self.code(),
            Some(code),
            "{what}: want exit {code}, got {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// A per-test sandbox: temporary state directory and working directory.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::Builder::new()
            .prefix("cellhost-cli-test-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir_all(dir.path().join("state")).expect("state dir");
        std::fs::create_dir_all(dir.path().join("work")).expect("work dir");
        Env { dir }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// `cellhost SUBCOMMAND --python PY ARGS…`.
    fn cmd(&self, sub: &str, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        c.arg(sub).arg("--python").arg(python()).args(args);
        self.prepare(&mut c);
        c
    }

    fn prepare(&self, c: &mut Command) {
        c.current_dir(self.work())
            .env("CELLHOST_STATE_DIR", self.state())
            .env_remove("CELLHOST_LOG");
    }

    /// Runs `cellhost SUBCOMMAND --python PY ARGS…` to the end.
    fn run(&self, sub: &str, args: &[&str], stdin: Option<&str>, timeout: Duration) -> Finished {
        let mut r = Running::spawn(self.cmd(sub, args));
        if let Some(s) = stdin {
            r.write(s);
        }
        r.finish(&format!("cellhost {sub} {args:?}"), timeout)
    }

    fn exec(&self, args: &[&str]) -> Finished {
        self.run("exec", args, None, Duration::from_secs(60))
    }
}

const LONG: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// 1. exec: exit codes, stdin, --json

#[test]
fn exec_ok_exits_0() {
    let env = Env::new();
    let r = env.exec(&["print(1)"]);
    r.expect_code("print(1)", 0);
    assert_eq!(r.stdout, "1\n");
}

#[test]
fn exec_last_expression_value_is_printed() {
    let env = Env::new();
    let r = env.exec(&["x = 6\nx * 7"]);
    r.expect_code("x * 7", 0);
    assert_eq!(r.stdout.trim(), "42");
}

#[test]
fn exec_error_exits_1_with_traceback_on_stderr() {
    let env = Env::new();
    let r = env.exec(&["1/0"]);
    r.expect_code("1/0", 1);
    assert!(r.stderr.contains("Traceback"), "stderr: {}", r.stderr);
    assert!(
        r.stderr.contains("ZeroDivisionError: division by zero"),
        "stderr: {}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("cellhost_worker"),
        "worker frames leak into the traceback: {}",
        r.stderr
    );
}

#[test]
fn exec_timeout_exits_124_quickly() {
    let env = Env::new();
    let r = env.exec(&["--timeout", "1", "import time; time.sleep(10)"]);
    r.expect_code("timeout", 124);
    assert!(
        r.elapsed < Duration::from_secs(5),
        "a 1 s timeout took {:?}",
        r.elapsed
    );
    assert!(r.stderr.contains("timeout"), "stderr: {}", r.stderr);
}

#[test]
fn exec_os_exit_is_crashed_137() {
    let env = Env::new();
    let r = env.exec(&["import os; os._exit(3)"]);
    r.expect_code("os._exit(3)", 137);
    assert!(r.stderr.contains("code 3"), "stderr: {}", r.stderr);
}

#[test]
fn exec_segfault_is_crashed_137() {
    let env = Env::new();
    let r = env.exec(&["import ctypes; ctypes.string_at(0)"]);
    r.expect_code("segfault", 137);
    assert!(r.stderr.contains("SIGSEGV"), "stderr: {}", r.stderr);
    // faulthandler's Python stack names the cell's frame.
    assert!(r.stderr.contains("<cell-1>"), "stderr: {}", r.stderr);
}

#[test]
fn exec_usage_errors_exit_2() {
    let env = Env::new();
    let cases: &[&[&str]] = &[
        &["--no-such-flag", "print(1)"],
        &["--timeout", "-1", "print(1)"],
        &["--timeout=-1", "print(1)"],
        &["--timeout", "soon", "print(1)"],
        &["--timeout", "nan", "print(1)"],
        &[],
    ];
    for args in cases {
        let r = env.exec(args);
        r.expect_code(&format!("exec {args:?}"), 2);
        assert!(r.stdout.is_empty(), "usage error wrote stdout: {}", r.stdout);
        assert!(!r.stderr.is_empty(), "usage error without a message");
    }
    // A usage error never starts a kernel.
    assert!(
        !env.state().join("sessions").exists()
            || std::fs::read_dir(env.state().join("sessions"))
                .expect("sessions dir")
                .next()
                .is_none(),
        "a usage error started a session"
    );
}

#[test]
fn exec_missing_interpreter_fails_without_hanging() {
    let env = Env::new();
    let mut c = Command::new(env!("CARGO_BIN_EXE_cellhost"));
    c.args(["exec", "--python", "/nonexistent/bin/python3", "print(1)"]);
    env.prepare(&mut c);
    let r = Running::spawn(c).finish("missing python", Duration::from_secs(30));
    assert_ne!(r.code(), Some(0));
    assert!(
        r.stderr.contains("/nonexistent/bin/python3"),
        "the error does not name the interpreter: {}",
        r.stderr
    );
}

#[test]
fn exec_dash_reads_code_from_stdin() {
    let env = Env::new();
    let code = "for i in range(3):\n    print('line', i)\nprint('na\u{ef}ve \u{2713}')\n";
    let r = env.run("exec", &["-"], Some(code), Duration::from_secs(60));
    r.expect_code("exec -", 0);
    assert_eq!(r.stdout, "line 0\nline 1\nline 2\nna\u{ef}ve \u{2713}\n");
}

#[test]
fn exec_of_a_file_path_hints_at_run_and_stdin() {
    let env = Env::new();
    std::fs::write(env.work().join("analysis.py"), "print('ran the file')\n").expect("write");
    let r = env.exec(&["analysis.py"]);
    r.expect_code("exec analysis.py", 1);
    assert!(r.stderr.contains("NameError"), "{}", r.stderr);
    assert!(
        r.stderr.contains("cellhost run analysis.py") && r.stderr.contains("cellhost exec - < analysis.py"),
        "{}",
        r.stderr
    );
    let r = env.exec(&["--json", "analysis.py"]);
    let v: Value = serde_json::from_str(&r.stdout).expect("json");
    assert!(
        v["hint"]
            .as_str()
            .is_some_and(|h| h.contains("cellhost run analysis.py")),
        "{v}"
    );
    // Code that is not a file's path gets no such hint.
    let r = env.exec(&["analysis_py"]);
    assert!(!r.stderr.contains("cellhost run"), "{}", r.stderr);
}

#[test]
fn exec_json_ok() {
    let env = Env::new();
    let r = env.exec(&["--json", "print('hi')\n6 * 7"]);
    r.expect_code("--json ok", 0);
    let v = r.json();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["execution_count"], 1);
    assert_eq!(v["stdout"], "hi\n");
    assert_eq!(v["stderr"], "");
    assert_eq!(v["result"]["text/plain"], "42");
    assert_eq!(v["kernel"]["generation"], 1);
    assert_eq!(v["kernel"]["state_reset"], false);
    assert!(v["kernel"]["pid"].as_u64().is_some_and(|p| p > 1));
    assert!(v["error"].is_null());
    assert!(v.get("interrupt").is_none(), "interrupt on an ok cell: {v}");
}

#[test]
fn exec_json_error() {
    let env = Env::new();
    let r = env.exec(&["--json", "1/0"]);
    r.expect_code("--json error", 1);
    let v = r.json();
    assert_eq!(v["status"], "error");
    assert_eq!(v["error"]["ename"], "ZeroDivisionError");
    assert_eq!(v["error"]["evalue"], "division by zero");
    let tb = v["error"]["traceback"].as_array().expect("traceback list");
    assert!(!tb.is_empty());
}

#[test]
fn exec_json_timeout_keeps_state_when_interruptible() {
    let env = Env::new();
    let r = env.exec(&["--json", "--timeout", "1", "import time; time.sleep(10)"]);
    r.expect_code("--json timeout", 124);
    assert!(r.elapsed < Duration::from_secs(5), "took {:?}", r.elapsed);
    let v = r.json();
    assert_eq!(v["status"], "timeout");
    assert_eq!(v["kernel"]["generation"], 1);
    let i = &v["interrupt"];
    assert_eq!(i["delivered"], true, "{v}");
    assert_eq!(i["escalated"], false, "{v}");
    assert_eq!(i["state_kept"], true, "{v}");
    assert_eq!(v["error"]["ename"], "KeyboardInterrupt");
}

#[test]
fn exec_json_timeout_escalates_when_sigint_is_ignored() {
    let env = Env::new();
    let r = env.exec(&[
        "--json",
        "--timeout",
        "1",
        "import signal,time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(30)",
    ]);
    r.expect_code("SIG_IGN timeout", 124);
    // 1 s deadline + 2 s grace, then the kill.
    assert!(
        r.elapsed < Duration::from_secs(6),
        "escalation took {:?}",
        r.elapsed
    );
    assert!(r.elapsed >= Duration::from_secs(2), "no grace: {:?}", r.elapsed);
    let v = r.json();
    assert_eq!(v["status"], "timeout");
    let i = &v["interrupt"];
    assert_eq!(i["delivered"], true, "{v}");
    assert_eq!(i["escalated"], true, "{v}");
    assert_eq!(i["state_kept"], false, "{v}");
    let reason = i["reason"].as_str().unwrap_or_default();
    assert!(!reason.is_empty(), "escalated without a reason: {v}");
    assert!(
        reason.contains("SIG_IGN") || reason.contains("ignore"),
        "the reason does not say SIGINT was ignored: {reason}"
    );
}

#[test]
fn exec_json_crashed() {
    let env = Env::new();
    let r = env.exec(&["--json", "import os; os._exit(3)"]);
    r.expect_code("--json crash", 137);
    let v = r.json();
    assert_eq!(v["status"], "crashed");
    assert_eq!(v["crash"]["exit_code"], 3, "{v}");
}

// ---------------------------------------------------------------------------
// 2. Ctrl-C on exec

#[test]
fn exec_sigint_interrupts_running_cell_exits_130() {
    let env = Env::new();
    let run = Running::spawn(env.cmd(
        "exec",
        &["print('ru' + 'nning', flush=True)\nimport time\ntime.sleep(30)"],
    ));
    assert!(
        run.stdout
            .wait_for("running\n", 0, Duration::from_secs(60))
            .is_some(),
        "the cell never started; stderr: {}",
        run.stderr.text()
    );
    let sent = Instant::now();
    send_signal(run.pid(), "INT");
    let r = run.finish("exec after SIGINT", Duration::from_secs(10));
    r.expect_code("SIGINT", 130);
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "SIGINT took {:?} to end the cell",
        sent.elapsed()
    );
    assert!(r.stderr.contains("KeyboardInterrupt"), "{}", r.stderr);
    assert!(r.stderr.contains("state_kept=true"), "{}", r.stderr);
}

/// A Ctrl-C that arrives while the kernel is still starting is meant for
/// the cell: the result is `interrupted` (130, with JSON), not a host killed
/// by the signal.
#[test]
fn exec_sigint_during_kernel_startup_exits_130() {
    let env = Env::new();
    let mut run = Running::spawn(env.cmd("exec", &["--json", "import time; time.sleep(30)"]));
    // The kernel init is the host's first child: as soon as it exists the
    // host is past argument parsing and busy starting the kernel.
    let deadline = Instant::now() + Duration::from_secs(30);
    while descendants(run.pid()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no kernel process appeared; stderr: {}",
            run.stderr.text()
        );
        assert!(
            run.child.try_wait().expect("try_wait").is_none(),
            "cellhost exited early: {}",
            run.stderr.text()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    send_signal(run.pid(), "INT");
    let r = run.finish("exec, SIGINT during start-up", Duration::from_secs(15));
    r.expect_code("SIGINT during start-up", 130);
    let v = r.json();
    assert_eq!(v["status"], "interrupted", "{v}");
}

// ---------------------------------------------------------------------------
// 3. run

fn read_json(path: &Path) -> Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn code_cells(nb: &Value) -> Vec<&Value> {
    nb["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .filter(|c| c["cell_type"] == "code")
        .collect()
}

fn outputs(cell: &Value) -> &Vec<Value> {
    cell["outputs"].as_array().expect("outputs list")
}

/// `source`/`text` may be a string or a list of strings.
fn joined(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    }
}

fn stream_text(cell: &Value, name: &str) -> String {
    outputs(cell)
        .iter()
        .filter(|o| o["output_type"] == "stream" && o["name"] == name)
        .map(|o| joined(&o["text"]))
        .collect()
}

fn is_png_b64(v: &Value) -> bool {
    let s: String = joined(v).split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .is_ok_and(|b| b.starts_with(b"\x89PNG\r\n\x1a\n"))
}

fn png_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "png"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn run_percent_script_default_output() {
    let test = "run_percent_script_default_output";
    let env = Env::new();
    let plot = has_modules(&["matplotlib"]);
    let mut script =
        String::from("# %% [markdown]\n# A title\n\n# %%\nx = 21\n\n# %%\nprint('x is', x)\nx * 2\n");
    if plot {
        script.push_str(
            "\n# %%\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [x, 2, 5])\nplt.title('t')\nplt.show()\n",
        );
    } else {
        skip(test, "the matplotlib cell (matplotlib is not importable)");
    }
    let input = env.work().join("analysis.py");
    std::fs::write(&input, script).expect("write script");
    let r = env.run("run", &["analysis.py"], None, LONG);
    r.expect_code("run analysis.py", 0);
    let out = env.work().join("analysis.executed.ipynb");
    assert!(out.exists(), "no {} (stderr: {})", out.display(), r.stderr);
    let nb = read_json(&out);
    assert_eq!(nb["nbformat"], 4);
    let cells = code_cells(&nb);
    assert_eq!(cells.len(), if plot { 3 } else { 2 }, "{nb}");
    let counts: Vec<Value> = cells.iter().map(|c| c["execution_count"].clone()).collect();
    let want: Vec<Value> = (1..=cells.len()).map(|i| json!(i)).collect();
    assert_eq!(counts, want);
    assert!(outputs(cells[0]).is_empty(), "{}", cells[0]);
    assert_eq!(stream_text(cells[1], "stdout"), "x is 21\n");
    let res = outputs(cells[1])
        .iter()
        .find(|o| o["output_type"] == "execute_result")
        .expect("execute_result of x * 2");
    assert_eq!(joined(&res["data"]["text/plain"]), "42");
    assert_eq!(res["execution_count"], 2);
    // The markdown cell survives.
    assert!(
        nb["cells"]
            .as_array()
            .expect("cells")
            .iter()
            .any(|c| c["cell_type"] == "markdown" && joined(&c["source"]).contains("A title")),
        "markdown cell lost: {nb}"
    );
    if plot {
        let disp: Vec<&Value> = outputs(cells[2])
            .iter()
            .filter(|o| o["output_type"] == "display_data")
            .collect();
        assert_eq!(disp.len(), 1, "one figure expected: {}", cells[2]);
        assert!(is_png_b64(&disp[0]["data"]["image/png"]), "not a PNG");
        let files = png_files(&env.work().join("analysis.executed_files"));
        assert_eq!(files.len(), 1, "figure files: {files:?}");
    }
    assert!(r.stderr.contains("cell 1/"), "no progress: {}", r.stderr);
    validate_notebook(test, &out);
}

fn ipynb(cells: &[(&str, &str)]) -> String {
    let cells: Vec<Value> = cells
        .iter()
        .enumerate()
        .map(|(i, (kind, src))| {
            let mut c = json!({
                "cell_type": kind,
                "id": format!("cell-{i}"),
                "metadata": {},
                "source": src,
            });
            if *kind == "code" {
                c["execution_count"] = Value::Null;
                c["outputs"] = json!([{"output_type": "stream", "name": "stdout", "text": "stale\n"}]);
            }
            c
        })
        .collect();
    serde_json::to_string_pretty(&json!({
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5
    }))
    .expect("encode notebook")
}

#[test]
fn run_ipynb_with_output_flag() {
    let test = "run_ipynb_with_output_flag";
    let env = Env::new();
    let input = env.work().join("nb.ipynb");
    std::fs::write(
        &input,
        ipynb(&[
            ("markdown", "# Notes"),
            ("code", "import sys\nprint('out')\nprint('err', file=sys.stderr)"),
            (
                "code",
                "class H:\n    def _repr_html_(self):\n        return '<b>bold</b>'\n    def __repr__(self):\n        return 'H()'\ndisplay(H())\n'value'",
            ),
            ("raw", "raw text"),
            ("code", "y = [i * i for i in range(4)]\ny"),
        ]),
    )
    .expect("write notebook");
    let out = env.work().join("results/out.ipynb");
    let r = env.run(
        "run",
        &["nb.ipynb", "--output", out.to_str().expect("utf-8 path")],
        None,
        LONG,
    );
    r.expect_code("run nb.ipynb --output", 0);
    assert!(out.exists(), "no {}: {}", out.display(), r.stderr);
    assert!(
        !env.work().join("nb.executed.ipynb").exists(),
        "--output was ignored"
    );
    let nb = read_json(&out);
    assert_eq!(nb["cells"].as_array().expect("cells").len(), 5);
    let cells = code_cells(&nb);
    assert_eq!(cells.len(), 3);
    for (i, c) in cells.iter().enumerate() {
        assert_eq!(c["execution_count"], json!(i + 1), "{c}");
        assert!(
            !stream_text(c, "stdout").contains("stale"),
            "old outputs kept: {c}"
        );
    }
    assert_eq!(stream_text(cells[0], "stdout"), "out\n");
    assert_eq!(stream_text(cells[0], "stderr"), "err\n");
    let o = outputs(cells[1]);
    let d = o
        .iter()
        .find(|o| o["output_type"] == "display_data")
        .unwrap_or_else(|| panic!("no display_data: {}", cells[1]));
    assert_eq!(joined(&d["data"]["text/html"]), "<b>bold</b>");
    assert_eq!(joined(&d["data"]["text/plain"]), "H()");
    let e = o
        .iter()
        .find(|o| o["output_type"] == "execute_result")
        .unwrap_or_else(|| panic!("no execute_result: {}", cells[1]));
    assert_eq!(joined(&e["data"]["text/plain"]), "'value'");
    let e = outputs(cells[2])
        .iter()
        .find(|o| o["output_type"] == "execute_result")
        .expect("execute_result of y");
    assert_eq!(joined(&e["data"]["text/plain"]), "[0, 1, 4, 9]");
    assert_eq!(e["execution_count"], 3);
    validate_notebook(test, &out);
}

const FAILING: &str =
    "# %%\na = 1\n# %%\nprint('before')\nraise ValueError('boom')\n# %%\nprint('after', a)\n";

#[test]
fn run_stops_at_first_error_and_still_writes() {
    let test = "run_stops_at_first_error_and_still_writes";
    let env = Env::new();
    std::fs::write(env.work().join("fail.py"), FAILING).expect("write");
    let r = env.run("run", &["fail.py"], None, LONG);
    r.expect_code("run fail.py", 1);
    assert!(r.stderr.contains("ValueError: boom"), "{}", r.stderr);
    let out = env.work().join("fail.executed.ipynb");
    let nb = read_json(&out);
    let cells = code_cells(&nb);
    assert_eq!(cells.len(), 3);
    assert_eq!(cells[0]["execution_count"], 1);
    assert_eq!(cells[1]["execution_count"], 2);
    assert_eq!(stream_text(cells[1], "stdout"), "before\n");
    let err = outputs(cells[1])
        .iter()
        .find(|o| o["output_type"] == "error")
        .unwrap_or_else(|| panic!("no error output: {}", cells[1]));
    assert_eq!(err["ename"], "ValueError");
    assert_eq!(err["evalue"], "boom");
    assert!(!err["traceback"].as_array().expect("traceback").is_empty());
    assert!(cells[2]["execution_count"].is_null(), "{}", cells[2]);
    assert!(outputs(cells[2]).is_empty(), "{}", cells[2]);
    validate_notebook(test, &out);
}

#[test]
fn run_allow_errors_runs_every_cell() {
    let test = "run_allow_errors_runs_every_cell";
    let env = Env::new();
    std::fs::write(env.work().join("fail.py"), FAILING).expect("write");
    let r = env.run(
        "run",
        &["fail.py", "--allow-errors", "--output", "all.ipynb"],
        None,
        LONG,
    );
    r.expect_code("run --allow-errors", 0);
    let out = env.work().join("all.ipynb");
    let nb = read_json(&out);
    let cells = code_cells(&nb);
    let counts: Vec<Value> = cells.iter().map(|c| c["execution_count"].clone()).collect();
    assert_eq!(counts, vec![json!(1), json!(2), json!(3)]);
    assert!(
        outputs(cells[1]).iter().any(|o| o["output_type"] == "error"),
        "{}",
        cells[1]
    );
    // The namespace survived the error.
    assert_eq!(stream_text(cells[2], "stdout"), "after 1\n");
    validate_notebook(test, &out);
}

#[test]
fn run_timeout_per_cell_exits_124() {
    let test = "run_timeout_per_cell_exits_124";
    let env = Env::new();
    std::fs::write(
        env.work().join("slow.py"),
        "# %%\nimport time\n# %%\ntime.sleep(0.2)\n# %%\ntime.sleep(20)\n# %%\nprint('never')\n",
    )
    .expect("write");
    let r = env.run("run", &["slow.py", "--timeout", "1"], None, LONG);
    r.expect_code("run --timeout 1", 124);
    assert!(r.elapsed < Duration::from_secs(8), "took {:?}", r.elapsed);
    let out = env.work().join("slow.executed.ipynb");
    let nb = read_json(&out);
    let cells = code_cells(&nb);
    // The deadline is per cell: the short cell passed.
    assert_eq!(cells[1]["execution_count"], 2);
    assert!(
        !outputs(cells[1]).iter().any(|o| o["output_type"] == "error"),
        "{}",
        cells[1]
    );
    let err = outputs(cells[2])
        .iter()
        .find(|o| o["output_type"] == "error")
        .unwrap_or_else(|| panic!("no error output on the timed-out cell: {}", cells[2]));
    assert_eq!(err["ename"], "CellTimeout", "{err}");
    let evalue = err["evalue"].as_str().unwrap_or_default();
    assert!(evalue.contains("1 s"), "evalue does not give the limit: {evalue}");
    assert!(cells[3]["execution_count"].is_null(), "{}", cells[3]);
    validate_notebook(test, &out);
}

/// A cell that ignores SIGINT is killed at its deadline; with
/// `--allow-errors` the run goes on in a fresh kernel, and the notebook says
/// that the state was reset.
#[test]
fn run_escalated_timeout_with_allow_errors_marks_state_reset() {
    let test = "run_escalated_timeout_with_allow_errors_marks_state_reset";
    let env = Env::new();
    std::fs::write(
        env.work().join("stuck.py"),
        "# %%\na = 5\n# %%\nimport signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)\n# %%\nprint(globals().get('a'))\n",
    )
    .expect("write");
    let r = env.run(
        "run",
        &["stuck.py", "--timeout", "1", "--allow-errors"],
        None,
        LONG,
    );
    r.expect_code("run --timeout 1 --allow-errors", 0);
    assert!(r.elapsed < Duration::from_secs(10), "took {:?}", r.elapsed);
    let out = env.work().join("stuck.executed.ipynb");
    let nb = read_json(&out);
    let cells = code_cells(&nb);
    let err = outputs(cells[1])
        .iter()
        .find(|o| o["output_type"] == "error")
        .unwrap_or_else(|| panic!("no error output: {}", cells[1]));
    assert_eq!(err["ename"], "CellTimeout", "{err}");
    let evalue = err["evalue"].as_str().unwrap_or_default();
    assert!(evalue.contains("state is gone"), "{evalue}");
    assert!(evalue.contains("SIG_IGN"), "{evalue}");
    assert!(
        stream_text(cells[2], "stderr").contains("state reset"),
        "the notebook does not say the state was reset: {}",
        cells[2]
    );
    assert_eq!(stream_text(cells[2], "stdout"), "None\n");
    validate_notebook(test, &out);
}

#[test]
fn run_missing_input_is_a_usage_error() {
    let env = Env::new();
    let r = env.run("run", &["nope.ipynb"], None, Duration::from_secs(30));
    r.expect_code("run nope.ipynb", 2);
    assert!(r.stderr.contains("nope.ipynb"), "{}", r.stderr);
}

/// A notebook with a kernelspec and cells `(source, tags)`.
fn tagged_ipynb(kernelspec: Value, cells: &[(&str, &[&str])]) -> String {
    let cells: Vec<Value> = cells
        .iter()
        .enumerate()
        .map(|(i, (src, tags))| {
            json!({
                "cell_type": "code", "id": format!("c{i}"), "metadata": {"tags": tags},
                "source": src, "execution_count": null, "outputs": [],
            })
        })
        .collect();
    json!({"cells": cells, "metadata": {"kernelspec": kernelspec}, "nbformat": 4, "nbformat_minor": 5})
        .to_string()
}

/// A timestamp as nbclient writes it: `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
fn is_nbclient_stamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 27
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            26 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

#[test]
fn run_keeps_kernelspec_times_cells_and_injects_parameters() {
    let test = "run_keeps_kernelspec_times_cells_and_injects_parameters";
    let env = Env::new();
    let spec = json!({"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"});
    std::fs::write(
        env.work().join("nb.ipynb"),
        tagged_ipynb(
            spec.clone(),
            &[
                ("import sys", &[]),
                (
                    "alpha = 0.1\nn = 1\nname = 'default'\nflag = None",
                    &["parameters"],
                ),
                ("print(alpha, n, name, flag, type(big).__name__)", &[]),
                ("raise KeyError('expected')", &["raises-exception"]),
                ("print('after')", &[]),
            ],
        ),
    )
    .expect("write notebook");
    std::fs::write(env.work().join("p.yaml"), "n: 5\nname: from-file\n").expect("write parameters");
    let r = env.run(
        "run",
        &[
            "nb.ipynb",
            "--parameters-file",
            "p.yaml",
            "-p",
            "alpha",
            "0.6",
            "-p",
            "name",
            "cli",
            "-p",
            "flag",
            "True",
            "-p",
            "big",
            "12345678901234567890123",
        ],
        None,
        LONG,
    );
    r.expect_code("run with parameters", 0);
    let out = env.work().join("nb.executed.ipynb");
    let nb = read_json(&out);
    assert_eq!(nb["metadata"]["kernelspec"], spec, "kernelspec replaced");
    assert_eq!(nb["metadata"]["language_info"]["name"], "python");
    assert_eq!(
        nb["metadata"]["papermill"]["parameters"]["alpha"], 0.6,
        "{}",
        nb["metadata"]
    );
    let cells = code_cells(&nb);
    assert_eq!(cells.len(), 6);
    assert_eq!(cells[2]["metadata"]["tags"], json!(["injected-parameters"]));
    assert_eq!(
        joined(&cells[2]["source"]),
        "# Parameters\nn = 5\nname = \"cli\"\nalpha = 0.6\nflag = True\nbig = 12345678901234567890123\n"
    );
    assert_eq!(stream_text(cells[3], "stdout"), "0.6 5 cli True int\n");
    // `raises-exception` lets the run go on, as under nbclient.
    assert!(
        outputs(cells[4]).iter().any(|o| o["ename"] == "KeyError"),
        "{}",
        cells[4]
    );
    assert_eq!(stream_text(cells[5], "stdout"), "after\n");
    for c in &cells {
        let ex = &c["metadata"]["execution"];
        let keys = [
            "iopub.status.busy",
            "iopub.execute_input",
            "shell.execute_reply",
            "iopub.status.idle",
        ];
        let stamps: Vec<&str> = keys.iter().map(|k| ex[k].as_str().unwrap_or_default()).collect();
        assert!(stamps.iter().all(|s| is_nbclient_stamp(s)), "{ex}");
        // Fixed-width UTC stamps order as text: busy <= input <= reply <= idle.
        assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{ex}");
    }
    validate_notebook(test, &out);
}

#[test]
fn run_refuses_a_language_without_a_runtime() {
    let env = Env::new();
    let spec = json!({"name": "julia-1.10", "display_name": "Julia 1.10", "language": "julia"});
    std::fs::write(
        env.work().join("j.ipynb"),
        tagged_ipynb(spec, &[("println(1)", &[])]),
    )
    .expect("write");
    let r = env.run("run", &["j.ipynb"], None, Duration::from_secs(60));
    r.expect_code("run a Julia notebook", 2);
    assert!(r.stderr.contains("language is \"julia\""), "{}", r.stderr);
    assert!(r.stderr.contains("python, r"), "{}", r.stderr);
    assert!(
        !env.work().join("j.executed.ipynb").exists(),
        "a Julia notebook was run as another language"
    );
}

#[test]
fn run_parameter_mistakes_are_usage_errors() {
    let env = Env::new();
    std::fs::write(env.work().join("a.py"), "# %%\nprint(1)\n").expect("write");
    std::fs::write(env.work().join("list.yaml"), "- 1\n").expect("write");
    for (args, needle) in [
        (&["a.py", "-p", "1bad", "x"][..], "not a Python identifier"),
        (&["a.py", "--parameters-file", "missing.yaml"][..], "missing.yaml"),
        (&["a.py", "--parameters-file", "list.yaml"][..], "not a mapping"),
    ] {
        let r = env.run("run", args, None, Duration::from_secs(60));
        r.expect_code(&format!("run {args:?}"), 2);
        assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
    }
    assert!(!env.work().join("a.executed.ipynb").exists());
}

#[test]
fn run_penguins_example() {
    let test = "run_penguins_example";
    if !has_modules(&["pandas", "matplotlib", "palmerpenguins"]) {
        skip(
            test,
            "everything (pandas, matplotlib or palmerpenguins is not importable)",
        );
        return;
    }
    let env = Env::new();
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/penguins.ipynb");
    let input = input.canonicalize().expect("examples/penguins.ipynb");
    let out = env.work().join("penguins-out.ipynb");
    let r = env.run(
        "run",
        &[
            input.to_str().expect("utf-8 path"),
            "--output",
            out.to_str().expect("utf-8 path"),
        ],
        None,
        Duration::from_secs(300),
    );
    r.expect_code("run penguins.ipynb", 0);
    let nb = read_json(&out);
    let cells = code_cells(&nb);
    assert!(
        cells.iter().all(|c| c["execution_count"].is_number()),
        "a cell did not run"
    );
    assert!(
        !cells
            .iter()
            .any(|c| outputs(c).iter().any(|o| o["output_type"] == "error")),
        "an error output in the penguins notebook"
    );
    let pngs: Vec<&Value> = cells
        .iter()
        .flat_map(|c| outputs(c).iter())
        .filter(|o| o["data"].get("image/png").is_some())
        .collect();
    assert_eq!(pngs.len(), 2, "two figures expected");
    assert!(pngs.iter().all(|o| is_png_b64(&o["data"]["image/png"])));
    let files = png_files(&env.work().join("penguins-out_files"));
    assert_eq!(files.len(), 2, "figure files: {files:?}");
    for f in &files {
        let b = std::fs::read(f).expect("read figure");
        assert!(b.starts_with(b"\x89PNG"), "{} is not a PNG", f.display());
    }
    validate_notebook(test, &out);
}

// ---------------------------------------------------------------------------
// 4. Host death

/// Starts `cellhost exec` with a cell that starts a child, a `setsid`-ed
/// child and an orphaned grandchild, prints all pids, then runs `tail`.
/// Returns the running host and the processes seen under it.
fn start_tree(env: &Env, tail: &str) -> (Running, Vec<(String, Seen)>) {
    let gc_file = env.work().join("grandchild.pid");
    let code = format!(
        r#"import os, subprocess, time
a = subprocess.Popen(['sleep', '60'])
b = subprocess.Popen(['setsid', 'sleep', '60'])
os.system("sh -c 'sleep 60 & echo $! > {gc}'")
gc = open({gc:?}).read().strip()
print('PIDS', os.getpid(), a.pid, b.pid, gc, flush=True)
{tail}
"#,
        gc = gc_file.display()
    );
    let mut run = Running::spawn(env.cmd("exec", &[&code]));
    let end = run.stdout.wait_for("PIDS ", 0, Duration::from_secs(60));
    let end = end.unwrap_or_else(|| panic!("the cell did not print its pids: {}", run.stderr.text()));
    assert!(
        run.stdout.wait_for("\n", end, Duration::from_secs(10)).is_some(),
        "incomplete pid line"
    );
    let text = run.stdout.text();
    let line = text[end..].lines().next().expect("pid line").to_string();
    let pids: Vec<i32> = line
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert_eq!(pids.len(), 4, "pid line: {line}");
    // In the sandbox's pid namespace the cell sees its own pids: map them
    // to the host's through the `NSpid` line of each descendant.
    let pids: Vec<i32> = pids.iter().map(|p| host_pid(run.pid(), *p)).collect();
    let names = ["worker", "child", "setsid child", "orphaned grandchild"];
    let mut seen: Vec<(String, Seen)> = Vec::new();
    for (name, pid) in names.iter().zip(&pids) {
        let s = Seen::now(*pid).unwrap_or_else(|| panic!("the {name} ({pid}) is not alive"));
        seen.push((format!("{name} {pid}"), s));
    }
    // Everything else below the host: the kernel init, and whatever else.
    for (pid, starttime) in descendants(run.pid()) {
        if !pids.contains(&pid) {
            seen.push((format!("descendant {pid}"), Seen { pid, starttime }));
        }
    }
    run.also.extend(seen.iter().map(|(_, s)| *s));
    // The tree is what the test claims: the setsid child has its own
    // session, the grandchild's parent (sh) is gone.
    let b = seen[2].1.stat().expect("setsid child");
    assert_eq!(b.session, pids[2], "the setsid child did not start a session");
    let gc = seen[3].1.stat().expect("grandchild");
    assert_ne!(gc.ppid, pids[0], "the grandchild is not an orphan");
    (run, seen)
}

/// SIGKILLs the host and checks that within 2 s no process of the tree is
/// alive; zombies re-parented to pid 1 (which does not reap here) count as
/// dead and are reported.
fn kill_host_and_check(test: &str, mut run: Running, seen: &[(String, Seen)]) {
    let t0 = Instant::now();
    send_signal(run.pid(), "KILL");
    let st = run.wait_exit(Duration::from_secs(5)).expect("host exit");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(9),
        "host: {st:?}"
    );
    let deadline = t0 + Duration::from_secs(2);
    let leftovers = loop {
        let left: Vec<(&String, ProcStat)> = seen
            .iter()
            .filter_map(|(n, s)| s.stat().map(|st| (n, st)))
            .filter(|(_, st)| !(matches!(st.state, 'Z' | 'X') && st.ppid == 1))
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let zombies: Vec<&String> = seen
        .iter()
        .filter(|(_, s)| s.stat().is_some_and(|st| st.state == 'Z'))
        .map(|(n, _)| n)
        .collect();
    eprintln!(
        "note: {test}: {} processes tracked, settled in {:?}; zombies under pid 1 (not reaped by this machine's init): {} {zombies:?}",
        seen.len(),
        t0.elapsed(),
        zombies.len()
    );
    assert!(
        leftovers.is_empty(),
        "{test}: 2 s after the host's SIGKILL these are still alive or unreaped: {leftovers:?}"
    );
}

#[test]
fn host_sigkill_leaves_no_kernel_or_descendant() {
    let env = Env::new();
    let (run, seen) = start_tree(&env, "time.sleep(60)");
    kill_host_and_check("host_sigkill_leaves_no_kernel_or_descendant", run, &seen);
}

/// The worker's Python cannot react (it is stopped), so its control-channel
/// EOF handling cannot help: only the kernel init's parent-death signal can
/// clean up. This test fails if that mechanism is removed.
#[test]
fn host_sigkill_with_frozen_worker_leaves_nothing() {
    let env = Env::new();
    let (run, seen) = start_tree(
        &env,
        "import signal\nos.kill(os.getpid(), signal.SIGSTOP)\ntime.sleep(60)",
    );
    let worker = seen[0].1;
    let deadline = Instant::now() + Duration::from_secs(60);
    while worker.stat().is_some_and(|s| s.state != 'T') {
        assert!(Instant::now() < deadline, "the worker did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
    kill_host_and_check("host_sigkill_with_frozen_worker_leaves_nothing", run, &seen);
}

// ---------------------------------------------------------------------------
// 5. repl

#[test]
fn repl_with_piped_stdin() {
    let env = Env::new();
    let input = "x = 41\nx + 1\nfor i in range(3):\n    print('i', i)\n\nprint('done', x)\n";
    let r = env.run("repl", &[], Some(input), Duration::from_secs(60));
    r.expect_code("repl, stdin at EOF", 0);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines.contains(&"42"), "stdout: {}", r.stdout);
    let body: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("i ") || l.starts_with("done"))
        .collect();
    assert_eq!(body, vec!["i 0", "i 1", "i 2", "done 41"], "{}", r.stdout);
    let hist = std::fs::read_to_string(env.state().join("repl_history")).unwrap_or_default();
    assert!(hist.contains("x = 41"), "history: {hist}");
}

/// Under a real terminal (util-linux `script`): prompts, a multi-line block,
/// Ctrl-C interrupting a running cell but not the REPL (state kept), Ctrl-D
/// leaving with 0.
#[test]
fn repl_under_pty_ctrl_c_and_ctrl_d() {
    let test = "repl_under_pty_ctrl_c_and_ctrl_d";
    let has_script = Command::new("script")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_script {
        skip(test, "everything (util-linux `script` is not installed)");
        return;
    }
    let env = Env::new();
    // `exec`: the shell must not stay between `script` and the REPL (a
    // shell that saw the Ctrl-C would report 130 for itself).
    let inner = format!(
        "exec '{}' repl --python '{}'",
        env!("CARGO_BIN_EXE_cellhost"),
        python().display()
    );
    let mut c = Command::new("script");
    c.args(["-qfec", &inner, "/dev/null"])
        .env("TERM", "xterm")
        .env("SHELL", "/bin/sh");
    env.prepare(&mut c);
    let mut run = Running::spawn(c);
    let wait = Duration::from_secs(60);
    let out = run.stdout.clone();
    let expect = |needle: &str, from: usize| -> usize {
        out.wait_for(needle, from, wait)
            .unwrap_or_else(|| panic!("{test}: no {needle:?} after byte {from}; output:\n{}", out.text()))
    };
    let mut at = expect("In [1]: ", 0);
    run.write("x = 41\r");
    at = expect("In [2]: ", at);
    run.write("x + 1\r");
    at = expect("42\r\n", at);
    at = expect("In [3]: ", at);
    run.write("for i in range(2):\r");
    at = expect("...: ", at);
    run.write("    print('i', i * 10)\r");
    at = expect("...: ", at);
    run.write("\r");
    at = expect("i 0\r\n", at);
    at = expect("i 10\r\n", at);
    at = expect("In [4]: ", at);
    run.write("print('ru' + 'nning', flush=True); import time; time.sleep(30)\r");
    at = expect("running\r\n", at);
    let sent = Instant::now();
    run.write("\x03");
    at = expect("KeyboardInterrupt", at);
    at = expect("In [5]: ", at);
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "Ctrl-C took {:?}",
        sent.elapsed()
    );
    run.write("x\r");
    at = expect("41\r\n", at);
    expect("In [6]: ", at);
    run.write("\x04");
    let r = run.finish("repl under script", Duration::from_secs(20));
    r.expect_code("repl, Ctrl-D", 0);
}

/// `repl` under a pty (util-linux `script`) with `cmd` before the REPL.
fn spawn_repl(env: &Env) -> Running {
    let inner = format!(
        "exec '{}' repl --python '{}'",
        env!("CARGO_BIN_EXE_cellhost"),
        python().display()
    );
    let mut c = Command::new("script");
    c.args(["-qfec", &inner, "/dev/null"])
        .env("TERM", "xterm")
        .env("SHELL", "/bin/sh");
    env.prepare(&mut c);
    Running::spawn(c)
}

/// Lines pasted without bracketed paste, or typed while a cell runs, all
/// run (none is dropped); a pasted block ends at a dedented line; history
/// is on disk as soon as a cell is entered and recalled by the next REPL.
#[test]
fn repl_under_pty_keeps_pasted_and_typed_ahead_lines_and_history() {
    let test = "repl_under_pty_keeps_pasted_and_typed_ahead_lines_and_history";
    let has_script = Command::new("script")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_script {
        skip(test, "everything (util-linux `script` is not installed)");
        return;
    }
    let env = Env::new();
    let wait = Duration::from_secs(60);
    let mut run = spawn_repl(&env);
    let out = run.stdout.clone();
    let expect = |needle: &str, from: usize| -> usize {
        out.wait_for(needle, from, wait)
            .unwrap_or_else(|| panic!("{test}: no {needle:?} after byte {from}; output:\n{}", out.text()))
    };
    let mut at = expect("In [1]: ", 0);
    // One write: a paste without bracketed-paste mode.
    run.write("x1 = 1\rx2 = 2\rprint('sum', x1 + x2)\r");
    at = expect("sum 3\r\n", at);
    at = expect("In [4]: ", at);
    run.write("def f():\r    return 'from f'\rf()\r");
    at = expect("'from f'", at);
    at = expect("In [5]: ", at);
    // A line typed while a cell runs: the cell waits for a file the test
    // creates only after the line was typed.
    run.write("import os, time\rprint('wai' + 'ting', flush=True)\rwhile not os.path.exists('go'): time.sleep(0.01)\r");
    at = expect("waiting\r\n", at);
    run.write("print('typed' + ' ahead')\r");
    // The entered lines are in the history file before the REPL ends.
    let history = env.state().join("repl_history");
    let deadline = Instant::now() + wait;
    while !std::fs::read_to_string(&history)
        .unwrap_or_default()
        .contains("os.path.exists('go')")
    {
        assert!(
            Instant::now() < deadline,
            "{test}: no history in {}",
            history.display()
        );
        std::thread::yield_now();
    }
    std::fs::write(env.work().join("go"), "").expect("go");
    at = expect("typed ahead\r\n", at);
    expect("In [", at);
    run.write("\x04");
    run.finish("repl, Ctrl-D", Duration::from_secs(20))
        .expect_code("repl, Ctrl-D", 0);

    // A new REPL recalls the last entry with the Up arrow.
    let mut run = spawn_repl(&env);
    let out = run.stdout.clone();
    let at = out
        .wait_for("In [1]: ", 0, wait)
        .unwrap_or_else(|| panic!("{test}: second repl: {}", out.text()));
    run.write("\x1b[A\r");
    out.wait_for("typed ahead\r\n", at, wait)
        .unwrap_or_else(|| panic!("{test}: history not recalled: {}", out.text()));
    run.write("\x04");
    run.finish("second repl", Duration::from_secs(20))
        .expect_code("second repl, Ctrl-D", 0);
}

// ---------------------------------------------------------------------------
// Sandbox: `--sandbox` and `doctor`

#[test]
fn doctor_reports_layers_and_promises_and_exits_by_them() {
    let env = Env::new();
    let out = env.cmd("doctor", &["--json"]).output().expect("doctor");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    let layers = v["layers"].as_array().expect("layers");
    for name in [
        "rlimits", "pidns", "netns", "mountns", "landlock", "seccomp", "cgroup",
    ] {
        assert!(layers.iter().any(|l| l["name"] == name), "{name} missing: {v}");
    }
    assert_eq!(v["checks"].as_array().map(Vec::len), Some(7), "{v}");
    let ready = v["enforce_ready"].as_bool().expect("enforce_ready");
    assert_eq!(out.status.code(), Some(if ready { 0 } else { 1 }), "{v}");
}

#[test]
fn exec_sandbox_flag_selects_the_mode() {
    let env = Env::new();
    let code = "import os\nprint(os.getpid() == 2)";
    let off = env
        .cmd("exec", &["--sandbox", "off", code])
        .output()
        .expect("exec");
    assert_eq!(String::from_utf8_lossy(&off.stdout), "False\n");
    let bad = env
        .cmd("exec", &["--sandbox", "strict", code])
        .output()
        .expect("exec");
    assert_eq!(bad.status.code(), Some(2));
    let auto = env.cmd("exec", &[code]).output().expect("exec");
    assert!(auto.status.success(), "{}", String::from_utf8_lossy(&auto.stderr));
}

// ---------------------------------------------------------------------------
// Secrets and environment from the command line

#[test]
fn hk31_secret_redaction_output_only() {
    const SECRET: &str = "sk-demo-3f9a1c7e5b2d4a6f8e0c";
    let env = Env::new();
    let cell0 = "import os\nsecret = os.environ['DEMO_TOKEN']\nprint('DEMO_TOKEN=' + secret)\nprint({'token': secret})\nprint(secret[:10], end='')\nprint(secret[10:])\nraise ValueError('bad token ' + secret)";
    let mut cmd = env.cmd("exec", &["--json", "--secret-env", "DEMO_TOKEN", cell0]);
    cmd.env("DEMO_TOKEN", SECRET);
    let r = Running::spawn(cmd).finish("exec --secret-env", LONG);
    r.expect_code("cell 0 raises", 1);
    assert!(
        !r.stdout.contains(SECRET) && !r.stdout.contains("3f9a1c7e5b2d4a6f8e0c"),
        "{}",
        r.stdout
    );
    assert!(!r.stderr.contains(SECRET));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(v["error"]["ename"], "ValueError");
    assert!(v["stdout"].as_str().expect("stdout").contains("DEMO_TOKEN="));
    let cell1 = "import os\nliteral = 'sk-demo-3f9a1c7e5b2d4a6f8e0c'\nprint(len(literal), literal == os.environ['DEMO_TOKEN'])";
    let mut cmd = env.cmd("exec", &["--secret-env", "DEMO_TOKEN", cell1]);
    cmd.env("DEMO_TOKEN", SECRET);
    let r = Running::spawn(cmd).finish("exec --secret-env", LONG);
    r.expect_code("cell 1", 0);
    assert_eq!(r.stdout, "28 True\n", "the cell's code runs unmodified");
}

#[test]
fn env_flag_passes_a_variable_through_the_allowlist() {
    let env = Env::new();
    let r = env.exec(&[
        "--env",
        "MY_SETTING=blue",
        "import os; print(os.environ.get('MY_SETTING'))",
    ]);
    r.expect_code("--env NAME=VALUE", 0);
    assert_eq!(r.stdout, "blue\n");
    let r = env.exec(&["--env", "CELLHOST_SURELY_UNSET_VAR", "print(1)"]);
    r.expect_code("--env of an unset variable is a usage error", 2);
}

// ---------------------------------------------------------------------------
// Regressions from a new-user review

/// `exec` without `--json` streams at most the head live, then the rest of
/// the bounded view: a huge output never floods the terminal.
#[test]
fn exec_live_output_is_bounded_like_the_result() {
    let env = Env::new();
    let r = env.exec(&["import sys; sys.stdout.write('x' * 1_000_000); print(); print('end')"]);
    r.expect_code("big output", 0);
    assert!(
        r.stdout.len() < 60_000,
        "stdout is bounded: {} bytes",
        r.stdout.len()
    );
    assert!(r.stdout.contains("omitted"), "the omission line is shown");
    assert!(r.stdout.ends_with("end\n"), "the tail is shown");
    assert!(r.stderr.contains("stdout cut:"), "{}", r.stderr);
    let small = env.exec(&["for i in range(3): print(i)"]);
    assert_eq!(small.stdout, "0\n1\n2\n", "small output is printed once, exactly");
}

/// Ctrl-C during `run` interrupts the cell, writes the notebook so far, and
/// exits 130 (it used to kill the process and lose every executed cell).
#[test]
fn run_sigint_writes_what_ran_and_exits_130() {
    let env = Env::new();
    let input = env.work().join("slow.py");
    std::fs::write(&input, "# %%\nx = 1\nprint('first done', flush=True)\n\n# %%\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)\n\n# %%\nprint('never')\n")
        .expect("write script");
    let run = Running::spawn(env.cmd("run", &["slow.py"]));
    assert!(
        run.stderr
            .wait_for("cell 1/3 ok", 0, Duration::from_secs(60))
            .is_some(),
        "the first cell never finished; stderr: {}",
        run.stderr.text()
    );
    // Whether the SIGINT lands while cell 2 runs, before its code starts,
    // or between the cells, the run stops there.
    send_signal(run.pid(), "INT");
    let r = run.finish("run after SIGINT", Duration::from_secs(20));
    r.expect_code("SIGINT", 130);
    let nb = read_json(&env.work().join("slow.executed.ipynb"));
    let cells = code_cells(&nb);
    assert_eq!(cells[0]["execution_count"], 1);
    assert!(cells[0]["outputs"].to_string().contains("first done"));
    assert!(
        cells[1]["outputs"] == json!([]) || cells[1]["outputs"].to_string().contains("CellInterrupted"),
        "cell 2 is either not run or interrupted: {}",
        cells[1]
    );
    assert_eq!(cells[2]["outputs"], json!([]));
}

/// Background output of earlier cells' threads is marked in the notebook,
/// never merged into the later cell's stream (HK07 through `run`).
#[test]
fn run_marks_background_output_of_earlier_cells() {
    let env = Env::new();
    let input = env.work().join("bg.py");
    std::fs::write(&input, "# %%\nimport threading, time\ndef ticker():\n    for i in range(3):\n        time.sleep(0.3)\n        print(f'tick {i}', flush=True)\nthreading.Thread(target=ticker, daemon=True).start()\nprint('A returned')\n\n# %%\nimport time\ntime.sleep(1.5)\nprint('B done')\n")
        .expect("write script");
    let r = env.run("run", &["bg.py"], None, LONG);
    r.expect_code("run bg.py", 0);
    let nb = read_json(&env.work().join("bg.executed.ipynb"));
    let cells = code_cells(&nb);
    let outs = cells[1]["outputs"].as_array().expect("outputs").clone();
    let stream: Vec<&Value> = outs.iter().filter(|o| o["output_type"] == "stream").collect();
    assert_eq!(stream.len(), 1, "{outs:?}");
    assert_eq!(stream[0]["text"], json!(["B done\n"]));
    let bg = outs
        .iter()
        .find(|o| o["output_type"] == "display_data")
        .expect("background display");
    assert_eq!(bg["metadata"]["cellhost"]["background"], "stdout");
    let text = bg["data"]["text/plain"].to_string();
    for i in 0..3 {
        assert!(text.contains(&format!("tick {i}")), "{text}");
    }
}

/// Regression: as root with `umask 077`, every sandboxed kernel failed to
/// start ("cannot execute the interpreter"): the kernel's root was built
/// with the host user's umask, closing its directories to the kernel's own
/// uid. The root is built with umask 022; the worker keeps the user's.
#[test]
fn sandboxed_kernel_starts_under_a_strict_umask_and_keeps_it() {
    let env = Env::new();
    let c = env.cmd(
        "exec",
        &[
            "--sandbox",
            "auto",
            "import os; print('umask', oct(os.umask(0o22)))",
        ],
    );
    let mut argv = vec![c.get_program().to_string_lossy().into_owned()];
    argv.extend(c.get_args().map(|a| a.to_string_lossy().into_owned()));
    let quoted: Vec<String> = argv
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect();
    let mut sh = Command::new("sh");
    sh.arg("-c").arg(format!("umask 077; exec {}", quoted.join(" ")));
    env.prepare(&mut sh);
    let o = sh.output().expect("run under umask 077");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout: {out}\nstderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.trim(), "umask 0o77", "the worker keeps the user's umask");
}

/// R on PATH with jsonlite (what `run` picks without `--r`), else `false`
/// (said so).
fn r_on_path(test: &str) -> bool {
    let ok = Command::new("R")
        .args([
            "--no-echo",
            "-e",
            "quit(status = !requireNamespace('jsonlite', quietly = TRUE))",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(test, "R runs (no R with jsonlite on PATH)");
    }
    ok
}

/// `cellhost run` of an R notebook (kernelspec `ir`) runs it in R: the
/// console's printing, a plot as an image/png display, the value of the
/// last expression as execute_result, the kernelspec kept; a `.R` script in
/// percent format runs in R too; `history` of the run's session says R.
#[test]
fn run_executes_an_r_notebook_and_an_r_percent_script() {
    let test = "run_executes_an_r_notebook_and_an_r_percent_script";
    if !r_on_path(test) {
        return;
    }
    let env = Env::new();
    let spec = json!({"name": "ir", "display_name": "R", "language": "R"});
    std::fs::write(
        env.work().join("rnb.ipynb"),
        tagged_ipynb(
            spec.clone(),
            &[
                ("x <- c(1, 2, 3)", &[]),
                ("print(mean(x))", &[]),
                ("plot(x)", &[]),
                ("stop('expected')", &["raises-exception"]),
                ("summary(x)", &[]),
            ],
        ),
    )
    .expect("write notebook");
    let r = env.run("run", &["rnb.ipynb"], None, LONG);
    r.expect_code("run an R notebook", 0);
    let out = env.work().join("rnb.executed.ipynb");
    let nb = read_json(&out);
    assert_eq!(nb["metadata"]["kernelspec"], spec, "kernelspec replaced");
    let cells = code_cells(&nb);
    assert_eq!(cells.len(), 5);
    assert_eq!(stream_text(cells[1], "stdout"), "[1] 2\n");
    assert!(
        outputs(cells[2])
            .iter()
            .any(|o| o["output_type"] == "display_data" && o["data"]["image/png"].is_string()),
        "{}",
        cells[2]
    );
    assert!(
        outputs(cells[3]).iter().any(|o| o["ename"] == "simpleError"),
        "{}",
        cells[3]
    );
    let last = outputs(cells[4])
        .iter()
        .find(|o| o["output_type"] == "execute_result")
        .cloned()
        .unwrap_or_default();
    assert!(joined(&last["data"]["text/plain"]).contains("Median"), "{last}");
    validate_notebook(test, &out);
    let mut c = Command::new(env!("CARGO_BIN_EXE_cellhost"));
    c.args(["history", "rnb", "--json"]);
    env.prepare(&mut c);
    let h = Running::spawn(c).finish("cellhost history rnb --json", Duration::from_secs(60));
    h.expect_code("history of the run", 0);
    let h: Value = serde_json::from_str(&h.stdout).expect("history JSON");
    assert_eq!(h["language"], "r", "{h}");

    std::fs::write(
        env.work().join("script.R"),
        "# %%\ny <- 2\n# %%\ncat(y * 21, '\\n')\n# %%\nrev(letters[1:3])\n",
    )
    .expect("write script");
    let r = env.run("run", &["script.R", "--output", "script.ipynb"], None, LONG);
    r.expect_code("run a .R percent script", 0);
    let nb = read_json(&env.work().join("script.ipynb"));
    let cells = code_cells(&nb);
    assert_eq!(cells.len(), 3);
    assert_eq!(stream_text(cells[1], "stdout"), "42 \n");
    let last = outputs(cells[2])
        .iter()
        .find(|o| o["output_type"] == "execute_result")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        joined(&last["data"]["text/plain"]),
        "[1] \"c\" \"b\" \"a\"",
        "{last}"
    );
}
