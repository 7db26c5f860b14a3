//! Item 2: descriptors the process that starts cellhost holds without
//! close-on-exec (`cellhost ... 57<secret`) never reach a kernel — one-shot
//! `exec`, `run`, a daemon session (the daemon keeps none of the client
//! that started it), a kernel forked from a template — so a cell cannot
//! `pread` a file the sandbox would not let it open.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::{Env, bin, python, text};

/// The inherited descriptor's number: one the worker never opens itself.
const FD: i32 = 57;

/// Reads fd 57 and lists the cell's descriptors.
const PROBE: &str = r#"
import os
print("FDS", sorted(int(f) for f in os.listdir("/proc/self/fd")))
try:
    print("READ", os.pread(57, 100, 0))
except OSError as e:
    print("CLOSED", e.errno)
print("PARENT", open("/proc/%d/cmdline" % os.getppid(), "rb").read().replace(b"\0", b" ").decode(errors="replace")[:300])
"#;

impl Env {
    /// A secret file only the test's process holds open as fd 57.
    fn secret(&self) -> (std::path::PathBuf, String) {
        let secret = format!("TOPSECRET-{}", std::process::id());
        let p = self.path().join("secret.txt");
        std::fs::write(&p, &secret).expect("secret");
        (p, secret)
    }

    /// `cellhost ARGS` started by a shell that opens `file` as fd 57 (not
    /// close-on-exec), with this test's directories.
    fn with_inherited_fd(&self, file: &Path, args: &[&str]) -> Output {
        let inner = self.cmd(args);
        let mut c = Command::new("/bin/bash");
        c.arg("-c")
            .arg(format!(r#"exec "$0" "$@" {FD}<"$INHERITED_FILE""#))
            .arg(bin())
            .args(args)
            .env("INHERITED_FILE", file)
            .stdin(std::process::Stdio::null());
        for (k, v) in inner.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(d) = inner.get_current_dir() {
            c.current_dir(d);
        }
        c.output().expect("sh")
    }
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

/// fd 57 was closed in the cell and the secret never came back.
fn assert_fd_closed(stdout: &str, secret: &str, ctx: &str) {
    assert!(
        !stdout.contains(secret),
        "{ctx}: the cell read the inherited fd: {stdout}"
    );
    assert!(
        stdout.contains(&format!("CLOSED {}", libc_ebadf())),
        "{ctx}: fd {FD} is open in the kernel: {stdout}"
    );
}

fn libc_ebadf() -> i32 {
    9
}

#[test]
fn escape_2_one_shot_exec_inherits_no_descriptor() {
    let env = Env::new();
    let (file, secret) = env.secret();
    let py = python();
    for mode in ["off", "auto"] {
        let o = env.with_inherited_fd(
            &file,
            &["exec", "--python", &py, "--json", "--sandbox", mode, PROBE],
        );
        let v = json_of(&o);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert_fd_closed(
            v["stdout"].as_str().unwrap_or_default(),
            &secret,
            &format!("exec {mode}"),
        );
    }
    // The host is fine: another cell runs.
    let (code, v) = env.exec_json(&["--sandbox", "auto"], "print(2 + 2)");
    assert_eq!((code, v["stdout"].as_str()), (0, Some("4\n")), "{v}");
}

#[test]
fn escape_2_run_inherits_no_descriptor() {
    let env = Env::new();
    let (file, secret) = env.secret();
    let py = python();
    let script = env.path().join("probe.py");
    std::fs::write(&script, format!("# %%\n{PROBE}\n")).expect("script");
    for mode in ["off", "auto"] {
        let out = env.path().join(format!("probe-{mode}.ipynb"));
        let o = env.with_inherited_fd(
            &file,
            &[
                "run",
                "--python",
                &py,
                "--sandbox",
                mode,
                "--output",
                out.to_str().expect("utf-8"),
                script.to_str().expect("utf-8"),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let nb = std::fs::read_to_string(&out).expect("executed notebook");
        assert!(
            !nb.contains(&secret),
            "run {mode}: the cell read the inherited fd"
        );
        assert!(
            nb.contains("CLOSED 9"),
            "run {mode}: fd {FD} is open in the kernel: {nb}"
        );
    }
}

/// Links of the daemon's open descriptors.
fn fd_targets(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn escape_2_daemon_keeps_no_descriptor_of_the_client_that_started_it() {
    let env = Env::new();
    let (file, secret) = env.secret();
    let py = python();
    // Client A holds fd 57 and starts the daemon.
    let o = env.with_inherited_fd(
        &file,
        &[
            "exec",
            "--python",
            &py,
            "--session",
            "a",
            "--json",
            "--sandbox",
            "auto",
            PROBE,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_fd_closed(
        json_of(&o)["stdout"].as_str().unwrap_or_default(),
        &secret,
        "session a",
    );
    let daemon = env.daemon_pid().expect("daemon pid");
    let held = fd_targets(daemon);
    assert!(
        !held.iter().any(|t| t.contains("secret.txt")),
        "the daemon keeps its first client's descriptor: {held:?}"
    );
    // Client B, holding nothing, asks the daemon's kernel for fd 57.
    let (code, v) = env.exec_json(&["--session", "b", "--sandbox", "auto"], PROBE);
    assert_eq!(code, 0, "{v}");
    assert_fd_closed(v["stdout"].as_str().unwrap_or_default(), &secret, "session b");
    let (code, v) = env.exec_json(&["--session", "a", "--sandbox", "auto"], "print('still here')");
    assert_eq!((code, v["stdout"].as_str()), (0, Some("still here\n")), "{v}");
}

#[test]
fn escape_2_kernel_forked_from_a_template_inherits_no_descriptor() {
    let env = Env::new();
    // Kernels of the daemon come from its warm pool, forked from a template
    // that preloads a module.
    std::fs::write(
        env.path().join("config.toml"),
        "preload = \"json\"\npool_size = 1\n",
    )
    .expect("config");
    let (file, secret) = env.secret();
    let py = python();
    let o = env.with_inherited_fd(
        &file,
        &[
            "exec",
            "--python",
            &py,
            "--session",
            "a",
            "--json",
            "--sandbox",
            "off",
            PROBE,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let first = json_of(&o)["stdout"].as_str().unwrap_or_default().to_string();
    assert_fd_closed(&first, &secret, "first session");
    // A second session: the pooled kernel, forked while the daemon ran.
    let (code, v) = env.exec_json(&["--session", "b", "--sandbox", "off"], PROBE);
    assert_eq!(code, 0, "{v}");
    let out = v["stdout"].as_str().unwrap_or_default();
    assert_fd_closed(out, &secret, "pooled session");
    assert!(
        first.contains("--adopt") || out.contains("--adopt"),
        "no kernel was forked from the template (the path under test): {first}\n{out}"
    );
}
