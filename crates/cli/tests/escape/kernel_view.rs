//! Items 1 (kernel side) and 3: what a kernel sees of the host, and as
//! whom it runs. A cell looks for the host's control plane the way an
//! attacker would — the daemon's socket (its path handed to the cell, as
//! an attacker learns it), every other Unix socket of the host,
//! `/proc/1/cmdline` and `/proc/1/environ` of its ns-init, the host's
//! home — and tries root-only files; each test asserts the attempt fails
//! and that the host still serves a later cell. The same probe runs in a
//! one-shot kernel, a daemon session and a kernel forked from a template.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{self, Env};

/// Removes a file the test planted outside its own directory, also when
/// the test fails.
struct Planted(PathBuf);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Every Unix socket file under `dir`, at most `depth` levels down.
fn sockets_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_socket() {
            out.push(e.path());
        } else if ft.is_dir() && depth > 0 {
            sockets_under(&e.path(), depth - 1, out);
        }
    }
}

/// The host's sockets a cell must not reach: everything under `/run`,
/// `/var/run`, `/tmp/.X11-unix` and the tests' `$XDG_RUNTIME_DIR`, plus
/// `extra`.
fn host_sockets(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = extra.to_vec();
    let mut roots: Vec<PathBuf> = vec!["/run".into(), "/var/run".into(), "/tmp/.X11-unix".into()];
    roots.extend(std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from));
    for r in roots {
        sockets_under(&r, 3, &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// The probe a cell runs; prints one JSON object.
fn probe(sockets: &[PathBuf], reachable: &Path, planted_home: &Path, root_only: Option<&Path>) -> String {
    let list: Vec<String> = sockets.iter().map(|p| p.display().to_string()).collect();
    format!(
        r#"import json, os, socket, sys
out = {{"uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(), "groups": os.getgroups()}}
def reach(p):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
        s = socket.socket(socket.AF_UNIX, kind)
        try:
            s.settimeout(2)
            s.connect(p)
            return "CONNECTED"
        except OSError as e:
            last = type(e).__name__
        finally:
            s.close()
    return last
out["sockets"] = {{p: reach(p) for p in {list:?}}}
out["control"] = reach({reachable:?})
def read(p):
    try:
        with open(p, "rb") as f:
            return f.read().decode("latin-1")
    except OSError as e:
        return "!" + type(e).__name__
out["cmdline1"] = read("/proc/1/cmdline")
out["environ1"] = read("/proc/1/environ")
out["self_environ"] = read("/proc/self/environ")
out["home_planted"] = os.path.exists({home:?})
root_only = {root:?}
out["root_only"] = read(root_only) if root_only else None
out["run"] = [p for p in ("/run", "/var/run", "/tmp/.X11-unix") if os.path.exists(p)]
with open("written-by-cell", "w") as f:
    f.write("ok")
try:
    import numpy
    out["numpy"] = str(int(numpy.arange(4).sum()))
except ImportError:
    import decimal, _ssl
    out["numpy"] = "absent"
out["forked"] = "colorsys" in sys.modules
print(json.dumps(out))
"#,
        reachable = reachable.display().to_string(),
        home = planted_home.display().to_string(),
        root = root_only.map(|p| p.display().to_string()).unwrap_or_default(),
    )
}

/// The host interpreter has numpy (the cell must then import it too).
fn host_has_numpy() -> bool {
    std::process::Command::new(common::python())
        .args(["-c", "import numpy"])
        .status()
        .is_ok_and(|s| s.success())
}

/// What every surface must show: no host socket reached (the control in
/// the workdir is), nothing of the launch in `/proc/1` or the worker's
/// environment, no host home, no `/run`, not root, root-only files shut,
/// the workdir written, numpy importable when the host has it.
fn assert_confined(v: &Value, env: &Env, sockets: &[PathBuf], root_only: bool) {
    for (p, r) in v["sockets"].as_object().expect("sockets") {
        assert_ne!(r, "CONNECTED", "host socket {p} reached from a cell: {v}");
    }
    assert_eq!(
        v["sockets"].as_object().map(|m| m.len()),
        Some(sockets.len()),
        "{v}"
    );
    assert_eq!(
        v["control"], "CONNECTED",
        "the probe cannot see a reachable socket: {v}"
    );
    // pid 1 is a cold kernel's ns-init (a fork of the kernel init) or a
    // forked kernel's: numbers only, no path, no host pid, no spec.
    let cmdline = v["cmdline1"].as_str().expect("cmdline");
    let cold = "cellhost\0__cellhost-kernel-init\0--launch-fd\x000\0";
    let forked = cmdline.starts_with("cellhost\0__cellhost-ns-init\0--go-fd\0")
        && cmdline
            .split('\0')
            .skip(2)
            .all(|a| a.is_empty() || a.starts_with("--") || a.bytes().all(|b| b.is_ascii_digit()));
    assert!(
        cmdline == cold || forked,
        "pid 1's command line says too much: {v}"
    );
    let environ = v["environ1"].as_str().expect("environ");
    assert!(
        environ.is_empty() || environ.starts_with('!'),
        "ns-init environ leaks: {v}"
    );
    let own = v["self_environ"].as_str().expect("self environ");
    assert!(
        !own.contains("CELLHOST_"),
        "worker environ names cellhost config: {own}"
    );
    let state = env.state_dir().display().to_string();
    assert!(!own.contains(&state) && !cmdline.contains(&state), "{v}");
    assert_eq!(v["home_planted"], false, "the host's home is visible: {v}");
    assert_eq!(v["run"], serde_json::json!([]), "{v}");
    if common::is_root() {
        assert_ne!(v["uid"], 0, "a kernel holds the host's uid 0: {v}");
        assert_ne!(v["euid"], 0, "{v}");
        assert_ne!(v["gid"], 0, "{v}");
        assert_eq!(v["groups"], serde_json::json!([]), "{v}");
    } else {
        // As another user the kernel keeps that user's uid (never root).
        let me = rustix::process::getuid().as_raw();
        assert_eq!(v["uid"], me, "{v}");
    }
    if root_only {
        assert_eq!(
            v["root_only"], "!PermissionError",
            "a root-only file was read: {v}"
        );
    }
    if host_has_numpy() {
        assert_eq!(v["numpy"], "6", "{v}");
    }
    let written = env.path().join("written-by-cell");
    assert_eq!(std::fs::read_to_string(&written).ok().as_deref(), Some("ok"));
    let _ = std::fs::remove_file(written);
}

/// The test's fixtures: a daemon socket, sockets in the tests'
/// `$XDG_RUNTIME_DIR` and state directory (inside the kernel's workdir),
/// a control socket in the workdir itself, a file planted in `$HOME`, and
/// (as root) a 0600 root file under `/etc`.
struct Fixture {
    env: Env,
    _listeners: Vec<UnixListener>,
    _dgram: UnixDatagram,
    sockets: Vec<PathBuf>,
    control: PathBuf,
    home: Planted,
    root_only: Option<Planted>,
}

fn fixture(preload: Option<&str>) -> Fixture {
    let env = Env::new();
    if let Some(p) = preload {
        std::fs::write(env.path().join("config.toml"), format!("preload = {p:?}\n")).expect("config");
    }
    // A daemon, started the ordinary way; its socket is what a cell wants.
    let (code, v) = env.exec_json(&["--session", "victim", "--sandbox", "auto"], "secret = 41");
    assert_eq!(code, 0, "{v}");
    let daemon_sock = env.run_dir().join("daemon.sock");
    assert!(
        daemon_sock.exists(),
        "no daemon socket at {}",
        daemon_sock.display()
    );
    let user_sock = env.path().join("run/user-bus.sock");
    let state_sock = env.state_dir().join("other.sock");
    std::fs::create_dir_all(env.state_dir()).expect("state");
    let dgram_sock = env.path().join("run/user-log.sock");
    let control = env.path().join("control.sock");
    let listeners = vec![
        UnixListener::bind(&user_sock).expect("bind"),
        UnixListener::bind(&state_sock).expect("bind"),
        UnixListener::bind(&control).expect("bind"),
    ];
    let dgram = UnixDatagram::bind(&dgram_sock).expect("bind dgram");
    let sockets = host_sockets(&[daemon_sock, user_sock, state_sock, dgram_sock]);
    let home_dir = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
    // Unique per test (tests of one binary share a pid).
    let tag = env
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let home = Planted(home_dir.join(format!(".{tag}-home")));
    std::fs::write(&home.0, "host home secret").expect("plant in home");
    let root_only = common::is_root().then(|| {
        let p = Planted(PathBuf::from(format!("/etc/{tag}.key")));
        std::fs::write(&p.0, "root only").expect("plant root file");
        std::fs::set_permissions(&p.0, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        p
    });
    Fixture {
        env,
        _listeners: listeners,
        _dgram: dgram,
        sockets,
        control,
        home,
        root_only,
    }
}

impl Fixture {
    fn code(&self) -> String {
        probe(
            &self.sockets,
            &self.control,
            &self.home.0,
            self.root_only.as_ref().map(|p| p.0.as_path()),
        )
    }

    fn run(&self, extra: &[&str]) -> Value {
        let (code, v) = self.env.exec_json(extra, &self.code());
        assert_eq!(code, 0, "{v}");
        let line = v["stdout"].as_str().expect("stdout");
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("probe output ({e}): {v}"))
    }

    /// The host still serves: the victim session kept its state.
    fn assert_healthy(&self) {
        let (code, v) = self
            .env
            .exec_json(&["--session", "victim", "--sandbox", "auto"], "print(secret + 1)");
        assert_eq!(code, 0, "{v}");
        assert_eq!(v["stdout"], "42\n", "{v}");
        let (code, v) = self.env.exec_json(&["--sandbox", "auto"], "print('fresh')");
        assert_eq!(code, 0, "{v}");
    }
}

#[test]
fn escape_1_oneshot_cell_reaches_no_host_socket_and_no_launch_secret() {
    let f = fixture(None);
    let v = f.run(&["--sandbox", "auto"]);
    assert_confined(&v, &f.env, &f.sockets, f.root_only.is_some());
    // Mode enforce: the same view, or (a host without some other layer,
    // e.g. cgroups as a user) a refusal that names that layer — never one
    // of this view's layers.
    let py = common::python();
    let code = f.code();
    let o = f
        .env
        .run(&["exec", "--python", &py, "--json", "--sandbox", "enforce", &code]);
    if o.status.code() == Some(0) {
        let out: Value = serde_json::from_slice(&o.stdout).expect("json");
        let line = out["stdout"].as_str().expect("stdout");
        let v: Value = serde_json::from_str(line.trim()).expect("probe json");
        assert_confined(&v, &f.env, &f.sockets, f.root_only.is_some());
    } else {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("mode `enforce` refuses"), "{}", common::text(&o));
        for layer in ["`rootfs`", "`uid`", "`mountns`"] {
            assert!(!err.contains(layer), "{}", common::text(&o));
        }
        assert!(
            !common::is_root(),
            "enforce refused as root: {}",
            common::text(&o)
        );
    }
    f.assert_healthy();
}

#[test]
fn escape_1_daemon_session_cell_reaches_no_host_socket_and_no_launch_secret() {
    let f = fixture(None);
    let v = f.run(&["--session", "attacker", "--sandbox", "auto"]);
    assert_confined(&v, &f.env, &f.sockets, f.root_only.is_some());
    f.assert_healthy();
}

#[test]
fn escape_1_forked_kernel_gets_the_same_view() {
    let f = fixture(Some("colorsys"));
    // Sessions until one is forked from the template (it starts in the
    // background; the first kernels may start cold meanwhile).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut n = 0;
    let v = loop {
        n += 1;
        let v = f.run(&["--session", &format!("attacker{n}"), "--sandbox", "auto"]);
        if v["forked"] == true || std::time::Instant::now() > deadline {
            break v;
        }
    };
    // As root and as another user (a user namespace per forked kernel).
    assert_eq!(v["forked"], true, "no kernel was forked from the template: {v}");
    assert_confined(&v, &f.env, &f.sockets, f.root_only.is_some());
    f.assert_healthy();
}

#[test]
fn escape_3_kernel_never_holds_host_root_and_doctor_names_the_layers() {
    let f = fixture(None);
    let v = f.run(&["--sandbox", "auto"]);
    assert_confined(&v, &f.env, &f.sockets, f.root_only.is_some());
    if common::is_root() {
        let uid = v["uid"].as_u64().expect("uid");
        assert!(uid >= 0x7f80_0000, "not a kernel uid: {v}");
        // Root-owned 0600 files the host really has stay shut too.
        let o = f.env.run(&[
            "exec",
            "--python",
            &common::python(),
            "--sandbox",
            "auto",
            "import os\nfor p in ['/etc/ssl/private', '/etc/shadow', '/proc/1/environ']:\n    try:\n        print(p, os.listdir(p) if os.path.isdir(p) else len(open(p).read()))\n    except OSError as e:\n        print(p, type(e).__name__)",
        ]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!out.contains("/etc/ssl/private ["), "{out}");
        assert!(out.contains("/proc/1/environ PermissionError"), "{out}");
    }
    let o = f.env.run(&["doctor", "--json", "--python", &common::python()]);
    let report: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::text(&o)));
    let layers = report["layers"].as_array().expect("layers");
    for name in ["rootfs", "uid"] {
        let l = layers
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("no {name} layer: {report}"));
        assert_eq!(l["enforced"], true, "{l}");
    }
    let uid = layers.iter().find(|l| l["name"] == "uid").expect("uid");
    if common::is_root() {
        assert!(
            uid["detail"]
                .as_str()
                .is_some_and(|d| d.contains("one per kernel")),
            "{uid}"
        );
    } else {
        let me = rustix::process::getuid().as_raw();
        assert!(
            uid["detail"]
                .as_str()
                .is_some_and(|d| d.contains(&format!("host uid {me}"))),
            "{uid}"
        );
    }
    f.assert_healthy();
}

/// The cell a kernel runs to look at `/sys/fs/cgroup` the way
/// joblib/loky's `cpu_count()` does (cgroup v2 `cpu.max`, else v1
/// `cpu/cpu.cfs_quota_us`), and for other kernels' groups.
const CGROUP_PROBE: &str = r#"import json, os
out = {}
def read(p):
    try:
        return open(p).read().strip()
    except OSError as e:
        return type(e).__name__
for p in ["/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
          "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
          "/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"]:
    out[p] = read(p) if os.path.exists(p) else None
subdirs = []
for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"]:
    try:
        subdirs += [os.path.join(root, n) for n in os.listdir(root) if os.path.isdir(os.path.join(root, n))]
    except OSError:
        pass
out["subdirs"] = subdirs
try:
    open("/sys/fs/cgroup/pids/pids.max" if os.path.exists("/sys/fs/cgroup/pids/pids.max") else "/sys/fs/cgroup/pids.max", "w").write("max")
    out["write"] = "WROTE"
except OSError as e:
    out["write"] = type(e).__name__
print(json.dumps(out))"#;

/// Attack: read other kernels' cgroups (their names are session names),
/// or raise the kernel's own limit. Need: a library reading its quota
/// where it looks for it (joblib/loky failed with `PermissionError` on
/// `/sys/fs/cgroup/cpu/cpu.cfs_quota_us`). Surface: CLI one-shot `exec`,
/// mode `auto`. The kernel sees exactly its own groups, read-only, and
/// nothing else of `/sys/fs/cgroup`; where the host could not make it
/// groups (no cgroup layer), the quota files do not exist (loky then
/// counts CPUs), never a `PermissionError`.
#[test]
fn kernel_reads_its_own_cgroup_read_only_and_no_other() {
    let env = Env::new();
    let (code, v) = env.exec_json(&["--sandbox", "auto"], CGROUP_PROBE);
    assert_eq!(code, 0, "{v}");
    let seen: Value = serde_json::from_str(v["stdout"].as_str().unwrap_or("").trim()).expect("probe JSON");
    let cgroup_on = v["kernel"]["sandbox"]["enforced"]
        .as_array()
        .is_some_and(|a| a.iter().any(|l| l == "cgroup"));
    for (path, value) in seen.as_object().expect("object") {
        if path.starts_with('/') {
            assert_ne!(value, "PermissionError", "{path}: {seen}");
        }
    }
    assert_eq!(
        seen["subdirs"],
        serde_json::json!([]),
        "no other group is visible: {seen}"
    );
    assert_ne!(seen["write"], "WROTE", "{seen}");
    if cgroup_on {
        let mem = [
            &seen["/sys/fs/cgroup/memory.max"],
            &seen["/sys/fs/cgroup/memory/memory.limit_in_bytes"],
        ];
        assert!(
            mem.iter().any(|m| *m == "4294967296"),
            "the 4 GiB limit is readable: {seen}"
        );
        let pids = [
            &seen["/sys/fs/cgroup/pids.max"],
            &seen["/sys/fs/cgroup/pids/pids.max"],
        ];
        assert!(
            pids.iter().any(|m| *m == "512"),
            "the process limit is readable: {seen}"
        );
    } else {
        eprintln!("no cgroup layer here (non-root v1): the quota files are absent: {seen}");
        for (path, value) in seen.as_object().expect("object") {
            if path.starts_with('/') {
                assert_eq!(value, &Value::Null, "{path}: {seen}");
            }
        }
    }
}
