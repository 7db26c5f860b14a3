//! The messages of the host ↔ agent connection and their framing.
//!
//! One TLS connection carries everything of one remote kernel. A message
//! is `u32` big-endian length (of what follows), one kind byte, then the
//! payload: raw bytes for output, JSON for everything structured (worker
//! frames keep the worker protocol's JSON, see `cellhost-protocol`). The
//! length is checked against a cap *before* anything is allocated:
//! [`HANDSHAKE_CAP`] until the agent is admitted, [`MAX_MESSAGE`] after.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest message before admission (the handshake size cap):
/// 64 KiB. A longer one refuses the connection.
pub const HANDSHAKE_CAP: usize = 64 * 1024;

/// Largest message after admission: a worker frame at the protocol's cap
/// ([`cellhost_protocol::MAX_FRAME_BYTES`]) plus the kind byte.
pub const MAX_MESSAGE: usize = cellhost_protocol::MAX_FRAME_BYTES + 1;

/// Output is sent in chunks of at most this many bytes (1 MiB), so one
/// busy stream cannot hold the connection for long.
pub const OUTPUT_CHUNK: usize = 1 << 20;

/// What the agent reports once its worker's init runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Started {
    /// The node's host name.
    pub node: String,
    /// Pid of the kernel init on the node.
    pub init_pid: u32,
    /// A sandbox profile is active (the init's `sandbox` report follows).
    pub sandboxed: bool,
    /// Layers the agent applied around the init (its cgroups), as
    /// `kernel.sandbox` reports them.
    pub host_layers: Vec<cellhost_sandbox::profile::LayerStatus>,
    /// The cgroup limits in effect on the node, when there is a cgroup.
    pub limits: Option<cellhost_sandbox::cgroup::CgroupLimits>,
    /// Milliseconds from the agent's start to the host's `Welcome` (the
    /// dial back, TLS and the credential check), on the node's clock;
    /// absent from an agent that does not measure it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_after_ms: Option<u64>,
}

/// The node's view of the worker once it said `ready`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerPids {
    /// The worker's pid on the node (pid namespaces translated).
    pub pid: u32,
    /// The kernel init's pid on the node.
    pub init_pid: u32,
}

/// The tree's accounting on the node (its cgroups), sent before every
/// `response` frame and before the exit status.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct UsageSnapshot {
    /// Times the tree hit its process limit.
    pub pids_limit_hits: u64,
    /// The process limit.
    pub pids_max: Option<u64>,
    /// Processes the OOM killer ended.
    pub oom_kills: u64,
    /// Processes in the tree.
    pub processes: usize,
}

/// What the host tells the agent to run (the host's kernel config, as far
/// as it concerns the node).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentSpec {
    /// Session name.
    pub session: String,
    /// The generation the host assigned at the handshake.
    pub generation: u64,
    /// `python`, `r`.
    pub language: String,
    /// The interpreter the host names (the agent's `--python` overrides).
    pub python: std::path::PathBuf,
    /// Confinement on the node: mode, network, limits, rlimits and
    /// disabled layers (host paths are not sent).
    pub sandbox: cellhost_sandbox::profile::SandboxProfile,
    /// The caller's own cgroup limits.
    pub limits: cellhost_sandbox::cgroup::CgroupLimits,
    /// Host tools the cells may call (the calls come back to the host).
    pub tools: Vec<String>,
    /// How long the worker may take to say `ready`, in milliseconds.
    pub startup_timeout_ms: u64,
    /// Interval of the host's heartbeats, in milliseconds.
    pub heartbeat_ms: u64,
}

/// Why the host refused an agent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Refusal {
    /// Stable code, see [`crate::AdmissionError::code`].
    pub code: String,
    /// For a reader.
    pub message: String,
}

/// The agent's report of an interrupt it delivered (or could not).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct InterruptDone {
    /// `tgkill` succeeded.
    pub delivered: bool,
    /// Why not.
    pub reason: Option<String>,
}

/// One message on the connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    /// Agent → host, first: the credential file's bytes.
    Hello(Vec<u8>),
    /// Host → agent: admitted; what to run.
    Welcome(Box<AgentSpec>),
    /// Host → agent: refused (then the host closes).
    Refused(Refusal),
    /// Agent → host: the worker's init runs.
    Started(Started),
    /// Agent → host: the worker could not be started (the kernel error's
    /// text).
    SpawnFailed(String),
    /// Agent → host: a worker frame (its JSON).
    Frame(Vec<u8>),
    /// Agent → host: the worker's control channel ended.
    ControlClosed,
    /// Agent → host: the worker's control channel broke.
    ControlError(String),
    /// Agent → host: bytes of stdout (0) or stderr (1).
    Output(u8, Vec<u8>),
    /// Agent → host: a stream ended.
    OutputClosed(u8),
    /// Agent → host: the tree ended; the raw wait status.
    Exited(i32),
    /// Agent → host: worker pids on the node.
    Pids(WorkerPids),
    /// Agent → host: the tree's accounting.
    Usage(UsageSnapshot),
    /// Agent → host: an interrupt's delivery.
    InterruptDone(InterruptDone),
    /// Host → agent: a host frame (its JSON).
    Send(Vec<u8>),
    /// Host → agent: wake the worker's main thread (`tgkill` SIGINT).
    Interrupt,
    /// Host → agent: kill and reap the whole tree through its init.
    Terminate,
    /// Host → agent: kill what is left of the tree.
    ForceKill,
    /// Host → agent: stop reading the output streams.
    CloseOutput,
    /// Either way: heartbeat.
    Ping,
}

/// A message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The declared length passes the cap.
    #[error("message of {len} bytes exceeds the cap of {cap} bytes")]
    Oversized {
        /// Declared length.
        len: usize,
        /// The cap.
        cap: usize,
    },
    /// Unknown kind byte, or a payload that does not decode.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The connection failed or ended inside a message.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    // The types here always encode.
    serde_json::to_vec(v).unwrap_or_default()
}

fn de<T: for<'a> Deserialize<'a>>(b: &[u8]) -> Result<T, WireError> {
    serde_json::from_slice(b).map_err(|e| WireError::Malformed(e.to_string()))
}

impl Msg {
    fn encode(&self) -> (u8, std::borrow::Cow<'_, [u8]>) {
        use std::borrow::Cow::{Borrowed, Owned};
        match self {
            Msg::Hello(b) => (1, Borrowed(b)),
            Msg::Welcome(s) => (2, Owned(json(s))),
            Msg::Refused(r) => (3, Owned(json(r))),
            Msg::Started(s) => (4, Owned(json(s))),
            Msg::SpawnFailed(s) => (5, Borrowed(s.as_bytes())),
            Msg::Frame(b) => (6, Borrowed(b)),
            Msg::ControlClosed => (7, Borrowed(&[])),
            Msg::ControlError(s) => (8, Borrowed(s.as_bytes())),
            Msg::Output(0, b) => (9, Borrowed(b)),
            Msg::Output(_, b) => (10, Borrowed(b)),
            Msg::OutputClosed(s) => (11, Owned(vec![*s])),
            Msg::Exited(st) => (12, Owned(st.to_be_bytes().to_vec())),
            Msg::Pids(p) => (13, Owned(json(p))),
            Msg::Usage(u) => (14, Owned(json(u))),
            Msg::InterruptDone(d) => (15, Owned(json(d))),
            Msg::Send(b) => (16, Borrowed(b)),
            Msg::Interrupt => (17, Borrowed(&[])),
            Msg::Terminate => (18, Borrowed(&[])),
            Msg::ForceKill => (19, Borrowed(&[])),
            Msg::CloseOutput => (20, Borrowed(&[])),
            Msg::Ping => (21, Borrowed(&[])),
        }
    }

    fn decode(kind: u8, b: Vec<u8>) -> Result<Msg, WireError> {
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        Ok(match kind {
            1 => Msg::Hello(b),
            2 => Msg::Welcome(Box::new(de(&b)?)),
            3 => Msg::Refused(de(&b)?),
            4 => Msg::Started(de(&b)?),
            5 => Msg::SpawnFailed(text(b)),
            6 => Msg::Frame(b),
            7 => Msg::ControlClosed,
            8 => Msg::ControlError(text(b)),
            9 => Msg::Output(0, b),
            10 => Msg::Output(1, b),
            11 => match b.as_slice() {
                [s @ (0 | 1)] => Msg::OutputClosed(*s),
                _ => return Err(WireError::Malformed("bad stream of output_closed".into())),
            },
            12 => {
                let raw: [u8; 4] = b
                    .as_slice()
                    .try_into()
                    .map_err(|_| WireError::Malformed("bad exit status".into()))?;
                Msg::Exited(i32::from_be_bytes(raw))
            }
            13 => Msg::Pids(de(&b)?),
            14 => Msg::Usage(de(&b)?),
            15 => Msg::InterruptDone(de(&b)?),
            16 => Msg::Send(b),
            17 => Msg::Interrupt,
            18 => Msg::Terminate,
            19 => Msg::ForceKill,
            20 => Msg::CloseOutput,
            21 => Msg::Ping,
            k => return Err(WireError::Malformed(format!("unknown message kind {k}"))),
        })
    }
}

/// Writes one message.
///
/// # Errors
/// The connection's I/O error.
pub async fn write_msg<W: AsyncWrite + Unpin>(w: &mut W, msg: &Msg) -> std::io::Result<()> {
    let (kind, payload) = msg.encode();
    let len = u32::try_from(payload.len() + 1).map_err(|_| std::io::Error::other("message too large"))?;
    let mut head = [0u8; 5];
    head[..4].copy_from_slice(&len.to_be_bytes());
    head[4] = kind;
    w.write_all(&head).await?;
    w.write_all(&payload).await?;
    w.flush().await
}

/// Reads one message of at most `cap` bytes; `Ok(None)` at a clean end of
/// the connection (between messages). Not cancel-safe: readers run in a
/// task of their own.
///
/// # Errors
/// [`WireError::Oversized`] (nothing of the body is read),
/// [`WireError::Malformed`], [`WireError::Io`] (also the end inside a
/// message).
pub async fn read_msg<R: AsyncRead + Unpin>(r: &mut R, cap: usize) -> Result<Option<Msg>, WireError> {
    let mut len = [0u8; 4];
    match r.read(&mut len[..1]).await? {
        0 => return Ok(None),
        _ => r.read_exact(&mut len[1..]).await?,
    };
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 {
        return Err(WireError::Malformed("empty message".into()));
    }
    if len > cap {
        return Err(WireError::Oversized { len, cap });
    }
    let mut kind = [0u8; 1];
    r.read_exact(&mut kind).await?;
    let mut body = vec![0u8; len - 1];
    r.read_exact(&mut body).await?;
    Msg::decode(kind[0], body).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_round_trip_and_caps_are_checked_before_reading() {
        let msgs = vec![
            Msg::Hello(b"cred".to_vec()),
            Msg::Output(1, vec![0, 255, 10]),
            Msg::OutputClosed(0),
            Msg::Exited(9),
            Msg::Usage(UsageSnapshot {
                pids_limit_hits: 1,
                pids_max: Some(5),
                oom_kills: 0,
                processes: 3,
            }),
            Msg::Ping,
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            write_msg(&mut buf, m).await.expect("write");
        }
        let mut r = buf.as_slice();
        for m in &msgs {
            assert_eq!(read_msg(&mut r, 1024).await.expect("read").as_ref(), Some(m));
        }
        assert!(read_msg(&mut r, 1024).await.expect("eof").is_none());

        let mut big = Vec::new();
        write_msg(&mut big, &Msg::Hello(vec![7; 100]))
            .await
            .expect("write");
        let err = read_msg(&mut big.as_slice(), 50).await.expect_err("over the cap");
        assert!(matches!(err, WireError::Oversized { len: 101, cap: 50 }));
        let garbage = [0u8, 0, 0, 2, 99, 1];
        let err = read_msg(&mut garbage.as_slice(), 50)
            .await
            .expect_err("unknown kind");
        assert!(matches!(err, WireError::Malformed(_)));
    }
}
