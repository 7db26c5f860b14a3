//! Item 1, daemon side: a kernel that reaches the daemon's socket (the path
//! is learnt from its environment or passed in the cell) must get nothing
//! from it — no unconfined kernel, no list of sessions, no kill — while
//! the daemon and its other sessions keep working; and no legitimate
//! client may lower the daemon's sandbox floor.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use serde_json::Value;

use crate::common::{Env, python, text};

/// A cell that connects to `sock` once per hostile request and prints
/// `{"requests": [{"connected", "reply" | "error"}...]}` as JSON.
fn attack_cell(sock: &str) -> String {
    format!(
        r#"
import json, socket
SOCK = {sock:?}
reqs = [
    {{"op": "exec", "session": "pwn", "code": "print(open('/etc/hostname').read())", "sandbox": "off"}},
    {{"op": "sessions"}},
    {{"op": "kill", "session": "victim"}},
]
out = []
for q in reqs:
    r = {{"connected": False}}
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(SOCK)
        r["connected"] = True
        s.sendall((json.dumps(q) + "\n").encode())
        f = s.makefile("rb")
        line = f.readline()
        r["reply"] = json.loads(line) if line else None
        s.close()
    except OSError as e:
        r["error"] = repr(e)
    out.append(r)
print("ATTACK" + json.dumps(out))
"#
    )
}

/// The attack's outcome from a cell's stdout.
fn outcome(v: &Value) -> Vec<Value> {
    let out = v["stdout"].as_str().unwrap_or_default();
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("ATTACK"))
        .unwrap_or_else(|| panic!("the attack cell printed no outcome: {v}"));
    serde_json::from_str(line).expect("outcome JSON")
}

/// Every request either could not reach the socket or was refused with
/// `peer_refused` (nothing else answered); returns how many connected.
fn assert_refused(results: &[Value], ctx: &str) -> usize {
    assert_eq!(results.len(), 3, "{ctx}: {results:?}");
    let mut connected = 0;
    for r in results {
        if r["connected"] == true {
            connected += 1;
            let reply = &r["reply"];
            assert_eq!(
                reply["event"], "error",
                "{ctx}: the daemon answered a kernel: {r}"
            );
            assert_eq!(reply["code"], "peer_refused", "{ctx}: {r}");
        } else {
            assert!(r["error"].is_string(), "{ctx}: {r}");
        }
    }
    connected
}

impl Env {
    fn session_json(&self, session: &str, mode: &str, code: &str) -> (i32, Value) {
        self.exec_json(&["--session", session, "--sandbox", mode], code)
    }

    fn sock(&self) -> String {
        self.run_dir().join("daemon.sock").display().to_string()
    }

    /// The victim session still has its state and the daemon still serves.
    fn assert_healthy(&self, mode: &str, daemon: i32) {
        let (code, v) = self.session_json("victim", mode, "print(x + 1)");
        assert_eq!(code, 0, "{v}");
        assert_eq!(v["stdout"], "42\n", "the victim session lost its state: {v}");
        assert_eq!(self.daemon_pid(), Some(daemon), "the daemon was replaced");
        let o = self.run(&["sessions", "--json"]);
        let list: Value = serde_json::from_slice(&o.stdout).expect("sessions JSON");
        let names: Vec<&str> = list
            .as_array()
            .map(|a| a.iter().filter_map(|s| s["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(names.contains(&"victim"), "{}", text(&o));
        assert!(
            !names.contains(&"pwn"),
            "a kernel created a session: {}",
            text(&o)
        );
    }
}

/// Starts the daemon with floor `mode` and a victim session holding `x = 41`.
fn start_victim(env: &Env, mode: &str) -> i32 {
    let (code, v) = env.session_json("victim", mode, "x = 41");
    assert_eq!(code, 0, "{v}");
    env.daemon_pid().expect("daemon pid")
}

#[test]
fn escape_1_daemon_refuses_its_own_session_kernel_auto() {
    let env = Env::new();
    let daemon = start_victim(&env, "auto");
    let (code, v) = env.session_json("attacker", "auto", &attack_cell(&env.sock()));
    assert_eq!(code, 0, "{v}");
    let connected = assert_refused(&outcome(&v), "daemon session, auto");
    eprintln!("auto session kernel: {connected}/3 connects reached the socket");
    env.assert_healthy("auto", daemon);
}

#[test]
fn escape_1_daemon_refuses_its_own_session_kernel_off() {
    let env = Env::new();
    // A daemon whose floor is off: its kernels see the host's files, the
    // socket included; the peer check alone must keep them out.
    let daemon = start_victim(&env, "off");
    let (code, v) = env.session_json("attacker", "off", &attack_cell(&env.sock()));
    assert_eq!(code, 0, "{v}");
    let connected = assert_refused(&outcome(&v), "daemon session, off");
    assert_eq!(connected, 3, "an unsandboxed kernel reaches the socket: {v}");
    env.assert_healthy("off", daemon);
}

#[test]
fn escape_1_daemon_refuses_a_one_shot_kernel_auto_and_off() {
    let env = Env::new();
    let daemon = start_victim(&env, "off");
    for mode in ["auto", "off"] {
        let (code, v) = env.exec_json(&["--sandbox", mode], &attack_cell(&env.sock()));
        assert_eq!(code, 0, "{v}");
        let connected = assert_refused(&outcome(&v), &format!("one-shot exec, {mode}"));
        if mode == "off" {
            assert_eq!(connected, 3, "an unsandboxed kernel reaches the socket: {v}");
        }
        env.assert_healthy("off", daemon);
    }
}

/// One request from this (legitimate) process; the first reply.
fn call(env: &Env, req: &Value) -> Value {
    let mut s = UnixStream::connect(env.run_dir().join("daemon.sock")).expect("connect");
    s.write_all(format!("{req}\n").as_bytes()).expect("send");
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).expect("reply");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("reply {line:?}: {e}"))
}

#[test]
fn escape_1_daemon_refuses_a_request_below_its_floor() {
    let env = Env::new();
    let daemon = start_victim(&env, "auto");
    // The CLI: exit 2 and a message naming the floor.
    let py = python();
    let o = env.run(&[
        "exec",
        "--python",
        &py,
        "--session",
        "weak",
        "--sandbox",
        "off",
        "--json",
        "print(1)",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("below") && err.contains("floor auto"),
        "{}",
        text(&o)
    );
    // The wire: a typed error, and no session was made.
    let r = call(
        &env,
        &serde_json::json!({"op": "exec", "session": "weak", "code": "print(1)", "sandbox": "off"}),
    );
    assert_eq!(r["event"], "error", "{r}");
    assert_eq!(r["code"], "sandbox_below_floor", "{r}");
    // A stronger mode than the floor is what the session gets (or, where
    // this machine cannot enforce, a refusal — never a weaker kernel).
    let r = call(
        &env,
        &serde_json::json!({"op": "exec", "session": "strong", "code": "print(1)", "sandbox": "enforce"}),
    );
    match r["event"].as_str() {
        Some("result") => assert_eq!(r["result"]["kernel"]["sandbox"]["mode"], "enforce", "{r}"),
        Some("error") => assert_eq!(r["code"], "sandbox_unavailable", "{r}"),
        _ => panic!("unexpected reply {r}"),
    }
    env.assert_healthy("auto", daemon);
}
