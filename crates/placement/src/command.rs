//! Runs a scheduler's command-line tool (`sbatch`, `squeue`, `scancel`,
//! `ssh`) with a deadline and keeps what it said for typed errors.

use std::ffi::OsStr;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::PlacementError;

/// Longest part of a tool's stderr kept in an error message, in bytes.
pub const MESSAGE_LIMIT: usize = 4096;

/// What a finished command printed.
#[derive(Debug)]
pub struct Output {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its stdout, lossily decoded.
    pub stdout: String,
    /// Its stderr, lossily decoded, trimmed and cut to [`MESSAGE_LIMIT`].
    pub stderr: String,
}

impl Output {
    /// The tool's message: stderr, else stdout, else the exit status.
    pub fn message(&self) -> String {
        if !self.stderr.is_empty() {
            return self.stderr.clone();
        }
        let out = cut(self.stdout.trim());
        if !out.is_empty() {
            return out;
        }
        format!("exited with {}", self.status)
    }
}

fn cut(s: &str) -> String {
    if s.len() <= MESSAGE_LIMIT {
        return s.to_owned();
    }
    let mut end = MESSAGE_LIMIT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A command to run: program, arguments, extra environment, stdin bytes.
#[derive(Debug)]
pub struct Invocation<'a> {
    /// Placement kind, for errors.
    pub kind: &'static str,
    /// The program (a name looked up in `PATH`, or a path).
    pub program: &'a OsStr,
    /// Its arguments.
    pub args: Vec<std::ffi::OsString>,
    /// Variables added to the inherited environment.
    pub env: Vec<(String, std::ffi::OsString)>,
    /// Bytes written to its stdin, which is then closed (`/dev/null` when `None`).
    pub stdin: Option<&'a [u8]>,
    /// How long it may take before it is killed.
    pub timeout: Duration,
}

/// Runs the command to its end.
///
/// # Errors
/// [`PlacementError::Unavailable`] when it cannot be started, its stdin
/// cannot be written, or it outlives `timeout` (it is then killed).
pub async fn run(inv: Invocation<'_>) -> Result<Output, PlacementError> {
    let program = inv.program.to_string_lossy().into_owned();
    let unavailable = |message: String| PlacementError::Unavailable {
        kind: inv.kind.to_owned(),
        message,
    };
    let mut cmd = tokio::process::Command::new(inv.program);
    cmd.args(&inv.args)
        .stdin(if inv.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in &inv.env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| unavailable(format!("{program} could not be started: {e}")))?;
    let work = async move {
        if let (Some(bytes), Some(mut pipe)) = (inv.stdin, child.stdin.take()) {
            // A tool that exits without reading its stdin is reported by its
            // exit status below, not as a broken pipe here.
            let _ = pipe.write_all(bytes).await;
            drop(pipe);
        }
        child.wait_with_output().await
    };
    let out = match tokio::time::timeout(inv.timeout, work).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(unavailable(format!("{program} failed: {e}"))),
        Err(_) => {
            return Err(unavailable(format!(
                "{program} did not finish within {} s",
                inv.timeout.as_secs()
            )));
        }
    };
    Ok(Output {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: cut(String::from_utf8_lossy(&out.stderr).trim()),
    })
}
