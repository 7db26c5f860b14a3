//! The HTTP API against a real server on 127.0.0.1:0 with real kernels:
//! sessions, execute (JSON and server-sent events), interrupt, restart,
//! variables, spilled output, history, auth (401/403/404 across owners),
//! the body limit and OpenAPI parity; plus `scripts/curl-smoke.sh`.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cellhost_server::auth::Scope;
use cellhost_server::{AppState, Tokens};
use cellhost_sessions::cell::KernelConfig;
use cellhost_sessions::{Durability, Journal, Registry, RegistryConfig};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";
const READER: &str = "reader-token-0123456789abcdef";

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_sessions::cell::resolve_python(None).expect("python3 for tests"),
    }
}

struct Server {
    addr: SocketAddr,
    registry: Arc<Registry>,
    _dir: TempDir,
}

impl Server {
    async fn stop(self) {
        self.registry.shutdown().await;
    }
}

async fn start() -> Server {
    start_with(None).await
}

/// R for the tests (`CELLHOST_TEST_R` or `R` on PATH) with jsonlite, or
/// `None` (printed).
fn r_interpreter() -> Option<PathBuf> {
    cellhost_testkit::r::r_interpreter(|| cellhost_sessions::cell::resolve_r(None))
}

/// A server whose kernels' default cell deadline is `cell_timeout` (the
/// config's `cell_timeout_s`; `None`: the built-in 300 s).
async fn start_with(cell_timeout: Option<Duration>) -> Server {
    start_full(cell_timeout, None).await
}

/// A server as [`start_with`], its R (when given) configured as the
/// config's `r = PATH` does.
async fn start_full(cell_timeout: Option<Duration>, r: Option<PathBuf>) -> Server {
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = KernelConfig::new(python(), dir.path().join("unused"));
    if cell_timeout.is_some() {
        cfg.cell_timeout = cell_timeout;
    }
    cfg.cwd = Some(dir.path().to_path_buf());
    let mut rc = RegistryConfig::new(dir.path().join("state"), cfg);
    rc.pool_size = 0;
    if let Some(r) = r {
        rc.interpreters.insert("r".into(), r);
    }
    let j = Arc::new(
        Journal::open(dir.path().join("state/journal.sqlite3"), Durability::Normal).expect("journal"),
    );
    let registry = Registry::start(rc, Some(j)).await.expect("registry");
    let mut tokens = Tokens::single("alice", ALICE, Scope::ReadWrite);
    tokens.add("bob", BOB, Scope::ReadWrite);
    tokens.add("alice", READER, Scope::ReadOnly);
    let state = AppState::new(registry.clone(), tokens);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(cellhost_server::http::serve(
        listener,
        state,
        std::future::pending(),
    ));
    Server {
        addr,
        registry,
        _dir: dir,
    }
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn request_bytes(
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
    extra: &[(&str, &str)],
) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if let Some(b) = body {
        out.extend_from_slice(b);
    }
    out
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap_or("0").trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = i + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

fn parse(raw: &[u8]) -> Resp {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&body).to_string(),
    }
}

async fn call(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> Resp {
    let b = body.map(|v| v.to_string().into_bytes());
    call_raw(addr, method, path, token, b.as_deref(), &[]).await
}

async fn call_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
    extra: &[(&str, &str)],
) -> Resp {
    let s = TcpStream::connect(addr).await.expect("connect");
    // The server may answer (413) before reading a large body: write and
    // read at once, so the answer is read before the server's close
    // resets the connection, and ignore a failed write.
    let (mut r, mut w) = s.into_split();
    let req = request_bytes(method, path, token, body, extra);
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&req).await;
        w
    });
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    }
    let _ = writer.await;
    parse(&raw)
}

async fn create(addr: SocketAddr, token: &str, name: &str) -> Resp {
    call(
        addr,
        "POST",
        "/v1/sessions",
        Some(token),
        Some(json!({"name": name})),
    )
    .await
}

async fn exec(addr: SocketAddr, token: &str, name: &str, code: &str) -> Resp {
    call(
        addr,
        "POST",
        &format!("/v1/sessions/{name}/execute"),
        Some(token),
        Some(json!({"code": code})),
    )
    .await
}

#[test]
fn openapi_document_matches_the_router() {
    let routes: BTreeSet<(String, String)> = cellhost_server::http::route_table()
        .into_iter()
        .map(|(m, p, _)| (m.as_str().to_lowercase(), p.to_string()))
        .collect();
    let doc = cellhost_server::openapi::document();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, _) in item.as_object().expect("item") {
            documented.insert((method.clone(), path.clone()));
        }
    }
    let missing: Vec<_> = routes.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&routes).collect();
    assert!(missing.is_empty(), "routes not in openapi.json: {missing:?}");
    assert!(
        extra.is_empty(),
        "openapi.json operations without a route: {extra:?}"
    );
    assert_eq!(doc["openapi"], "3.1.0");
}

/// `POST /v1/notebooks/run`: parameters injected, outputs filled in, a
/// language without a runtime refused with its code, a failed cell in
/// `stop`, a named session's state seen, a temporary session gone after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_notebook_route() {
    let srv = start().await;
    let a = srv.addr;
    let run = |body: Value| call(a, "POST", "/v1/notebooks/run", Some(ALICE), Some(body));
    let r = run(json!({
        "script": "# %% tags=[\"parameters\"]\nx = 1\n# %%\nprint(x * 2)\nx",
        "parameters": {"x": 21},
    }))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (v["total"].as_u64(), v["ran"].as_u64()),
        (Some(3), Some(3)),
        "{v}"
    );
    assert!(v.get("stop").is_none(), "{v}");
    let cells = v["notebook"]["cells"].as_array().expect("cells").clone();
    assert_eq!(cells[1]["metadata"]["tags"], json!(["injected-parameters"]));
    assert_eq!(cells[1]["source"], json!(["# Parameters\n", "x = 21\n"]));
    let outs = cells[2]["outputs"].as_array().expect("outputs");
    assert_eq!(outs[0]["text"], json!(["42\n"]), "{}", cells[2]);
    assert_eq!(outs[1]["data"]["text/plain"], json!(["21"]), "{}", cells[2]);
    assert!(cells[2]["metadata"]["execution"]["shell.execute_reply"].is_string());
    assert_eq!(
        v["notebook"]["metadata"]["papermill"]["parameters"],
        json!({"x": 21})
    );
    // The run's own session is gone.
    assert!(
        srv.registry
            .sessions_of("http:alice")
            .iter()
            .all(|(k, _)| !k.session.starts_with("notebook run")),
        "a temporary session was left"
    );

    let j_nb = json!({"cells": [{"cell_type": "code", "source": "1", "metadata": {}, "outputs": [], "execution_count": null}],
                      "metadata": {"kernelspec": {"name": "julia-1.10", "language": "julia", "display_name": "Julia"}},
                      "nbformat": 4, "nbformat_minor": 5});
    let r = run(json!({"notebook": j_nb})).await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "unsupported_language");
    assert_eq!(r.json()["error"]["language"], "julia");
    assert_eq!(r.json()["error"]["supported"], json!(["python", "r"]));

    let r = run(json!({"script": "# %%\n1", "notebook": {}})).await;
    assert_eq!(
        (r.status, code_of(&r)),
        (422, "invalid_request".to_string()),
        "{}",
        r.body
    );
    let r = run(json!({"script": "# %%\n1", "parameters": {"not an identifier": 1}})).await;
    assert_eq!(
        (r.status, code_of(&r)),
        (400, "bad_request".to_string()),
        "{}",
        r.body
    );
    assert_eq!(r.json()["error"]["field"], "parameters");
    let r = run(json!({"notebook": {"nbformat": 3, "cells": []}})).await;
    assert_eq!(
        (r.status, code_of(&r)),
        (400, "bad_request".to_string()),
        "{}",
        r.body
    );

    let r = run(json!({"script": "# %%\nraise ValueError('no')\n# %%\nprint('not reached')"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["stop"]["reason"], "cell_failed", "{v}");
    assert_eq!(v["stop"]["cell"], 1);
    assert_eq!(v["stop"]["status"], "error");
    assert_eq!(v["ran"], 1);

    // In a named session: its variables are there, and stay.
    assert_eq!(create(a, ALICE, "nbs").await.status, 201);
    assert_eq!(exec(a, ALICE, "nbs", "y = 5").await.status, 200);
    let r = run(json!({"script": "print(y)\ny += 1", "session": "nbs"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["notebook"]["cells"][0]["outputs"][0]["text"],
        json!(["5\n"])
    );
    let e = exec(a, ALICE, "nbs", "y").await;
    assert_eq!(e.json()["result"]["text/plain"], "6", "{}", e.body);
    // A session running a cell refuses the run (409), as it refuses an execute.
    // The gate file is in the kernels' working directory (a sandboxed
    // kernel has a /tmp of its own).
    let go = srv._dir.path().join("nb-go");
    let waiting = format!(
        "import os, time\nwhile not os.path.exists({:?}): time.sleep(0.01)",
        go.display().to_string()
    );
    let runner = tokio::spawn(async move { exec(a, ALICE, "nbs", &waiting).await });
    loop {
        let l = call(a, "GET", "/v1/sessions", Some(ALICE), None).await.json();
        let busy = l["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["name"] == "nbs" && s["busy"] == true);
        if busy {
            break;
        }
        tokio::task::yield_now().await;
    }
    let r = run(json!({"script": "print('never')", "session": "nbs"})).await;
    assert_eq!(
        (r.status, code_of(&r)),
        (409, "session_busy".to_string()),
        "{}",
        r.body
    );
    std::fs::write(&go, "").expect("go");
    let done = runner.await.expect("task");
    assert_eq!(done.json()["status"], "ok", "{}", done.body);
    // Another owner's session is not found; a read-only token may not run.
    let r = call(
        a,
        "POST",
        "/v1/notebooks/run",
        Some(BOB),
        Some(json!({"script": "1", "session": "nbs"})),
    )
    .await;
    assert_eq!(
        (r.status, code_of(&r)),
        (404, "session_not_found".to_string()),
        "{}",
        r.body
    );
    let r = call(
        a,
        "POST",
        "/v1/notebooks/run",
        Some(READER),
        Some(json!({"script": "1"})),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_execute_variables_history_restart_delete() {
    let srv = start().await;
    let a = srv.addr;
    let doc = call(a, "GET", "/openapi.json", None, None).await;
    assert_eq!(doc.status, 200);
    assert_eq!(doc.json()["openapi"], "3.1.0");

    let c = create(a, ALICE, "ana").await;
    assert_eq!(c.status, 201, "{}", c.body);
    assert_eq!(c.json()["alive"], true);
    assert_eq!(create(a, ALICE, "ana").await.status, 409);
    assert_eq!(create(a, ALICE, "bad name!").await.status, 422);

    let r = exec(a, ALICE, "ana", "x = 21\nprint('hi')\nx * 2").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["stdout"], "hi\n");
    assert_eq!(v["result"]["text/plain"], "42");
    let r = exec(a, ALICE, "ana", "x + 1").await.json();
    assert_eq!(r["result"]["text/plain"], "22", "state kept: {r}");
    let r = exec(a, ALICE, "ana", "1/0").await.json();
    assert_eq!(r["status"], "error");
    assert_eq!(r["error"]["ename"], "ZeroDivisionError");

    let vars = call(a, "GET", "/v1/sessions/ana/variables", Some(ALICE), None).await;
    assert_eq!(vars.status, 200, "{}", vars.body);
    assert!(vars.body.contains("\"x\""), "{}", vars.body);

    let list = call(a, "GET", "/v1/sessions", Some(ALICE), None).await.json();
    assert_eq!(list["sessions"][0]["name"], "ana");

    let h = call(a, "GET", "/v1/sessions/ana/history", Some(ALICE), None).await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["cells"].as_array().map(Vec::len), Some(3), "{}", h.body);

    let rs = call(a, "POST", "/v1/sessions/ana/restart", Some(ALICE), None).await;
    assert_eq!(rs.status, 200, "{}", rs.body);
    let r = exec(a, ALICE, "ana", "'x' in globals()").await.json();
    assert_eq!(r["result"]["text/plain"], "False", "restart clears state: {r}");
    // The listing gives the session's generation (regression: it gave the
    // kernel's own count, always 1).
    let list = call(a, "GET", "/v1/sessions", Some(ALICE), None).await.json();
    assert_eq!(
        list["sessions"][0]["generation"], r["kernel"]["generation"],
        "{list} vs {r}"
    );
    assert_eq!(list["sessions"][0]["generation"], 2, "{list}");

    // Big output: cut inline, pageable by the owner only.
    let r = exec(a, ALICE, "ana", "print('y' * 200000)").await.json();
    let cell = r["cell_id"].as_str().expect("cell").to_string();
    assert!(
        r["truncated"]["stdout"]["omitted_bytes"].as_u64().unwrap_or(0) > 0,
        "{r}"
    );
    let page = call(
        a,
        "GET",
        &format!("/v1/cells/{cell}/output/stdout?offset=100&length=1000"),
        Some(ALICE),
        None,
    )
    .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let p = page.json();
    assert_eq!(p["text"].as_str().map(str::len), Some(1000));
    assert_eq!(p["next_offset"], 1100);
    let foreign = call(
        a,
        "GET",
        &format!("/v1/cells/{cell}/output/stdout"),
        Some(BOB),
        None,
    )
    .await;
    assert_eq!(foreign.status, 404);

    let d = call(a, "DELETE", "/v1/sessions/ana", Some(ALICE), None).await;
    assert_eq!(d.status, 204);
    assert_eq!(exec(a, ALICE, "ana", "1").await.status, 404);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fork_route_makes_a_session_of_its_own_and_refuses_taken_names_and_other_owners() {
    let srv = start().await;
    let a = srv.addr;
    assert_eq!(create(a, ALICE, "trunk").await.status, 201);
    let r = exec(a, ALICE, "trunk", "xs = [1, 2]\nopen('f.txt', 'w').write('t')").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let f = call(
        a,
        "POST",
        "/v1/sessions/trunk/fork",
        Some(ALICE),
        Some(json!({"name": "branch"})),
    )
    .await;
    assert_eq!(f.status, 201, "{}", f.body);
    let rep = f.json();
    assert_eq!(rep["parent"], "trunk");
    assert_eq!(rep["execution_count"], 1);
    assert!(rep["files_copied"].as_u64() >= Some(1), "{rep}");
    let r = exec(a, ALICE, "branch", "xs.append(3); xs, open('f.txt').read()")
        .await
        .json();
    assert_eq!(r["result"]["text/plain"], "([1, 2, 3], 't')", "{r}");
    assert_eq!(r["execution_count"], 2, "{r}");
    let r = exec(a, ALICE, "trunk", "xs").await.json();
    assert_eq!(r["result"]["text/plain"], "[1, 2]", "{r}");
    // Listed as the caller's session; lineage in its history.
    let list = call(a, "GET", "/v1/sessions", Some(ALICE), None).await.json();
    assert!(
        list["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .any(|s| s["name"] == "branch"),
        "{list}"
    );
    let h = call(a, "GET", "/v1/sessions/branch/history", Some(ALICE), None)
        .await
        .json();
    assert_eq!(h["kernels"][0]["parent_session"], "trunk", "{h}");
    // A taken name; another owner's session (404 as a missing one); a bad body.
    let again = call(
        a,
        "POST",
        "/v1/sessions/trunk/fork",
        Some(ALICE),
        Some(json!({"name": "branch"})),
    )
    .await;
    assert_eq!(
        (again.status, code_of(&again).as_str()),
        (409, "session_exists"),
        "{}",
        again.body
    );
    let other = call(
        a,
        "POST",
        "/v1/sessions/trunk/fork",
        Some(BOB),
        Some(json!({"name": "mine"})),
    )
    .await;
    assert_eq!(
        (other.status, code_of(&other).as_str()),
        (404, "session_not_found"),
        "{}",
        other.body
    );
    let bad = call(
        a,
        "POST",
        "/v1/sessions/trunk/fork",
        Some(ALICE),
        Some(json!({"name": "x", "threads": "keep"})),
    )
    .await;
    assert_eq!(bad.status, 422, "{}", bad.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auth_401_403_and_owner_isolation() {
    let srv = start().await;
    let a = srv.addr;
    let none = call(a, "GET", "/v1/sessions", None, None).await;
    assert_eq!(none.status, 401);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    assert_eq!(
        call(a, "GET", "/v1/sessions", Some("wrong-token-0123456789"), None)
            .await
            .status,
        401
    );
    assert_eq!(
        call_raw(
            a,
            "GET",
            "/v1/sessions",
            None,
            None,
            &[("Authorization", "Basic YTpi")]
        )
        .await
        .status,
        401
    );

    assert_eq!(create(a, ALICE, "mine").await.status, 201);
    assert_eq!(exec(a, ALICE, "mine", "secret = 7").await.json()["status"], "ok");
    // Read-only token of the same owner: GET works, anything else is 403.
    assert_eq!(create(a, READER, "ro").await.status, 403);
    assert_eq!(exec(a, READER, "mine", "1").await.status, 403);
    assert_eq!(
        call(a, "DELETE", "/v1/sessions/mine", Some(READER), None)
            .await
            .status,
        403
    );
    let ro_list = call(a, "GET", "/v1/sessions", Some(READER), None).await;
    assert_eq!(ro_list.status, 200);
    assert_eq!(ro_list.json()["sessions"][0]["name"], "mine");
    assert_eq!(
        call(a, "GET", "/v1/sessions/mine/variables", Some(READER), None)
            .await
            .status,
        200
    );

    // Another owner sees nothing of alice's session: 404 everywhere.
    assert_eq!(exec(a, BOB, "mine", "print(secret)").await.status, 404);
    for (m, p) in [
        ("GET", "/v1/sessions/mine/variables"),
        ("GET", "/v1/sessions/mine/history"),
        ("POST", "/v1/sessions/mine/interrupt"),
        ("POST", "/v1/sessions/mine/restart"),
        ("DELETE", "/v1/sessions/mine"),
    ] {
        assert_eq!(call(a, m, p, Some(BOB), None).await.status, 404, "{m} {p}");
    }
    let bob_list = call(a, "GET", "/v1/sessions", Some(BOB), None).await.json();
    assert_eq!(bob_list["sessions"], json!([]));
    // Bob's own session of the same name is his own namespace.
    assert_eq!(create(a, BOB, "mine").await.status, 201);
    let r = exec(a, BOB, "mine", "'secret' in globals()").await.json();
    assert_eq!(r["result"]["text/plain"], "False");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn body_limit_413() {
    let srv = start().await;
    let a = srv.addr;
    assert_eq!(create(a, ALICE, "big").await.status, 201);
    let code = "x".repeat(cellhost_server::MAX_BODY_BYTES + 1024);
    let body = json!({ "code": code }).to_string();
    let r = call_raw(
        a,
        "POST",
        "/v1/sessions/big/execute",
        Some(ALICE),
        Some(body.as_bytes()),
        &[],
    )
    .await;
    assert_eq!(r.status, 413, "{}", r.body);
    // Just under the limit is accepted.
    let code = format!("s = '{}'\nlen(s)", "y".repeat(1024 * 1024));
    let r = exec(a, ALICE, "big", &code).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"]["text/plain"], "1048576");
    srv.stop().await;
}

/// Reads server-sent events from a streaming execute until `result`.
async fn read_events(s: &mut TcpStream, mut on_event: impl FnMut(&str, &Value)) -> Vec<(String, Value)> {
    let mut raw = Vec::new();
    let mut events = Vec::new();
    let mut consumed = 0usize;
    let mut buf = [0u8; 8192];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf))
            .await
            .expect("events in time")
            .expect("read");
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        // Work on the de-chunked text after the headers.
        let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let text = String::from_utf8_lossy(&dechunk(&raw[split + 4..])).to_string();
        let blocks: Vec<&str> = text.split("\n\n").collect();
        // The last block may be incomplete.
        for block in &blocks[consumed..blocks.len().saturating_sub(1)] {
            let mut name = "message".to_string();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if data.is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&data).unwrap_or(Value::String(data));
            on_event(&name, &v);
            events.push((name.clone(), v));
            if name == "result" || name == "error" {
                return events;
            }
        }
        consumed = blocks.len().saturating_sub(1);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sse_stream_and_interrupt() {
    let srv = start().await;
    let a = srv.addr;
    assert_eq!(create(a, ALICE, "live").await.status, 201);
    assert_eq!(
        exec(a, ALICE, "live", "keep = 'kept'").await.json()["status"],
        "ok"
    );

    // ?stream=true: stream chunks, a display, then the result.
    let code = "import time, cellhost\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.05)\ncellhost.display('shown')\n'done'";
    let body = json!({"code": code}).to_string();
    let mut s = TcpStream::connect(a).await.expect("connect");
    s.write_all(&request_bytes(
        "POST",
        "/v1/sessions/live/execute?stream=true",
        Some(ALICE),
        Some(body.as_bytes()),
        &[],
    ))
    .await
    .expect("write");
    let events = read_events(&mut s, |_, _| {}).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"stream"), "{events:?}");
    assert!(names.contains(&"display"), "{events:?}");
    assert_eq!(names.last(), Some(&"result"), "{events:?}");
    let streamed: String = events
        .iter()
        .filter(|(n, _)| n == "stream")
        .filter_map(|(_, v)| v["text"].as_str())
        .collect();
    assert!(
        streamed.contains("tick 0") && streamed.contains("tick 2"),
        "{streamed}"
    );
    let result = &events.last().expect("result").1;
    assert_eq!(result["status"], "ok");
    assert_eq!(result["result"]["text/plain"], "'done'");

    // Accept: text/event-stream, and an interrupt while it sleeps.
    let body = json!({"code": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"}).to_string();
    let mut s = TcpStream::connect(a).await.expect("connect");
    s.write_all(&request_bytes(
        "POST",
        "/v1/sessions/live/execute",
        Some(ALICE),
        Some(body.as_bytes()),
        &[("Accept", "text/event-stream")],
    ))
    .await
    .expect("write");
    let mut interrupted = false;
    let mut pending: Option<tokio::task::JoinHandle<Resp>> = None;
    let events = read_events(&mut s, |name, v| {
        if name == "stream" && v["text"].as_str().is_some_and(|t| t.contains("sleeping")) && !interrupted {
            interrupted = true;
            pending = Some(tokio::spawn(async move {
                call(a, "POST", "/v1/sessions/live/interrupt", Some(ALICE), None).await
            }));
        }
    })
    .await;
    let ir = pending.expect("interrupt sent").await.expect("join");
    assert_eq!(ir.status, 200);
    assert_eq!(ir.json()["delivered"], true, "{}", ir.body);
    let result = &events.last().expect("result").1;
    assert_eq!(result["status"], "interrupted", "{result}");
    let r = exec(a, ALICE, "live", "keep").await.json();
    assert_eq!(
        r["result"]["text/plain"], "'kept'",
        "state survives the interrupt: {r}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curl_smoke_script() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("curl not installed: skipped");
        return;
    }
    let srv = start().await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/curl-smoke.sh");
    let out = tokio::process::Command::new("bash")
        .arg(&script)
        .env("CELLHOST_URL", format!("http://{}", srv.addr))
        .env("CELLHOST_TOKEN", ALICE)
        .output()
        .await
        .expect("run curl-smoke.sh");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "curl-smoke.sh failed:\n{text}");
    assert!(text.contains("curl smoke: all passed"), "{text}");
    srv.stop().await;
}

/// The error envelope of `resp`: its code, after checking the body is
/// `{"error": {"code", "message"}}` as application/json.
fn code_of(resp: &Resp) -> String {
    assert_eq!(
        resp.header("content-type"),
        Some("application/json"),
        "{} {:?} {}",
        resp.status,
        resp.headers,
        resp.body
    );
    let v = resp.json();
    assert!(v["error"]["message"].is_string(), "{}", resp.body);
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_error_is_a_json_envelope_with_its_code() {
    let srv = start().await;
    let a = srv.addr;
    let cases: Vec<(Resp, u16, &str)> = vec![
        (
            call(a, "GET", "/v1/sessions", None, None).await,
            401,
            "unauthorized",
        ),
        (
            call(a, "GET", "/no/such/route", Some(ALICE), None).await,
            404,
            "not_found",
        ),
        (
            call(a, "PUT", "/v1/sessions", Some(ALICE), None).await,
            405,
            "method_not_allowed",
        ),
        (
            call(a, "POST", "/v1/sessions", Some(READER), None).await,
            403,
            "forbidden",
        ),
        (
            call_raw(a, "POST", "/v1/sessions", Some(ALICE), Some(b"{"), &[]).await,
            400,
            "bad_request",
        ),
        (
            call_raw(
                a,
                "POST",
                "/v1/sessions",
                Some(ALICE),
                Some(br#"{"name": 7}"#),
                &[],
            )
            .await,
            422,
            "invalid_request",
        ),
        (
            call_raw(
                a,
                "POST",
                "/v1/sessions",
                Some(ALICE),
                Some(br#"{"nome": "x"}"#),
                &[],
            )
            .await,
            422,
            "invalid_request",
        ),
        (create(a, ALICE, "bad name!").await, 422, "invalid_request"),
        (
            call(
                a,
                "GET",
                "/v1/sessions/nope/variables?limit=abc",
                Some(ALICE),
                None,
            )
            .await,
            422,
            "invalid_request",
        ),
        (
            call(a, "GET", "/v1/cells/c1/output/stdin", Some(ALICE), None).await,
            422,
            "invalid_request",
        ),
        (
            call(a, "GET", "/v1/cells/c1/output/stdout?length=0", Some(ALICE), None).await,
            422,
            "invalid_request",
        ),
        (
            call(a, "GET", "/v1/cells/c1/output/stdout", Some(ALICE), None).await,
            404,
            "output_not_found",
        ),
        (exec(a, ALICE, "nope", "1").await, 404, "session_not_found"),
    ];
    for (resp, status, code) in &cases {
        assert_eq!(resp.status, *status, "{code}: {}", resp.body);
        assert_eq!(code_of(resp), *code, "{}", resp.body);
    }
    // A body that is not JSON: 415 whatever the route.
    let mut raw = TcpStream::connect(a).await.expect("connect");
    let body = r#"{"code": "1"}"#;
    let req = format!(
        "POST /v1/sessions/nope/execute HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    raw.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    raw.read_to_end(&mut out).await.expect("read");
    let r = parse(&out);
    assert_eq!(r.status, 415, "{}", r.body);
    assert_eq!(code_of(&r), "unsupported_media_type");
    // Over the body limit: 413 with the limit.
    let big = vec![b' '; cellhost_server::MAX_BODY_BYTES + 10];
    let r = call_raw(a, "POST", "/v1/sessions", Some(ALICE), Some(&big), &[]).await;
    assert_eq!(r.status, 413);
    assert_eq!(code_of(&r), "payload_too_large");
    // Values the document refuses are refused by the server, too.
    assert_eq!(create(a, ALICE, "ok").await.status, 201);
    for bad in [
        json!({"code": "1", "timeout_s": -1}),
        json!({"code": "1", "timeout_s": 604801}),
    ] {
        let r = call(a, "POST", "/v1/sessions/ok/execute", Some(ALICE), Some(bad)).await;
        assert_eq!(
            (r.status, code_of(&r).as_str()),
            (422, "invalid_request"),
            "{}",
            r.body
        );
    }
    let r = call(a, "GET", "/v1/sessions/ok/variables?limit=501", Some(ALICE), None).await;
    assert_eq!((r.status, code_of(&r).as_str()), (422, "invalid_request"));
    // The host is healthy afterwards.
    assert_eq!(
        exec(a, ALICE, "ok", "6 * 7").await.json()["result"]["text/plain"],
        "42"
    );
    srv.stop().await;
}

/// The HTTP row of the surface × request matrix: the default and an
/// explicit deadline, the sandbox mode, owners kept apart, the busy rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn matrix_http_timeout_sandbox_owner_busy() {
    let srv = start_with(Some(Duration::from_secs(2))).await;
    let a = srv.addr;
    let floor = srv.registry.sandbox_floor();

    // Sandbox: no mode is the floor; a weaker one is refused (403).
    let c = create(a, ALICE, "m").await;
    assert_eq!(c.status, 201, "{}", c.body);
    assert_eq!(c.json()["sandbox"], floor.as_str());
    let r = exec(a, ALICE, "m", "1").await.json();
    assert_eq!(r["kernel"]["sandbox"]["mode"], floor.as_str(), "{r}");
    if floor > cellhost_sandbox::profile::SandboxMode::Off {
        let r = call(
            a,
            "POST",
            "/v1/sessions",
            Some(ALICE),
            Some(json!({"name": "weak", "sandbox": "off"})),
        )
        .await;
        assert_eq!(
            (r.status, code_of(&r).as_str()),
            (403, "sandbox_below_floor"),
            "{}",
            r.body
        );
        assert_eq!(r.json()["error"]["floor"], floor.as_str());
    }

    // Timeout: no timeout_s is the server's default (2 s here) ...
    let r = exec(a, ALICE, "m", "import time\ntime.sleep(30)").await.json();
    assert_eq!(r["status"], "timeout", "{r}");
    // ... and an explicit one overrides it.
    let r = call(
        a,
        "POST",
        "/v1/sessions/m/execute",
        Some(ALICE),
        Some(json!({"code": "import time\ntime.sleep(3)\n'done'", "timeout_s": 60})),
    )
    .await
    .json();
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["result"]["text/plain"], "'done'");

    // Owners: the same name under two tokens is two sessions.
    assert_eq!(exec(a, ALICE, "m", "who = 'alice'").await.status, 200);
    assert_eq!(create(a, BOB, "m").await.status, 201);
    let r = exec(a, BOB, "m", "'who' in globals()").await.json();
    assert_eq!(r["result"]["text/plain"], "False", "{r}");
    assert_eq!(
        exec(a, ALICE, "m", "who").await.json()["result"]["text/plain"],
        "'alice'"
    );

    // Busy: a second execute is refused (409 session_busy) unless it queues.
    let runner = tokio::spawn(async move {
        call(
            a,
            "POST",
            "/v1/sessions/m/execute",
            Some(ALICE),
            Some(json!({"code": "import time\ntime.sleep(120)", "timeout_s": 0})),
        )
        .await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let l = call(a, "GET", "/v1/sessions", Some(ALICE), None).await.json();
        if l["sessions"][0]["busy"] == true {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the cell never ran: {l}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = exec(a, ALICE, "m", "1").await;
    assert_eq!(
        (r.status, code_of(&r).as_str()),
        (409, "session_busy"),
        "{}",
        r.body
    );
    assert_eq!(r.json()["error"]["session"], "m");
    // Bob's session of the same name is not busy.
    assert_eq!(exec(a, BOB, "m", "2").await.json()["status"], "ok");
    let queued = tokio::spawn(async move {
        call(
            a,
            "POST",
            "/v1/sessions/m/execute",
            Some(ALICE),
            Some(json!({"code": "who", "queue": true})),
        )
        .await
    });
    // The queued call is waiting, not refused: it ends only after the
    // running cell is interrupted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!queued.is_finished(), "the queued call did not wait");
    let i = call(a, "POST", "/v1/sessions/m/interrupt", Some(ALICE), None).await;
    assert_eq!(i.status, 200, "{}", i.body);
    let first = runner.await.expect("runner").json();
    assert_eq!(first["status"], "interrupted", "{first}");
    let q = queued.await.expect("queued").json();
    assert_eq!(q["status"], "ok", "{q}");
    assert_eq!(q["result"]["text/plain"], "'alice'");
    srv.stop().await;
}

/// An R session over HTTP: created with `"language": "r"`, its cells run
/// in R with state kept, errors carry R's condition class, variables,
/// history and restart work as for Python, the session keeps its language,
/// and an R notebook (kernelspec `ir`) runs through `/v1/notebooks/run`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn r_sessions_over_http() {
    let Some(r) = r_interpreter() else { return };
    let srv = start_full(None, Some(r)).await;
    let a = srv.addr;
    let c = call(
        a,
        "POST",
        "/v1/sessions",
        Some(ALICE),
        Some(json!({"name": "rs", "language": "r"})),
    )
    .await;
    assert_eq!(c.status, 201, "{}", c.body);
    assert_eq!(c.json()["language"], "r", "{}", c.body);
    let bad = call(
        a,
        "POST",
        "/v1/sessions",
        Some(ALICE),
        Some(json!({"name": "rj", "language": "julia"})),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.json()["error"]["code"], "bad_request");

    let v = exec(a, ALICE, "rs", "x <- 21\ncat('hi\\n')\nx * 2").await;
    assert_eq!(v.status, 200, "{}", v.body);
    let v = v.json();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["stdout"], "hi\n");
    assert_eq!(v["result"]["text/plain"], "[1] 42");
    let v = exec(a, ALICE, "rs", "x + 1").await.json();
    assert_eq!(v["result"]["text/plain"], "[1] 22", "state kept: {v}");
    let v = exec(a, ALICE, "rs", "stop('nope')").await.json();
    assert_eq!(v["status"], "error");
    assert_eq!(v["error"]["ename"], "simpleError");
    assert_eq!(v["error"]["evalue"], "nope");
    let v = exec(a, ALICE, "rs", "data.frame(a = 1:2)").await.json();
    assert!(
        v["result"]["text/html"]
            .as_str()
            .is_some_and(|h| h.contains("<table")),
        "{v}"
    );

    let vars = call(a, "GET", "/v1/sessions/rs/variables", Some(ALICE), None).await;
    assert_eq!(vars.status, 200, "{}", vars.body);
    let vars = vars.json();
    let x = vars["variables"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "x").cloned())
        .unwrap_or_default();
    assert_eq!(x["type"], "numeric", "{vars}");

    let h = call(a, "GET", "/v1/sessions/rs/history", Some(ALICE), None).await;
    assert_eq!(h.status, 200, "{}", h.body);
    assert_eq!(h.json()["cells"].as_array().map(Vec::len), Some(4), "{}", h.body);

    let rs = call(a, "POST", "/v1/sessions/rs/restart", Some(ALICE), None).await;
    assert_eq!(rs.status, 200, "{}", rs.body);
    let v = exec(a, ALICE, "rs", "exists('x')").await.json();
    assert_eq!(
        v["result"]["text/plain"], "[1] FALSE",
        "restart clears state, still R: {v}"
    );

    let nb = json!({"cells": [
            {"cell_type": "code", "source": "y <- c(1, 2, 3)", "metadata": {}, "outputs": [], "execution_count": null},
            {"cell_type": "code", "source": "mean(y)", "metadata": {}, "outputs": [], "execution_count": null}],
        "metadata": {"kernelspec": {"name": "ir", "language": "R", "display_name": "R"}},
        "nbformat": 4, "nbformat_minor": 5});
    let run = call(
        a,
        "POST",
        "/v1/notebooks/run",
        Some(ALICE),
        Some(json!({"notebook": nb})),
    )
    .await;
    assert_eq!(run.status, 200, "{}", run.body);
    let v = run.json();
    assert_eq!(v["ran"], 2, "{v}");
    let outs = v["notebook"]["cells"][1]["outputs"]
        .as_array()
        .expect("outputs")
        .clone();
    assert_eq!(outs[0]["data"]["text/plain"], json!(["[1] 2"]), "{v}");

    let d = call(a, "DELETE", "/v1/sessions/rs", Some(ALICE), None).await;
    assert_eq!(d.status, 204);
    srv.stop().await;
}

/// A regression: forking a session without a live kernel (here: paused)
/// dropped the session's hold while holding its lock, so the request and
/// every later one on that session hung. It answers at once now, and the
/// session still serves (resumed by its next cell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_of_a_session_without_a_live_kernel_answers_and_the_session_still_serves() {
    let srv = start().await;
    let a = srv.addr;
    assert_eq!(create(a, ALICE, "idle").await.status, 201);
    let r = exec(a, ALICE, "idle", "x = 6").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let p = call(a, "POST", "/v1/sessions/idle/pause", Some(ALICE), None).await;
    assert_eq!(p.status, 200, "{}", p.body);
    let f = tokio::time::timeout(
        Duration::from_secs(120),
        call(
            a,
            "POST",
            "/v1/sessions/idle/fork",
            Some(ALICE),
            Some(json!({"name": "copy"})),
        ),
    )
    .await
    .expect("the fork answers (a hang guard, not a speed check)");
    assert_eq!(
        (f.status, code_of(&f).as_str()),
        (404, "session_not_found"),
        "{}",
        f.body
    );
    let r = tokio::time::timeout(Duration::from_secs(120), exec(a, ALICE, "idle", "x * 7"))
        .await
        .expect("the session still serves");
    assert_eq!(r.json()["result"]["text/plain"], "42", "{}", r.body);
}
