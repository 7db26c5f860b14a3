//! FORK: forking a live session holding numpy + pandas and 100 MB / 1 GB
//! of arrays (`cellhost_sessions::requests::ForkRequest`), by pickle (the
//! default sandbox) and copy-on-write (the sandbox off), against re-running
//! the cells that built the state in a new session; memory (PSS and USS
//! from `/proc/PID/smaps_rollup`) of parent + fork right after the fork and
//! after the fork mutates 10% of the data.

use std::time::Instant;

use cellhost_sessions::requests::{
    CwdScope, ExecuteRequest, ForkMethod, ForkRequest, ForkThreads, KillRequest,
};
use cellhost_sessions::{Origin, Registry, RegistryConfig, SessionSpec};

use super::stats::row;
use super::workloads::Ctx;

type R = Result<(), String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

const OWNER: &str = "bench";

/// The cells that build a session's state: the stack, then `mb` MiB of
/// float64 arrays and a frame.
fn state_cells(mb: u64) -> Vec<String> {
    vec![
        "import numpy as np, pandas as pd".into(),
        format!("arr = np.random.default_rng(1).random({} )", (mb << 20) / 8),
        "df = pd.DataFrame({'a': np.arange(100_000), 'b': np.arange(100_000) * 0.5})".into(),
    ]
}

async fn run(reg: &Registry, session: &str, code: &str) -> Result<f64, String> {
    let t = Instant::now();
    let r = ExecuteRequest::new(SessionSpec::new(OWNER, session), code, Origin::new("bench"))
        .execute(reg)
        .await
        .map_err(s)?
        .result;
    if r.status != cellhost_kernel::CellStatus::Ok {
        return Err(format!(
            "FORK: cell {code:?} ended {}: {:?}",
            r.status.as_str(),
            r.error
        ));
    }
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

async fn kill(reg: &Registry, session: &str) {
    let _ = KillRequest {
        owner: OWNER.into(),
        session: session.into(),
        cwd: CwdScope::Any,
    }
    .execute(reg)
    .await;
}

/// (PSS, USS) of a process in MiB (`Pss:`, and `Private_Clean:` plus
/// `Private_Dirty:`, of `/proc/PID/smaps_rollup`).
fn mem_mb(pid: u32) -> Option<(f64, f64)> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> Option<f64> {
        t.lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse::<f64>()
            .ok()
    };
    let pss = field("Pss:")?;
    let uss = field("Private_Clean:")? + field("Private_Dirty:")?;
    Some((pss / 1024.0, uss / 1024.0))
}

fn pid_of(reg: &Registry, session: &str) -> Option<u32> {
    reg.kernel(&reg.key(OWNER, session)).map(|k| k.info().pid)
}

/// FORK at 100 MiB (n = `--kernels`, at most 10) and 1 GiB (3 forks):
/// by pickle with the configured sandbox (the default: confined), then
/// copy-on-write with the sandbox off, then the cells re-run.
pub async fn fork(ctx: &mut Ctx<'_>) -> R {
    for method in [ForkMethod::Pickle, ForkMethod::Cow] {
        let mut cfg = ctx.cfg.clone();
        if method == ForkMethod::Cow {
            cfg.sandbox.mode = cellhost_sandbox::profile::SandboxMode::Off;
        }
        let name = match method {
            ForkMethod::Cow => "fork-cow",
            ForkMethod::Pickle => "fork",
        };
        let mut rc = RegistryConfig::new(ctx.dir.join(name), cfg);
        rc.pool_size = 0;
        rc.max_live = 16;
        let reg = Registry::start(rc, None).await.map_err(s)?;
        let result = measure(ctx, &reg, method).await;
        reg.shutdown().await;
        result?;
    }
    Ok(())
}

async fn measure(ctx: &mut Ctx<'_>, reg: &Registry, method: ForkMethod) -> R {
    for (mb, n) in [(100u64, ctx.args.kernels.clamp(1, 10)), (1024, 3)] {
        let label = format!("FORK session with numpy+pandas and {mb} MiB of arrays");
        let parent = format!("fork-{mb}");
        for c in state_cells(mb) {
            run(reg, &parent, &c).await?;
        }
        let mut fork_ms = Vec::new();
        let mut after_fork = Vec::new();
        let mut after_mutate = Vec::new();
        let mut parent_alone = Vec::new();
        let mut why_pickle = None;
        for i in 0..n {
            let name = format!("fork-{mb}-{i}");
            if let Some(p) = pid_of(reg, &parent).and_then(mem_mb) {
                parent_alone.push(p);
            }
            let t = Instant::now();
            let rep = ForkRequest {
                session: SessionSpec::new(OWNER, parent.as_str()),
                name: name.clone(),
                threads: ForkThreads::Refuse,
            }
            .execute(reg)
            .await
            .map_err(s)?;
            fork_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            if rep.method != method {
                return Err(format!(
                    "FORK: expected a {method:?} fork, got {:?} ({:?})",
                    rep.method, rep.pickle_reason
                ));
            }
            why_pickle = rep.pickle_reason.clone();
            if !rep.lost.is_empty() {
                return Err(format!("FORK: names not carried: {:?}", rep.lost));
            }
            let both = |reg: &Registry| {
                let nan = (f64::NAN, f64::NAN);
                let p = pid_of(reg, &parent).and_then(mem_mb).unwrap_or(nan);
                let c = mem_mb(rep.pid).unwrap_or(nan);
                (p.0 + c.0, p.1 + c.1)
            };
            after_fork.push(both(reg));
            run(reg, &name, "arr[: len(arr) // 10] += 1.0").await?;
            after_mutate.push(both(reg));
            kill(reg, &name).await;
        }
        let med = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
            super::stats::percentile(&v.iter().map(f).collect::<Vec<_>>(), 50.0)
        };
        type Pick = fn(&(f64, f64)) -> f64;
        let (pss, uss): (Pick, Pick) = (|m| m.0, |m| m.1);
        let what = match method {
            ForkMethod::Cow => "cellhost fork, copy-on-write (sandbox off)",
            ForkMethod::Pickle => "cellhost fork, pickle (default sandbox)",
        };
        let mut mine = row(&label, what, &fork_ms);
        mine.note = format!(
            "PSS/USS (MiB, p50): parent alone {:.0}/{:.0}; parent + fork right after the fork {:.0}/{:.0}; after the fork mutates 10% {:.0}/{:.0}{}",
            med(&parent_alone, pss),
            med(&parent_alone, uss),
            med(&after_fork, pss),
            med(&after_fork, uss),
            med(&after_mutate, pss),
            med(&after_mutate, uss),
            why_pickle
                .map(|w| format!("; pickle because {w}"))
                .unwrap_or_default()
        );
        let fork_p50 = mine.p50;
        ctx.rows.push(mine);
        if method == ForkMethod::Cow {
            // The baseline: the same cells run again in a new session (once,
            // with the sandbox off; ratio against this run's fork).
            let mut rerun_ms = Vec::new();
            for i in 0..n {
                let name = format!("rerun-{mb}-{i}");
                let t = Instant::now();
                for c in state_cells(mb) {
                    run(reg, &name, &c).await?;
                }
                rerun_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                kill(reg, &name).await;
            }
            let mut base = row(
                &label,
                "cellhost, the cells re-run in a new session (sandbox off)",
                &rerun_ms,
            );
            base.ratio = Some(base.p50 / fork_p50);
            base.note = "ratio = re-run p50 / copy-on-write fork p50 (kernel start included in both)".into();
            ctx.rows.push(base);
        }
        kill(reg, &parent).await;
    }
    Ok(())
}
