//! The cell types every surface renders, re-exported from the kernel crate
//! so that servers depend on `cellhost-sessions` alone: a cell's result and
//! its parts, live output, an interrupt's outcome, a namespace listing,
//! reading spilled output, host files opened without following links, and
//! what a server needs to configure its kernels.

pub use cellhost_kernel::hostfs;
pub use cellhost_kernel::{
    CellError, CellResult, CellStatus, DisplayOutput, InterruptOutcome, KernelConfig, KernelError,
    KernelPlacement, KernelRef, LiveEvent, MimeBundle, SpillChunk, Truncation, Variables, read_spill,
    resolve_python, resolve_r,
};
