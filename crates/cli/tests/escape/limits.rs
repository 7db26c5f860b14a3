//! Limits per session (`limits` of `POST /v1/sessions`, `exec --session
//! --memory/--pids/--disk`, config `[limits]`): a cell that runs into a
//! limit — a memory hog, a fork bomb, `dd` past the disk cap, a sleep past
//! the deadline, a forbidden system call — must come back as a result with
//! that limit's `fault` (never a bare crash or a hung call), a request over
//! the operator's maximum must be refused naming the field and the maximum,
//! the host's own writes must respect the disk cap, and the session's info
//! must show its limits. Runs as root and, through
//! `scripts/escape-nonroot.sh`, as an unprivileged user: where that user
//! has no cgroup to set memory or process limits in, a session asking for
//! them is refused (`kernel_failed`), never started without them.

use std::os::unix::ffi::OsStrExt;

use serde_json::{Value, json};

use crate::common::{self, Env, text};
use crate::http_tenants::{ALICE, Answer, Serve};

const CONFIG: &str = r#"
[limits.max]
memory_mb = 1024
pids = 256
disk_mb = 64
cell_timeout_s = 120

[[limits.session]]
match = "agent-*"
disk_mb = 4
"#;

fn auth() -> String {
    format!("Bearer {ALICE}")
}

fn json_of(a: &Answer) -> Value {
    serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("not JSON ({e}): {a:?}"))
}

/// `serve` with [`CONFIG`] as its configuration (the directory kept by the
/// caller).
fn serve_with_limits() -> (Serve, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix("cellhost-limits-")
        .tempdir()
        .expect("tmp");
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, CONFIG).expect("config");
    let cfg = cfg.display().to_string();
    (Serve::start(&[("CELLHOST_CONFIG", cfg.as_str())]), dir)
}

fn create(serve: &Serve, body: &Value) -> Answer {
    let a = auth();
    serve.request(
        "POST",
        "/v1/sessions",
        &[
            ("Authorization", a.as_str()),
            ("Content-Type", "application/json"),
        ],
        &body.to_string(),
    )
}

fn execute(serve: &Serve, name: &str, code: &str) -> Value {
    let a = auth();
    let ans = serve.request(
        "POST",
        &format!("/v1/sessions/{name}/execute"),
        &[
            ("Authorization", a.as_str()),
            ("Content-Type", "application/json"),
        ],
        &json!({ "code": code, "timeout_s": 60 }).to_string(),
    );
    assert_eq!(ans.status, 200, "{ans:?}");
    json_of(&ans)
}

/// Executes `code` with the session's own deadline (no `timeout_s`).
fn execute_default_deadline(serve: &Serve, name: &str, code: &str) -> Value {
    let a = auth();
    let ans = serve.request(
        "POST",
        &format!("/v1/sessions/{name}/execute"),
        &[
            ("Authorization", a.as_str()),
            ("Content-Type", "application/json"),
        ],
        &json!({ "code": code }).to_string(),
    );
    assert_eq!(ans.status, 200, "{ans:?}");
    json_of(&ans)
}

/// The `limits` of the caller's live session `name` in `GET /v1/sessions`.
fn listed_limits(serve: &Serve, name: &str) -> Value {
    let a = auth();
    let ans = serve.request("GET", "/v1/sessions", &[("Authorization", a.as_str())], "");
    assert_eq!(ans.status, 200, "{ans:?}");
    let v = json_of(&ans);
    v["sessions"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .map(|s| s["limits"].clone())
        .unwrap_or_else(|| panic!("{name} not listed: {v}"))
}

const DD_PAST_CAP: &str = "import subprocess\nsubprocess.run(['dd', 'if=/dev/zero', 'of=big.bin', 'bs=1M', 'count=12'], check=True, capture_output=True)";
const KEXEC: &str = "import ctypes\nctypes.CDLL(None).syscall(246, 0, 0, 0, 0)";

/// The workdir holders (`__cellhost-disk-holder`) that are children of
/// process `parent`.
fn holders_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.split(|&b| b == 0).nth(1) != Some(b"__cellhost-disk-holder".as_slice()) {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let ppid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

/// `disk_mb` caps the session's workdir in total, not only each file: a
/// cell writing 20 files of a tenth of the cap each gets `ENOSPC` (fault
/// `disk`) once their sum reaches the cap; the session's next cell runs,
/// the files written before the cap are readable through the files API,
/// a restarted kernel sees them, and the workdir's holder is reaped with
/// the session (as root, and as the unprivileged user of
/// `scripts/escape-nonroot.sh`).
/// As root on Linux before 6.3 (no idmapped tmpfs) the session keeps the
/// kernel's own uid and its cap is the host's accounting: the layer `disk`
/// is named missing with the reason, and the kernel writes its workdir.
/// `true` when that is so here (the caller's tmpfs checks do not apply).
fn disk_is_accounting_here(v: &Value) -> bool {
    let Some(why) = cellhost_sandbox::workdir_disk::tmpfs_idmap_missing()
        .filter(|_| rustix::process::geteuid().is_root())
    else {
        return false;
    };
    let reason = v["kernel"]["sandbox"]["reasons"]["disk"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("cannot idmap a tmpfs"),
        "the missing disk layer names why: {v}"
    );
    assert_ne!(
        v["error"]["ename"], "PermissionError",
        "the kernel writes its workdir: {v}"
    );
    let enforced = v["kernel"]["sandbox"]["enforced"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(enforced.iter().any(|l| l == "uid"), "the uid layer is kept: {v}");
    eprintln!("{why}: the disk cap is the host's accounting here; the tmpfs checks are skipped");
    true
}

#[test]
fn disk_mb_caps_the_workdir_in_total() {
    let (serve, _cfg) = serve_with_limits();
    let a = create(&serve, &json!({"name": "dtot", "limits": {"disk_mb": 10}}));
    assert_eq!(a.status, 201, "{a:?}");
    let v = execute(
        &serve,
        "dtot",
        "for i in range(20):
    with open(f'part{i:02}.bin', 'wb') as f:
        f.write(bytes([i]) * (1 << 20))",
    );
    if disk_is_accounting_here(&v) {
        return;
    }
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["fault"], "disk", "{v}");
    let evalue = v["error"]["evalue"].as_str().unwrap_or_default();
    assert!(
        evalue.contains("Errno 28") && evalue.contains("No space left"),
        "{v}"
    );
    let enforced: Vec<&str> = v["kernel"]["sandbox"]["enforced"]
        .as_array()
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(enforced.contains(&"disk"), "the disk layer is in force: {v}");
    assert_eq!(holders_of(serve.pid()).len(), 1, "one holder for the session");

    // The session goes on; the files before the cap are whole and listed.
    let v = execute(
        &serve,
        "dtot",
        "import os
print(sum(os.path.getsize(f) for f in os.listdir('.')) <= 10 << 20)",
    );
    assert_eq!(v["stdout"], "True\n", "{v}");
    let a = auth();
    let list = serve.request(
        "GET",
        "/v1/sessions/dtot/files",
        &[("Authorization", a.as_str())],
        "",
    );
    assert_eq!(list.status, 200, "{list:?}");
    let l = json_of(&list);
    let entries = l["entries"].as_array().cloned().unwrap_or_default();
    let whole: Vec<&Value> = entries.iter().filter(|e| e["size"] == 1 << 20).collect();
    assert!(whole.len() >= 8, "at least 8 whole files before the cap: {l}");
    let got = serve.request(
        "GET",
        "/v1/sessions/dtot/files/part03.bin",
        &[("Authorization", a.as_str())],
        "",
    );
    assert_eq!(got.status, 200, "{:?}", got.status);
    assert_eq!(got.body.len(), 1 << 20);
    assert!(got.body.bytes().all(|b| b == 3));
    // The host's write past the cap is refused, the tmpfs full or not.
    let put = serve.request(
        "PUT",
        "/v1/sessions/dtot/files/more.bin",
        &[
            ("Authorization", a.as_str()),
            ("Content-Type", "application/octet-stream"),
        ],
        &"0".repeat(2 << 20),
    );
    assert_eq!(put.status, 507, "{put:?}");
    assert_eq!(json_of(&put)["error"]["code"], "disk_full");

    // A new kernel (restart) sees the same files, and the cap holds still.
    let r = serve.request(
        "POST",
        "/v1/sessions/dtot/restart",
        &[
            ("Authorization", a.as_str()),
            ("Content-Type", "application/json"),
        ],
        "{}",
    );
    assert_eq!(r.status, 200, "{r:?}");
    let v = execute(
        &serve,
        "dtot",
        "print(open('part00.bin', 'rb').read(4))
open('after.bin', 'wb').write(b'1' * (4 << 20))",
    );
    assert_eq!(v["stdout"], "b'\\x00\\x00\\x00\\x00'\n", "{v}");
    assert_eq!(v["fault"], "disk", "{v}");
    assert_eq!(holders_of(serve.pid()).len(), 1, "the holder outlives the kernel");

    // The session's end reaps its holder.
    let d = serve.request(
        "DELETE",
        "/v1/sessions/dtot",
        &[("Authorization", a.as_str())],
        "",
    );
    assert!(d.status == 200 || d.status == 204, "{d:?}");
    assert!(holders_of(serve.pid()).is_empty(), "holder left behind");

    // The server's shutdown reaps the holders of sessions still open.
    let a2 = create(&serve, &json!({"name": "dtot2", "limits": {"disk_mb": 4}}));
    assert_eq!(a2.status, 201, "{a2:?}");
    assert_eq!(execute(&serve, "dtot2", "print(1)")["stdout"], "1\n");
    let open = holders_of(serve.pid());
    assert_eq!(open.len(), 1, "{open:?}");
    drop(serve);
    for pid in open {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            cmdline.split(|&b| b == 0).nth(1) != Some(b"__cellhost-disk-holder".as_slice()),
            "holder {pid} outlived the server"
        );
    }
}

/// The `--dir` of holder `pid` (the session's workdir on disk).
fn holder_dir(pid: u32) -> std::path::PathBuf {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("holder cmdline");
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let at = args.iter().position(|a| *a == b"--dir").expect("--dir");
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(args[at + 1]))
}

/// Blocks until process `pid` (not our child) has exited: its pidfd
/// becomes readable. The bound only keeps a broken holder from hanging the
/// suite.
fn wait_exit(pidfd: &std::os::fd::OwnedFd) {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let guard = Timespec {
        tv_sec: 600,
        tv_nsec: 0,
    };
    loop {
        match poll(&mut fds, Some(&guard)) {
            Ok(0) => panic!("the holder did not exit"),
            Ok(_) => return,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => panic!("poll: {e}"),
        }
    }
}

/// A host killed with `SIGKILL` loses none of what a `disk_mb` session's
/// cells wrote: the workdir's holder, its stdin closed by the host's death,
/// copies the tmpfs back into the directory on disk before it exits —
/// byte-exact, sub-directories too, a symbolic link kept as a link (one
/// to `/etc/passwd` neither followed nor written through) (as root, and as
/// the unprivileged user of `scripts/escape-nonroot.sh`).
#[test]
fn disk_mb_files_survive_the_host_sigkill() {
    let (mut serve, _cfg) = serve_with_limits();
    let passwd = std::fs::read("/etc/passwd").expect("/etc/passwd");
    let a = create(&serve, &json!({"name": "dkill", "limits": {"disk_mb": 8}}));
    assert_eq!(a.status, 201, "{a:?}");
    let v = execute(
        &serve,
        "dkill",
        "import os
os.makedirs('sub/deep')
open('all.bin', 'wb').write(bytes(range(256)) * 4096)
open('sub/deep/note.txt', 'w').write('written before the host died\\n')
os.symlink('/etc/passwd', 'pw')
os.symlink('/etc', 'etcdir')
print(sorted(os.listdir('.')))",
    );
    if disk_is_accounting_here(&v) {
        assert_eq!(v["status"], "ok", "{v}");
        return;
    }
    assert_eq!(v["status"], "ok", "{v}");
    let enforced: Vec<&str> = v["kernel"]["sandbox"]["enforced"]
        .as_array()
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(enforced.contains(&"disk"), "the disk layer is in force: {v}");
    let holders = holders_of(serve.pid());
    assert_eq!(holders.len(), 1, "{holders:?}");
    let holder = holders[0];
    let dir = holder_dir(holder);
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(holder as i32).expect("pid"),
        rustix::process::PidfdFlags::empty(),
    )
    .expect("pidfd_open");
    // Before the host dies, the directory on disk does not have the files.
    assert!(!dir.join("all.bin").exists(), "{}", dir.display());

    serve.kill_now();
    wait_exit(&pidfd);

    let all = std::fs::read(dir.join("all.bin")).expect("all.bin on disk");
    assert_eq!(all.len(), 256 * 4096);
    assert!(
        all.chunks(256).all(|c| c.iter().copied().eq(0..=255u8)),
        "byte-exact"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("sub/deep/note.txt")).expect("note"),
        "written before the host died\n"
    );
    for (link, target) in [("pw", "/etc/passwd"), ("etcdir", "/etc")] {
        let m = std::fs::symlink_metadata(dir.join(link)).expect("link on disk");
        assert!(m.file_type().is_symlink(), "{link}: {m:?}");
        assert_eq!(
            std::fs::read_link(dir.join(link)).expect("readlink"),
            std::path::Path::new(target)
        );
    }
    assert_eq!(
        std::fs::read("/etc/passwd").expect("/etc/passwd"),
        passwd,
        "/etc/passwd untouched"
    );
    for f in ["all.bin", "note.txt", "deep"] {
        assert!(!std::path::Path::new("/etc").join(f).exists(), "/etc/{f} written");
    }
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("workdir")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with(".cellhost-"))
        .collect();
    assert!(left.is_empty(), "temporary names left: {left:?}");
}

/// HTTP: disk cap, deadline and seccomp need no cgroup: each hit is its
/// fault; the host's PUT past the cap is refused (507 `disk_full`); the
/// session's limits are listed; a rule of the config applies by name.
#[test]
fn limits_http_disk_timeout_seccomp_faults() {
    let (serve, _cfg) = serve_with_limits();
    let a = create(
        &serve,
        &json!({"name": "lim1", "limits": {"disk_mb": 8, "cell_timeout_s": 2}}),
    );
    assert_eq!(a.status, 201, "{a:?}");
    let created = json_of(&a);
    assert_eq!(created["limits"]["disk_mb"], 8, "{created}");
    let listed = listed_limits(&serve, "lim1");
    assert_eq!(listed["disk_mb"], 8, "{listed}");
    assert_eq!(listed["cell_timeout_s"], 2.0, "{listed}");
    // The operator's maximum stands in for the host's default (4096 MiB).
    assert_eq!(listed["memory_mb"], 1024, "{listed}");

    let v = execute(&serve, "lim1", DD_PAST_CAP);
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["fault"], "disk", "{v}");
    let v = execute(
        &serve,
        "lim1",
        "with open('big2.bin', 'wb') as f:\n    f.write(b'0' * (9 << 20))",
    );
    assert_eq!(v["fault"], "disk", "{v}");
    // Past the file-size limit, or (the workdir's tmpfs holding what `dd`
    // wrote) past the workdir's total.
    let evalue = v["error"]["evalue"].as_str().unwrap_or_default();
    assert!(evalue.contains("Errno 27") || evalue.contains("Errno 28"), "{v}");
    // The same session still runs cells.
    assert_eq!(execute(&serve, "lim1", "print(6 * 7)")["stdout"], "42\n");

    // The host's own write into the workdir respects the cap: the cell's
    // files leave 64 KiB of it, a PUT of 256 KiB is refused (the body is
    // small enough for the socket to take it all while the server stops
    // reading at the cap).
    let v = execute(
        &serve,
        "lim1",
        "import os
for f in os.listdir('.'):
    os.remove(f)
with open('fill.bin', 'wb') as f:
    f.write(b'0' * ((8 << 20) - (64 << 10)))",
    );
    assert_eq!(v["status"], "ok", "{v}");
    let a = auth();
    let put = serve.request(
        "PUT",
        "/v1/sessions/lim1/files/in.bin",
        &[
            ("Authorization", a.as_str()),
            ("Content-Type", "application/octet-stream"),
        ],
        &"0".repeat(256 << 10),
    );
    assert_eq!(put.status, 507, "{put:?}");
    let e = json_of(&put);
    assert_eq!(e["error"]["code"], "disk_full", "{e}");
    assert_eq!(e["error"]["max_mb"], 8, "{e}");
    let small = serve.request(
        "PUT",
        "/v1/sessions/lim1/files/small.txt",
        &[
            ("Authorization", a.as_str()),
            ("Content-Type", "application/octet-stream"),
        ],
        "hello",
    );
    assert_eq!(small.status, 201, "{small:?}");

    // The session's deadline, not the host's 300 s.
    let v = execute_default_deadline(&serve, "lim1", "import time\ntime.sleep(30)");
    assert_eq!(v["status"], "timeout", "{v}");
    assert_eq!(v["fault"], "timeout", "{v}");

    // A forbidden system call ends the kernel with its fault; the next
    // cell gets a new kernel under the same limits.
    let v = execute(&serve, "lim1", KEXEC);
    assert_eq!(v["status"], "crashed", "{v}");
    assert_eq!(v["fault"], "seccomp", "{v}");
    assert_eq!(v["crash"]["signal_name"], "SIGSYS", "{v}");
    let v = execute(&serve, "lim1", "print('again')");
    assert_eq!(v["stdout"], "again\n", "{v}");
    assert_eq!(listed_limits(&serve, "lim1")["disk_mb"], 8);

    // A config rule by session name.
    let a = create(&serve, &json!({"name": "agent-7"}));
    assert_eq!(a.status, 201, "{a:?}");
    assert_eq!(listed_limits(&serve, "agent-7")["disk_mb"], 4);
    let v = execute(&serve, "agent-7", DD_PAST_CAP);
    assert_eq!(v["fault"], "disk", "{v}");
}

/// HTTP: a value over the maximum is refused with the field and the max,
/// and no session is left behind; a value out of range is a usage error.
#[test]
fn limits_http_over_max_refused() {
    let (serve, _cfg) = serve_with_limits();
    for (field, value, max) in [
        ("memory_mb", json!(4096), 1024.0),
        ("pids", json!(100000), 256.0),
        ("disk_mb", json!(65), 64.0),
        ("cell_timeout_s", json!(0), 120.0),
    ] {
        let a = create(&serve, &json!({"name": "big", "limits": { field: value }}));
        assert_eq!(a.status, 422, "{field}: {a:?}");
        let e = json_of(&a);
        assert_eq!(e["error"]["code"], "limit_over_max", "{e}");
        assert_eq!(e["error"]["field"], field, "{e}");
        assert_eq!(e["error"]["max"], max, "{e}");
    }
    let a = create(&serve, &json!({"name": "big", "limits": {"memory_mb": 1}}));
    assert_eq!(a.status, 400, "{a:?}");
    let a = create(&serve, &json!({"name": "big", "limits": {"memroy_mb": 1}}));
    assert_eq!(a.status, 422, "{a:?}");
    // Nothing was created by the refused requests.
    let t = auth();
    let list = serve.request("GET", "/v1/sessions", &[("Authorization", t.as_str())], "");
    assert!(!list.body.contains("\"big\""), "{list:?}");
}

/// HTTP: memory and process limits (the kernel's cgroup): a memory hog is
/// `oom`, a fork bomb `pids`, each in a kernel the session restarts; where
/// no cgroup can be set (a non-root user without delegation) the session
/// is refused, never started without its limits.
#[test]
fn limits_http_oom_and_pids_faults() {
    let (serve, _cfg) = serve_with_limits();
    let a = create(
        &serve,
        &json!({"name": "lim2", "limits": {"memory_mb": 128, "pids": 32, "cpu": 1.0}}),
    );
    if a.status == 502 {
        assert!(!common::is_root(), "root must have cgroups here: {a:?}");
        let e = json_of(&a);
        assert_eq!(e["error"]["code"], "kernel_failed", "{e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("limit"),
            "{e}"
        );
        return;
    }
    assert_eq!(a.status, 201, "{a:?}");
    let listed = listed_limits(&serve, "lim2");
    assert_eq!(listed["memory_mb"], 128, "{listed}");
    assert_eq!(listed["pids"], 32, "{listed}");
    assert_eq!(listed["cpu"], 1.0, "{listed}");
    let v = execute(
        &serve,
        "lim2",
        "x = bytearray(512 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1",
    );
    assert_eq!(v["fault"], "oom", "{v}");
    assert_eq!(v["status"], "crashed", "{v}");
    let v = execute(
        &serve,
        "lim2",
        "import os, time\nkids = []\nfor i in range(200):\n    pid = os.fork()\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    kids.append(pid)",
    );
    assert_eq!(v["fault"], "pids", "{v}");
    let v = execute(&serve, "lim2", "print('alive')");
    assert_eq!(v["stdout"], "alive\n", "{v}");
}

/// The daemon (`exec --session`): `--disk` gives `dd` past the cap its
/// fault, `sessions --json` lists the limits, a value over the config's
/// maximum exits 2 naming the field, and a running session keeps its
/// limits (a note says so).
#[test]
fn limits_daemon_flags() {
    let env = Env::new();
    std::fs::write(env.path().join("config.toml"), CONFIG).expect("config");
    let py = common::python();
    let exec = |extra: &[&str], code: &str| {
        let mut args = vec!["exec", "--session", "d1", "--python", py.as_str(), "--json"];
        args.extend_from_slice(extra);
        args.push(code);
        env.run(&args)
    };
    let o = exec(&["--disk", "8"], DD_PAST_CAP);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(v["fault"], "disk", "{v}");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = env.run(&["sessions", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let s = listed
        .as_array()
        .or_else(|| listed["sessions"].as_array())
        .and_then(|a| a.iter().find(|s| s["name"] == "d1").cloned())
        .unwrap_or_else(|| panic!("d1 not listed: {listed}"));
    assert_eq!(s["limits"]["disk_mb"], 8, "{s}");
    let o = exec(&["--disk", "16"], "print(1)");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("other limits"),
        "{}",
        text(&o)
    );
    let o = exec(&["--pids", "100000"], "print(1)");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("pids") && err.contains("256"), "{}", text(&o));
    let o = exec(&["--timeout", "1"], "import time\ntime.sleep(30)");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(v["fault"], "timeout", "{v}");
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    // The terminal rendering names the fault too.
    let o = env.run(&["exec", "--session", "d1", "--python", py.as_str(), DD_PAST_CAP]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("fault: disk"),
        "{}",
        text(&o)
    );
}

/// `exec --session --detach` takes the session flags of `exec --session`:
/// `--disk` sizes the session the detached cell creates (its `dd` past the
/// cap is a `disk` fault in `wait`'s result, the listing shows the cap),
/// `--network` with a list gives its kernel the proxy, a running session
/// keeps its limits (a note says so), and a value over the maximum is
/// refused at once with exit 2 before any cell is submitted.
#[test]
fn limits_daemon_detach_flags() {
    let env = Env::new();
    std::fs::write(env.path().join("config.toml"), CONFIG).expect("config");
    let py = common::python();
    let submit = |extra: &[&str], code: &str| {
        let mut args = vec!["exec", "--session", "dd1", "--python", py.as_str(), "--detach"];
        args.extend_from_slice(extra);
        args.push(code);
        env.run(&args)
    };
    let code = format!("import os\nprint(os.environ.get('HTTPS_PROXY'))\n{DD_PAST_CAP}");
    let o = submit(&["--disk", "8", "--network", "127.0.0.1:9"], &code);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let cell = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let o = env.run(&["wait", "--json", &cell]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(v["fault"], "disk", "{v}");
    assert!(
        v["stdout"]
            .as_str()
            .unwrap_or_default()
            .starts_with("http://127.0.0.1:"),
        "the list policy's proxy: {v}"
    );
    let o = env.run(&["sessions", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let s = listed
        .as_array()
        .or_else(|| listed["sessions"].as_array())
        .and_then(|a| a.iter().find(|s| s["name"] == "dd1").cloned())
        .unwrap_or_else(|| panic!("dd1 not listed: {listed}"));
    assert_eq!(s["limits"]["disk_mb"], 8, "{s}");
    let o = submit(&["--disk", "16"], "print(1)");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("other limits"),
        "{}",
        text(&o)
    );
    let cell = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let o = env.run(&["wait", &cell]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = submit(&["--pids", "100000"], "print(1)");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("limit_over_max") && err.contains("256"),
        "{}",
        text(&o)
    );
    assert!(o.stdout.is_empty(), "no cell id: {}", text(&o));
}

/// A session's own limits and network policy are journaled: after the
/// daemon restarts, the session's next kernel runs under them (a `dd` past
/// its `--disk` is a `disk` fault, its kernel has the list policy's
/// proxy), and `restore` (into the same session, and `--from` into
/// another) rebuilds it under them too.
#[test]
fn limits_and_network_survive_daemon_restart_and_restore() {
    let env = Env::new();
    std::fs::write(env.path().join("config.toml"), CONFIG).expect("config");
    let py = common::python();
    let exec = |session: &str, extra: &[&str], code: &str| {
        let mut args = vec!["exec", "--session", session, "--python", py.as_str(), "--json"];
        args.extend_from_slice(extra);
        args.push(code);
        let o = env.run(&args);
        serde_json::from_slice::<Value>(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
    };
    let probe = format!("import os\nprint(os.environ.get('HTTPS_PROXY'))\n{DD_PAST_CAP}");
    let check = |v: &Value, what: &str| {
        assert_eq!(v["fault"], "disk", "{what}: {v}");
        assert!(
            v["stdout"]
                .as_str()
                .unwrap_or_default()
                .starts_with("http://127.0.0.1:"),
            "{what}: the list policy's proxy: {v}"
        );
    };
    let v = exec("r1", &["--disk", "8", "--network", "127.0.0.1:9"], "x = 41");
    assert_eq!(v["status"], "ok", "{v}");
    let o = env.run(&["daemon", "stop"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // A new daemon: the session's next kernel gets its journaled settings.
    check(&exec("r1", &[], &probe), "after a daemon restart");
    let v = exec("r1", &[], "x = 41");
    assert_eq!(v["status"], "ok", "{v}");
    let o = env.run(&["daemon", "stop"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // `restore` after a restart replays under them.
    let o = env.run(&["restore", "--python", py.as_str(), "--json", "r1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = exec("r1", &[], "print(x + 1)");
    assert_eq!(v["stdout"], "42\n", "{v}");
    check(&exec("r1", &[], &probe), "after restore");
    let o = env.run(&["restore", "--python", py.as_str(), "--json", "--from", "r1", "r2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    check(&exec("r2", &[], &probe), "restored from r1 into r2");
    let o = env.run(&["sessions", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let s = listed
        .as_array()
        .or_else(|| listed["sessions"].as_array())
        .and_then(|a| a.iter().find(|s| s["name"] == "r2").cloned())
        .unwrap_or_else(|| panic!("r2 not listed: {listed}"));
    assert_eq!(s["limits"]["disk_mb"], 8, "{s}");
}

/// `serve` restarted on the same state directory: a session created again
/// under its name (not deleted before) runs under the limits and network
/// policy it was created with; once deleted, its name is a new session
/// under the configured ones.
#[test]
fn limits_and_network_survive_a_serve_restart_until_deleted() {
    let dir = tempfile::Builder::new()
        .prefix("cellhost-limits-restart-")
        .tempdir()
        .expect("tmp");
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, CONFIG).expect("config");
    let state = dir.path().join("state").display().to_string();
    let cfg = cfg.display().to_string();
    let vars = [
        ("CELLHOST_CONFIG", cfg.as_str()),
        ("CELLHOST_STATE_DIR", state.as_str()),
    ];
    let probe = format!("import os\nprint(os.environ.get('HTTPS_PROXY'))\n{DD_PAST_CAP}");
    {
        let serve = Serve::start(&vars);
        let a = create(
            &serve,
            &json!({"name": "h1", "limits": {"disk_mb": 8}, "network": ["127.0.0.1:9"]}),
        );
        assert_eq!(a.status, 201, "{a:?}");
        // A settled cell is committed, and the session's row before it.
        let v = execute(&serve, "h1", "x = 1");
        assert_eq!(v["status"], "ok", "{v}");
    }
    let serve = Serve::start(&vars);
    let a = create(&serve, &json!({"name": "h1"}));
    assert_eq!(a.status, 201, "{a:?}");
    assert_eq!(listed_limits(&serve, "h1")["disk_mb"], 8);
    let v = execute(&serve, "h1", &probe);
    assert_eq!(v["fault"], "disk", "{v}");
    assert!(
        v["stdout"]
            .as_str()
            .unwrap_or_default()
            .starts_with("http://127.0.0.1:"),
        "the journaled list policy: {v}"
    );
    let auth = auth();
    let d = serve.request(
        "DELETE",
        "/v1/sessions/h1",
        &[("Authorization", auth.as_str())],
        "",
    );
    assert_eq!(d.status, 204, "{d:?}");
    let a = create(&serve, &json!({"name": "h1"}));
    assert_eq!(a.status, 201, "{a:?}");
    assert_eq!(
        listed_limits(&serve, "h1")["disk_mb"],
        64,
        "the configured maximum"
    );
    let v = execute(&serve, "h1", &probe);
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["stdout"], "None\n", "{v}");
}
