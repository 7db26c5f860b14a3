//! Real R templates: a fork server with packages attached hands out R
//! kernels that behave as cold ones (unsandboxed: the R runtime's
//! templates fork unsandboxed kernels only).
//!
//! The interpreter is `CELLHOST_TEST_R` or `R` on PATH; every test is
//! skipped, saying why, where R, its `jsonlite` package or a C compiler
//! (the template's native part is built with `R CMD SHLIB`) is missing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cellhost_kernel::{
    CellResult, CellStatus, ExecOptions, Kernel, KernelConfig, KernelError, RRuntime, Template,
};
use cellhost_sandbox::profile::SandboxProfile;
use tempfile::TempDir;

/// R for the tests, or `None` (printed) when it, jsonlite or a C compiler
/// is missing.
fn r() -> Option<PathBuf> {
    let path = match std::env::var_os("CELLHOST_TEST_R") {
        Some(p) => PathBuf::from(p),
        None => match cellhost_kernel::resolve_r(None) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("skipped: no R to test with: {e}");
                return None;
            }
        },
    };
    let ok = std::process::Command::new(&path)
        .args([
            "--no-echo",
            "-e",
            "quit(status = !requireNamespace('jsonlite', quietly = TRUE))",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "skipped: R package jsonlite is not installed for {}",
            path.display()
        );
        return None;
    }
    let cc = std::process::Command::new(&path)
        .args(["CMD", "config", "CC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let compiler = cc.split_whitespace().next().unwrap_or("");
    if compiler.is_empty()
        || !std::process::Command::new(compiler)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    {
        eprintln!("skipped: no C compiler for R CMD SHLIB ({cc:?})");
        return None;
    }
    Some(path)
}

fn config(r: &std::path::Path, dir: &TempDir, session: &str) -> KernelConfig {
    let mut cfg = KernelConfig::new(r.to_path_buf(), dir.path().join(session));
    cfg.runtime = Arc::new(RRuntime);
    cfg.session = session.into();
    cfg.cwd = Some(dir.path().to_path_buf());
    cfg.sandbox = SandboxProfile::off();
    cfg
}

async fn template(r: &std::path::Path, dir: &TempDir, preload: &[&str]) -> Template {
    Template::start(
        config(r, dir, "template"),
        preload.iter().map(|s| s.to_string()).collect(),
    )
    .await
    .expect("R template")
}

fn fork_config(dir: &TempDir, t: &Template, session: &str) -> KernelConfig {
    let mut cfg = t.config().clone();
    cfg.session = session.into();
    cfg.session_dir = dir.path().join(session);
    cfg
}

async fn run(k: &Kernel, code: &str) -> CellResult {
    k.execute(code, ExecOptions::default()).await.expect("execute")
}

fn plain(r: &CellResult) -> Option<&str> {
    r.result.as_ref()?.get("text/plain")?.as_str()
}

fn assert_ok(r: &CellResult) {
    assert_eq!(r.status, CellStatus::Ok, "cell failed: {r:#?}");
}

/// Kills the kernels it holds when dropped, so a failing test leaves none.
struct Kernels(Vec<Kernel>);

impl Drop for Kernels {
    fn drop(&mut self) {
        for k in &self.0 {
            if k.is_alive()
                && let Some(pid) = i32::try_from(k.info().init_pid)
                    .ok()
                    .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

#[tokio::test]
async fn r_template_forks_kernels_with_the_package_attached() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&r, &dir, &["tools", "no.such.package.xyz"]).await;
    assert_eq!(t.info().preloaded, vec!["tools".to_string()]);
    assert!(
        t.info().failed["no.such.package.xyz"].contains("no package called"),
        "{:?}",
        t.info()
    );
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("fork");
    let ks = Kernels(vec![k.clone()]);
    assert_eq!(k.info().template, Some(t.info().pid));
    let r = run(&k, "'package:tools' %in% search()").await;
    assert_eq!(plain(&r), Some("[1] TRUE"), "{r:#?}");
    // A fresh worker: its own pid, stdout and stderr captured, the cwd and
    // a temporary directory of its own.
    let r = run(&k, "cat(Sys.getpid(), '\\n'); message('to stderr'); getwd()").await;
    assert_ok(&r);
    let pid: u32 = r.stdout.trim().parse().expect("pid");
    assert_ne!(pid, t.info().pid);
    assert_eq!(r.stderr, "to stderr\n");
    assert_eq!(
        plain(&r),
        Some(format!("[1] \"{}\"", dir.path().display()).as_str())
    );
    let r = run(&k, "cat(tempdir())").await;
    assert!(
        !r.stdout.is_empty() && std::path::Path::new(&r.stdout).is_dir(),
        "{r:#?}"
    );
    drop(ks);
}

#[tokio::test]
async fn r_template_kernels_share_no_state_and_have_their_own_rng() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&r, &dir, &["tools"]).await;
    let a = t.fork(fork_config(&dir, &t, "a")).await.expect("fork a");
    let b = t.fork(fork_config(&dir, &t, "b")).await.expect("fork b");
    let ks = Kernels(vec![a.clone(), b.clone()]);
    assert_ok(
        &run(
            &a,
            "secret <- 41; Sys.setenv(A_ONLY = '1'); options(a.only = TRUE)",
        )
        .await,
    );
    let r = run(
        &b,
        "cat(exists('secret'), nzchar(Sys.getenv('A_ONLY')), isTRUE(getOption('a.only')))",
    )
    .await;
    assert_eq!(r.stdout, "FALSE FALSE FALSE", "{r:#?}");
    let ra = run(&a, "cat(runif(3))").await.stdout;
    let rb = run(&b, "cat(runif(3))").await.stdout;
    assert!(!ra.is_empty());
    assert_ne!(ra, rb, "each forked kernel seeds its own random state");
    assert_ne!(
        run(&a, "cat(tempdir())").await.stdout,
        run(&b, "cat(tempdir())").await.stdout
    );
    // The first to quit does not take the other's temporary directory.
    let tmp_b = run(&b, "cat(tempdir())").await.stdout;
    a.kill().await;
    assert!(std::path::Path::new(&tmp_b).is_dir());
    drop(ks);
}

#[tokio::test]
async fn r_template_kernel_interrupt_timeout_and_crash_behave_as_cold() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&r, &dir, &[]).await;
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("fork");
    let ks = Kernels(vec![k.clone()]);
    assert_ok(&run(&k, "state <- 'kept'").await);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = ExecOptions {
        live: Some(tx),
        ..Default::default()
    };
    let h = k
        .submit("cat('sleeping\\n'); Sys.sleep(60); state <- 'late'", opts)
        .expect("submit");
    assert_eq!(
        rx.recv().await,
        Some(cellhost_kernel::LiveEvent::Stdout("sleeping\n".into()))
    );
    assert!(h.interrupt().await.delivered);
    let res = h.wait().await.expect("result");
    assert_eq!(res.status, CellStatus::Interrupted, "{res:#?}");
    assert!(res.interrupt.expect("report").state_kept);
    assert_eq!(plain(&run(&k, "state").await), Some("[1] \"kept\""));
    let opts = ExecOptions {
        timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let res = k.execute("repeat {}", opts).await.expect("execute");
    assert_eq!(res.status, CellStatus::Timeout);
    assert!(res.interrupt.expect("report").state_kept);
    let res = run(&k, "system(sprintf('kill -9 %d', Sys.getpid()))").await;
    assert_eq!(res.status, CellStatus::Crashed, "{res:#?}");
    assert_eq!(res.crash.expect("crash").signal_name.as_deref(), Some("SIGKILL"));
    assert!(!k.is_alive());
    drop(ks);
}

#[tokio::test]
async fn r_template_death_is_reported_and_a_cold_kernel_starts() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&r, &dir, &[]).await;
    assert!(t.is_alive());
    let pid = rustix::process::Pid::from_raw(i32::try_from(t.info().pid).expect("pid")).expect("pid");
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).expect("pidfd");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill the template");
    // A pidfd polls readable once its process has exited.
    let mut fds = [rustix::event::PollFd::new(&pidfd, rustix::event::PollFlags::IN)];
    rustix::event::poll(&mut fds, None).expect("poll the template's pidfd");
    assert!(!t.is_alive());
    let e = t
        .fork(fork_config(&dir, &t, "a"))
        .await
        .expect_err("fork of a dead template");
    assert!(matches!(e, KernelError::Spawn { .. }), "{e:?}");
    assert!(!t.is_alive());
    let k = Kernel::spawn(fork_config(&dir, &t, "cold"))
        .await
        .expect("cold kernel");
    let ks = Kernels(vec![k.clone()]);
    assert_eq!(k.info().template, None);
    assert_ok(&run(&k, "1").await);
    drop(ks);
}

#[tokio::test]
async fn r_template_refuses_sandboxed_kernels() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&r, &dir, "template");
    cfg.sandbox = SandboxProfile::default();
    let e = Template::start(cfg, Vec::new())
        .await
        .expect_err("sandboxed R template");
    assert!(matches!(e, KernelError::InvalidRequest(_)), "{e:?}");
    let t = template(&r, &dir, &[]).await;
    let mut cfg = fork_config(&dir, &t, "a");
    cfg.sandbox = SandboxProfile::default();
    let e = t.fork(cfg).await.expect_err("sandboxed fork");
    assert!(matches!(e, KernelError::InvalidRequest(_)), "{e:?}");
}
