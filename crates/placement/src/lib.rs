//! The seam between cellhost's host and whatever starts a node agent
//! somewhere else: [`Placement`].
//!
//! A remote kernel is a worker started by `cellhost agent` on another node;
//! the agent dials back to the host over TLS with a single-use credential
//! and carries the worker's link (see the `cellhost-remote` crate). A
//! placement only *starts* that agent through the cluster's own scheduler
//! (`sbatch`, a Kubernetes Pod, `ssh`) and can cancel or query it; it never
//! schedules anything itself, and it never sees the worker's protocol.
//!
//! Contract for every implementation:
//! * [`Placement::place`] returns once the scheduler accepted the request
//!   (a job id, a pod name, a running `ssh`), not once the agent dialled
//!   back; the host waits for the dial-back with its own deadline.
//! * The credential reaches the agent as a file readable only by the
//!   agent's user (mode 0600), never on a command line or in the
//!   environment; `agent_argv` names that file with
//!   [`CREDENTIAL_PLACEHOLDER`], which the placement replaces by the path
//!   it wrote the file to on the node.
//! * The request's `token` is the idempotency key: placing twice with one
//!   token must not start two agents (Slurm: the job name or comment;
//!   Kubernetes: the Pod name).
//! * [`Placement::cancel`] ends the agent and everything it started
//!   (`scancel`, Pod deletion, killing the ssh session); cancelling a job
//!   that already ended is not an error.
//! * Failures are [`PlacementError`]s carrying the scheduler's own message.

use std::collections::BTreeMap;
use std::time::Duration;

/// Stands for the on-node path of the credential file inside
/// [`PlacementRequest::agent_argv`].
pub const CREDENTIAL_PLACEHOLDER: &str = "{credential}";

/// What the host asks a scheduler to start.
#[derive(Debug, Clone)]
pub struct PlacementRequest {
    /// Idempotency key, unique per (session, generation): `cellhost-<hex>`.
    pub token: String,
    /// The session this kernel belongs to (for job names and logs).
    pub session: String,
    /// The kernel's generation the host assigned.
    pub generation: u64,
    /// The agent's command line on the node, program first; one element is
    /// [`CREDENTIAL_PLACEHOLDER`].
    pub agent_argv: Vec<String>,
    /// The credential file's bytes (written 0600 on the node).
    pub credential: Vec<u8>,
    /// Environment for the agent (the scheduler's own job variables are
    /// added by the scheduler, not here). Never contains secrets.
    pub env: BTreeMap<String, String>,
    /// How long the agent may wait in the scheduler's queue before the
    /// host gives up (the placement may pass it on, e.g. `--deadline`).
    pub queue_timeout: Duration,
}

/// A scheduler accepted a [`PlacementRequest`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placed {
    /// Placement kind: `slurm`, `kubernetes`, `ssh`, `loopback`.
    pub kind: String,
    /// The scheduler's id of what was started (Slurm job id, Pod name,
    /// ssh destination and pid).
    pub job: String,
    /// The node it runs on, once known.
    pub node: Option<String>,
}

/// Where a placed agent stands, as the scheduler reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PlacedState {
    /// Waiting in the scheduler's queue (`PENDING`, Pod `Pending`), with
    /// the scheduler's reason when it gives one.
    Queued {
        /// E.g. `Resources`, `Unschedulable: 0/3 nodes are available…`.
        reason: Option<String>,
    },
    /// Running on `node`.
    Running {
        /// The node's name.
        node: Option<String>,
    },
    /// Ended (completed, failed, cancelled, deleted), with the scheduler's
    /// description.
    Ended {
        /// E.g. `FAILED (exit 1)`, `CANCELLED`, `OOMKilled`.
        detail: String,
    },
}

/// Why a placement failed; every variant keeps the scheduler's own words.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    /// The scheduler refused the request (`sbatch: error: …`, an API
    /// `422`), e.g. an unknown partition or a queue at its limit.
    #[error("the {kind} scheduler rejected the kernel: {message}")]
    Rejected {
        /// Placement kind.
        kind: String,
        /// The scheduler's message.
        message: String,
    },
    /// Accepted but cannot run (Pod unschedulable, job held).
    #[error("the {kind} scheduler cannot run the kernel: {message}")]
    Unschedulable {
        /// Placement kind.
        kind: String,
        /// The scheduler's message.
        message: String,
    },
    /// The scheduler (its command or API) could not be reached or failed.
    #[error("the {kind} scheduler could not be used: {message}")]
    Unavailable {
        /// Placement kind.
        kind: String,
        /// What failed (command not found, connection refused, …).
        message: String,
    },
    /// The placement's configuration is invalid.
    #[error("placement {name:?} is misconfigured: {message}")]
    Config {
        /// Name of the `[placement.<name>]` table.
        name: String,
        /// What is wrong.
        message: String,
    },
}

impl PlacementError {
    /// Stable code on every surface: `placement_rejected`,
    /// `placement_unschedulable`, `placement_unavailable`, `placement_config`.
    pub fn code(&self) -> &'static str {
        match self {
            PlacementError::Rejected { .. } => "placement_rejected",
            PlacementError::Unschedulable { .. } => "placement_unschedulable",
            PlacementError::Unavailable { .. } => "placement_unavailable",
            PlacementError::Config { .. } => "placement_config",
        }
    }
}

/// Starts node agents through a scheduler. See the crate docs for the
/// contract every implementation keeps.
pub trait Placement: Send + Sync + std::fmt::Debug {
    /// `slurm`, `kubernetes`, `ssh`, `loopback`.
    fn kind(&self) -> &'static str;

    /// Asks the scheduler to start the agent.
    ///
    /// # Errors
    /// [`PlacementError`] with the scheduler's message.
    fn place(
        &self,
        request: &PlacementRequest,
    ) -> impl std::future::Future<Output = Result<Placed, PlacementError>> + Send;

    /// What the scheduler says about a placed agent now.
    ///
    /// # Errors
    /// [`PlacementError::Unavailable`] when the scheduler cannot be asked.
    fn state(
        &self,
        placed: &Placed,
    ) -> impl std::future::Future<Output = Result<PlacedState, PlacementError>> + Send;

    /// Ends the agent and all it started; idempotent.
    ///
    /// # Errors
    /// [`PlacementError::Unavailable`] when the scheduler cannot be asked.
    fn cancel(&self, placed: &Placed)
    -> impl std::future::Future<Output = Result<(), PlacementError>> + Send;
}
