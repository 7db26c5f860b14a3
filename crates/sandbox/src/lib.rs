//! Confinement and supervision of one cellhost worker.
//!
//! * [`launcher`]: the *kernel init*, a hidden subcommand of the embedding
//!   binary that sits between the host and Python: it starts a new session,
//!   becomes a child subreaper so no descendant of the kernel escapes it,
//!   reaps everything, kills the whole tree when Python dies or the host asks
//!   (or dies), and mirrors Python's exit status.
//! * [`signal`]: thread-directed signals (`tgkill`) and process-tree sweeps.
//! * [`mod@env`]: the environment allowlist; [`fds`]: no inherited
//!   descriptor reaches a kernel or a host tool.
//! * [`peer`]: who is on the other end of a control socket (never a kernel).
//! * [`profile`]: the sandbox profile (mode off/auto/enforce, network,
//!   paths, limits), what the init is told, and what it reports.
//! * [`confine`]: the layers the init applies (rlimits, namespaces, mounts,
//!   Landlock, capabilities, seccomp); [`rootfs`]: the kernel's fresh root
//!   and its uid; [`cgroup`]: the kernel's limits.
//! * [`steps`]: the confinement steps as one ordered list, for the cold
//!   and the forked path; [`sys`]: the privileged calls they make, behind
//!   the [`sys::Sys`] trait (the real one, and a recording one for tests).
//! * [`workdir_disk`]: a session's workdir on a size-limited tmpfs held
//!   by a process of its own, which the session's kernels enter (`disk_mb`).
//!
//! This is the only crate of cellhost with `unsafe` code; every block has a
//! `// SAFETY:` line.

pub mod cgroup;
pub mod confine;
pub mod egress;
pub mod env;
pub mod fds;
pub mod forkplan;
pub mod init_prelude;
pub mod launcher;
pub mod peer;
pub mod procfs;
pub mod profile;
pub mod rootfs;
pub mod signal;
pub mod steps;
pub mod sys;
pub mod workdir_disk;
pub mod workdir_mirror;

#[cfg(feature = "ctor-launcher")]
mod ctor_hook {
    /// Runs the kernel init before `main` when the binary was started as one
    /// (see [`crate::launcher::run_if_requested`]).
    #[ctor::ctor(unsafe)]
    fn cellhost_kernel_init_hook() {
        crate::launcher::run_if_requested_from_proc();
    }
}
