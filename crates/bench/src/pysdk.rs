//! PYSDK: the cost of cellhost's Python API (`python/cellhost_sdk`,
//! `Session.run`) over a raw HTTP request for the same trivial cell, both to
//! one `cellhost serve` the package starts, interleaved in the same run
//! (`pysdk_overhead.py`, run by the bench's interpreter).
//!
//! The package is pure Python: it is imported from the source tree this
//! bench was built from (`python/cellhost_sdk/src`) when that is there,
//! else from the interpreter's environment (the installed wheel).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::stats::row;
use super::workloads::Ctx;

const SCRIPT: &str = include_str!("pysdk_overhead.py");

/// The SDK's source directory of the tree this bench was built from.
fn sdk_src() -> Option<PathBuf> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python/cellhost_sdk/src"
    ));
    p.join("cellhost/session.py").is_file().then_some(p)
}

fn samples(v: &serde_json::Value, key: &str) -> Result<Vec<f64>, String> {
    v.get(key)
        .and_then(|x| x.as_array())
        .map(|xs| xs.iter().filter_map(|x| x.as_f64()).collect::<Vec<_>>())
        .filter(|xs| !xs.is_empty())
        .ok_or_else(|| format!("PYSDK: no `{key}` samples in the script's answer"))
}

/// PYSDK: `Session.run("1")` vs a raw `POST …/execute` (urllib).
pub fn pysdk(ctx: &mut Ctx<'_>) -> Result<(), String> {
    let n = ctx.args.cells.clamp(1, 1000);
    std::fs::create_dir_all(&ctx.dir).map_err(|e| e.to_string())?;
    let script = ctx.dir.join("pysdk_overhead.py");
    std::fs::write(&script, SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    let mut c = Command::new(&ctx.cfg.python);
    c.arg(&script)
        .arg(n.to_string())
        .env("CELLHOST_BIN", &ctx.cellhost)
        .env_remove("CELLHOST_LOG")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(src) = sdk_src() {
        c.env("PYTHONPATH", src);
    }
    let out = c
        .output()
        .map_err(|e| format!("PYSDK: {}: {e}", ctx.cfg.python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "PYSDK: the script failed ({}); the interpreter needs the `cellhost` package (the source tree or the wheel)",
            out.status
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("PYSDK: the script's answer is not JSON: {e}"))?;
    let api = samples(&v, "api")?;
    let raw = samples(&v, "raw")?;
    let mine = row("PYSDK trivial cell `1`", "Python API: `Session.run`", &api);
    let mut peer = row(
        "PYSDK trivial cell `1`",
        "raw HTTP request (urllib), same server",
        &raw,
    );
    peer.ratio = Some(peer.p50 / mine.p50);
    peer.note = format!(
        "interleaved with the row above; the Python layer's overhead at p50: {:+.2} ms (a ratio under 1 is that cost)",
        mine.p50 - peer.p50
    );
    ctx.rows.push(mine);
    ctx.rows.push(peer);
    Ok(())
}
