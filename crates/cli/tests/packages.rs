//! Packages at runtime through the real interfaces, against the real
//! package index: `cellhost install` (daemon) and `%pip install` in a cell
//! install a small pure-Python wheel from PyPI into the session's overlay,
//! the next cell imports it, the session's own code stays offline (its
//! `urlopen` of the index fails), a module imported before the install
//! makes the result say a restart is needed, and `restore` replays the
//! install; HTTP `POST …/packages` through curl does the same for a served
//! session.
//!
//! Each test needs the network: when the index is unreachable it prints
//! why and returns. The interpreter is `CELLHOST_TEST_PYTHON` or `python3`.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

const INDEX: &str = cellhost_testkit::index::TOMLI;

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether the package index answers; prints why not.
fn index_reachable() -> bool {
    cellhost_testkit::index::reachable(INDEX)
}

struct Env {
    dir: TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("run")).expect("run dir");
        std::fs::write(dir.path().join("config.toml"), "").expect("config");
        Env { dir }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        c.args(args)
            .env("CELLHOST_STATE_DIR", self.dir.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("CELLHOST_DAEMON_IDLE_S", "600")
            .env("CELLHOST_CONFIG", self.dir.path().join("config.toml"))
            .env_remove("CELLHOST_LOG")
            .stdin(Stdio::null())
            .current_dir(self.dir.path());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run cellhost")
    }

    fn exec_json(&self, session: &str, code: &str) -> Value {
        let py = python();
        let o = self.run(&["exec", "--python", &py, "--session", session, "--json", code]);
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)))
    }
}

impl Drop for Env {
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

const OFFLINE: &str = "import urllib.request\ntry:\n    urllib.request.urlopen('https://pypi.org/simple/tomli/', timeout=10)\n    print('ONLINE')\nexcept Exception as e:\n    print('offline:', type(e).__name__)";

/// `cellhost install s tomli` then `import tomli` in the next cell, from
/// the overlay; user code offline; `%pip install six` in a cell after `import six`
/// says a restart is needed; `restore` replays both installs.
#[test]
fn install_from_the_index_imports_next_cell_while_offline() {
    if !index_reachable() {
        return;
    }
    let env = Env::new();
    let py = python();
    let o = env.run(&["install", "--python", &py, "--json", "s", "tomli"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("report JSON");
    let installed = v["report"]["installed"].as_array().cloned().unwrap_or_default();
    assert!(installed.iter().any(|d| d["name"] == "tomli"), "{v}");
    assert_eq!(v["report"]["target"], "overlay", "{v}");
    assert_eq!(v["report"]["restart_needed"], false, "{v}");

    let r = env.exec_json(
        "s",
        "import tomli\nprint(tomli.loads('a = 1')['a'], tomli.__file__)",
    );
    assert_eq!(r["status"], "ok", "{r}");
    let out = r["stdout"].as_str().unwrap_or_default();
    assert!(out.starts_with("1 "), "{r}");
    assert!(
        out.contains("/packages/"),
        "tomli must come from the overlay: {r}"
    );

    let r = env.exec_json("s", OFFLINE);
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        r["stdout"].as_str().unwrap_or_default().starts_with("offline:"),
        "{r}"
    );

    // The overlay is the host's: the kernel cannot write into it.
    let r = env.exec_json(
        "s",
        "import os, tomli\nd = os.path.dirname(os.path.dirname(tomli.__file__))\ntry:\n    open(os.path.join(d, 'planted.py'), 'w').write('x')\n    print('WROTE')\nexcept OSError as e:\n    print('refused', e.errno)",
    );
    assert!(
        r["stdout"].as_str().unwrap_or_default().starts_with("refused"),
        "{r}"
    );

    // %pip in a cell; six imported before from the interpreter's own
    // site-packages (or failing), so a restart is needed when it had been.
    let r = env.exec_json("s", "try:\n    import six\nexcept ImportError:\n    pass");
    assert_eq!(r["status"], "ok", "{r}");
    let r = env.exec_json("s", "%pip install six");
    assert_eq!(r["status"], "ok", "{r}");
    // The installer's output is the cell's, once (followed while it ran).
    let out = r["stdout"].as_str().unwrap_or_default();
    assert_eq!(out.matches("Successfully installed six").count(), 1, "{r}");
    let tools = r["tool_calls"].as_array().cloned().unwrap_or_default();
    assert!(
        tools
            .iter()
            .any(|t| t["name"] == "cellhost.install_packages" && t["outcome"] == "ok"),
        "{r}"
    );
    let r2 = env.exec_json("s", "import sys\nprint('six' in sys.modules)");
    if r2["stdout"] == "True\n" {
        let err = r["stderr"].as_str().unwrap_or_default();
        assert!(err.contains("restart the kernel"), "{r}");
    }
    let r = env.exec_json("s", "import importlib, six\nprint(six.__name__)");
    assert_eq!(r["stdout"], "six\n", "{r}");

    // restore replays the journaled install cells into a new kernel.
    let o = env.run(&["kill", "s"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["restore", "--python", &py, "s"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.exec_json("s", "import tomli\nprint(tomli.loads('b = 2')['b'])");
    assert_eq!(r["stdout"], "2\n", "{r}");
    let r = env.exec_json("s", OFFLINE);
    assert!(
        r["stdout"].as_str().unwrap_or_default().starts_with("offline:"),
        "{r}"
    );
}

struct Serve {
    child: Child,
    addr: String,
    _env: Env,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TOKEN: &str = "pppppppppppppppppppppppppppppppp";

fn serve() -> Serve {
    let env = Env::new();
    let tokens = env.dir.path().join("tokens");
    std::fs::write(&tokens, format!("alice {TOKEN} rw\n")).expect("tokens");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let py = python();
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
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
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
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("serve did not say where it listens");
    Serve {
        child,
        addr,
        _env: env,
    }
}

fn curl(s: &Serve, method: &str, path: &str, body: &str) -> (u16, Value) {
    let url = format!("http://{}{path}", s.addr);
    let o = Command::new("curl")
        .args(["-sS", "-X", method, "-H"])
        .arg(format!("Authorization: Bearer {TOKEN}"))
        .args([
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            "-w",
            "\n%{http_code}",
            &url,
        ])
        .output()
        .expect("curl");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap_or((&out, "0"));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// HTTP through curl: `POST /v1/sessions/p/packages {"packages": ["tomli"]}`
/// then `import tomli` in the next execute; the session is offline.
#[test]
fn http_install_with_curl() {
    if !index_reachable() {
        return;
    }
    let s = serve();
    let (code, v) = curl(&s, "POST", "/v1/sessions", r#"{"name": "p"}"#);
    assert_eq!(code, 201, "{v}");
    let (code, v) = curl(
        &s,
        "POST",
        "/v1/sessions/p/packages",
        r#"{"packages": ["tomli"]}"#,
    );
    assert_eq!(code, 200, "{v}");
    assert!(
        v["report"]["installed"]
            .as_array()
            .is_some_and(|a| a.iter().any(|d| d["name"] == "tomli")),
        "{v}"
    );
    assert_eq!(v["result"]["status"], "ok", "{v}");
    let body = serde_json::json!({"code": "import tomli\ntomli.loads('x = 3')['x']"}).to_string();
    let (code, v) = curl(&s, "POST", "/v1/sessions/p/execute", &body);
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["result"]["text/plain"], "3", "{v}");
    let body = serde_json::json!({ "code": OFFLINE }).to_string();
    let (_, v) = curl(&s, "POST", "/v1/sessions/p/execute", &body);
    assert!(
        v["stdout"].as_str().unwrap_or_default().starts_with("offline:"),
        "{v}"
    );
    // A package the index does not have: install_failed with pip's stderr.
    let (code, v) = curl(
        &s,
        "POST",
        "/v1/sessions/p/packages",
        r#"{"packages": ["cellhost-no-such-package-zzz"]}"#,
    );
    assert_eq!(code, 502, "{v}");
    assert_eq!(v["error"]["code"], "install_failed", "{v}");
    assert!(
        v["error"]["stderr_tail"].as_str().is_some_and(|t| !t.is_empty()),
        "{v}"
    );
}

/// A module imported before an install replaces it: the report says
/// `restart_needed` (naming it), the cell prints a note, the overlay's
/// metadata names the new version only, and the next kernel imports it.
#[test]
fn replacing_an_imported_module_needs_a_restart() {
    if !index_reachable() {
        return;
    }
    let env = Env::new();
    let py = python();
    let install = |spec: &str| -> Value {
        let o = env.run(&["install", "--python", &py, "--json", "r", spec]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        serde_json::from_slice(&o.stdout).expect("report JSON")
    };
    let v = install("tomli==2.0.1");
    assert_eq!(v["report"]["restart_needed"], false, "{v}");
    let r = env.exec_json(
        "r",
        "import tomli, importlib.metadata as m\nprint(m.version('tomli'))",
    );
    assert_eq!(r["stdout"], "2.0.1\n", "{r}");
    let v = install("tomli==2.2.1");
    assert_eq!(v["report"]["restart_needed"], true, "{v}");
    assert_eq!(
        v["report"]["restart_modules"],
        serde_json::json!(["tomli"]),
        "{v}"
    );
    assert!(
        v["result"]["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("restart the kernel"),
        "{v}"
    );
    let r = env.exec_json("r", "import importlib.metadata as m\nprint(m.version('tomli'))");
    assert_eq!(r["stdout"], "2.2.1\n", "{r}");
    let o = env.run(&["kill", "r"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.exec_json(
        "r",
        "import tomli, importlib.metadata as m\nprint(m.version('tomli'), tomli.loads('a = 1')['a'])",
    );
    assert_eq!(r["stdout"], "2.2.1 1\n", "{r}");
}
