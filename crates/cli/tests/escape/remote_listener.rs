//! Hostile clients of the host's listener for remote agents: garbage
//! instead of TLS, and more pending handshakes than the bound (64). Each
//! is refused (counted with its code), and afterwards a real agent (this
//! build's `cellhost agent`, placed by `loopback`) is still admitted and
//! its kernel runs a cell.
//!
//! Also hostile *agents* holding a genuine credential (a script placed by
//! `loopback` in place of `cellhost agent`): one that dials twice with it,
//! and ones that, once admitted, send a message longer than the cap, a
//! malformed one or an unknown kind. The second dial is refused
//! (`credential_replayed`); each admitted one ends its kernel's start with
//! an error (never a hang or a panic of the host), and a genuine agent is
//! admitted afterwards.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use cellhost_kernel::{CellStatus, ExecOptions, Kernel, KernelConfig};
use cellhost_remote::{
    AnyPlacement, HostIdentity, HostOptions, LoopbackPlacement, MemoryNonces, RemoteHost, RemoteStarter,
};
use cellhost_sandbox::profile::SandboxMode;

async fn listener() -> RemoteHost {
    RemoteHost::start(
        HostOptions::default(),
        HostIdentity::generate().expect("certificate"),
        Arc::new(MemoryNonces::default()),
    )
    .await
    .expect("listener")
}

/// A real agent is still admitted and runs a cell.
async fn still_serves(host: &RemoteHost) {
    let dir = tempfile::tempdir().expect("tmp");
    let placement = LoopbackPlacement::with_program(crate::common::bin(), Vec::new());
    let mut cfg = KernelConfig::new(crate::common::python(), dir.path().join("session"));
    cfg.sandbox.mode = SandboxMode::Off;
    cfg.starter = Some(Arc::new(RemoteStarter::new(
        "lo",
        host.clone(),
        AnyPlacement::Loopback(placement),
        None,
    )));
    let k = Kernel::spawn(cfg).await.expect("a genuine agent is admitted");
    let r = k.execute("6 * 7", ExecOptions::default()).await.expect("cell");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    k.kill().await;
}

/// Blocks until the peer closes `s` (EOF or reset).
fn closed(s: &mut std::net::TcpStream) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_listener_garbage_instead_of_tls_is_refused() {
    let host = listener().await;
    let addr = host.addr();
    // Each refusal is on record by the time the attacker sees its
    // connection closed (repeated: the order is what is tested).
    for i in 1..=20 {
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            std::io::Write::write_all(&mut s, &[0xff; 4096]).expect("garbage");
            assert!(closed(&mut s), "garbage connection left open");
        })
        .await
        .expect("attacker");
        let refusals = host.refusals();
        assert_eq!(refusals.len(), i, "{refusals:?}");
        assert!(refusals.iter().all(|c| *c == "tls_failed"), "{refusals:?}");
    }
    assert_eq!(host.admitted(), 0);
    still_serves(&host).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_listener_silent_connection_times_out_and_is_counted_first() {
    let host = RemoteHost::start(
        HostOptions {
            handshake_timeout: Duration::from_millis(300),
            ..HostOptions::default()
        },
        HostIdentity::generate().expect("certificate"),
        Arc::new(MemoryNonces::default()),
    )
    .await
    .expect("listener");
    let addr = host.addr();
    for i in 1..=3 {
        // Connects and says nothing: the handshake's deadline closes it.
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            assert!(closed(&mut s), "silent connection left open");
        })
        .await
        .expect("attacker");
        let refusals = host.refusals();
        assert_eq!(refusals, vec!["handshake_timeout"; i], "{refusals:?}");
    }
    assert_eq!(host.admitted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_listener_65_pending_handshakes_the_65th_is_closed_at_once() {
    let host = listener().await;
    let addr = host.addr();
    let held = tokio::task::spawn_blocking(move || {
        // 64 connections that never start TLS hold every handshake slot.
        let mut held: Vec<std::net::TcpStream> = Vec::new();
        for _ in 0..64 {
            held.push(std::net::TcpStream::connect(addr).expect("connect"));
        }
        let mut extra = std::net::TcpStream::connect(addr).expect("connect 65th");
        extra
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        assert!(closed(&mut extra), "the 65th pending handshake was not refused");
        held
    })
    .await
    .expect("attacker");
    assert!(
        host.refusals().contains(&"too_many_handshakes"),
        "{:?}",
        host.refusals()
    );
    // The attacker lets go: the slots come back and a genuine agent gets in.
    drop(held);
    while host.pending() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    still_serves(&host).await;
}

/// The hostile agent: reads the credential file named on its command
/// line, pins the host's certificate as the real agent does, says hello,
/// and then misbehaves as its last argument says.
const FAKE_AGENT: &str = r#"
import hashlib, json, socket, ssl, struct, sys
args = sys.argv[1:]
mode = args[-1]
cred_path = args[args.index("--credential") + 1]
raw = open(cred_path, "rb").read()
cred = json.loads(raw)
host, port = cred["host"].rsplit(":", 1)
def dial():
    s = socket.create_connection((host.strip("[]"), int(port)), timeout=60)
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    t = c.wrap_socket(s, server_hostname="cellhost-host")
    assert hashlib.sha256(t.getpeercert(True)).hexdigest() == cred["cert_sha256"]
    return t
def send(t, kind, payload=b""):
    t.sendall(struct.pack(">IB", len(payload) + 1, kind) + payload)
def recv(t):
    head = b""
    while len(head) < 5:
        b = t.recv(5 - len(head))
        if not b:
            return None
        head += b
    n, kind = struct.unpack(">IB", head)
    body = b""
    while len(body) < n - 1:
        b = t.recv(n - 1 - len(body))
        if not b:
            break
        body += b
    return kind
t = dial()
send(t, 1, raw)
assert recv(t) == 2, "not welcomed"
started = json.dumps({"node": "fake", "init_pid": 1, "sandboxed": False, "host_layers": [], "limits": None}).encode()
if mode == "twice":
    t2 = dial()
    send(t2, 1, raw)
    recv(t2)
    send(t, 5, b"the second dial was refused")
elif mode == "oversized_first":
    t.sendall(struct.pack(">IB", 0xFFFFFFF0, 6))
elif mode == "oversized":
    send(t, 4, started)
    t.sendall(struct.pack(">IB", 0xFFFFFFF0, 6))
elif mode == "bad_stream":
    send(t, 4, started)
    send(t, 11, b"\x07")
elif mode == "unknown_kind":
    send(t, 4, started)
    send(t, 200, b"x")
elif mode == "bad_frame":
    send(t, 4, started)
    send(t, 6, b"{not json")
# Wait for the host to close the connection.
while True:
    try:
        if not t.recv(65536):
            break
    except OSError:
        break
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_listener_hostile_agents_with_a_genuine_credential() {
    let host = listener().await;
    let dir = tempfile::tempdir().expect("tmp");
    let script = dir.path().join("fake-agent.py");
    std::fs::write(&script, FAKE_AGENT).expect("script");
    let wrapper = dir.path().join("fake-agent");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} {} \"$@\"\n",
            crate::common::python(),
            script.display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(
        &wrapper,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .expect("chmod");
    for mode in [
        "twice",
        "oversized_first",
        "oversized",
        "bad_stream",
        "unknown_kind",
        "bad_frame",
    ] {
        let before = host.refusals().len();
        let placement = LoopbackPlacement::with_program(&wrapper, vec![mode.to_string()]);
        let mut cfg = KernelConfig::new(crate::common::python(), dir.path().join(format!("s-{mode}")));
        cfg.sandbox.mode = SandboxMode::Off;
        cfg.startup_timeout = Duration::from_secs(60);
        cfg.starter = Some(Arc::new(RemoteStarter::new(
            "lo",
            host.clone(),
            AnyPlacement::Loopback(placement),
            None,
        )));
        let r = Kernel::spawn(cfg).await;
        assert!(r.is_err(), "{mode}: a hostile agent's kernel started");
        if mode == "twice" {
            let refusals = host.refusals();
            assert_eq!(
                &refusals[before..],
                &["credential_replayed"],
                "{mode}: {refusals:?}"
            );
        }
    }
    assert_eq!(host.admitted(), 6);
    still_serves(&host).await;
}
