//! `cellhost output PATH [--offset BYTES] [--length BYTES] [--json]`: page
//! through a cell's spilled output instead of re-running the cell.

use std::io::Write;
use std::path::PathBuf;

use crate::common::EXIT_USAGE;

/// Arguments of `output`.
#[derive(Debug, clap::Args)]
pub struct OutputArgs {
    /// A spill file named in a result's `truncated.<stream>.spill_path`.
    #[arg(value_name = "PATH")]
    path: PathBuf,
    /// Byte offset to start at (moved forward to a character boundary).
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Bytes to read (at most 16 MiB a call).
    #[arg(long, default_value_t = 65_536)]
    length: u64,
    /// Print `{text, offset, next_offset, total_bytes}` as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `output`; returns the exit code (2 for a bad path or offset).
pub fn run(args: OutputArgs) -> u8 {
    // The spill file is read by its absolute path, never through a link.
    let path = std::path::absolute(&args.path).unwrap_or_else(|_| args.path.clone());
    match cellhost_kernel::read_spill(&path, args.offset, args.length) {
        Ok(chunk) => {
            if args.json {
                let v = serde_json::json!({
                    "text": chunk.text,
                    "offset": chunk.offset,
                    "next_offset": chunk.next_offset,
                    "total_bytes": chunk.total_bytes,
                });
                println!("{v}");
            } else {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(chunk.text.as_bytes());
                let _ = out.flush();
                match chunk.next_offset {
                    Some(n) => eprintln!(
                        "cellhost: bytes {}..{n} of {}; next: cellhost output {} --offset {n}",
                        chunk.offset,
                        chunk.total_bytes,
                        args.path.display()
                    ),
                    None => eprintln!("cellhost: end of output ({} bytes)", chunk.total_bytes),
                }
            }
            0
        }
        Err(e) => {
            eprintln!("cellhost: {e}");
            EXIT_USAGE
        }
    }
}
