//! `cellhost-bench [--workload LIST] [--peers] [--python PATH]`: cellhost
//! against its peers in the same run; prints a table of medians, p99 and
//! ratios, and rewrites `BENCHMARKS.md`. A binary of its own, so the bench
//! is not compiled into `cellhost`; `cellhost bench ARGS…` runs it.
//!
//! Workloads: W1 round trip of a trivial cell; W2 spawn to first result
//! (cold); W2S the same with the sandbox off vs auto; W3 1 GB of stdout through the capture path with the host's peak
//! RSS; W4 interrupt-to-settled for `time.sleep`, a Python loop and numpy
//! matmuls, with the other core kept busy; KILL kill-to-reaped of a kernel
//! with 50 descendants; HOSTKILL SIGKILL of a host with 20 busy kernels and
//! the processes left 2 s later; W7 the penguins notebook end to end
//! (`cellhost run`);
//! POOL acquire latency of a session's kernel, cold spawn vs warm pool;
//! JOURNAL per-cell cost of the SQLite journal (cells/s with and without);
//! W5 host-call round trip (cell → host → cell) through a trivial tool;
//! IDLE200 200 idle kernels: spawn time, host RSS and RSS per kernel;
//! DAEMON and HTTP round trip of a trivial cell through the daemon CLI, the
//! daemon socket and `cellhost serve`; HTTP50 50 concurrent HTTP clients of
//! 100 cells each (throughput, p99, lost or misattributed output); MCP and
//! MCP50 the same through `cellhost mcp`; PYSDK a trivial cell through the
//! Python API (`Session.run`) against a raw HTTP request to the same server;
//! CKPT namespace checkpoints of numpy + pandas state (checkpoint cost per
//! cell as a ratio of the cell's own time, restore after SIGKILL, pause and
//! resume, memory a pause frees).
//!
//! The library workloads run kernels in this process (it is their kernel
//! init too); the surfaces (CLI, daemon, HTTP, MCP, `cellhost run`) run the
//! real `cellhost` binary, found next to this one or given by `--cellhost`.
//! Peers (`--peers`): ipykernel driven by jupyter_client, a fresh
//! `python -c` per cell, and nbclient, from the interpreter's environment;
//! when it lacks them, from the bench venv the command sets up once
//! (`python/requirements.txt`'s pins, under the cache directory).

mod as_user;
mod checkpoint;
mod fork;
mod limits;
mod pysdk;
mod remote;
mod remote_scale;
mod rtemplate;
mod sessions;
mod stats;
mod surfaces;
mod template;
mod venv;
mod workloads;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cellhost_kernel::{KernelConfig, resolve_python};
use cellhost_sandbox::profile::SandboxMode;
use cellhost_sessions::Config;
use clap::{Parser, Subcommand};

/// Exit code for usage errors.
const EXIT_USAGE: u8 = 2;

/// Every workload this build measures, in run order (W3 first: it resets
/// and reads the host's peak RSS).
pub const ALL: &[&str] = &[
    "W3", "W1", "W2", "W2S", "W2T", "R2T", "R2TS", "W4", "KILL", "HOSTKILL", "W7", "POOL", "JOURNAL", "W5",
    "IDLE200", "DAEMON", "HTTP", "HTTP50", "MCP", "MCP50", "PYSDK", "FORK", "CKPT",
];

/// The workloads that run the `cellhost` binary.
const NEED_CELLHOST: &[&str] = &["W7", "DAEMON", "HTTP", "HTTP50", "MCP", "MCP50", "PYSDK"];

/// The command line: the bench, or its hidden helper.
#[derive(Debug, Parser)]
#[command(
    name = "cellhost-bench",
    version,
    about = "Measure cellhost against its peers and rewrite BENCHMARKS.md.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    helper: Option<Helper>,
    #[command(flatten)]
    args: BenchArgs,
}

#[derive(Debug, Subcommand)]
enum Helper {
    /// HOSTKILL's host: starts busy kernels, prints their processes, waits
    /// to be killed.
    #[command(name = "__bench-host", hide = true)]
    Host {
        /// Interpreter.
        #[arg(long)]
        python: PathBuf,
        /// Directory for the kernels' session directories.
        #[arg(long)]
        dir: PathBuf,
        /// Kernels to start.
        n: usize,
    },
    /// Remote kernels on loopback: handshakes per second, host RSS with
    /// live remote kernels, trivial-cell round trip local vs remote.
    Remote {
        /// Interpreter (default: as the bench's).
        #[arg(long, value_name = "PATH")]
        python: Option<PathBuf>,
        /// Sandbox mode of the kernels (default: the config's).
        #[arg(long, value_name = "MODE", value_parser = parse_sandbox_mode)]
        sandbox: Option<SandboxMode>,
        /// The `cellhost` binary run as the agent (default: next to this one).
        #[arg(long, value_name = "PATH")]
        cellhost: Option<PathBuf>,
        /// Live remote Python kernels for the RSS figure.
        #[arg(long, default_value_t = 100)]
        kernels: usize,
        /// Handshakes per mode.
        #[arg(long, default_value_t = 1000)]
        handshakes: usize,
        /// Cells per round-trip sample set.
        #[arg(long, default_value_t = 300)]
        cells: usize,
    },
    /// Remote kernels at scale on loopback: a thousand with the stub worker
    /// (`cellhost-stub-worker`, protocol v1 without an interpreter) and a
    /// hundred with real Python workers, every one through `cellhost agent`
    /// and TLS: handshakes per second, host RSS (host alone and total),
    /// the trivial-cell round trip local vs remote, processes left after.
    #[command(name = "remote-scale")]
    RemoteScale {
        /// Interpreter of the Python kernels (default: as the bench's).
        #[arg(long, value_name = "PATH")]
        python: Option<PathBuf>,
        /// Sandbox mode of the kernels (default: the config's).
        #[arg(long, value_name = "MODE", value_parser = parse_sandbox_mode)]
        sandbox: Option<SandboxMode>,
        /// The `cellhost` binary run as the agent (default: next to this one).
        #[arg(long, value_name = "PATH")]
        cellhost: Option<PathBuf>,
        /// The stub worker (default: `cellhost-stub-worker` next to this one).
        #[arg(long, value_name = "PATH")]
        stub: Option<PathBuf>,
        /// Remote kernels with the stub worker.
        #[arg(long, default_value_t = 1000)]
        stub_kernels: usize,
        /// Remote kernels with real Python workers, started on top.
        #[arg(long, default_value_t = 100)]
        python_kernels: usize,
        /// Kernels starting at once (more than the listener's 64 pending
        /// handshakes: the agents turned away must dial again).
        #[arg(long, default_value_t = 128)]
        starting: usize,
        /// Cells per round-trip sample set.
        #[arg(long, default_value_t = 300)]
        cells: usize,
        /// TLS handshakes + admissions for the rate.
        #[arg(long, default_value_t = 1000)]
        handshakes: usize,
        /// Replace (or add) this workload's section of this Markdown file
        /// (`BENCHMARKS.md`), keeping the rest; default: print only.
        #[arg(long, value_name = "PATH")]
        output: Option<PathBuf>,
    },
}

/// Arguments of the bench.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Interpreter of the kernels (and of the peers); default: the config
    /// file's `python`, else python3 on PATH, resolved to its real
    /// executable.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// R of the R workloads (R2T, R2TS); default: R on PATH.
    #[arg(long, value_name = "PATH")]
    pub r: Option<PathBuf>,
    /// Sandbox mode of the kernels this process starts: `off`, `auto` or
    /// `enforce` (default: the config file's).
    #[arg(long, value_name = "MODE", value_parser = parse_sandbox_mode)]
    pub sandbox: Option<SandboxMode>,
    /// Config file (TOML), for this process's kernels and for the `cellhost
    /// run` and `cellhost mcp` it starts; default: `CELLHOST_CONFIG`, else
    /// `~/.config/cellhost/config.toml` when it exists. The daemon and HTTP
    /// workloads run their servers with an empty config of their own.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// The `cellhost` binary the surface workloads (W7, DAEMON, HTTP,
    /// HTTP50, MCP, MCP50, PYSDK) run; default: `cellhost` next to this
    /// executable.
    #[arg(long, value_name = "PATH")]
    pub cellhost: Option<PathBuf>,
    /// Comma-separated workloads (W1, W2, W2S, W2T, R2T, R2TS, W3, W4, KILL, HOSTKILL, W7, POOL,
    /// JOURNAL, W5, IDLE200, DAEMON, HTTP, HTTP50, MCP, MCP50, PYSDK, FORK, CKPT), or `all`.
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
    /// Notebook for W7; default: the penguins notebook built into this
    /// binary (examples/penguins.ipynb), written to a scratch directory.
    #[arg(long, value_name = "PATH")]
    pub notebook: Option<PathBuf>,
    /// Where to write the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub output: PathBuf,
    /// Run as root only: also run the library workloads asked for (W1, W2,
    /// W2S, W2T, W4, KILL, POOL) as the local user NAME, with the same
    /// interpreter (which NAME must be able to run, say a venv under
    /// /var/tmp), sandbox mode and sample counts; NAME's rows go beside
    /// root's with the ratio of the medians.
    #[arg(long, value_name = "NAME")]
    pub as_user: Option<String>,
    /// Also write the rows as JSON to PATH (used by --as-user).
    #[arg(long, value_name = "PATH", hide = true)]
    pub rows_json: Option<PathBuf>,
}

fn parse_sandbox_mode(s: &str) -> Result<SandboxMode, String> {
    s.parse()
}

fn main() -> ExitCode {
    // Kernels this process starts run it as their init: handle that before
    // anything else (no threads, no runtime).
    cellhost_sandbox::launcher::run_if_requested();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let code = match cli.helper {
        Some(Helper::Host { python, dir, n }) => workloads::host_for_bench(&python, &dir, n),
        Some(Helper::Remote {
            python,
            sandbox,
            cellhost,
            kernels,
            handshakes,
            cells,
        }) => {
            let args = BenchArgs {
                python,
                sandbox,
                ..cli.args
            };
            let dir = std::env::temp_dir().join(format!("cellhost-bench-remote-{}", std::process::id()));
            let cfg = match kernel_config(&args, &dir) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("cellhost-bench: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let bin = match cellhost_binary(cellhost.as_deref()) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("cellhost-bench: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let code = remote::run(cfg, &bin, kernels, handshakes, cells);
            let _ = std::fs::remove_dir_all(&dir);
            code
        }
        Some(Helper::RemoteScale {
            python,
            sandbox,
            cellhost,
            stub,
            stub_kernels,
            python_kernels,
            starting,
            cells,
            handshakes,
            output,
        }) => {
            let command = format!(
                "cellhost bench remote-scale{}{} --stub-kernels {stub_kernels} --python-kernels {python_kernels} --starting {starting} --cells {cells} --handshakes {handshakes}{}",
                python
                    .as_ref()
                    .map(|p| format!(" --python {}", p.display()))
                    .unwrap_or_default(),
                sandbox.map(|m| format!(" --sandbox {m}")).unwrap_or_default(),
                output
                    .as_ref()
                    .map(|p| format!(" --output {}", p.display()))
                    .unwrap_or_default(),
            );
            let args = BenchArgs {
                python,
                sandbox,
                ..cli.args
            };
            let dir = std::env::temp_dir().join(format!("cellhost-bench-scale-{}", std::process::id()));
            let cfg = match kernel_config(&args, &dir) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("cellhost-bench: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let bins =
                cellhost_binary(cellhost.as_deref()).and_then(|c| Ok((c, stub_binary(stub.as_deref())?)));
            let (cellhost, stub) = match bins {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("cellhost-bench: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let code = remote_scale::run(
                cfg,
                remote_scale::ScaleArgs {
                    stub_kernels,
                    python_kernels,
                    starting,
                    cells,
                    handshakes,
                    cellhost,
                    stub,
                    command,
                    output,
                },
            );
            let _ = std::fs::remove_dir_all(&dir);
            code
        }
        None => run(cli.args),
    };
    ExitCode::from(code)
}

/// A multi-threaded runtime for the bench (two workers, as the CLI's).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// The kernel configuration of the bench's own kernels: the config file,
/// then `--python` and `--sandbox`, session `bench`, files under `dir`.
///
/// # Errors
/// The config file cannot be read or is invalid, or the interpreter cannot
/// be found (the message says which).
fn kernel_config(args: &BenchArgs, dir: &Path) -> Result<KernelConfig, String> {
    let config = Config::load(args.config.as_deref()).map_err(|e| e.to_string())?;
    let python =
        resolve_python(args.python.as_deref().or(config.python().as_deref())).map_err(|e| e.to_string())?;
    if !python.is_file() {
        return Err(format!("{}: no such interpreter", python.display()));
    }
    let mut cfg = KernelConfig::new(python, dir);
    config.apply_to_kernel(&mut cfg);
    if let Some(mode) = args.sandbox {
        cfg.sandbox.mode = mode;
    }
    cfg.session = "bench".into();
    Ok(cfg)
}

/// The `cellhost` binary: `given`, else `cellhost` next to this executable.
///
/// # Errors
/// This executable's path is unknown, or there is no such file (the
/// message names the path and how to build it).
fn cellhost_binary(given: Option<&Path>) -> Result<PathBuf, String> {
    let path = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot locate this executable: {e}"))?
            .with_file_name("cellhost"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "the cellhost binary {} is missing: build it with `cargo build --release -p cellhost`, or pass --cellhost PATH",
            path.display()
        ))
    }
}

/// The stub worker: `given`, else `cellhost-stub-worker` next to this
/// executable.
///
/// # Errors
/// This executable's path is unknown, or there is no such file.
fn stub_binary(given: Option<&Path>) -> Result<PathBuf, String> {
    let path = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot locate this executable: {e}"))?
            .with_file_name("cellhost-stub-worker"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "the stub worker {} is missing: build it with `cargo build -p cellhost-bench`, or pass --stub PATH",
            path.display()
        ))
    }
}

/// Runs the bench; returns the exit code.
pub fn run(args: BenchArgs) -> u8 {
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
            "cellhost-bench: unknown workload {bad} (this build measures {})",
            ALL.join(", ")
        );
        return EXIT_USAGE;
    }
    let as_user = match &args.as_user {
        None => None,
        Some(_) if !rustix::process::geteuid().is_root() => {
            eprintln!("cellhost-bench: --as-user needs root (it runs the workloads again as that user)");
            return EXIT_USAGE;
        }
        Some(name) => {
            let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
            match as_user::find_account(&passwd, name) {
                Some(a) if a.uid != 0 => Some(a),
                Some(_) => {
                    eprintln!("cellhost-bench: --as-user {name}: that is root");
                    return EXIT_USAGE;
                }
                None => {
                    eprintln!("cellhost-bench: --as-user {name}: no such user in /etc/passwd");
                    return EXIT_USAGE;
                }
            }
        }
    };
    let cellhost = if list.iter().any(|w| NEED_CELLHOST.contains(&w.as_str())) {
        match cellhost_binary(args.cellhost.as_deref()) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("cellhost-bench: {e}");
                return 1;
            }
        }
    } else {
        PathBuf::from("cellhost")
    };
    let scratch = match tempfile::Builder::new().prefix("cellhost-bench-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cellhost-bench: cannot make a scratch directory: {e}");
            return 1;
        }
    };
    let dir = scratch.path().to_path_buf();
    let mut cfg = match kernel_config(&args, &dir.join("kernels")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cellhost-bench: {e}");
            return 1;
        }
    };
    if args.peers && !venv::has_peers(&cfg.python) {
        // The peers need the pinned Jupyter stack: set up the bench venv
        // when the interpreter lacks it.
        match venv::ensure(&cfg.python) {
            Ok(p) => cfg.python = p,
            Err(e) => {
                eprintln!("cellhost-bench: cannot set up the bench venv: {e}");
                return 1;
            }
        }
    }
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost-bench: {e}");
            return 1;
        }
    };
    let mut ctx = workloads::Ctx {
        args: &args,
        cfg,
        dir,
        cellhost,
        rows: Vec::new(),
        notes: Vec::new(),
    };
    // Each workload on its own: one that cannot run (say W2T without the
    // stack it imports) is named in the report with the reason, and the
    // others still run. The report is rewritten after every workload, so
    // an interrupted run keeps what it measured.
    let mut failed: Vec<String> = Vec::new();
    for w in ALL.iter().filter(|w| list.iter().any(|l| l == *w)) {
        eprintln!("cellhost-bench: {w}");
        if let Err(e) = rt.block_on(workloads::run_one(&mut ctx, w)) {
            eprintln!("cellhost-bench: {w} did not run: {e}");
            ctx.notes.push(format!("{w} did not run: {e}"));
            failed.push((*w).to_string());
        }
        if let Err(e) = std::fs::write(&args.output, report(&args, &ctx, &list)) {
            eprintln!("cellhost-bench: cannot write {}: {e}", args.output.display());
            return 1;
        }
    }
    if let Some(who) = &as_user {
        let theirs: Vec<String> = ALL
            .iter()
            .filter(|w| as_user::AS_USER.contains(w) && list.iter().any(|l| l == *w))
            .map(|w| w.to_string())
            .collect();
        if !theirs.is_empty() {
            eprintln!(
                "cellhost-bench: {} as {} (uid {})",
                theirs.join(","),
                who.name,
                who.uid
            );
            match as_user::run_as(&args, &ctx.cfg.python, who, &theirs) {
                Ok((rows, missing)) => {
                    as_user::merge(&mut ctx.rows, rows, who);
                    for m in missing {
                        eprintln!("cellhost-bench: {m}");
                        ctx.notes.push(m);
                    }
                }
                Err(e) => {
                    eprintln!("cellhost-bench: as {}: {e}", who.name);
                    ctx.notes
                        .push(format!("the run as {} did not complete: {e}", who.name));
                    failed.push(format!("as {}", who.name));
                }
            }
        }
    }
    if let Some(path) = &args.rows_json
        && let Err(e) = std::fs::write(path, as_user::rows_json(&ctx.rows).to_string())
    {
        eprintln!("cellhost-bench: cannot write {}: {e}", path.display());
        return 1;
    }
    println!("{}", stats::render(&ctx.rows));
    if let Err(e) = std::fs::write(&args.output, report(&args, &ctx, &list)) {
        eprintln!("cellhost-bench: cannot write {}: {e}", args.output.display());
        return 1;
    }
    if !failed.is_empty() {
        eprintln!(
            "cellhost-bench: wrote {}; workloads that did not run: {}",
            args.output.display(),
            failed.join(", ")
        );
        return 1;
    }
    eprintln!("cellhost-bench: wrote {}", args.output.display());
    0
}

/// The report as it stands: the command, the table of `ctx.rows`, the
/// notes (a workload that did not run among them, with the reason) and the
/// limits section of the workloads in `list`.
fn report(args: &BenchArgs, ctx: &workloads::Ctx<'_>, list: &[String]) -> String {
    let mut doc = String::from("# Benchmarks\n\n");
    let _ = writeln!(
        doc,
        "Made by `cellhost bench --workload {} {}{}--python {}` on a 2-core, 24 GiB Debian 12 machine, which is shared and noisy: read the ratios, which compare systems measured in the same run. *ratio* = how many times cellhost is faster: the peer's p50 ÷ cellhost's p50 for times, cellhost's ÷ the peer's for throughputs (MB/s); a row's note says when it compares something else.\n",
        args.workload,
        if args.peers { "--peers " } else { "" },
        args.as_user
            .as_ref()
            .map(|u| format!("--as-user {u} "))
            .unwrap_or_default(),
        ctx.cfg.python.display()
    );
    doc.push_str(&stats::render(&ctx.rows));
    doc.push('\n');
    for n in &ctx.notes {
        let _ = writeln!(doc, "- {n}");
    }
    doc.push_str(&limits::section(list));
    // The R figures come from scripts outside this bench (IRkernel through
    // jupyter_client and nbclient); a rewrite keeps them.
    doc.push_str(R_RESULTS);
    doc
}

/// The R section of the report: `bench/r/RESULTS.md`, made by
/// `scripts/corpus/r_corpus.py` and `bench/r/latency_vs_irkernel.py`.
const R_RESULTS: &str = include_str!("../../../bench/r/RESULTS.md");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_cellhost_binary_is_named_with_the_build_command() {
        let e = cellhost_binary(Some(Path::new("/nonexistent/cellhost"))).expect_err("missing binary");
        assert!(e.contains("/nonexistent/cellhost"), "{e}");
        assert!(e.contains("cargo build --release -p cellhost"), "{e}");
    }

    #[test]
    fn the_hidden_host_helper_parses_and_conflicts_with_bench_options() {
        let cli = Cli::try_parse_from([
            "cellhost-bench",
            "__bench-host",
            "--python",
            "/p",
            "--dir",
            "/d",
            "3",
        ])
        .expect("helper parses");
        assert!(matches!(cli.helper, Some(Helper::Host { n: 3, .. })));
        let cli = Cli::try_parse_from(["cellhost-bench", "--workload", "W1"]).expect("bench parses");
        assert!(cli.helper.is_none() && cli.args.notebook.is_none());
        assert!(
            Cli::try_parse_from([
                "cellhost-bench",
                "--cells",
                "3",
                "__bench-host",
                "--python",
                "/p",
                "--dir",
                "/d",
                "1"
            ])
            .is_err()
        );
    }
}
