//! Shared by the kernel crate's integration tests (Python and R kernels,
//! cold and forked from templates).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cellhost_kernel::Kernel;

/// Every layer a sandboxed kernel reports (enforced or missing).
pub const SANDBOX_LAYERS: [&str; 15] = [
    "env",
    "rlimits",
    "userns",
    "pidns",
    "netns",
    "ipcns",
    "utsns",
    "mountns",
    "cgroupns",
    "rootfs",
    "uid",
    "landlock",
    "capabilities",
    "seccomp",
    "cgroup",
];

/// The layers of [`SANDBOX_LAYERS`] a sandboxed kernel enforces here where
/// the machine has them: all but the user namespace as root (which needs
/// none).
pub fn sandbox_layer_names() -> Vec<&'static str> {
    let root = rustix::process::geteuid().is_root();
    SANDBOX_LAYERS
        .into_iter()
        .filter(|n| !(root && *n == "userns"))
        .collect()
}

/// A forked kernel reports every layer of [`sandbox_layer_names`] enforced,
/// except those of `as_cold`, which are enforced exactly as far as the cold
/// kernel `cold` of the same user gets them (what this machine lacks).
pub fn assert_fork_layers_as_cold(fork: &Kernel, cold: &Kernel, as_cold: &[&str]) {
    for name in sandbox_layer_names() {
        let l = fork
            .info()
            .sandbox
            .layer(name)
            .unwrap_or_else(|| panic!("{name} not reported: {:?}", fork.info().sandbox));
        if as_cold.contains(&name) {
            let c = cold
                .info()
                .sandbox
                .layer(name)
                .unwrap_or_else(|| panic!("cold kernel's {name} layer"));
            assert_eq!(
                l.enforced, c.enforced,
                "{name}: forked {} / cold {}",
                l.detail, c.detail
            );
        } else {
            assert!(l.enforced, "{name}: {}", l.detail);
        }
    }
}

/// A shared object that sets SIGINT's disposition, as a package's native
/// code can (built in `dir`, which a sandboxed kernel can read); `None`
/// (printed) without a C compiler.
pub fn sigint_library(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("sigint.c");
    std::fs::write(
        &src,
        "#include <signal.h>\nvoid ignore_sigint(void) { signal(SIGINT, SIG_IGN); }\n",
    )
    .expect("write C source");
    let lib = dir.join("sigint.so");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        eprintln!("skipped: no C compiler to build a library that ignores SIGINT");
        return None;
    }
    Some(lib)
}
