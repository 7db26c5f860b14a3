//! Errors of the capture library.

use std::path::PathBuf;

/// What can go wrong in this crate. Output capture itself never fails: a
/// spill error is recorded in [`Truncation::spill_error`](crate::Truncation)
/// and the inline result is kept; these errors come from
/// [`read_spill`](crate::read_spill) and [`Redactor::new`](crate::Redactor::new).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Reading or writing a spill file failed.
    #[error("spill file {}: {op} failed: {source}", path.display())]
    SpillIo {
        /// The spill file.
        path: PathBuf,
        /// What was being done: `open`, `create`, `seek`, `read`, `write`, `flush`.
        op: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A read started past the end of a spill file.
    #[error("spill file {}: offset {offset} is past its end ({total_bytes} bytes)", path.display())]
    OffsetOutOfRange {
        /// The spill file.
        path: PathBuf,
        /// The offset asked for, in bytes.
        offset: u64,
        /// The file's size in bytes.
        total_bytes: u64,
    },
    /// A built-in redaction pattern failed to compile (a bug in this crate).
    #[error("redaction pattern {name}: {source}")]
    Pattern {
        /// The pattern's name, e.g. `jwt`.
        name: &'static str,
        /// The compiler's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
