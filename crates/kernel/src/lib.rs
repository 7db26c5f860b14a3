//! One supervised, persistent kernel: a worker process of some language
//! runtime, driven over the worker protocol.
//!
//! A [`Kernel`] is one worker incarnation plus its host-side handle; a
//! [`Session`] is the named thing a caller talks to, which outlives its
//! kernels (each new kernel is a new *generation*).
//!
//! Two seams keep the pieces apart:
//! * [`runtime::WorkerRuntime`]: what a language needs (how to start its
//!   worker, its boot files, environment, sandbox paths, hints, whether
//!   templates apply); [`runtime::python::PythonRuntime`] is the first.
//! * [`link::WorkerLink`]: what the driver needs from a running worker
//!   (control frames, the two output byte streams, interrupt, whole-tree
//!   kill, exit status, usage); the local process is the first.
//!
//! ```text
//! Kernel (handle) ──commands──▶ driver task ──WorkerLink──▶ local link
//!                                 (cells, markers,            (init, pidfd, pipes,
//!                                  deadlines, settle)          rings, cgroups)
//! host ──fork (spawner thread)──▶ kernel init (setsid, subreaper, pdeathsig)
//!                                   └─fork/exec──▶ <runtime's worker argv>
//!   control: socketpair (JSON lines, protocol v1) · fd 1/2: pipes (raw bytes)
//! ```
//!
//! Modules: `cell` and `result` hold the types every part shares;
//! `handshake` starts the conversation over any link; `driver` owns a
//! kernel (split by concern); `kernel` is the handle.
//!
//! Binaries that embed this crate must call
//! [`cellhost_sandbox::launcher::run_if_requested`] first thing in `main`
//! (the kernel init is a hidden subcommand of the running executable), or
//! set [`KernelConfig::launcher`] to a binary that does.

mod cell;
pub mod config;
pub mod cow;
mod driver;
pub mod error;
pub mod fault;
mod handshake;
mod hints;
pub mod kernel;
pub mod lineage;
pub mod link;
mod marker;
mod outputs;
pub use outputs::is_saved_file_mime;
pub mod restored;
pub mod result;
pub mod runtime;
mod seal;
pub mod session;
pub mod template;
pub mod tools;

pub use cellhost_capture::hostfs;
pub use cellhost_capture::{RedactionConfig, Redactor, SpillChunk, StreamLimits, read_spill};
pub use cellhost_egress as egress;
pub use config::{DisplayLimits, KernelConfig, KernelStarter};
pub use cow::CowInvite;
pub use error::KernelError;
pub use fault::Fault;
pub use kernel::{
    CellHandle, CellProgress, ExecOptions, InterruptOutcome, Kernel, KernelInfo, KernelPlacement, LiveEvent,
    PlacementStart, Variables,
};
pub use lineage::Lineage;
pub use link::local::criu;
pub use restored::{LostCell, LostName, ReplayFailure, ReplayReport, ReplayedCell, RestoredState};
pub use result::*;
pub use runtime::python::{PythonRuntime, files as worker_files, resolve_python};
pub use runtime::r::{RRuntime, resolve_r};
pub use runtime::{WorkerRuntime, for_language};
pub use session::Session;
pub use template::{Template, TemplateInfo};
pub use tools::{ToolCall, ToolCallRecord, ToolFuture, ToolHost};
