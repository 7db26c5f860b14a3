//! The error type of this crate.

use std::path::PathBuf;

/// What can go wrong reading, editing or writing a notebook.
///
/// Errors about a notebook's content carry an `origin`: the file's path when
/// the notebook came from [`Notebook::load`](crate::Notebook::load), or
/// `<string>` when it came from
/// [`Notebook::from_ipynb_str`](crate::Notebook::from_ipynb_str).
#[derive(Debug, thiserror::Error)]
pub enum NotebookError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The notebook could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The destination.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The file is neither `.ipynb` nor `.py`.
    #[error(
        "{}: unsupported input; expected a Jupyter notebook (.ipynb) or a percent-format script (.py)",
        path.display()
    )]
    UnsupportedExtension {
        /// The file.
        path: PathBuf,
    },

    /// The file is not UTF-8 text.
    #[error("{}: not UTF-8 text (byte {valid_up_to} is invalid)", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Length of the valid UTF-8 prefix, in bytes.
        valid_up_to: usize,
    },

    /// The notebook text is not JSON.
    #[error("{origin}: not a Jupyter notebook, invalid JSON: {source}")]
    InvalidJson {
        /// The file's path, or `<string>`.
        origin: String,
        /// The parser's error (it names the line and column).
        #[source]
        source: serde_json::Error,
    },

    /// The notebook uses a major format version other than 4.
    #[error(
        "{origin}: nbformat {version} is not supported, cellhost reads nbformat 4 \
         (convert it with `jupyter nbconvert --to notebook`, or open and save it in Jupyter)"
    )]
    UnsupportedVersion {
        /// The file's path, or `<string>`.
        origin: String,
        /// The `nbformat` value found, as written in the file.
        version: String,
    },

    /// The JSON does not have the structure of an nbformat 4 notebook.
    #[error("{origin}: not a valid nbformat 4 notebook: {reason}")]
    Malformed {
        /// The file's path, or `<string>`.
        origin: String,
        /// What is wrong, naming the offending field (e.g. `cells[3].source`).
        reason: String,
    },

    /// A cell index past the end of the notebook.
    #[error("no cell {index}: the notebook has {len} cells")]
    NoSuchCell {
        /// The index asked for.
        index: usize,
        /// How many cells the notebook has.
        len: usize,
    },

    /// Outputs were given for a cell that is not a code cell.
    #[error("cell {index} is a {cell_type} cell, not a code cell")]
    NotCodeCell {
        /// The index asked for.
        index: usize,
        /// The cell's `cell_type`.
        cell_type: String,
    },
}
