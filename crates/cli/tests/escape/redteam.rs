//! Red team: holes found after the issue's items were closed, each an
//! attack from inside a real kernel that must fail while the host stays
//! healthy.
//!
//! * The host writes each cell's figures and spill files into the session
//!   directory, which is bound read-write into the kernel: a kernel that
//!   plants `cells/<id>/display-1.png -> /etc/cron.d/x` (or a link on the
//!   spill file `stdout.txt`) had the host — root, or the host user — write
//!   attacker bytes anywhere, and a link swapped in after the write had the
//!   host read any host file back to a client (MCP image content, the
//!   figure copies and embedded data of `run`). Now `cells/` is covered in
//!   the kernel's view, and the host never follows a link (nor opens a
//!   FIFO or a hard link) below a directory a kernel can write.

use std::path::Path;

use serde_json::Value;

use crate::common::{self, Env, text};

/// Python that plants links to `VICTIM` on every file the host writes for
/// this cell (its figure, its spill files, the `_files` directory of
/// `run`), then makes the host write them: a PNG display and 60 KB of
/// stdout. Prints `session-dir-seen` when the cell could see its session
/// directory at all (so the attack is not vacuous) and `planted N`.
const PLANT: &str = r#"
import os, sys
VICTIM = "@VICTIM@"
st = sys.modules['cellhost_worker.state']
# Every read-write directory bound from the host: the workdir and the
# session directory (under `sessions/` or, in a long-lived host, `staging/`).
sds = [l.split()[4] for l in open('/proc/self/mountinfo')
       if l.split()[5].startswith('rw') and l.split()[4] not in ('/proc', '/dev', '/dev/shm', '/tmp')
       and not l.split()[4].startswith('/dev/')]
if any('/sessions/' in d or '/staging/' in d for d in sds):
    print("session-dir-seen")
planted = 0
for sd in sds:
    for rel in ['cells/%s/display-1.png' % st.current, 'cells/%s/stdout.txt' % st.current, 'cells/%s/result.png' % st.current]:
        p = os.path.join(sd, rel)
        try:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            os.symlink(os.path.join(VICTIM, os.path.basename(p)), p)
            planted += 1
        except OSError:
            pass
    try:
        os.rename(os.path.join(sd, 'cells'), os.path.join(sd, 'cells-old'))
        os.symlink(VICTIM, os.path.join(sd, 'cells'))
        planted += 1
    except OSError:
        pass
print("planted", planted)
class P:
    def _repr_png_(self):
        return b'\x89PNG\r\n\x1a\n* * * * * root touch /tmp/cellhost-pwned\n'
display(P())
print("x" * 60000)
P()
"#;

fn victim_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("victim dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `exec` from a workdir that is not the state directory's parent (so the
/// session directory is bound into the kernel as it is for a user).
/// `None` when the kernel was refused: `enforce` as non-root where the
/// cgroup layer is missing; any other failure is not JSON and fails.
fn exec_in(env: &Env, wd: &Path, mode: &str, code: &str) -> Option<(i32, Value)> {
    let py = common::python();
    let o = env
        .cmd(&["exec", "--python", py.as_str(), "--json", "--sandbox", mode, code])
        .current_dir(wd)
        .output()
        .expect("run cellhost");
    // Refused only where a layer is missing (the cgroup limits of a user
    // on cgroup v1); with a delegated cgroup (systemd, cgroup v2) the
    // kernel runs and is checked like root's.
    if mode == "enforce"
        && !common::is_root()
        && o.status.code() == Some(1)
        && String::from_utf8_lossy(&o.stderr).contains("refuses")
    {
        return None;
    }
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)));
    Some((o.status.code().unwrap_or(-1), v))
}

/// One-shot `exec`, modes auto and enforce, root and non-root: links
/// planted on the figure, result and spill paths are never followed by the
/// host; the figure and the spill still land in the session directory.
#[test]
fn escape_red_session_dir_links_host_writes() {
    for mode in ["auto", "enforce"] {
        let env = Env::new();
        let wd = env.path().join("wd");
        std::fs::create_dir_all(&wd).expect("wd");
        let victim = tempfile::Builder::new()
            .prefix("cellhost-red-victim-")
            .tempdir()
            .expect("victim");
        let plant = PLANT.replace("@VICTIM@", &victim.path().to_string_lossy());
        let got = exec_in(&env, &wd, mode, &plant);
        assert!(
            victim_files(victim.path()).is_empty(),
            "{mode}: the host wrote through a link the kernel planted: {:?}\n{got:?}",
            victim_files(victim.path())
        );
        let Some((code, v)) = got else { continue };
        assert_eq!(code, 0, "{mode}: {v}");
        let stdout = v["stdout"].as_str().unwrap_or_default();
        assert!(
            stdout.contains("session-dir-seen"),
            "{mode}: the attack did not run: {v}"
        );
        // What the host wrote is where it belongs, a regular file.
        let fig = v["displays"][0]["data"]["image/png"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{mode}: no saved figure: {v}"));
        let meta = std::fs::symlink_metadata(fig).expect("figure");
        assert!(meta.file_type().is_file(), "{mode}: {fig} is not a regular file");
        assert!(
            fig.starts_with(&*env.state_dir().to_string_lossy()),
            "{mode}: {fig}"
        );
        let spill = v["truncated"]["stdout"]["spill_path"]
            .as_str()
            .unwrap_or_default();
        assert!(
            std::fs::symlink_metadata(spill).is_ok_and(|m| m.file_type().is_file()),
            "{mode}: spill {spill:?}: {v}"
        );
        // The host is healthy.
        let (code, v) = exec_in(&env, &wd, mode, "print(6 * 7)").expect("ran before");
        assert_eq!((code, v["stdout"].as_str()), (0, Some("42\n")), "{mode}: {v}");
    }
}

/// `run`, mode auto (the mode every user gets; enforce shares its code
/// path): a cell links the notebook's figure directory
/// (`<stem>_files`) to a host directory, and a later cell's figure must
/// not be copied there; a figure swapped for a link to a host file after
/// the host saved it is not read back into the notebook.
#[test]
fn escape_red_run_figure_links() {
    let env = Env::new();
    let wd = env.path().join("nb");
    std::fs::create_dir_all(&wd).expect("wd");
    let victim = tempfile::Builder::new()
        .prefix("cellhost-red-victim-")
        .tempdir()
        .expect("victim");
    let secret = victim.path().join("host-secret");
    std::fs::write(&secret, "red-host-secret-9f3k").expect("secret");
    let nb = format!(
        r#"# %%
import os, sys, glob, time
for d in ["nb.executed_files", "nb_files"]:
    os.symlink({victim:?}, d)
print("linked")
# %%
class P:
    def _repr_png_(self):
        return b'\x89PNG\r\n\x1a\n figure'
display(P())
st = sys.modules['cellhost_worker.state']
sds = [l.split()[4] for l in open('/proc/self/mountinfo') if '/sessions/' in l.split()[4]]
swapped = 0
deadline = time.time() + 5
while sds and time.time() < deadline and not swapped:
    for f in glob.glob(os.path.join(sds[0], 'cells', st.current, 'display-*.png')):
        try:
            os.unlink(f)
            os.symlink({secret:?}, f)
            swapped += 1
        except OSError:
            pass
    if not os.path.isdir(os.path.join(sds[0], 'cells', st.current)):
        break
print("swapped", swapped)
# %%
print(6 * 7)
"#,
        victim = victim.path().to_string_lossy(),
        secret = secret.to_string_lossy(),
    );
    std::fs::write(wd.join("nb.py"), nb).expect("notebook");
    let py = common::python();
    let o = env
        .cmd(&["run", "nb.py", "--python", py.as_str(), "--sandbox", "auto"])
        .current_dir(&wd)
        .output()
        .expect("run");
    let mut files = victim_files(victim.path());
    files.retain(|f| f != "host-secret");
    assert!(
        files.is_empty(),
        "the host wrote into a linked directory: {files:?}\n{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_to_string(&secret).expect("secret"),
        "red-host-secret-9f3k"
    );
    let out = std::fs::read_to_string(wd.join("nb.executed.ipynb")).expect("executed notebook");
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode("red-host-secret-9f3k");
    assert!(
        !out.contains(&b64) && !out.contains("red-host-secret"),
        "host file read back: {out}"
    );
    assert!(
        out.contains("linked") && out.contains("42"),
        "the notebook did not run: {}\n{out}",
        text(&o)
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// A cell that sets up an io_uring and submits `IORING_OP_OPENAT` with
/// `O_CREAT` and mode 04755: the open runs without a syscall, so seccomp's
/// argument filters (no set-ID modes, `openat2` refused) never see it.
/// Prints `setup <errno name>` or `setup ok` and `openat <result>`.
const URING: &str = r#"
import ctypes, errno, mmap, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
p = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 4, p)
if fd < 0:
    print("setup", errno.errorcode.get(ctypes.get_errno(), "?"))
else:
    print("setup ok")
    sq = struct.unpack_from("8IQ", p.raw, 40)
    cq = struct.unpack_from("8IQ", p.raw, 80)
    n_sq, n_cq = struct.unpack_from("2I", p.raw, 0)
    ring = mmap.mmap(fd, max(sq[6] + n_sq * 4, cq[5] + n_cq * 16), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
    sqes = mmap.mmap(fd, n_sq * 64, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0x10000000)
    path = ctypes.create_string_buffer(b"uring-made")
    sqes[0:64] = struct.pack("BBHiQQIIQ", 18, 0, 0, -100, 0, ctypes.addressof(path), 0o4755, os.O_CREAT | os.O_WRONLY, 7).ljust(64, b"\0")
    tail = struct.unpack_from("I", ring, sq[1])[0]
    struct.pack_into("I", ring, sq[6] + 4 * (tail & struct.unpack_from("I", ring, sq[2])[0]), 0)
    struct.pack_into("I", ring, sq[1], tail + 1)
    libc.syscall(426, fd, 1, 1, 1, None, 0)
    head = struct.unpack_from("I", ring, cq[0])[0]
    print("openat", struct.unpack_from("QiI", ring, cq[5] + 16 * (head & struct.unpack_from("I", ring, cq[2])[0]))[1])
"#;

/// One-shot `exec`, modes auto and enforce, root and non-root: io_uring,
/// a way around every seccomp filter, is refused (`EPERM`), and no file
/// with a set-ID bit appears in the workdir.
#[test]
fn escape_red_io_uring_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    for mode in ["auto", "enforce"] {
        let env = Env::new();
        let wd = env.path().join("wd");
        std::fs::create_dir_all(&wd).expect("wd");
        let got = exec_in(&env, &wd, mode, URING);
        let made = std::fs::metadata(wd.join("uring-made")).map(|m| m.permissions().mode());
        assert!(
            made.as_ref().map_or(true, |m| m & 0o6000 == 0),
            "{mode}: a set-ID file through io_uring: {made:?}"
        );
        let Some((code, v)) = got else { continue };
        assert_eq!(code, 0, "{mode}: {v}");
        assert_eq!(v["stdout"], "setup EPERM\n", "{mode}: io_uring is available: {v}");
        assert!(made.is_err(), "{mode}: io_uring created a file: {v}");
        let (code, v) = exec_in(&env, &wd, mode, "print(6 * 7)").expect("ran before");
        assert_eq!((code, v["stdout"].as_str()), (0, Some("42\n")), "{mode}: {v}");
    }
}

/// Runs `code` in session `name` of `serve` as `token`'s owner; the result.
fn serve_exec(serve: &crate::http_tenants::Serve, token: &str, name: &str, code: &str) -> Value {
    let auth = format!("Bearer {token}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let create = serde_json::json!({ "name": name }).to_string();
    let a = serve.request("POST", "/v1/sessions", &headers, &create);
    assert!(a.status == 201 || a.status == 409, "{name}: {a:?}");
    let path = format!(
        "/v1/sessions/{}/execute",
        name.replace('.', "%2E").replace('/', "%2F")
    );
    let body = serde_json::json!({ "code": code }).to_string();
    let a = serve.request("POST", &path, &headers, &body);
    assert_eq!(a.status, 200, "{name}: {a:?}");
    serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {a:?}"))
}

/// Python that writes a file named `@MARK@` into every read-write
/// directory of the kernel's view (its workdir, its session directory) and
/// prints the directories.
const DROP_MARK: &str = r#"
import os
rw = [l.split()[4] for l in open('/proc/self/mountinfo') if l.split()[5].startswith('rw') and l.split()[4] not in ('/proc', '/dev/shm', '/tmp', '/dev')]
for d in rw:
    try:
        if os.path.isdir(d):
            open(os.path.join(d, '@MARK@'), 'w').write('x')
    except OSError:
        pass
print(sorted(rw))
"#;

/// Python that prints every file named `@MARK@` in its read-write view.
const FIND_MARK: &str = r#"
import os
found = []
for l in open('/proc/self/mountinfo'):
    d = l.split()[4]
    if l.split()[5].startswith('rw') and os.path.isdir(d):
        for root, dirs, files in os.walk(d):
            found += [os.path.join(root, f) for f in files if f == '@MARK@']
print("found", found)
"#;

/// `serve`, mode auto, root and non-root: sessions whose names differ only
/// in characters a directory name cannot hold (`a.b`, `a_b`) or only
/// past their first 60 characters must not share their session directory:
/// a file one session writes anywhere it can is not visible to the other.
#[test]
fn escape_red_serve_sessions_with_alike_names_share_no_directory() {
    use crate::http_tenants::{ALICE, Serve};
    let serve = Serve::start(&[]);
    let long = "L".repeat(60);
    let pairs = [
        ("a.b".to_string(), "a_b".to_string()),
        (format!("{long}x"), format!("{long}y")),
    ];
    for (i, (first, second)) in pairs.iter().enumerate() {
        let mark = format!("red-mark-{i}");
        let v = serve_exec(&serve, ALICE, first, &DROP_MARK.replace("@MARK@", &mark));
        assert_eq!(v["status"], "ok", "{first}: {v}");
        let v = serve_exec(&serve, ALICE, second, &FIND_MARK.replace("@MARK@", &mark));
        assert_eq!(v["status"], "ok", "{second}: {v}");
        assert_eq!(
            v["stdout"], "found []\n",
            "session {second:?} sees what session {first:?} wrote: {v}"
        );
    }
    // The host is healthy: the first session still answers.
    let v = serve_exec(&serve, ALICE, "a.b", "print(6 * 7)");
    assert_eq!(v["stdout"], "42\n", "{v}");
}

/// Python that finds the worker's control socket (the highest socket fd)
/// and sends frames on it: `send(frame_dict)`.
const FORGE: &str = r#"
import os, socket, stat, json, sys
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

/// `run`, mode auto, root and non-root: a hostile worker forges a display
/// (and a result) whose entries look like files the host saved —
/// `{"path": <host file>}` under an unknown binary type, `application/json`
/// and `image/png` — and the host must not read that file into the
/// notebook or copy it beside it (both in the kernel's workdir).
#[test]
fn escape_red_forged_display_paths_are_not_read() {
    let env = Env::new();
    let wd = env.path().join("nb");
    std::fs::create_dir_all(&wd).expect("wd");
    let victim = tempfile::Builder::new()
        .prefix("cellhost-red-victim-")
        .tempdir()
        .expect("victim");
    let secret = victim.path().join("host-secret");
    std::fs::write(&secret, "red-host-secret-4k2q").expect("secret");
    let fake = serde_json::json!({ "path": secret, "bytes": 20 });
    let data = serde_json::json!({
        "application/x-foo": fake,
        "application/json": fake,
        "image/png": fake,
        "text/plain": "forged",
    });
    let nb = format!(
        "# %%\n{FORGE}\nst = sys.modules['cellhost_worker.state']\n\
         send({{'type': 'display', 'id': st.current, 'data': json.loads({data:?}), 'metadata': {{}}}})\n\
         print('forged')\n# %%\nprint(6 * 7)\n",
        data = data.to_string(),
    );
    std::fs::write(wd.join("nb.py"), nb).expect("notebook");
    let py = common::python();
    let o = env
        .cmd(&["run", "nb.py", "--python", py.as_str(), "--sandbox", "auto"])
        .current_dir(&wd)
        .output()
        .expect("run");
    let out = std::fs::read_to_string(wd.join("nb.executed.ipynb")).expect("executed notebook");
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode("red-host-secret-4k2q");
    assert!(
        !out.contains(&b64) && !out.contains("red-host-secret"),
        "host file read into the notebook: {out}"
    );
    let mut copied = Vec::new();
    for d in std::fs::read_dir(&wd).expect("wd").flatten() {
        if d.path().is_dir() {
            for f in std::fs::read_dir(d.path()).expect("files dir").flatten() {
                if std::fs::read_to_string(f.path()).is_ok_and(|s| s.contains("red-host-secret")) {
                    copied.push(f.path());
                }
            }
        }
    }
    assert!(
        copied.is_empty(),
        "host file copied beside the notebook: {copied:?}"
    );
    assert!(
        out.contains("forged") && out.contains("42"),
        "the notebook did not run: {}\n{out}",
        text(&o)
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// Daemon sessions (`exec --session`, mode auto) with `preload` set: the
/// kernels are forked from a template (pool directories under `staging/`),
/// as root and as another user; links planted on the host's files are
/// never followed.
#[test]
fn escape_red_session_dir_links_daemon_and_template() {
    let env = Env::new();
    let wd = env.path().join("wd");
    std::fs::create_dir_all(&wd).expect("wd");
    let victim = tempfile::Builder::new()
        .prefix("cellhost-red-victim-")
        .tempdir()
        .expect("victim");
    let plant = format!(
        "{}\nprint('forked', 'cellhost_worker.template' in sys.modules)\n",
        PLANT.replace("@VICTIM@", &victim.path().to_string_lossy())
    );
    let py = common::python();
    let run = |session: &str, code: &str| -> Value {
        let o = env
            .cmd(&[
                "exec",
                "--session",
                session,
                "--python",
                py.as_str(),
                "--json",
                "--sandbox",
                "auto",
                code,
            ])
            .current_dir(&wd)
            .env("CELLHOST_PRELOAD", "colorsys")
            .output()
            .expect("run cellhost");
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)))
    };
    // Sessions until one is forked from the template (it starts in the
    // background; the first kernels may start cold meanwhile).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut n = 0;
    let forked = loop {
        n += 1;
        let v = run(&format!("attacker{n}"), &plant);
        assert!(
            victim_files(victim.path()).is_empty(),
            "the host wrote through a planted link: {:?}\n{v}",
            victim_files(victim.path())
        );
        let out = v["stdout"].as_str().unwrap_or_default().to_string();
        assert!(out.contains("session-dir-seen"), "the attack did not run: {v}");
        let forked = out.contains("forked True");
        if forked || std::time::Instant::now() > deadline {
            break forked;
        }
    };
    // As root and as another user (a user namespace per forked kernel).
    assert!(forked, "no kernel was forked from the template");
    let v = run("attacker1", "print(6 * 7)");
    assert_eq!(v["stdout"], "42\n", "{v}");
}

/// Python that prints every host path component the kernel can learn: its
/// mount points and its working directory, split at `/` and `-`.
const PATH_WORDS: &str = r#"
import os, re
words = set()
paths = [l.split()[4] for l in open('/proc/self/mountinfo')] + [os.getcwd()]
for p in paths:
    words.update(w for w in re.split(r'[/_.-]', p) if w)
print(" ".join(sorted(words)))
"#;

/// One-shot `exec` and a daemon session, mode auto, root and non-root:
/// the host's pid (the `cellhost` process, the daemon) appears in no path
/// the kernel sees (its session directory used to be named after it).
#[test]
fn escape_red_host_pid_is_not_in_the_kernels_paths() {
    let env = Env::new();
    let wd = env.path().join("wd");
    std::fs::create_dir_all(&wd).expect("wd");
    let py = common::python();
    let child = env
        .cmd(&[
            "exec",
            "--python",
            py.as_str(),
            "--json",
            "--sandbox",
            "auto",
            PATH_WORDS,
        ])
        .current_dir(&wd)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let host = child.id().to_string();
    let o = child.wait_with_output().expect("exec");
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)));
    let words = v["stdout"].as_str().unwrap_or_default().to_string();
    assert!(words.contains("exec"), "no session directory seen: {v}");
    assert!(
        !words.split_whitespace().any(|w| w == host),
        "exec's pid {host} in the kernel's paths: {words}"
    );

    let o = env
        .cmd(&[
            "exec",
            "--session",
            "s",
            "--python",
            py.as_str(),
            "--json",
            "--sandbox",
            "auto",
            PATH_WORDS,
        ])
        .current_dir(&wd)
        .output()
        .expect("exec --session");
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)));
    let daemon = env.daemon_pid().expect("daemon pid").to_string();
    let words = v["stdout"].as_str().unwrap_or_default().to_string();
    assert!(words.contains("staging"), "no session directory seen: {v}");
    assert!(
        !words.split_whitespace().any(|w| w == daemon),
        "the daemon's pid {daemon} in the kernel's paths: {words}"
    );
    let o = env
        .cmd(&[
            "exec",
            "--session",
            "s",
            "--python",
            py.as_str(),
            "--sandbox",
            "auto",
            "print(6 * 7)",
        ])
        .current_dir(&wd)
        .output()
        .expect("exec --session");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "42\n", "{}", text(&o));
}
