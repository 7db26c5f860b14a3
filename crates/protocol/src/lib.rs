//! The cellhost worker protocol, version 1.
//!
//! The host and a worker exchange JSON objects, one per line, over a
//! socketpair (the *control channel*). Raw output of a cell travels
//! separately on fd 1 and fd 2; this crate knows nothing of it.
//!
//! * [`frame`]: the frame types, tagged by their `type` field.
//! * [`codec`]: a reader that enforces [`MAX_FRAME_BYTES`] and a writer.
//!
//! The crate does no process or policy work: what a frame means is the
//! kernel's business.

#![forbid(unsafe_code)]

pub mod codec;
pub mod frame;

pub use codec::{FrameReader, FrameWriter, ProtocolError};
pub use frame::{HostFrame, SandboxLayer, WorkerFrame};

/// Protocol version spoken by this host; a worker's `ready` frame must carry
/// the same number.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame in bytes (64 MiB, DESIGN.md "Worker protocol v1"), newline
/// excluded. A longer line is a [`ProtocolError::Oversized`].
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
