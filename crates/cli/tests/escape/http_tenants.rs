//! Item 6: a second tenant of `cellhost serve` who learnt another tenant's
//! `Mcp-Session-Id` tries every method and JSON-RPC message on it (end it,
//! watch its event stream, replay its handshake, ping it, notify it, run a
//! cell in it). Every one must answer exactly like an unknown session
//! (404), and the victim's session and variables must survive.
//!
//! Also the plumbing the slow-client tests share: a real `cellhost serve`
//! on 127.0.0.1 with a token file, and a minimal HTTP/1.1 client on raw
//! sockets (no client library: the tests control every byte).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, Env};

pub const ALICE: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub const BOB: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/// A running `cellhost serve` with tokens for `alice` and `bob`; stopped
/// (SIGTERM, then SIGKILL) on drop.
pub struct Serve {
    child: Child,
    pub addr: String,
    // Keeps the state directory alive while the server runs.
    _env: Env,
}

impl Serve {
    /// Starts `serve` with `vars` added to its environment (e.g. the
    /// `CELLHOST_SERVE_*` limits).
    pub fn start(vars: &[(&str, &str)]) -> Serve {
        let env = Env::new();
        let tokens = env.path().join("tokens");
        std::fs::write(&tokens, format!("alice {ALICE} rw\nbob {BOB} rw\n")).expect("tokens");
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let py = common::python();
        let tokens_arg = tokens.display().to_string();
        let mut cmd = env.cmd(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--python",
            &py,
            "--token-file",
            &tokens_arg,
        ]);
        cmd.env("CELLHOST_POOL_SIZE", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut said = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !said && let Some(rest) = line.split("serving http://").nth(1) {
                    said = true;
                    let _ = tx.send(rest.split('/').next().unwrap_or_default().to_string());
                }
                eprintln!("serve: {line}");
            }
        });
        let mut serve = Serve {
            child,
            addr: String::new(),
            _env: env,
        };
        // The server's own announcement is the event waited for; the bound
        // only stops a broken server from hanging the suite.
        serve.addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("serve did not say where it listens");
        serve
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server with `SIGKILL` (no shutdown of its own) and reaps
    /// it; the state directory stays until the `Serve` is dropped.
    pub fn kill_now(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A new connection to the server.
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).expect("connect");
        // Guards against a hang; never an assertion on time.
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        s
    }

    /// Sends one request (`Connection: close`) and reads the whole answer.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut s = self.connect();
        s.write_all(raw_request(method, path, headers, body, true).as_bytes())
            .expect("send");
        read_answer(&mut s).expect("an HTTP answer")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
        }
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The text of one HTTP/1.1 request.
pub fn raw_request(method: &str, path: &str, headers: &[(&str, &str)], body: &str, close: bool) -> String {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if close {
        r.push_str("Connection: close\r\n");
    }
    r.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    r
}

/// An HTTP answer: status, headers (names in lower case), decoded body.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl std::fmt::Debug for Answer {
    /// Status, headers and the body's first 400 characters.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body: String = self.body.chars().take(400).collect();
        f.debug_struct("Answer")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &body)
            .finish()
    }
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC messages of the body: JSON, or the `data:` lines of
    /// server-sent events.
    pub fn messages(&self) -> Vec<Value> {
        if let Ok(v) = serde_json::from_str::<Value>(&self.body) {
            return vec![v];
        }
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    }
}

/// Reads one answer from `s`: the head, then a body of `Content-Length`
/// bytes, a chunked body, or everything up to EOF. `None` when the server
/// closed (or reset) the connection before a whole head arrived.
pub fn read_answer(s: &mut TcpStream) -> Option<Answer> {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(n, 0);
        r.read_exact(&mut body).ok()?;
    } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        let _ = r.read_to_end(&mut body);
    }
    Some(Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).to_string(),
    })
}

/// An MCP client of one caller (bearer token) against `/mcp`.
struct Mcp<'a> {
    serve: &'a Serve,
    token: &'a str,
}

impl Mcp<'_> {
    fn headers<'h>(&'h self, auth: &'h str, session: Option<&'h str>) -> Vec<(&'h str, &'h str)> {
        let mut h = vec![
            ("Authorization", auth),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("MCP-Protocol-Version", "2025-06-18"),
        ];
        if let Some(sid) = session {
            h.push(("Mcp-Session-Id", sid));
        }
        h
    }

    fn send(&self, method: &str, session: Option<&str>, body: &Value) -> Answer {
        let auth = format!("Bearer {}", self.token);
        let mut h = self.headers(&auth, session);
        if method == "GET" {
            h.retain(|(k, _)| *k != "Content-Type");
            h.retain(|(k, _)| *k != "Accept");
            h.push(("Accept", "text/event-stream"));
        }
        let text = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        self.serve.request(method, "/mcp", &h, &text)
    }

    /// `initialize` + `notifications/initialized`; the new session id.
    fn open(&self) -> String {
        let a = self.send("POST", None, &initialize(1));
        assert_eq!(a.status, 200, "{a:?}");
        let sid = a.header("mcp-session-id").expect("a session id").to_string();
        let n = self.send(
            "POST",
            Some(&sid),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        assert_eq!(n.status, 202, "{n:?}");
        sid
    }

    /// Runs `code` with `execute_code`; the tool result.
    fn run(&self, sid: &str, id: u64, code: &str) -> Value {
        let a = self.send("POST", Some(sid), &call(id, code));
        assert_eq!(a.status, 200, "{a:?}");
        a.messages()
            .into_iter()
            .find(|m| m["id"] == id)
            .and_then(|m| m.get("result").cloned())
            .unwrap_or_else(|| panic!("no result for call {id}: {a:?}"))
    }
}

fn initialize(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "escape", "version": "0"}}})
}

fn call(id: u64, code: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "execute_code", "arguments": {"code": code}}})
}

fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Bob holds Alice's `Mcp-Session-Id`: every method and every kind of
/// JSON-RPC message he sends with it answers like an unknown session, and
/// her session, kernel and variable live on.
#[test]
fn escape_6_mcp_http_foreign_session_id_refused_on_every_method() {
    let serve = Serve::start(&[]);
    let alice = Mcp {
        serve: &serve,
        token: ALICE,
    };
    let bob = Mcp {
        serve: &serve,
        token: BOB,
    };
    let sid = alice.open();
    // rmcp's ids are UUIDv4 (122 random bits from the OS generator).
    let hex: String = sid.chars().filter(|c| *c != '-').collect();
    assert!(
        hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()) && hex.as_bytes()[12] == b'4',
        "session id {sid:?} is not a random UUID"
    );
    let r = alice.run(&sid, 2, "x = 41");
    assert_eq!(r["isError"], false, "{r}");

    // What an unknown session looks like to Bob.
    let unknown = bob.send(
        "POST",
        Some("00000000-0000-4000-8000-000000000000"),
        &json!({"jsonrpc": "2.0", "id": 9, "method": "ping"}),
    );
    assert_eq!(unknown.status, 404, "{unknown:?}");

    let attacks: Vec<(&str, &str, Value)> = vec![
        ("end her session", "DELETE", Value::Null),
        ("open her event stream", "GET", Value::Null),
        ("replay the handshake", "POST", initialize(3)),
        (
            "ping",
            "POST",
            json!({"jsonrpc": "2.0", "id": 4, "method": "ping"}),
        ),
        (
            "list tools",
            "POST",
            json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
        ),
        (
            "list resources",
            "POST",
            json!({"jsonrpc": "2.0", "id": 6, "method": "resources/list"}),
        ),
        ("run a cell", "POST", call(7, "x = 0")),
        (
            "read her variables",
            "POST",
            json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
            "params": {"name": "list_variables", "arguments": {}}}),
        ),
        (
            "notify initialized",
            "POST",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        ),
        (
            "cancel a request",
            "POST",
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 2}}),
        ),
        (
            "answer a server request",
            "POST",
            json!({"jsonrpc": "2.0", "id": 0, "result": {}}),
        ),
    ];
    for (what, method, body) in &attacks {
        let a = bob.send(method, Some(&sid), body);
        assert_eq!(
            (a.status, a.body.as_str()),
            (unknown.status, unknown.body.as_str()),
            "Bob's {method} to {what} was not answered like an unknown session: {a:?}"
        );
    }
    // Without a token the endpoint says nothing about the session either.
    let anon = serve.request("DELETE", "/mcp", &[("Mcp-Session-Id", &sid)], "");
    assert_eq!(anon.status, 401, "{anon:?}");

    // Alice's session, kernel and variable survived every attempt.
    let r = alice.run(&sid, 10, "x + 1");
    assert!(text_of(&r).contains("42"), "{r}");
    // Her event stream still opens for her.
    let mut s = serve.connect();
    let auth = format!("Bearer {ALICE}");
    let get = raw_request(
        "GET",
        "/mcp",
        &[
            ("Authorization", &auth),
            ("Accept", "text/event-stream"),
            ("MCP-Protocol-Version", "2025-06-18"),
            ("Mcp-Session-Id", &sid),
        ],
        "",
        true,
    );
    s.write_all(get.as_bytes()).expect("send");
    let mut head = String::new();
    BufReader::new(&mut s).read_line(&mut head).expect("status line");
    assert!(head.contains(" 200 "), "{head}");
    drop(s);

    // The host serves another tenant: Bob's own session works, and it is
    // his: Alice cannot use it either.
    let bob_sid = bob.open();
    let r = bob.run(&bob_sid, 11, "'x' in globals()");
    assert!(text_of(&r).contains("False"), "{r}");
    let a = alice.send("POST", Some(&bob_sid), &call(12, "1"));
    assert_eq!(a.status, 404, "{a:?}");

    // Alice may end her own session; afterwards it is gone for her too.
    let d = alice.send("DELETE", Some(&sid), &Value::Null);
    assert_eq!(d.status, 202, "{d:?}");
    let a = alice.send("POST", Some(&sid), &call(13, "x"));
    assert_eq!(a.status, 404, "{a:?}");
}
