//! A non-root user on a host without user namespaces (containers, hardened
//! sysctls): mode `auto` must not run a kernel that reaches the host's
//! loopback, sees host processes and writes the host's `/tmp` without
//! saying so. It refuses, naming `--sandbox off` and
//! `allow_weak_sandbox = true`; with that key the weaker kernel starts and
//! every surface names the missing layers; `enforce` refuses.
//!
//! "No user namespaces" is real, and the host is left alone: the CLI runs
//! as an unprivileged uid inside a child user namespace whose own
//! `/proc/sys/user/max_user_namespaces` is 0 (a per-namespace limit), so
//! its `unshare(CLONE_NEWUSER)` fails with `ENOSPC` exactly as on such a
//! host. Setting that up needs root (the id maps name another uid);
//! otherwise the tests are skipped with a printed reason.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::common::{self, text};

/// The unprivileged uid (and gid) the CLI runs as: `nobody`.
const UID: u32 = 65534;

/// The base interpreter (a venv under /root is not readable by `nobody`).
const PYTHON: &str = "/usr/bin/python3";

/// Stage two, run by `sh` inside the new user namespace once the test has
/// written its id maps (exec'd anew so uid 0 of the namespace holds its
/// capabilities): lowers the namespace's own user-namespace limit to 0,
/// then becomes `UID` and runs the command.
const INNER: &str = "echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --reuid \"$0\" --regid \"$0\" --clear-groups -- \"$@\"";

struct NoUserns {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl NoUserns {
    /// `None` (with the reason printed) when this host cannot set it up.
    fn new() -> Option<NoUserns> {
        if !common::is_root() {
            eprintln!("skipped: writing another uid's id map needs root");
            return None;
        }
        if !Path::new(PYTHON).exists() {
            eprintln!("skipped: no {PYTHON}");
            return None;
        }
        for tool in ["unshare", "setpriv"] {
            if !Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                eprintln!("skipped: no {tool} (util-linux)");
                return None;
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("cellhost-nouserns-")
            .tempdir()
            .expect("tmp");
        let bin = dir.path().join("cellhost");
        std::fs::copy(common::bin(), &bin).expect("copy cellhost");
        for d in ["home", "state"] {
            std::fs::create_dir(dir.path().join(d)).expect("mkdir");
        }
        std::fs::write(dir.path().join("config.toml"), "").expect("config");
        std::fs::write(dir.path().join("weak.toml"), "allow_weak_sandbox = true\n").expect("config");
        for e in walk(dir.path()) {
            std::os::unix::fs::chown(&e, Some(UID), Some(UID)).expect("chown");
        }
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Some(NoUserns { dir, bin })
    }

    /// Runs `cellhost ARGS` as `UID` without user namespaces.
    fn run(&self, config: &str, args: &[&str]) -> Output {
        let d = self.dir.path();
        let mut c = Command::new("unshare");
        c.arg("-U")
            .args([
                "sh",
                "-c",
                &format!(
                    "echo ready; read go; exec sh -c '{}' \"$@\"",
                    INNER.replace('\'', "'\\''")
                ),
                "nouserns",
            ])
            .arg(UID.to_string())
            .arg(&self.bin)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", d.join("home"))
            .env("CELLHOST_STATE_DIR", d.join("state"))
            .env("CELLHOST_CONFIG", d.join(config))
            .env("CELLHOST_DAEMON_IDLE_S", "600")
            .current_dir(d.join("home"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("unshare");
        let pid = child.id();
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("ready line");
        assert_eq!(line, "ready\n", "the namespace's shell did not start");
        // The shell runs in its own user namespace now: map its root to
        // root (to lower the limit) and UID to itself.
        for map in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{pid}/{map}"), format!("0 0 1\n{UID} {UID} 1\n")).expect(map);
        }
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"go\n").expect("go");
        drop(stdin);
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut rest).expect("stdout");
        let mut o = child.wait_with_output().expect("wait");
        o.stdout = rest;
        o
    }

    fn exec_json(&self, config: &str, extra: &[&str], code: &str) -> (Output, Option<Value>) {
        let mut args = vec!["exec", "--python", PYTHON, "--json"];
        args.extend_from_slice(extra);
        args.push(code);
        let o = self.run(config, &args);
        let v = serde_json::from_slice(&o.stdout).ok();
        (o, v)
    }
}

impl Drop for NoUserns {
    fn drop(&mut self) {
        // A daemon a test started lives in a user namespace of its own
        // (and refuses clients of any other): stop it by its pid, with
        // SIGTERM (its orderly shutdown), then make sure it is gone.
        let pid_file = self.dir.path().join("state/run/daemon.pid");
        let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            return;
        };
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        if !common::wait_gone(pid.as_raw_nonzero().get(), std::time::Duration::from_secs(10)) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// The first line of `path` containing `needle`, once written (a
/// background check writes it; 60 s at most).
fn wait_for_line(path: &Path, needle: &str) -> String {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains(needle)) {
            return l.to_string();
        }
        assert!(
            std::time::Instant::now() < until,
            "no {needle:?} in {}: {text}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut v = vec![root.to_path_buf()];
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                v.extend(walk(&e.path()));
            } else {
                v.push(e.path());
            }
        }
    }
    v
}

/// The attack: a cell of mode `auto` on a host without user namespaces
/// reaches the host's loopback, sees its processes and writes its `/tmp`.
/// Surface: CLI one-shot `exec` and the daemon (`exec --session`).
#[test]
fn auto_without_user_namespaces_refuses_and_names_the_way_out() {
    let Some(env) = NoUserns::new() else { return };
    let marker = format!("/tmp/cellhost-nouserns-{}", std::process::id());
    let cell =
        format!("import os\nopen({marker:?}, 'w').write('x')\nprint(os.getuid(), len(os.listdir('/proc')))");

    let o = env.run("config.toml", &["exec", "--python", PYTHON, &cell]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        err.contains("`userns`") && err.contains("No space left on device"),
        "{err}"
    );
    assert!(
        err.contains("--sandbox off") && err.contains("allow_weak_sandbox = true"),
        "{err}"
    );
    assert!(!Path::new(&marker).exists(), "the refused kernel ran the cell");

    // --json: the error envelope on stderr, with the stable code.
    let (o, _) = env.exec_json("config.toml", &[], "1");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let e: Value = serde_json::from_slice(&o.stderr).expect("envelope");
    assert_eq!(e["error"]["code"], "sandbox_unavailable", "{e}");
    assert_eq!(e["error"]["layer"], "userns", "{e}");

    // The daemon refuses the same way, per request.
    let o = env.run(
        "config.toml",
        &["exec", "--python", PYTHON, "--session", "s", "1"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("allow_weak_sandbox = true"),
        "{}",
        text(&o)
    );
    // ... and says so in its start-up log, at the default log level.
    let log = env.dir.path().join("state/run/daemon.log");
    let said = wait_for_line(&log, "sandbox check:");
    assert!(said.contains("allow_weak_sandbox = true"), "{said}");

    // enforce refuses too.
    let (o, _) = env.exec_json("config.toml", &["--sandbox", "enforce"], "1");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    // --sandbox off is the unconfined kernel, asked for.
    let (o, v) = env.exec_json("config.toml", &["--sandbox", "off"], "print('off')");
    let v = v.unwrap_or_else(|| panic!("{}", text(&o)));
    assert_eq!(v["stdout"], "off\n", "{v}");
    assert_eq!(v["kernel"]["sandbox"]["mode"], "off", "{v}");
    let _ = std::fs::remove_file(&marker);
}

/// With `allow_weak_sandbox = true` the weaker kernel starts, and the
/// layers it lacks are named with their reasons in the result and once on
/// stderr.
#[test]
fn allow_weak_sandbox_runs_and_reports_every_missing_layer() {
    let Some(env) = NoUserns::new() else { return };
    let (o, v) = env.exec_json("weak.toml", &[], "print('weak')");
    let v = v.unwrap_or_else(|| panic!("{}", text(&o)));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(v["stdout"], "weak\n", "{v}");
    let s = &v["kernel"]["sandbox"];
    assert_eq!(s["mode"], "auto", "{s}");
    let missing: Vec<&str> = s["missing"]
        .as_array()
        .expect("missing")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for layer in ["userns", "netns", "pidns", "mountns"] {
        assert!(missing.contains(&layer), "{layer} missing: {s}");
        assert!(
            s["reasons"][layer].as_str().is_some_and(|r| !r.is_empty()),
            "{layer}: {s}"
        );
    }
    let enforced: Vec<&str> = s["enforced"]
        .as_array()
        .expect("enforced")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        enforced.contains(&"landlock") && enforced.contains(&"seccomp"),
        "{s}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("not in force here").count(),
        1,
        "once per kernel: {err}"
    );
    // joblib/loky's quota read works (the machine's top-level files: the
    // kernel has no groups of its own here), never a PermissionError.
    let (o, v) = env.exec_json(
        "weak.toml",
        &[],
        "import os\np = '/sys/fs/cgroup/cpu.max' if os.path.exists('/sys/fs/cgroup/cpu.max') else '/sys/fs/cgroup/cpu/cpu.cfs_quota_us'\nprint(open(p).read().split()[0] if os.path.exists(p) else 'absent')",
    );
    let v = v.unwrap_or_else(|| panic!("{}", text(&o)));
    assert_eq!(v["status"], "ok", "{v}");
    assert!(err.contains("userns (") && err.contains("netns ("), "{err}");
}
