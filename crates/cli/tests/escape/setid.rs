//! Item 3, its other half: a kernel's files land on disk owned by the
//! owner of its read-write directories (idmapped mounts), root's when
//! cellhost runs as root. A cell that could give such a file the
//! set-user-ID or set-group-ID bit would leave a root set-user-ID program
//! on the host. Every way to set those bits (chmod, fchmod, fchmodat,
//! creating a file with them, mknod, openat2) must fail, and the workdir
//! must hold no such file afterwards, while ordinary modes still work.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::Env;

/// Every file under `dir` whose mode has the set-user-ID or set-group-ID bit.
fn setid_files(dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            setid_files(&e.path(), out);
        } else if m.permissions().mode() & 0o6000 != 0 {
            out.push(format!("{} {:o}", e.path().display(), m.permissions().mode()));
        }
    }
}

const ATTEMPTS: &str = r##"
import ctypes, json, os, stat
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as e:
        out[name] = type(e).__name__
open("plain", "w").write("#!/bin/sh\nid\n")
attempt("chmod_4755", lambda: os.chmod("plain", 0o4755))
attempt("chmod_2755", lambda: os.chmod("plain", 0o2755))
fd = os.open("plain", os.O_RDONLY)
attempt("fchmod_4755", lambda: os.fchmod(fd, 0o4755))
os.close(fd)
attempt("open_creat_4755", lambda: os.close(os.open("made", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("mknod_4755", lambda: os.mknod("node", stat.S_IFREG | 0o4755))
def openat2():
    # struct open_how {u64 flags, mode, resolve}
    how = (ctypes.c_uint64 * 3)(os.O_CREAT | os.O_WRONLY, 0o4755, 0)
    r = libc.syscall(437, -100, b"made2", ctypes.byref(how), 24)
    if r < 0:
        raise OSError(ctypes.get_errno(), "openat2")
    os.close(r)
attempt("openat2_4755", openat2)
attempt("chmod_0755", lambda: os.chmod("plain", 0o755))
out["modes"] = {n: oct(os.stat(n).st_mode & 0o7777) for n in os.listdir(".") if os.path.isfile(n)}
print(json.dumps(out))
"##;

#[test]
fn escape_3_kernel_cannot_make_setid_files() {
    let env = Env::new();
    let work = env.path().join("work");
    std::fs::create_dir_all(&work).expect("workdir");
    let mut c = env.cmd(&[
        "exec",
        "--python",
        &crate::common::python(),
        "--json",
        "--sandbox",
        "auto",
        ATTEMPTS,
    ]);
    c.current_dir(&work);
    let o = c.output().expect("exec");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", crate::common::text(&o)));
    assert_eq!(v["status"], "ok", "{v}");
    let line = v["stdout"].as_str().unwrap_or_default().trim().to_string();
    let got: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("probe ({e}): {v}"));
    for name in [
        "chmod_4755",
        "chmod_2755",
        "fchmod_4755",
        "open_creat_4755",
        "mknod_4755",
        "openat2_4755",
    ] {
        assert_ne!(got[name], "done", "{name} succeeded: {got}");
    }
    assert_eq!(
        got["chmod_0755"], "done",
        "an ordinary mode must still work: {got}"
    );
    let mut bad = Vec::new();
    setid_files(&work, &mut bad);
    assert!(bad.is_empty(), "set-ID files left on the host: {bad:?}");
    // The host still serves.
    let (code, v) = env.exec_json(&["--sandbox", "auto"], "print(1 + 1)");
    assert_eq!((code, v["stdout"].as_str()), (0, Some("2\n")), "{v}");
}
