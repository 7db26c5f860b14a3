//! Sessions over kernels: a registry of kernels keyed by owner and session,
//! their lifecycle (LRU cap, idle reaper, pinned children, shutdown), a warm
//! pool of prespawned kernels, host tools run as external commands, the
//! SQLite journal, the configuration file, and the request layer every
//! surface goes through ([`requests`]).
#![forbid(unsafe_code)]

pub mod cell;
pub mod cell_index;
pub mod checkpoint;
pub mod config;
pub mod config_egress;
pub mod detached;
pub mod floor;
pub mod install_egress;
pub mod journal;
pub mod journal_schema;
mod last_used;
pub mod limits;
pub mod network;
pub mod packages;
pub mod placement;
pub mod pool;
pub mod registry;
pub mod replay;
pub mod requests;
pub(crate) mod session_disk;
pub mod session_env;
pub mod templates;
pub mod tools;
pub mod workdir_copy;

/// The notebook crate the `run_notebook` request works on, for surfaces
/// that depend on this crate only.
pub use cellhost_kernel::egress;
pub use cellhost_notebook as notebook;
pub use checkpoint::{CheckpointMode, CheckpointSettings};
pub use config::{Config, ConfigError, Source};
pub use floor::{BelowFloor, sandbox_for_request};
pub use journal::{CellRow, CellStart, Durability, Journal, JournalError, JournalReader, KernelRow};
pub use limits::{LimitsPolicy, SessionLimits};
pub use network::NetworkSettings;
pub use registry::{
    CheckpointSummary, Key, Origin, PauseReport, Registry, RegistryConfig, RegistryError, RegistryStats,
    RestoreReport, RestoreSkip,
};
pub use replay::{RestoreMode, RestoreSettings};
pub use requests::{Deadline, RequestError, SessionSpec, Surface};
pub use session_env::{EnvApplied, SessionEnv};
pub use tools::{CommandTools, ToolSpec};
