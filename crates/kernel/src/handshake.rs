//! The start of a kernel's conversation, over any [`WorkerLink`]: the
//! kernel init's `sandbox` report (with a sandbox), then the worker's
//! `ready` with its protocol version; the sandbox status the caller sees;
//! the errors of a worker that never got ready.

use std::process::ExitStatus;
use std::time::Duration;

use cellhost_protocol::frame::RingOffer;
use cellhost_protocol::{PROTOCOL_VERSION, ProtocolError, SandboxLayer, WorkerFrame};
use cellhost_sandbox::profile::{LayerStatus, SandboxMode, SandboxStatus};

use crate::config::KernelConfig;
use crate::error::KernelError;
use crate::link::{Launch, LinkEvent, Stream, WorkerLink, describe_exit};

/// Early stderr kept for the error of a worker that died at start.
const EARLY_STDERR_MAX: usize = 65536;
/// Early stdout kept (as output of no cell) before the first cell.
const EARLY_STDOUT_MAX: usize = 4 * 1024 * 1024;
/// How long a gone worker's init report may still take.
const SANDBOX_REPORT_WAIT: Duration = Duration::from_millis(300);
/// How long a gone worker's last words may take to arrive.
const LAST_WORDS_WAIT: Duration = Duration::from_millis(500);
/// How long to wait for the exit status of a worker that closed its
/// channel before `ready`.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// A worker that said `ready`.
#[derive(Debug)]
pub(crate) struct Ready {
    /// The pid the worker reported (its own view).
    pub pid: u32,
    /// The interpreter's version string.
    pub version: String,
    /// The side channels it offers.
    pub rings: Vec<RingOffer>,
    /// The confinement in force.
    pub sandbox: SandboxStatus,
    /// Bytes the worker wrote before `ready`, per stream.
    pub early: [Vec<u8>; 2],
}

/// How the first phase ended.
enum First {
    Frame(WorkerFrame),
    Broken(ProtocolError),
    /// The worker's tree is gone (or its channel closed) before any frame.
    Gone,
}

/// Runs the handshake on `link`.
///
/// # Errors
/// [`KernelError::StartupTimeout`] (nothing within
/// [`KernelConfig::startup_timeout`]), [`KernelError::Spawn`] (the worker
/// died first, with its stderr; or its first frame was not `ready`),
/// [`KernelError::Protocol`], [`KernelError::ProtocolMismatch`],
/// [`KernelError::SandboxUnavailable`] (mode `enforce` with a layer
/// missing).
pub(crate) async fn handshake<L: WorkerLink>(
    link: &mut L,
    config: &KernelConfig,
    launch: &Launch,
) -> Result<Ready, KernelError> {
    let sandboxed = launch.sandboxed;
    let mut early: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut sandbox_frame: Option<Vec<SandboxLayer>> = None;
    let mut exit: Option<ExitStatus> = None;
    let first = tokio::time::timeout(config.startup_timeout, async {
        loop {
            match link.next_event().await {
                // The kernel init's report comes before `ready`.
                LinkEvent::Frame(WorkerFrame::Sandbox { layers, .. }) if sandboxed => {
                    sandbox_frame = Some(layers);
                }
                LinkEvent::Frame(f) => return First::Frame(f),
                // A worker that died without reading its configuration
                // message resets the socket: it is gone, as at EOF.
                LinkEvent::ControlError(ProtocolError::Io(e))
                    if e.kind() == std::io::ErrorKind::ConnectionReset =>
                {
                    return First::Gone;
                }
                LinkEvent::ControlError(e) => return First::Broken(e),
                LinkEvent::ControlClosed => return First::Gone,
                LinkEvent::Output { stream, bytes } => {
                    keep_early(&mut early, stream, &bytes);
                    link.recycle(stream, bytes);
                }
                LinkEvent::OutputClosed(Stream::Stderr) => {
                    // Worker tree gone: wait for the init to report.
                    loop {
                        match link.next_event().await {
                            LinkEvent::Exited(st) => {
                                exit = Some(st);
                                return First::Gone;
                            }
                            LinkEvent::Frame(WorkerFrame::Sandbox { layers, .. }) if sandboxed => {
                                sandbox_frame = Some(layers);
                            }
                            LinkEvent::Output { stream, bytes } => {
                                keep_early(&mut early, stream, &bytes);
                                link.recycle(stream, bytes);
                            }
                            _ => {}
                        }
                    }
                }
                LinkEvent::OutputClosed(Stream::Stdout) => {}
                LinkEvent::Exited(st) => {
                    exit = Some(st);
                    return First::Gone;
                }
            }
        }
    })
    .await;
    let gone = matches!(first, Ok(First::Gone));
    if gone && sandboxed && sandbox_frame.is_none() {
        // The init may have reported its layers and then refused to go
        // on (enforce): the report is still in the channel.
        let _ = tokio::time::timeout(SANDBOX_REPORT_WAIT, async {
            loop {
                match link.next_event().await {
                    LinkEvent::Frame(WorkerFrame::Sandbox { layers, .. }) => {
                        sandbox_frame = Some(layers);
                        break;
                    }
                    LinkEvent::ControlClosed | LinkEvent::ControlError(_) => break,
                    LinkEvent::Output { stream, bytes } => {
                        keep_early(&mut early, stream, &bytes);
                        link.recycle(stream, bytes);
                    }
                    LinkEvent::Exited(st) => exit = Some(st),
                    _ => {}
                }
            }
        })
        .await;
    }
    if gone {
        // The worker is gone: its last words may still sit in the pipe.
        let _ = tokio::time::timeout(LAST_WORDS_WAIT, async {
            loop {
                match link.next_event().await {
                    LinkEvent::Output { stream, bytes } => {
                        keep_early(&mut early, stream, &bytes);
                        link.recycle(stream, bytes);
                        if early[1].len() >= EARLY_STDERR_MAX {
                            break;
                        }
                    }
                    LinkEvent::OutputClosed(Stream::Stderr) => break,
                    LinkEvent::Exited(st) => exit = Some(st),
                    _ => {}
                }
            }
        })
        .await;
        if exit.is_none() {
            let _ = tokio::time::timeout(EXIT_WAIT, async {
                loop {
                    if let LinkEvent::Exited(st) = link.next_event().await {
                        exit = Some(st);
                        break;
                    }
                }
            })
            .await;
        }
    }
    let sandbox = sandbox_status(config.sandbox.mode, launch, sandbox_frame);
    if sandboxed {
        let reported = sandbox.layer("init").is_none();
        if config.sandbox.mode == SandboxMode::Enforce
            && (reported || matches!(first, Ok(First::Frame(WorkerFrame::Ready { .. }))))
            && let Some(l) = sandbox.missing().next()
        {
            return Err(KernelError::SandboxUnavailable {
                kernel: launch.label.clone(),
                layer: l.name.clone(),
                reason: l.detail.clone(),
            });
        }
        if config.sandbox.mode == SandboxMode::Auto
            && !config.sandbox.allow_weak
            && (reported || matches!(first, Ok(First::Frame(WorkerFrame::Ready { .. }))))
            && let Some(l) = sandbox.weak_layer()
        {
            return Err(KernelError::WeakSandbox {
                kernel: launch.label.clone(),
                layer: l.name.clone(),
                reason: l.detail.clone(),
            });
        }
    }
    let python = config.python.display().to_string();
    match first {
        Err(_) => Err(KernelError::StartupTimeout {
            kernel: launch.label.clone(),
            timeout_ms: config.startup_timeout.as_millis() as u64,
        }),
        Ok(First::Gone) => {
            let status = exit.map_or_else(|| "still running".to_string(), describe_exit);
            let said = cellhost_capture::render_once(&early[1]).trim().to_string();
            if let Some(err) = config.runtime.start_failure(&config.python, &said) {
                return Err(err);
            }
            Err(KernelError::Spawn {
                python,
                reason: format!("the worker exited before it was ready ({status}): {said}"),
            })
        }
        Ok(First::Broken(e)) => Err(KernelError::Protocol {
            kernel: launch.label.clone(),
            source: e,
        }),
        Ok(First::Frame(WorkerFrame::Ready {
            pid,
            python: version,
            protocol,
            rings,
            ..
        })) => {
            if protocol != PROTOCOL_VERSION {
                return Err(KernelError::ProtocolMismatch {
                    kernel: launch.label.clone(),
                    worker: protocol,
                    host: PROTOCOL_VERSION,
                });
            }
            Ok(Ready {
                pid,
                version,
                rings,
                sandbox,
                early,
            })
        }
        Ok(First::Frame(other)) => Err(KernelError::Spawn {
            python,
            reason: format!("the worker's first frame was `{}`, not `ready`", other.kind()),
        }),
    }
}

fn keep_early(early: &mut [Vec<u8>; 2], stream: Stream, bytes: &[u8]) {
    let (buf, max) = match stream {
        Stream::Stdout => (&mut early[0], EARLY_STDOUT_MAX),
        Stream::Stderr => (&mut early[1], EARLY_STDERR_MAX),
    };
    if buf.len() < max {
        buf.extend_from_slice(bytes);
    }
}

/// The confinement layers in force: the environment allowlist, the init's
/// report, then the host's own layers (cgroups).
fn sandbox_status(mode: SandboxMode, launch: &Launch, frame: Option<Vec<SandboxLayer>>) -> SandboxStatus {
    let mut sandbox = SandboxStatus::off();
    if !launch.sandboxed {
        // A session's disk cap without its mount is named even with the
        // sandbox off (the host's accounting only).
        sandbox
            .layers
            .extend(launch.host_layers.iter().filter(|l| l.name == "disk").cloned());
        return sandbox;
    }
    sandbox.mode = mode;
    sandbox.layers.push(LayerStatus::on(
        "env",
        "environment by allowlist; secret-looking names withheld",
    ));
    match frame {
        Some(layers) => sandbox.layers.extend(layers.into_iter().map(|l| LayerStatus {
            name: l.name,
            enforced: l.enforced,
            detail: l.detail,
            optional: l.optional,
        })),
        None => sandbox.layers.push(LayerStatus::missing(
            "init",
            "the kernel init reported no sandbox layers",
        )),
    }
    sandbox.layers.extend(launch.host_layers.iter().cloned());
    sandbox
}
