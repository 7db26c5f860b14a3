//! The files routes (`/v1/sessions/{name}/files…`) against a hostile cell
//! and a hostile client: every way out of the session's workdir — `..`,
//! absolute paths, a link to `/etc`, a link swapped while requests run, a
//! hard link, `/proc/self/root`, very long paths, NUL — must be refused
//! (403 `path_refused`, or 404 where nothing is there) without reading or
//! writing anything outside, while the session keeps serving.
//!
//! Special files and abuse of the request itself: a FIFO the cell made
//! (and a file it holds a lease on) must not hang a GET; any `Range`
//! header gets a well-formed answer; a write over the server's cap
//! (declared or streamed) is refused with nothing left behind; the walk
//! that checks a session's disk cap never follows a link the kernel
//! swaps in (it counted the host's `/usr` before).
//!
//! Also the regression of a pooled kernel's `cwd`: a result named the
//! pool's staging directory (moved away when the kernel joined its
//! session); it must be the session's real workdir, where the files routes
//! read.

use serde_json::Value;

use crate::http_tenants::{ALICE, Answer, Serve, read_answer};

const AUTH: &str = "Bearer aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn json(a: &Answer) -> Value {
    serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("not JSON ({e}): {a:?}"))
}

/// A served session `name` (alice's).
fn session(serve: &Serve, name: &str) {
    let a = serve.request(
        "POST",
        "/v1/sessions",
        &[("Authorization", AUTH), ("Content-Type", "application/json")],
        &format!(r#"{{"name": "{name}"}}"#),
    );
    assert_eq!(a.status, 201, "{a:?}");
}

/// Runs `code` in alice's session `name`; the result.
fn run(serve: &Serve, name: &str, code: &str) -> Value {
    let body = serde_json::json!({ "code": code }).to_string();
    let a = serve.request(
        "POST",
        &format!("/v1/sessions/{name}/execute"),
        &[("Authorization", AUTH), ("Content-Type", "application/json")],
        &body,
    );
    assert_eq!(a.status, 200, "{a:?}");
    let v = json(&a);
    assert_eq!(v["status"], "ok", "{v}");
    v
}

fn get(serve: &Serve, path: &str) -> Answer {
    serve.request("GET", path, &[("Authorization", AUTH)], "")
}

fn put(serve: &Serve, path: &str, body: &str) -> Answer {
    serve.request(
        "PUT",
        path,
        &[
            ("Authorization", AUTH),
            ("Content-Type", "application/octet-stream"),
        ],
        body,
    )
}

/// The answer refuses the path (403 `path_refused`) or finds nothing
/// (404), and never carries the host's `/etc/passwd`.
fn refused(a: &Answer, what: &str) {
    assert!(
        matches!(a.status, 403 | 404),
        "{what}: expected a refusal, got {a:?}"
    );
    assert!(!a.body.contains("root:x:0:0"), "{what} leaked /etc/passwd: {a:?}");
    if a.status == 403 {
        assert_eq!(json(a)["error"]["code"], "path_refused", "{what}: {a:?}");
    }
}

/// The session still serves its own files after the attacks.
fn still_serves(serve: &Serve, name: &str) {
    let w = put(
        serve,
        &format!("/v1/sessions/{name}/files/after.txt"),
        "still here",
    );
    assert!(matches!(w.status, 200 | 201), "{w:?}");
    let r = get(serve, &format!("/v1/sessions/{name}/files/after.txt"));
    assert_eq!((r.status, r.body.as_str()), (200, "still here"), "{r:?}");
}

#[test]
fn escape_files_dotdot_absolute_nul_and_long_paths_are_refused() {
    let serve = Serve::start(&[]);
    session(&serve, "f1");
    let base = "/v1/sessions/f1/files";
    for (what, path) in [
        ("..", format!("{base}/..%2F..%2F..%2F..%2Fetc%2Fpasswd")),
        ("../ in the middle", format!("{base}/a%2F..%2F..%2Fetc%2Fpasswd")),
        ("raw ../", format!("{base}/../../../etc/passwd")),
        ("absolute", format!("{base}/%2Fetc%2Fpasswd")),
        ("absolute, double slash", format!("{base}//etc/passwd")),
        (
            "/proc/self/root",
            format!("{base}/%2Fproc%2Fself%2Froot%2Fetc%2Fpasswd"),
        ),
        ("NUL", format!("{base}/a%00b")),
        ("NUL before ..", format!("{base}/x%00%2F..%2F..%2Fetc%2Fpasswd")),
        ("long component", format!("{base}/{}", "x".repeat(300))),
        ("very long path", format!("{base}/{}", "d/".repeat(2100))),
    ] {
        refused(&get(&serve, &path), &format!("GET {what}"));
        refused(&put(&serve, &path, "pwned"), &format!("PUT {what}"));
        refused(
            &serve.request("DELETE", &path, &[("Authorization", AUTH)], ""),
            &format!("DELETE {what}"),
        );
    }
    // The listing's `path` takes the same checks.
    for q in ["..", "%2Fetc", "a%2F..%2F..", "%00"] {
        refused(&get(&serve, &format!("{base}?path={q}")), &format!("list {q}"));
    }
    assert!(!std::path::Path::new("/etc/pwned").exists());
    still_serves(&serve, "f1");
}

#[test]
fn escape_files_links_out_of_the_workdir_are_never_followed() {
    let serve = Serve::start(&[]);
    session(&serve, "f2");
    // The cell plants links: a directory link to /etc, a file link to
    // /etc/passwd, a link to /proc/self/root (a magic link), a relative
    // link that climbs out, and a link that stays inside (allowed).
    run(
        &serve,
        "f2",
        r#"
import os
open("inside.txt", "w").write("inside")
for target, name in [("/etc", "etc"), ("/etc/passwd", "pw"), ("/proc/self/root", "root"),
                     ("../../../../../../etc/passwd", "climb"), ("inside.txt", "ok-link")]:
    os.symlink(target, name)
"#,
    );
    let base = "/v1/sessions/f2/files";
    for p in ["etc/passwd", "pw", "root/etc/passwd", "climb", "etc"] {
        refused(&get(&serve, &format!("{base}/{p}")), &format!("GET {p}"));
    }
    // Writing through a directory link is refused; writing at a link's
    // name replaces the link itself, never its target.
    refused(&put(&serve, &format!("{base}/etc/pwned"), "x"), "PUT etc/pwned");
    refused(
        &put(&serve, &format!("{base}/root/tmp/pwned"), "x"),
        "PUT root/tmp/pwned",
    );
    let passwd_before = std::fs::read("/etc/passwd").expect("passwd");
    let w = put(&serve, &format!("{base}/pw"), "replaced the link");
    assert_eq!(w.status, 200, "{w:?}");
    assert_eq!(std::fs::read("/etc/passwd").expect("passwd"), passwd_before);
    assert!(!std::path::Path::new("/etc/pwned").exists());
    let r = get(&serve, &format!("{base}/pw"));
    assert_eq!((r.status, r.body.as_str()), (200, "replaced the link"), "{r:?}");
    // A link that stays inside the workdir is read; a delete removes the
    // link, never its target.
    let r = get(&serve, &format!("{base}/ok-link"));
    assert_eq!((r.status, r.body.as_str()), (200, "inside"), "{r:?}");
    let d = serve.request("DELETE", &format!("{base}/etc"), &[("Authorization", AUTH)], "");
    assert_eq!(d.status, 200, "{d:?}");
    assert_eq!(json(&d)["type"], "symlink");
    assert!(std::path::Path::new("/etc/passwd").exists());
    // The listing reports links as links.
    let l = json(&get(&serve, base));
    let kinds: Vec<(String, String)> = l["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or("").into(),
                e["type"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    assert!(kinds.contains(&("root".into(), "symlink".into())), "{kinds:?}");
    assert!(kinds.contains(&("pw".into(), "file".into())), "{kinds:?}");
    still_serves(&serve, "f2");
}

#[test]
fn escape_files_hard_links_are_not_read() {
    let serve = Serve::start(&[]);
    session(&serve, "f3");
    // A second name of a file may be a name of a file outside the workdir
    // (where the kernel can reach one): files with more than one link are
    // refused. The cell also tries to link the host's /etc/passwd.
    let v = run(
        &serve,
        "f3",
        r#"
import os
open("a.txt", "w").write("secret twin")
os.link("a.txt", "b.txt")
try:
    os.link("/etc/passwd", "hl")
    print("linked")
except OSError as e:
    print("no link:", e.errno)
"#,
    );
    let base = "/v1/sessions/f3/files";
    refused(&get(&serve, &format!("{base}/b.txt")), "GET hard link");
    refused(&get(&serve, &format!("{base}/a.txt")), "GET hard-linked original");
    if v["stdout"].as_str().unwrap_or("").contains("linked") {
        refused(
            &get(&serve, &format!("{base}/hl")),
            "GET hard link to /etc/passwd",
        );
    }
    // A write replaces the name (a new inode), never the shared file.
    let w = put(&serve, &format!("{base}/b.txt"), "own file now");
    assert_eq!(w.status, 200, "{w:?}");
    let r = get(&serve, &format!("{base}/b.txt"));
    assert_eq!((r.status, r.body.as_str()), (200, "own file now"), "{r:?}");
    let v = run(&serve, "f3", "print(open('a.txt').read())");
    assert_eq!(v["stdout"], "secret twin\n", "{v}");
    still_serves(&serve, "f3");
}

#[test]
fn escape_files_a_link_swapped_mid_request_never_leads_out() {
    let serve = Serve::start(&[]);
    session(&serve, "f4");
    // A thread of the cell swaps `d` between a real directory (holding
    // `passwd` with a marker) and a link to /etc, as fast as it can, while
    // the client reads `d/passwd` and writes `d/pwned` through it. Every
    // answer is the marker, a refusal or "not found": never the host's
    // file, and nothing lands in /etc.
    run(
        &serve,
        "f4",
        r#"
import os, threading
os.makedirs("real", exist_ok=True)
open("real/passwd", "w").write("marker")
stop = False
def swap():
    while not stop:
        try:
            os.symlink("/etc", "d.tmp"); os.replace("d.tmp", "d")
            os.unlink("d"); os.symlink("real", "d.tmp"); os.replace("d.tmp", "d")
            os.unlink("d"); os.rename("real", "d"); os.rename("d", "real")
        except OSError:
            pass
t = threading.Thread(target=swap, daemon=True)
t.start()
"#,
    );
    let base = "/v1/sessions/f4/files";
    let mut seen_marker = 0;
    for i in 0..300 {
        let r = get(&serve, &format!("{base}/d/passwd"));
        assert!(
            !r.body.contains("root:x:0:0"),
            "read {i} leaked /etc/passwd: {r:?}"
        );
        match r.status {
            200 => {
                assert_eq!(r.body, "marker", "{r:?}");
                seen_marker += 1;
            }
            403 | 404 => {}
            _ => panic!("read {i}: unexpected {r:?}"),
        }
        let w = put(&serve, &format!("{base}/d/pwned"), "x");
        assert!(matches!(w.status, 200 | 201 | 403 | 404), "write {i}: {w:?}");
        assert!(
            !std::path::Path::new("/etc/pwned").exists(),
            "write {i} landed in /etc"
        );
    }
    eprintln!("the marker was read {seen_marker} of 300 times");
    run(&serve, "f4", "stop = True; t.join()");
    still_serves(&serve, "f4");
}

#[test]
fn files_a_pooled_kernels_cwd_is_the_sessions_real_workdir() {
    // Regression: with a warm pool, `cwd` named the pool's staging
    // directory, which no longer existed once the kernel joined its
    // session.
    let serve = Serve::start(&[("CELLHOST_POOL_SIZE", "1")]);
    session(&serve, "cw");
    let v = run(
        &serve,
        "cw",
        "open('made-by-cell.txt', 'w').write('from the cell')",
    );
    let cwd = v["cwd"].as_str().expect("a cwd");
    assert!(!cwd.contains("/staging/"), "cwd is a staging path: {v}");
    let dir = std::path::Path::new(cwd);
    assert!(dir.is_dir(), "the reported cwd does not exist: {cwd}");
    assert_eq!(
        std::fs::read_to_string(dir.join("made-by-cell.txt")).expect("the cell's file in cwd"),
        "from the cell"
    );
    // The file the cell wrote is visible to the next GET at once.
    let r = get(&serve, "/v1/sessions/cw/files/made-by-cell.txt");
    assert_eq!((r.status, r.body.as_str()), (200, "from the cell"), "{r:?}");
    let _ = ALICE;
}

fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
    a.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A FIFO the cell made, and a file the cell holds a write lease on, at
/// paths a client reads: each GET is answered at once (refused or an I/O
/// error), never left waiting for a writer or for the lease to break; the
/// listing reports the FIFO as `other`; a write at the FIFO's name
/// replaces it with a file, never opens it.
#[test]
fn escape_files_a_fifo_or_a_leased_file_never_hangs_a_get() {
    let serve = Serve::start(&[]);
    session(&serve, "f5");
    let v = run(
        &serve,
        "f5",
        r#"
import fcntl, os, signal
# The lease's break is signalled (SIGIO, fatal by default) to its holder.
signal.signal(signal.SIGIO, signal.SIG_IGN)
os.mkfifo("fifo")
open("leased.txt", "w").write("leased")
lease_fd = os.open("leased.txt", os.O_RDONLY)
try:
    fcntl.fcntl(lease_fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    print("lease")
except OSError as e:
    print("no lease:", e.errno)
"#,
    );
    let base = "/v1/sessions/f5/files";
    let r = get(&serve, &format!("{base}/fifo"));
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(json(&r)["error"]["code"], "path_refused", "{r:?}");
    if v["stdout"].as_str().unwrap_or_default().starts_with("lease") {
        // The open does not wait for the lease to break (it is non-blocking).
        let r = get(&serve, &format!("{base}/leased.txt"));
        assert!(
            r.status == 200 && r.body == "leased" || json(&r)["error"]["code"] == "file_io_failed",
            "{r:?}"
        );
    }
    let l = json(&get(&serve, base));
    let fifo = l["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["name"] == "fifo")
        .cloned()
        .unwrap_or_default();
    assert_eq!(fifo["type"], "other", "{l}");
    let w = put(&serve, &format!("{base}/fifo"), "a file now");
    assert_eq!(w.status, 200, "{w:?}");
    let r = get(&serve, &format!("{base}/fifo"));
    assert_eq!((r.status, r.body.as_str()), (200, "a file now"), "{r:?}");
    run(&serve, "f5", "os.close(lease_fd)");
    still_serves(&serve, "f5");
}

/// Every shape of `Range` a client may send gets a well-formed answer:
/// one range is 206 with its bytes, an unsatisfiable one 416 with
/// `Content-Range: bytes */SIZE`, anything else (several ranges,
/// reversed, overflowing numbers, garbage) the whole file (200).
#[test]
fn escape_files_range_header_abuse_is_answered_sanely() {
    let serve = Serve::start(&[]);
    session(&serve, "f6");
    let body: String = (0..100).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let w = put(&serve, "/v1/sessions/f6/files/r.txt", &body);
    assert_eq!(w.status, 201, "{w:?}");
    let path = "/v1/sessions/f6/files/r.txt";
    let many = format!("bytes={}", vec!["0-1"; 2000].join(","));
    for (range, status, want) in [
        ("bytes=0-0", 206, &body[0..1]),
        ("bytes= 5 - 9", 206, &body[5..10]),
        ("bytes=-5", 206, &body[95..]),
        ("bytes=-200", 206, &body[..]),
        ("bytes=90-1000000", 206, &body[90..]),
        ("bytes=100-", 416, ""),
        ("bytes=-0", 416, ""),
        ("bytes=18446744073709551615-", 416, ""),
        ("bytes=99999999999999999999999-", 200, &body[..]),
        ("bytes=50-10", 200, &body[..]),
        ("bytes=0-1,5-6", 200, &body[..]),
        (many.as_str(), 200, &body[..]),
        ("bytes=--5", 200, &body[..]),
        ("bytes=5", 200, &body[..]),
        ("items=0-5", 200, &body[..]),
    ] {
        let a = serve.request("GET", path, &[("Authorization", AUTH), ("Range", range)], "");
        let shown: String = range.chars().take(40).collect();
        assert_eq!(a.status, status, "{shown}: {a:?}");
        if status == 416 {
            assert_eq!(header(&a, "content-range"), Some("bytes */100"), "{shown}: {a:?}");
            assert_eq!(json(&a)["error"]["code"], "range_not_satisfiable", "{shown}");
        } else {
            assert_eq!(a.body, want, "{shown}: {a:?}");
        }
    }
    still_serves(&serve, "f6");
}

/// A write over the server's cap (`file_max_mb`, 1 MiB here): declared
/// by `Content-Length` it is refused before a byte is read; streamed
/// (chunked) it is refused once the cap passes. Either way 413
/// `file_too_large`, the old file is untouched, and no temporary file is
/// left in the workdir.
#[test]
fn escape_files_writes_over_the_cap_leave_nothing_behind() {
    use std::io::Write;
    let serve = Serve::start(&[("CELLHOST_FILE_MAX_MB", "1")]);
    session(&serve, "f7");
    let path = "/v1/sessions/f7/files/big.bin";
    let w = put(&serve, path, "old");
    assert_eq!(w.status, 201, "{w:?}");
    // Declared too large: the head alone is refused.
    let mut s = serve.connect();
    s.write_all(
        format!(
            "PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            2u64 << 20
        )
        .as_bytes(),
    )
    .expect("head");
    let a = read_answer(&mut s).expect("an answer to the declared-too-large PUT");
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(json(&a)["error"]["code"], "file_too_large", "{a:?}");
    // Streamed past the cap, chunked: the server stops it.
    let mut s = serve.connect();
    s.write_all(
        format!(
            "PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .expect("head");
    let mut w = s.try_clone().expect("clone");
    let sender = std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..40 {
            if w.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).is_err()
                || w.write_all(&chunk).is_err()
                || w.write_all(b"\r\n").is_err()
            {
                return;
            }
        }
        let _ = w.write_all(b"0\r\n\r\n");
    });
    let a = read_answer(&mut s).expect("an answer to the streamed PUT");
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(json(&a)["error"]["code"], "file_too_large", "{a:?}");
    drop(s);
    let _ = sender.join();
    let r = get(&serve, path);
    assert_eq!((r.status, r.body.as_str()), (200, "old"), "{r:?}");
    let l = json(&get(&serve, "/v1/sessions/f7/files"));
    let names: Vec<&str> = l["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, vec!["big.bin"], "{l}");
    still_serves(&serve, "f7");
}

/// The session's disk cap (`disk_mb`) is checked on every PUT by walking
/// the workdir. A thread of the cell swaps `d` between a real directory
/// and a link to the host's `/usr` (far larger than the cap) as fast as it
/// can: the walk must never follow the link (it would count the host's
/// files, and read where the kernel cannot), so every small PUT succeeds.
#[test]
fn escape_files_the_disk_cap_walk_never_follows_a_swapped_link() {
    let serve = Serve::start(&[]);
    let a = serve.request(
        "POST",
        "/v1/sessions",
        &[("Authorization", AUTH), ("Content-Type", "application/json")],
        r#"{"name": "f8", "limits": {"disk_mb": 16}}"#,
    );
    assert_eq!(a.status, 201, "{a:?}");
    run(
        &serve,
        "f8",
        r#"
import os, threading
os.makedirs("real/sub", exist_ok=True)
open("real/sub/x", "w").write("x")
# Many entries beside `d`: the walk looks at each before it opens `d`,
# which widens the window between seeing `d` and opening it.
for i in range(5000):
    open("e%d" % i, "w").close()
stop = False
def swap():
    while not stop:
        try:
            os.rename("real", "d"); os.rename("d", "real")
            os.symlink("/usr", "d"); os.unlink("d")
        except OSError:
            pass
t = threading.Thread(target=swap, daemon=True)
t.start()
"#,
    );
    for i in 0..300 {
        let w = put(
            &serve,
            &format!("/v1/sessions/f8/files/small-{}.txt", i % 5),
            "tiny",
        );
        assert!(matches!(w.status, 200 | 201), "PUT {i}: {w:?}");
    }
    run(&serve, "f8", "stop = True; t.join()");
    still_serves(&serve, "f8");
}
