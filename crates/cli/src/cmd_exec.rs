//! `cellhost exec [--python PATH] [--timeout SECONDS] [--json] CODE`.

use std::io::Read;

use std::time::Duration;

use cellhost_sessions::requests::ExecuteRequest;
use cellhost_sessions::{Origin, SessionSpec};
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
    #[command(flatten)]
    limits: crate::limit_args::LimitArgs,
    /// Deadline in seconds (default: `cell_timeout_s` of the configuration,
    /// 300 unless set; 0 = none). At the deadline the cell is interrupted,
    /// then killed after a 2 s grace.
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
    /// With `--session`: wait behind a cell the session is running instead
    /// of failing at once with `session_busy`.
    #[arg(long, requires = "session")]
    queue: bool,
    /// With `--session`: submit the cell and print its id at once; it runs
    /// in the daemon after the session's earlier submitted cells, and
    /// `cellhost wait ID` prints its result.
    #[arg(long, requires = "session", conflicts_with = "queue")]
    detach: bool,
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
    let deadline = match common::parse_timeout(args.timeout) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    if let Some(session) = args.session {
        if args.detach {
            return crate::cmd_wait::submit(
                &args.kernel,
                session,
                code,
                args.timeout,
                args.json,
                args.limits.limits(),
            );
        }
        let as_code = (args.code != "-").then(|| args.code.clone());
        return crate::cmd_sessions::exec(
            &args.kernel,
            session,
            code,
            args.timeout,
            args.queue,
            args.json,
            args.limits.limits(),
            as_code.as_deref(),
        );
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
        // One kernel through the registry (the single-kernel case), the
        // same request path as every other surface; not journaled.
        let registry = match common::start_one_shot(cfg, false).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        };
        let spec = SessionSpec {
            limits: args.limits.limits(),
            ..SessionSpec::new(common::cli_owner(), "exec")
        };
        let key = match spec.key(&registry) {
            Ok(k) => k,
            Err(e) => {
                registry.shutdown().await;
                return common::request_failed(&e);
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let mut req = ExecuteRequest::new(spec, code, Origin::new("cli:exec"));
        req.deadline = deadline;
        req.live = (!args.json).then_some(tx);
        let printer = tokio::spawn(render::print_live(rx));
        // Ctrl-C interrupts the cell once it is submitted (a second one
        // during the grace is answered by the escalation already under way).
        let watcher = {
            let (registry, key) = (registry.clone(), key.clone());
            tokio::spawn(async move {
                let Some(mut sigint) = sigint else { return };
                while sigint.recv().await.is_some() {
                    let k = loop {
                        match registry.kernel(&key) {
                            Some(k) if k.is_busy() => break k,
                            _ => tokio::time::sleep(Duration::from_millis(10)).await,
                        }
                    };
                    k.interrupt().await;
                }
            })
        };
        let result = req.execute(&registry).await;
        watcher.abort();
        let printed = printer.await.unwrap_or_default();
        registry.shutdown().await;
        match result {
            Ok(mut done) => {
                if args.code != "-" {
                    common::hint_file_as_code(&args.code, &mut done.result);
                }
                render::finish_streamed(&printed, &done.result, args.json)
            }
            Err(e) => {
                // With --json, the error envelope (`{"error": {"code",
                // "message", …}}`) goes to stderr: stdout holds results only.
                if args.json {
                    eprintln!("{}", serde_json::json!({ "error": e.to_json() }));
                    return if e.is_usage() { EXIT_USAGE } else { 1 };
                }
                common::request_failed(&e)
            }
        }
    })
}
