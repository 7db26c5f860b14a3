//! `cellhost agent --credential FILE [--connect-grace 30s]`: the node
//! agent of a remote kernel (see the `cellhost-remote` crate). A placement
//! starts it on the compute node; it dials the host named in the
//! credential, pins the host's certificate, runs the worker locally in
//! this node's sandbox and relays it over the one TLS connection.
//!
//! Exit codes: 0 the kernel ended and the host closed the connection,
//! 3 the host was gone for longer than the grace (the worker's tree was
//! killed), 1 the agent could not serve (its error's code is printed),
//! 2 usage.

use std::path::PathBuf;
use std::time::Duration;

use cellhost_remote::{AgentExit, AgentOptions};

use crate::common;

/// Arguments of `agent`.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The credential file the placement wrote (mode 0600, owned by this
    /// user; removed once read).
    #[arg(long, value_name = "FILE")]
    credential: PathBuf,
    /// How long the host may be unreachable before the agent kills its
    /// worker and exits: `30s` (default), `500ms`, `2m`.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    connect_grace: Duration,
    /// The interpreter on this node (default: the one the host names).
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Where the kernel's session directory goes on this node (kept);
    /// default: the temporary directory, where it is removed once the
    /// worker has ended.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

/// `30s`, `500ms`, `2m`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (use 30s, 500ms, 2m)"))?;
    if !v.is_finite() || v < 0.0 || v * scale > 86_400.0 {
        return Err(format!("duration out of range: {s:?}"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// Runs the agent.
pub fn run(args: AgentArgs) -> u8 {
    let rt = match common::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost agent: cannot start the runtime: {e}");
            return 1;
        }
    };
    let opts = AgentOptions {
        credential: args.credential,
        connect_grace: args.connect_grace,
        python: args.python,
        state_dir: args.state_dir,
    };
    match rt.block_on(cellhost_remote::run_agent(opts)) {
        Ok(AgentExit::Done) => 0,
        Ok(AgentExit::HostLost) => {
            eprintln!("cellhost agent: the host was gone for longer than the grace; the worker was killed");
            3
        }
        Err(e) => {
            eprintln!("cellhost agent: {e} ({})", e.code());
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
