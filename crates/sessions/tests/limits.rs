//! Limits per session through the request layer, with real kernels: a
//! session with limits of its own (asked by the request, or by a config
//! rule for its name) never adopts a warm-pool kernel started with the
//! host's defaults, and its kernel runs under them; a session without
//! limits still takes from the pool.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellhost_sessions::limits::{LimitRule, LimitsPolicy, SessionLimits};
use cellhost_sessions::requests::{ExecuteRequest, ListRequest};
use cellhost_sessions::{Origin, Registry, RegistryConfig, SessionSpec};

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

async fn wait_pooled(reg: &Registry, n: usize) {
    let t0 = Instant::now();
    while reg.stats().pooled < n {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run(reg: &Registry, spec: SessionSpec, code: &str) -> cellhost_kernel::CellResult {
    ExecuteRequest::new(spec, code, Origin::new("test"))
        .execute(reg)
        .await
        .expect("cell")
        .result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_with_limits_never_adopt_pooled_kernels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut template = cellhost_kernel::KernelConfig::new(python(), dir.path().join("unused"));
    template.cwd = Some(dir.path().to_path_buf());
    let mut cfg = RegistryConfig::new(dir.path().join("state"), template);
    cfg.pool_size = 1;
    cfg.limits = LimitsPolicy {
        rules: vec![LimitRule {
            pattern: "agent-*".into(),
            limits: SessionLimits {
                disk_mb: Some(3),
                ..Default::default()
            },
        }],
        ..Default::default()
    };
    let reg = Registry::start(cfg, None).await.expect("registry");
    wait_pooled(&reg, 1).await;

    let fsize = "import resource\nresource.getrlimit(resource.RLIMIT_FSIZE)[0] >> 20";
    let asked = SessionSpec {
        limits: SessionLimits {
            disk_mb: Some(5),
            cell_timeout_s: Some(30.0),
            ..Default::default()
        },
        ..SessionSpec::new("o", "sized")
    };
    let r = run(&reg, asked, fsize).await;
    assert_eq!(
        r.result.as_ref().and_then(|b| b.get("text/plain")),
        Some(&"5".into()),
        "{r:?}"
    );
    assert_eq!((reg.stats().from_pool, reg.stats().spawned), (0, 1));

    // A config rule by name is limits of its own too.
    let r = run(&reg, SessionSpec::new("o", "agent-1"), fsize).await;
    assert_eq!(
        r.result.as_ref().and_then(|b| b.get("text/plain")),
        Some(&"3".into()),
        "{r:?}"
    );
    assert_eq!((reg.stats().from_pool, reg.stats().spawned), (0, 2));

    // The limits in force are listed.
    let listed = ListRequest { owner: "o".into() }.execute(&reg);
    let sized = listed.iter().find(|s| s.name == "sized").expect("listed");
    assert_eq!(sized.limits.disk_mb, Some(5));
    assert_eq!(sized.limits.cell_timeout_s, Some(30.0));
    assert_eq!(sized.limits.pids, Some(512), "host default filled in");

    // A session of the host's defaults takes the pooled kernel.
    wait_pooled(&reg, 1).await;
    run(&reg, SessionSpec::new("o", "plain"), "1").await;
    assert_eq!(reg.stats().from_pool, 1);
    reg.shutdown().await;
}
