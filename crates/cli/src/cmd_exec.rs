//! `cellhost exec [--python PATH] [--timeout SECONDS] [--json] CODE`.

use std::io::Read;

use cellhost_kernel::{ExecOptions, Session};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::KernelArgs;
use crate::common::{self, EXIT_USAGE};
use crate::render;

/// Arguments of `exec`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    #[command(flatten)]
    kernel: KernelArgs,
    /// Deadline in seconds (default 300; 0 = none). At the deadline the cell
    /// is interrupted, then killed after a 2 s grace.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Print the CellResult as JSON instead of the output.
    #[arg(long)]
    json: bool,
    /// Run the cell in this named session of the per-user daemon (started
    /// on first use): its state persists across `exec` invocations until
    /// `cellhost kill NAME` or the daemon's idle exit.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    /// The code to run; `-` reads it from stdin.
    #[arg(value_name = "CODE")]
    code: String,
}

/// Runs `exec`; returns the process exit code.
pub fn run(args: ExecArgs) -> u8 {
    let code = if args.code == "-" {
        let mut s = String::new();
        if let Err(e) = std::io::stdin().read_to_string(&mut s) {
            eprintln!("cellhost: cannot read the code from stdin: {e}");
            return EXIT_USAGE;
        }
        s
    } else {
        args.code.clone()
    };
    let timeout = match common::parse_timeout(args.timeout) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    if let Some(session) = args.session {
        return crate::cmd_sessions::exec(&args.kernel, session, code, args.timeout, args.json);
    }
    common::block_on(async move {
        // Listen for Ctrl-C before the kernel starts: a SIGINT that arrives
        // while the kernel is starting is recorded and interrupts the cell
        // once it is submitted, instead of killing this process by signal
        // (no result, no JSON, exit by SIGINT rather than 130).
        let sigint = match signal(SignalKind::interrupt()) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("cellhost: cannot listen for Ctrl-C: {e}");
                None
            }
        };
        let dir = common::new_session_dir("exec");
        let cfg = match common::kernel_config(&args.kernel, "exec", &dir) {
            Ok(c) => c,
            Err(e) => {
                // A missing interpreter or a bad configuration is the
                // caller's mistake, not the cell's: exit 2, never 1.
                eprintln!("cellhost: {e}");
                return EXIT_USAGE;
            }
        };
        let mut session = Session::new(cfg);
        session.set_cell_timeout(timeout);
        let (tx, rx) = mpsc::unbounded_channel();
        let opts = ExecOptions {
            live: (!args.json).then_some(tx),
            ..Default::default()
        };
        let printer = tokio::spawn(render::print_live(rx));
        let result = match session.submit(&code, opts).await {
            Ok(handle) => {
                // Ctrl-C interrupts the cell (a second one during the grace
                // is answered by the escalation already under way).
                let kernel = session.kernel().cloned();
                let watcher = tokio::spawn(async move {
                    let Some(mut sigint) = sigint else { return };
                    while sigint.recv().await.is_some() {
                        if let Some(k) = &kernel {
                            k.interrupt().await;
                        }
                    }
                });
                let r = session.finish(handle).await;
                watcher.abort();
                r
            }
            Err(e) => Err(e),
        };
        let printed = printer.await.unwrap_or_default();
        session.shutdown().await;
        match result {
            Ok(r) => render::finish_streamed(&printed, &r, args.json),
            Err(e) => {
                eprintln!("cellhost: {e}");
                1
            }
        }
    })
}
