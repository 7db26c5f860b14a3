//! The worker starts without importing what only some cells need.

use cellhost_kernel::{CellStatus, ExecOptions, Kernel};

use super::config;

#[tokio::test]
async fn asyncio_is_imported_only_by_the_first_top_level_await() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = Kernel::spawn(config(&dir)).await.expect("spawn");
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
