//! W2T: a kernel with the scientific stack ready, forked from a template
//! versus started cold (cellhost and ipykernel), spawn to first result.

use std::time::Instant;

use cellhost_kernel::{ExecOptions, Kernel, Template};

use super::stats::row;
use super::workloads::{Ctx, compare, floats, run_peer};

/// Modules the template preloads and every measured cell imports.
const STACK: &[&str] = &["numpy", "pandas", "matplotlib.pyplot"];

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// W2T: `import numpy, pandas, matplotlib.pyplot` answered by a fresh
/// kernel: forked from a template that preloaded them (n = `--kernels`),
/// cold (5 kernels), and ipykernel cold (5, with `--peers`).
pub async fn w2t(ctx: &mut Ctx<'_>) -> Result<(), String> {
    let code = format!("import {}\n1", STACK.join(", "));
    let name = "W2T kernel with numpy+pandas+matplotlib ready";
    let t0 = Instant::now();
    let mut base = ctx.cfg.clone();
    base.session = "template".into();
    let t = Template::start(base, STACK.iter().map(|m| m.to_string()).collect())
        .await
        .map_err(s)?;
    let start_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if !t.info().failed.is_empty() {
        return Err(format!("the template could not import {:?}", t.info().failed));
    }
    let mut forked = Vec::new();
    for i in 0..ctx.args.kernels {
        let mut c = ctx.cfg.clone();
        c.session = format!("w2t-{i}");
        c.session_dir = ctx.dir.join(format!("w2t-{i}"));
        let t1 = Instant::now();
        let k = t.fork(c).await.map_err(s)?;
        let r = k
            .execute(code.as_str(), ExecOptions::default())
            .await
            .map_err(s)?;
        forked.push(t1.elapsed().as_secs_f64() * 1000.0);
        k.kill().await;
        if r.error.is_some() {
            return Err(format!("W2T cell failed: {:?}", r.error));
        }
    }
    let import_ms = t.info().import_ms;
    drop(t);
    let mut cold = Vec::new();
    for i in 0..5 {
        let mut c = ctx.cfg.clone();
        c.session = format!("w2t-cold-{i}");
        c.session_dir = ctx.dir.join(format!("w2t-cold-{i}"));
        let t1 = Instant::now();
        let k = Kernel::spawn(c).await.map_err(s)?;
        k.execute(code.as_str(), ExecOptions::default())
            .await
            .map_err(s)?;
        cold.push(t1.elapsed().as_secs_f64() * 1000.0);
        k.kill().await;
    }
    let mine = row(name, "cellhost, forked from a template", &forked);
    let mut cold_row = row(name, "cellhost, cold start", &cold);
    cold_row.ratio = Some(cold_row.p50 / mine.p50);
    cold_row.note = "ratio = cold p50 / forked p50".into();
    let mut mine = mine;
    mine.note = format!(
        "default sandbox; template ready after {start_ms:.0} ms (imports {:.0} ms), then forks on demand",
        import_ms
    );
    ctx.rows.push(mine.clone());
    ctx.rows.push(cold_row);
    if ctx.args.peers {
        let v = run_peer(ctx, &["w2".into(), "5".into(), code.clone()])?;
        compare(
            ctx,
            &mine,
            row(
                name,
                "ipykernel + jupyter_client, cold",
                &floats(&v, "ipykernel_ms"),
            ),
        );
    }
    Ok(())
}
