//! `cellhost mcp [--python PATH] [--sandbox MODE] [--config PATH]`: an MCP
//! server on standard input and output (one connection = one owner, whose
//! kernels end when the client disconnects). Logs go to standard error only.

use std::sync::Arc;

use cellhost_sessions::{Journal, Registry, RegistryConfig};

use crate::KernelArgs;
use crate::common::{self, EXIT_USAGE};

/// Arguments of `mcp`.
#[derive(Debug, clap::Args)]
pub struct McpArgs {
    #[command(flatten)]
    kernel: KernelArgs,
}

/// Runs `mcp` until the client disconnects; returns the exit code.
pub fn run(args: McpArgs) -> u8 {
    let config = match common::config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    let rt = match common::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost: cannot start the runtime: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        let dir = common::new_session_dir("mcp");
        let template = match common::kernel_config(&args.kernel, "default", &dir) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return EXIT_USAGE;
            }
        };
        let journal = if config.bool("journal") {
            match Journal::open(common::journal_path(), config.durability()) {
                Ok(j) => Some(Arc::new(j)),
                Err(e) => {
                    eprintln!("cellhost: the journal is off for this server: {e}");
                    None
                }
            }
        } else {
            None
        };
        let mut rc = RegistryConfig::new(common::state_dir(), template);
        config.apply_to_registry(&mut rc);
        let registry = match Registry::start(rc, journal).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cellhost: cannot start the session registry: {e}");
                return 1;
            }
        };
        let owner = cellhost_mcp::new_owner_id();
        eprintln!("cellhost: MCP server on stdio (owner {owner})");
        let served = cellhost_mcp::serve_stdio(registry.clone(), owner).await;
        registry.shutdown().await;
        match served {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("cellhost: {e}");
                1
            }
        }
    })
}
