//! Hostile clients of the host's listener for remote agents: garbage
//! instead of TLS, and more pending handshakes than the bound (64). Each
//! is refused (counted with its code), and afterwards a real agent (this
//! build's `cellhost agent`, placed by `loopback`) is still admitted and
//! its kernel runs a cell.

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
