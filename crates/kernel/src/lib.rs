//! One supervised, persistent Python kernel.
//!
//! A [`Kernel`] is one worker process incarnation plus its host-side handle;
//! a [`Session`] is the named thing a caller talks to, which outlives its
//! kernels (each new kernel is a new *generation*).
//!
//! ```text
//! host ──fork (spawner thread)──▶ kernel init (setsid, subreaper, pdeathsig)
//!                                   └─fork/exec──▶ python -c <boot> (worker)
//!   control: socketpair (JSON lines, protocol v1) · fd 1/2: pipes (raw bytes)
//! ```
//!
//! Binaries that embed this crate must call
//! [`cellhost_sandbox::launcher::run_if_requested`] first thing in `main`
//! (the kernel init is a hidden subcommand of the running executable), or
//! set [`KernelConfig::launcher`] to a binary that does.

pub mod config;
mod driver;
pub mod error;
mod hints;
mod init_proc;
pub mod kernel;
mod marker;
mod outputs;
pub use outputs::is_saved_file_mime;
pub mod result;
mod ring;
mod seal;
pub mod session;
mod spawn;
pub mod template;
pub mod tools;
pub mod worker_files;

pub use cellhost_capture::hostfs;
pub use cellhost_capture::{RedactionConfig, Redactor, SpillChunk, StreamLimits, read_spill};
pub use config::{DisplayLimits, KernelConfig, resolve_python};
pub use error::KernelError;
pub use kernel::{
    CellHandle, CellProgress, ExecOptions, InterruptOutcome, Kernel, KernelInfo, LiveEvent, Variables,
};
pub use result::*;
pub use session::Session;
pub use template::{Template, TemplateInfo};
pub use tools::{ToolCall, ToolCallRecord, ToolFuture, ToolHost};
