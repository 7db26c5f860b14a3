//! `cellhost serve [--listen ADDR] [--token-file PATH] [--workdir DIR] [--mcp-sessions connection|caller]`: the HTTP API
//! (REST + server-sent events, `/openapi.json`) and the MCP endpoint
//! (streamable HTTP at `/mcp`), both behind bearer tokens, every
//! connection within the `serve_*` limits of the config (header, idle and
//! body timeouts, a connection cap).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cellhost_server::http::{self, AppState};
use cellhost_server::listen::{ServeLimits, serve_with_limits};
use cellhost_server::{DEFAULT_LISTEN, Tokens};
use tokio::signal::unix::{SignalKind, signal};

use crate::KernelArgs;
use crate::common::{self, EXIT_USAGE};

/// Arguments of `serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    kernel: KernelArgs,
    /// Address to listen on (loopback by default).
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Token file: `OWNER TOKEN [rw|ro]` lines, mode 0600. Default:
    /// `STATE_DIR/server/tokens`, created with one token at first start.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// A directory every session works in (read-write for all of them, and
    /// so shared between owners). Default: each session works in a
    /// directory of its own, `STATE_DIR/work/OWNER-…/SESSION-…`, kept
    /// across its kernels, so owners and sessions share no files.
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// Whose sessions an MCP session at `/mcp` uses: `connection` (its
    /// own, ended with it) or `caller` (the token owner's, shared by all
    /// of that owner's MCP sessions and kept across them, for clients
    /// that open one connection per call).
    #[arg(long, value_name = "SCOPE", default_value = "connection", value_parser = ["connection", "caller"])]
    mcp_sessions: String,
}

/// Runs `serve`.
pub fn run(args: ServeArgs) -> u8 {
    let token_file = args
        .token_file
        .clone()
        .unwrap_or_else(|| common::state_dir().join("server").join("tokens"));
    let tokens = match Tokens::load_or_create(&token_file) {
        Ok((t, created)) => {
            if created {
                eprintln!("cellhost: created a token in {}", token_file.display());
            }
            t
        }
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    let mut template = match common::kernel_config(&args.kernel, "serve", &common::new_session_dir("serve")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    // Many owners share one server: the directory it was started from is
    // not theirs to share unless asked for.
    template.cwd = match &args.workdir {
        Some(dir) => match std::fs::canonicalize(dir) {
            Ok(d) if d.is_dir() && common::workdir_allowed(&d) => Some(d),
            Ok(d) => {
                eprintln!(
                    "cellhost: --workdir {}: not a directory a kernel may work in (not your home or a directory holding it)",
                    d.display()
                );
                return EXIT_USAGE;
            }
            Err(e) => {
                eprintln!("cellhost: --workdir {}: {e}", dir.display());
                return EXIT_USAGE;
            }
        },
        None => None,
    };
    // Without a shared workdir, each session gets one of its own, kept
    // across its kernels (restarts, crashes) under the state directory.
    let workdirs = template.cwd.is_none().then(|| common::state_dir().join("work"));
    let (limits, max_file_bytes) = match common::config() {
        Ok(c) => (
            ServeLimits {
                header_timeout: c.duration("serve_header_timeout_s"),
                idle_timeout: c.duration("serve_idle_timeout_s"),
                body_timeout: c.duration("serve_body_timeout_s"),
                max_connections: usize::try_from(c.int("serve_max_connections")).unwrap_or(1),
            },
            u64::try_from(c.int("file_max_mb")).unwrap_or(1) * 1024 * 1024,
        ),
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    common::block_on(async move {
        let reg = match common::start_registry(template, None, false, workdirs).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        };
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("cellhost: cannot listen on {}: {e}", args.listen);
                reg.shutdown().await;
                return 1;
            }
        };
        let addr = listener.local_addr().unwrap_or(args.listen);
        let state = AppState::with_max_file_bytes(reg.clone(), tokens, max_file_bytes);
        let scope = if args.mcp_sessions == "caller" {
            cellhost_mcp::SessionScope::Caller
        } else {
            cellhost_mcp::SessionScope::Connection
        };
        let mcp = axum_router_mcp(reg.clone(), scope);
        let app = http::router(state.clone()).merge(http::protect(state, mcp));
        eprintln!(
            "cellhost: serving http://{addr}/v1 (OpenAPI at /openapi.json, MCP at /mcp); tokens in {}",
            token_file.display()
        );
        let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(t), Ok(i)) => (t, i),
            _ => {
                eprintln!("cellhost: cannot listen for signals");
                reg.shutdown().await;
                return 1;
            }
        };
        let stop = Arc::new(tokio::sync::Notify::new());
        let stop2 = stop.clone();
        let mut server = tokio::spawn(serve_with_limits(listener, app, limits, async move {
            stop2.notified().await;
        }));
        let served = tokio::select! {
            r = &mut server => r,
            _ = term.recv() => {
                stop.notify_one();
                // Open event streams and MCP connections get 5 s to finish.
                tokio::time::timeout(Duration::from_secs(5), &mut server)
                    .await
                    .unwrap_or(Ok(Ok(())))
            }
            _ = int.recv() => {
                stop.notify_one();
                tokio::time::timeout(Duration::from_secs(5), &mut server)
                    .await
                    .unwrap_or(Ok(Ok(())))
            }
        };
        server.abort();
        reg.shutdown().await;
        match served {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                eprintln!("cellhost: {e}");
                1
            }
            Err(e) => {
                eprintln!("cellhost: {e}");
                1
            }
        }
    })
}

/// The MCP endpoint. The bearer-token layer (`http::protect`) runs first and
/// records the caller; this hands its owner to the MCP router, which binds
/// each MCP session to the caller that opened it (a leaked `Mcp-Session-Id`
/// is useless to anyone else: every method answers 404 for it).
fn axum_router_mcp(
    reg: Arc<cellhost_sessions::Registry>,
    scope: cellhost_mcp::SessionScope,
) -> cellhost_server::axum::Router {
    use cellhost_server::axum::extract::Request;
    use cellhost_server::axum::middleware::map_request;
    async fn tag_caller(mut req: Request) -> Request {
        if let Some(owner) = req
            .extensions()
            .get::<cellhost_server::auth::Caller>()
            .map(|c| c.owner.clone())
        {
            req.extensions_mut().insert(cellhost_mcp::HttpCaller(owner));
        }
        req
    }
    cellhost_mcp::http_router_scoped(reg, Default::default(), scope).layer(map_request(tag_caller))
}
