//! Test support shared by cellhost's integration tests (a dev-dependency
//! only): what more than one crate's tests need and would otherwise copy.
//!
//! - [`procs`]: whether a process is gone, its parent, waiting for a line
//!   a cell writes to a file.
//! - [`sshd`]: a loopback `sshd` for the SSH placement's tests.
//! - [`r`]: the R interpreter to test with, or why the R tests are skipped.
//! - [`index`]: whether the package index answers.
//!
//! Test code: a failed set-up step panics with what failed.

#![allow(clippy::expect_used, clippy::unwrap_used)]

pub mod index;
pub mod procs;
pub mod r;
pub mod sshd;
