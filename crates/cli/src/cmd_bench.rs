//! `cellhost bench [--workload W1,W2,W7] [--peers] [--python PATH]`:
//! cellhost against its peers in the same run; prints a table of medians,
//! p99 and ratios, and rewrites `BENCHMARKS.md`.
//!
//! Peers (with `--peers`): ipykernel driven by jupyter_client, a fresh
//! `python -c` per cell, and nbclient for notebooks. They run from the
//! interpreter given by `--python` (the project venv pins their versions).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use cellhost_kernel::{CellStatus, ExecOptions, Kernel};

use crate::KernelArgs;
use crate::common::{self, EXIT_USAGE};

const PEERS_PY: &str = include_str!("../../../bench/peers.py");

/// Arguments of `bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    kernel: KernelArgs,
    /// Comma-separated workloads: W1 (round trip), W2 (spawn to first
    /// result), W7 (penguins notebook end to end).
    #[arg(long, value_name = "LIST", default_value = "W1,W2,W7")]
    workload: String,
    /// Also measure the peers (needs ipykernel, jupyter_client, nbclient in
    /// the interpreter's environment).
    #[arg(long)]
    peers: bool,
    /// Cells for W1.
    #[arg(long, default_value_t = 1000)]
    cells: usize,
    /// Kernels for W2.
    #[arg(long, default_value_t = 20)]
    kernels: usize,
    /// Notebook for W7.
    #[arg(long, default_value = "examples/penguins.ipynb")]
    notebook: PathBuf,
    /// Where to write the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    output: PathBuf,
}

#[derive(Debug, Clone)]
struct Row {
    workload: String,
    system: String,
    n: usize,
    p50: f64,
    p99: f64,
    ratio: Option<f64>,
}

fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let idx = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[idx.min(s.len() - 1)]
}

fn row(workload: &str, system: &str, v: &[f64]) -> Row {
    Row {
        workload: workload.into(),
        system: system.into(),
        n: v.len(),
        p50: percentile(v, 50.0),
        p99: percentile(v, 99.0),
        ratio: None,
    }
}

fn run_peer(python: &std::path::Path, args: &[String]) -> Result<serde_json::Value, String> {
    let dir = std::env::temp_dir().join(format!("cellhost-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let script = dir.join("peers.py");
    std::fs::write(&script, PEERS_PY).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(python)
        .arg(&script)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "peer {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("peer output: {e}"))
}

fn floats(v: &serde_json::Value, key: &str) -> Vec<f64> {
    v.get(key)
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default()
}

/// Runs `bench`; returns the exit code.
pub fn run(args: BenchArgs) -> u8 {
    let workloads: Vec<String> = args
        .workload
        .split(',')
        .map(|w| w.trim().to_ascii_uppercase())
        .collect();
    if let Some(bad) = workloads
        .iter()
        .find(|w| !matches!(w.as_str(), "W1" | "W2" | "W7"))
    {
        eprintln!("cellhost: unknown workload {bad} (this build measures W1, W2, W7)");
        return EXIT_USAGE;
    }
    let rt = match common::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 1;
        }
    };
    let dir = common::new_session_dir("bench");
    let cfg = match common::kernel_config(&args.kernel, "bench", &dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 1;
        }
    };
    let python = cfg.python.clone();
    let mut rows: Vec<Row> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let result: Result<(), String> = rt.block_on(async {
        if workloads.iter().any(|w| w == "W1") {
            eprintln!("W1: {} round trips of `x += 1`", args.cells);
            let k = Kernel::spawn(cfg.clone()).await.map_err(|e| e.to_string())?;
            k.execute("x = 0", ExecOptions::default()).await.map_err(|e| e.to_string())?;
            for _ in 0..20 {
                k.execute("x += 1", ExecOptions::default()).await.map_err(|e| e.to_string())?;
            }
            let mut lat = Vec::with_capacity(args.cells);
            for _ in 0..args.cells {
                let t = Instant::now();
                let r = k.execute("x += 1", ExecOptions::default()).await.map_err(|e| e.to_string())?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                if r.status != CellStatus::Ok {
                    return Err(format!("W1 cell failed: {r:?}"));
                }
            }
            k.kill().await;
            let mine = row("W1 round trip", "cellhost", &lat);
            rows.push(mine.clone());
            if args.peers {
                let v = run_peer(&python, &["w1".into(), args.cells.to_string()])?;
                for (key, name) in [("ipykernel_ms", "ipykernel + jupyter_client"), ("python_c_ms", "python -c per cell")] {
                    let mut r = row("W1 round trip", name, &floats(&v, key));
                    r.ratio = Some(r.p50 / mine.p50);
                    rows.push(r);
                }
            }
        }
        if workloads.iter().any(|w| w == "W2") {
            eprintln!("W2: spawn to first result, {} kernels", args.kernels);
            let mut lat = Vec::new();
            for i in 0..args.kernels {
                let mut c = cfg.clone();
                c.generation = i as u64 + 1;
                let t = Instant::now();
                let k = Kernel::spawn(c).await.map_err(|e| e.to_string())?;
                k.execute("1", ExecOptions::default()).await.map_err(|e| e.to_string())?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                k.kill().await;
            }
            let mine = row("W2 spawn to first result (cold)", "cellhost", &lat);
            rows.push(mine.clone());
            if args.peers {
                let v = run_peer(&python, &["w2".into(), args.kernels.to_string()])?;
                let mut r = row("W2 spawn to first result (cold)", "ipykernel + jupyter_client", &floats(&v, "ipykernel_ms"));
                r.ratio = Some(r.p50 / mine.p50);
                rows.push(r);
            }
        }
        if workloads.iter().any(|w| w == "W7") {
            eprintln!("W7: {} end to end", args.notebook.display());
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let out = dir.join("w7.ipynb");
            let mut lat = Vec::new();
            for _ in 0..3 {
                let t = Instant::now();
                let st = std::process::Command::new(&exe)
                    .arg("run")
                    .arg(&args.notebook)
                    .arg("--output")
                    .arg(&out)
                    .arg("--python")
                    .arg(&python)
                    .stderr(std::process::Stdio::null())
                    .status()
                    .map_err(|e| e.to_string())?;
                if !st.success() {
                    return Err(format!("cellhost run failed: {st}"));
                }
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            let mine = row("W7 penguins notebook", "cellhost run", &lat);
            rows.push(mine.clone());
            if args.peers {
                let v = run_peer(&python, &["w7".into(), args.notebook.display().to_string(), "3".into()])?;
                let mut r = row("W7 penguins notebook", "nbclient + ipykernel", &floats(&v, "nbclient_ms"));
                r.ratio = Some(r.p50 / mine.p50);
                rows.push(r);
            }
            notes.push("W7 times `cellhost run` as a whole process (start-up included); nbclient is timed inside Python around `NotebookClient.execute()` (its import excluded).".into());
        }
        Ok(())
    });
    if let Err(e) = result {
        eprintln!("cellhost: bench failed: {e}");
        return 1;
    }
    let table = render_table(&rows);
    println!("{table}");
    let mut doc = String::from("# Benchmarks\n\n");
    let _ = writeln!(
        doc,
        "Made by `cellhost bench --workload {} {}--python {}` on a 2-core, 24 GiB Debian 12 machine (shared and noisy: read the ratios, which compare peers measured in the same run). Times in milliseconds; *ratio* = the peer's p50 / cellhost's p50 (above 1: cellhost is faster).\n",
        args.workload,
        if args.peers { "--peers " } else { "" },
        python.display()
    );
    doc.push_str(&table);
    doc.push('\n');
    for n in &notes {
        let _ = writeln!(doc, "- {n}");
    }
    if let Err(e) = std::fs::write(&args.output, doc) {
        eprintln!("cellhost: cannot write {}: {e}", args.output.display());
        return 1;
    }
    eprintln!("cellhost: wrote {}", args.output.display());
    0
}

fn render_table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| workload | system | n | p50 ms | p99 ms | ratio |\n| --- | --- | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        let ratio = r
            .ratio
            .map(|x| format!("{x:.1}×"))
            .unwrap_or_else(|| "—".into());
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {:.2} | {} |",
            r.workload, r.system, r.n, r.p50, r.p99, ratio
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_sorted_ranks() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
