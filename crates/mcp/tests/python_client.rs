//! The official Python MCP SDK (`mcp` on PyPI) as a real client of
//! cellhost's MCP server over stdio: `tests/mcp_client.py` runs an analysis
//! session on the penguins data against the `cellhost-mcp-test` binary
//! (the same `serve_stdio` as `cellhost mcp`), and against
//! `http_router` (the endpoint at `/mcp`) (as
//! `cellhost serve` mounts it): state kept across calls, a
//! figure as image content, live output as progress notifications, a
//! cancellation that interrupts a sleeping cell while a variable survives,
//! a timeout, paging of spilled output, variables, sessions, restart.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` (scripts/test.sh sets it to the
//! project venv), else `python3`. Without the `mcp`, `pandas`,
//! `matplotlib` and `palmerpenguins` packages the test says so on stderr
//! and passes without running.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_mcp::SessionScope;
use cellhost_sessions::cell::KernelConfig;
use cellhost_sessions::{Registry, RegistryConfig};

fn python() -> PathBuf {
    std::env::var_os("CELLHOST_TEST_PYTHON")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

fn has_modules(py: &PathBuf, mods: &str) -> bool {
    Command::new(py)
        .args(["-c", &format!("import {mods}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn have_packages(py: &PathBuf) -> bool {
    if has_modules(py, "mcp, pandas, matplotlib, palmerpenguins") {
        return true;
    }
    eprintln!(
        "skipped: {} lacks mcp, pandas, matplotlib or palmerpenguins (set CELLHOST_TEST_PYTHON to the project venv)",
        py.display()
    );
    false
}

#[test]
fn python_sdk_client_over_stdio() {
    let py = python();
    if !have_packages(&py) {
        return;
    }
    let state = tempfile::tempdir().expect("tempdir");
    let server = env!("CARGO_BIN_EXE_cellhost-mcp-test");
    let py_arg = py.display().to_string();
    let state_arg = state.path().display().to_string();
    let out = run_client(&py, &[server, "--python", &py_arg, "--state", &state_arg]);
    // The R checks ran (or said why not: no R with jsonlite on PATH).
    assert!(
        out.contains("ok R: another language for the session is an error")
            || out.contains("skipped R checks"),
        "{out}"
    );
}

/// The workspace tools through the Python SDK over stdio: files, the
/// image budget, submitted cells, progress keepalives
/// (tests/mcp_workspace.py).
#[test]
fn python_sdk_workspace_tools() {
    let py = python();
    if !have_packages(&py) {
        return;
    }
    let state = tempfile::tempdir().expect("tempdir");
    let server = env!("CARGO_BIN_EXE_cellhost-mcp-test");
    let py_arg = py.display().to_string();
    let state_arg = state.path().display().to_string();
    let out = run_script(
        &py,
        "mcp_workspace.py",
        &[server, "--python", &py_arg, "--state", &state_arg],
    );
    assert!(out.contains("all checks passed"), "{out}");
}

/// `limits` and `network` of execute_code and submit_code through the
/// Python SDK over stdio, under an operator maximum of 64 MiB of disk
/// (tests/mcp_limits.py).
#[test]
fn python_sdk_session_limits_and_network() {
    let py = python();
    if !have_packages(&py) {
        return;
    }
    let state = tempfile::tempdir().expect("tempdir");
    let server = env!("CARGO_BIN_EXE_cellhost-mcp-test");
    let py_arg = py.display().to_string();
    let state_arg = state.path().display().to_string();
    let out = run_script(
        &py,
        "mcp_limits.py",
        &[
            server,
            "--python",
            &py_arg,
            "--state",
            &state_arg,
            "--max-disk-mb",
            "64",
        ],
    );
    assert!(out.contains("all checks passed"), "{out}");
}

/// The MCP row of the surface × request matrix (owners apart: the
/// streamable-HTTP test's `owners isolated` checks).
#[test]
fn python_sdk_matrix_timeout_sandbox_busy() {
    let py = python();
    if !have_packages(&py) {
        return;
    }
    let state = tempfile::tempdir().expect("tempdir");
    let server = env!("CARGO_BIN_EXE_cellhost-mcp-test");
    let py_arg = py.display().to_string();
    let state_arg = state.path().display().to_string();
    let out = run_client(
        &py,
        &[
            "--matrix",
            server,
            "--python",
            &py_arg,
            "--state",
            &state_arg,
            "--sandbox",
            "auto",
            "--cell-timeout",
            "2",
        ],
    );
    assert!(out.contains("ok matrix: busy is refused"), "{out}");
}

#[test]
fn python_sdk_client_over_streamable_http() {
    let py = python();
    if !have_packages(&py) {
        return;
    }
    let state = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let (registry, url) = rt.block_on(serve_http(&py, state.path(), SessionScope::Connection));
    let client = std::thread::spawn({
        let py = py.clone();
        move || {
            let out = run_client(&py, &[&url]);
            assert!(out.contains("ok owners isolated (b)"), "{out}");
            assert!(out.contains("ok another caller refused"), "{out}");
        }
    });
    let joined = client.join();
    // The client ended its MCP session (DELETE): its owner's kernels end too.
    let live = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while registry.stats().live > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        registry.stats().live
    });
    rt.block_on(registry.shutdown());
    if let Err(panic) = joined {
        std::panic::resume_unwind(panic);
    }
    assert_eq!(live, 0, "kernels of a closed MCP session are still alive");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A registry and the MCP endpoint over it on a loopback port, the
/// caller taken from an `x-test-caller` header (standing in for the HTTP
/// layer's bearer tokens); returns the registry and the endpoint's URL.
async fn serve_http(py: &Path, state: &Path, scope: SessionScope) -> (Arc<Registry>, String) {
    let mut cfg = KernelConfig::new(py.to_path_buf(), state.join("sessions"));
    // The kernel init is a hidden subcommand of a binary that handles it.
    cfg.launcher = Some(PathBuf::from(env!("CARGO_BIN_EXE_cellhost-mcp-test")));
    let mut rc = RegistryConfig::new(state, cfg);
    rc.pool_size = 1;
    let registry = Registry::start(rc, None).await.expect("registry");
    let app = cellhost_mcp::http_router_scoped(registry.clone(), Default::default(), scope).layer(
        axum::middleware::from_fn(
            |mut req: axum::extract::Request, next: axum::middleware::Next| async move {
                let caller = req
                    .headers()
                    .get("x-test-caller")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("anonymous")
                    .to_string();
                req.extensions_mut().insert(cellhost_mcp::HttpCaller(caller));
                next.run(req).await
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (registry, format!("http://127.0.0.1:{}/mcp", addr.port()))
}

/// `SessionScope::Caller`: two MCP connections of one caller, one after
/// the other, share its sessions (the state of the first is there in the
/// second), and closing a connection does not end them.
#[test]
fn python_sdk_sessions_kept_across_connections_for_a_caller() {
    let py = python();
    if !have_packages(&py) {
        return;
    }
    let state = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let (registry, url) = rt.block_on(serve_http(&py, state.path(), SessionScope::Caller));
    let client = std::thread::spawn({
        let py = py.clone();
        move || run_client(&py, &["--persist", &url])
    });
    let joined = client.join();
    let live = registry.stats().live;
    rt.block_on(registry.shutdown());
    let out = match joined {
        Ok(o) => o,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    assert!(
        out.contains("ok persist: a second connection sees the state"),
        "{out}"
    );
    assert_eq!(live, 1, "the caller's kernel ended with its MCP connection");
}

/// Runs tests/mcp_client.py with `args` and fails with its output unless
/// every check passed; returns its standard output.
fn run_client(py: &PathBuf, args: &[&str]) -> String {
    run_script(py, "mcp_client.py", args)
}

/// Runs `tests/<script>` with `args` and fails with its output unless every
/// check passed; returns its standard output.
fn run_script(py: &PathBuf, script: &str, args: &[&str]) -> String {
    let script = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(py)
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the Python client");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let tail: String = err
        .lines()
        .rev()
        .take(60)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    match status {
        Some(st) if st.success() => {
            assert!(
                out.contains("all checks passed"),
                "stdout:\n{out}\nstderr:\n{tail}"
            );
            assert!(!out.contains("FAIL"), "stdout:\n{out}");
            out
        }
        Some(st) => panic!("the Python MCP client failed ({st}):\n{out}\nstderr:\n{tail}"),
        None => panic!("the Python MCP client did not finish within 300 s:\n{out}\nstderr:\n{tail}"),
    }
}
