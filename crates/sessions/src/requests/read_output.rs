//! `read_output`: page a cut stream's spilled output by byte offset.

use std::path::PathBuf;

use serde::Serialize;

use super::RequestError;

/// Largest page, in bytes (16 MiB).
pub const MAX_PAGE: u64 = 16 * 1024 * 1024;

/// Read `length` bytes of a spill file from `offset` (moved to character
/// boundaries). The CLI names the file by the path a result gave; the
/// network surfaces resolve a (cell, stream) of the caller's own cells to
/// that path before they build this request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOutputRequest {
    /// The spill file (a result's `truncated.<stream>.spill_path`).
    pub path: PathBuf,
    /// Byte offset.
    pub offset: u64,
    /// Bytes to read (at most 16 MiB are: a longer page is cut).
    pub length: u64,
}

/// One page of spilled output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutputPage {
    /// The text.
    pub text: String,
    /// Where it starts (a character boundary at or after the asked offset).
    pub offset: u64,
    /// Where the next page starts (`None`: this was the end).
    pub next_offset: Option<u64>,
    /// The file's size.
    pub total_bytes: u64,
}

impl ReadOutputRequest {
    /// Runs the request.
    ///
    /// # Errors
    /// `bad_request`: an offset past the end, a file that cannot be read.
    pub fn execute(&self) -> Result<OutputPage, RequestError> {
        // The spill file is read by its absolute path, never through a link.
        let path = std::path::absolute(&self.path).unwrap_or_else(|_| self.path.clone());
        let chunk = cellhost_kernel::read_spill(&path, self.offset, self.length.min(MAX_PAGE))
            .map_err(|e| RequestError::bad_request(e.to_string()))?;
        Ok(OutputPage {
            text: chunk.text,
            offset: chunk.offset,
            next_offset: chunk.next_offset,
            total_bytes: chunk.total_bytes,
        })
    }
}
