//! `cellhost`: run code cells and notebooks in persistent, supervised
//! Python kernels.
//!
//! Exit codes of `exec` (and of `run` when it stops at a cell): 0 ok,
//! 1 error, 2 usage, 124 timeout, 130 interrupted, 137 crashed.

mod bench;
mod cmd_exec;
mod cmd_output;
mod cmd_repl;
mod cmd_run;
mod common;
mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Persistent, supervised code kernels for agents and people.
#[derive(Debug, Parser)]
#[command(name = "cellhost", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one cell and print its output (exit code = status).
    Exec(cmd_exec::ExecArgs),
    /// Execute a notebook (.ipynb) or a percent-format script (.py).
    Run(cmd_run::RunArgs),
    /// Interactive session: Ctrl-C interrupts the running cell.
    Repl(cmd_repl::ReplArgs),
    /// Page through a cell's spilled output by byte offset.
    Output(cmd_output::OutputArgs),
    /// Measure cellhost against its peers and rewrite BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// Bench helper: a host with busy kernels, killed by `bench`.
    #[command(name = "__bench-host", hide = true)]
    BenchHost {
        /// Interpreter.
        #[arg(long)]
        python: PathBuf,
        /// Kernels to start.
        n: usize,
    },
}

/// Options shared by every command that starts a kernel.
#[derive(Debug, Clone, clap::Args)]
pub struct KernelArgs {
    /// Interpreter to run (any venv or conda env); default: python3 on PATH,
    /// resolved to its real executable.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
}

fn main() -> ExitCode {
    // The kernel init is a hidden subcommand of this binary: handle it before
    // anything else (no threads, no runtime).
    cellhost_sandbox::launcher::run_if_requested();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("CELLHOST_LOG"))
        .with_writer(std::io::stderr)
        .try_init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let code = match cli.command {
        Cmd::Exec(a) => cmd_exec::run(a),
        Cmd::Run(a) => cmd_run::run(a),
        Cmd::Repl(a) => cmd_repl::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::BenchHost { python, n } => bench::host_for_bench(&python, n),
        Cmd::Output(a) => cmd_output::run(a),
    };
    ExitCode::from(code)
}
