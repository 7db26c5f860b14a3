//! A stdio MCP server for cellhost-mcp's tests (the `cellhost` binary lives
//! in another crate): `cellhost-mcp-test --python PATH [--sandbox MODE]
//! [--state DIR] [--cell-timeout SECONDS]`. Logs go to standard error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use cellhost_sessions::cell::KernelConfig;
use cellhost_sessions::{Registry, RegistryConfig};

fn main() -> ExitCode {
    // The kernel init is a hidden subcommand of this binary.
    cellhost_sandbox::launcher::run_if_requested();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("CELLHOST_LOG"))
        .with_writer(std::io::stderr)
        .try_init();
    let mut python: Option<PathBuf> = None;
    let mut sandbox: Option<String> = None;
    let mut state: Option<PathBuf> = None;
    let mut cell_timeout: Option<String> = None;
    let mut max_disk_mb: Option<u64> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--python" => python = args.next().map(PathBuf::from),
            "--sandbox" => sandbox = args.next(),
            "--state" => state = args.next().map(PathBuf::from),
            "--cell-timeout" => cell_timeout = args.next(),
            // The operator's maximum of `limits.disk_mb` (`[limits.max]`).
            "--max-disk-mb" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) => max_disk_mb = Some(n),
                None => {
                    eprintln!("cellhost-mcp-test: --max-disk-mb takes a number of MiB");
                    return ExitCode::from(2);
                }
            },
            other => {
                eprintln!("cellhost-mcp-test: unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    let python = match cellhost_sessions::cell::resolve_python(python.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cellhost-mcp-test: {e}");
            return ExitCode::from(2);
        }
    };
    let state = state
        .unwrap_or_else(|| std::env::temp_dir().join(format!("cellhost-mcp-test-{}", std::process::id())));
    let mut cfg = KernelConfig::new(python, state.join("sessions"));
    if let Some(mode) = sandbox {
        match mode.parse() {
            Ok(m) => cfg.sandbox.mode = m,
            Err(e) => {
                eprintln!("cellhost-mcp-test: --sandbox: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(t) = cell_timeout {
        match t
            .parse::<f64>()
            .ok()
            .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
        {
            Some(d) => cfg.cell_timeout = Some(d),
            None => {
                eprintln!("cellhost-mcp-test: --cell-timeout: not a number of seconds: {t}");
                return ExitCode::from(2);
            }
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost-mcp-test: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(async move {
        let mut rc = RegistryConfig::new(&state, cfg);
        rc.pool_size = 1;
        rc.limits.max.disk_mb = max_disk_mb;
        let registry: Arc<Registry> = match Registry::start(rc, None).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cellhost-mcp-test: {e}");
                return ExitCode::from(1);
            }
        };
        let served = cellhost_mcp::serve_stdio(registry.clone(), cellhost_mcp::new_owner_id()).await;
        registry.shutdown().await;
        match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cellhost-mcp-test: {e}");
                ExitCode::from(1)
            }
        }
    })
}
