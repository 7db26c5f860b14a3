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
