//! `cellhost restore SESSION [--owner OWNER] [--python PATH] [--json]`:
//! replays the successful cells of a session's last journaled kernel into a
//! new kernel, and reports which cells it replayed and which it skipped.
//! Opt-in: nothing replays code unless asked.

use std::sync::Arc;

use cellhost_sessions::{Journal, Registry, RegistryConfig};

use crate::KernelArgs;
use crate::common::{self, CLI_OWNER, EXIT_USAGE};

/// Arguments of `restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// Session name.
    #[arg(value_name = "SESSION")]
    session: String,
    /// Owner of the session.
    #[arg(long, default_value = CLI_OWNER)]
    owner: String,
    #[command(flatten)]
    kernel: KernelArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `restore`.
pub fn run(args: RestoreArgs) -> u8 {
    let config = match common::config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    let dir = common::new_session_dir("restore");
    let template = match common::kernel_config(&args.kernel, &args.session, &dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 1;
        }
    };
    common::block_on(async move {
        let journal = match Journal::open(common::journal_path(), config.durability()) {
            Ok(j) => Arc::new(j),
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        };
        let mut rc = RegistryConfig::new(common::state_dir(), template);
        config.apply_to_registry(&mut rc);
        rc.pool_size = 0;
        let reg = match Registry::start(rc, Some(journal)).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        };
        let key = reg.key(&args.owner, &args.session);
        let out = reg.restore(&key, false).await;
        reg.shutdown().await;
        match out {
            Ok(rep) => {
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&rep).unwrap_or_default());
                } else {
                    println!(
                        "restored session {} from generation {} into generation {}: {} replayed, {} skipped",
                        args.session,
                        rep.from_generation,
                        rep.generation,
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
            }
            Err(e) => {
                eprintln!("cellhost: {e}");
                1
            }
        }
    })
}
