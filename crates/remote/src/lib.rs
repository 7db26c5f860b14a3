//! Remote kernels: a worker on another node, started by that node's
//! `cellhost agent`, behaving exactly like a local kernel.
//!
//! ```text
//! host: Kernel ─ driver ─ RemoteLink ══ TLS (one connection) ══ agent: LocalLink ─ kernel init ─ worker
//!        RemoteStarter ─ Placement::place(credential 0600) ─▶ scheduler starts `cellhost agent`
//!        RemoteHost (listener, admission) ◀── agent dials back, pins the host certificate
//! ```
//!
//! * [`host`]: the TLS listener and admission (single-use HMAC
//!   credentials, nonces burned in a [`NonceStore`], handshake deadline,
//!   size cap and a bound on pending handshakes).
//! * [`link`]: [`RemoteLink`], the kernel crate's `WorkerLink` over the
//!   connection (control frames, both output streams, interrupt, kill,
//!   exit status, usage), and the lost connection as a clear status.
//! * [`agent`]: the node agent.
//! * [`wire`]: the messages and their length-prefixed framing.
//! * [`credential`], [`tls`]: the credential file and the pinned TLS.
//! * [`placements`]: the placements by kind ([`AnyPlacement`]);
//!   [`loopback`] is the local one; [`starter`] turns a placement into the
//!   kernel crate's `KernelStarter`.

pub mod agent;
pub mod credential;
pub mod host;
pub mod link;
pub mod loopback;
pub mod placements;
pub mod starter;
pub mod tls;
pub mod wire;

pub use agent::{AgentError, AgentExit, AgentOptions, run_agent};
pub use host::{AdmissionError, HostOptions, MemoryNonces, NonceStore, RemoteHost};
pub use link::RemoteLink;
pub use loopback::LoopbackPlacement;
pub use placements::AnyPlacement;
pub use starter::RemoteStarter;
pub use tls::HostIdentity;

/// `N` bytes from the OS's random source.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if getrandom::fill(&mut b).is_err() {
        // No randomness at all: refuse to make guessable secrets.
        panic!("the OS random source failed");
    }
    b
}
