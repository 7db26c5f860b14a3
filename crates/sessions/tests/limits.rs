//! Limits per session through the request layer, with real kernels: a
//! session with limits of its own (asked by the request, or by a config
//! rule for its name) never adopts a warm-pool kernel started with the
//! host's defaults, and its kernel runs under them; a session without
//! limits still takes from the pool.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_sessions::limits::{LimitRule, LimitsPolicy, SessionLimits};
use cellhost_sessions::requests::{ExecuteRequest, ListRequest};
use cellhost_sessions::{Origin, Registry, RegistryConfig, SessionSpec};

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

async fn wait_pooled(reg: &Registry, n: usize) {
    let t0 = Instant::now();
    while reg.stats().pooled < n {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run(reg: &Registry, spec: SessionSpec, code: &str) -> cellhost_kernel::CellResult {
    ExecuteRequest::new(spec, code, Origin::new("test"))
        .execute(reg)
        .await
        .expect("cell")
        .result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_with_limits_never_adopt_pooled_kernels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut template = cellhost_kernel::KernelConfig::new(python(), dir.path().join("unused"));
    template.cwd = Some(dir.path().to_path_buf());
    let mut cfg = RegistryConfig::new(dir.path().join("state"), template);
    cfg.pool_size = 1;
    cfg.limits = LimitsPolicy {
        rules: vec![LimitRule {
            pattern: "agent-*".into(),
            limits: SessionLimits {
                disk_mb: Some(3),
                ..Default::default()
            },
        }],
        ..Default::default()
    };
    let reg = Registry::start(cfg, None).await.expect("registry");
    wait_pooled(&reg, 1).await;

    let fsize = "import resource\nresource.getrlimit(resource.RLIMIT_FSIZE)[0] >> 20";
    let asked = SessionSpec {
        limits: SessionLimits {
            disk_mb: Some(5),
            cell_timeout_s: Some(30.0),
            ..Default::default()
        },
        ..SessionSpec::new("o", "sized")
    };
    let r = run(&reg, asked, fsize).await;
    assert_eq!(
        r.result.as_ref().and_then(|b| b.get("text/plain")),
        Some(&"5".into()),
        "{r:?}"
    );
    assert_eq!((reg.stats().from_pool, reg.stats().spawned), (0, 1));

    // A config rule by name is limits of its own too.
    let r = run(&reg, SessionSpec::new("o", "agent-1"), fsize).await;
    assert_eq!(
        r.result.as_ref().and_then(|b| b.get("text/plain")),
        Some(&"3".into()),
        "{r:?}"
    );
    assert_eq!((reg.stats().from_pool, reg.stats().spawned), (0, 2));

    // The limits in force are listed.
    let listed = ListRequest { owner: "o".into() }.execute(&reg);
    let sized = listed.iter().find(|s| s.name == "sized").expect("listed");
    assert_eq!(sized.limits.disk_mb, Some(5));
    assert_eq!(sized.limits.cell_timeout_s, Some(30.0));
    assert_eq!(sized.limits.pids, Some(512), "host default filled in");

    // A session of the host's defaults takes the pooled kernel.
    wait_pooled(&reg, 1).await;
    run(&reg, SessionSpec::new("o", "plain"), "1").await;
    assert_eq!(reg.stats().from_pool, 1);
    reg.shutdown().await;
}

/// A registry of kernels like `template`, without a pool, whose sessions
/// work in directories under `dir/work`.
async fn start_with_workdirs(dir: &Path, template: cellhost_kernel::KernelConfig) -> Arc<Registry> {
    let mut cfg = RegistryConfig::new(dir.join("state"), template);
    cfg.pool_size = 0;
    cfg.session_workdirs = Some(dir.join("work"));
    Registry::start(cfg, None).await.expect("registry")
}

/// The session `name` of owner `o` with a 4 MiB `disk_mb`.
fn disk_capped(name: &str) -> SessionSpec {
    SessionSpec {
        limits: SessionLimits {
            disk_mb: Some(4),
            ..Default::default()
        },
        ..SessionSpec::new("o", name)
    }
}

/// `r`'s kernel's sandbox gives a reason for layer `disk` that contains
/// `says`.
#[track_caller]
fn assert_disk_reason(r: &cellhost_kernel::CellResult, says: &str) {
    assert!(
        r.kernel
            .sandbox
            .reasons
            .get("disk")
            .is_some_and(|w| w.contains(says)),
        "{:?}",
        r.kernel.sandbox
    );
}

/// The workdir holder (`__cellhost-disk-holder`) `pid` still runs.
fn holder_runs(pid: u32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmdline.split(|&b| b == 0).nth(1) == Some(b"__cellhost-disk-holder".as_slice())
}

/// `disk_mb` is a mount that outlives the session's kernels: files written
/// before a kernel is killed with `SIGKILL` are there for the next kernel,
/// the cap holds over the sum of the files, the holder is reaped when the
/// session is disposed and the files are back in the directory on disk; a
/// session working in a cwd the caller named gets the accounting only, and
/// its sandbox names layer `disk` as missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_mb_mount_outlives_a_killed_kernel_and_names_its_absence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let template = cellhost_kernel::KernelConfig::new(python(), dir.path().join("unused"));
    let reg = start_with_workdirs(dir.path(), template).await;
    let capped = disk_capped("capped");
    let key = capped.key(&reg).expect("key");
    let r = run(
        &reg,
        capped.clone(),
        "for i in range(3):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))",
    )
    .await;
    assert_eq!(r.status, cellhost_kernel::CellStatus::Ok, "{r:?}");
    assert!(
        r.kernel.sandbox.enforced.iter().any(|l| l == "disk"),
        "{:?}",
        r.kernel.sandbox
    );
    let holder = reg.disk_holder(&key).expect("a holder");
    assert!(holder_runs(holder));

    // SIGKILL of the kernel (its worker) loses no file.
    let worker = rustix::process::Pid::from_raw(r.kernel.pid as i32).expect("pid");
    rustix::process::kill_process(worker, rustix::process::Signal::KILL).expect("kill");
    // The cell that finds the kernel dead says so (unless the host saw the
    // death first); the next runs in a new kernel either way.
    let r = run(&reg, capped.clone(), "1").await;
    assert!(
        matches!(
            r.status,
            cellhost_kernel::CellStatus::Crashed | cellhost_kernel::CellStatus::Ok
        ),
        "{r:?}"
    );
    let r = run(
        &reg,
        capped.clone(),
        "import os\nprint(sorted(os.listdir('.')))\nopen('g', 'wb').write(b'y' * (2 << 20))",
    )
    .await;
    assert!(r.kernel.generation >= 2, "{r:?}");
    assert!(r.stdout.contains("['f0', 'f1', 'f2']"), "{r:?}");
    assert_eq!(r.fault, Some(cellhost_kernel::Fault::Disk), "{r:?}");
    assert_eq!(reg.disk_holder(&key), Some(holder), "the same holder");

    // Disposed: the holder is reaped, the files are on disk.
    let on_disk = reg.workdir(&key).expect("workdir");
    reg.dispose(&key).await;
    assert!(!holder_runs(holder), "holder left behind");
    assert_eq!(reg.disk_holder(&key), None);
    for f in ["f0", "f1", "f2"] {
        let m = std::fs::metadata(on_disk.join(f)).expect("copied back");
        assert_eq!(m.len(), 1 << 20);
    }

    // A cwd the caller named: accounting only, the layer named missing.
    let own = dir.path().join("own");
    std::fs::create_dir_all(&own).expect("own dir");
    let in_cwd = SessionSpec {
        cwd: Some(own),
        ..disk_capped("in-cwd")
    };
    let r = run(&reg, in_cwd, "1").await;
    assert!(
        r.kernel.sandbox.missing.iter().any(|l| l == "disk"),
        "{:?}",
        r.kernel.sandbox
    );
    assert_disk_reason(&r, "cwd");
    reg.shutdown().await;
}

/// The sandbox off: `disk_mb` is the host's accounting of its own writes
/// only, and the
/// kernel's sandbox names layer `disk` (its one layer) as missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_mb_with_the_sandbox_off_names_the_missing_mount() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut template = cellhost_kernel::KernelConfig::new(python(), dir.path().join("unused"));
    template.sandbox = cellhost_sandbox::profile::SandboxProfile::off();
    let reg = start_with_workdirs(dir.path(), template).await;
    let off = disk_capped("off");
    let key = off.key(&reg).expect("key");
    // Nothing bounds the cell's own writes (no mount, and no rlimits
    // without a sandbox): the result says so.
    let r = run(&reg, off, "1").await;
    assert_eq!(r.kernel.sandbox.missing, ["disk"], "{:?}", r.kernel.sandbox);
    assert_disk_reason(&r, "sandbox is off");
    assert_eq!(reg.disk_holder(&key), None, "no holder without a sandbox");
    reg.shutdown().await;
}

/// The holder puts back exactly the tmpfs's tree when the session is
/// disposed — a file the cell removed is gone from the directory on disk,
/// a new one is there, a link stays a link — and a holder whose copy-in
/// failed (the workdir already over the cap) never touches the directory
/// on disk: its files stay as they were, the cap becomes accounting only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_mb_copy_back_mirrors_the_tmpfs_and_a_failed_copy_in_keeps_the_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let template = cellhost_kernel::KernelConfig::new(python(), dir.path().join("unused"));
    let reg = start_with_workdirs(dir.path(), template).await;

    // Mirrored: removed, added, replaced, a link kept as a link.
    let key = disk_capped("mirror").key(&reg).expect("key");
    let wd = reg.workdir(&key).expect("workdir");
    std::fs::create_dir_all(wd.join("olddir")).expect("workdir");
    std::fs::write(wd.join("old.txt"), b"old").expect("old");
    std::fs::write(wd.join("olddir/x"), b"x").expect("x");
    std::fs::write(wd.join("kept.txt"), b"v1").expect("kept");
    let r = run(
        &reg,
        disk_capped("mirror"),
        "import os, shutil
print(open('old.txt').read())
os.remove('old.txt')
shutil.rmtree('olddir')
open('kept.txt', 'w').write('v2')
open('new.bin', 'wb').write(bytes(range(256)))
os.symlink('kept.txt', 'ln')",
    )
    .await;
    assert_eq!(r.status, cellhost_kernel::CellStatus::Ok, "{r:?}");
    assert_eq!(r.stdout, "old\n", "the copy-in: {r:?}");
    assert!(reg.disk_holder(&key).is_some(), "a holder");
    reg.dispose(&key).await;
    assert!(!wd.join("old.txt").exists() && !wd.join("olddir").exists());
    assert_eq!(std::fs::read(wd.join("kept.txt")).expect("kept"), b"v2");
    assert_eq!(
        std::fs::read(wd.join("new.bin")).expect("new"),
        (0..=255u8).collect::<Vec<u8>>()
    );
    assert_eq!(
        std::fs::read_link(wd.join("ln")).expect("link"),
        std::path::Path::new("kept.txt")
    );

    // Over the cap already: no mount, and the files on disk untouched.
    let key = disk_capped("over").key(&reg).expect("key");
    let wd = reg.workdir(&key).expect("workdir");
    std::fs::create_dir_all(&wd).expect("workdir");
    std::fs::write(wd.join("big.bin"), vec![7u8; 5 << 20]).expect("big");
    std::fs::write(wd.join("small.txt"), b"small").expect("small");
    let r = run(
        &reg,
        disk_capped("over"),
        "print(sorted(__import__('os').listdir('.')))",
    )
    .await;
    assert_disk_reason(&r, "more than the cap");
    assert_eq!(reg.disk_holder(&key), None);
    reg.dispose(&key).await;
    assert_eq!(std::fs::metadata(wd.join("big.bin")).expect("big").len(), 5 << 20);
    assert_eq!(std::fs::read(wd.join("small.txt")).expect("small"), b"small");
    reg.shutdown().await;
}
