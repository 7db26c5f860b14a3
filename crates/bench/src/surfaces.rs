//! Round trip of a trivial cell through the agent surfaces, each the real
//! `cellhost` binary as a user runs it: DAEMON (a `cellhost exec --session`
//! process per cell, through the per-user daemon, and the daemon's socket
//! protocol alone), HTTP (`POST /v1/sessions/NAME/execute` on a `cellhost
//! serve`, a new connection per request, as curl does) and MCP (`cellhost
//! mcp` over stdio).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cellhost_server::daemon::{Client, Reply, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::stats::{Row, row};
use super::workloads::Ctx;

type R = Result<(), String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

impl Ctx<'_> {
    /// Adds the kernel flags of a `cellhost` command that starts kernels:
    /// the bench's interpreter, and `--sandbox` when the bench was given one.
    fn kernel_flags<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        c.arg("--python").arg(&self.cfg.python);
        if let Some(mode) = self.args.sandbox {
            c.arg("--sandbox").arg(mode.as_str());
        }
        c
    }
}

/// DAEMON: `cellhost exec --session` per cell, and the socket alone.
pub async fn daemon(ctx: &mut Ctx<'_>) -> R {
    let n = ctx.args.cells.clamp(1, 300);
    let base = ctx.dir.join("daemon-bench");
    std::fs::create_dir_all(base.join("run")).map_err(s)?;
    std::fs::write(base.join("config.toml"), "").map_err(s)?;
    let cmd = |code: &str| {
        let mut c = Command::new(&ctx.cellhost);
        // The session works in (and is keyed by) the caller's directory:
        // the socket requests below name the same one.
        c.args(["exec", "--session", "bench", code]).current_dir(&base);
        ctx.kernel_flags(&mut c)
            .env("CELLHOST_STATE_DIR", base.join("state"))
            .env("XDG_RUNTIME_DIR", base.join("run"))
            .env("CELLHOST_CONFIG", base.join("config.toml"))
            .env("CELLHOST_DAEMON_IDLE_S", "120")
            .stdout(Stdio::null());
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
                queue: false,
                python: None,
                sandbox: None,
                cwd: base.canonicalize().ok(),
                env: Vec::new(),
                language: None,
                placement: None,
                network: None,
                limits: None,
                checkpoint: None,
                restore: None,
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

/// A `cellhost serve` of the bench's: loopback, a port of its own, the
/// tokens given and a config file of its own (`config`: TOML, the defaults
/// for what it leaves out) in a state directory of its own; stopped
/// (SIGTERM, then SIGKILL after 10 s) on drop.
struct Serve {
    child: Child,
    addr: SocketAddr,
}

impl Serve {
    /// Starts the server with `tokens` (owner, token; read-write) under
    /// `ctx.dir/name` and waits until it says where it listens.
    fn start(ctx: &Ctx<'_>, name: &str, config: &str, tokens: &[(String, String)]) -> Result<Serve, String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let base = ctx.dir.join(name);
        std::fs::create_dir_all(&base).map_err(s)?;
        std::fs::write(base.join("config.toml"), config).map_err(s)?;
        let token_file = base.join("tokens");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .map_err(|e| format!("{}: {e}", token_file.display()))?;
        for (owner, token) in tokens {
            writeln!(f, "{owner} {token} rw").map_err(s)?;
        }
        drop(f);
        let mut c = Command::new(&ctx.cellhost);
        c.args(["serve", "--listen", "127.0.0.1:0", "--token-file"])
            .arg(&token_file);
        let mut child = ctx
            .kernel_flags(&mut c)
            .env("CELLHOST_STATE_DIR", base.join("state"))
            .env("CELLHOST_CONFIG", base.join("config.toml"))
            .env_remove("CELLHOST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", ctx.cellhost.display()))?;
        let Some(stderr) = child.stderr.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("cellhost serve: no stderr".into());
        };
        let mut serve = Serve {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let mut lines = BufReader::new(stderr);
        let mut line = String::new();
        loop {
            line.clear();
            if lines.read_line(&mut line).map_err(s)? == 0 {
                return Err("cellhost serve exited before it listened".into());
            }
            let addr = line
                .split_once("serving http://")
                .and_then(|(_, rest)| rest.split_once('/'))
                .and_then(|(a, _)| a.parse().ok());
            if let Some(a) = addr {
                serve.addr = a;
                break;
            }
        }
        // Keep reading its log, so a full pipe never stalls the server.
        std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
        Ok(serve)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// HTTP: execute through `cellhost serve`.
pub async fn http(ctx: &mut Ctx<'_>) -> R {
    let n = ctx.args.cells.max(1);
    let token = cellhost_server::auth::new_token();
    let serve = Serve::start(ctx, "http-bench", "", &[("bench".into(), token.clone())])?;
    let addr = serve.addr;
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
    tokio::task::spawn_blocking(move || drop(serve))
        .await
        .map_err(s)?;
    let mut r = row("HTTP", "cellhost serve: POST /v1/sessions/NAME/execute", &ms);
    r.note = "new TCP connection per request; default config".into();
    ctx.rows.push(r);
    Ok(())
}

/// HTTP50: 50 clients of one `cellhost serve`, each in its own session (its
/// own owner and token), running 100 cells concurrently; every cell prints
/// a tag naming its client and cell, and any output that is missing or
/// names another cell is counted.
pub async fn http50(ctx: &mut Ctx<'_>) -> R {
    const CLIENTS: usize = 50;
    const CELLS: usize = 100;
    let toks: Vec<(String, String)> = (0..CLIENTS)
        .map(|i| (format!("client{i}"), cellhost_server::auth::new_token()))
        .collect();
    // A live kernel for every client (the default cap is 16).
    let config = format!("max_live_kernels = {}\n", CLIENTS + 4);
    let serve = Serve::start(ctx, "http50-bench", &config, &toks)?;
    let addr = serve.addr;
    for (_, t) in &toks {
        let (code, text) = post(addr, "/v1/sessions", t, r#"{"name":"w"}"#).await?;
        if code != 201 {
            return Err(format!("HTTP50: create answered {code}: {text}"));
        }
    }
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (ci, (_, token)) in toks.iter().cloned().enumerate() {
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
    tokio::task::spawn_blocking(move || drop(serve))
        .await
        .map_err(s)?;
    ctx.rows.push(many_clients_row(
        "HTTP50",
        "cellhost serve: 50 clients × 100 cells, own sessions",
        &all,
        bad,
        wall,
        "",
    ));
    Ok(())
}

/// One MCP client over stdio: a `cellhost mcp` child spoken to in
/// newline-delimited JSON-RPC, as MCP clients do.
struct McpStdio {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    next_id: u64,
}

impl McpStdio {
    /// `cellhost mcp` with the bench's kernel flags and its state in `state`.
    fn command(ctx: &Ctx<'_>, state: &std::path::Path) -> Command {
        let mut c = ctx.cellhost();
        c.arg("mcp");
        ctx.kernel_flags(&mut c).env("CELLHOST_STATE_DIR", state);
        c
    }

    /// Starts `cmd` (from [`McpStdio::command`]) and initializes the session.
    fn start(mut cmd: Command) -> Result<Self, String> {
        let mut child = cmd
            .env("CELLHOST_POOL_SIZE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(s)?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut c = McpStdio {
            child,
            stdin,
            stdout,
            next_id: 1,
        };
        c.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "cellhost-bench", "version": "1"}
            }),
        )?;
        c.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        Ok(c)
    }

    fn send(&mut self, v: &serde_json::Value) -> Result<(), String> {
        use std::io::Write;
        let mut line = v.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).map_err(s)?;
        self.stdin.flush().map_err(s)
    }

    /// Sends a request and returns its response, skipping notifications.
    fn request(&mut self, method: &str, params: serde_json::Value) -> Result<serde_json::Value, String> {
        use std::io::BufRead;
        let id = self.next_id;
        self.next_id += 1;
        self.send(&serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line).map_err(s)? == 0 {
                return Err(format!("MCP server closed its stdout during {method}"));
            }
            let v: serde_json::Value = serde_json::from_str(&line).map_err(s)?;
            if v.get("id").and_then(|i| i.as_u64()) == Some(id) {
                if let Some(e) = v.get("error") {
                    return Err(format!("{method}: {e}"));
                }
                return Ok(v["result"].clone());
            }
        }
    }

    /// `execute_code` and the structured CellResult's stdout.
    fn execute(&mut self, code: &str) -> Result<String, String> {
        let r = self.request(
            "tools/call",
            serde_json::json!({"name": "execute_code", "arguments": {"code": code, "session": "bench"}}),
        )?;
        Ok(r["structuredContent"]["stdout"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }
}

impl Drop for McpStdio {
    fn drop(&mut self) {
        // Closing stdin ends the session; the server then exits.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// MCP: round trip of `x += 1` through `cellhost mcp` over stdio.
pub async fn mcp(ctx: &mut Ctx<'_>) -> R {
    let n = ctx.args.cells;
    let cmd = McpStdio::command(ctx, &ctx.dir.join("mcp-bench"));
    let lat = tokio::task::spawn_blocking(move || -> Result<Vec<f64>, String> {
        let mut c = McpStdio::start(cmd)?;
        c.execute("x = 0")?;
        for _ in 0..20 {
            c.execute("x += 1")?;
        }
        let mut lat = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            c.execute("x += 1")?;
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        Ok(lat)
    })
    .await
    .map_err(s)??;
    ctx.rows
        .push(row("MCP stdio round trip `x += 1`", "cellhost mcp", &lat));
    Ok(())
}

/// MCP50: 50 MCP stdio clients, each with its own server and session,
/// 100 cells each; counts lost or misattributed output.
pub async fn mcp50(ctx: &mut Ctx<'_>) -> R {
    const CLIENTS: usize = 50;
    const CELLS: usize = 100;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for ci in 0..CLIENTS {
        let cmd = McpStdio::command(ctx, &ctx.dir.join(format!("mcp50-{ci}")));
        tasks.push(tokio::task::spawn_blocking(
            move || -> Result<(Vec<f64>, usize), String> {
                let mut c = McpStdio::start(cmd)?;
                let mut ms = Vec::with_capacity(CELLS);
                let mut bad = 0;
                for i in 0..CELLS {
                    let tag = format!("client{ci}-cell{i}");
                    let t = Instant::now();
                    let out = c.execute(&format!("print({tag:?})"))?;
                    ms.push(t.elapsed().as_secs_f64() * 1000.0);
                    if out != format!("{tag}\n") {
                        bad += 1;
                    }
                }
                Ok((ms, bad))
            },
        ));
    }
    let mut all = Vec::new();
    let mut bad = 0;
    for t in tasks {
        let (ms, b) = t.await.map_err(s)??;
        all.extend(ms);
        bad += b;
    }
    let wall = t0.elapsed().as_secs_f64();
    ctx.rows.push(many_clients_row(
        "MCP50",
        "50 stdio clients × 100 cells, own servers",
        &all,
        bad,
        wall,
        " (server and kernel start-up included)",
    ));
    Ok(())
}

/// The row of a many-clients workload: latencies `all` (ms), `bad` cells
/// lost or misattributed, `wall` seconds for all of them.
fn many_clients_row(workload: &str, system: &str, all: &[f64], bad: usize, wall: f64, what: &str) -> Row {
    let mut r = row(workload, system, all);
    r.note = format!(
        "{:.0} cells/s{what}; {bad} of {} cells lost or misattributed",
        all.len() as f64 / wall,
        all.len()
    );
    r
}
