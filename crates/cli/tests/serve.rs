//! `cellhost serve` end to end: the token file made at first start (mode
//! 0600), `scripts/curl-smoke.sh` against the real binary, bearer auth in
//! front of the MCP endpoint at `/mcp`, and a clean exit on SIGTERM.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

mod serve_address;
use serve_address::serve_address;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn curl(args: &[&str]) -> String {
    let o = Command::new("curl").args(args).output().expect("curl");
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[test]
fn serve_with_token_file_curl_mcp_auth_and_sigterm() {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("curl not installed: skipped");
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("config.toml"), "").expect("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(["serve", "--listen", "127.0.0.1:0", "--python", &python()])
        .env("CELLHOST_STATE_DIR", dir.path().join("state"))
        .env("CELLHOST_CONFIG", dir.path().join("config.toml"))
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let (addr, _rx) = serve_address(&mut child, Duration::from_secs(60));
    let Some(addr) = addr else {
        let _ = child.kill();
        panic!("serve did not say where it listens");
    };
    let url = format!("http://{addr}");
    let tokens = dir.path().join("state/server/tokens");
    let mode = std::fs::metadata(&tokens)
        .expect("token file")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&tokens).expect("read tokens");
    let token = text
        .lines()
        .find(|l| l.starts_with("local "))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("a token for owner local")
        .to_string();

    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/curl-smoke.sh"
        ))
        .env("CELLHOST_URL", &url)
        .env("CELLHOST_TOKEN", &token)
        .output()
        .expect("curl-smoke.sh");
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && log.contains("all passed"), "{log}");

    // The MCP endpoint is behind the same tokens.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
    let mcp = format!("{url}/mcp");
    // The HTTP status of an MCP initialize posted with `extra` headers.
    let initialize = |extra: &[&str]| {
        let mut args = vec!["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"];
        for h in extra {
            args.extend(["-H", h]);
        }
        args.extend([
            "-H",
            "Content-Type: application/json",
            "-H",
            "Accept: application/json, text/event-stream",
            "-d",
            init,
            &mcp,
        ]);
        curl(&args)
    };
    let no_token = initialize(&[]);
    assert_eq!(no_token, "401");
    let auth = format!("Authorization: Bearer {token}");
    let with_token = initialize(&[&auth]);
    assert_eq!(with_token, "200", "MCP initialize through /mcp");

    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            assert_eq!(st.code(), Some(0), "serve exits 0 on SIGTERM");
            break;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("serve did not exit on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Why a template is not (fully) used shows on stderr at the default log
/// level, without `CELLHOST_LOG`: here, a preloaded module it cannot import.
#[test]
fn serve_says_why_its_template_falls_short_without_cellhost_log() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("config.toml"), "pool_size = 1\n").expect("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(["serve", "--listen", "127.0.0.1:0", "--python", &python()])
        .env("CELLHOST_STATE_DIR", dir.path().join("state"))
        .env("CELLHOST_CONFIG", dir.path().join("config.toml"))
        .env("CELLHOST_PRELOAD", "json, no_such_module_xyz")
        .env_remove("CELLHOST_LOG")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let mut found = None;
    let until = Instant::now() + Duration::from_secs(60);
    while found.is_none() && Instant::now() < until {
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) {
            if line.contains("modules not preloaded") {
                found = Some(line.clone());
            }
            seen.push(line);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let line =
        found.unwrap_or_else(|| panic!("no warning about the template on stderr:\n{}", seen.join("\n")));
    assert!(
        line.contains("WARN") && line.contains("no_such_module_xyz") && line.contains("ModuleNotFoundError"),
        "{line}"
    );
}
