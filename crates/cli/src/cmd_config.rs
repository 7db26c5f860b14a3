//! `cellhost config [--json]`: the effective configuration and where each
//! value came from (default, the config file, or a `CELLHOST_*` variable).

use crate::common::{self, EXIT_USAGE};

/// Arguments of `config`.
#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// Print JSON (`values.KEY = {value, source}`, `tools`, `file`).
    #[arg(long)]
    json: bool,
}

/// Runs `config`.
pub fn run(args: ConfigArgs) -> u8 {
    let cfg = match common::config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&cfg) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        }
    } else {
        print!("{}", cfg.render());
        println!("# journal: {}", common::journal_path().display());
    }
    0
}
