//! Items 4, 5 and 9: everything that leaves a kernel is redacted, bounded
//! and honest. Each attack runs from inside a real kernel cell (forged
//! frames go straight to the worker's control socket, found the way an
//! attacker finds it), and sizes are measured on disk, not read from the
//! result's own claims.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::common::{self, Env, text};

/// A registered secret (long enough to be matched, short enough to be a
/// directory name).
const SECRET: &str = "Zq7-escape-Secret-91xk";
/// The variable `--secret-env` reads it from.
const SECRET_VAR: &str = "CELLHOST_ESCAPE_TOKEN";

/// Python that finds the worker's control socket (the highest socket fd of
/// the process) and sends frames on it: `send(frame_dict)`.
const FORGE: &str = r#"
import os, socket, stat, json
def _ctl():
    best = None
    for name in os.listdir('/proc/self/fd'):
        try:
            fd = int(name)
            if stat.S_ISSOCK(os.fstat(fd).st_mode) and (best is None or fd > best):
                best = fd
        except (OSError, ValueError):
            pass
    return socket.socket(fileno=os.dup(best))
_sock = _ctl()
def send(frame):
    _sock.sendall(json.dumps(frame).encode() + b"\n")
"#;

/// `exec --json` with the secret registered; exit code and result.
fn exec_secret(env: &Env, extra: &[&str], code: &str) -> (i32, Value, Output) {
    let py = common::python();
    let mut args = vec![
        "exec",
        "--python",
        py.as_str(),
        "--json",
        "--secret-env",
        SECRET_VAR,
    ];
    args.extend_from_slice(extra);
    args.push(code);
    let o = env
        .cmd(&args)
        .env(SECRET_VAR, SECRET)
        .output()
        .expect("run cellhost");
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)));
    (o.status.code().unwrap_or(-1), v, o)
}

/// Every file under `dir`: (path, size).
fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, u64)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, out),
            Ok(t) if t.is_file() => out.push((p, e.metadata().map(|m| m.len()).unwrap_or(0))),
            _ => {}
        }
    }
}

/// Files under the state directory whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
        .into_iter()
        .filter(|(p, _)| std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)))
        .map(|(p, _)| p)
        .collect()
}

fn assert_healthy(env: &Env, extra: &[&str]) {
    let (code, v, o) = exec_secret(env, extra, "print('still', 6 * 7)");
    assert_eq!(code, 0, "{}", text(&o));
    assert_eq!(v["stdout"], "still 42\n", "{v}");
}

/// Item 4 (CLI JSON, one-shot and daemon session, sandbox auto): a cell
/// that chdirs into a directory named after the secret and raises with it
/// gets every field masked; neither the output nor the journal holds it.
#[test]
fn escape_4_secret_in_cwd_is_redacted_on_cli_json_and_daemon() {
    let env = Env::new();
    // The cell learns the secret from its environment, as an attacker's
    // code would (the code itself, which the journal keeps for replay,
    // does not hold it).
    let code = format!(
        "import os\ns = os.environ[{SECRET_VAR:?}]\nos.makedirs(s, exist_ok=True)\nos.chdir(s)\n\
         print(os.getcwd())\nraise RuntimeError(os.getcwd())"
    );
    for extra in [
        &["--sandbox", "auto"][..],
        &["--sandbox", "auto", "--session", "s4"][..],
    ] {
        let (code_, v, o) = exec_secret(&env, extra, &code);
        assert_eq!(code_, 1, "{}", text(&o));
        let raw = String::from_utf8_lossy(&o.stdout);
        assert!(!raw.contains(SECRET), "secret in the result of {extra:?}: {raw}");
        let cwd = v["cwd"].as_str().unwrap_or_default();
        assert!(cwd.contains("[redacted]"), "cwd {cwd:?}");
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains(SECRET),
            "secret on stderr"
        );
        assert_healthy(&env, extra);
    }
    // History (the journal) keeps the masked values only.
    let h = env.run(&["history", "s4", "--json"]);
    assert!(h.status.success(), "{}", text(&h));
    assert!(!String::from_utf8_lossy(&h.stdout).contains(SECRET));
}

/// Item 4 (one-shot exec, sandbox auto): a PNG display whose bytes carry
/// the secret is forged on the control socket; it is withheld (a note),
/// no file anywhere in the state directory holds the secret, and neither
/// the secret nor its base64 reaches the result.
#[test]
fn escape_4_secret_in_png_display_is_withheld() {
    use base64::Engine;
    let env = Env::new();
    let code = format!(
        "{FORGE}\nimport base64\npng = b'\\x89PNG\\r\\n\\x1a\\n' + b'tEXtComment\\0' + {SECRET:?}.encode() + b'\\0' * 64\n\
         send({{'type': 'display', 'id': 'x', 'data': {{'image/png': base64.b64encode(png).decode(), 'text/plain': 'fig'}}}})\n\
         display({{'image/png': base64.b64encode(png).decode()}}, raw=True)\nprint('sent')"
    );
    let (code_, v, o) = exec_secret(&env, &["--sandbox", "auto"], &code);
    assert_eq!(code_, 0, "{}", text(&o));
    let raw = String::from_utf8_lossy(&o.stdout);
    let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
    assert!(!raw.contains(SECRET) && !raw.contains(&b64[..16]), "{raw}");
    assert_eq!(v["displays_dropped"]["withheld"], 2, "{v}");
    assert!(raw.contains("display withheld"), "{raw}");
    let leaked = files_containing(&env.state_dir(), SECRET.as_bytes());
    assert!(leaked.is_empty(), "files holding the secret: {leaked:?}");
    assert_healthy(&env, &["--sandbox", "auto"]);
}

/// Item 5 (one-shot exec, sandbox auto): 20 forged displays of 30 MiB of
/// base64 each and 20,000 small ones, written straight to the control
/// socket. The result keeps at most 100 displays and the cell's files stay
/// within the 50 MB display budget on disk; the result says what was
/// dropped.
#[test]
fn escape_5_forged_displays_are_bounded_on_disk_and_in_the_result() {
    let env = Env::new();
    let code = format!(
        "{FORGE}\nbig = 'A' * (30 << 20)\nfor i in range(20):\n    send({{'type': 'display', 'id': 'x', 'data': {{'image/png': big}}}})\n\
         del big\nfor i in range(20000):\n    send({{'type': 'display', 'id': 'x', 'data': {{'text/plain': 'd%d' % i}}}})\nprint('forged')"
    );
    let (code_, v, o) = exec_secret(&env, &["--sandbox", "auto"], &code);
    assert_eq!(code_, 0, "{}", text(&o));
    let displays = v["displays"].as_array().map_or(0, Vec::len);
    assert!(displays <= 101, "{displays} displays in one result");
    let dropped = v["displays_dropped"]["count"].as_u64().unwrap_or(0);
    assert!(
        dropped >= 20_000 - 100,
        "dropped {dropped}: {}",
        v["displays_dropped"]
    );
    let mut files = Vec::new();
    walk(&env.state_dir(), &mut files);
    let total: u64 = files.iter().map(|(_, n)| n).sum();
    assert!(total <= 55_000_000, "{total} bytes under the state directory");
    assert!(o.stdout.len() < 8 << 20, "the result is {} bytes", o.stdout.len());
    assert_healthy(&env, &["--sandbox", "auto"]);
}

/// Item 5 (one-shot exec and daemon session, sandbox auto): one forged
/// 30 MiB `background` frame comes back as at most 16 KiB a stream with
/// the rest counted in `dropped_bytes`.
#[test]
fn escape_5_huge_background_frame_is_capped() {
    let env = Env::new();
    let code = format!(
        "{FORGE}\nsend({{'type': 'background', 'stream': 'stdout', 'text': 'B' * (30 << 20)}})\nprint('ok')"
    );
    for extra in [
        &["--sandbox", "auto"][..],
        &["--sandbox", "auto", "--session", "s5"][..],
    ] {
        let (code_, v, o) = exec_secret(&env, extra, &code);
        assert_eq!(code_, 0, "{}", text(&o));
        let bg = &v["background_output"];
        let kept = bg["stdout"].as_str().map_or(0, str::len);
        assert!(kept <= 16 * 1024, "{kept} bytes of background stdout");
        assert!(
            bg["dropped_bytes"].as_u64().unwrap_or(0) >= (30 << 20) - 16 * 1024,
            "{bg}"
        );
        assert!(o.stdout.len() < 1 << 20, "result of {} bytes", o.stdout.len());
        assert_healthy(&env, extra);
    }
}

/// Item 9a (one-shot exec, sandbox auto): the thread bomb of the report.
/// Where the kernel has a pids cgroup (root here) the kernel is killed at
/// the limit and the result says so, never `ok`; without one (no cgroup
/// for this user) nothing is killed, and the result must then be the
/// truth: either the bomb failed in the cell (error) or every thread ran.
#[test]
fn escape_9_thread_bomb_reports_the_process_limit() {
    let env = Env::new();
    let code = "import threading, time\n\
                [threading.Thread(target=time.sleep, args=(100,), daemon=True).start() for _ in range(10000)]\n\
                print('threads', threading.active_count())";
    let (code_, v, o) = exec_secret(&env, &["--sandbox", "auto", "--timeout", "120"], code);
    let status = v["status"].as_str().unwrap_or_default();
    let why = format!("{} {}", v["crash"]["message"], v["interrupt"]["reason"]);
    if why.contains("process limit") {
        assert_ne!(status, "ok", "{v}");
        assert_ne!(code_, 0, "{}", text(&o));
    } else if common::is_root() {
        panic!("as root the kernel has a pids cgroup; the limit must be named: {v}");
    } else {
        // No pids cgroup for this user: the truth is whatever happened.
        let all_ran = v["stdout"].as_str().unwrap_or_default().starts_with("threads ");
        assert!(
            (status == "ok" && all_ran) || (status == "error" && v["error"]["ename"] == "RuntimeError"),
            "{v}"
        );
    }
    assert_healthy(&env, &["--sandbox", "auto"]);
}

/// Item 9b (daemon session, sandbox auto): cells whose threads keep
/// printing after the cell ended. No cell's stdout holds another cell's
/// line or any marker text; late lines come back as background output.
#[test]
fn escape_9_late_output_never_lands_in_the_next_cell() {
    let env = Env::new();
    let mut all = String::new();
    // Each cell's thread writes only once the next cell has started (it
    // waits for the file that cell creates), so its lines are late for sure.
    for c in 0..16 {
        let code = format!(
            "import threading, sys, os, time\n\
             open('go{prev}', 'w').close()\n\
             def _late():\n\
             \x20   while not os.path.exists('go{c}'):\n\
             \x20       time.sleep(0.005)\n\
             \x20   for i in range(20):\n\
             \x20       sys.stdout.write('late {c} %d\\n' % i)\n\
             if {c} < 15:\n\
             \x20   threading.Thread(target=_late, daemon=True).start()\n\
             sys.stdout.write('cell {c}\\n')",
            prev = c as i64 - 1
        );
        let (code_, v, o) = exec_secret(&env, &["--sandbox", "auto", "--session", "s9"], &code);
        assert_eq!(code_, 0, "{}", text(&o));
        let out = v["stdout"].as_str().unwrap_or_default();
        for line in out.lines() {
            assert!(
                line == format!("cell {c}"),
                "cell {c}'s stdout holds {line:?}: {out:?}"
            );
        }
        all.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    assert!(
        !all.contains("cellhost-end") && !all.contains("cellhost-start"),
        "marker text leaked"
    );
    assert!(
        all.contains("background_output"),
        "late lines come back as background output"
    );
    assert_healthy(&env, &["--sandbox", "auto", "--session", "s9"]);
}

/// Item 9c (one-shot exec): an ordinary short word after a key-like name
/// is not masked; a credential-looking value still is.
#[test]
fn escape_9_plain_words_after_key_names_are_not_over_redacted() {
    let env = Env::new();
    let (code_, v, o) = exec_secret(
        &env,
        &["--sandbox", "auto"],
        "print('passwd = hello')\nprint('PASSWORD=hunter2')",
    );
    assert_eq!(code_, 0, "{}", text(&o));
    assert_eq!(v["stdout"], "passwd = hello\nPASSWORD=****[redacted]\n", "{v}");
}
