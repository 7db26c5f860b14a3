//! Checkpoints, automatic restores and pause/resume through `cellhost
//! serve`'s HTTP API (the real binary, curl as the client): a kernel
//! SIGKILLed mid-analysis continues from its last checkpoint (what was
//! restored and lost named), a paused session frees its kernel and survives
//! a restart of `serve`, and checkpoint bytes a cell forged are unpickled
//! only inside the new sandboxed kernel. With `restore: replay` and no
//! checkpoint, a SIGKILLed kernel's journaled cells are replayed (stopping
//! at one whose side effect cannot happen twice, cut at the configured
//! bound, never after a restart).
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` (numpy and pandas needed) or
//! `python3` on PATH.

mod serve_address;
use serve_address::serve_address;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// The binary under test: `CELLHOST_TEST_BIN` when set (the non-root run
/// of `scripts/escape-nonroot.sh` copies it where that user can run it).
fn cellhost_bin() -> String {
    std::env::var("CELLHOST_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_cellhost").to_string())
}

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
        let mut child = Command::new(cellhost_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--python", &python()])
            .args(extra)
            .env("CELLHOST_STATE_DIR", dir.join("state"))
            .env("CELLHOST_CONFIG", dir.join("config.toml"))
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve");
        let (addr, _rx) = serve_address(&mut child, Duration::from_secs(120));
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

    /// Creates a session from `body` (`POST /v1/sessions`), asserting it
    /// was made under the name `body` gives.
    #[track_caller]
    fn create(&self, body: Value) {
        let made = self.call("POST", "/v1/sessions", Some(body.clone()));
        assert_eq!(made["name"], body["name"], "{made}");
    }

    /// Runs `code` in `session`, asserting it ended `ok`.
    #[track_caller]
    fn exec_ok(&self, session: &str, code: &str) -> Value {
        let r = self.exec(session, code);
        assert_eq!(r["status"], "ok", "{r}");
        r
    }

    /// Runs a cell that SIGKILLs its own kernel, asserting it came back
    /// `crashed`.
    #[track_caller]
    fn exec_sigkill(&self, session: &str) -> Value {
        let killed = self.exec(session, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)");
        assert_eq!(killed["status"], "crashed", "{killed}");
        killed
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

/// `restored`'s reason names the signal that killed the kernel.
#[track_caller]
fn assert_killed_by_a_signal(restored: &Value) {
    assert!(
        restored["reason"]
            .as_str()
            .is_some_and(|w| w.contains("SIGKILL") || w.contains("signal")),
        "{restored}"
    );
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
    s.create(json!({"name": "ana", "checkpoint": "namespace"}));
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
    let r = s.exec_ok(
        "ana",
        "(round(float(df.x.sum()) - total, 9), list(df.columns), len(means))",
    );
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
    assert_killed_by_a_signal(restored);
    assert_eq!(
        r["execution_count"], 2,
        "the count goes on from the checkpoint: {r}"
    );
    s.stop();
}

/// A worker killed from outside while idle, with the next cell sent at
/// once (before or after the host sees the death: both orders happen over
/// the rounds): the cell runs on a restored kernel instead of coming back
/// `crashed` from the dead one.
#[test]
fn a_kernel_killed_while_idle_gives_the_next_cell_a_restored_kernel_not_a_crash() {
    let Some(dir) = ready() else { return };
    let s = Serve::start(dir.path());
    s.create(json!({"name": "idle", "checkpoint": "namespace"}));
    s.exec_ok("idle", "x = 41");
    for round in 0..5 {
        // The checkpoint of the last cell is written before the next runs.
        let r = s.exec("idle", "x + 0");
        assert_eq!(r["status"], "ok", "round {round}: {r}");
        let pid = r["kernel"]["pid"].as_i64().expect("the kernel's pid");
        let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        assert!(killed.is_ok_and(|st| st.success()), "round {round}: kill {pid}");
        let next = s.exec("idle", "x + 1");
        assert_eq!(
            next["status"], "ok",
            "round {round}: the cell after the kill: {next}"
        );
        assert_eq!(next["result"]["text/plain"], "42", "round {round}: {next}");
        assert_eq!(next["restored"]["source"], "checkpoint", "round {round}: {next}");
        assert_ne!(
            next["kernel"]["pid"], r["kernel"]["pid"],
            "round {round}: a new kernel"
        );
    }
    s.stop();
}

/// A cell's answer's `cell_id` (`?` when it has none).
fn cell_id(cell: &Value) -> String {
    cell["cell_id"].as_str().unwrap_or("?").to_string()
}

fn cell_ids(v: &Value, field: &str) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x[field].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_pip_install_cell_is_replayed_after_a_kill_and_what_it_installed_imports_again() {
    let Some(dir) = ready() else { return };
    if !cellhost_testkit::index::reachable(cellhost_testkit::index::TOMLI) {
        return;
    }
    let s = Serve::start(dir.path());
    s.create(json!({"name": "pipr", "restore": "replay", "checkpoint": "off"}));
    let install = s.exec_ok("pipr", "%pip install tomli==2.0.1");
    let use_it = s.exec_ok(
        "pipr",
        "import tomli\nconf = tomli.loads('x = 41')\nconf['x'] += 1",
    );
    s.exec_sigkill("pipr");
    let r = s.exec_ok("pipr", "conf['x'], tomli.__name__");
    assert_eq!(r["result"]["text/plain"], "(42, 'tomli')", "{r}");
    let replay = &r["restored"]["replay"];
    assert_eq!(r["restored"]["source"], "replay", "{r}");
    assert_eq!(
        cell_ids(&replay["replayed"], "cell"),
        vec![cell_id(&install), cell_id(&use_it)],
        "the install is replayed as any cell, in order: {replay}"
    );
    assert!(
        replay["failed"].is_null(),
        "the install ran again without failing: {replay}"
    );
    s.stop();
}

#[test]
fn a_kernel_sigkilled_mid_analysis_with_restore_replay_continues_from_its_replayed_cells() {
    let Some(dir) = ready() else { return };
    let s = Serve::start(dir.path());
    // No checkpoints: the journal's cells are all there is.
    s.create(json!({"name": "rep", "restore": "replay", "checkpoint": "off"}));
    let load = s.exec(
        "rep",
        "import numpy as np, pandas as pd\n\
         rng = np.random.default_rng(7)\n\
         df = pd.DataFrame({'x': rng.normal(size=1000), 'g': rng.integers(0, 4, 1000)})\n\
         total = float(df.x.sum())\n\
         print('loaded', len(df))",
    );
    assert_eq!(load["status"], "ok", "{load}");
    let group = s.exec_ok(
        "rep",
        "means = df.groupby('g').x.mean()\nsteps = ['load', 'group']\nmeans",
    );
    let typo = s.exec("rep", "df.nosuchcolumn");
    assert_eq!(typo["status"], "error", "{typo}");
    // The next cell changes the frame and is SIGKILLed halfway.
    let killed = s.exec(
        "rep",
        "df['y'] = df.x * 2\nsteps.append('y')\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    );
    assert_eq!(killed["status"], "crashed", "{killed}");
    let r = s.exec_ok(
        "rep",
        "(round(float(df.x.sum()) - total, 9), list(df.columns), len(means), steps)",
    );
    assert_eq!(
        r["result"]["text/plain"], "(0.0, ['x', 'g'], 4, ['load', 'group'])",
        "the analysis continues from the replayed cells, without the killed cell's changes: {r}"
    );
    assert!(
        !r["stdout"].as_str().unwrap_or("").contains("loaded"),
        "replayed cells emit no output: {r}"
    );
    let restored = &r["restored"];
    assert_eq!(restored["source"], "replay", "{r}");
    assert_eq!(restored["checkpoint_ms"], 0, "no checkpoint: {restored}");
    let replay = &restored["replay"];
    assert_eq!(
        cell_ids(&replay["replayed"], "cell"),
        vec![cell_id(&load), cell_id(&group)],
        "the two ok cells, in order: {restored}"
    );
    assert!(
        replay.get("failed").is_none() && replay.get("cut").is_none(),
        "{restored}"
    );
    let lost = cell_ids(&restored["lost_cells"], "cell");
    for c in [&typo, &killed] {
        assert!(
            lost.contains(&cell_id(c)),
            "the cells that did not end ok are named as lost: {restored}"
        );
    }
    assert_killed_by_a_signal(restored);
    assert_eq!(
        r["execution_count"], 5,
        "the count goes on from the original cells, not the replays: {r}"
    );
    // Replayed once: the next cell is an ordinary one.
    let again = s.exec("rep", "len(steps)");
    assert!(again.get("restored").is_none(), "{again}");
    assert_eq!(again["execution_count"], 6, "{again}");
    s.stop();
}

#[test]
fn a_replay_stops_at_a_cell_whose_side_effect_cannot_happen_twice_and_a_restart_replays_nothing() {
    let Some(dir) = ready() else { return };
    let s = Serve::start(dir.path());
    s.create(json!({"name": "side", "restore": "replay"}));
    let a = s.exec_ok("side", "a = 1");
    // A cell with an effect outside the namespace, refusing to run twice.
    let once = s.exec_ok(
        "side",
        "import os\nif os.path.exists('sent.marker'):\n    raise RuntimeError('already sent')\nopen('sent.marker', 'w').close()\nb = 2",
    );
    let c = s.exec_ok("side", "c = 3");
    let killed = s.exec_sigkill("side");
    let r = s.exec_ok("side", "[n in globals() for n in ('a', 'b', 'c')]");
    assert_eq!(
        r["result"]["text/plain"], "[True, False, False]",
        "the replay stopped at the failing cell: {r}"
    );
    let replay = &r["restored"]["replay"];
    assert_eq!(cell_ids(&replay["replayed"], "cell"), vec![cell_id(&a)], "{r}");
    assert_eq!(replay["failed"]["cell"], once["cell_id"], "{r}");
    assert!(
        replay["failed"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("already sent")),
        "{r}"
    );
    let lost = cell_ids(&r["restored"]["lost_cells"], "cell");
    for cell in [&once, &c, &killed] {
        assert!(lost.contains(&cell_id(cell)), "{r}");
    }
    assert_eq!(
        r["execution_count"], 2,
        "a stopped replay continues from the last cell that came back: {r}"
    );
    // A restart drops the state on purpose: nothing is replayed.
    let restarted = s.call("POST", "/v1/sessions/side/restart", None);
    assert!(restarted.get("error").is_none(), "{restarted}");
    let r = s.exec("side", "'a' in globals()");
    assert_eq!(r["result"]["text/plain"], "False", "{r}");
    assert!(r.get("restored").is_none(), "{r}");
    s.stop();
}

#[test]
fn a_session_with_restore_replay_gets_its_cells_back_after_a_serve_restart() {
    let Some(dir) = ready() else { return };
    let s = Serve::start(dir.path());
    s.create(json!({"name": "host", "restore": "replay"}));
    s.exec_ok(
        "host",
        "import pandas as pd\nframe = pd.DataFrame({'v': range(10)})",
    );
    s.exec_ok("host", "frame['w'] = frame.v ** 2");
    s.stop();

    // The server ended with the kernel; created again (as a client does
    // after a restart), the session replays its cells before the next one.
    let s = Serve::start(dir.path());
    s.create(json!({"name": "host"}));
    let r = s.exec_ok("host", "int(frame.w.sum())");
    assert_eq!(r["result"]["text/plain"], "285", "{r}");
    assert_eq!(r["restored"]["source"], "replay", "{r}");
    assert_eq!(
        r["restored"]["replay"]["replayed"].as_array().map(Vec::len),
        Some(2),
        "{r}"
    );
    assert_eq!(r["execution_count"], 3, "{r}");
    // Deleted, the name is a new session: nothing is replayed.
    let auth = format!("Authorization: Bearer {}", s.token);
    let gone = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "DELETE",
            "-H",
            &auth,
        ])
        .arg(format!("{}/v1/sessions/host", s.url))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&gone.stdout), "204");
    s.create(json!({"name": "host", "restore": "replay"}));
    let r = s.exec("host", "'frame' in globals()");
    assert_eq!(r["result"]["text/plain"], "False", "{r}");
    assert!(r.get("restored").is_none(), "{r}");
    s.stop();
}

#[test]
fn a_replay_is_cut_at_its_cell_bound_and_says_so() {
    let Some(dir) = ready() else { return };
    std::fs::write(
        dir.path().join("config.toml"),
        "pool_size = 0\n[restore]\nmode = \"replay\"\nmax_cells = 2\n",
    )
    .expect("config");
    let s = Serve::start(dir.path());
    // The server's default for every session (config `restore.mode`).
    s.create(json!({"name": "cut"}));
    let mut ids = Vec::new();
    for code in ["x = [1]", "x.append(2)", "x.append(3)"] {
        let r = s.exec("cut", code);
        assert_eq!(r["status"], "ok", "{r}");
        ids.push(cell_id(&r));
    }
    s.exec_sigkill("cut");
    let r = s.exec("cut", "x");
    assert_eq!(r["result"]["text/plain"], "[1, 2]", "{r}");
    let replay = &r["restored"]["replay"];
    assert_eq!(cell_ids(&replay["replayed"], "cell"), ids[..2].to_vec(), "{r}");
    assert!(
        replay["cut"]
            .as_str()
            .is_some_and(|w| w.contains("restore.max_cells")),
        "{r}"
    );
    assert!(
        cell_ids(&r["restored"]["lost_cells"], "cell").contains(&ids[2]),
        "{r}"
    );
    s.stop();
}

#[test]
fn a_paused_session_frees_its_kernel_is_listed_paused_and_survives_a_serve_restart() {
    let Some(dir) = ready() else { return };
    let s = Serve::start(dir.path());
    s.create(json!({"name": "p"}));
    let r = s.exec_ok("p", "import numpy as np\na = np.ones(10_000_000)\nlabel = 'kept'");
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
    let listed_paused = |s: &Serve| {
        let l = s.call("GET", "/v1/sessions", None);
        let p = l["sessions"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == "p").cloned())
            .unwrap_or_else(|| panic!("the paused session is listed: {l}"));
        assert_eq!(p["state"], "paused", "{l}");
        assert_eq!(p["alive"], false, "{l}");
        assert!(p["paused_ms"].as_i64().unwrap_or(0) > 0, "{l}");
        assert!(names(&p["checkpoint"]["saved"]).contains(&"a".to_string()), "{l}");
    };
    listed_paused(&s);
    s.stop();

    // A new server on the same state directory lists it paused, and its
    // next cell resumes it without the session being created again.
    let s = Serve::start(dir.path());
    listed_paused(&s);
    let r = s.exec_ok("p", "(float(a.sum()), label)");
    assert_eq!(r["result"]["text/plain"], "(10000000.0, 'kept')", "{r}");
    assert_eq!(r["restored"]["resumed"], true, "{r}");
    assert_ne!(r["kernel"]["pid"].as_u64(), Some(pid));
    // Resumed once: the next cell is an ordinary one.
    let r = s.exec("p", "label");
    assert!(r.get("restored").is_none(), "{r}");
    let l = s.call("GET", "/v1/sessions", None);
    assert_eq!(l["sessions"][0]["state"], "live", "{l}");
    // Created again after a restart (the client's habit), a paused session
    // still resumes.
    let p = s.call("POST", "/v1/sessions/p/pause", None);
    assert_eq!(p["session"], "p", "{p}");
    s.stop();
    let s = Serve::start(dir.path());
    s.create(json!({"name": "p"}));
    let r = s.exec("p", "label");
    assert_eq!(r["result"]["text/plain"], "'kept'", "{r}");
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
    s.exec_sigkill("h");
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
    s.exec_ok(
        "h",
        "ck.save = lambda path, m, c: (open(path, 'wb').write(b'garbage'), print('CELLHOST-CHECKPOINT {\"ok\": true}'))\ny = 1",
    );
    s.exec_sigkill("h");
    let r = s.exec_ok("h", "'y' in dir()");
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

/// Why this host cannot take process checkpoints (`None`: it can): no
/// CRIU whose `criu check` passes (Debian 12's 3.17.1 fails on 6.x
/// kernels; `scripts/criu-build.sh` installs one that passes), run as
/// root, or as another user in CRIU's unprivileged mode (a binary with the
/// CAP_CHECKPOINT_RESTORE file capability, named by `CELLHOST_CRIU`).
fn criu_unusable() -> Option<String> {
    cellhost_sessions::checkpoint::process_available().err()
}

/// [`ready`], and a host that can take process checkpoints. With
/// `CELLHOST_REQUIRE_CRIU` set (the non-root run of
/// `scripts/escape-nonroot.sh`, which sets CRIU up) a host that cannot is
/// a failure, not a skip.
fn process_ready() -> Option<tempfile::TempDir> {
    let required = std::env::var_os("CELLHOST_REQUIRE_CRIU").is_some();
    let Some(dir) = ready() else {
        assert!(
            !required,
            "CELLHOST_REQUIRE_CRIU: curl, numpy and pandas are needed"
        );
        return None;
    };
    if let Some(why) = criu_unusable() {
        assert!(!required, "CELLHOST_REQUIRE_CRIU: {why}");
        eprintln!("process checkpoints cannot run here ({why}): skipped");
        return None;
    }
    Some(dir)
}

#[test]
fn process_checkpoints_restore_the_whole_kernel_after_a_kill_and_a_pause() {
    let Some(dir) = process_ready() else { return };
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

    s.create(json!({"name": "whole", "checkpoint": "process", "sandbox": "off"}));
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
    // A kernel CRIU may dump runs under no_new_privs (what its
    // unprivileged restore needs).
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    assert!(
        status
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["NoNewPrivs:", "1"]),
        "{status}"
    );
    let c = s.call("POST", "/v1/sessions/whole/checkpoint", None);
    assert!(c["bytes"].as_u64().unwrap_or(0) > 0, "an image was written: {c}");
    // SIGKILLed halfway through a cell: the next cell runs in the tree
    // restored from the checkpoint, from before `x = 1000`.
    let r = s.exec(
        "whole",
        "x = 1000\nimport signal\nos.kill(os.getpid(), signal.SIGKILL)",
    );
    assert_eq!(r["status"], "crashed", "{r}");
    let r = s.exec_ok("whole", "x, next(g), int(a.sum()), f.tell(), os.getpid()");
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
        "the paused kernel is gone (reaped, not left a zombie): {:?}",
        std::fs::read_to_string(format!("/proc/{pid}/status")).map(|s| s
            .lines()
            .filter(|l| l.starts_with("State") || l.starts_with("PPid"))
            .collect::<Vec<_>>()
            .join(" "))
    );
    s.stop();
    let s = Serve::start_with(dir.path(), &["--sandbox", "off"]);
    s.create(json!({"name": "whole"}));
    let r = s.exec_ok("whole", "x += 1; x, next(g)");
    assert_eq!(r["result"]["text/plain"], "(42, 9)", "{r}");
    assert_eq!(r["execution_count"], 3, "{r}");
    assert_eq!(r["restored"]["source"], "process", "{r}");
    assert_eq!(r["restored"]["resumed"], true, "{r}");
    s.stop();
}

/// The memory line of `/proc/PID/cgroup` (v1: the `memory` controller's,
/// v2: the unified one).
fn memory_group(pid: u64) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let line = text
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "memory"))
        })
        .or_else(|| text.lines().find(|l| l.starts_with("0::")));
    line.and_then(|l| l.splitn(3, ':').nth(2))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn process_checkpoints_bring_a_limited_kernel_back_under_its_new_generations_limits() {
    let Some(dir) = process_ready() else { return };
    let s = Serve::start_with(dir.path(), &["--sandbox", "off"]);
    let made = s.call(
        "POST",
        "/v1/sessions",
        Some(json!({
            "name": "lim", "checkpoint": "process", "sandbox": "off",
            "limits": {"memory_mb": 256, "pids": 64}
        })),
    );
    if made["name"] != "lim" && !rustix::process::geteuid().is_root() {
        // A v1 host gives users no groups: the named limit is refused.
        eprintln!(
            "cgroup limits are not this user's here ({}): skipped",
            made["error"]
        );
        s.stop();
        return;
    }
    assert_eq!(made["name"], "lim", "{made}");
    let r = s.exec_ok("lim", "import os\nx = 41\nos.getpid()");
    let pid = r["kernel"]["pid"].as_u64().expect("pid");
    let before = memory_group(pid);
    if before.is_empty() || before == "/" {
        eprintln!("the kernel has no memory group here ({before:?}): skipped");
        s.stop();
        return;
    }
    let c = s.call("POST", "/v1/sessions/lim/checkpoint", None);
    assert!(c["bytes"].as_u64().unwrap_or(0) > 0, "an image was written: {c}");
    s.exec_sigkill("lim");
    let r = s.exec_ok("lim", "x, os.getpid()");
    assert_eq!(r["result"]["text/plain"], format!("(41, {pid})"), "{r}");
    assert_eq!(r["restored"]["source"], "process", "{r}");
    // Back in the new generation's own group, not the dumped one's (gone
    // with its kernel) nor the host's.
    let after = memory_group(pid);
    assert_ne!(after, before, "the restored tree is in a fresh group");
    assert!(
        after.contains(&format!("-g{}-", r["kernel"]["generation"])),
        "the group of generation {}: {after}",
        r["kernel"]["generation"]
    );
    // And its limit holds: 400 MiB under 256 MiB is an OOM of this kernel.
    let r = s.exec("lim", "big = b'x' * (400 << 20)");
    assert_eq!(r["status"], "crashed", "{r}");
    assert_eq!(r["fault"], "oom", "{r}");
    assert!(
        r["hint"]
            .as_str()
            .is_some_and(|h| h.contains("restored from the session's checkpoint")),
        "the hint says the state comes back: {r}"
    );
    assert!(
        r["crash"]["message"]
            .as_str()
            .is_some_and(|w| w.contains("memory limit (256 MiB)")),
        "the limit is named: {r}"
    );
    // The next cell comes back from the checkpoint again, still limited.
    let r = s.exec_ok("lim", "x");
    assert_eq!(r["result"]["text/plain"], "41", "{r}");
    assert_eq!(r["restored"]["source"], "process", "{r}");
    s.stop();
}

#[test]
fn an_evicted_process_session_comes_back_from_the_checkpoint_taken_before_eviction() {
    let Some(dir) = process_ready() else { return };
    std::fs::write(
        dir.path().join("config.toml"),
        "pool_size = 0\nmax_live_kernels = 1\n",
    )
    .expect("config");
    let s = Serve::start_with(dir.path(), &["--sandbox", "off"]);
    s.create(json!({"name": "ev1", "checkpoint": "process"}));
    s.exec_ok("ev1", "g = iter(range(100)); next(g); x = 7");
    // A second session takes the only place: ev1 is dumped, then evicted.
    s.create(json!({"name": "ev2"}));
    s.exec_ok("ev2", "1 + 1");
    let r = s.exec_ok("ev1", "x, next(g)");
    assert_eq!(r["result"]["text/plain"], "(7, 1)", "{r}");
    assert_eq!(r["restored"]["source"], "process", "{r}");
    assert!(r["restored"]["error"].is_null(), "{r}");
    s.stop();
}
