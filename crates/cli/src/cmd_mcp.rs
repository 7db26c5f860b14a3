//! `cellhost mcp [--python PATH] [--sandbox MODE] [--config PATH]`: an MCP
//! server on standard input and output (one connection = one owner, whose
//! kernels end when the client disconnects). Logs go to standard error only.

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
    common::block_on(async move {
        let dir = common::new_session_dir("mcp");
        let template = match common::kernel_config(&args.kernel, "default", &dir) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return EXIT_USAGE;
            }
        };
        let registry = match common::start_registry(template, None, false, None).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cellhost: cannot start the session registry: {e}");
                return 1;
            }
        };
        let owner = cellhost_mcp::new_owner_id();
        eprintln!("cellhost: MCP server on stdio (owner {owner})");
        // Validated with the rest of the configuration by start_registry.
        let limits = common::config()
            .map(|c| cellhost_mcp::McpLimits {
                file_max_bytes: u64::try_from(c.int("mcp_file_max_kb")).unwrap_or(1) * 1024,
                image_max_bytes: u64::try_from(c.int("mcp_image_max_kb")).unwrap_or(1) * 1024,
            })
            .unwrap_or_default();
        let served = cellhost_mcp::serve_stdio_with(registry.clone(), owner, limits).await;
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
