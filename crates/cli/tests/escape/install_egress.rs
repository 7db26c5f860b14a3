//! The installer runs on the host with network, so its network is the
//! package index only: a local index (a listener on this machine) serves
//! two projects, one whose wheel it serves itself and one whose wheel it
//! links on a second local listener. The first installs through the
//! installer's egress proxy; the second fails with `install_failed`
//! naming the refused host, and the second listener never sees a
//! connection. Runs as root and, through `scripts/escape-nonroot.sh`, as
//! an unprivileged user.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::common::{self, Env, text};

/// A PEP 503 index on 127.0.0.1 (first port) and a second host (second
/// port) that records every request in `hits` (argv[1]). Prints the two
/// ports, then serves until killed.
const INDEX: &str = r#"
import hashlib, http.server, io, socketserver, sys, threading, zipfile

hits = sys.argv[1]

def wheel(name):
    buf = io.BytesIO()
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = '{name} from the local index'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(buf, "w") as z:
        record = []
        for path, text in files.items():
            z.writestr(path, text)
            record.append(f"{path},,")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return buf.getvalue()

WHEELS = {n: wheel(n) for n in ("goodpkg", "evilpkg")}

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

def handler(kind):
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def send(self, body, ctype):
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            if kind == "other":
                with open(hits, "a") as f:
                    f.write(self.path + "\n")
            name = self.path.strip("/").split("/")[-1]
            if self.path.endswith(".whl"):
                project = name.split("-")[0]
                return self.send(WHEELS[project], "application/octet-stream")
            if kind == "index" and name in WHEELS:
                where = index_port if name == "goodpkg" else other_port
                f = f"{name}-1.0-py3-none-any.whl"
                digest = hashlib.sha256(WHEELS[name]).hexdigest()
                link = f'<a href="http://127.0.0.1:{where}/files/{f}#sha256={digest}">{f}</a>'
                return self.send(f"<html><body>{link}</body></html>".encode(), "text/html")
            self.send_response(404)
            self.end_headers()
    return H

index = Server(("127.0.0.1", 0), handler("index"))
other = Server(("127.0.0.1", 0), handler("other"))
index_port, other_port = index.server_address[1], other.server_address[1]
for s in (index, other):
    threading.Thread(target=s.serve_forever, daemon=True).start()
print(index_port, other_port, flush=True)
threading.Event().wait()
"#;

/// The index's process; killed and reaped on drop.
struct Index {
    child: Child,
    index_port: u16,
    other_port: u16,
}

impl Index {
    fn start(hits: &std::path::Path) -> Index {
        let mut child = Command::new(common::python())
            .arg("-c")
            .arg(INDEX)
            .arg(hits)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the local index");
        let mut line = String::new();
        let read = child
            .stdout
            .take()
            .map(|o| BufReader::new(o).read_line(&mut line));
        let ports: Vec<u16> = line.split_whitespace().filter_map(|p| p.parse().ok()).collect();
        if !matches!(read, Some(Ok(_))) || ports.len() != 2 {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the local index did not start: {line:?}");
        }
        Index {
            child,
            index_port: ports[0],
            other_port: ports[1],
        }
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn installer_reaches_the_index_and_nothing_else() {
    let env = Env::new();
    let hits = env.path().join("other-host-hits");
    let index = Index::start(&hits);
    std::fs::write(
        env.path().join("config.toml"),
        format!(
            "package_index = \"http://127.0.0.1:{}/simple\"\n",
            index.index_port
        ),
    )
    .expect("config");
    let py = common::python();

    let o = env.run(&["install", "--python", &py, "--json", "s", "goodpkg"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let installed = v["report"]["installed"].as_array().cloned().unwrap_or_default();
    assert!(installed.iter().any(|d| d["name"] == "goodpkg"), "{v}");
    let (status, r) = {
        let o = env.run(&[
            "exec",
            "--python",
            &py,
            "--session",
            "s",
            "--json",
            "import goodpkg\nprint(goodpkg.VALUE)",
        ]);
        let r: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
        (o.status.code(), r)
    };
    assert_eq!(status, Some(0), "{r}");
    assert_eq!(r["stdout"], "goodpkg from the local index\n", "{r}");

    // The index links the second project's wheel on another host: the
    // installer's proxy refuses it, and that host sees nothing.
    let o = env.run(&["install", "--python", &py, "s", "evilpkg"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("install_failed"), "{}", text(&o));
    assert!(
        err.contains("egress proxy refused") && err.contains(&format!("127.0.0.1:{}", index.other_port)),
        "the refused host is named: {}",
        text(&o)
    );
    assert!(
        !hits.exists(),
        "the second host was reached: {:?}",
        std::fs::read_to_string(&hits)
    );
    let o = env.run(&[
        "exec",
        "--python",
        &py,
        "--session",
        "s",
        "--json",
        "import importlib.util\nprint(importlib.util.find_spec('evilpkg'))",
    ]);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(r["stdout"], "None\n", "{r}");
}
