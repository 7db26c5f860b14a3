//! R2T / R2TS: an R kernel with dplyr, ggplot2 and data.table attached,
//! forked from an R template versus started cold, spawn to first result;
//! R2T with the sandbox off, R2TS with the default sandbox (the forked
//! processes apply the fork plan's confinement steps themselves).

use std::sync::Arc;
use std::time::Instant;

use cellhost_kernel::{ExecOptions, Kernel, KernelConfig, RRuntime, Template, resolve_r};
use cellhost_sandbox::profile::SandboxProfile;

use super::stats::row;
use super::workloads::Ctx;

/// Packages the template attaches and every measured cell attaches.
const PACKAGES: &[&str] = &["dplyr", "ggplot2", "data.table"];

/// Cold kernels measured (each loads the packages: seconds).
const COLD: usize = 5;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The R kernel configuration: the bench's, with `--r` (or R on `PATH`)
/// and `sandbox`.
fn r_config(ctx: &Ctx<'_>, sandbox: SandboxProfile) -> Result<KernelConfig, String> {
    let mut cfg = ctx.cfg.clone();
    cfg.python = resolve_r(ctx.args.r.as_deref()).map_err(s)?;
    cfg.runtime = Arc::new(RRuntime);
    cfg.sandbox = sandbox;
    Ok(cfg)
}

/// R2T: `library(dplyr); library(ggplot2); library(data.table); 1 + 1`
/// answered by a fresh R kernel with the sandbox off: forked from a
/// template that attached the packages (n = `--kernels`) and cold (5
/// kernels).
pub async fn r2t(ctx: &mut Ctx<'_>) -> Result<(), String> {
    measure(ctx, SandboxProfile::off(), "R2T", "sandbox off").await
}

/// R2TS: R2T with the default sandbox (every layer, forked and cold).
pub async fn r2ts(ctx: &mut Ctx<'_>) -> Result<(), String> {
    measure(ctx, SandboxProfile::default(), "R2TS", "default sandbox").await
}

async fn measure(ctx: &mut Ctx<'_>, sandbox: SandboxProfile, id: &str, what: &str) -> Result<(), String> {
    let base = r_config(ctx, sandbox)?;
    let code = PACKAGES
        .iter()
        .map(|p| format!("suppressPackageStartupMessages(library({p}))\n"))
        .collect::<String>()
        + "1 + 1";
    let name = format!("{id} R kernel with dplyr+ggplot2+data.table attached ({what})");
    let name = name.as_str();
    let t0 = Instant::now();
    let mut tcfg = base.clone();
    tcfg.session = "r-template".into();
    let t = Template::start(tcfg, PACKAGES.iter().map(|p| p.to_string()).collect())
        .await
        .map_err(s)?;
    let start_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if !t.info().failed.is_empty() {
        return Err(format!("the R template could not attach {:?}", t.info().failed));
    }
    let mut forked = Vec::new();
    for i in 0..ctx.args.kernels {
        let mut c = base.clone();
        c.session = format!("{id}-{i}");
        c.session_dir = ctx.dir.join(format!("{id}-{i}"));
        let t1 = Instant::now();
        let k = t.fork(c).await.map_err(s)?;
        let r = k
            .execute(code.as_str(), ExecOptions::default())
            .await
            .map_err(s)?;
        forked.push(t1.elapsed().as_secs_f64() * 1000.0);
        k.kill().await;
        if r.error.is_some() {
            return Err(format!("{id} cell failed: {:?}", r.error));
        }
    }
    let import_ms = t.info().import_ms;
    drop(t);
    let mut cold = Vec::new();
    for i in 0..COLD {
        let mut c = base.clone();
        c.session = format!("{id}-cold-{i}");
        c.session_dir = ctx.dir.join(format!("{id}-cold-{i}"));
        let t1 = Instant::now();
        let k = Kernel::spawn(c).await.map_err(s)?;
        let r = k
            .execute(code.as_str(), ExecOptions::default())
            .await
            .map_err(s)?;
        cold.push(t1.elapsed().as_secs_f64() * 1000.0);
        k.kill().await;
        if r.error.is_some() {
            return Err(format!("{id} cell failed: {:?}", r.error));
        }
    }
    let mut mine = row(name, "cellhost, forked from an R template", &forked);
    mine.note = format!(
        "{what}; template ready after {start_ms:.0} ms (R start and library() {import_ms:.0} ms), then forks on demand"
    );
    let mut cold_row = row(name, "cellhost, cold start", &cold);
    cold_row.ratio = Some(cold_row.p50 / mine.p50);
    cold_row.note = format!("{what}; ratio = cold p50 / forked p50");
    ctx.rows.push(mine);
    ctx.rows.push(cold_row);
    Ok(())
}
