//! `cellhost exec --session NAME --detach CODE` (submit a cell to the
//! daemon and print its id) and `cellhost wait CELL [--json]` (wait for a
//! submitted cell and print its result; exit code by status, as `exec`;
//! 1 when it could not run or was dropped from the queue, 2 for an unknown
//! cell).

use cellhost_server::daemon::{Reply, Request};

use crate::KernelArgs;
use crate::cmd_daemon;
use crate::cmd_sessions::caller_cwd;
use crate::common::{self, EXIT_USAGE};
use crate::render;

/// Arguments of `wait`.
#[derive(Debug, clap::Args)]
pub struct WaitArgs {
    #[command(flatten)]
    kernel: KernelArgs,
    /// Print the CellResult as JSON instead of the output.
    #[arg(long)]
    json: bool,
    /// The cell id `exec --session NAME --detach` printed.
    #[arg(value_name = "CELL")]
    cell: String,
}

/// Sends `req` and answers its first reply that is not a `note` (each
/// note is printed to stderr, as `exec --session` prints them).
fn call(kernel: &KernelArgs, req: Request) -> Result<Reply, String> {
    let rt = common::runtime().map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(async {
        let mut c = cmd_daemon::connect(kernel)
            .await
            .map_err(|e| format!("cannot reach the daemon: {e}"))?;
        c.send(&req).await.map_err(|e| e.to_string())?;
        loop {
            match c.next().await.map_err(|e| e.to_string())? {
                Some(Reply::Note { message }) => eprintln!("cellhost: note: {message}"),
                Some(reply) => return Ok(reply),
                None => return Err("the daemon closed the connection".into()),
            }
        }
    })
}

fn failed(message: &str, usage: bool, code: &str, json: bool) -> u8 {
    if json {
        eprintln!(
            "{}",
            serde_json::json!({"error": {"code": code, "message": message}})
        );
    } else {
        eprintln!("cellhost: {message} ({code})");
    }
    if usage { EXIT_USAGE } else { 1 }
}

/// Submits `code` to the daemon's session and prints the cell id (with
/// `--json`, the handle as JSON). The session's variables, network policy
/// and `limits` go with it, under the same rules as `exec --session`
/// without `--detach` (a running session keeps its own, and a note says
/// so; a value over the daemon's maximum is refused before any cell is
/// submitted).
pub fn submit(
    kernel: &KernelArgs,
    session: String,
    code: String,
    timeout_s: Option<f64>,
    json: bool,
    limits: cellhost_sessions::SessionLimits,
) -> u8 {
    let env = match crate::cmd_sessions::session_env(kernel) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    let python = match crate::common::daemon_python_arg(kernel) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let req = Request::Submit {
        session,
        code,
        timeout_s,
        python,
        sandbox: kernel.sandbox.map(|m| m.to_string()),
        cwd: caller_cwd(),
        env,
        network: kernel.network.as_ref().map(|p| p.to_text()),
        limits: (!limits.is_empty()).then_some(limits),
    };
    match call(kernel, req) {
        Ok(Reply::Submitted { submitted }) => {
            if json {
                println!("{}", serde_json::to_string(&submitted).unwrap_or_default());
            } else {
                println!("{}", submitted.cell);
            }
            0
        }
        Ok(Reply::Error { message, usage, code }) => failed(&message, usage, &code, json),
        Ok(other) => failed(&format!("unexpected reply {other:?}"), false, "internal", json),
        Err(e) => failed(&e, false, "daemon_unreachable", json),
    }
}

/// Runs `wait`.
pub fn run(args: WaitArgs) -> u8 {
    match call(
        &args.kernel,
        Request::Wait {
            cell: args.cell.clone(),
        },
    ) {
        Ok(Reply::Result { result }) => {
            render::finish_streamed(&[String::new(), String::new()], &result, args.json)
        }
        Ok(Reply::Error { message, usage, code }) => failed(&message, usage, &code, args.json),
        Ok(other) => failed(
            &format!("unexpected reply {other:?}"),
            false,
            "internal",
            args.json,
        ),
        Err(e) => failed(&e, false, "daemon_unreachable", args.json),
    }
}
