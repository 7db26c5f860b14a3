//! The agent's workspace through the real interfaces: files in and out of
//! a session (curl against `cellhost serve`; `cellhost cp` against the
//! daemon), displays by URL, and cells that outlive a call (curl:
//! `POST …/cells`, `GET /v1/cells/{cell}`, its SSE events from an offset,
//! `DELETE`, an interrupt that drops queued cells; the CLI: `exec --session
//! NAME --detach` and `cellhost wait`).
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH; without
//! curl the HTTP tests say so and pass.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

const TOKEN: &str = "workspace-token-0123456789abcdef0123";

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn have_curl() -> bool {
    let ok = Command::new("curl").arg("--version").output().is_ok();
    if !ok {
        eprintln!("curl not installed: skipped");
    }
    ok
}

/// A `cellhost serve` on loopback; killed (and reaped) on drop.
struct Serve {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    fn start(vars: &[(&str, &str)]) -> Serve {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("config.toml"), "").expect("config");
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, format!("tester {TOKEN} rw\n")).expect("tokens");
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--python",
            &python(),
            "--token-file",
        ])
        .arg(&tokens)
        .env("CELLHOST_STATE_DIR", dir.path().join("state"))
        .env("CELLHOST_CONFIG", dir.path().join("config.toml"))
        .env("CELLHOST_POOL_SIZE", "0")
        .current_dir(dir.path())
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
            }
        });
        // The server's announcement is the event; the bound only keeps a
        // broken server from hanging the test.
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("serve says where it listens");
        Serve {
            child,
            url: format!("http://{addr}"),
            dir,
        }
    }

    /// curl with the bearer token; `-s -w '\n%{http_code}'` appended: the
    /// body and the status.
    fn curl(&self, args: &[&str]) -> (String, u16) {
        let o = Command::new("curl")
            .args([
                "-s",
                "-H",
                &format!("Authorization: Bearer {TOKEN}"),
                "-w",
                "\n%{http_code}",
            ])
            .args(args)
            .output()
            .expect("curl");
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
        (body.to_string(), code.trim().parse().unwrap_or(0))
    }

    fn json(&self, args: &[&str]) -> (Value, u16) {
        let (b, c) = self.curl(args);
        (serde_json::from_str(&b).unwrap_or(Value::Null), c)
    }

    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    fn session(&self, name: &str) {
        let (v, c) = self.json(&[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            &format!(r#"{{"name": "{name}"}}"#),
            &self.at("/v1/sessions"),
        ]);
        assert_eq!(c, 201, "{v}");
    }

    fn execute(&self, name: &str, body: Value) -> Value {
        let (v, c) = self.json(&[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            &body.to_string(),
            &self.at(&format!("/v1/sessions/{name}/execute")),
        ]);
        assert_eq!(c, 200, "{v}");
        v
    }
}

#[test]
fn http_files_put_get_range_list_delete_and_the_size_cap() {
    if !have_curl() {
        return;
    }
    let serve = Serve::start(&[("CELLHOST_FILE_MAX_MB", "6")]);
    serve.session("w");
    // A 5 MiB upload, over the 4 MiB limit of JSON bodies: streamed.
    let big = serve.dir.path().join("big.bin");
    let data: Vec<u8> = (0..5 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&big, &data).expect("big");
    let big_arg = format!("@{}", big.display());
    let (v, c) = serve.json(&[
        "-X",
        "PUT",
        "--data-binary",
        &big_arg,
        &serve.at("/v1/sessions/w/files/in/big.bin"),
    ]);
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["path"], "in/big.bin");
    assert_eq!(v["size"], 5 * 1024 * 1024);
    assert_eq!(v["url"], "/v1/sessions/w/files/in/big.bin");
    // The next cell sees it; a file the cell writes is served at once.
    let r = serve.execute(
        "w",
        serde_json::json!({"code": "d = open('in/big.bin', 'rb').read()\nopen('out.txt', 'w').write('n=%d' % len(d))\nlen(d)"}),
    );
    assert_eq!(r["result"]["text/plain"], "5242880", "{r}");
    let (b, c) = serve.curl(&[&serve.at("/v1/sessions/w/files/out.txt")]);
    assert_eq!((b.as_str(), c), ("n=5242880", 200));
    // Streamed back whole, and by range.
    let back = serve.dir.path().join("back.bin");
    let back_arg = back.display().to_string();
    let (_, c) = serve.curl(&["-o", &back_arg, &serve.at("/v1/sessions/w/files/in/big.bin")]);
    assert_eq!(c, 200);
    assert_eq!(std::fs::read(&back).expect("back"), data);
    let (b, c) = serve.curl(&[
        "-H",
        "Range: bytes=2-5",
        &serve.at("/v1/sessions/w/files/out.txt"),
    ]);
    assert_eq!((b.as_str(), c), ("5242", 206));
    let (b, c) = serve.curl(&["-H", "Range: bytes=-3", &serve.at("/v1/sessions/w/files/out.txt")]);
    assert_eq!((b.as_str(), c), ("880", 206));
    let (v, c) = serve.json(&[
        "-H",
        "Range: bytes=100-",
        &serve.at("/v1/sessions/w/files/out.txt"),
    ]);
    assert_eq!(
        (c, v["error"]["code"].as_str()),
        (416, Some("range_not_satisfiable")),
        "{v}"
    );
    // Listing: name, path, type, size, mtime.
    let (v, c) = serve.json(&[&serve.at("/v1/sessions/w/files?path=in")]);
    assert_eq!(c, 200, "{v}");
    let e = &v["entries"][0];
    assert_eq!(
        (e["name"].as_str(), e["type"].as_str()),
        (Some("big.bin"), Some("file")),
        "{v}"
    );
    assert_eq!(e["size"], 5 * 1024 * 1024);
    assert!(e["mtime_ms"].as_i64().is_some_and(|t| t > 0), "{v}");
    // Over the cap (6 MiB here): 413, and nothing is left behind.
    let huge = serve.dir.path().join("huge.bin");
    std::fs::write(&huge, vec![7u8; 7 * 1024 * 1024]).expect("huge");
    let huge_arg = format!("@{}", huge.display());
    let (v, c) = serve.json(&[
        "-X",
        "PUT",
        "--data-binary",
        &huge_arg,
        &serve.at("/v1/sessions/w/files/in/huge.bin"),
    ]);
    assert_eq!(
        (c, v["error"]["code"].as_str()),
        (413, Some("file_too_large")),
        "{v}"
    );
    let (v, _) = serve.json(&[&serve.at("/v1/sessions/w/files?path=in")]);
    assert_eq!(v["entries"].as_array().map(Vec::len), Some(1), "{v}");
    // Delete, then it is gone.
    let (v, c) = serve.json(&["-X", "DELETE", &serve.at("/v1/sessions/w/files/in/big.bin")]);
    assert_eq!((c, v["type"].as_str()), (200, Some("file")), "{v}");
    let (v, c) = serve.json(&[&serve.at("/v1/sessions/w/files/in/big.bin")]);
    assert_eq!(
        (c, v["error"]["code"].as_str()),
        (404, Some("file_not_found")),
        "{v}"
    );
    // Another owner's session is not found, like a missing one.
    let (_, c) = serve.curl(&[&serve.at("/v1/sessions/nope/files/out.txt")]);
    assert_eq!(c, 404);
}

#[test]
fn http_displays_by_url_inline_or_none() {
    if !have_curl() {
        return;
    }
    let serve = Serve::start(&[]);
    serve.session("fig");
    let plot = "import matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()";
    let r = serve.execute("fig", serde_json::json!({"code": plot}));
    let png = &r["displays"][0]["data"]["image/png"];
    let url = png["url"].as_str().unwrap_or_else(|| panic!("no url: {r}"));
    assert!(url.starts_with("/v1/sessions/fig/displays/"), "{url}");
    let out = serve.dir.path().join("fig.png");
    let out_arg = out.display().to_string();
    let (_, c) = serve.curl(&["-o", &out_arg, &serve.at(url)]);
    assert_eq!(c, 200);
    let bytes = std::fs::read(&out).expect("png");
    assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
    assert_eq!(Some(bytes.len() as u64), png["bytes"].as_u64());
    let r = serve.execute("fig", serde_json::json!({"code": plot, "images": "inline"}));
    let b64 = r["displays"][0]["data"]["image/png"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"));
    assert!(b64.starts_with("iVBOR"), "{b64:.20}");
    let r = serve.execute("fig", serde_json::json!({"code": plot, "images": "none"}));
    let data = r["displays"][0]["data"].as_object().expect("bundle");
    assert!(
        !data.contains_key("image/png") && data.contains_key("text/plain"),
        "{r}"
    );
    let (v, c) = serve.json(&[&serve.at("/v1/sessions/fig/displays/c0-none.0")]);
    assert_eq!(
        (c, v["error"]["code"].as_str()),
        (404, Some("display_not_found")),
        "{v}"
    );
}

#[test]
fn http_cells_outlive_the_call_and_an_interrupt_drops_the_queue() {
    if !have_curl() {
        return;
    }
    let serve = Serve::start(&[]);
    serve.session("bg");
    let submit = |code: &str| {
        let (v, c) = serve.json(&[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            &serde_json::json!({ "code": code }).to_string(),
            &serve.at("/v1/sessions/bg/cells"),
        ]);
        assert_eq!(c, 202, "{v}");
        v["cell"].as_str().expect("cell").to_string()
    };
    let c1 = submit(
        "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.2)\n'done'",
    );
    let c2 = submit("x = 2");
    let (v, _) = serve.json(&[&serve.at("/v1/sessions/bg/cells")]);
    let listed: Vec<&str> = v["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .filter_map(|c| c["cell"].as_str())
        .collect();
    assert!(listed.contains(&c2.as_str()), "{v}");
    // Its events, as server-sent events, until the result.
    let (sse, c) = serve.curl(&["-N", &serve.at(&format!("/v1/cells/{c1}/events"))]);
    assert_eq!(c, 200);
    assert!(sse.contains("event: stream") && sse.contains("step 2"), "{sse}");
    assert!(sse.contains("event: result"), "{sse}");
    // From an offset: the first event is skipped.
    let (from1, _) = serve.curl(&["-N", &serve.at(&format!("/v1/cells/{c1}/events?offset=1"))]);
    assert!(
        !from1.contains("id: 0\n") && from1.contains("event: result"),
        "{from1}"
    );
    let (after, _) = serve.curl(&[
        "-N",
        "-H",
        "Last-Event-ID: 0",
        &serve.at(&format!("/v1/cells/{c1}/events")),
    ]);
    assert_eq!(after, from1);
    let (v, _) = serve.json(&[&serve.at(&format!("/v1/cells/{c1}"))]);
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(v["result"]["result"]["text/plain"], "'done'", "{v}");
    assert!(v["stdout"].as_str().is_some_and(|s| s.contains("step 0")), "{v}");
    // A running cell, two queued: DELETE dequeues one, an interrupt stops
    // the running one and names the queued one it dropped.
    let long = submit("import time\nprint('long', flush=True)\ntime.sleep(120)");
    let q1 = submit("dropped_by_delete = 1");
    let q2 = submit("dropped_by_interrupt = 1");
    let (events, _) = {
        // Wait for the long cell to be running: its first stream event.
        let o = Command::new("curl")
            .args([
                "-s",
                "-N",
                "-H",
                &format!("Authorization: Bearer {TOKEN}"),
                "--max-time",
                "60",
            ])
            .arg(serve.at(&format!("/v1/cells/{long}/events")))
            .stdout(Stdio::piped())
            .spawn()
            .expect("curl");
        let mut o = o;
        let mut lines = BufReader::new(o.stdout.take().expect("stdout")).lines();
        let mut seen = String::new();
        for l in lines.by_ref().map_while(Result::ok) {
            seen.push_str(&l);
            seen.push('\n');
            if l.contains("long") {
                break;
            }
        }
        let _ = o.kill();
        let _ = o.wait();
        (seen, ())
    };
    assert!(events.contains("long"), "{events}");
    let (v, c) = serve.json(&["-X", "DELETE", &serve.at(&format!("/v1/cells/{q1}"))]);
    assert_eq!((c, v["action"].as_str()), (200, Some("dequeued")), "{v}");
    let (v, c) = serve.json(&["-X", "POST", &serve.at("/v1/sessions/bg/interrupt")]);
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["delivered"], true, "{v}");
    assert_eq!(v["dropped"], serde_json::json!([q2]), "{v}");
    let (v, _) = serve.json(&[&serve.at(&format!("/v1/cells/{q2}"))]);
    assert_eq!(v["status"], "cancelled", "{v}");
    let (sse, _) = serve.curl(&["-N", &serve.at(&format!("/v1/cells/{long}/events"))]);
    assert!(
        sse.contains("event: result") && sse.contains("interrupted"),
        "{sse}"
    );
    let r = serve.execute(
        "bg",
        serde_json::json!({"code": "('dropped_by_delete' in globals(), 'dropped_by_interrupt' in globals(), x)"}),
    );
    assert_eq!(r["result"]["text/plain"], "(False, False, 2)", "{r}");
    let (v, c) = serve.json(&[&serve.at("/v1/cells/bnosuchcell")]);
    assert_eq!(
        (c, v["error"]["code"].as_str()),
        (404, Some("cell_not_found")),
        "{v}"
    );
}

/// A `cellhost` command with a private state, runtime and config directory
/// (its daemon is stopped by [`Daemon`]'s drop).
struct Daemon {
    dir: tempfile::TempDir,
}

impl Daemon {
    fn new() -> Daemon {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("run")).expect("run");
        std::fs::create_dir_all(dir.path().join("work")).expect("work");
        std::fs::write(dir.path().join("config.toml"), "").expect("config");
        Daemon { dir }
    }

    fn work(&self) -> std::path::PathBuf {
        self.dir.path().join("work")
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_cellhost"))
            .args(args)
            .env("CELLHOST_STATE_DIR", self.dir.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("CELLHOST_CONFIG", self.dir.path().join("config.toml"))
            .env("CELLHOST_DAEMON_IDLE_S", "600")
            .env("CELLHOST_POOL_SIZE", "0")
            .env_remove("CELLHOST_LOG")
            .current_dir(self.work())
            .stdin(Stdio::null())
            .output()
            .expect("cellhost")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.run(&["daemon", "stop"]);
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn cli_cp_in_and_out_of_a_daemon_session() {
    let d = Daemon::new();
    let py = python();
    let o = d.run(&[
        "exec",
        "--python",
        &py,
        "--session",
        "cps",
        "import os; os.makedirs('sub', exist_ok=True)",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let local = d.dir.path().join("local.csv");
    std::fs::write(&local, "a,b\n1,2\n").expect("local");
    let local_arg = local.display().to_string();
    let o = d.run(&["cp", &local_arg, "cps:sub/data.csv"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = d.run(&[
        "exec",
        "--python",
        &py,
        "--session",
        "cps",
        "print(open('sub/data.csv').read(), end=''); _ = open('res.txt', 'w').write('from the cell')",
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "a,b\n1,2\n", "{}", text(&o));
    let back = d.dir.path().join("back.txt");
    let back_arg = back.display().to_string();
    let o = d.run(&["cp", "cps:res.txt", &back_arg]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&back).expect("back"), "from the cell");
    // Out of the workdir: refused (exit 2), nothing written.
    let o = d.run(&["cp", "cps:../../../../etc/passwd", &back_arg]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("path_refused"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read_to_string(&back).expect("back"), "from the cell");
    let o = d.run(&["cp", &local_arg, "cps:../escaped.csv"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!Path::new(&d.dir.path().join("escaped.csv")).exists());
    // Both local, or both remote: usage.
    let o = d.run(&["cp", &local_arg, &back_arg]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn cli_exec_detach_prints_the_cell_and_wait_prints_its_result() {
    let d = Daemon::new();
    let py = python();
    let o = d.run(&[
        "exec",
        "--python",
        &py,
        "--session",
        "bgs",
        "--detach",
        "import time\ntime.sleep(0.5)\nprint('slow work done')\nanswer = 42",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let cell = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(
        cell.starts_with('b') && !cell.contains(char::is_whitespace),
        "{}",
        text(&o)
    );
    let o = d.run(&["wait", &cell]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("slow work done"),
        "{}",
        text(&o)
    );
    // The session kept the cell's state; a failing detached cell's exit
    // code is its status.
    let o = d.run(&["exec", "--python", &py, "--session", "bgs", "print(answer)"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "42\n", "{}", text(&o));
    let o = d.run(&["exec", "--python", &py, "--session", "bgs", "--detach", "1/0"]);
    let failing = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let o = d.run(&["wait", "--json", &failing]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["error"]["ename"], "ZeroDivisionError", "{v}");
    let o = d.run(&["wait", "bnosuchcell"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
