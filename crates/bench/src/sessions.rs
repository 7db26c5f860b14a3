//! Workloads of the sessions layer: POOL, JOURNAL, W5.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_kernel::{CellStatus, ExecOptions, Kernel, ToolCall, ToolFuture, ToolHost};
use cellhost_sessions::{Durability, Journal, Origin, Registry, RegistryConfig};

use super::stats::row;
use super::workloads::Ctx;

type R = Result<(), String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn registry_config(ctx: &Ctx<'_>, name: &str, pool: usize) -> RegistryConfig {
    let mut rc = RegistryConfig::new(ctx.dir.join(name), ctx.cfg.clone());
    rc.pool_size = pool;
    rc.max_live = 64;
    rc
}

/// Acquire latency of a session's kernel: a cold spawn (no pool) against a
/// queue pop from the warm pool (refilled before each sample, as an idle
/// server's pool would be).
pub async fn pool(ctx: &mut Ctx<'_>) -> R {
    let n = ctx.args.kernels;
    let cold = Registry::start(registry_config(ctx, "pool-cold", 0), None)
        .await
        .map_err(s)?;
    let mut cold_ms = Vec::new();
    for i in 0..n {
        let key = cold.key("bench", &format!("cold{i}"));
        let t = Instant::now();
        cold.acquire(&key).await.map_err(s)?;
        cold_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        cold.dispose(&key).await;
    }
    cold.shutdown().await;
    let warm = Registry::start(registry_config(ctx, "pool-warm", 2), None)
        .await
        .map_err(s)?;
    let mut warm_ms = Vec::new();
    for i in 0..n {
        let t0 = Instant::now();
        while warm.stats().pooled < 2 {
            if t0.elapsed() > Duration::from_secs(60) {
                return Err("POOL: the pool did not refill in 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let key = warm.key("bench", &format!("warm{i}"));
        let t = Instant::now();
        warm.acquire(&key).await.map_err(s)?;
        warm_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        warm.dispose(&key).await;
    }
    let from_pool = warm.stats().from_pool;
    warm.shutdown().await;
    let cold_row = row("POOL acquire a session's kernel", "cold spawn", &cold_ms);
    let mut warm_row = row("POOL acquire a session's kernel", "warm pool (size 2)", &warm_ms);
    warm_row.ratio = Some(cold_row.p50 / warm_row.p50);
    warm_row.note = format!("{from_pool}/{n} from the pool; ratio = cold p50 / pool p50");
    ctx.rows.push(cold_row);
    ctx.rows.push(warm_row);
    Ok(())
}

async fn cells(reg: &Registry, name: &str, n: usize) -> Result<(Vec<f64>, f64), String> {
    let key = reg.key("bench", name);
    let o = Origin::new("bench");
    reg.execute(&key, "x = 0", ExecOptions::default(), &o)
        .await
        .map_err(s)?;
    for _ in 0..20 {
        reg.execute(&key, "x += 1", ExecOptions::default(), &o)
            .await
            .map_err(s)?;
    }
    let mut lat = Vec::with_capacity(n);
    let t0 = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let r = reg
            .execute(&key, "x += 1", ExecOptions::default(), &o)
            .await
            .map_err(s)?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        if r.status != CellStatus::Ok {
            return Err(format!("JOURNAL cell failed: {r:?}"));
        }
    }
    Ok((lat, n as f64 / t0.elapsed().as_secs_f64()))
}

/// Cells per second through the registry with and without the journal
/// (each settled cell committed before its result returns).
pub async fn journal(ctx: &mut Ctx<'_>) -> R {
    let n = ctx.args.cells;
    let plain = Registry::start(registry_config(ctx, "journal-off", 0), None)
        .await
        .map_err(s)?;
    let (off, off_rate) = cells(&plain, "off", n).await?;
    plain.shutdown().await;
    let mut rows = vec![];
    for (label, durability) in [
        ("journal, synchronous=NORMAL", Durability::Normal),
        ("journal, synchronous=FULL", Durability::Full),
    ] {
        let dir = ctx.dir.join(format!("journal-{durability:?}"));
        let j = Journal::open(dir.join("journal.sqlite3"), durability).map_err(s)?;
        let reg = Registry::start(
            registry_config(ctx, &format!("journal-{durability:?}"), 0),
            Some(Arc::new(j)),
        )
        .await
        .map_err(s)?;
        let (on, on_rate) = cells(&reg, "on", n).await?;
        reg.shutdown().await;
        let mut r = row("JOURNAL cell round trip `x += 1`", label, &on);
        r.note = format!("{on_rate:.0} cells/s");
        rows.push(r);
    }
    let mut r = row("JOURNAL cell round trip `x += 1`", "no journal", &off);
    r.note = format!("{off_rate:.0} cells/s");
    ctx.rows.push(r);
    ctx.rows.extend(rows);
    Ok(())
}

struct Echo;

impl ToolHost for Echo {
    fn names(&self) -> Vec<String> {
        vec!["echo".into()]
    }
    fn call(&self, call: ToolCall) -> ToolFuture {
        Box::pin(async move { Ok(call.args) })
    }
}

/// Host-call round trip measured inside the cell: `cellhost.call('echo',
/// {...})` to a trivial Rust tool and back.
pub async fn w5(ctx: &mut Ctx<'_>) -> R {
    let n = ctx.args.cells.max(10);
    let mut cfg = ctx.cfg.clone();
    cfg.tool_host = Some(Arc::new(Echo));
    cfg.tool_budget = u32::try_from(n + 50).unwrap_or(u32::MAX);
    let k = Kernel::spawn(cfg).await.map_err(s)?;
    let code = format!(
        "import cellhost, time, json\nfor _ in range(20): cellhost.call('echo', {{'i': 0}})\n_l = []\nfor i in range({n}):\n    t = time.perf_counter()\n    cellhost.call('echo', {{'i': i}})\n    _l.append((time.perf_counter() - t) * 1000)\nprint(json.dumps(_l))"
    );
    let r = k
        .execute(code.as_str(), ExecOptions::default())
        .await
        .map_err(s)?;
    k.kill().await;
    if r.status != CellStatus::Ok {
        return Err(format!("W5 cell failed: {:?}", r.error));
    }
    let lat: Vec<f64> = serde_json::from_str(r.stdout.trim()).map_err(|e| format!("W5 output: {e}"))?;
    let mut mine = row("W5 host call round trip (cell → host → cell)", "cellhost", &lat);
    mine.note = "trivial Rust ToolHost (echo), timed in the cell".into();
    ctx.rows.push(mine);
    Ok(())
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// 200 idle kernels in one registry: time to spawn them all (8 at a time),
/// the host's RSS, and the RSS of each kernel (worker + init).
pub async fn idle200(ctx: &mut Ctx<'_>) -> R {
    const N: usize = 200;
    const PAR: usize = 8;
    let mut rc = registry_config(ctx, "idle200", 0);
    rc.max_live = N + 8;
    let reg = Registry::start(rc, None).await.map_err(s)?;
    let host_before = rss_kb(std::process::id());
    let t0 = Instant::now();
    let mut kernels = Vec::with_capacity(N);
    for batch in (0..N).collect::<Vec<_>>().chunks(PAR) {
        let futs: Vec<_> = batch
            .iter()
            .map(|i| {
                let reg = reg.clone();
                let key = reg.key("bench", &format!("idle{i}"));
                tokio::spawn(async move { reg.acquire(&key).await })
            })
            .collect();
        for f in futs {
            let (k, _) = f.await.map_err(s)?.map_err(s)?;
            kernels.push(k);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let host_after = rss_kb(std::process::id());
    let per: Vec<f64> = kernels
        .iter()
        .map(|k| (rss_kb(k.info().pid) + rss_kb(k.info().init_pid)) as f64 / 1024.0)
        .collect();
    drop(kernels);
    let t1 = Instant::now();
    reg.shutdown().await;
    let down = t1.elapsed().as_secs_f64();
    let mut r = row("IDLE200 200 idle kernels: RSS per kernel", "cellhost", &per);
    r.unit = "MB";
    r.note = format!(
        "all spawned in {secs:.1} s ({PAR} at a time); host RSS {:.1} → {:.1} MB; shutdown {down:.1} s",
        host_before as f64 / 1024.0,
        host_after as f64 / 1024.0
    );
    ctx.rows.push(r);
    Ok(())
}
