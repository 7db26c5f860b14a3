//! Real R through the registry: with `r_preload`, R sessions are forked
//! from an R template (unsandboxed and sandboxed) that attached those
//! packages and no Python module of `preload`, and a dead template is
//! replaced.
//!
//! The interpreter is `CELLHOST_TEST_R` or `R` on PATH; the tests are
//! skipped, saying why, without R, its jsonlite package or a C compiler.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cellhost_kernel::{ExecOptions, KernelConfig, RRuntime};
use cellhost_sandbox::profile::SandboxProfile;
use cellhost_sessions::{Origin, Registry, RegistryConfig};

/// R for the tests, or `None` (printed) when it, jsonlite or a C compiler
/// is missing.
fn r() -> Option<PathBuf> {
    cellhost_testkit::r::r_with_compiler(|| cellhost_kernel::resolve_r(None))
}

fn reg_config(r: &Path, dir: &Path, sandbox: SandboxProfile) -> RegistryConfig {
    let mut cfg = KernelConfig::new(r.to_path_buf(), dir.join("unused"));
    cfg.runtime = Arc::new(RRuntime);
    cfg.cwd = Some(dir.to_path_buf());
    cfg.sandbox = sandbox;
    let mut c = RegistryConfig::new(dir.join("state"), cfg);
    c.pool_size = 0;
    // The Python list names a Python module: it must never reach R.
    c.preload = vec!["colorsys".into()];
    c.r_preload = vec!["tools".into()];
    c
}

const PROBE: &str = "'package:tools' %in% search()";

fn plain(r: &cellhost_kernel::CellResult) -> Option<&str> {
    r.result.as_ref()?.get("text/plain")?.as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r_sessions_fork_from_a_template_and_a_dead_one_is_replaced() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = Registry::start(reg_config(&r, dir.path(), SandboxProfile::off()), None)
        .await
        .expect("registry");
    let o = Origin::new("test");
    let a = reg.key("o", "a");
    let res = reg
        .execute(&a, PROBE, ExecOptions::default(), &o)
        .await
        .expect("a");
    assert_eq!(plain(&res), Some("[1] TRUE"), "{res:#?}");
    let t = reg
        .kernel(&a)
        .and_then(|k| k.info().template)
        .expect("forked from a template");
    // Kill the template behind the registry's back and wait for its end.
    let pid = rustix::process::Pid::from_raw(t as i32).expect("pid");
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).expect("pidfd");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill");
    let mut fds = [rustix::event::PollFd::new(&pidfd, rustix::event::PollFlags::IN)];
    rustix::event::poll(&mut fds, None).expect("poll");
    // Its kernel lives on; the next session gets a kernel all the same
    // (from a new template once it is ready, else cold).
    let res = reg
        .execute(&a, "cat('still here')", ExecOptions::default(), &o)
        .await
        .expect("a");
    assert_eq!(res.stdout, "still here");
    let b = reg.key("o", "b");
    let res = reg
        .execute(&b, "1 + 1", ExecOptions::default(), &o)
        .await
        .expect("b");
    assert_eq!(plain(&res), Some("[1] 2"), "{res:#?}");
    assert_ne!(reg.kernel(&b).and_then(|k| k.info().template), Some(t));
    reg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxed_r_sessions_fork_from_a_sandboxed_template() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = Registry::start(reg_config(&r, dir.path(), SandboxProfile::default()), None)
        .await
        .expect("registry");
    let o = Origin::new("test");
    let a = reg.key("o", "a");
    let res = reg
        .execute(&a, PROBE, ExecOptions::default(), &o)
        .await
        .expect("a");
    assert_eq!(plain(&res), Some("[1] TRUE"), "{res:#?}");
    let k = reg.kernel(&a).expect("kernel");
    assert!(k.info().template.is_some(), "forked from a template");
    assert!(
        k.info().sandbox.layer("seccomp").is_some_and(|l| l.enforced),
        "{:?}",
        k.info().sandbox
    );
    reg.shutdown().await;
}

/// Each language's template gets its own list: the R template attaches
/// `r_preload` only (a Python module of `preload` is never tried in R),
/// and with no Python list Python kernels start cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preload_lists_reach_their_own_language_only() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = KernelConfig::new(r.clone(), dir.path().join("unused"));
    cfg.runtime = Arc::new(RRuntime);
    cfg.cwd = Some(dir.path().to_path_buf());
    cfg.sandbox = SandboxProfile::off();
    let templates = Arc::new(cellhost_sessions::templates::Templates::new(
        [
            ("python".to_string(), vec!["colorsys".to_string()]),
            ("r".to_string(), vec!["tools".to_string()]),
        ]
        .into_iter()
        .collect(),
    ));
    assert_eq!(templates.preload("r"), ["tools".to_string()]);
    assert_eq!(templates.preload("python"), ["colorsys".to_string()]);
    let t = templates.template_for(&cfg).await.expect("R template");
    assert_eq!(t.info().preloaded, vec!["tools".to_string()]);
    assert!(t.info().failed.is_empty(), "{:?}", t.info().failed);
    let only_r = cellhost_sessions::templates::Templates::new(
        [("r".to_string(), vec!["tools".to_string()])]
            .into_iter()
            .collect(),
    );
    assert!(only_r.preload("python").is_empty());
    templates.shutdown().await;
}
