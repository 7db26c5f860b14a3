//! A kernel with an egress allowlist: its network namespace reaches only
//! the host's proxy, through the environment every HTTP client reads.
//! The target is a listener of this test on 127.0.0.1, reached by a name
//! the policy pins to it (`allowed.test`).
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::PathBuf;
use std::sync::Arc;

use cellhost_kernel::egress::{DenyReason, Egress, Limits, NetworkPolicy, Resolver};
use cellhost_kernel::{CellStatus, ExecOptions, Kernel, KernelConfig};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

/// An HTTP server on 127.0.0.1 answering every request with `hello`.
async fn http_server() -> (u16, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
                    .await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_host_answers_and_the_rest_is_refused_and_reported() {
    let (port, server) = http_server().await;
    let dir = TempDir::new().expect("tmp");
    let mut cfg = KernelConfig::new(python(), dir.path().join("session"));
    cfg.session = "egress".into();
    let mut resolver = Resolver::default();
    resolver
        .hosts
        .insert("allowed.test".into(), vec!["127.0.0.1".parse().expect("ip")]);
    let policy = NetworkPolicy::parse(&format!("allowed.test:{port}")).expect("policy");
    let egress: Arc<Egress> = Egress::for_policy(&policy, resolver, Limits::default()).expect("egress");
    cfg.egress = Some(egress);
    let k = Kernel::spawn(cfg).await.expect("spawn");
    let ok = k
        .execute(
            &format!(
                "import urllib.request\nurllib.request.urlopen('http://allowed.test:{port}/x', timeout=30).read().decode()"
            ),
            ExecOptions::default(),
        )
        .await
        .expect("execute");
    assert_eq!(ok.status, CellStatus::Ok, "{ok:?}");
    assert_eq!(
        ok.result.as_ref().and_then(|r| r.get("text/plain")),
        Some(&"'hello'".into())
    );
    assert!(ok.network.is_none(), "{:?}", ok.network);
    let code = format!(
        "import urllib.request, socket\n\
         errs = []\n\
         for url in ['http://evil.test:{port}/', 'http://127.0.0.1:{port}/']:\n\
         \x20   try:\n\
         \x20       urllib.request.urlopen(url, timeout=30).read()\n\
         \x20   except Exception as e:\n\
         \x20       errs.append(type(e).__name__)\n\
         s = socket.socket()\n\
         try:\n\
         \x20   s.connect(('127.0.0.1', {port}))\n\
         except OSError as e:\n\
         \x20   errs.append('direct:' + type(e).__name__)\n\
         errs"
    );
    let denied = k.execute(&code, ExecOptions::default()).await.expect("execute");
    assert_eq!(denied.status, CellStatus::Ok, "{denied:?}");
    let text = denied.result.as_ref().and_then(|r| r.get("text/plain")).cloned();
    assert_eq!(
        text,
        Some("['HTTPError', 'URLError', 'direct:ConnectionRefusedError']".into()),
        "{denied:?}"
    );
    let report = denied.network.expect("network report");
    assert_eq!(report.denied.len(), 1, "{report:?}");
    assert_eq!(report.denied[0].host, "evil.test");
    assert_eq!(report.denied[0].port, port);
    assert_eq!(report.denied[0].reason, DenyReason::NotAllowed);
    k.kill().await;
    server.abort();
}
