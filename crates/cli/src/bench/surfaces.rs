//! Round trip of a trivial cell through the agent surfaces: DAEMON (a
//! `cellhost exec --session` process per cell, through the per-user
//! daemon, and the daemon's socket protocol alone) and HTTP (`POST
//! /v1/sessions/NAME/execute` on a local server, a new connection per
//! request, as curl does).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_server::daemon::{Client, Reply, Request};
use cellhost_server::{AppState, Scope, Tokens};
use cellhost_sessions::{Registry, RegistryConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::stats::row;
use super::workloads::Ctx;

type R = Result<(), String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// DAEMON: `cellhost exec --session` per cell, and the socket alone.
pub async fn daemon(ctx: &mut Ctx<'_>) -> R {
    let n = ctx.args.cells.clamp(1, 300);
    let exe = std::env::current_exe().map_err(s)?;
    let base = ctx.dir.join("daemon-bench");
    std::fs::create_dir_all(base.join("run")).map_err(s)?;
    std::fs::write(base.join("config.toml"), "").map_err(s)?;
    let python = ctx.cfg.python.clone();
    let cmd = |code: &str| {
        let mut c = Command::new(&exe);
        c.args(["exec", "--session", "bench", code])
            .arg("--python")
            .arg(&python)
            .env("CELLHOST_STATE_DIR", base.join("state"))
            .env("XDG_RUNTIME_DIR", base.join("run"))
            .env("CELLHOST_CONFIG", base.join("config.toml"))
            .env("CELLHOST_DAEMON_IDLE_S", "120")
            .stdout(std::process::Stdio::null());
        c
    };
    let st = cmd("x = 0").status().map_err(s)?;
    if !st.success() {
        return Err(format!("DAEMON: warm-up exec failed: {st}"));
    }
    let mut cli_ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let st = cmd("x += 1").status().map_err(s)?;
        cli_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if !st.success() {
            return Err(format!("DAEMON: exec failed: {st}"));
        }
    }
    let dir = base.join("run/cellhost");
    let mut c = Client::connect(&dir).await.map_err(s)?;
    let mut sock_ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = c
            .call(&Request::Exec {
                session: "bench".into(),
                code: "x += 1".into(),
                timeout_s: None,
                live: false,
                python: None,
                sandbox: None,
            })
            .await
            .map_err(s)?;
        sock_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if !matches!(r, Reply::Result { .. }) {
            return Err(format!("DAEMON: unexpected reply {r:?}"));
        }
    }
    let _ = c.call(&Request::Stop).await;
    let mut r1 = row("DAEMON", "cellhost exec --session (process per cell)", &cli_ms);
    r1.note = "CLI start + Unix socket + cell".into();
    let mut r2 = row("DAEMON", "daemon socket (JSON lines)", &sock_ms);
    r2.note = "one connection, no process start".into();
    ctx.rows.push(r1);
    ctx.rows.push(r2);
    Ok(())
}

async fn post(
    addr: std::net::SocketAddr,
    path: &str,
    token: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let mut st = tokio::net::TcpStream::connect(addr).await.map_err(s)?;
    st.set_nodelay(true).map_err(s)?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    st.write_all(req.as_bytes()).await.map_err(s)?;
    let mut raw = Vec::new();
    st.read_to_end(&mut raw).await.map_err(s)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    Ok((status, text))
}

/// HTTP: execute through a local API server.
pub async fn http(ctx: &mut Ctx<'_>) -> R {
    let n = ctx.args.cells.max(1);
    let mut rc = RegistryConfig::new(ctx.dir.join("http-bench"), ctx.cfg.clone());
    rc.pool_size = 0;
    let reg = Registry::start(rc, None).await.map_err(s)?;
    let token = cellhost_server::auth::new_token();
    let state = AppState::new(reg.clone(), Tokens::single("bench", &token, Scope::ReadWrite));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(s)?;
    let addr = listener.local_addr().map_err(s)?;
    let stop = Arc::new(tokio::sync::Notify::new());
    let stop2 = stop.clone();
    let server = tokio::spawn(cellhost_server::http::serve(listener, state, async move {
        stop2.notified().await;
    }));
    let (code, text) = post(addr, "/v1/sessions", &token, r#"{"name":"bench"}"#).await?;
    if code != 201 {
        return Err(format!("HTTP: create answered {code}: {text}"));
    }
    post(addr, "/v1/sessions/bench/execute", &token, r#"{"code":"x = 0"}"#).await?;
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (code, text) = post(addr, "/v1/sessions/bench/execute", &token, r#"{"code":"x += 1"}"#).await?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if code != 200 || !text.contains("\"status\":\"ok\"") {
            return Err(format!("HTTP: execute answered {code}: {text}"));
        }
    }
    stop.notify_one();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    reg.shutdown().await;
    let mut r = row("HTTP", "POST /v1/sessions/NAME/execute", &ms);
    r.note = "new TCP connection per request".into();
    ctx.rows.push(r);
    Ok(())
}

/// HTTP50: 50 clients, each in its own session (its own owner and token),
/// running 100 cells concurrently; every cell prints a tag naming its
/// client and cell, and any output that is missing or names another cell
/// is counted.
pub async fn http50(ctx: &mut Ctx<'_>) -> R {
    const CLIENTS: usize = 50;
    const CELLS: usize = 100;
    let mut rc = RegistryConfig::new(ctx.dir.join("http50-bench"), ctx.cfg.clone());
    rc.pool_size = 0;
    rc.max_live = CLIENTS + 4;
    let reg = Registry::start(rc, None).await.map_err(s)?;
    let mut tokens = Tokens::default();
    let toks: Vec<String> = (0..CLIENTS).map(|_| cellhost_server::auth::new_token()).collect();
    for (i, t) in toks.iter().enumerate() {
        tokens.add(&format!("client{i}"), t, Scope::ReadWrite);
    }
    let state = AppState::new(reg.clone(), tokens);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(s)?;
    let addr = listener.local_addr().map_err(s)?;
    let stop = Arc::new(tokio::sync::Notify::new());
    let stop2 = stop.clone();
    let server = tokio::spawn(cellhost_server::http::serve(listener, state, async move {
        stop2.notified().await;
    }));
    for t in &toks {
        let (code, text) = post(addr, "/v1/sessions", t, r#"{"name":"w"}"#).await?;
        if code != 201 {
            return Err(format!("HTTP50: create answered {code}: {text}"));
        }
    }
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (ci, token) in toks.iter().cloned().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut ms = Vec::with_capacity(CELLS);
            let mut bad = 0usize;
            for i in 0..CELLS {
                let tag = format!("client{ci}-cell{i}");
                let body = serde_json::json!({ "code": format!("print({tag:?})") }).to_string();
                let t = Instant::now();
                let r = post(addr, "/v1/sessions/w/execute", &token, &body).await;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
                let ok = r.as_ref().is_ok_and(|(code, text)| {
                    *code == 200
                        && text
                            .split("\r\n\r\n")
                            .nth(1)
                            .and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok())
                            .is_some_and(|v| v["stdout"] == format!("{tag}\n"))
                });
                if !ok {
                    bad += 1;
                }
            }
            (ms, bad)
        }));
    }
    let mut all = Vec::new();
    let mut bad = 0;
    for t in tasks {
        let (ms, b) = t.await.map_err(s)?;
        all.extend(ms);
        bad += b;
    }
    let wall = t0.elapsed().as_secs_f64();
    stop.notify_one();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    reg.shutdown().await;
    let mut r = row("HTTP50", "50 clients × 100 cells, own sessions", &all);
    r.note = format!(
        "{:.0} cells/s; {bad} of {} cells lost or misattributed",
        all.len() as f64 / wall,
        all.len()
    );
    ctx.rows.push(r);
    Ok(())
}
