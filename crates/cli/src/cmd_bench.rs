//! `cellhost bench ARGS…`: runs `cellhost-bench`, a binary of its own next
//! to this one, with the same arguments (`cellhost bench --help` prints its
//! options), so the bench is not compiled into `cellhost`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use crate::common;

/// Arguments of `bench`: passed on to `cellhost-bench` as they are.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Arguments of `cellhost-bench` (`cellhost bench --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    args: Vec<OsString>,
}

/// The bench binary: `cellhost-bench` in this executable's directory.
///
/// # Errors
/// This executable's path is unknown, or the bench is not there (the
/// message names the path and the command that builds it).
fn bench_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    let bin = exe.with_file_name("cellhost-bench");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "the bench is a binary of its own and {} is missing: build it with `cargo build --release -p cellhost-bench`",
            bin.display()
        ))
    }
}

/// Runs `bench`: replaces this process with `cellhost-bench ARGS…` (with
/// `--config PATH` when `cellhost --config PATH` was given). Returns only
/// on failure: 1, the reason on stderr.
pub fn run(args: BenchArgs) -> u8 {
    let bin = match bench_binary() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 1;
        }
    };
    let mut cmd = Command::new(&bin);
    if let Some(config) = common::config_path() {
        cmd.arg("--config").arg(config);
    }
    let e = cmd.args(&args.args).exec();
    eprintln!("cellhost: cannot run {}: {e}", bin.display());
    1
}
