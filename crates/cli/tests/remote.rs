//! Remote kernels through the real `cellhost` binary: `exec --placement`
//! with a `[placement.NAME]` table of kind `loopback` (the agent is this
//! build's `cellhost agent`, a child process), the host killed with
//! SIGKILL (the agent kills its worker after its grace), the agent killed
//! (the cell is `crashed` with `reason: connection lost`, the next kernel
//! says `state_reset`).
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cellhost_kernel::{CellStatus, ExecOptions, KernelConfig, LiveEvent, Session};
use cellhost_remote::{
    AnyPlacement, HostIdentity, HostOptions, LoopbackPlacement, MemoryNonces, RemoteHost, RemoteStarter,
};
use cellhost_sandbox::profile::SandboxMode;
use serde_json::Value;

use cellhost_testkit::procs::{pid_gone, ppid, wait_gone, wait_line};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cellhost")
}

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().expect("tmp");
        let cfg = format!(
            "[placement.lo]\nkind = \"loopback\"\nprogram = {:?}\nargs = [\"--connect-grace\", \"1s\"]\n",
            bin()
        );
        std::fs::write(dir.path().join("config.toml"), cfg).expect("config");
        Env { dir }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args)
            .current_dir(self.dir.path())
            .env("CELLHOST_STATE_DIR", self.dir.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("CELLHOST_CONFIG", self.dir.path().join("config.toml"))
            .env_remove("CELLHOST_PLACEMENT");
        c
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

#[test]
fn exec_with_a_placement_runs_the_cell_through_a_node_agent() {
    let env = Env::new();
    let py = python();
    let o = env
        .cmd(&[
            "exec",
            "--python",
            &py,
            "--json",
            "--placement",
            "lo",
            "x = 20\nx * 2 + 2",
        ])
        .output()
        .expect("exec");
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(o.status.code(), Some(0), "{v}");
    assert_eq!(v["result"]["text/plain"], "42", "{v}");
    assert_eq!(v["kernel"]["placement"]["kind"], "loopback", "{v}");
    assert_eq!(v["kernel"]["placement"]["name"], "lo", "{v}");
    assert!(
        v["kernel"]["placement"]["job"]
            .as_str()
            .is_some_and(|j| !j.is_empty()),
        "{v}"
    );
}

#[test]
fn an_unknown_placement_is_a_usage_error() {
    let env = Env::new();
    let py = python();
    let o = env
        .cmd(&["exec", "--python", &py, "--placement", "nowhere", "1"])
        .output()
        .expect("exec");
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown placement `nowhere`"), "{err}");
}

#[test]
fn host_sigkill_makes_the_agent_kill_its_worker_after_the_grace() {
    let env = Env::new();
    let py = python();
    let pids = env.path().join("pids");
    let code = format!(
        "import os, time\nopen({:?}, 'w').write(f'{{os.getpid()}} {{os.getppid()}}\\n')\ntime.sleep(300)",
        pids.display()
    );
    let mut host = env
        .cmd(&[
            "exec",
            "--python",
            &py,
            "--sandbox",
            "off",
            "--placement",
            "lo",
            &code,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("host");
    let line = wait_line(&pids);
    let mut it = line.split_whitespace().map(|p| p.parse::<i32>().expect("pid"));
    let (worker, init) = (it.next().expect("worker"), it.next().expect("init"));
    let agent = ppid(init).expect("ppid");
    assert!(!pid_gone(worker) && !pid_gone(agent));
    host.kill().expect("SIGKILL the host");
    let _ = host.wait();
    assert!(wait_gone(worker), "worker {worker} outlived the host");
    assert!(wait_gone(agent), "agent {agent} outlived the host");
}

async fn remote_session(dir: &Path) -> (Session, RemoteHost) {
    let host = RemoteHost::start(
        HostOptions::default(),
        HostIdentity::generate().expect("certificate"),
        Arc::new(MemoryNonces::default()),
    )
    .await
    .expect("listener");
    let placement = LoopbackPlacement::with_program(bin(), vec!["--connect-grace".into(), "1s".into()]);
    let mut cfg = KernelConfig::new(python(), dir.join("session"));
    cfg.session = "remote".into();
    cfg.sandbox.mode = SandboxMode::Off;
    cfg.starter = Some(Arc::new(RemoteStarter::new(
        "lo",
        host.clone(),
        AnyPlacement::Loopback(placement),
        None,
    )));
    (Session::new(cfg), host)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_is_a_lost_connection_and_the_next_kernel_says_state_reset() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut session, _host) = remote_session(dir.path()).await;
    let r = session.execute("x = 1", ExecOptions::default()).await.expect("x");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    let place = session
        .kernel()
        .and_then(|k| k.info().placement.clone())
        .expect("placement");
    let agent: i32 = place.job.parse().expect("the loopback job is the agent's pid");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = ExecOptions {
        live: Some(tx),
        ..ExecOptions::default()
    };
    let cell = session
        .submit("import time\nprint('go', flush=True)\ntime.sleep(300)", opts)
        .await
        .expect("submit");
    while let Some(ev) = rx.recv().await {
        if matches!(&ev, LiveEvent::Stdout(s) if s.contains("go")) {
            break;
        }
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(agent).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill the agent");
    let r = session.finish(cell).await.expect("the cell settles");
    assert_eq!(r.status, CellStatus::Crashed, "{r:?}");
    let crash = r.crash.clone().expect("crash report");
    assert_eq!(crash.reason.as_deref(), Some("connection lost"), "{crash:?}");
    let r = session
        .execute("'x' in dir()", ExecOptions::default())
        .await
        .expect("next");
    assert!(r.kernel.state_reset, "{r:?}");
    assert_eq!(r.kernel.generation, 2);
    assert_eq!(
        r.result.as_ref().and_then(|m| m.get("text/plain")).cloned(),
        Some(serde_json::json!("False"))
    );
    session.shutdown().await;
}

/// Stops the test's daemon, also when the test fails.
struct DaemonGuard<'a>(&'a Env);

impl Drop for DaemonGuard<'_> {
    fn drop(&mut self) {
        let _ = self.0.cmd(&["daemon", "stop"]).output();
    }
}

#[test]
fn daemon_sessions_keep_their_placement_and_list_and_history_show_where_they_ran() {
    let env = Env::new();
    let cfg = format!(
        "[placement]\ndefault = \"lo\"\n[placement.lo]\nkind = \"loopback\"\nprogram = {:?}\n",
        bin()
    );
    std::fs::write(env.path().join("config.toml"), cfg).expect("config");
    std::fs::create_dir_all(env.path().join("run")).expect("run dir");
    let _daemon = DaemonGuard(&env);
    let py = python();
    let exec = |args: &[&str]| -> (Option<i32>, Value, String) {
        let mut all = vec!["exec", "--python", py.as_str(), "--json"];
        all.extend_from_slice(args);
        let o = env.cmd(&all).output().expect("exec --session");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        (o.status.code(), v, err)
    };
    // The configured default: the session runs on the loopback agent.
    let (code, v, err) = exec(&["--session", "s1", "y = 2\ny * 21"]);
    assert_eq!(code, Some(0), "{v} {err}");
    assert_eq!(v["result"]["text/plain"], "42", "{v}");
    assert_eq!(v["kernel"]["placement"]["name"], "lo", "{v}");
    let job = v["kernel"]["placement"]["job"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!job.is_empty(), "{v}");
    // Naming the session's own placement reuses it (state kept).
    let (code, v, err) = exec(&["--session", "s1", "--placement", "lo", "y + 1"]);
    assert_eq!(code, Some(0), "{v} {err}");
    assert_eq!(v["result"]["text/plain"], "3", "{v}");
    // Another placement for a running session is a typed usage error.
    let (code, _, err) = exec(&["--session", "s1", "--placement", "local", "1"]);
    assert_eq!(code, Some(2), "refused as usage: {err}");
    assert!(
        err.contains("placement_mismatch") || err.contains("keeps the placement"),
        "{err}"
    );
    // A session created with `--placement local` runs on this host.
    let (code, v, err) = exec(&[
        "--session",
        "s2",
        "--placement",
        "local",
        "import os\nos.getpid()",
    ]);
    assert_eq!(code, Some(0), "{v} {err}");
    assert!(v["kernel"].get("placement").is_none(), "a local kernel: {v}");
    // An unknown placement names the configured ones.
    let (code, _, err) = exec(&["--session", "s3", "--placement", "nowhere", "1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown placement `nowhere`"), "{err}");

    let o = env.cmd(&["sessions", "--json"]).output().expect("sessions");
    let list: Value = serde_json::from_slice(&o.stdout).expect("sessions JSON");
    let s1 = list
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == "s1"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(s1["placement"]["kind"], "loopback", "{list}");
    assert_eq!(s1["placement"]["job"], job.as_str(), "{list}");
    let s2 = list
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == "s2"))
        .cloned()
        .unwrap_or(Value::Null);
    assert!(s2.get("placement").is_none(), "{list}");
    let o = env.cmd(&["sessions"]).output().expect("sessions");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("(lo loopback job {job})")), "{text}");

    // The journal says where each generation ran.
    let o = env.cmd(&["history", "s1", "--json"]).output().expect("history");
    let h: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("history JSON ({e}): {}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(h["kernels"][0]["placement"]["name"], "lo", "{h}");
    assert_eq!(h["kernels"][0]["placement"]["job"], job.as_str(), "{h}");
    let o = env.cmd(&["history", "s1"]).output().expect("history");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("(lo loopback job {job})")), "{text}");
    let o = env.cmd(&["history", "s2", "--json"]).output().expect("history");
    let h: Value = serde_json::from_slice(&o.stdout).expect("history JSON");
    assert!(h["kernels"][0].get("placement").is_none(), "{h}");
}

/// `cellhost serve`, killed and reaped on drop.
struct Serve(std::process::Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn curl(args: &[&str]) -> (String, Value) {
    let mut all = vec!["-s", "-w", "\n%{http_code}"];
    all.extend_from_slice(args);
    let o = Command::new("curl").args(&all).output().expect("curl");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, status) = out.rsplit_once('\n').unwrap_or(("", ""));
    (
        status.to_string(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[test]
fn http_sessions_are_created_on_a_named_placement_and_list_where_they_run() {
    use std::io::{BufRead, BufReader};
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skipped: curl is not installed");
        return;
    }
    let env = Env::new();
    let mut child = env
        .cmd(&["serve", "--listen", "127.0.0.1:0", "--python", &python()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let stderr = child.stderr.take().expect("stderr");
    let _serve = Serve(child);
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(rest) = line.split("serving http://").nth(1) {
                    break rest.split('/').next().unwrap_or_default().to_string();
                }
            }
            _ => panic!("serve ended before it said where it listens"),
        }
    };
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let tokens = std::fs::read_to_string(env.path().join("state/server/tokens")).expect("tokens");
    let token = tokens
        .lines()
        .find(|l| l.starts_with("local "))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("a token")
        .to_string();
    let auth = format!("Authorization: Bearer {token}");
    let url = format!("http://{addr}/v1/sessions");
    let post = |path: &str, body: &str| {
        curl(&[
            "-H",
            &auth,
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            &format!("{url}{path}"),
        ])
    };
    let (status, v) = post("", r#"{"name": "r1", "placement": "lo"}"#);
    assert_eq!(status, "201", "{v}");
    assert_eq!(v["placement"]["name"], "lo", "{v}");
    assert_eq!(v["placement"]["kind"], "loopback", "{v}");
    let job = v["placement"]["job"].as_str().unwrap_or_default().to_string();
    assert!(!job.is_empty() && v["placement"]["node"] != "", "{v}");
    let (status, v) = post("/r1/execute", r#"{"code": "x = 20\nx + 22"}"#);
    assert_eq!(status, "200", "{v}");
    assert_eq!(v["result"]["text/plain"], "42", "{v}");
    assert_eq!(v["kernel"]["placement"]["job"], job.as_str(), "{v}");
    let (status, v) = post("", r#"{"name": "r2"}"#);
    assert_eq!(status, "201", "{v}");
    assert!(
        v.get("placement").is_none(),
        "the default placement is local: {v}"
    );
    let (status, v) = curl(&["-H", &auth, &url]);
    assert_eq!(status, "200", "{v}");
    let r1 = v["sessions"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == "r1"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(r1["placement"]["job"], job.as_str(), "{v}");
    let (status, v) = post("", r#"{"name": "r3", "placement": "nowhere"}"#);
    assert_eq!(status, "400", "{v}");
    assert_eq!(v["error"]["code"], "bad_request", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown placement `nowhere`")),
        "{v}"
    );
    // The refused session was not kept.
    let (_, v) = curl(&["-H", &auth, &url]);
    assert!(
        v["sessions"]
            .as_array()
            .is_some_and(|l| l.iter().all(|s| s["name"] != "r3")),
        "{v}"
    );
}

#[test]
fn a_daemon_session_keeps_its_placement_after_its_agent_is_killed() {
    let env = Env::new();
    std::fs::create_dir_all(env.path().join("run")).expect("run dir");
    let _daemon = DaemonGuard(&env);
    let py = python();
    let exec = |args: &[&str]| -> Value {
        let mut all = vec!["exec", "--python", py.as_str(), "--json", "--session", "s"];
        all.extend_from_slice(args);
        let o = env.cmd(&all).output().expect("exec --session");
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stderr)))
    };
    // The default is local; the session is created on the loopback agent.
    let v = exec(&["--placement", "lo", "x = 1"]);
    assert_eq!(v["status"], "ok", "{v}");
    let agent: i32 = v["kernel"]["placement"]["job"]
        .as_str()
        .and_then(|j| j.parse().ok())
        .unwrap_or_else(|| panic!("the loopback job is the agent's pid: {v}"));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(agent).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill the agent");
    assert!(wait_gone(agent), "agent {agent} killed");
    // The daemon notices the lost connection: the session has no live kernel.
    let mut listed = true;
    for _ in 0..600 {
        let o = env.cmd(&["sessions", "--json"]).output().expect("sessions");
        let list: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        listed = list
            .as_array()
            .is_some_and(|l| l.iter().any(|s| s["name"] == "s"));
        if !listed {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!listed, "the session's kernel is gone after its agent");
    // Without --placement the next kernel runs where the session was created.
    let v = exec(&["'x' in dir()"]);
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["kernel"]["placement"]["name"], "lo", "{v}");
    assert_eq!(v["kernel"]["state_reset"], true, "{v}");
    assert_eq!(v["kernel"]["generation"], 2, "{v}");
    assert_eq!(v["result"]["text/plain"], "False", "{v}");
}
