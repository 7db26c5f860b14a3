//! Real R templates: a fork server with packages attached hands out R
//! kernels that behave as cold ones, unsandboxed and sandboxed (the escape
//! checks of the Python templates, for R forks).
//!
//! The interpreter is `CELLHOST_TEST_R` or `R` on PATH; every test is
//! skipped, saying why, where R, its `jsonlite` package or a C compiler
//! (the template's native part is built with `R CMD SHLIB`) is missing.

mod common;

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
    cellhost_testkit::r::r_with_compiler(|| cellhost_kernel::resolve_r(None))
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

// ---- sandboxed forks: the escape checks of the Python templates

async fn sandboxed_template(r: &std::path::Path, dir: &TempDir, preload: &[&str]) -> Template {
    let mut cfg = config(r, dir, "template");
    cfg.sandbox = SandboxProfile::default();
    Template::start(cfg, preload.iter().map(|s| s.to_string()).collect())
        .await
        .expect("sandboxed R template")
}

/// The process ids under a kernel's init.
fn tree_of(init: u32) -> Vec<i32> {
    cellhost_sandbox::procfs::descendants(init as i32)
        .iter()
        .map(|p| p.pid)
        .collect()
}

/// A sandboxed fork reports every layer a cold sandboxed R kernel reports,
/// each enforced (as another user, also its own user namespace; the
/// cgroup layer exactly as far as a cold kernel of that user gets it), runs
/// as pid 2 of its own pid namespace with the package attached, and its
/// cgroup namespace is rooted at its own group.
#[tokio::test]
async fn r_template_forks_a_sandboxed_kernel_with_every_layer() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = rustix::process::geteuid().is_root();
    let t = sandboxed_template(&r, &dir, &["tools"]).await;
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("sandboxed fork");
    let mut cold_cfg = fork_config(&dir, &t, "cold");
    cold_cfg.session_dir = dir.path().join("cold");
    let cold = Kernel::spawn(cold_cfg).await.expect("cold sandboxed R kernel");
    let ks = Kernels(vec![k.clone(), cold.clone()]);
    assert_eq!(k.info().template, Some(t.info().pid));
    // Landlock and the cgroup as far as a cold kernel gets them here (no
    // Landlock in the running kernel, no delegated cgroup for this user).
    common::assert_fork_layers_as_cold(&k, &cold, &["cgroup", "landlock"]);
    let r = run(&k, "cat(Sys.getpid(), 'package:tools' %in% search())").await;
    assert_eq!(r.stdout, "2 TRUE", "{r:#?}");
    let ns = cellhost_sandbox::procfs::ns_pids(k.info().pid as i32);
    assert_eq!(ns.last(), Some(&2), "{ns:?}");
    let r = run(&k, "cat(sum(grepl('cellhost', readLines('/proc/self/cgroup'))))").await;
    assert_eq!(r.stdout, "0", "{r:#?}");
    if !root {
        // The kernel sees the user's own uid, as a cold kernel does.
        let me = rustix::process::getuid().as_raw();
        let r = run(&k, "cat(system('id -u', intern = TRUE))").await;
        assert_eq!(r.stdout, me.to_string(), "{r:#?}");
    }
    let init = k.info().init_pid;
    k.kill().await;
    assert!(tree_of(init).is_empty());
    drop(ks);
}

/// Two forks share no state, no `/tmp` and no pid namespace; the template
/// is untouched by either.
#[tokio::test]
async fn r_template_sandboxed_kernels_share_no_tmp_and_no_pid_namespace() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let t = sandboxed_template(&r, &dir, &[]).await;
    let a = t.fork(fork_config(&dir, &t, "a")).await.expect("fork a");
    let b = t.fork(fork_config(&dir, &t, "b")).await.expect("fork b");
    let ks = Kernels(vec![a.clone(), b.clone()]);
    assert_ok(
        &run(
            &a,
            "secret <- 41; writeLines('x', '/tmp/a-only'); Sys.setenv(A_ONLY = '1')",
        )
        .await,
    );
    let pid_a = a.info().pid;
    let r = run(
        &b,
        &format!(
            "p <- suppressWarnings(as.integer(list.files('/proc'))); \
             cat(exists('secret'), file.exists('/tmp/a-only'), nzchar(Sys.getenv('A_ONLY')), \
             file.exists('/proc/{pid_a}'), head(sort(p[!is.na(p)]), 2))"
        ),
    )
    .await;
    assert_eq!(r.stdout, "FALSE FALSE FALSE FALSE 1 2", "{r:#?}");
    assert!(
        !std::path::Path::new("/tmp/a-only").exists(),
        "the kernel's /tmp is its own, not the host's"
    );
    let c = t.fork(fork_config(&dir, &t, "c")).await.expect("fork c");
    let ks2 = Kernels(vec![c.clone()]);
    assert_eq!(run(&c, "cat(exists('secret'))").await.stdout, "FALSE");
    drop((ks, ks2));
}

/// Writes outside the kernel's directories are blocked, there is no
/// network, seccomp and no_new_privs are on, and neither the worker nor
/// pid 1 of its namespace holds a capability; as another user each fork
/// has a user namespace of its own.
#[tokio::test]
async fn r_template_sandboxed_kernel_keeps_the_sandbox_promises() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = rustix::process::geteuid().is_root();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let t = sandboxed_template(&r, &dir, &[]).await;
    let a = t.fork(fork_config(&dir, &t, "a")).await.expect("fork a");
    let b = t.fork(fork_config(&dir, &t, "b")).await.expect("fork b");
    let ks = Kernels(vec![a.clone(), b.clone()]);
    let code = format!(
        r#"out <- character(0)
for (p in c("{home}/cellhost-escape", "/var/tmp/cellhost-escape", "/usr/cellhost-escape")) {{
  ok <- tryCatch(suppressWarnings({{ writeLines("x", p); TRUE }}), error = function(e) FALSE)
  out <- c(out, if (ok) paste("wrote", p) else "blocked")
}}
net <- tryCatch(suppressWarnings({{ s <- socketConnection("1.1.1.1", 53, timeout = 1); close(s); "net" }}),
                error = function(e) "nonet")
out <- c(out, net)
writeLines("ok", "written-in-workdir")
st <- readLines("/proc/self/status")
field <- function(s, f) trimws(sub("^[^:]*:", "", grep(paste0("^", f, ":"), s, value = TRUE)))
out <- c(out, paste("seccomp", field(st, "Seccomp")), paste("nnp", field(st, "NoNewPrivs")))
caps <- character(0)
for (pid in c("self", "1")) {{
  s <- readLines(sprintf("/proc/%s/status", pid))
  for (f in c("CapInh", "CapPrm", "CapEff", "CapAmb")) {{
    if (any(strtoi(strsplit(field(s, f), "")[[1]], 16L) != 0L)) caps <- c(caps, paste(pid, f))
  }}
}}
cat(out, paste0("caps[", paste(caps, collapse = ","), "]"))"#
    );
    let r = run(&a, &code).await;
    assert_ok(&r);
    assert_eq!(
        r.stdout, "blocked blocked blocked nonet seccomp 2 nnp 1 caps[]",
        "{r:#?}"
    );
    assert!(dir.path().join("written-in-workdir").exists());
    assert!(!std::path::Path::new("/var/tmp/cellhost-escape").exists());
    let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/user")).expect("user namespace link");
    let host = ns(std::process::id());
    assert_eq!(
        ns(t.info().pid),
        host,
        "the template stays in the host's user namespace"
    );
    let (na, nb) = (ns(a.info().pid), ns(b.info().pid));
    if root {
        assert_eq!((&na, &nb), (&host, &host));
    } else {
        assert_ne!(na, host);
        assert_ne!(na, nb, "two forked kernels share a user namespace");
    }
    drop(ks);
}

/// Interrupt keeps the state of a sandboxed fork (also after native code
/// replaced R's SIGINT handler in an earlier cell), and killing the
/// kernel reaps its tree, a backgrounded `system()` child included.
#[tokio::test]
async fn r_template_sandboxed_interrupt_keeps_state_and_kill_reaps_the_tree() {
    let Some(r) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(lib) = common::sigint_library(dir.path()) else {
        return;
    };
    let t = sandboxed_template(&r, &dir, &[]).await;
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("fork");
    let ks = Kernels(vec![k.clone()]);
    let code = format!(
        "dyn.load('{}'); invisible(.C('ignore_sigint')); state <- 'kept'",
        lib.display()
    );
    assert_ok(&run(&k, &code).await);
    for code in [
        "cat('go\\n'); Sys.sleep(60); state <- 'late'",
        "cat('go\\n'); repeat { state <- paste0(substr(state, 1, 4)) }",
    ] {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let opts = ExecOptions {
            live: Some(tx),
            ..Default::default()
        };
        let h = k.submit(code, opts).expect("submit");
        assert_eq!(
            rx.recv().await,
            Some(cellhost_kernel::LiveEvent::Stdout("go\n".into()))
        );
        assert!(h.interrupt().await.delivered);
        let res = h.wait().await.expect("result");
        assert_eq!(res.status, CellStatus::Interrupted, "{code}: {res:#?}");
        let i = res.interrupt.expect("report");
        assert!(i.state_kept && !i.escalated, "{code}: {i:#?}");
    }
    assert_eq!(plain(&run(&k, "state").await), Some("[1] \"kept\""));
    assert_ok(&run(&k, "system('sleep 300 &')").await);
    let init = k.info().init_pid;
    let tree = tree_of(init);
    assert!(tree.len() >= 3, "init's tree: {tree:?}");
    k.kill().await;
    for p in tree {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        assert!(!cmd.starts_with(b"sleep\x00300"), "{p} survived");
    }
    assert!(!k.is_alive());
    drop(ks);
}
