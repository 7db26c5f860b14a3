//! The worker starts without importing what only some cells need.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::PathBuf;

use cellhost_kernel::{CellStatus, ExecOptions, Kernel, KernelConfig};

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

#[tokio::test]
async fn asyncio_is_imported_only_by_the_first_top_level_await() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = KernelConfig::new(python(), dir.path().join("session"));
    cfg.session = "imports".into();
    cfg.cwd = Some(dir.path().to_path_buf());
    let k = Kernel::spawn(cfg).await.expect("spawn");
    let r = k
        .execute(
            "import sys\nprint(sorted(m for m in ('asyncio', 'ssl') if m in sys.modules))",
            ExecOptions::default(),
        )
        .await
        .expect("execute");
    assert_eq!(r.stdout, "[]\n", "{r:#?}");
    let r = k
        .execute(
            "async def f():\n    return 41\nx = await f()\nx + 1",
            ExecOptions::default(),
        )
        .await
        .expect("execute");
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    assert_eq!(
        r.result
            .as_ref()
            .and_then(|v| v.get("text/plain"))
            .and_then(|v| v.as_str()),
        Some("42")
    );
    let r = k
        .execute(
            "import asyncio\nasyncio.run(asyncio.sleep(0))\nx",
            ExecOptions::default(),
        )
        .await
        .expect("execute");
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    k.kill().await;
}
