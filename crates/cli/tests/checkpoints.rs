//! Checkpoints, automatic restores and pause/resume through `cellhost
//! serve`'s HTTP API (the real binary, curl as the client): a kernel
//! SIGKILLed mid-analysis continues from its last checkpoint (what was
//! restored and lost named), a paused session frees its kernel and survives
//! a restart of `serve`, and checkpoint bytes a cell forged are unpickled
//! only inside the new sandboxed kernel.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` (numpy and pandas needed) or
//! `python3` on PATH.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn has(module: &str) -> bool {
    Command::new(python())
        .args(["-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A running `cellhost serve` on a state directory; stopped (SIGTERM,
/// reaped) on drop.
struct Serve {
    child: Child,
    url: String,
    token: String,
}

impl Serve {
    fn start(dir: &std::path::Path) -> Serve {
        Serve::start_with(dir, &[])
    }

    /// With `extra` flags for `serve`.
    fn start_with(dir: &std::path::Path, extra: &[&str]) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost"))
            .args(["serve", "--listen", "127.0.0.1:0", "--python", &python()])
            .args(extra)
            .env("CELLHOST_STATE_DIR", dir.join("state"))
            .env("CELLHOST_CONFIG", dir.join("config.toml"))
            .current_dir(dir)
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
        let mut addr = None;
        let until = Instant::now() + Duration::from_secs(120);
        while addr.is_none() && Instant::now() < until {
            if let Ok(line) = rx.recv_timeout(Duration::from_secs(1))
                && let Some(rest) = line.split("serving http://").nth(1)
            {
                addr = rest.split('/').next().map(str::to_string);
            }
        }
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve did not say where it listens");
        };
        let text = std::fs::read_to_string(dir.join("state/server/tokens")).expect("tokens");
        let token = text
            .lines()
            .find(|l| l.starts_with("local "))
            .and_then(|l| l.split_whitespace().nth(1))
            .expect("token")
            .to_string();
        Serve {
            child,
            url: format!("http://{addr}"),
            token,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let auth = format!("Authorization: Bearer {}", self.token);
        let url = format!("{}{path}", self.url);
        let mut args = vec!["-s", "-X", method, "-H", &auth];
        let data = body.map(|b| b.to_string());
        if let Some(d) = &data {
            args.extend(["-H", "Content-Type: application/json", "-d", d]);
        }
        args.push(&url);
        let o = Command::new("curl").args(&args).output().expect("curl");
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "{method} {path}: not JSON ({e}): {}",
                String::from_utf8_lossy(&o.stdout)
            )
        })
    }

    fn exec(&self, session: &str, code: &str) -> Value {
        self.call(
            "POST",
            &format!("/v1/sessions/{session}/execute"),
            Some(json!({"code": code, "queue": true})),
        )
    }

    /// SIGTERM, then reaped.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let _ = self.child.wait();
        }
    }
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn lost_names(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn ready() -> Option<tempfile::TempDir> {
    if Command::new("curl").arg("--version").output().is_err() || !has("numpy") || !has("pandas") {
        eprintln!("curl, numpy or pandas missing: skipped");
        return None;
    }
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("config.toml"), "pool_size = 0\n").expect("config");
    Some(dir)
}

#[test]
fn a_kernel_sigkilled_mid_analysis_continues_from_its_last_checkpoint() {
    let Some(dir) = ready() else { return };
    let s = Serve::start(dir.path());
    let made = s.call(
        "POST",
        "/v1/sessions",
        Some(json!({"name": "ana", "checkpoint": "namespace"})),
    );
    assert_eq!(made["name"], "ana", "{made}");
    let r = s.exec(
        "ana",
        "import numpy as np, pandas as pd, threading\n\
         rng = np.random.default_rng(7)\n\
         df = pd.DataFrame({'x': rng.normal(size=1000), 'g': rng.integers(0, 4, 1000)})\n\
         means = df.groupby('g').x.mean()\n\
         gen = (i for i in range(3))\n\
         lock = threading.Lock()\n\
         total = float(df.x.sum())",
    );
    assert_eq!(r["status"], "ok", "{r}");
    // The next cell changes the frame and is SIGKILLed halfway.
    let r = s.exec(
        "ana",
        "df['y'] = df.x * 2\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    );
    assert_eq!(r["status"], "crashed", "{r}");
    let r = s.exec(
        "ana",
        "(round(float(df.x.sum()) - total, 9), list(df.columns), len(means))",
    );
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        r["result"]["text/plain"], "(0.0, ['x', 'g'], 4)",
        "the analysis continues from the checkpoint: {r}"
    );
    let restored = &r["restored"];
    assert_eq!(restored["source"], "checkpoint", "{r}");
    assert_eq!(restored["resumed"], false);
    assert_eq!(restored["execution_count"], 1, "from the first cell: {restored}");
    assert!(restored["checkpoint_ms"].as_i64().unwrap_or(0) > 0);
    let back = names(&restored["restored"]);
    for n in ["df", "means", "total", "np", "pd", "threading", "rng"] {
        assert!(back.contains(&n.to_string()), "{n} restored: {restored}");
    }
    let lost = lost_names(&restored["lost"]);
    assert!(
        lost.contains(&"gen".to_string()) && lost.contains(&"lock".to_string()),
        "unpicklable names named: {restored}"
    );
    let lost_cells = restored["lost_cells"].as_array().cloned().unwrap_or_default();
    assert!(
        lost_cells.iter().any(|c| c["status"] == "crashed"),
        "the crashed cell is named as lost: {restored}"
    );
    assert!(
        restored["reason"]
            .as_str()
            .is_some_and(|w| w.contains("SIGKILL") || w.contains("signal")),
        "{restored}"
    );
    assert_eq!(
        r["execution_count"], 2,
        "the count goes on from the checkpoint: {r}"
    );
    s.stop();
}

#[test]
fn a_paused_session_frees_its_kernel_and_survives_a_serve_restart() {
    let Some(dir) = ready() else { return };
    let s = Serve::start(dir.path());
    let made = s.call("POST", "/v1/sessions", Some(json!({"name": "p"})));
    assert_eq!(made["name"], "p", "{made}");
    let r = s.exec("p", "import numpy as np\na = np.ones(10_000_000)\nlabel = 'kept'");
    assert_eq!(r["status"], "ok", "{r}");
    let pid = r["kernel"]["pid"].as_u64().expect("pid");
    let p = s.call("POST", "/v1/sessions/p/pause", None);
    assert_eq!(p["session"], "p", "{p}");
    assert_eq!(p["pid"].as_u64(), Some(pid));
    assert!(
        p["memory_freed_bytes"].as_u64().unwrap_or(0) > 50 << 20,
        "the 80 MB array's memory is freed: {p}"
    );
    assert!(names(&p["checkpoint"]["saved"]).contains(&"a".to_string()), "{p}");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the kernel process is gone"
    );
    // Paused twice: no live kernel.
    let again = s.call("POST", "/v1/sessions/p/pause", None);
    assert_eq!(again["error"]["code"], "session_not_found", "{again}");
    s.stop();

    let s = Serve::start(dir.path());
    let made = s.call("POST", "/v1/sessions", Some(json!({"name": "p"})));
    assert_eq!(made["name"], "p", "{made}");
    let r = s.exec("p", "(float(a.sum()), label)");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["result"]["text/plain"], "(10000000.0, 'kept')", "{r}");
    assert_eq!(r["restored"]["resumed"], true, "{r}");
    assert_ne!(r["kernel"]["pid"].as_u64(), Some(pid));
    // Resumed once: the next cell is an ordinary one.
    let r = s.exec("p", "label");
    assert!(r.get("restored").is_none(), "{r}");
    s.stop();
}

#[test]
fn forged_checkpoint_bytes_are_unpickled_only_inside_the_new_kernel() {
    let Some(dir) = ready() else { return };
    let s = Serve::start(dir.path());
    s.call(
        "POST",
        "/v1/sessions",
        Some(json!({"name": "h", "checkpoint": "namespace"})),
    );
    // The cell rewrites every checkpoint its kernel writes: a pickle whose
    // loading runs code (it says which process loaded it) and garbage.
    let forge = r#"
import importlib, pickle
ck = importlib.import_module('cellhost_worker.checkpoint')
_orig = ck.save
def _forged(path, max_bytes, count):
    _orig(path, max_bytes, count)
    data = open(path, 'rb').read()
    at = int.from_bytes(data[-8:], 'little')
    index = pickle.loads(data[at:-8])
    body = bytearray(data[:at])
    for name, payload in [('proof', b"c__builtin__\neval\n(V__import__('sys').modules.get('cellhost_worker.main') is not None\ntR."),
                          ('junk', b'\x80\x05garbage\xff\x00')]:
        index['entries'].append((name, len(body), len(payload)))
        body += len(payload).to_bytes(8, 'little') + payload
    idx = len(body)
    body += pickle.dumps(index) + idx.to_bytes(8, 'little')
    open(path, 'wb').write(bytes(body))
ck.save = _forged
x = 41
"#;
    let r = s.exec("h", forge);
    assert_eq!(r["status"], "ok", "{r}");
    let r = s.exec("h", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)");
    assert_eq!(r["status"], "crashed", "{r}");
    let r = s.exec("h", "(x + 1, proof)");
    assert_eq!(r["status"], "ok", "the host and the session go on: {r}");
    assert_eq!(
        r["result"]["text/plain"], "(42, True)",
        "the forged pickle ran inside a kernel's worker, not the host: {r}"
    );
    let restored = &r["restored"];
    assert!(
        lost_names(&restored["lost"]).contains(&"junk".to_string()),
        "garbage is named lost: {restored}"
    );
    // A garbage file in place of the whole checkpoint: nothing restored, said so.
    let r = s.exec(
        "h",
        "ck.save = lambda path, m, c: (open(path, 'wb').write(b'garbage'), print('CELLHOST-CHECKPOINT {\"ok\": true}'))\ny = 1",
    );
    assert_eq!(r["status"], "ok", "{r}");
    let r = s.exec("h", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)");
    assert_eq!(r["status"], "crashed", "{r}");
    let r = s.exec("h", "'y' in dir()");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["result"]["text/plain"], "False", "{r}");
    assert!(
        r["restored"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("damaged")),
        "a damaged checkpoint is reported: {}",
        r["restored"]
    );
    s.stop();
}

#[test]
fn process_checkpoints_are_refused_with_the_reason() {
    let Some(dir) = ready() else { return };
    let s = Serve::start(dir.path());
    let made = s.call(
        "POST",
        "/v1/sessions",
        Some(json!({"name": "criu", "checkpoint": "process"})),
    );
    assert_eq!(made["error"]["code"], "checkpoint_unavailable", "{made}");
    let why = made["error"]["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("CRIU") || why.contains("criu"),
        "names the missing layer: {why}"
    );
    s.stop();
}

/// Why this host cannot take process checkpoints (`None`: it can): not
/// root, or no CRIU whose `criu check` passes (Debian 12's 3.17.1 fails on
/// 6.x kernels; `scripts/criu-build.sh` installs one that passes).
fn criu_unusable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not root".into());
    }
    let criu = cellhost_kernel::criu::criu_binary();
    match Command::new(&criu).arg("check").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`{} check` fails: {}",
            criu.display(),
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        )),
        Err(e) => Some(format!("{}: {e}", criu.display())),
    }
}

#[test]
fn process_checkpoints_restore_the_whole_kernel_after_a_kill_and_a_pause() {
    let Some(dir) = ready() else { return };
    if let Some(why) = criu_unusable() {
        eprintln!("process checkpoints cannot run here ({why}): skipped");
        return;
    }
    // The floor off: sessions without a sandbox are allowed.
    let s = Serve::start_with(dir.path(), &["--sandbox", "off"]);
    // A sandboxed session is refused, naming the layer CRIU cannot restore.
    let made = s.call(
        "POST",
        "/v1/sessions",
        Some(json!({"name": "boxed", "checkpoint": "process", "sandbox": "auto"})),
    );
    assert_eq!(made["error"]["code"], "checkpoint_unavailable", "{made}");
    assert_eq!(made["error"]["layer"], "landlock", "{made}");

    let made = s.call(
        "POST",
        "/v1/sessions",
        Some(json!({"name": "whole", "checkpoint": "process", "sandbox": "off"})),
    );
    assert_eq!(made["name"], "whole", "{made}");
    // State no pickle holds: a generator half consumed, a thread-local
    // lock, an open file position.
    let r = s.exec(
        "whole",
        "import os, numpy as np, threading\n\
         a = np.arange(1_000_000)\n\
         g = (i * i for i in range(10)); next(g); next(g)\n\
         lock = threading.Lock()\n\
         f = open('notes.txt', 'w+'); f.write('hello'); f.flush()\n\
         x = 41\n\
         os.getpid()",
    );
    assert_eq!(r["status"], "ok", "{r}");
    let pid = r["kernel"]["pid"].as_u64().expect("pid");
    let c = s.call("POST", "/v1/sessions/whole/checkpoint", None);
    assert!(c["bytes"].as_u64().unwrap_or(0) > 0, "an image was written: {c}");
    // SIGKILLed halfway through a cell: the next cell runs in the tree
    // restored from the checkpoint, from before `x = 1000`.
    let r = s.exec(
        "whole",
        "x = 1000\nimport signal\nos.kill(os.getpid(), signal.SIGKILL)",
    );
    assert_eq!(r["status"], "crashed", "{r}");
    let r = s.exec("whole", "x, next(g), int(a.sum()), f.tell(), os.getpid()");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        r["result"]["text/plain"],
        format!("(41, 4, 499999500000, 5, {pid})"),
        "{r}"
    );
    assert_eq!(r["restored"]["source"], "process", "{r}");
    assert_eq!(r["restored"]["resumed"], false, "{r}");
    assert_eq!(
        r["execution_count"], 2,
        "the count goes on from the checkpoint's: {r}"
    );
    assert!(r["restored"]["error"].is_null(), "{r}");

    // Pause: dumped and stopped, memory freed; after a restart of serve
    // the next cell resumes it, as a child of the new host.
    let p = s.call("POST", "/v1/sessions/whole/pause", None);
    assert!(p["memory_freed_bytes"].as_u64().unwrap_or(0) > 0, "{p}");
    assert!(p["checkpoint"]["bytes"].as_u64().unwrap_or(0) > 0, "{p}");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the paused kernel is gone"
    );
    s.stop();
    let s = Serve::start_with(dir.path(), &["--sandbox", "off"]);
    let made = s.call("POST", "/v1/sessions", Some(json!({"name": "whole"})));
    assert_eq!(made["name"], "whole", "{made}");
    let r = s.exec("whole", "x += 1; x, next(g)");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["result"]["text/plain"], "(42, 9)", "{r}");
    assert_eq!(r["execution_count"], 3, "{r}");
    assert_eq!(r["restored"]["source"], "process", "{r}");
    assert_eq!(r["restored"]["resumed"], true, "{r}");
    s.stop();
}

#[test]
fn an_evicted_process_session_comes_back_from_the_checkpoint_taken_before_eviction() {
    let Some(dir) = ready() else { return };
    if let Some(why) = criu_unusable() {
        eprintln!("process checkpoints cannot run here ({why}): skipped");
        return;
    }
    std::fs::write(
        dir.path().join("config.toml"),
        "pool_size = 0\nmax_live_kernels = 1\n",
    )
    .expect("config");
    let s = Serve::start_with(dir.path(), &["--sandbox", "off"]);
    let made = s.call(
        "POST",
        "/v1/sessions",
        Some(json!({"name": "ev1", "checkpoint": "process"})),
    );
    assert_eq!(made["name"], "ev1", "{made}");
    let r = s.exec("ev1", "g = iter(range(100)); next(g); x = 7");
    assert_eq!(r["status"], "ok", "{r}");
    // A second session takes the only place: ev1 is dumped, then evicted.
    let made = s.call("POST", "/v1/sessions", Some(json!({"name": "ev2"})));
    assert_eq!(made["name"], "ev2", "{made}");
    let r = s.exec("ev2", "1 + 1");
    assert_eq!(r["status"], "ok", "{r}");
    let r = s.exec("ev1", "x, next(g)");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["result"]["text/plain"], "(7, 1)", "{r}");
    assert_eq!(r["restored"]["source"], "process", "{r}");
    assert!(r["restored"]["error"].is_null(), "{r}");
    s.stop();
}
