//! Remote kernels end to end on loopback, with the agent's code running in
//! this process (the same `run_agent` as `cellhost agent`): state, interrupt,
//! timeout, tree kill, admission refusals, the listener's bounds.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cellhost_kernel::{CellStatus, ExecOptions, Kernel, KernelConfig, LiveEvent, Session};
use cellhost_remote::credential::Credential;
use cellhost_remote::wire::{self, AgentSpec, Msg};
use cellhost_remote::{
    AgentError, AgentExit, AgentOptions, AnyPlacement, HostIdentity, HostOptions, LoopbackPlacement,
    MemoryNonces, RemoteHost, RemoteStarter, run_agent,
};
use cellhost_sandbox::profile::SandboxMode;
use cellhost_testkit::procs::pid_gone;
use tempfile::TempDir;

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

async fn host() -> RemoteHost {
    let opts = HostOptions {
        heartbeat: Duration::from_millis(500),
        ..HostOptions::default()
    };
    RemoteHost::start(
        opts,
        HostIdentity::generate().expect("certificate"),
        Arc::new(MemoryNonces::default()),
    )
    .await
    .expect("listener")
}

fn in_process() -> LoopbackPlacement {
    LoopbackPlacement::in_process(Duration::from_secs(2))
}

fn config(dir: &TempDir, host: &RemoteHost, mode: SandboxMode) -> KernelConfig {
    let mut cfg = KernelConfig::new(python(), dir.path().join("session"));
    cfg.session = "remote".into();
    cfg.sandbox.mode = mode;
    let starter = RemoteStarter::new("lo", host.clone(), AnyPlacement::Loopback(in_process()), None);
    cfg.starter = Some(Arc::new(starter));
    cfg
}

fn spec(generation: u64) -> AgentSpec {
    let sandbox = cellhost_sandbox::profile::SandboxProfile {
        mode: SandboxMode::Off,
        ..Default::default()
    };
    AgentSpec {
        session: "raw".into(),
        generation,
        language: "python".into(),
        python: python(),
        sandbox,
        limits: Default::default(),
        tools: Vec::new(),
        startup_timeout_ms: 60_000,
        heartbeat_ms: 500,
    }
}

fn write_credential(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.path().join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p)
        .expect("credential file");
    std::io::Write::write_all(&mut f, bytes).expect("write");
    p
}

fn agent(path: PathBuf, grace: Duration) -> tokio::task::JoinHandle<Result<AgentExit, AgentError>> {
    tokio::spawn(run_agent(AgentOptions {
        credential: path,
        connect_grace: grace,
        python: None,
        state_dir: None,
    }))
}

/// Waits until the cell printed `needle` on stdout.
async fn until_printed(rx: &mut tokio::sync::mpsc::UnboundedReceiver<LiveEvent>, needle: &str) {
    let mut seen = String::new();
    while let Some(ev) = rx.recv().await {
        if let LiveEvent::Stdout(s) = ev {
            seen.push_str(&s);
            if seen.contains(needle) {
                return;
            }
        }
    }
    panic!("the cell ended without printing {needle:?}: {seen:?}");
}

/// Waits (by polling /proc, at most 20 s) until `pid` is gone.
async fn wait_gone(pid: i32) -> bool {
    for _ in 0..400 {
        if pid_gone(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_across_cells_and_kernel_info_names_the_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host().await;
    let mut session = Session::new(config(&dir, &host, SandboxMode::Auto));
    let r = session
        .execute("x = 41", ExecOptions::default())
        .await
        .expect("cell 1");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    let r = session
        .execute("x + 1", ExecOptions::default())
        .await
        .expect("cell 2");
    assert_eq!(r.status, CellStatus::Ok);
    let text = r.result.as_ref().and_then(|m| m.get("text/plain")).cloned();
    assert_eq!(text, Some(serde_json::json!("42")), "{r:?}");
    let info = session.kernel().expect("live kernel").info().clone();
    let place = info.placement.expect("a remote kernel names where it runs");
    assert_eq!(place.kind, "loopback");
    assert_eq!(place.name, "lo");
    assert_eq!(place.node, cellhost_remote::agent::node_name());
    assert!(place.job.starts_with("task-"), "{place:?}");
    // The node's sandbox report, as a local kernel's on the same machine.
    assert_eq!(info.sandbox.mode, SandboxMode::Auto);
    assert!(!info.sandbox.layers.is_empty(), "{:?}", info.sandbox);
    assert_eq!(host.admitted(), 1);
    session.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_keeps_state_and_timeout_settles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host().await;
    let kernel = Kernel::spawn(config(&dir, &host, SandboxMode::Off))
        .await
        .expect("remote kernel");
    kernel.execute("y = 5", ExecOptions::default()).await.expect("y");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = ExecOptions {
        live: Some(tx),
        ..ExecOptions::default()
    };
    let cell = kernel
        .submit("import time\nprint('go', flush=True)\ntime.sleep(60)", opts)
        .expect("submit");
    until_printed(&mut rx, "go").await;
    let out = cell.interrupt().await;
    assert!(out.delivered, "{out:?}");
    assert!(
        out.target.as_deref().is_some_and(|t| t.contains(':')),
        "node:pid/tid {out:?}"
    );
    let r = cell.wait().await.expect("interrupted cell");
    assert_eq!(r.status, CellStatus::Interrupted, "{r:?}");
    let r = kernel
        .execute("y", ExecOptions::default())
        .await
        .expect("y again");
    assert_eq!(
        r.result.as_ref().and_then(|m| m.get("text/plain")).cloned(),
        Some(serde_json::json!("5")),
        "state kept across the interrupt: {r:?}"
    );
    let opts = ExecOptions {
        timeout: Some(Duration::from_millis(500)),
        ..ExecOptions::default()
    };
    let r = kernel
        .execute("import time\ntime.sleep(60)", opts)
        .await
        .expect("timed out cell");
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    let r = kernel
        .execute("y * 2", ExecOptions::default())
        .await
        .expect("after timeout");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    kernel.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_ends_the_whole_tree_with_setsid_grandchildren() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host().await;
    let kernel = Kernel::spawn(config(&dir, &host, SandboxMode::Off))
        .await
        .expect("remote kernel");
    let r = kernel
        .execute(
            "import subprocess\np = subprocess.Popen(['setsid', 'sleep', '300'])\nprint(p.pid)",
            ExecOptions::default(),
        )
        .await
        .expect("spawn grandchild");
    let pid: i32 = r.stdout.trim().parse().expect("grandchild pid");
    let worker = kernel.info().pid as i32;
    assert!(!pid_gone(pid), "grandchild runs");
    kernel.kill().await;
    assert!(wait_gone(pid).await, "setsid grandchild {pid} left behind");
    assert!(wait_gone(worker).await, "worker {worker} left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_credential_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host().await;
    let mut expected = host.expect(spec(1), Duration::from_secs(60));
    let bytes = expected.credential().to_bytes();
    let first = agent(write_credential(&dir, "c1", &bytes), Duration::from_millis(300));
    let mut conn = expected
        .wait(Duration::from_secs(30))
        .await
        .expect("first use admitted");
    // The agent started its worker.
    let started = wire::read_msg(&mut conn, wire::HANDSHAKE_CAP)
        .await
        .expect("started");
    assert!(matches!(started, Some(Msg::Started(_))), "{started:?}");
    let second = agent(write_credential(&dir, "c2", &bytes), Duration::from_millis(300));
    match second.await.expect("join") {
        Err(AgentError::Refused { code, .. }) => assert_eq!(code, "credential_replayed"),
        other => panic!("replay admitted: {other:?}"),
    }
    assert!(host.refusals().contains(&"credential_replayed"));
    drop(conn);
    assert_eq!(
        first.await.expect("join").expect("first agent"),
        AgentExit::HostLost
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_credential_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host().await;
    let expected = host.expect_expiring_at(spec(1), 1);
    let p = write_credential(&dir, "c", &expected.credential().to_bytes());
    match agent(p, Duration::from_secs(5)).await.expect("join") {
        Err(AgentError::Refused { code, .. }) => assert_eq!(code, "credential_expired"),
        other => panic!("expired credential admitted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_unknown_credential_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host().await;
    let expected = host.expect(spec(1), Duration::from_secs(60));
    let mut forged = expected.credential().clone();
    forged.epoch = 2;
    let p = write_credential(&dir, "forged", &forged.to_bytes());
    match agent(p, Duration::from_secs(5)).await.expect("join") {
        Err(AgentError::Refused { code, .. }) => assert_eq!(code, "credential_invalid"),
        other => panic!("forged credential admitted: {other:?}"),
    }
    // A genuine credential whose allocation the host gave up on: late.
    let late = host.expect(spec(1), Duration::from_secs(60));
    let bytes = late.credential().to_bytes();
    drop(late);
    let p = write_credential(&dir, "late", &bytes);
    match agent(p, Duration::from_secs(5)).await.expect("join") {
        Err(AgentError::Refused { code, .. }) => assert_eq!(code, "unknown_allocation"),
        other => panic!("late agent admitted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_another_certificate_is_refused_by_the_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host().await;
    let expected = host.expect(spec(1), Duration::from_secs(60));
    let mut c: Credential = expected.credential().clone();
    let other = HostIdentity::generate().expect("other certificate");
    c.cert_sha256 = other.cert_sha256();
    let p = write_credential(&dir, "c", &c.to_bytes());
    let err = agent(p, Duration::from_secs(5))
        .await
        .expect("join")
        .expect_err("wrong pin");
    assert_eq!(err.code(), "tls_failed", "{err}");
    assert_eq!(host.admitted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_handshake_is_refused() {
    let host = host().await;
    let expected = host.expect(spec(1), Duration::from_secs(60));
    let pin = expected.credential().cert_sha256.clone();
    let connector = tokio_rustls::TlsConnector::from(cellhost_remote::tls::client_config(&pin).expect("tls"));
    let tcp = tokio::net::TcpStream::connect(host.addr())
        .await
        .expect("connect");
    let mut tls = connector
        .connect(cellhost_remote::tls::server_name(), tcp)
        .await
        .expect("tls");
    // Only the length of a 64 KiB + 1 hello: the host refuses it before
    // reading (or allocating) any of the body.
    let len = (wire::HANDSHAKE_CAP as u32 + 2).to_be_bytes();
    tokio::io::AsyncWriteExt::write_all(&mut tls, &len)
        .await
        .expect("send");
    tokio::io::AsyncWriteExt::flush(&mut tls).await.expect("flush");
    match wire::read_msg(&mut tls, wire::HANDSHAKE_CAP)
        .await
        .expect("reply")
    {
        Some(Msg::Refused(r)) => assert_eq!(r.code, "handshake_malformed", "{r:?}"),
        other => panic!("oversized hello not refused: {other:?}"),
    }
    assert_eq!(host.admitted(), 0);
}

#[tokio::test]
async fn credential_files_readable_by_others_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_credential(&dir, "c", b"{}");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let err = agent(p, Duration::from_secs(1))
        .await
        .expect("join")
        .expect_err("0640 refused");
    assert_eq!(err.code(), "credential_file", "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_turned_away_by_a_full_listener_dials_again_and_is_admitted() {
    // One handshake slot, held by a connection that never starts TLS: the
    // agent is closed at once (as the 65th of 65 agents started together
    // would be) and must come back, not fail.
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = HostOptions {
        heartbeat: Duration::from_millis(500),
        max_pending: 1,
        ..HostOptions::default()
    };
    let host = RemoteHost::start(
        opts,
        HostIdentity::generate().expect("certificate"),
        Arc::new(MemoryNonces::default()),
    )
    .await
    .expect("listener");
    let hold = tokio::net::TcpStream::connect(host.addr())
        .await
        .expect("connect");
    while host.pending() < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut expected = host.expect(spec(1), Duration::from_secs(60));
    let p = write_credential(&dir, "c", &expected.credential().to_bytes());
    let a = agent(p, Duration::from_secs(60));
    while !host.refusals().contains(&"too_many_handshakes") {
        assert!(!a.is_finished(), "the agent gave up: {:?}", a.await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(hold);
    let mut conn = expected
        .wait(Duration::from_secs(30))
        .await
        .expect("admitted once the slot was free");
    let started = wire::read_msg(&mut conn, wire::HANDSHAKE_CAP)
        .await
        .expect("started");
    assert!(matches!(started, Some(Msg::Started(_))), "{started:?}");
    assert_eq!(host.admitted(), 1);
    // Ends the agent's worker (the local link kills and reaps the tree).
    a.abort();
    let _ = a.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_directory_for_the_kernel_is_removed_when_the_kernel_ends() {
    // A node running thousands of kernels one after another must not keep
    // a directory per kernel in its temporary directory. The agent runs in
    // this process: its directory is `cellhost-agent-SESSION-GEN-PID`.
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host().await;
    let mut cfg = config(&dir, &host, SandboxMode::Off);
    cfg.session = "scratchdir".into();
    let suffix = format!("-{}", std::process::id());
    let agent_dirs = || -> Vec<PathBuf> {
        std::fs::read_dir(std::env::temp_dir())
            .expect("temp dir")
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("cellhost-agent-scratchdir-") && n.ends_with(&suffix))
            })
            .collect()
    };
    let k = Kernel::spawn(cfg).await.expect("remote kernel");
    let r = k.execute("1", ExecOptions::default()).await.expect("cell");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    let live = agent_dirs();
    assert_eq!(live.len(), 1, "{live:?}");
    k.kill().await;
    assert!(agent_dirs().is_empty(), "{live:?} left behind");
}
