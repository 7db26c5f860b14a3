//! The files routes (`/v1/sessions/{name}/files…`) against a hostile cell
//! and a hostile client: every way out of the session's workdir — `..`,
//! absolute paths, a link to `/etc`, a link swapped while requests run, a
//! hard link, `/proc/self/root`, very long paths, NUL — must be refused
//! (403 `path_refused`, or 404 where nothing is there) without reading or
//! writing anything outside, while the session keeps serving.
//!
//! Also the regression of a pooled kernel's `cwd`: a result named the
//! pool's staging directory (moved away when the kernel joined its
//! session); it must be the session's real workdir, where the files routes
//! read.

use serde_json::Value;

use crate::http_tenants::{ALICE, Answer, Serve};

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
