//! `cellhost-stub-worker`: a worker that speaks protocol v1 without an
//! interpreter, for `cellhost bench remote-scale` only (so a thousand
//! remote kernels fit in memory). It is no part of `cellhost`: the bench
//! names it as the kernels' interpreter and the node agent starts it like
//! any worker (the kernel init, the sandbox, fd 3), through the real agent
//! and TLS path.
//!
//! What it does (DESIGN.md, "Worker protocol v1"):
//! * reads its configuration message from the control socket (fd 3: the
//!   length in decimal, a newline, JSON) and answers `ready`;
//! * `execute`: `started`, the start marker then the end marker on fd 1 and
//!   fd 2, then `response` (`ok`, no result: the code is not run; the
//!   execution count counts cells that are not silent);
//! * `inspect_variables`: an empty `variables`; `interrupt`: an
//!   `interrupt_ack` (no cell is ever running); `shutdown` or the end of
//!   the control socket: exit 0.
//!
//! Its arguments (the Python runtime's `-c BOOT DIR`) are ignored. Without a
//! control socket at fd 3 (an asset build run with the same arguments) it
//! exits 1 at once. Exit 2: a frame it cannot read.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use cellhost_protocol::frame::SigintHandler;
use cellhost_protocol::{HostFrame, MAX_FRAME_BYTES, PROTOCOL_VERSION, WorkerFrame};

/// The control socket's descriptor (as the Python worker's `CONTROL_FD`).
const CONTROL_FD: i32 = 3;

/// Longest decimal length header of the configuration message.
const HEADER_MAX: usize = 20;

fn main() -> ExitCode {
    let Some(fd) = cellhost_sandbox::launcher::take_inherited_fd(CONTROL_FD) else {
        eprintln!("cellhost-stub-worker: no control socket at fd {CONTROL_FD}");
        return ExitCode::from(1);
    };
    let sock = UnixStream::from(fd);
    match serve(sock) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cellhost-stub-worker: {e}");
            ExitCode::from(2)
        }
    }
}

/// Reads the configuration message (its content is not needed).
fn read_config(sock: &mut UnixStream) -> Result<(), String> {
    let mut header = Vec::new();
    let mut b = [0u8; 1];
    while header.last() != Some(&b'\n') {
        if header.len() > HEADER_MAX {
            return Err("configuration header too long".into());
        }
        match sock.read(&mut b) {
            Ok(0) => return Err("control socket closed before the configuration".into()),
            Ok(_) => header.push(b[0]),
            Err(e) => return Err(format!("reading the configuration: {e}")),
        }
    }
    let n: usize = std::str::from_utf8(&header)
        .ok()
        .and_then(|h| h.trim().parse().ok())
        .filter(|&n| n <= MAX_FRAME_BYTES)
        .ok_or("malformed configuration header")?;
    let mut body = vec![0u8; n];
    sock.read_exact(&mut body)
        .map_err(|e| format!("reading the configuration: {e}"))
}

fn send(w: &mut UnixStream, frame: &WorkerFrame) -> Result<(), String> {
    let mut line = serde_json::to_vec(frame).map_err(|e| e.to_string())?;
    line.push(b'\n');
    w.write_all(&line).map_err(|e| format!("control socket: {e}"))
}

/// `marker` on fd 1 and fd 2, in that order.
fn write_both(marker: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    out.write_all(marker.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))?;
    let mut err = std::io::stderr().lock();
    err.write_all(marker.as_bytes())
        .and_then(|()| err.flush())
        .map_err(|e| format!("stderr: {e}"))
}

fn serve(mut sock: UnixStream) -> Result<(), String> {
    read_config(&mut sock)?;
    let mut w = sock.try_clone().map_err(|e| e.to_string())?;
    send(
        &mut w,
        &WorkerFrame::Ready {
            pid: std::process::id(),
            python: "cellhost-stub-worker (protocol v1, no interpreter)".into(),
            executable: std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            protocol: PROTOCOL_VERSION,
            rings: Vec::new(),
        },
    )?;
    let mut r = BufReader::new(sock);
    let mut line = Vec::new();
    let mut execution_count = 0u64;
    loop {
        line.clear();
        let n = (&mut r)
            .take(MAX_FRAME_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("control socket: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            return Err(format!("frame without a newline ({n} bytes)"));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let frame: HostFrame = serde_json::from_slice(&line).map_err(|e| format!("malformed frame: {e}"))?;
        match frame {
            HostFrame::Execute {
                id, marker, options, ..
            } => {
                send(&mut w, &WorkerFrame::Started { id: id.clone() })?;
                write_both(&marker.replacen("cellhost-end-", "cellhost-start-", 1))?;
                if !options.silent {
                    execution_count += 1;
                }
                write_both(&marker)?;
                send(
                    &mut w,
                    &WorkerFrame::Response {
                        id,
                        status: "ok".into(),
                        execution_count,
                        result: None,
                        error: None,
                        usage: None,
                        cwd: None,
                        sigint_handler: None,
                        files: None,
                        result_at: None,
                    },
                )?;
            }
            HostFrame::InspectVariables { id, .. } => send(
                &mut w,
                &WorkerFrame::Variables {
                    id,
                    variables: Vec::new(),
                    truncated: false,
                },
            )?,
            HostFrame::Interrupt { id, .. } => send(
                &mut w,
                &WorkerFrame::InterruptAck {
                    id,
                    running: false,
                    handler: SigintHandler::Default,
                    raised: 0,
                },
            )?,
            HostFrame::HostResponse { .. } => {}
            HostFrame::Shutdown {} => return Ok(()),
        }
    }
}
