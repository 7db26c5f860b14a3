//! `cellhost`: run code cells and notebooks in persistent, supervised
//! Python kernels.
//!
//! Exit codes of `exec` (and of `run` when it stops at a cell): 0 ok,
//! 1 error, 2 usage, 124 timeout, 130 interrupted, 137 crashed.

mod cmd_agent;
mod cmd_bench;
mod cmd_config;
mod cmd_cp;
mod cmd_daemon;
mod cmd_doctor;
mod cmd_exec;
mod cmd_fork;
mod cmd_history;
mod cmd_install;
mod cmd_mcp;
mod cmd_output;
mod cmd_repl;
mod cmd_restore;
mod cmd_run;
mod cmd_serve;
mod cmd_sessions;
mod cmd_wait;
mod common;
mod limit_args;
mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Persistent, supervised code kernels for agents and people.
#[derive(Debug, Parser)]
#[command(name = "cellhost", version, about)]
struct Cli {
    /// Config file (TOML); default: `CELLHOST_CONFIG`, else
    /// `~/.config/cellhost/config.toml` when it exists.
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
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
    /// Print the effective configuration and where each value came from.
    Config(cmd_config::ConfigArgs),
    /// Show a session's journaled cells.
    History(cmd_history::HistoryArgs),
    /// Rebuild a session by replaying its successful cells into a new kernel.
    Restore(cmd_restore::RestoreArgs),
    /// Fork a live, idle daemon session into a new session with its state.
    Fork(cmd_fork::ForkArgs),
    /// Serve the MCP tools (execute_code, interrupt, restart, list_variables,
    /// read_output, list_sessions, write_file, read_file, list_files,
    /// submit_code, get_cell, cancel_cell, install_packages, fork_session) on stdin/stdout; logs go to stderr.
    Mcp(cmd_mcp::McpArgs),
    /// Serve the HTTP API (and MCP at /mcp) behind bearer tokens.
    Serve(cmd_serve::ServeArgs),
    /// The per-user daemon behind `exec --session` (`run`, `stop`, `status`).
    Daemon(cmd_daemon::DaemonArgs),
    /// List the daemon's sessions (`exec --session NAME`).
    Sessions(cmd_sessions::SessionsArgs),
    /// Kill a daemon session's kernel and forget the session.
    Kill(cmd_sessions::NameArgs),
    /// Interrupt the running cell of a daemon session.
    Interrupt(cmd_sessions::NameArgs),
    /// Pause a daemon session: its namespace checkpointed, its kernel
    /// stopped (memory freed); the next `exec --session NAME` resumes it,
    /// also after the daemon restarted.
    Pause(cmd_sessions::NameArgs),
    /// Copy a file into or out of a daemon session's working directory
    /// (`cp LOCAL SESSION:PATH`, `cp SESSION:PATH LOCAL`).
    Cp(cmd_cp::CpArgs),
    /// Install packages into a daemon session: the host runs the installer
    /// into the session's overlay; the kernel stays offline.
    Install(cmd_install::InstallArgs),
    /// Wait for a cell submitted with `exec --session NAME --detach` and
    /// print its result (exit code = status, as `exec`).
    Wait(cmd_wait::WaitArgs),
    /// Check which sandbox layers this machine enforces, by a real self-test
    /// (exit 0 when everything mode `enforce` needs is available).
    Doctor(cmd_doctor::DoctorArgs),
    /// Measure cellhost against its peers and rewrite BENCHMARKS.md (runs
    /// `cellhost-bench`, next to this binary; `cellhost bench --help` lists
    /// its options).
    #[command(disable_help_flag = true)]
    Bench(cmd_bench::BenchArgs),
    /// The node agent of a remote kernel (a placement starts it on the
    /// compute node): dials the host, runs the worker here, relays it.
    Agent(cmd_agent::AgentArgs),
}

/// Options shared by every command that starts a kernel.
#[derive(Debug, Clone, clap::Args)]
pub struct KernelArgs {
    /// Interpreter to run (any venv or conda env); default: python3 on PATH,
    /// resolved to its real executable.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Language of the kernel: `python` (default) or `r`. With
    /// `--session`, the session keeps the language it was created with.
    #[arg(long, value_name = "NAME")]
    pub language: Option<String>,
    /// R interpreter for `--language r` (default: config `r`, else `R` on
    /// PATH).
    #[arg(long = "r", value_name = "PATH")]
    pub r: Option<PathBuf>,
    /// Sandbox mode: `off`, `auto` (default: apply what this machine
    /// supports, report the rest) or `enforce` (refuse to start a kernel
    /// when a layer is missing).
    #[arg(long, value_name = "MODE", value_parser = parse_sandbox_mode)]
    pub sandbox: Option<cellhost_sandbox::profile::SandboxMode>,
    /// Give the kernel an environment variable: `NAME=VALUE`, or `NAME` to
    /// pass the host's value (the kernel's environment is an allowlist).
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// Pass the host's variable NAME to the kernel and register its value
    /// as a secret: it is masked in everything the kernel outputs.
    #[arg(long = "secret-env", value_name = "NAME")]
    pub secret_env: Vec<String>,
    /// Where the kernel runs: `local` (default: config `placement`) or the
    /// name of a `[placement.NAME]` table (a node agent started by that
    /// placement dials back over TLS).
    #[arg(long, value_name = "NAME")]
    pub placement: Option<String>,
    /// Network of the kernel: `off` (default: a private loopback only),
    /// `on` (the host's network), or an allowlist of `HOST[:PORT]` rules
    /// separated by commas (`api.openai.com:443,*.githubusercontent.com`;
    /// no port: 443 and 80), reached through the host's egress proxy.
    /// With `--session`, the policy of a session this call creates (a
    /// running session keeps its own); otherwise the default of the
    /// command's sessions.
    #[arg(long, value_name = "off|on|HOST[:PORT],...", value_parser = parse_network)]
    pub network: Option<cellhost_kernel::egress::NetworkPolicy>,
    /// Checkpoints of the session: `off`, `namespace` (the picklable part
    /// of the namespace after each successful cell; a lost kernel is
    /// restored from it before the next cell) or `process` (CRIU; refused
    /// with the reason where it cannot run). With `--session`, the
    /// session's mode; for `daemon`, `serve` and `mcp`, the default of
    /// their sessions (over config `checkpoint.mode`).
    #[arg(long, value_name = "off|namespace|process")]
    pub checkpoint: Option<cellhost_sessions::CheckpointMode>,
    /// What a session gets back after an unexpected death of its kernel:
    /// `checkpoint` (its latest checkpoint), `replay` (the checkpoint if
    /// any, then the lost kernel's journaled successful cells after it,
    /// run again silently, stopping at the first that fails) or `none`.
    /// With `--session`, the session's mode; for `daemon`, `serve` and
    /// `mcp`, the default of their sessions (over config `restore.mode`).
    #[arg(long, value_name = "checkpoint|replay|none")]
    pub restore: Option<cellhost_sessions::RestoreMode>,
}

fn parse_network(s: &str) -> Result<cellhost_kernel::egress::NetworkPolicy, String> {
    cellhost_kernel::egress::NetworkPolicy::parse(s).map_err(|e| e.to_string())
}

fn parse_sandbox_mode(s: &str) -> Result<cellhost_sandbox::profile::SandboxMode, String> {
    s.parse()
}

fn main() -> ExitCode {
    // The kernel init is a hidden subcommand of this binary: handle it before
    // anything else (no threads, no runtime).
    cellhost_sandbox::launcher::run_if_requested();
    // Warnings (a template not used and why, say) show without
    // CELLHOST_LOG; it raises or lowers the level as usual.
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .with_env_var("CELLHOST_LOG")
        .from_env_lossy();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
    common::set_config_path(cli.config.clone());
    let code = match cli.command {
        Cmd::Exec(a) => cmd_exec::run(a),
        Cmd::Run(a) => cmd_run::run(a),
        Cmd::Repl(a) => cmd_repl::run(a),
        Cmd::Bench(a) => cmd_bench::run(a),
        Cmd::Doctor(a) => cmd_doctor::run(a),
        Cmd::Serve(a) => cmd_serve::run(a),
        Cmd::Cp(a) => cmd_cp::run(a),
        Cmd::Install(a) => cmd_install::run(a),
        Cmd::Wait(a) => cmd_wait::run(a),
        Cmd::Daemon(a) => cmd_daemon::run(a),
        Cmd::Sessions(a) => cmd_sessions::sessions(a),
        Cmd::Kill(a) => cmd_sessions::kill(a),
        Cmd::Interrupt(a) => cmd_sessions::interrupt(a),
        Cmd::Pause(a) => cmd_sessions::pause(a),
        Cmd::Output(a) => cmd_output::run(a),
        Cmd::Config(a) => cmd_config::run(a),
        Cmd::History(a) => cmd_history::run(a),
        Cmd::Restore(a) => cmd_restore::run(a),
        Cmd::Fork(a) => cmd_fork::run(a),
        Cmd::Mcp(a) => cmd_mcp::run(a),
        Cmd::Agent(a) => cmd_agent::run(a),
    };
    // A font-cache build a kernel of this command started is finished
    // (once per interpreter), never cut short by the exit nor left behind.
    cellhost_kernel::worker_files::wait_for_asset_builds(std::time::Duration::from_secs(30));
    ExitCode::from(code)
}
