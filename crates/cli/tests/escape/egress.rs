//! Egress by allowlist (issue 18, item 4): a kernel whose session allows
//! a list of hosts reaches those through the host's proxy, and nothing
//! else — not another name, not an IP literal, not a name that resolves to
//! the host's loopback, not a TLS tunnel whose server name differs from
//! the host it asked for, not the host's listeners by a direct connect.
//! Each refusal the proxy made is in the cell's result
//! (`network.denied`), on the CLI and over HTTP.
//!
//! Also every other spelling of a host (case, trailing dot, percent
//! encoding, IPv6 and numeric forms), wildcard edges, port confusion,
//! oversized heads, a second request smuggled after the first on one
//! connection, raw UDP and ICMP, and one session holding its proxy's every
//! connection while another session's proxy keeps serving.
//!
//! The targets are listeners of this test on 127.0.0.1 (an HTTP and an
//! HTTPS server with a self-signed certificate for `allowed.test`, run by
//! the kernels' interpreter), reached by names the config's `[egress]
//! hosts` pins to 127.0.0.1. Nothing leaves the machine.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::common::{self, Env};
use crate::http_tenants::{ALICE, Serve};

const SERVER: &str = r#"
import http.server, ssl, sys, threading
release = threading.Event()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/hold":
            release.wait()
        elif self.path == "/release":
            release.set()
        body = b"hello " + self.server.tag
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
# Room for every connection a test holds at once (the default backlog is 5).
http.server.ThreadingHTTPServer.request_queue_size = 256
plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
plain.tag = b"http"
tls = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
tls.tag = b"https"
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
for s in (plain, tls):
    threading.Thread(target=s.serve_forever, daemon=True).start()
print(plain.server_address[1], tls.server_address[1], flush=True)
sys.stdin.read()
"#;

/// The HTTP and HTTPS listeners; stopped (stdin closed, then killed) and
/// reaped on drop.
struct Targets {
    child: Child,
    http: u16,
    https: u16,
}

impl Targets {
    /// Starts both servers with a fresh certificate for `allowed.test`,
    /// written (`ca.pem`) into `dir` for the cell to trust.
    fn start(dir: &std::path::Path) -> Targets {
        let cert = rcgen::generate_simple_self_signed(vec!["allowed.test".to_string()]).expect("certificate");
        let (pem, key) = (dir.join("ca.pem"), dir.join("key.pem"));
        std::fs::write(&pem, cert.cert.pem()).expect("cert");
        std::fs::write(&key, cert.signing_key.serialize_pem()).expect("key");
        let mut child = Command::new(common::python())
            .arg("-c")
            .arg(SERVER)
            .arg(&pem)
            .arg(&key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the target servers");
        let mut line = String::new();
        let out = child.stdout.take().expect("stdout");
        BufReader::new(out).read_line(&mut line).expect("ports");
        let ports: Vec<u16> = line.split_whitespace().filter_map(|p| p.parse().ok()).collect();
        let t = Targets {
            child,
            http: ports.first().copied().unwrap_or(0),
            https: ports.get(1).copied().unwrap_or(0),
        };
        assert!(t.http > 0 && t.https > 0, "the servers said {line:?}");
        t
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A config pinning the test's names to 127.0.0.1.
fn write_config(path: &std::path::Path) {
    std::fs::write(
        path,
        "[egress]\nhosts = { \"allowed.test\" = \"127.0.0.1\", \"evil.test\" = \"127.0.0.1\" }\n",
    )
    .expect("config");
}

/// This host's address on its default route, if it has one.
fn host_ip() -> Option<String> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then(|| ip.to_string())
}

/// The cell: every attack, each outcome in one JSON object.
fn attack_cell(t: &Targets, host_ip: &str) -> String {
    format!(
        r#"
import json, socket, ssl, urllib.request, urllib.error
out = {{}}
def attempt(name, f):
    try:
        out[name] = "ok: " + str(f())
    except urllib.error.HTTPError as e:
        out[name] = "http %d %s" % (e.code, e.headers.get("X-Cellhost-Denied"))
    except Exception as e:
        out[name] = "error: " + type(e).__name__ + (" errno %s" % e.errno if isinstance(e, OSError) and e.errno else "")
ctx = ssl.create_default_context(cafile="ca.pem")
def raw(request):
    # A request straight to the proxy (urllib would honour NO_PROXY).
    s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
    s.sendall(request)
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(4096)
        if not b:
            break
        head += b
    lines = head.decode("latin-1").split("\r\n")
    denied = [l.split(":", 1)[1].strip() for l in lines if l.lower().startswith("x-cellhost-denied:")]
    return lines[0].split(" ")[1] + " " + (denied[0] if denied else "-")
attempt("allowed_http", lambda: urllib.request.urlopen("http://allowed.test:{http}/", timeout=60).read().decode())
attempt("allowed_https", lambda: urllib.request.urlopen("https://allowed.test:{https}/", timeout=60, context=ctx).read().decode())
attempt("denied_host", lambda: urllib.request.urlopen("http://evil.test:{http}/", timeout=60).read())
attempt("denied_port", lambda: urllib.request.urlopen("http://allowed.test:1/", timeout=60).read())
attempt("ip_literal", lambda: raw(b"GET http://127.0.0.1:{http}/ HTTP/1.1\r\nHost: 127.0.0.1:{http}\r\n\r\n"))
attempt("ip_literal_connect", lambda: raw(b"CONNECT 127.0.0.1:{https} HTTP/1.1\r\n\r\n"))
attempt("numeric_host", lambda: raw(b"CONNECT 2130706433:{https} HTTP/1.1\r\n\r\n"))
attempt("rebind_loopback", lambda: raw(b"GET http://localhost:{http}/ HTTP/1.1\r\nHost: localhost:{http}\r\n\r\n"))
def sni_mismatch():
    s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
    s.sendall(b"CONNECT allowed.test:{https} HTTP/1.1\r\nHost: allowed.test:{https}\r\n\r\n")
    head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head
    c = ssl.create_default_context(cafile="ca.pem")
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    return c.wrap_socket(s, server_hostname="evil.test").version()
attempt("sni_mismatch", sni_mismatch)
attempt("host_mismatch", lambda: raw(b"GET http://allowed.test:{http}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"))
attempt("direct_loopback", lambda: socket.create_connection(("127.0.0.1", {http}), timeout=60))
attempt("direct_host_ip", lambda: socket.create_connection(("{host_ip}", {http}), timeout=60))
attempt("dns", lambda: socket.getaddrinfo("allowed.test", 80))
print(json.dumps(out, sort_keys=True))
"#,
        http = t.http,
        https = t.https,
    )
}

/// What each attack must come to.
fn check_outcomes(out: &Value, has_host_ip: bool) {
    let s = |k: &str| out[k].as_str().unwrap_or_default().to_string();
    assert_eq!(s("allowed_http"), "ok: hello http", "{out}");
    assert_eq!(s("allowed_https"), "ok: hello https", "{out}");
    assert_eq!(s("denied_host"), "http 403 not_allowed", "{out}");
    assert_eq!(s("denied_port"), "http 403 not_allowed", "{out}");
    assert_eq!(s("ip_literal"), "ok: 403 ip_literal", "{out}");
    assert_eq!(s("ip_literal_connect"), "ok: 403 ip_literal", "{out}");
    assert_eq!(s("numeric_host"), "ok: 403 bad_host", "{out}");
    assert_eq!(s("rebind_loopback"), "ok: 403 private_address", "{out}");
    assert!(s("sni_mismatch").starts_with("error: "), "{out}");
    assert_eq!(s("host_mismatch"), "ok: 403 host_mismatch", "{out}");
    assert_eq!(
        s("direct_loopback"),
        "error: ConnectionRefusedError errno 111",
        "{out}"
    );
    if has_host_ip {
        assert!(
            s("direct_host_ip").starts_with("error: OSError errno 101"),
            "{out}"
        );
    }
    assert!(s("dns").starts_with("error: gaierror"), "{out}");
}

/// The refusals the result must list, in order.
fn check_denied(v: &Value, t: &Targets) {
    let denied: Vec<(String, u64, String)> = v["network"]["denied"]
        .as_array()
        .unwrap_or_else(|| panic!("no network.denied in {v}"))
        .iter()
        .map(|d| {
            (
                d["host"].as_str().unwrap_or_default().to_string(),
                d["port"].as_u64().unwrap_or(0),
                d["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let (http, https) = (u64::from(t.http), u64::from(t.https));
    let want: Vec<(String, u64, String)> = [
        ("evil.test", http, "not_allowed"),
        ("allowed.test", 1, "not_allowed"),
        ("127.0.0.1", http, "ip_literal"),
        ("127.0.0.1", https, "ip_literal"),
        ("2130706433", https, "bad_host"),
        ("localhost", http, "private_address"),
        ("allowed.test", https, "sni_mismatch"),
        ("allowed.test", http, "host_mismatch"),
    ]
    .iter()
    .map(|(h, p, r)| (h.to_string(), *p, r.to_string()))
    .collect();
    assert_eq!(denied, want, "{v}");
    let sni = v["network"]["denied"][6]["sni"].as_str();
    assert_eq!(sni, Some("evil.test"), "{v}");
}

fn rules(t: &Targets) -> String {
    // `localhost` is listed by name, so only its resolution to loopback refuses it.
    format!(
        "allowed.test:{},allowed.test:{},localhost:{}",
        t.http, t.https, t.http
    )
}

/// CLI, sandbox auto: the allowlist admits exactly its hosts, every
/// bypass fails, and the result lists what the proxy refused.
#[test]
fn allowlist_admits_its_hosts_and_refuses_every_bypass_cli() {
    let env = Env::new();
    write_config(&env.path().join("config.toml"));
    let t = Targets::start(env.path());
    let ip = host_ip();
    let code = attack_cell(&t, ip.as_deref().unwrap_or("192.0.2.1"));
    let (status, v) = env.exec_json(&["--sandbox", "auto", "--network", &rules(&t)], &code);
    assert_eq!(status, 0, "{v}");
    let out: Value = serde_json::from_str(v["stdout"].as_str().unwrap_or_default().trim())
        .unwrap_or_else(|e| panic!("cell output is not JSON ({e}): {v}"));
    check_outcomes(&out, ip.is_some());
    check_denied(&v, &t);
    // The kernel's sandbox says the proxy is its only way out.
    let enforced = v["kernel"]["sandbox"]["enforced"].to_string();
    assert!(enforced.contains("egress"), "{v}");
}

/// CLI: a network allowlist with the sandbox off is refused (its network
/// namespace is the boundary), never run with the host's network.
#[test]
fn allowlist_without_a_sandbox_is_refused() {
    let env = Env::new();
    let py = common::python();
    let o = env.run(&[
        "exec",
        "--json",
        "--python",
        &py,
        "--sandbox",
        "off",
        "--network",
        "example.com:443",
        "1",
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", common::text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad_request") && err.contains("allowlist"),
        "{}",
        common::text(&o)
    );
}

/// CLI: a malformed policy is a usage error naming the rule.
#[test]
fn bad_rules_are_refused_by_name() {
    let env = Env::new();
    for bad in ["*", "*.com", "127.1", "example.com:0", "exa mple.com"] {
        let o = env.run(&["exec", "--network", bad, "1"]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", common::text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("network"),
            "{bad}: {}",
            common::text(&o)
        );
    }
}

/// HTTP: `POST /v1/sessions {"network": [...]}` gives the session the
/// allowlist; an execute's result lists the refusals.
#[test]
fn allowlist_over_http_reports_denials_in_the_result() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = dir.path().join("config.toml");
    write_config(&config);
    let workdir = tempfile::tempdir().expect("workdir");
    let t = Targets::start(workdir.path());
    let config_arg = config.display().to_string();
    let serve = Serve::start(&[("CELLHOST_CONFIG", config_arg.as_str())]);
    let auth = format!("Bearer {ALICE}");
    let h = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let rules: Vec<String> = rules(&t).split(',').map(str::to_string).collect();
    let body = json!({"name": "net", "network": rules}).to_string();
    let a = serve.request("POST", "/v1/sessions", &h, &body);
    assert_eq!(a.status, 201, "{a:?}");
    let ca = std::fs::read_to_string(workdir.path().join("ca.pem")).expect("ca");
    let code = format!(
        "import urllib.request, urllib.error, ssl\nopen('ca.pem', 'w').write({ca:?})\nctx = ssl.create_default_context(cafile='ca.pem')\nr = [urllib.request.urlopen('https://allowed.test:{}/', timeout=60, context=ctx).read().decode()]\ntry:\n    urllib.request.urlopen('http://evil.test:{}/', timeout=60)\nexcept urllib.error.HTTPError as e:\n    r.append(e.code)\nprint(r)",
        t.https, t.http
    );
    let exec = json!({ "code": code }).to_string();
    let a = serve.request("POST", "/v1/sessions/net/execute", &h, &exec);
    assert_eq!(a.status, 200, "{a:?}");
    let v: Value = serde_json::from_str(&a.body).expect("json");
    assert_eq!(v["stdout"], "['hello https', 403]\n", "{v}");
    assert_eq!(v["network"]["denied"][0]["host"], "evil.test", "{v}");
    assert_eq!(v["network"]["denied"][0]["reason"], "not_allowed", "{v}");
    // The OpenAPI document describes both.
    let doc = serve.request("GET", "/openapi.json", &h, "");
    let doc: Value = serde_json::from_str(&doc.body).expect("openapi");
    let schemas = &doc["components"]["schemas"];
    assert!(
        schemas["CellResult"]["properties"]["network"].is_object(),
        "{}",
        schemas["CellResult"]
    );
    assert!(
        schemas["NetworkReport"]["properties"]["denied"].is_object(),
        "{schemas}"
    );
    assert!(schemas["DenyReason"].is_object(), "{schemas}");
    assert!(
        schemas["CreateSession"]["properties"]["network"].is_object(),
        "{}",
        schemas["CreateSession"]
    );
    // A malformed rule is refused with the field named.
    let bad = json!({"name": "net2", "network": ["*"]}).to_string();
    let a = serve.request("POST", "/v1/sessions", &h, &bad);
    assert_eq!(a.status, 422, "{a:?}");
}

/// The daemon (`exec --session`): a session gets its policy from
/// `--network` or from the config's pattern for its name; a running
/// session keeps its own, and the caller is told.
#[test]
fn allowlist_per_session_on_the_daemon_by_flag_and_by_config_pattern() {
    let env = Env::new();
    let t = Targets::start(env.path());
    let rules = rules(&t);
    std::fs::write(
        env.path().join("config.toml"),
        format!(
            "[egress]\nhosts = {{ \"allowed.test\" = \"127.0.0.1\", \"evil.test\" = \"127.0.0.1\" }}\n[egress.sessions]\n\"net-*\" = {:?}\n",
            rules.split(',').collect::<Vec<_>>()
        ),
    )
    .expect("config");
    let py = common::python();
    let fetch = format!(
        "import urllib.request, urllib.error\nr = []\nfor u in ['http://allowed.test:{0}/', 'http://evil.test:{0}/']:\n    try:\n        r.append(urllib.request.urlopen(u, timeout=60).read().decode())\n    except urllib.error.HTTPError as e:\n        r.append(e.code)\n    except Exception as e:\n        r.append(type(e).__name__)\nprint(r)",
        t.http
    );
    let exec = |session: &str, extra: &[&str]| {
        let mut args = vec!["exec", "--session", session, "--python", py.as_str(), "--json"];
        args.extend_from_slice(extra);
        args.push(fetch.as_str());
        let o = env.run(&args);
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", common::text(&o)));
        (v, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    // By the config's pattern.
    let (v, _) = exec("net-1", &[]);
    assert_eq!(v["stdout"], "['hello http', 403]\n", "{v}");
    assert_eq!(v["network"]["denied"][0]["host"], "evil.test", "{v}");
    // By the flag.
    let (v, _) = exec("flagged", &["--network", &rules]);
    assert_eq!(v["stdout"], "['hello http', 403]\n", "{v}");
    assert_eq!(v["network"]["denied"][0]["reason"], "not_allowed", "{v}");
    // Neither: network off, no proxy at all.
    let (v, _) = exec("plain", &[]);
    assert_eq!(v["stdout"], "['URLError', 'URLError']\n", "{v}");
    assert!(v.get("network").is_none(), "{v}");
    // A running session keeps its policy; the caller is told.
    let (v, err) = exec("plain", &["--network", "on"]);
    assert_eq!(v["stdout"], "['URLError', 'URLError']\n", "{v}");
    assert!(err.contains("network policy"), "{err}");
}

/// The cell of the spelling and framing attacks: each outcome, in one
/// JSON object.
fn spelling_cell(t: &Targets) -> String {
    format!(
        r#"
import json, socket, ssl
out = {{}}
def attempt(name, f):
    try:
        out[name] = "ok: " + str(f())
    except Exception as e:
        out[name] = "error: " + type(e).__name__ + (" errno %s" % e.errno if isinstance(e, OSError) and e.errno else "")
def raw(request):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
    s.sendall(request)
    data = b""
    while True:
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        data += b
    lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    denied = [l.split(":", 1)[1].strip() for l in lines if l.lower().startswith("x-cellhost-denied:")]
    return "%s %s x%d" % (lines[0].split(" ")[1], denied[0] if denied else "-", data.count(b"HTTP/1."))
def get(host, port, extra=b""):
    h = host.encode()
    return raw(b"GET http://" + h + b":%d/ HTTP/1.1\r\nHost: " % port + h + b":%d\r\n" % port + extra + b"\r\n")
def connect(target):
    return raw(b"CONNECT " + target.encode() + b" HTTP/1.1\r\n\r\n")
def tls(target, sni):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
    s.sendall(b"CONNECT " + target.encode() + b" HTTP/1.1\r\n\r\n")
    head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head
    c = ssl.create_default_context(cafile="ca.pem")
    c.check_hostname = False
    return c.wrap_socket(s, server_hostname=sni).version()
H, S = {http}, {https}
attempt("upper", lambda: get("ALLOWED.TEST", H))
attempt("trailing_dot", lambda: get("allowed.test.", H))
attempt("trailing_dot_tls", lambda: tls("allowed.test.:%d" % S, "allowed.test"))
attempt("upper_sni", lambda: tls("allowed.test:%d" % S, "ALLOWED.TEST"))
attempt("percent", lambda: get("allowed%2etest", H))
attempt("percent_connect", lambda: connect("allowed%%2Etest:%d" % S))
attempt("v6_loopback", lambda: connect("[::1]:%d" % S))
attempt("v6_mapped", lambda: connect("[::ffff:127.0.0.1]:%d" % S))
attempt("v6_mapped_long", lambda: connect("[0:0:0:0:0:ffff:7f00:1]:%d" % S))
attempt("v6_zone", lambda: connect("[fe80::1%%25lo]:%d" % S))
attempt("v6_bare", lambda: connect("::1:%d" % S))
attempt("v6_forward", lambda: get("[::1]", H))
attempt("octal", lambda: connect("0177.0.0.1:%d" % S))
attempt("hex", lambda: connect("0x7f.1:%d" % S))
attempt("wild_sub", lambda: get("sub.wild.test", H))
attempt("wild_apex", lambda: get("wild.test", H))
attempt("wild_suffix", lambda: get("evilwild.test", H))
attempt("wild_empty_label", lambda: get(".wild.test", H))
attempt("wild_literal", lambda: connect("*.wild.test:%d" % H))
attempt("port_double", lambda: connect("allowed.test:%d:80" % S))
attempt("port_sign", lambda: raw(b"GET http://allowed.test:+%d/ HTTP/1.1\r\nHost: allowed.test:+%d\r\n\r\n" % (H, H)))
attempt("userinfo", lambda: raw(b"GET http://allowed.test:%d@evil.test:%d/ HTTP/1.1\r\nHost: evil.test:%d\r\n\r\n" % (H, H, H)))
attempt("host_allowed_url_evil", lambda: raw(b"GET http://evil.test:%d/ HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n" % (H, H)))
attempt("huge_head", lambda: get("allowed.test", H, b"X-Big: " + b"a" * 16400 + b"\r\n"))
attempt("many_headers", lambda: get("allowed.test", H, b"".join(b"X-%d: v\r\n" % i for i in range(150))))
attempt("smuggle_te_cl", lambda: get("allowed.test", H, b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n"))
attempt("pipelined", lambda: raw(b"GET http://allowed.test:%d/ HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\nGET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n" % (H, H)))
def udp(family, addr):
    s = socket.socket(family, socket.SOCK_DGRAM)
    return s.sendto(b"\0" * 12, addr)
attempt("udp_dns", lambda: udp(socket.AF_INET, ("8.8.8.8", 53)))
attempt("udp6_dns", lambda: udp(socket.AF_INET6, ("2001:4860:4860::8888", 53)))
def icmp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    return s.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", ("8.8.8.8", 0))
attempt("icmp", icmp)
def raw_icmp():
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    return s.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", ("8.8.8.8", 0))
attempt("raw_icmp", raw_icmp)
attempt("other_port_on_loopback", lambda: socket.create_connection(("127.0.0.1", 3129), timeout=60))
attempt("proxy_on_v6", lambda: socket.create_connection(("::1", 3128), timeout=60))
print(json.dumps(out, sort_keys=True))
"#,
        http = t.http,
        https = t.https,
    )
}

/// CLI, sandbox auto: every other spelling of a host reaches only what
/// the rules name — case and a trailing dot are the same name; percent
/// encoding, IPv6 and numeric forms, and `*` are refused; `*.wild.test`
/// admits names below it only; a second request after the first on one
/// connection never reaches the target; raw UDP, ICMP and other ports get
/// nowhere.
#[test]
fn escape_egress_host_spellings_wildcards_ports_smuggling_and_raw_sockets() {
    let env = Env::new();
    let pins = [
        "allowed.test",
        "evil.test",
        "sub.wild.test",
        "wild.test",
        "evilwild.test",
    ]
    .iter()
    .map(|n| format!("\"{n}\" = \"127.0.0.1\""))
    .collect::<Vec<_>>()
    .join(", ");
    std::fs::write(
        env.path().join("config.toml"),
        format!("[egress]\nhosts = {{ {pins} }}\n"),
    )
    .expect("config");
    let t = Targets::start(env.path());
    let rules = format!(
        "allowed.test:{},allowed.test:{},*.wild.test:{}",
        t.http, t.https, t.http
    );
    let (status, v) = env.exec_json(&["--sandbox", "auto", "--network", &rules], &spelling_cell(&t));
    assert_eq!(status, 0, "{v}");
    let out: Value = serde_json::from_str(v["stdout"].as_str().unwrap_or_default().trim())
        .unwrap_or_else(|e| panic!("cell output is not JSON ({e}): {v}"));
    let s = |k: &str| out[k].as_str().unwrap_or_default().to_string();
    for (k, want) in [
        ("upper", "ok: 200 - x1"),
        ("trailing_dot", "ok: 200 - x1"),
        ("trailing_dot_tls", "ok: TLSv1.3"),
        ("upper_sni", "ok: TLSv1.3"),
        ("percent", "ok: 403 bad_host x1"),
        ("percent_connect", "ok: 403 bad_host x1"),
        ("v6_loopback", "ok: 403 ip_literal x1"),
        ("v6_mapped", "ok: 403 ip_literal x1"),
        ("v6_mapped_long", "ok: 403 ip_literal x1"),
        ("v6_zone", "ok: 403 bad_host x1"),
        ("v6_bare", "ok: 403 bad_host x1"),
        ("v6_forward", "ok: 403 ip_literal x1"),
        ("octal", "ok: 403 bad_host x1"),
        ("hex", "ok: 403 bad_host x1"),
        ("wild_sub", "ok: 200 - x1"),
        ("wild_apex", "ok: 403 not_allowed x1"),
        ("wild_suffix", "ok: 403 not_allowed x1"),
        ("wild_empty_label", "ok: 403 bad_host x1"),
        ("wild_literal", "ok: 403 bad_host x1"),
        ("port_double", "ok: 403 bad_host x1"),
        ("port_sign", "ok: 400 bad_request x1"),
        ("userinfo", "ok: 400 bad_request x1"),
        ("host_allowed_url_evil", "ok: 403 host_mismatch x1"),
        ("huge_head", "ok: 431 head_too_large x1"),
        ("many_headers", "ok: 431 head_too_large x1"),
        ("smuggle_te_cl", "ok: 400 bad_request x1"),
        // One answer: the second request never went upstream.
        ("pipelined", "ok: 200 - x1"),
        ("udp_dns", "error: OSError errno 101"),
        (
            "other_port_on_loopback",
            "error: ConnectionRefusedError errno 111",
        ),
    ] {
        assert_eq!(s(k), want, "{k}: {out}");
    }
    // No route for IPv6 at all, or none out; ICMP either not permitted
    // or unroutable; never sent.
    for k in ["udp6_dns", "icmp", "raw_icmp", "proxy_on_v6"] {
        assert!(s(k).starts_with("error: "), "{k}: {out}");
    }
    // Each refusal is in the result; the port confusion names what was sent.
    let denied = v["network"]["denied"].as_array().cloned().unwrap_or_default();
    let port_double = format!("allowed.test:{}", t.https);
    assert!(
        denied
            .iter()
            .any(|d| d["host"] == port_double.as_str() && d["port"] == 80 && d["reason"] == "bad_host"),
        "{v}"
    );
    assert!(
        denied
            .iter()
            .any(|d| d["host"] == "wild.test" && d["reason"] == "not_allowed"),
        "{v}"
    );
    assert_eq!(
        denied.len(),
        out.as_object().map_or(0, |o| o
            .values()
            .filter(|v| v.as_str().is_some_and(|s| s.contains(" 4")))
            .count()),
        "{v}"
    );
}

/// The daemon: one session holds every connection its proxy serves (64
/// requests the target never answers) and its next one is refused
/// (`connection_cap`), while another session's proxy serves at once. The
/// test then lets the target answer.
#[test]
fn escape_egress_one_session_holding_its_proxy_does_not_starve_another() {
    let env = Env::new();
    write_config(&env.path().join("config.toml"));
    let t = Targets::start(env.path());
    let rules = format!("allowed.test:{}", t.http);
    let py = common::python();
    let exec = |session: &str, code: &str| -> Value {
        let o = env.run(&[
            "exec",
            "--session",
            session,
            "--python",
            &py,
            "--json",
            "--network",
            &rules,
            code,
        ]);
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", common::text(&o)))
    };
    let hold = format!(
        r#"
import socket
held = []
for i in range(64):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
    s.sendall(b"GET http://allowed.test:{p}/hold HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n")
    held.append(s)
s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
s.sendall(b"GET http://allowed.test:{p}/ HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n")
print(s.recv(4096).split(b"\r\n")[0].decode())
"#,
        p = t.http
    );
    let v = exec("holder", &hold);
    assert_eq!(v["stdout"], "HTTP/1.1 503 Service Unavailable\n", "{v}");
    assert_eq!(v["network"]["denied"][0]["reason"], "connection_cap", "{v}");
    // Another session's proxy serves while the holder's is full.
    let fetch = format!(
        "import urllib.request\nprint(urllib.request.urlopen('http://allowed.test:{}/', timeout=60).read().decode())",
        t.http
    );
    let v = exec("other", &fetch);
    assert_eq!(v["stdout"], "hello http\n", "{v}");
    // Its proxy is its own: none of the holder's refusals are in its result.
    assert!(v.get("network").is_none(), "{v}");
    // The target answers the held requests; the holder reads them.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", t.http)).expect("target");
    std::io::Write::write_all(
        &mut s,
        b"GET /release HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .expect("release");
    let mut answer = String::new();
    let _ = std::io::Read::read_to_string(&mut s, &mut answer);
    assert!(answer.contains("hello http"), "{answer}");
    let v = exec(
        "holder",
        "def answer(h):\n    d = b''\n    while (b := h.recv(4096)):\n        d += b\n    h.close()\n    return d\nprint(sum(b'hello http' in answer(h) for h in held))",
    );
    assert_eq!(v["stdout"], "64\n", "{v}");
}
