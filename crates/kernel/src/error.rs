//! Errors of the kernel layer.

use cellhost_protocol::ProtocolError;

/// What went wrong with a kernel or a request to it.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The interpreter could not be found or run.
    #[error("cannot start the interpreter {python}: {reason}")]
    Spawn {
        /// Interpreter path.
        python: String,
        /// Why (includes the worker's stderr when it printed something).
        reason: String,
    },
    /// The interpreter is older than the worker supports; found before the
    /// worker's own code is loaded (the boot line checks the version).
    #[error(
        "cannot start the interpreter {python}: needs Python {needs} or newer (found {found} at {python})"
    )]
    UnsupportedInterpreter {
        /// Interpreter path.
        python: String,
        /// The version it reported (`3.7.16`).
        found: String,
        /// The oldest supported version (`3.8`).
        needs: String,
    },
    /// Sandbox mode `enforce` and a confinement layer is not available.
    #[error(
        "kernel {kernel}: sandbox layer `{layer}` is not enforced ({reason}); mode `enforce` refuses to start the kernel"
    )]
    SandboxUnavailable {
        /// Kernel label.
        kernel: String,
        /// Layer name (`landlock`, `seccomp`, `netns`, `cgroup`, ...).
        layer: String,
        /// Why it is missing.
        reason: String,
    },
    /// Mode `auto` could not apply a layer that keeps the kernel off the
    /// host's network, processes and files (no user namespaces for a
    /// non-root user): refused unless the profile accepts a weak sandbox.
    #[error(
        "kernel {kernel}: sandbox layer `{layer}` is not available ({reason}); without it a kernel would reach the host's loopback services, see host processes and write the host's /tmp. Mode `auto` refuses to start it: pass `--sandbox off` for no sandbox, or set `allow_weak_sandbox = true` in the config to accept Landlock and seccomp only"
    )]
    WeakSandbox {
        /// Kernel label.
        kernel: String,
        /// Layer name (`userns`, `netns`, `pidns`, `mountns`).
        layer: String,
        /// Why it is missing.
        reason: String,
    },
    /// The worker did not say `ready` in time.
    #[error("kernel {kernel}: no `ready` from the worker within {timeout_ms} ms")]
    StartupTimeout {
        /// Kernel label (`session/generation`).
        kernel: String,
        /// The limit.
        timeout_ms: u64,
    },
    /// The worker speaks another protocol version.
    #[error("kernel {kernel}: worker speaks protocol {worker}, this host speaks {host}")]
    ProtocolMismatch {
        /// Kernel label.
        kernel: String,
        /// Version in the worker's `ready` frame.
        worker: u32,
        /// Version of this host.
        host: u32,
    },
    /// A frame from the worker was oversized or malformed; the kernel was killed.
    #[error("kernel {kernel}: protocol error: {source}")]
    Protocol {
        /// Kernel label.
        kernel: String,
        /// The codec error.
        #[source]
        source: ProtocolError,
    },
    /// The kernel is running a cell and the caller asked not to queue.
    #[error("kernel {kernel} is busy with cell {cell}")]
    KernelBusy {
        /// Kernel label.
        kernel: String,
        /// The running cell.
        cell: String,
    },
    /// The kernel's process is gone.
    #[error("kernel {kernel} is dead: {reason}")]
    Dead {
        /// Kernel label.
        kernel: String,
        /// How it died.
        reason: String,
    },
    /// An operation named a generation that has been replaced.
    #[error("session {session}: generation {requested} was replaced by generation {current}")]
    StaleGeneration {
        /// Session name.
        session: String,
        /// Generation the caller named.
        requested: u64,
        /// The live generation.
        current: u64,
    },
    /// A request argument is out of range.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A remote kernel could not be placed or admitted: the placement's
    /// scheduler refused or failed, the node agent did not dial back in
    /// time, or its handshake was refused. `code` is stable
    /// (`placement_rejected`, `placement_unschedulable`,
    /// `placement_unavailable`, `placement_config`, `dial_back_timeout`,
    /// `dial_back_failed`,
    /// `admission_refused`, `remote_failed`).
    #[error("kernel {kernel}: {message}")]
    Remote {
        /// Kernel label.
        kernel: String,
        /// The stable code.
        code: &'static str,
        /// What happened, with the scheduler's or the agent's own words.
        message: String,
    },
    /// Host-side I/O (session directory, pipes).
    #[error("kernel {kernel}: {context}: {source}")]
    Io {
        /// Kernel label (or `-` before one exists).
        kernel: String,
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl KernelError {
    pub(crate) fn io(kernel: &str, context: impl Into<String>, source: std::io::Error) -> Self {
        KernelError::Io {
            kernel: kernel.to_string(),
            context: context.into(),
            source,
        }
    }
}
