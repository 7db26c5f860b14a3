//! `cellhost serve` against its own OpenAPI document: schemathesis (pinned
//! in python/requirements.txt) generates requests from `/openapi.json` —
//! boundary values and invalid ones (coverage), random ones (fuzzing) and
//! linked sequences (stateful) — and checks every answer: no 5xx, bodies
//! that match the documented schema, documented statuses and content
//! types. Bounded: 30 examples an operation (about 600 cases), a fixed
//! seed, loopback only, and the run is killed after 150 s.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3`; schemathesis is
//! looked up beside it. Without it the test says so and passes.

mod serve_address;
use serve_address::serve_address;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "schemathesis-token-0123456789abcdef";

fn python() -> PathBuf {
    std::env::var_os("CELLHOST_TEST_PYTHON")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// Kills the child when the test ends, passing or not.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_off_the_document() {
    let py = python();
    let st = py.with_file_name("schemathesis");
    if !st.exists() {
        eprintln!(
            "skipped: no schemathesis beside {} (scripts/setup-venv.sh installs it)",
            py.display()
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("config.toml"), "").expect("config");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("tester {TOKEN} rw\n")).expect("tokens");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut serve = Guard(
        Command::new(env!("CARGO_BIN_EXE_cellhost"))
            .args(["serve", "--listen", "127.0.0.1:0", "--python"])
            .arg(&py)
            .arg("--token-file")
            .arg(&tokens)
            .env("CELLHOST_STATE_DIR", dir.path().join("state"))
            .env("CELLHOST_CONFIG", dir.path().join("config.toml"))
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve"),
    );
    let (addr, _rx) = serve_address(&mut serve.0, Duration::from_secs(60));
    let addr = addr.expect("serve says where it listens");
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let mut run = Guard(
        Command::new(&st)
            .arg("run")
            .arg(format!("http://{addr}/openapi.json"))
            .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
            .args([
                "--checks",
                "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance",
            ])
            .args(["--phases", "coverage,fuzzing,stateful"])
            // The install route runs an installer against the package
            // index: generated specs would download arbitrary packages, and
            // a name the index lacks is rightly 502 `install_failed`. Its
            // refusals are tested in the escape suite, its installs in
            // tests/packages.rs.
            .args(["--exclude-path", "/v1/sessions/{name}/packages"])
            .args(["--max-examples", "30", "--seed", "20261201", "--no-shrink"])
            .args(["--request-timeout", "60", "--workers", "1"])
            .env("NO_COLOR", "1")
            .env("SCHEMATHESIS_TELEMETRY", "false")
            // Its cache (.schemathesis/) goes to the test's directory, not the source tree.
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn schemathesis"),
    );
    let mut out = run.0.stdout.take().expect("stdout");
    let mut err = run.0.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        let _ = err.read_to_string(&mut s);
        s
    });
    // A hang guard, not a speed check: on a loaded machine the bounded run
    // takes minutes.
    let deadline = Instant::now() + Duration::from_secs(900);
    let status = loop {
        if let Some(s) = run.0.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if status.is_none() {
        let _ = run.0.kill();
    }
    let log = reader.join().unwrap_or_default();
    let status = status.unwrap_or_else(|| {
        panic!("schemathesis ran past 900 s (a hang: its work is bounded by --max-examples):\n{log}")
    });
    assert!(status.success(), "schemathesis found problems:\n{log}");
    assert!(log.contains("passed"), "{log}");
    // The server is healthy after the run.
    assert!(serve.0.try_wait().expect("wait").is_none(), "serve died:\n{log}");
}
