//! The shell workflow through the per-user daemon: `exec --session` keeps
//! state across separate invocations, exit codes by status, `sessions`,
//! `kill`, `interrupt`, Ctrl-C, `daemon stop`, SIGTERM and the idle exit.
//! Each test has its own state and runtime directories and stops its
//! daemon.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

struct Env {
    dir: TempDir,
}

impl Env {
    fn new(idle_s: &str) -> Env {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("run")).expect("run dir");
        std::fs::write(dir.path().join("idle"), idle_s).expect("idle");
        std::fs::write(dir.path().join("config.toml"), "").expect("config");
        Env { dir }
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run/cellhost")
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        let idle = std::fs::read_to_string(self.dir.path().join("idle")).unwrap_or_default();
        c.args(args)
            .env("CELLHOST_STATE_DIR", self.dir.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("CELLHOST_DAEMON_IDLE_S", idle.trim())
            .env("CELLHOST_CONFIG", self.dir.path().join("config.toml"))
            .env_remove("CELLHOST_LOG")
            .current_dir(self.dir.path());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run cellhost")
    }

    fn exec(&self, session: &str, code: &str) -> Output {
        self.run(&["exec", "--python", &python(), "--session", session, code])
    }

    fn exec_json(&self, session: &str, code: &str) -> (i32, Value) {
        let o = self.run(&[
            "exec",
            "--python",
            &python(),
            "--session",
            session,
            "--json",
            code,
        ]);
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)));
        (o.status.code().unwrap_or(-1), v)
    }

    fn daemon_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.run_dir().join("daemon.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    fn sessions(&self) -> Value {
        let o = self.run(&["sessions", "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("sessions JSON")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let pid = self.daemon_pid();
        let _ = self.run(&["daemon", "stop"]);
        if let Some(pid) = pid
            && !wait_gone(pid, Duration::from_secs(10))
        {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z")
}

fn wait_gone(pid: i32, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    !alive(pid)
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
}

#[test]
fn state_persists_across_invocations_with_exit_codes() {
    let env = Env::new("600");
    let o = env.exec("ana", "x = 41\nprint('set')");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "set\n");
    assert_eq!(mode(&env.run_dir().join("daemon.sock")), 0o600);
    assert_eq!(mode(&env.run_dir()), 0o700);
    let daemon = env.daemon_pid().expect("daemon pid");

    let o = env.exec("ana", "x + 1");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("42"), "{}", text(&o));

    let (code, v) = env.exec_json("ana", "x");
    assert_eq!(code, 0);
    assert_eq!(v["result"]["text/plain"], "41");
    assert_eq!(v["kernel"]["reused"], true);
    let kernel_pid = v["kernel"]["pid"].as_i64().expect("pid") as i32;

    // Another session is another namespace.
    let o = env.exec("other", "x");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("NameError"),
        "{}",
        text(&o)
    );

    let o = env.run(&[
        "exec",
        "--session",
        "ana",
        "--timeout",
        "0.5",
        "import time; time.sleep(10)",
    ]);
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    let (code, v) = env.exec_json("ana", "x");
    assert_eq!(
        (code, v["result"]["text/plain"].clone()),
        (0, "41".into()),
        "state kept after the timeout"
    );

    let o = env.run(&["exec", "--session", "ana", "--timeout", "-1", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    let o = env.exec("crash", "import os; os.kill(os.getpid(), 9)");
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));

    let s = env.sessions();
    let names: Vec<&str> = s
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|x| x["name"].as_str())
        .collect();
    assert!(names.contains(&"ana") && names.contains(&"other"), "{s}");
    let table = env.run(&["sessions"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("ana"));

    let o = env.run(&["kill", "ana"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        wait_gone(kernel_pid, Duration::from_secs(10)),
        "kill reaps the kernel"
    );
    let o = env.run(&["kill", "ana"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = env.exec("ana", "x");
    assert_eq!(
        o.status.code(),
        Some(1),
        "a killed session starts empty: {}",
        text(&o)
    );

    // The journal is shared with `cellhost history`.
    let h = env.run(&["history", "ana", "--json"]);
    assert_eq!(h.status.code(), Some(0), "{}", text(&h));
    assert!(String::from_utf8_lossy(&h.stdout).contains("x = 41"));

    let o = env.run(&["daemon", "stop"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(wait_gone(daemon, Duration::from_secs(10)), "daemon exits on stop");
    assert!(!env.run_dir().join("daemon.sock").exists());
}

fn spawn_sleeper(env: &Env, session: &str) -> Child {
    env.cmd(&[
        "exec",
        "--python",
        &python(),
        "--session",
        session,
        "import time\nprint('sleeping', flush=True)\ntime.sleep(60)",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn exec")
}

fn wait_busy(env: &Env, session: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        let s = env.sessions();
        if s.as_array()
            .is_some_and(|a| a.iter().any(|x| x["name"] == session && x["busy"] == true))
        {
            std::thread::sleep(Duration::from_millis(200));
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("session {session} never became busy");
}

#[test]
fn interrupt_and_ctrl_c_keep_state() {
    let env = Env::new("600");
    assert_eq!(env.exec("s", "keep = 'kept'").status.code(), Some(0));

    let child = spawn_sleeper(&env, "s");
    wait_busy(&env, "s");
    let o = env.run(&["interrupt", "s"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));

    // Ctrl-C on the exec process interrupts the daemon's cell.
    let child = spawn_sleeper(&env, "s");
    wait_busy(&env, "s");
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));

    let (code, v) = env.exec_json("s", "keep");
    assert_eq!(code, 0);
    assert_eq!(v["result"]["text/plain"], "'kept'");
    let o = env.run(&["interrupt", "nosuch"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn idle_exit_and_sigterm_reap_every_kernel() {
    let env = Env::new("1");
    let (code, v) = env.exec_json("a", "1");
    assert_eq!(code, 0);
    let kernel = v["kernel"]["pid"].as_i64().expect("pid") as i32;
    let daemon = env.daemon_pid().expect("daemon");
    assert!(
        wait_gone(daemon, Duration::from_secs(20)),
        "daemon exits when idle"
    );
    assert!(
        wait_gone(kernel, Duration::from_secs(10)),
        "its kernels are reaped"
    );
    assert!(!env.run_dir().join("daemon.sock").exists());

    // The next exec starts a new daemon; SIGTERM shuts it down cleanly.
    std::fs::write(env.dir.path().join("idle"), "600").expect("idle");
    let (code, v) = env.exec_json("a", "2");
    assert_eq!(code, 0);
    assert_eq!(v["kernel"]["generation"], 2, "journal numbering continues: {v}");
    let kernel = v["kernel"]["pid"].as_i64().expect("pid") as i32;
    let daemon2 = env.daemon_pid().expect("daemon");
    assert_ne!(daemon, daemon2);
    let st = Command::new("kill")
        .args(["-TERM", &daemon2.to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    assert!(
        wait_gone(daemon2, Duration::from_secs(20)),
        "daemon exits on SIGTERM"
    );
    assert!(
        wait_gone(kernel, Duration::from_secs(10)),
        "SIGTERM reaps the kernels"
    );
    let o = env.run(&["sessions", "--json"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
}

/// A session works in the directory `exec --session` was run from, never in
/// the one the daemon was started from; the same name from another
/// directory is another session, which cannot reach the first one's files.
#[test]
fn session_works_in_the_callers_directory() {
    let env = Env::new("60");
    let a = env.dir.path().join("a");
    let b = env.dir.path().join("b");
    std::fs::create_dir_all(&a).expect("a");
    std::fs::create_dir_all(&b).expect("b");
    std::fs::write(a.join("secret.txt"), "project a").expect("write");
    let in_dir = |dir: &Path, session: &str, code: &str| {
        env.cmd(&["exec", "--python", &python(), "--session", session, code])
            .current_dir(dir)
            .output()
            .expect("run cellhost")
    };
    // The daemon starts from a.
    let o = in_dir(&a, "x", "import os; print(os.getcwd())");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        a.canonicalize().expect("a").display().to_string()
    );
    // Session y from b works in b, and a's files are not there for it.
    let o = in_dir(
        &b,
        "y",
        "import os; print(os.getcwd()); print(os.path.exists('secret.txt'))",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            b.canonicalize().expect("b").display().to_string().as_str(),
            "False"
        ],
        "{}",
        text(&o)
    );
    // Session x from b is another session than x in a: x's state stays in a.
    let o = in_dir(&a, "x", "marker = 'a'");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = in_dir(&b, "x", "import os; print(os.getcwd()); print('marker' in dir())");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.ends_with("False\n") && out.contains(&*b.canonicalize().expect("b").to_string_lossy()),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("a session is per directory"),
        "{}",
        text(&o)
    );
    // A hostile client naming a directory that is none is refused; the
    // daemon goes on.
    let dir = env.run_dir();
    let reply = common_request(
        &dir,
        r#"{"op":"exec","session":"z","code":"1","cwd":"relative/dir"}"#,
    );
    assert!(
        reply.contains("bad_request") && reply.contains("absolute"),
        "{reply}"
    );
    let reply = common_request(
        &dir,
        &format!(
            r#"{{"op":"exec","session":"z","code":"1","cwd":"{}"}}"#,
            a.join("secret.txt").display()
        ),
    );
    assert!(
        reply.contains("bad_request") && reply.contains("not a directory"),
        "{reply}"
    );
    let o = in_dir(&a, "x", "print(marker)");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "a", "{}", text(&o));
}

/// `kill NAME` and `interrupt NAME` reach only the session of that name
/// working in the caller's directory (the daemon keys a session by it), and
/// from a directory where it does not run they are refused with the
/// directories it runs in.
#[test]
fn kill_and_interrupt_reach_only_the_callers_directory() {
    let env = Env::new("600");
    let a = env.dir.path().join("a");
    let b = env.dir.path().join("b");
    let c = env.dir.path().join("c");
    for d in [&a, &b, &c] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let in_dir = |dir: &Path, args: &[&str]| env.cmd(args).current_dir(dir).output().expect("run cellhost");
    let exec = |dir: &Path, code: &str| in_dir(dir, &["exec", "--python", &python(), "--session", "x", code]);
    assert_eq!(exec(&a, "mark = 'a'").status.code(), Some(0));
    assert_eq!(exec(&b, "mark = 'b'").status.code(), Some(0));

    // From c: refused, naming both directories; nothing is killed.
    let o = in_dir(&c, &["kill", "x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for d in [&a, &b] {
        let d = d.canonicalize().expect("dir");
        assert!(err.contains(&*d.to_string_lossy()), "{err}");
    }

    // A cell runs in b's x; an interrupt from a finds a's idle x only.
    let child = env
        .cmd(&[
            "exec",
            "--python",
            &python(),
            "--session",
            "x",
            "import time\nprint('sleeping', flush=True)\ntime.sleep(60)",
        ])
        .current_dir(&b)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn exec");
    wait_busy(&env, "x");
    let o = in_dir(&a, &["interrupt", "x"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "not delivered to a's idle x: {}",
        text(&o)
    );
    let o = in_dir(&b, &["interrupt", "x"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));

    // kill from a ends a's x only: b's keeps its state, a's starts afresh.
    let o = in_dir(&a, &["kill", "x"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = exec(&b, "print(mark)");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "b", "{}", text(&o));
    let o = exec(&a, "print('mark' in dir())");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "False", "{}", text(&o));
    let o = env.run(&["daemon", "stop"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// One raw request line to the daemon in `dir`; the first reply line.
fn common_request(dir: &Path, line: &str) -> String {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(dir.join("daemon.sock")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s.write_all(format!("{line}\n").as_bytes()).expect("write");
    let mut r = std::io::BufReader::new(s);
    let mut out = String::new();
    r.read_line(&mut out).expect("read");
    out
}

/// `--env` and `--secret-env` reach the session they create, also when the
/// daemon runs already; a session that runs keeps its environment and the
/// client is told; the secret is masked and never in the daemon's log.
#[test]
fn env_flags_apply_to_new_sessions_of_a_running_daemon() {
    let env = Env::new("60");
    let o = env.exec("first", "1");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let token = "tok-3f9a1c27e5b8";
    let code = "import os; print(os.environ.get('MYVAR')); print(os.environ.get('MYTOK'))";
    let o = env
        .cmd(&[
            "exec",
            "--python",
            &python(),
            "--session",
            "s1",
            "--env",
            "MYVAR=hello",
            "--secret-env",
            "MYTOK",
            code,
        ])
        .env("MYTOK", token)
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"hello"), "{}", text(&o));
    assert!(
        lines.get(1).is_some_and(|l| *l != "None" && !l.contains(token)),
        "{}",
        text(&o)
    );
    // The first session has none of them.
    let o = env.exec("first", code);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "None\nNone\n", "{}", text(&o));
    // s1 again with another value: it keeps its own, and says so.
    let o = env.run(&[
        "exec",
        "--python",
        &python(),
        "--session",
        "s1",
        "--env",
        "MYVAR=other",
        code,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("hello\n"),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("session s1 already runs; --env/--secret-env apply to new sessions only"),
        "{}",
        text(&o)
    );
    // The same flags again: no note.
    let o = env.run(&[
        "exec",
        "--python",
        &python(),
        "--session",
        "s1",
        "--env",
        "MYVAR=hello",
        "1",
    ]);
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("already runs"),
        "{}",
        text(&o)
    );
    // A malformed request carrying a secret is refused without echoing it.
    let reply = common_request(
        &env.run_dir(),
        &format!(
            r#"{{"op":"exec","session":"z","code":"1","env":[{{"name":"A","value":"{token}","secret":7}}]}}"#
        ),
    );
    assert!(reply.contains("bad_request") && !reply.contains(token), "{reply}");
    let log = std::fs::read_to_string(env.run_dir().join("daemon.log")).unwrap_or_default();
    assert!(!log.contains(token), "the daemon log holds the secret:\n{log}");
}

/// `daemon stop` returns once the daemon has exited, so an `exec --session`
/// right after starts a new one at once (never the 30 s wait for a socket
/// nobody opens); repeated, with a kernel to shut down each time.
#[test]
fn stop_then_exec_at_once_starts_a_new_daemon() {
    let env = Env::new("60");
    let mut last = None;
    for round in 0..4 {
        let o = env.exec("s", &format!("print({round})"));
        assert_eq!(o.status.code(), Some(0), "round {round}: {}", text(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), round.to_string());
        let pid = env.daemon_pid().expect("daemon pid");
        assert_ne!(Some(pid), last, "round {round}: the old daemon answered");
        let o = env.run(&["daemon", "stop"]);
        assert_eq!(o.status.code(), Some(0), "round {round}: {}", text(&o));
        assert!(
            !alive(pid),
            "round {round}: daemon stop returned before the daemon exited"
        );
        last = Some(pid);
    }
}

/// The daemon of `env` run with `XDG_RUNTIME_DIR` (and `TMPDIR`) replaced;
/// stopped with the same environment on drop.
struct OtherRuntime<'a> {
    env: &'a Env,
    xdg: PathBuf,
    tmp: PathBuf,
}

impl OtherRuntime<'_> {
    fn run(&self, args: &[&str]) -> Output {
        self.env
            .cmd(args)
            .env("XDG_RUNTIME_DIR", &self.xdg)
            .env("TMPDIR", &self.tmp)
            .output()
            .expect("run cellhost")
    }
}

impl Drop for OtherRuntime<'_> {
    fn drop(&mut self) {
        let _ = self.run(&["daemon", "stop"]);
    }
}

fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").expect("/proc/self").uid()
}

#[test]
fn unusable_xdg_runtime_dir_falls_back_and_errors_name_the_path() {
    let env = Env::new("600");
    let base = env.dir.path();
    let tmp = base.join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let open = base.join("open");
    std::fs::create_dir_all(&open).expect("open");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let mut bad = vec![base.join("missing"), open, base.join("config.toml")];
    if my_uid() == 0 {
        // Another user's directory, as after `su` or `sudo -u`.
        let theirs = base.join("theirs");
        std::fs::create_dir_all(&theirs).expect("theirs");
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
        bad.push(theirs);
    } else {
        bad.push(PathBuf::from("/"));
    }
    let fallback = base.join("state/run");
    for xdg in bad {
        let rt = OtherRuntime {
            env: &env,
            xdg: xdg.clone(),
            tmp: tmp.clone(),
        };
        let o = rt.run(&["exec", "--python", &python(), "--session", "s", "print('ok')"]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "XDG_RUNTIME_DIR={}: {}",
            xdg.display(),
            text(&o)
        );
        assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n");
        assert!(
            fallback.join("daemon.sock").exists(),
            "the socket is in {}",
            fallback.display()
        );
        assert_eq!(mode(&fallback), 0o700);
        let o = rt.run(&["daemon", "stop"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }

    // The state directory's `run` cannot be made either: the last
    // fallback is TMPDIR/cellhost-<uid>, and one someone else made first
    // (here: a file) is refused with its path.
    std::fs::remove_dir_all(&fallback).expect("rm run");
    std::fs::write(&fallback, b"not a directory").expect("block run");
    let last = tmp.join(format!("cellhost-{}", my_uid()));
    let rt = OtherRuntime {
        env: &env,
        xdg: base.join("missing"),
        tmp: tmp.clone(),
    };
    let o = rt.run(&["exec", "--python", &python(), "--session", "s", "print('ok')"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(last.join("daemon.sock").exists());
    assert_eq!(mode(&last), 0o700);
    let o = rt.run(&["daemon", "stop"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    std::fs::remove_dir_all(&last).expect("rm last");
    std::fs::write(&last, b"planted").expect("plant");
    let o = rt.run(&["exec", "--python", &python(), "--session", "s", "print('ok')"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&last.display().to_string()),
        "names the directory: {err}"
    );
}

/// `cellhost restore` of an R session replays its cells in R (the journal
/// recorded the session's language), and `history` names it; skipped, said
/// so, without R and jsonlite on PATH.
#[test]
fn restore_replays_an_r_session_in_r() {
    let r_ok = Command::new("R")
        .args([
            "--no-echo",
            "-e",
            "quit(status = !requireNamespace('jsonlite', quietly = TRUE))",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !r_ok {
        eprintln!("skipped: no R with jsonlite on PATH");
        return;
    }
    let env = Env::new("120");
    for code in ["x <- 20", "y <- x + 1"] {
        let o = env.run(&["exec", "--session", "rr", "--language", "r", code]);
        assert_eq!(o.status.code(), Some(0), "{code}: {}", text(&o));
    }
    let o = env.run(&["kill", "rr"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["restore", "rr", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rep: Value = serde_json::from_slice(&o.stdout).expect("restore JSON");
    assert_eq!(rep["replayed"].as_array().map(Vec::len), Some(2), "{rep}");
    let o = env.run(&["exec", "--session", "rr", "x + y"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[1] 41\n", "{}", text(&o));
    let o = env.run(&["history", "rr"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(", r):"),
        "{}",
        text(&o)
    );
}

/// `exec --session --checkpoint namespace`: a SIGKILLed kernel comes back
/// from its checkpoint; `cellhost pause` stops the kernel, and after the
/// daemon restarted the next `exec` resumes the session; `sessions` lists
/// it paused in between (also while no daemon runs).
#[test]
fn checkpoint_restore_and_pause_survive_a_daemon_restart() {
    let env = Env::new("600");
    let o = env.run(&[
        "exec",
        "--python",
        &python(),
        "--session",
        "ck",
        "--checkpoint",
        "namespace",
        "rows = [1, 2, 3]\nimport json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.exec("ck", "rows.append(4)\nimport os; os.kill(os.getpid(), 9)");
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));
    let (code, v) = env.exec_json("ck", "json.dumps(rows)");
    assert_eq!(code, 0, "{v}");
    assert_eq!(
        v["result"]["text/plain"], "'[1, 2, 3]'",
        "from the checkpoint: {v}"
    );
    assert_eq!(v["restored"]["execution_count"], 1, "{v}");
    let pid = v["kernel"]["pid"].as_i64().expect("pid") as i32;

    let o = env.run(&["pause", "ck"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("paused session ck"),
        "{}",
        text(&o)
    );
    assert!(
        wait_gone(pid, Duration::from_secs(10)),
        "the paused kernel is gone"
    );
    let o = env.run(&["pause", "ck"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a paused session has no kernel to pause: {}",
        text(&o)
    );

    let paused = |env: &Env| {
        let l = env.sessions();
        let ck = l
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == "ck").cloned())
            .unwrap_or_else(|| panic!("the paused session is listed: {l}"));
        assert_eq!(ck["state"], "paused", "{l}");
        assert!(ck["paused_ms"].as_i64().unwrap_or(0) > 0, "{l}");
        assert_eq!(ck["checkpoint"]["execution_count"], 2, "{l}");
    };
    paused(&env);

    let daemon = env.daemon_pid().expect("daemon pid");
    let o = env.run(&["daemon", "stop"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(wait_gone(daemon, Duration::from_secs(10)));
    // No daemon runs: the journal still lists the session paused.
    paused(&env);
    let o = env.run(&["sessions"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("paused"),
        "{}",
        text(&o)
    );
    let (code, v) = env.exec_json("ck", "json.dumps(rows)");
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["result"]["text/plain"], "'[1, 2, 3]'", "{v}");
    assert_eq!(v["restored"]["resumed"], true, "{v}");
    let l = env.sessions();
    assert_eq!(l[0]["state"], "live", "resumed: {l}");
    let o = env.run(&["exec", "--session", "ck", "--checkpoint", "process", "1"]);
    assert_eq!(o.status.code(), Some(1), "process mode is refused: {}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("CRIU"),
        "{}",
        text(&o)
    );
}
