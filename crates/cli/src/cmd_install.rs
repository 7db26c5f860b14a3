//! `cellhost install SESSION PKG…`: install packages into a daemon session
//! (the session `exec --session SESSION` runs in from this directory)
//! through the daemon's `install` request — the same request as HTTP's
//! `POST …/packages`, MCP's `install_packages` and a cell's `%pip install`:
//! the host runs the installer into the session's overlay while the kernel
//! stays offline, and the next cell imports the packages.
//!
//! Prints the installer's output, then one line per distribution added;
//! with `--json`, the report. Exit 0 when installed, 2 for a refused spec
//! (`invalid_package_spec`, `shared_venv_refused`) or another usage error,
//! 1 when the installer failed (`install_failed`, with its stderr's tail).

use cellhost_server::daemon::{Reply, Request};

use crate::KernelArgs;
use crate::cmd_daemon;
use crate::cmd_sessions::caller_cwd;
use crate::common::{self, EXIT_USAGE};

/// Arguments of `install`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    #[command(flatten)]
    kernel: KernelArgs,
    /// Print the install report as JSON.
    #[arg(long)]
    json: bool,
    /// Install into the interpreter's own environment, shared by every
    /// session using it (refused unless `packages.shared_venv = true`).
    #[arg(long)]
    shared_venv: bool,
    /// The daemon session.
    #[arg(value_name = "SESSION")]
    session: String,
    /// Requirement specs: `name`, `name[extra]`, `name>=1.0,<2` (no
    /// options, markers, paths or URLs; each is checked by the host).
    #[arg(
        value_name = "PKG",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    packages: Vec<String>,
}

/// Runs `install`.
pub fn run(args: InstallArgs) -> u8 {
    let python = match crate::common::daemon_python_arg(&args.kernel) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let req = Request::Install {
        session: args.session.clone(),
        packages: args.packages.clone(),
        shared_venv: args.shared_venv,
        live: false,
        python,
        sandbox: args.kernel.sandbox.map(|m| m.to_string()),
        cwd: caller_cwd(),
    };
    let rt = match common::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost: cannot start the runtime: {e}");
            return 1;
        }
    };
    let reply = rt.block_on(async {
        let mut c = cmd_daemon::connect(&args.kernel).await?;
        c.call(&req).await
    });
    match reply {
        Ok(Reply::Installed { report, result }) => {
            if args.json {
                let v = serde_json::json!({"report": report, "result": result});
                println!("{v}");
                return 0;
            }
            if !result.stdout.is_empty() {
                print!("{}", result.stdout);
            }
            if !result.stderr.is_empty() {
                eprint!("{}", result.stderr);
            }
            for d in &report.installed {
                eprintln!(
                    "cellhost: installed {} {} into session {}",
                    d.name, d.version, args.session
                );
            }
            if report.installed.is_empty() {
                eprintln!("cellhost: nothing new to install in session {}", args.session);
            }
            0
        }
        Ok(Reply::Error { message, usage, code }) => {
            if args.json {
                eprintln!(
                    "{}",
                    serde_json::json!({"error": {"code": code, "message": message}})
                );
            } else {
                eprintln!("cellhost: {message} ({code})");
            }
            if usage { EXIT_USAGE } else { 1 }
        }
        Ok(other) => {
            eprintln!("cellhost: unexpected reply from the daemon: {other:?}");
            1
        }
        Err(e) => {
            eprintln!("cellhost: {e}");
            1
        }
    }
}
