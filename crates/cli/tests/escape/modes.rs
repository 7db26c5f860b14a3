//! Item 8: the sandbox mode asked for is the mode the kernel gets, on every
//! surface — one-shot `exec`, `exec --session` (the daemon), `run`, `mcp`
//! (stdio), `serve` (HTTP) — for each of `off`, `auto`, `enforce`: the
//! result's `kernel.sandbox.mode` says the requested mode. With a layer
//! disabled by the config (`sandbox_disable`), `enforce` is refused with a
//! clear error naming the layer on every surface, never started weaker.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Env, is_root, python, text, wait_gone};

/// What a surface did with a cell.
#[derive(Debug)]
enum Outcome {
    /// It ran; the result's `kernel` object.
    Ran(Value),
    /// The kernel was refused; the message.
    Refused(String),
}

const CELL: &str = "print('mode-probe')";

/// A child process killed (SIGTERM, then SIGKILL) and reaped on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let pid = self.0.id() as i32;
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
        }
        if !wait_gone(pid, Duration::from_secs(10)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

fn exec_one_shot(env: &Env, mode: &str) -> Outcome {
    let py = python();
    let o = env.run(&["exec", "--python", &py, "--json", "--sandbox", mode, CELL]);
    match serde_json::from_slice::<Value>(&o.stdout) {
        Ok(v) => Outcome::Ran(v["kernel"].clone()),
        Err(_) => Outcome::Refused(text(&o)),
    }
}

fn exec_session(env: &Env, mode: &str) -> Outcome {
    let py = python();
    let session = format!("s-{mode}");
    let o = env.run(&[
        "exec",
        "--python",
        &py,
        "--session",
        &session,
        "--json",
        "--sandbox",
        mode,
        CELL,
    ]);
    // The daemon's floor is the mode it was started with: each mode gets a
    // daemon of its own here (raising the floor is daemon_peer's test).
    if let Some(pid) = env.daemon_pid() {
        let _ = env.run(&["daemon", "stop"]);
        assert!(wait_gone(pid, Duration::from_secs(20)), "the daemon did not stop");
    }
    match serde_json::from_slice::<Value>(&o.stdout) {
        Ok(v) => Outcome::Ran(v["kernel"].clone()),
        Err(_) => Outcome::Refused(text(&o)),
    }
}

fn run_notebook(env: &Env, mode: &str) -> Outcome {
    let py = python();
    let script = env.path().join(format!("nb-{mode}.py"));
    std::fs::write(&script, format!("# %%\n{CELL}\n")).expect("script");
    let out = env.path().join(format!("nb-{mode}.ipynb"));
    let o = env.run(&[
        "run",
        "--python",
        &py,
        "--sandbox",
        mode,
        "--output",
        out.to_str().expect("utf-8"),
        script.to_str().expect("utf-8"),
    ]);
    let nb: Option<Value> = std::fs::read(&out)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    match nb {
        Some(nb) if o.status.success() => {
            Outcome::Ran(json!({"sandbox": nb["metadata"]["cellhost"]["sandbox"]}))
        }
        _ => Outcome::Refused(text(&o)),
    }
}

fn mcp_stdio(env: &Env, mode: &str) -> Outcome {
    let py = python();
    let mut c = env.cmd(&["mcp", "--python", &py, "--sandbox", mode]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut g = Guard(c.spawn().expect("spawn mcp"));
    let mut stdin = g.0.stdin.take().expect("stdin");
    let stdout = g.0.stdout.take().expect("stdout");
    let msgs = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "escape-modes", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "execute_code", "arguments": {"code": CELL}}}),
    ];
    for m in msgs {
        writeln!(stdin, "{m}").expect("write");
    }
    stdin.flush().expect("flush");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["id"] != 2 {
            continue;
        }
        drop(stdin);
        let r = &v["result"];
        if r["isError"] == true || r["structuredContent"].is_null() {
            return Outcome::Refused(r.to_string());
        }
        return Outcome::Ran(r["structuredContent"]["kernel"].clone());
    }
    Outcome::Refused("the MCP server closed without answering".into())
}

/// `cellhost serve` on an ephemeral port: the guard, its URL and token.
fn start_serve(env: &Env, mode: &str) -> (Guard, String, String) {
    let py = python();
    let mut c = env.cmd(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--python",
        &py,
        "--sandbox",
        mode,
    ]);
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut g = Guard(c.spawn().expect("spawn serve"));
    let stderr = g.0.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let until = Instant::now() + Duration::from_secs(60);
    let mut addr = None;
    while addr.is_none() && Instant::now() < until {
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(1))
            && let Some(rest) = line.split("serving http://").nth(1)
        {
            addr = rest.split('/').next().map(str::to_string);
        }
    }
    let addr = addr.expect("serve says where it listens");
    let tokens = std::fs::read_to_string(env.state_dir().join("server/tokens")).expect("tokens");
    let token = tokens
        .lines()
        .find(|l| l.starts_with("local "))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("a token")
        .to_string();
    (g, format!("http://{addr}"), token)
}

fn curl(args: &[&str]) -> String {
    let o = Command::new("curl").args(args).output().expect("curl");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn serve_http(env: &Env, mode: &str) -> Outcome {
    let (_g, url, token) = start_serve(env, mode);
    let auth = format!("Authorization: Bearer {token}");
    let created = curl(&[
        "-s",
        "-X",
        "POST",
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"name": "m"}"#,
        &format!("{url}/v1/sessions"),
    ]);
    // Creating the session starts its kernel: a refusal shows here.
    if serde_json::from_str::<Value>(&created).is_ok_and(|v| v["error"]["code"].is_string()) {
        return Outcome::Refused(created);
    }
    let body = json!({"code": CELL}).to_string();
    let out = curl(&[
        "-s",
        "-X",
        "POST",
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        &body,
        &format!("{url}/v1/sessions/m/execute"),
    ]);
    match serde_json::from_str::<Value>(&out) {
        Ok(v) if v["kernel"].is_object() => Outcome::Ran(v["kernel"].clone()),
        Ok(v) if v["result"]["kernel"].is_object() => Outcome::Ran(v["result"]["kernel"].clone()),
        _ => Outcome::Refused(out),
    }
}

type Surface = (&'static str, fn(&Env, &str) -> Outcome);

const SURFACES: &[Surface] = &[
    ("exec", exec_one_shot),
    ("exec --session", exec_session),
    ("run", run_notebook),
    ("mcp", mcp_stdio),
    ("serve http", serve_http),
];

fn have_curl() -> bool {
    Command::new("curl").arg("--version").output().is_ok()
}

#[test]
fn escape_8_every_surface_applies_the_requested_mode() {
    assert!(have_curl(), "the serve rows need curl");
    let env = Env::new();
    let mut table = Vec::new();
    for (name, surface) in SURFACES {
        for mode in ["off", "auto", "enforce"] {
            let got = surface(&env, mode);
            table.push(format!("{name:>15} × {mode:<7} → {got:?}"));
            match got {
                Outcome::Ran(k) => assert_eq!(k["sandbox"]["mode"], mode, "{name} × {mode}: {k}"),
                // Only enforce may be refused, only where this machine
                // cannot enforce every layer (never as root here), and
                // the refusal says the sandbox is why.
                Outcome::Refused(why) => assert!(
                    mode == "enforce" && !is_root() && why.contains("sandbox"),
                    "{name} × {mode} refused: {why}"
                ),
            }
        }
    }
    eprintln!("{}", table.join("\n"));
    // The host serves on: a cell runs.
    let (code, v) = env.exec_json(&["--sandbox", "auto"], "print(1)");
    assert_eq!(code, 0, "{v}");
}

#[test]
fn escape_8_enforce_with_a_disabled_layer_is_refused_on_every_surface() {
    assert!(have_curl(), "the serve rows need curl");
    let env = Env::new();
    std::fs::write(env.path().join("config.toml"), "sandbox_disable = \"seccomp\"\n").expect("config");
    for (name, surface) in SURFACES {
        match surface(&env, "enforce") {
            Outcome::Ran(k) => panic!("{name}: enforce ran without seccomp: {k}"),
            Outcome::Refused(why) => assert!(
                why.contains("seccomp") || (!is_root() && why.contains("sandbox")),
                "{name}: the refusal does not say why: {why}"
            ),
        }
        // The same configuration in mode auto runs, and says what is missing.
        match surface(&env, "auto") {
            Outcome::Ran(k) => {
                assert_eq!(k["sandbox"]["mode"], "auto", "{name}: {k}");
                let missing = k["sandbox"]["missing"].to_string();
                assert!(missing.contains("seccomp"), "{name}: {k}");
            }
            Outcome::Refused(why) => panic!("{name}: auto refused: {why}"),
        }
    }
}
