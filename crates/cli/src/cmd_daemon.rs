//! `cellhost daemon run|stop|status`: the per-user daemon that keeps
//! `exec --session` sessions alive across invocations, and the client side
//! used by `exec --session`, `sessions`, `kill` and `interrupt`.

use std::path::PathBuf;
use std::time::Duration;

use cellhost_server::daemon::{self, Client, Reply, Request};

use crate::KernelArgs;
use crate::common::{self, EXIT_USAGE};

/// Arguments of `daemon`.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    #[command(subcommand)]
    cmd: DaemonCmd,
}

#[derive(Debug, clap::Subcommand)]
enum DaemonCmd {
    /// Run the daemon in the foreground (`exec --session` starts it
    /// detached on first use).
    Run {
        #[command(flatten)]
        kernel: KernelArgs,
        /// Exit after this many seconds without a connection (default:
        /// `CELLHOST_DAEMON_IDLE_S`, else 1800).
        #[arg(long, value_name = "SECONDS")]
        idle_timeout: Option<f64>,
    },
    /// Stop the daemon (every kernel is killed, the journal flushed).
    Stop,
    /// Say whether the daemon runs, and where its socket is.
    Status,
}

/// The daemon's directory: `$XDG_RUNTIME_DIR/cellhost` when usable, else
/// `STATE_DIR/run`, else `/tmp/cellhost-<uid>`.
pub fn dir() -> PathBuf {
    daemon::runtime_dir(&common::state_dir())
}

fn idle_default() -> Duration {
    std::env::var("CELLHOST_DAEMON_IDLE_S")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(daemon::DEFAULT_IDLE)
}

/// Starts `cellhost daemon run` detached (own process group, output to
/// `daemon.log` in the daemon's directory), forwarding the kernel options.
fn spawn_daemon(kernel: &KernelArgs) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let d = dir();
    cellhost_server::rundir::prepare(&d)?;
    let log_path = d.join("daemon.log");
    // The log keeps the last daemons' lines; past 1 MiB it starts over.
    let big = std::fs::metadata(&log_path).is_ok_and(|m| m.len() > 1 << 20);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(!big)
        .write(true)
        .truncate(big)
        .open(&log_path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", log_path.display())))?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    if let Some(c) = common::config_path() {
        cmd.arg("--config").arg(c);
    }
    cmd.args(["daemon", "run"]);
    if let Some(p) = &kernel.python {
        cmd.arg("--python").arg(p);
    }
    if let Some(m) = kernel.sandbox {
        cmd.arg("--sandbox").arg(m.to_string());
    }
    // `--env`/`--secret-env` are not the daemon's: they travel with each
    // request and belong to the session it creates (never to every other
    // session of the daemon).
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .process_group(0);
    // The daemon outlives this client and serves others: it must keep none
    // of this client's descriptors (and hand none to its kernels).
    cellhost_sandbox::fds::close_inherited_on_exec(&mut cmd);
    cmd.spawn()
}

/// Connects to the daemon, starting it first if none answers.
pub async fn connect(kernel: &KernelArgs) -> std::io::Result<Client> {
    let d = dir();
    let log = d.join("daemon.log");
    Client::connect_or_start(&d, Duration::from_secs(30), Some(&log), || spawn_daemon(kernel)).await
}

/// Runs `daemon`.
pub fn run(args: DaemonArgs) -> u8 {
    match args.cmd {
        DaemonCmd::Run { kernel, idle_timeout } => run_daemon(&kernel, idle_timeout),
        DaemonCmd::Stop => stop(),
        DaemonCmd::Status => client_call(Request::Ping),
    }
}

/// How long `daemon stop` waits for the daemon to exit.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Runs `daemon stop`: asks the daemon to stop and returns once it has
/// exited (its kernels killed, the journal flushed), so a daemon started
/// right after finds none in its way. Exit 1 when it has not exited within
/// [`STOP_WAIT`].
fn stop() -> u8 {
    common::block_on(async move {
        let mut c = match Client::connect(&dir()).await {
            Ok(c) => c,
            Err(_) => {
                println!("no daemon is running ({})", daemon::socket_path(&dir()).display());
                return 0;
            }
        };
        // Pinned before asking: the pidfd names this daemon, whatever pid
        // reuse comes later.
        let pidfd = match c.daemon_pidfd() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("cellhost: cannot watch the daemon: {e}");
                return 1;
            }
        };
        match common::daemon_reply(c.call(&Request::Stop).await) {
            Ok(Reply::Ok { message }) => println!("daemon: {message}"),
            Ok(other) => return common::unexpected_reply(&other),
            Err(code) => return code,
        }
        drop(c);
        match daemon::wait_exit(pidfd, STOP_WAIT).await {
            Ok(true) => {
                println!("daemon: stopped");
                0
            }
            Ok(false) => {
                eprintln!(
                    "cellhost: the daemon has not exited within {} s (see {})",
                    STOP_WAIT.as_secs(),
                    dir().join("daemon.log").display()
                );
                1
            }
            Err(e) => {
                eprintln!("cellhost: cannot wait for the daemon: {e}");
                1
            }
        }
    })
}

/// Sends one request to a running daemon (never starts one) and prints the
/// reply; returns the exit code.
fn client_call(req: Request) -> u8 {
    common::block_on(async move {
        let mut c = match Client::connect(&dir()).await {
            Ok(c) => c,
            Err(_) => {
                println!("no daemon is running ({})", daemon::socket_path(&dir()).display());
                return 0;
            }
        };
        match common::daemon_reply(c.call(&req).await) {
            Ok(Reply::Ok { message }) => {
                println!("daemon: {message}");
                0
            }
            Ok(other) => common::unexpected_reply(&other),
            Err(code) => code,
        }
    })
}

fn run_daemon(kernel: &KernelArgs, idle: Option<f64>) -> u8 {
    // Started by hand (`cellhost daemon run 7<file`): whatever descriptor it
    // was given stays out of every child it starts.
    cellhost_sandbox::fds::cloexec_all();
    let idle = match idle {
        None => idle_default(),
        Some(s) if s.is_finite() && s > 0.0 => match Duration::try_from_secs_f64(s) {
            Ok(d) => d,
            Err(_) => {
                eprintln!("cellhost: --idle-timeout {s} is too large");
                return EXIT_USAGE;
            }
        },
        Some(s) => {
            eprintln!("cellhost: --idle-timeout must be > 0, got {s}");
            return EXIT_USAGE;
        }
    };
    let mut template = match common::kernel_config(kernel, "daemon", &common::new_session_dir("daemon")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    // The directory the daemon was started from is no session's: each
    // request names its caller's (or none: the session directory).
    template.cwd = None;
    common::block_on(async move {
        let reg = match common::start_registry(template, None, false, None).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        };
        let d = dir();
        eprintln!(
            "cellhost daemon {} on {} (exits after {} s idle)",
            std::process::id(),
            daemon::socket_path(&d).display(),
            idle.as_secs_f64()
        );
        match daemon::run(reg, &d, idle).await {
            Ok(reason) => {
                eprintln!("cellhost daemon {} stopped: {reason:?}", std::process::id());
                0
            }
            Err(e) => {
                eprintln!("cellhost daemon: {e}");
                1
            }
        }
    })
}
