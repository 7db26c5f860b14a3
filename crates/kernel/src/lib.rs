//! One supervised, persistent Python kernel.
//!
//! A [`Kernel`] is one worker process incarnation plus its host-side handle;
//! a [`Session`] is the named thing a caller talks to, which outlives its
//! kernels (each new kernel is a new *generation*).

pub mod result;

pub use result::*;
