//! `cellhost restore SESSION [--owner OWNER] [--from NAME] [--python PATH] [--json]`:
//! rebuilds a session in the per-user daemon (started on first use) by
//! replaying the successful cells of the session's last journaled kernel
//! (of that owner only) into a new kernel, and reports which cells it
//! replayed and which it skipped. The rebuilt session is the daemon's:
//! `cellhost exec --session SESSION` goes on where it left off. Opt-in:
//! nothing replays code unless asked.

use cellhost_server::daemon::{Reply, Request};

use crate::KernelArgs;
use crate::cmd_daemon;

/// Arguments of `restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// Session name: the daemon session to rebuild (and, without `--from`,
    /// the journaled session to replay).
    #[arg(value_name = "SESSION")]
    session: String,
    /// Owner of the journaled session (default: this user's CLI owner,
    /// `cli:<user>`; `serve`'s sessions are keyed by their token's owner).
    #[arg(long)]
    owner: Option<String>,
    /// Replay this journaled session instead of SESSION.
    #[arg(long, value_name = "NAME")]
    from: Option<String>,
    #[command(flatten)]
    kernel: KernelArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `restore`.
pub fn run(args: RestoreArgs) -> u8 {
    let python = match crate::common::daemon_python_arg(&args.kernel) {
        Ok(p) => p,
        Err(code) => return code,
    };
    crate::common::block_on(async move {
        let mut c = match cmd_daemon::connect(&args.kernel).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cellhost: cannot reach the daemon: {e}");
                return 1;
            }
        };
        let req = Request::Restore {
            session: args.session.clone(),
            from: args.from.clone(),
            owner: args.owner.clone(),
            python,
            sandbox: args.kernel.sandbox.map(|m| m.to_string()),
            cwd: crate::cmd_sessions::caller_cwd(),
        };
        let rep = match crate::common::daemon_reply(c.call(&req).await) {
            Ok(Reply::Restored { report }) => report,
            Ok(other) => return crate::common::unexpected_reply(&other),
            Err(code) => return code,
        };
        if args.json {
            println!("{}", serde_json::to_string_pretty(&rep).unwrap_or_default());
        } else {
            println!(
                "restored session {} from generation {} into generation {} (in the daemon: exec --session {} goes on): {} replayed, {} skipped",
                args.session,
                rep.from_generation,
                rep.generation,
                args.session,
                rep.replayed.len(),
                rep.skipped.len()
            );
            for id in &rep.replayed {
                println!("  replayed {id}");
            }
            for s in &rep.skipped {
                println!("  skipped {} ({})", s.cell, s.reason);
            }
        }
        u8::from(rep.skipped.iter().any(|s| s.status == "ok"))
    })
}
