//! `cellhost fork SESSION NEW [--threads refuse|drop] [--python PATH] [--json]`:
//! forks the daemon's live, idle session SESSION (the one working in the
//! caller's directory) into the new session NEW, with the same variables,
//! imports, execution count and a copy of the working directory, as a
//! kernel of its own (see `cellhost_sessions::requests::fork`). NEW is
//! reached by name from the same directory (`exec --session NEW`); it works
//! in its own copy of the directory, which the report names.

use cellhost_server::daemon::{Reply, Request};
use cellhost_sessions::requests::ForkThreads;

use crate::KernelArgs;
use crate::cmd_daemon;

/// Arguments of `fork`.
#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    /// The live, idle daemon session to fork.
    #[arg(value_name = "SESSION")]
    session: String,
    /// The new session's name (must not exist).
    #[arg(value_name = "NEW")]
    name: String,
    /// What to do with threads of the session's cells: `refuse` (default:
    /// the fork is refused naming them) or `drop` (the fork starts without
    /// them).
    #[arg(long, value_name = "POLICY", default_value = "refuse", value_parser = parse_threads)]
    threads: ForkThreads,
    #[command(flatten)]
    kernel: KernelArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_threads(s: &str) -> Result<ForkThreads, String> {
    match s {
        "refuse" => Ok(ForkThreads::Refuse),
        "drop" => Ok(ForkThreads::Drop),
        _ => Err(format!("{s:?}: expected refuse or drop")),
    }
}

/// Runs `fork`: exit 0 when forked, 2 for the caller's mistakes (no such
/// session, a taken name, running threads, the disk cap), 1 otherwise
/// (a busy session included, as `exec --session`).
pub fn run(args: ForkArgs) -> u8 {
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
        let req = Request::Fork {
            session: args.session.clone(),
            name: args.name.clone(),
            threads: args.threads,
            python,
            sandbox: args.kernel.sandbox.map(|m| m.to_string()),
            cwd: crate::cmd_sessions::caller_cwd(),
        };
        let rep = match crate::common::daemon_reply(c.call(&req).await) {
            Ok(Reply::Forked { report }) => report,
            Ok(other) => return crate::common::unexpected_reply(&other),
            Err(code) => return code,
        };
        if args.json {
            println!("{}", serde_json::to_string_pretty(&rep).unwrap_or_default());
            return 0;
        }
        println!(
            "forked {} (generation {}, execution_count {}) into {}: generation {}, pid {}, {} names, {} files ({} bytes) in {} ms; it works in {}",
            rep.parent,
            rep.parent_generation,
            rep.execution_count,
            rep.session,
            rep.generation,
            rep.pid,
            rep.names.len(),
            rep.files_copied,
            rep.bytes_copied,
            rep.duration_ms,
            rep.cwd.display()
        );
        match rep.method {
            cellhost_sessions::requests::ForkMethod::Cow => {
                println!("  method: cow (copy-on-write fork of the worker)")
            }
            cellhost_sessions::requests::ForkMethod::Pickle => println!(
                "  method: pickle ({})",
                rep.pickle_reason.as_deref().unwrap_or("no reason given")
            ),
        }
        for (name, why) in &rep.lost {
            println!("  not carried: {name} ({why})");
        }
        for (module, why) in &rep.modules_failed {
            println!("  not imported: {module} ({why})");
        }
        for t in &rep.threads_dropped {
            println!("  thread dropped: {t}");
        }
        for p in &rep.skipped {
            println!("  file not copied: {p}");
        }
        0
    })
}
