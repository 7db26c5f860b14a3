//! A call sent right after the cancellation of a running `execute_code`
//! waits for the interrupted cell instead of being refused as
//! `session_busy`, however the server schedules the cancelled handler.
//!
//! The client writes `notifications/cancelled` and the next `tools/call`
//! in one write, so the server reads them back to back: the race that a
//! CI run once lost (`variable survives the cancellation` in
//! tests/mcp_client.py, `session_busy` from the call after the cancel).
//! Raw JSON-RPC over the stdio of `cellhost-mcp-test`; needs only a Python
//! interpreter (`CELLHOST_TEST_PYTHON`, else `python3`).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use serde_json::{Value, json};

/// A hang guard for any one message, not a timing assertion.
const MESSAGE_GUARD: Duration = Duration::from_secs(120);

fn python() -> PathBuf {
    std::env::var_os("CELLHOST_TEST_PYTHON")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// The server process; killed and reaped on drop, also when a check fails.
struct Server {
    child: Child,
    stdin: ChildStdin,
    messages: Receiver<Value>,
    _state: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Server {
        let state = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost-mcp-test"))
            .arg("--python")
            .arg(python())
            .arg("--state")
            .arg(state.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cellhost-mcp-test");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, messages) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => {
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                    Err(e) => panic!("the server wrote a line that is not JSON ({e}): {line}"),
                }
            }
        });
        Server {
            child,
            stdin,
            messages,
            _state: state,
        }
    }

    fn send(&mut self, msgs: &[Value]) {
        let mut buf = String::new();
        for m in msgs {
            buf.push_str(&m.to_string());
            buf.push('\n');
        }
        self.stdin.write_all(buf.as_bytes()).expect("write to the server");
        self.stdin.flush().expect("flush");
    }

    /// The next message for which `want` holds; the others are skipped.
    fn wait_for(&self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        loop {
            match self.messages.recv_timeout(MESSAGE_GUARD) {
                Ok(v) if want(&v) => return v,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no {what} from the server within {MESSAGE_GUARD:?}")
                }
                Err(RecvTimeoutError::Disconnected) => panic!("the server closed its output before {what}"),
            }
        }
    }

    fn response(&self, id: u64) -> Value {
        self.wait_for(&format!("response {id}"), |v| v["id"] == json!(id))
    }
}

fn call(id: u64, code: &str, progress: Option<&str>) -> Value {
    let mut params = json!({"name": "execute_code", "arguments": {"code": code}});
    if let Some(token) = progress {
        params["_meta"] = json!({"progressToken": token});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

#[test]
fn a_call_right_after_a_cancellation_waits_for_the_interrupted_cell() {
    let mut server = Server::start();
    server.send(&[
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "cancel-then-call", "version": "0"}}}),
    ]);
    let init = server.response(0);
    assert!(init.get("result").is_some(), "initialize: {init}");
    server.send(&[
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        call(1, "survivor = 42", None),
    ]);
    let first = server.response(1);
    assert_eq!(first["result"]["structuredContent"]["status"], "ok", "{first}");

    let mut id = 2;
    for round in 0..5 {
        let token = format!("sleeper-{round}");
        server.send(&[call(
            id,
            "import time\nprint('started', flush=True)\ntime.sleep(120)",
            Some(&token),
        )]);
        // The cell runs once its live output comes back as progress.
        server.wait_for("the sleeping cell's progress", |v| {
            v["method"] == "notifications/progress"
                && v["params"]["progressToken"] == json!(token)
                && v["params"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("started"))
        });
        server.send(&[
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": id, "reason": "the test cancels"}}),
            call(id + 1, "survivor + 1", None),
        ]);
        let next = server.response(id + 1);
        let content = &next["result"]["structuredContent"];
        assert_eq!(
            content["status"], "ok",
            "round {round}: the call after the cancellation: {next}"
        );
        assert!(
            next["result"].to_string().contains("43"),
            "round {round}: the variable survives the cancellation: {next}"
        );
        id += 2;
    }
}
