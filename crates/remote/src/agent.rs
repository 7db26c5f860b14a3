//! The node agent (`cellhost agent --credential FILE`): dials the host,
//! starts the worker locally exactly as a local kernel (the kernel crate's
//! [`LocalLink`], with this node's sandbox), and relays its link over the
//! one TLS connection.
//!
//! Interrupts and kills run here (`tgkill` to the worker's main thread,
//! the init's whole-tree kill) and their delivery is reported back. When
//! the host connection is gone (closed, broken, or silent) for longer
//! than the grace, the agent kills the worker's tree and exits.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellhost_kernel::KernelConfig;
use cellhost_kernel::link::local::LocalLink;
use cellhost_kernel::link::{LinkEvent, WorkerLink};
use cellhost_protocol::{HostFrame, WorkerFrame};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;

use crate::credential::{CredentialFileError, read_credential_file};
use crate::wire::{
    AgentSpec, HANDSHAKE_CAP, InterruptDone, MAX_MESSAGE, Msg, OUTPUT_CHUNK, Started, UsageSnapshot,
    WireError, WorkerPids, read_msg, write_msg,
};

/// How the agent is run.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The credential file (mode 0600, removed once read).
    pub credential: PathBuf,
    /// How long the host may be unreachable (at the first dial, and once
    /// connected) before the agent gives up and kills its worker (30 s).
    pub connect_grace: Duration,
    /// The interpreter on this node (default: the one the host names).
    pub python: Option<PathBuf>,
    /// Where the kernel's session directory goes on this node (kept).
    /// Default: a directory under the system's temporary directory, removed
    /// once the worker has ended.
    pub state_dir: Option<PathBuf>,
}

/// How the agent ended (its process exit code in the CLI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentExit {
    /// The worker ended and the host closed the connection (exit 0).
    Done,
    /// The host was gone for longer than the grace; the tree was killed
    /// (exit 3).
    HostLost,
}

/// Why the agent could not serve.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The credential file was refused.
    #[error(transparent)]
    Credential(#[from] CredentialFileError),
    /// The host could not be reached within the grace.
    #[error("cannot reach the host {host}: {reason}")]
    Unreachable {
        /// `host:port`.
        host: String,
        /// The last error.
        reason: String,
    },
    /// TLS failed (a certificate other than the pinned one, …).
    #[error("TLS with the host {host} failed: {reason}")]
    Tls {
        /// `host:port`.
        host: String,
        /// rustls's message.
        reason: String,
    },
    /// The host refused the credential.
    #[error("the host refused this agent ({code}): {message}")]
    Refused {
        /// The host's code (`credential_replayed`, …).
        code: String,
        /// The host's message.
        message: String,
    },
    /// The worker could not be started (reported to the host as well).
    #[error("cannot start the worker: {0}")]
    Spawn(String),
    /// The connection broke during the handshake.
    #[error("handshake with the host failed: {0}")]
    Handshake(String),
}

impl AgentError {
    /// Stable code: `credential_file`, `host_unreachable`, `tls_failed`,
    /// `admission_refused`, `worker_spawn_failed`, `handshake_failed`.
    pub fn code(&self) -> &'static str {
        match self {
            AgentError::Credential(_) => "credential_file",
            AgentError::Unreachable { .. } => "host_unreachable",
            AgentError::Tls { .. } => "tls_failed",
            AgentError::Refused { .. } => "admission_refused",
            AgentError::Spawn(_) => "worker_spawn_failed",
            AgentError::Handshake(_) => "handshake_failed",
        }
    }
}

type Conn = tokio_rustls::client::TlsStream<TcpStream>;

/// Runs the agent to its end.
///
/// # Errors
/// [`AgentError`].
pub async fn run_agent(opts: AgentOptions) -> Result<AgentExit, AgentError> {
    let began = Instant::now();
    let (cred, bytes) = read_credential_file(&opts.credential)?;
    // Single use: nothing else on the node needs it.
    let _ = std::fs::remove_file(&opts.credential);
    let mut conn = dial(&cred.host, &cred.cert_sha256, opts.connect_grace).await?;
    write_msg(&mut conn, &Msg::Hello(bytes))
        .await
        .map_err(|e| AgentError::Handshake(e.to_string()))?;
    let spec = match read_msg(&mut conn, HANDSHAKE_CAP).await {
        Ok(Some(Msg::Welcome(spec))) => *spec,
        Ok(Some(Msg::Refused(r))) => {
            return Err(AgentError::Refused {
                code: r.code,
                message: r.message,
            });
        }
        Ok(other) => return Err(AgentError::Handshake(format!("unexpected reply {other:?}"))),
        Err(e) => return Err(AgentError::Handshake(e.to_string())),
    };
    let admitted_after_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
    let config = kernel_config(&spec, &opts);
    // A directory the agent made under the temporary directory is scratch
    // of this run (its name has the agent's pid): removed once the worker
    // is gone, so a node running thousands of kernels keeps none of them.
    // One under `--state-dir` is kept.
    let scratch = ScratchDir(opts.state_dir.is_none().then(|| config.session_dir.clone()));
    let (local, launch) = match LocalLink::spawn(&config).await {
        Ok(x) => x,
        Err(e) => {
            scratch.remove();
            let _ = write_msg(&mut conn, &Msg::SpawnFailed(e.to_string())).await;
            return Err(AgentError::Spawn(e.to_string()));
        }
    };
    let started = Started {
        node: node_name(),
        init_pid: 0,
        sandboxed: launch.sandboxed,
        host_layers: launch.host_layers.clone(),
        limits: launch.limits.clone(),
        admitted_after_ms: Some(admitted_after_ms),
    };
    write_msg(&mut conn, &Msg::Started(started))
        .await
        .map_err(|e| AgentError::Handshake(e.to_string()))?;
    Ok(relay(
        conn,
        local,
        opts.connect_grace,
        Duration::from_millis(spec.heartbeat_ms.max(100)),
        &scratch,
    )
    .await)
}

/// The kernel's session directory on this node when it is the agent's
/// scratch (`None`: kept).
struct ScratchDir(Option<PathBuf>);

impl ScratchDir {
    /// Removes the directory (once the worker is gone); errors are logged.
    fn remove(&self) {
        if let Some(d) = &self.0
            && let Err(e) = std::fs::remove_dir_all(d)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cannot remove the kernel's directory {}: {e}", d.display());
        }
    }
}

/// This node's host name.
pub fn node_name() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

/// First pause before dialling again after a refused or failed attempt;
/// it doubles up to [`REDIAL_MAX`], with jitter.
const REDIAL_FIRST: Duration = Duration::from_millis(50);
/// Longest pause between attempts.
const REDIAL_MAX: Duration = Duration::from_secs(1);

/// Whether a failed TLS connect is the host turning the connection away
/// before TLS (closed or reset: its bound on pending handshakes, 64, is
/// reached), which is worth another attempt, rather than TLS refusing the
/// host (a certificate other than the pinned one), which is not.
fn turned_away(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
    )
}

/// The pause before attempt `attempt` (1 = the first retry): doubling
/// from [`REDIAL_FIRST`] to [`REDIAL_MAX`], each between half and all of
/// that, so agents turned away together do not come back together.
fn redial_pause(attempt: u32) -> Duration {
    let full = REDIAL_FIRST
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(10))
        .min(REDIAL_MAX);
    let r = u16::from_le_bytes(crate::random_bytes::<2>());
    full / 2 + full.mul_f64(f64::from(r) / f64::from(u16::MAX) / 2.0)
}

/// Connects and completes TLS, retrying within `grace` while the host is
/// unreachable or turns the connection away before TLS (so a thousand
/// agents started at once all get in, paced by the host's bound on pending
/// handshakes); a TLS failure of the pinned certificate is final.
async fn dial(host: &str, pin: &str, grace: Duration) -> Result<Conn, AgentError> {
    let connector = TlsConnector::from(crate::tls::client_config(pin).map_err(|reason| AgentError::Tls {
        host: host.to_string(),
        reason,
    })?);
    let until = Instant::now() + grace;
    let mut attempt = 0u32;
    loop {
        let err = match TcpStream::connect(host).await {
            Ok(tcp) => {
                let _ = tcp.set_nodelay(true);
                match connector.connect(crate::tls::server_name(), tcp).await {
                    Ok(conn) => return Ok(conn),
                    Err(e) if turned_away(&e) => AgentError::Unreachable {
                        host: host.to_string(),
                        reason: format!("the host closed the connection before TLS (busy): {e}"),
                    },
                    Err(e) => {
                        return Err(AgentError::Tls {
                            host: host.to_string(),
                            reason: e.to_string(),
                        });
                    }
                }
            }
            Err(e) => AgentError::Unreachable {
                host: host.to_string(),
                reason: e.to_string(),
            },
        };
        attempt += 1;
        let pause = redial_pause(attempt);
        if Instant::now() + pause >= until {
            return Err(err);
        }
        tokio::time::sleep(pause).await;
    }
}

/// The node's kernel config for the host's spec: this node's environment
/// (through the allowlist), its own session directory and sandbox with
/// the host's mode, network, limits and disabled layers.
fn kernel_config(spec: &AgentSpec, opts: &AgentOptions) -> KernelConfig {
    let python = opts.python.clone().unwrap_or_else(|| spec.python.clone());
    let base = opts.state_dir.clone().unwrap_or_else(std::env::temp_dir);
    let session_dir = base.join(format!(
        "cellhost-agent-{}-{}-{}",
        sanitize(&spec.session),
        spec.generation,
        std::process::id()
    ));
    let mut config = KernelConfig::new(python, session_dir);
    if let Some(rt) = cellhost_kernel::for_language(&spec.language) {
        config.runtime = rt;
    }
    config.session = spec.session.clone();
    config.generation = spec.generation;
    config.limits = spec.limits.clone();
    let mut sandbox = spec.sandbox.clone();
    // Paths of the host mean nothing here.
    sandbox.extra_rw.clear();
    sandbox.extra_ro.clear();
    sandbox.workdir = None;
    sandbox.hidden.clear();
    config.sandbox = sandbox;
    config.startup_timeout = Duration::from_millis(spec.startup_timeout_ms);
    config
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect()
}

fn snapshot(local: &LocalLink) -> Option<UsageSnapshot> {
    local.usage().map(|u| UsageSnapshot {
        pids_limit_hits: u.pids_limit_hits(),
        pids_max: u.pids_max(),
        oom_kills: u.oom_kills(),
        processes: u.processes(),
    })
}

async fn relay(
    conn: Conn,
    mut local: LocalLink,
    grace: Duration,
    heartbeat: Duration,
    scratch: &ScratchDir,
) -> AgentExit {
    let (mut rd, mut wr) = tokio::io::split(conn);
    let (in_tx, mut in_rx) = mpsc::channel::<Result<Option<Msg>, WireError>>(16);
    tokio::spawn(async move {
        loop {
            let m = read_msg(&mut rd, MAX_MESSAGE).await;
            let end = !matches!(m, Ok(Some(_)));
            if in_tx.send(m).await.is_err() || end {
                return;
            }
        }
    });
    let mut exited = false;
    let mut open = [true, true];
    let mut host_gone_at: Option<Instant> = None;
    let mut last_heard = Instant::now();
    let mut ping = tokio::time::interval(heartbeat);
    let mut wire_ok = true;
    // How many more times a starved wake-up past the silence deadline
    // re-arms it (reset whenever the host is heard).
    let mut recheck_left = STARVED_RECHECKS;
    loop {
        if exited && host_gone_at.is_some() {
            return AgentExit::Done;
        }
        let lost_at = host_gone_at.unwrap_or(last_heard) + grace;
        tokio::select! {
            ev = local.next_event(), if !(exited && open == [false, false]) => {
                let msgs = match ev {
                    LinkEvent::Frame(WorkerFrame::Ready { pid, python, executable, protocol, .. }) => {
                        // The host uses no shared-memory rings of a remote
                        // worker: every byte comes through the pipes.
                        let ids = local.worker_ready(pid, &[]);
                        let frame = WorkerFrame::Ready { pid, python, executable, protocol, rings: Vec::new() };
                        vec![
                            Msg::Pids(WorkerPids { pid: ids.pid, init_pid: ids.init_pid }),
                            Msg::Frame(serde_json::to_vec(&frame).unwrap_or_default()),
                        ]
                    }
                    LinkEvent::Frame(f) => {
                        let mut v = Vec::new();
                        if matches!(f, WorkerFrame::Response { .. })
                            && let Some(u) = snapshot(&local)
                        {
                            v.push(Msg::Usage(u));
                        }
                        v.push(Msg::Frame(serde_json::to_vec(&f).unwrap_or_default()));
                        v
                    }
                    LinkEvent::ControlClosed => vec![Msg::ControlClosed],
                    LinkEvent::ControlError(e) => vec![Msg::ControlError(e.to_string())],
                    LinkEvent::Output { stream, bytes } => {
                        let s = stream.index() as u8;
                        let v = bytes.chunks(OUTPUT_CHUNK).map(|c| Msg::Output(s, c.to_vec())).collect();
                        local.recycle(stream, bytes);
                        v
                    }
                    LinkEvent::OutputClosed(stream) => {
                        open[stream.index()] = false;
                        vec![Msg::OutputClosed(stream.index() as u8)]
                    }
                    LinkEvent::Exited(st) => {
                        exited = true;
                        // Before the host hears of the exit: its answer may
                        // be to cancel (kill) this agent.
                        scratch.remove();
                        let mut v: Vec<Msg> = snapshot(&local).map(Msg::Usage).into_iter().collect();
                        v.push(Msg::Exited(st.into_raw()));
                        v
                    }
                };
                if wire_ok {
                    for m in &msgs {
                        if write_msg(&mut wr, m).await.is_err() {
                            wire_ok = false;
                            host_gone_at.get_or_insert_with(Instant::now);
                            break;
                        }
                    }
                }
            }
            m = in_rx.recv(), if host_gone_at.is_none() => match m {
                Some(Ok(Some(msg))) => {
                    last_heard = Instant::now();
                    recheck_left = STARVED_RECHECKS;
                    match msg {
                        Msg::Send(b) => match serde_json::from_slice::<HostFrame>(&b) {
                            Ok(f) => {
                                if let Err(e) = local.send(&f).await {
                                    tracing::warn!("cannot pass a frame to the worker: {e}");
                                }
                            }
                            Err(e) => tracing::warn!("malformed host frame dropped: {e}"),
                        },
                        Msg::Interrupt => {
                            let r = local.interrupt();
                            let done = InterruptDone { delivered: r.is_ok(), reason: r.err() };
                            if wire_ok && write_msg(&mut wr, &Msg::InterruptDone(done)).await.is_err() {
                                wire_ok = false;
                            }
                        }
                        Msg::Terminate => local.terminate(),
                        Msg::ForceKill => local.force_kill(),
                        Msg::CloseOutput => {
                            local.close_output();
                            open = [false, false];
                        }
                        Msg::Ping => {}
                        other => tracing::warn!("unexpected message from the host dropped: {other:?}"),
                    }
                }
                _ => {
                    host_gone_at = Some(Instant::now());
                }
            },
            _ = ping.tick(), if wire_ok && host_gone_at.is_none() => {
                if write_msg(&mut wr, &Msg::Ping).await.is_err() {
                    wire_ok = false;
                    host_gone_at = Some(Instant::now());
                }
            }
            _ = tokio::time::sleep_until(lost_at.into()), if !exited => {
                if host_gone_at.is_none() {
                    // The reader task may hold the host's messages that a
                    // starved agent has not taken yet: let it run first.
                    tokio::task::yield_now().await;
                }
                match silence_verdict(Instant::now(), lost_at, heartbeat, !in_rx.is_empty(), host_gone_at.is_some(), recheck_left) {
                    Silence::Heard => continue,
                    Silence::Starved => {
                        recheck_left -= 1;
                        tracing::info!("the agent woke {} ms past the host's silence deadline (starved): listening {} s more",
                            Instant::now().saturating_duration_since(lost_at).as_millis(), (2 * heartbeat).as_secs_f64());
                        last_heard = Instant::now().checked_sub(grace).map_or_else(Instant::now, |t| t + 2 * heartbeat);
                        continue;
                    }
                    Silence::Lost => {}
                }
                tracing::warn!("the host is gone for longer than {} s: killing the worker", grace.as_secs_f64());
                local.force_kill();
                local.terminate();
                wait_exit(&mut local).await;
                local.release();
                scratch.remove();
                return AgentExit::HostLost;
            }
        }
    }
}

/// How many starved wake-ups in a row may re-arm the silence deadline.
const STARVED_RECHECKS: u32 = 3;

/// What the silence deadline means when its timer fires.
#[derive(Debug, PartialEq, Eq)]
enum Silence {
    /// A message of the host is waiting: it was not silent, the agent was slow.
    Heard,
    /// The timer fired more than a heartbeat late: the agent was not
    /// scheduled (an overloaded machine), so the silence is not the host's
    /// alone; listen for two more heartbeats.
    Starved,
    /// The host was silent for the whole grace (or its connection is broken).
    Lost,
}

/// The verdict on the host's silence when the deadline `lost_at` fires at
/// `now`: `pending` when the reader has a message of the host waiting,
/// `broken` when the connection already failed (then only the grace runs),
/// `recheck_left` starved re-arms left.
fn silence_verdict(
    now: Instant,
    lost_at: Instant,
    heartbeat: Duration,
    pending: bool,
    broken: bool,
    recheck_left: u32,
) -> Silence {
    if broken {
        return Silence::Lost;
    }
    if pending {
        return Silence::Heard;
    }
    if recheck_left > 0 && now.saturating_duration_since(lost_at) > heartbeat {
        return Silence::Starved;
    }
    Silence::Lost
}

/// Waits for the tree's end after a kill (the link reaps its init).
async fn wait_exit(local: &mut LocalLink) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(until.into(), local.next_event()).await {
            Ok(LinkEvent::Exited(_)) | Err(_) => return,
            Ok(LinkEvent::Output { stream, bytes }) => local.recycle(stream, bytes),
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_message_or_a_starved_wake_up_is_not_the_hosts_silence() {
        let hb = Duration::from_secs(5);
        let due = Instant::now();
        // On time, nothing waiting: lost.
        assert_eq!(silence_verdict(due, due, hb, false, false, 3), Silence::Lost);
        // A message of the host is waiting: heard, however late.
        assert_eq!(
            silence_verdict(due + 60 * hb, due, hb, true, false, 0),
            Silence::Heard
        );
        // Woken long past the deadline: starved, while re-arms are left.
        assert_eq!(
            silence_verdict(due + 3 * hb, due, hb, false, false, 1),
            Silence::Starved
        );
        assert_eq!(
            silence_verdict(due + 3 * hb, due, hb, false, false, 0),
            Silence::Lost
        );
        // A broken connection is lost whatever waits.
        assert_eq!(
            silence_verdict(due + 3 * hb, due, hb, true, true, 3),
            Silence::Lost
        );
    }

    #[test]
    fn redial_pauses_double_with_jitter_up_to_the_cap() {
        for attempt in 1..40 {
            let full = REDIAL_FIRST
                .saturating_mul(1u32 << (attempt - 1).min(10))
                .min(REDIAL_MAX);
            let p = redial_pause(attempt);
            assert!(p >= full / 2 && p <= full, "attempt {attempt}: {p:?} vs {full:?}");
        }
        assert!(redial_pause(100) <= REDIAL_MAX);
    }

    #[test]
    fn only_a_connection_closed_before_tls_is_retried() {
        use std::io::{Error, ErrorKind};
        assert!(turned_away(&Error::from(ErrorKind::UnexpectedEof)));
        assert!(turned_away(&Error::from(ErrorKind::ConnectionReset)));
        assert!(!turned_away(&Error::new(
            ErrorKind::InvalidData,
            "invalid peer certificate"
        )));
    }
}
