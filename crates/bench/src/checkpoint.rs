//! CKPT: namespace checkpoints of a session holding numpy + pandas state
//! (a 10 MB and a 100 MB frame): the checkpoint's cost per cell as a ratio
//! of the cell's own time, the restore after a SIGKILLed kernel, and pause
//! and resume with the memory a pause frees.

use std::sync::Arc;
use std::time::Instant;

use cellhost_kernel::{CellStatus, ExecOptions};
use cellhost_sessions::checkpoint::CheckpointMode;
use cellhost_sessions::{Durability, Journal, Origin, Registry, RegistryConfig};

use super::stats::row;
use super::workloads::Ctx;

type R = Result<(), String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Samples per size.
const ROUNDS: usize = 5;

pub async fn ckpt(ctx: &mut Ctx<'_>) -> R {
    let dir = ctx.dir.join("ckpt");
    let journal = Journal::open(dir.join("journal.sqlite3"), Durability::Normal).map_err(s)?;
    let mut rc = RegistryConfig::new(&dir, ctx.cfg.clone());
    rc.pool_size = 0;
    rc.checkpoint.default = CheckpointMode::Namespace;
    let reg = Registry::start(rc, Some(Arc::new(journal))).await.map_err(s)?;
    let out = run(ctx, &reg).await;
    reg.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

async fn run(ctx: &mut Ctx<'_>, reg: &Registry) -> R {
    let o = Origin::new("bench");
    for (label, rows_n) in [("10 MB frame", 125_000usize), ("100 MB frame", 1_250_000)] {
        let key = reg.key("bench", &format!("ckpt-{rows_n}"));
        let setup = format!(
            "import numpy as np, pandas as pd\ndf = pd.DataFrame(np.random.default_rng(1).random(({rows_n}, 10)))\nacc = []"
        );
        let r = reg
            .execute(&key, &setup, ExecOptions::default(), &o)
            .await
            .map_err(s)?;
        if r.status != CellStatus::Ok {
            return Err(format!("CKPT setup: {:?} {}", r.status, r.stderr));
        }
        // A cell of real work on the state: its own time, then the time of
        // the checkpoint that follows it (taken now, the same work the
        // background checkpoint does).
        let cell = "df[0] = df[0] * 1.0001\nacc.append(float(df.values.sum()))";
        let (mut cell_ms, mut ckpt_ms, mut ratio, mut bytes) = (vec![], vec![], vec![], 0u64);
        for _ in 0..ROUNDS {
            let r = reg
                .execute(&key, cell, ExecOptions::default(), &o)
                .await
                .map_err(s)?;
            let c = reg.checkpoint_now(&key).await.map_err(s)?;
            cell_ms.push(r.duration_ms as f64);
            ckpt_ms.push(c.write_ms as f64);
            ratio.push(c.write_ms as f64 / (r.duration_ms.max(1)) as f64);
            bytes = c.bytes;
        }
        let mut a = row(
            "CKPT cell on numpy+pandas state",
            &format!("{label}: the cell itself"),
            &cell_ms,
        );
        a.note = "a column update and a full sum".into();
        let mut b = row(
            "CKPT checkpoint after the cell",
            &format!("{label}: checkpoint write"),
            &ckpt_ms,
        );
        let rs = super::stats::row("", "", &ratio);
        b.ratio = Some(rs.p50);
        b.note = format!(
            "{:.1} MB file; ratio = checkpoint ÷ cell (p50; off the critical path: the result is sent first)",
            bytes as f64 / 1e6
        );
        ctx.rows.push(a);
        ctx.rows.push(b);
        // Restore after SIGKILL: the next cell's round trip and the restore.
        let (mut restore_ms, mut trip_ms) = (vec![], vec![]);
        for _ in 0..ROUNDS {
            let (k, _) = reg.acquire(&key).await.map_err(s)?;
            let pid = k.info().pid;
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
            // The driver notices the death on its own; the bench waits for it.
            let t0 = Instant::now();
            while k.is_alive() && t0.elapsed().as_secs() < 30 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            let t = Instant::now();
            let r = reg
                .execute(&key, "len(acc)", ExecOptions::default(), &o)
                .await
                .map_err(s)?;
            trip_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            let restored = r
                .restored
                .ok_or("CKPT: the cell after SIGKILL was not restored")?;
            if restored.error.is_some() || !restored.restored.iter().any(|n| n == "df") {
                return Err(format!("CKPT: restore failed: {restored:?}"));
            }
            restore_ms.push(restored.restore_ms as f64);
        }
        ctx.rows.push(row(
            "CKPT restore after SIGKILL",
            &format!("{label}: restore in the new kernel"),
            &restore_ms,
        ));
        let mut t = row(
            "CKPT restore after SIGKILL",
            &format!("{label}: next cell, spawn + restore + cell"),
            &trip_ms,
        );
        t.note = "a cold kernel start included".into();
        ctx.rows.push(t);
        // Pause and resume.
        let (mut pause_ms, mut resume_ms, mut freed) = (vec![], vec![], vec![]);
        for _ in 0..ROUNDS {
            let p = reg.pause(&key).await.map_err(s)?;
            pause_ms.push(p.pause_ms as f64);
            freed.push(p.memory_freed_bytes as f64 / 1e6);
            let t = Instant::now();
            let r = reg
                .execute(&key, "len(acc)", ExecOptions::default(), &o)
                .await
                .map_err(s)?;
            resume_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            if !r.restored.is_some_and(|n| n.resumed) {
                return Err("CKPT: the cell after a pause did not resume".into());
            }
        }
        let mut p = row("CKPT pause (checkpoint + stop)", label, &pause_ms);
        let f = row("", "", &freed);
        p.note = format!("{:.0} MB of worker RSS freed (p50)", f.p50);
        ctx.rows.push(p);
        let mut q = row("CKPT resume (next cell)", label, &resume_ms);
        q.note = "spawn + restore + cell".into();
        ctx.rows.push(q);
        reg.dispose(&key).await;
    }
    Ok(())
}
