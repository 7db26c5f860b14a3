//! `cellhost bench [--workload LIST] [--peers] [--python PATH]`: cellhost
//! against its peers in the same run; prints a table of medians, p99 and
//! ratios, and rewrites `BENCHMARKS.md`.
//!
//! Workloads: W1 round trip of a trivial cell; W2 spawn to first result
//! (cold); W2S the same with the sandbox off vs auto; W3 1 GB of stdout through the capture path with the host's peak
//! RSS; W4 interrupt-to-settled for `time.sleep`, a Python loop and numpy
//! matmuls, with the other core kept busy; KILL kill-to-reaped of a kernel
//! with 50 descendants; HOSTKILL SIGKILL of a host with 20 busy kernels and
//! the processes left 2 s later; W7 the penguins notebook end to end;
//! POOL acquire latency of a session's kernel, cold spawn vs warm pool;
//! JOURNAL per-cell cost of the SQLite journal (cells/s with and without);
//! W5 host-call round trip (cell → host → cell) through a trivial tool;
//! IDLE200 200 idle kernels: spawn time, host RSS and RSS per kernel;
//! DAEMON and HTTP round trip of a trivial cell through the daemon CLI, the
//! daemon socket and the HTTP API; HTTP50 50 concurrent HTTP clients of 100
//! cells each (throughput, p99, lost or misattributed output).
//! Peers (`--peers`): ipykernel driven by jupyter_client, a fresh
//! `python -c` per cell, and nbclient, from the interpreter's environment;
//! when it lacks them, from the bench venv the command sets up once
//! (`python/requirements.txt`'s pins, under the cache directory).

mod limits;
mod sessions;
mod stats;
mod surfaces;
mod template;
mod venv;
mod workloads;

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::KernelArgs;
use crate::common::{self, EXIT_USAGE};

pub use workloads::host_for_bench;

/// Every workload this build measures, in run order (W3 first: it resets
/// and reads the host's peak RSS).
pub const ALL: &[&str] = &[
    "W3", "W1", "W2", "W2S", "W2T", "W4", "KILL", "HOSTKILL", "W7", "POOL", "JOURNAL", "W5", "IDLE200",
    "DAEMON", "HTTP", "HTTP50", "MCP", "MCP50",
];

/// Arguments of `bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub kernel: KernelArgs,
    /// Comma-separated workloads (W1, W2, W2S, W2T, W3, W4, KILL, HOSTKILL, W7, POOL,
    /// JOURNAL, W5, IDLE200, DAEMON, HTTP, HTTP50, MCP, MCP50), or `all`.
    #[arg(long, value_name = "LIST", default_value = "W1,W2,W7")]
    pub workload: String,
    /// Also measure the peers: ipykernel + jupyter_client, `python -c`,
    /// nbclient. When the interpreter lacks them, the bench sets up its own
    /// venv with the pinned packages once (~/.cache/cellhost/bench-venv-*)
    /// and runs every workload with it.
    #[arg(long)]
    pub peers: bool,
    /// Cells for W1.
    #[arg(long, default_value_t = 1000)]
    pub cells: usize,
    /// Kernels for W2.
    #[arg(long, default_value_t = 20)]
    pub kernels: usize,
    /// Runs per kind for W4.
    #[arg(long, default_value_t = 100)]
    pub interrupts: usize,
    /// Notebook for W7.
    #[arg(long, default_value = "examples/penguins.ipynb")]
    pub notebook: PathBuf,
    /// Where to write the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub output: PathBuf,
}

/// Runs `bench`; returns the exit code.
pub fn run(mut args: BenchArgs) -> u8 {
    let mut list: Vec<String> = args
        .workload
        .split(',')
        .map(|w| w.trim().to_ascii_uppercase())
        .collect();
    if list.iter().any(|w| w == "ALL") {
        list = ALL.iter().map(|s| s.to_string()).collect();
    }
    if let Some(bad) = list.iter().find(|w| !ALL.contains(&w.as_str())) {
        eprintln!(
            "cellhost: unknown workload {bad} (this build measures {})",
            ALL.join(", ")
        );
        return EXIT_USAGE;
    }
    if args.peers {
        // The peers need the pinned Jupyter stack: set up the bench venv
        // when the interpreter lacks it.
        let python = match cellhost_kernel::resolve_python(args.kernel.python.as_deref()) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        };
        if !venv::has_peers(&python) {
            match venv::ensure(&python) {
                Ok(p) => args.kernel.python = Some(p),
                Err(e) => {
                    eprintln!("cellhost: cannot set up the bench venv: {e}");
                    return 1;
                }
            }
        }
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
    let mut ctx = workloads::Ctx {
        args: &args,
        cfg,
        dir,
        rows: Vec::new(),
        notes: Vec::new(),
    };
    let outcome = rt.block_on(async {
        for w in ALL.iter().filter(|w| list.iter().any(|l| l == *w)) {
            eprintln!("cellhost bench: {w}");
            workloads::run_one(&mut ctx, w).await?;
        }
        Ok::<(), String>(())
    });
    if let Err(e) = outcome {
        eprintln!("cellhost: bench failed: {e}");
        return 1;
    }
    let table = stats::render(&ctx.rows);
    println!("{table}");
    let mut doc = String::from("# Benchmarks\n\n");
    let _ = writeln!(
        doc,
        "Made by `cellhost bench --workload {} {}--python {}` on a 2-core, 24 GiB Debian 12 machine, which is shared and noisy: read the ratios, which compare systems measured in the same run. *ratio* = how many times cellhost is faster: the peer's p50 ÷ cellhost's p50 for times, cellhost's ÷ the peer's for throughputs (MB/s); a row's note says when it compares something else.\n",
        args.workload,
        if args.peers { "--peers " } else { "" },
        ctx.cfg.python.display()
    );
    doc.push_str(&table);
    doc.push('\n');
    for n in &ctx.notes {
        let _ = writeln!(doc, "- {n}");
    }
    doc.push_str(&limits::section(&list));
    if let Err(e) = std::fs::write(&args.output, doc) {
        eprintln!("cellhost: cannot write {}: {e}", args.output.display());
        return 1;
    }
    eprintln!("cellhost: wrote {}", args.output.display());
    0
}
