//! The kernel's cgroup limits on this host, whatever it is (v1, v2, hybrid;
//! root or not): every limit the profile asks for is in force in the
//! kernel's own group — checked in the group's files, not only in the
//! report — or is a named missing layer with its reason. Never silently
//! weaker. Each test prints `capability <name>: <enforced|missing>: <why>`
//! lines for the capability table (scripts/vm-test.sh).
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::PathBuf;

use cellhost_kernel::{CellResult, ExecOptions, Kernel, KernelConfig};
use cellhost_sandbox::cgroup::layout::{Layout, Mode};
use cellhost_sandbox::profile::{LayerStatus, SandboxProfile};
use tempfile::TempDir;

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

/// The default profile, plus half a CPU (the default has no CPU cap).
fn profile() -> SandboxProfile {
    let mut p = SandboxProfile::default();
    p.limits.cpu_cores = Some(0.5);
    p
}

async fn kernel(dir: &TempDir) -> Kernel {
    let mut cfg = KernelConfig::new(python(), dir.path().join("session"));
    cfg.session = "cg".into();
    cfg.cwd = Some(dir.path().to_path_buf());
    cfg.sandbox = profile();
    Kernel::spawn(cfg).await.expect("sandboxed kernel")
}

async fn run(k: &Kernel, code: &str) -> CellResult {
    k.execute(code, ExecOptions::default()).await.expect("execute")
}

/// The kernel's group directories, from `/proc/<init>/cgroup` and this
/// host's mounts: `(v2, dir)`.
fn kernel_groups(init: u32) -> Vec<(bool, PathBuf)> {
    let layout = Layout::read();
    let text = std::fs::read_to_string(format!("/proc/{init}/cgroup")).expect("init cgroup");
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if !path.split('/').any(|c| c == "cellhost") {
            continue;
        }
        let rel = path.trim_start_matches('/');
        if id == "0" && ctrls.is_empty() {
            if let Some(u) = &layout.unified {
                out.push((true, u.mount_point.join(rel)));
            }
        } else if let Some(m) = ctrls.split(',').find_map(|c| layout.v1_for(c)) {
            out.push((false, m.mount_point.join(rel)));
        }
    }
    out
}

fn read_in(groups: &[(bool, PathBuf)], file: &str) -> Option<String> {
    groups
        .iter()
        .find_map(|(_, d)| std::fs::read_to_string(d.join(file)).ok())
        .map(|s| s.trim().to_string())
}

fn missing_layer<'a>(k: &'a Kernel, name: &str) -> Option<&'a LayerStatus> {
    k.info()
        .sandbox
        .layers
        .iter()
        .find(|l| (l.name == name || l.name == "cgroup") && !l.enforced)
}

#[tokio::test]
async fn every_limit_is_in_its_group_or_a_named_missing_layer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kernel(&dir).await;
    let layout = Layout::read();
    eprintln!(
        "host: cgroup {}, uid {}",
        layout.mode.as_str(),
        rustix::process::geteuid().as_raw()
    );
    let cgroup = k
        .info()
        .sandbox
        .layer("cgroup")
        .expect("cgroup layer reported")
        .clone();
    eprintln!(
        "capability cgroup: enforced={}: {}",
        cgroup.enforced, cgroup.detail
    );
    let groups = kernel_groups(k.info().init_pid);
    let p = profile().limits;
    let mem = p.memory_bytes.expect("default memory limit");
    let pids = p.pids_max.expect("default process limit");
    // (layer, files that hold the limit: v2 first, then v1, expected value)
    let cases = [
        (
            "cgroup.memory",
            "memory.max",
            "memory.limit_in_bytes",
            mem.to_string(),
        ),
        ("cgroup.pids", "pids.max", "pids.max", pids.to_string()),
        ("cgroup.cpu", "cpu.max", "cpu.cfs_quota_us", String::new()),
    ];
    for (layer, f2, f1, want) in cases {
        let v2 = groups.iter().any(|(v2, _)| *v2) && read_in(&groups, f2).is_some();
        let got = read_in(&groups, if v2 { f2 } else { f1 });
        match (got, missing_layer(&k, layer)) {
            (Some(v), None) => {
                let want = if layer == "cgroup.cpu" {
                    if v2 {
                        "50000 100000".to_string()
                    } else {
                        "50000".to_string()
                    }
                } else {
                    want
                };
                assert_eq!(v, want, "{layer}: {f2}/{f1} in {groups:?}");
                assert!(
                    cgroup.enforced,
                    "{layer} is set but the cgroup layer says {cgroup:?}"
                );
                eprintln!("capability {layer}: enforced: {} = {v}", if v2 { f2 } else { f1 });
            }
            (None, Some(l)) => {
                assert!(!l.detail.is_empty(), "{layer} is missing without a reason");
                eprintln!("capability {layer}: missing: {}", l.detail);
            }
            (Some(v), Some(l)) => panic!("{layer} is set ({v}) but reported missing: {l:?}"),
            (None, None) => panic!(
                "{layer}: not in the kernel's groups {groups:?} and not a missing layer: silently weaker ({:?})",
                k.info().sandbox
            ),
        }
    }
    if groups.iter().any(|(v2, _)| *v2) && read_in(&groups, "memory.max").is_some() {
        assert_eq!(read_in(&groups, "memory.oom.group").as_deref(), Some("1"));
        eprintln!("capability memory.oom.group: enforced");
    }
    // The worker is in the kernel's groups, not only its init.
    let r = run(&k, "import os; print(os.getpid())").await;
    assert!(!r.stdout.trim().is_empty(), "{r:#?}");
    let worker = std::fs::read_to_string(format!("/proc/{}/cgroup", k.info().pid)).expect("worker cgroup");
    if !groups.is_empty() {
        assert!(
            worker.contains("cellhost"),
            "the worker is outside its kernel's group: {worker}"
        );
    }
    k.kill().await;
    // The kill reaped the tree and removed the groups.
    for (_, d) in &groups {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

#[tokio::test]
async fn the_whole_tree_dies_with_the_kernel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kernel(&dir).await;
    let cgroup = k.info().sandbox.layer("cgroup").expect("cgroup layer").clone();
    let init = k.info().init_pid;
    // A child, and a daemon that left its session and its parent.
    let r = run(
        &k,
        "import subprocess, os\n\
         a = subprocess.Popen(['sleep', '600'])\n\
         if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '601'])\n    os._exit(0)\n\
         os.wait()\n\
         print('started')",
    )
    .await;
    assert_eq!(r.stdout, "started\n", "{r:#?}");
    let groups = kernel_groups(init);
    let before: Vec<i32> = cellhost_sandbox::procfs::descendants(init as i32)
        .iter()
        .map(|s| s.pid)
        .collect();
    assert!(before.len() >= 3, "worker, sleep and the daemon: {before:?}");
    let method = if cgroup.detail.contains("whole-tree kill: cgroup.kill") {
        "cgroup.kill"
    } else {
        "SIGKILL sweep"
    };
    let v2_controllers = matches!(Layout::read().mode, Mode::V2) && cgroup.enforced;
    if v2_controllers {
        assert_eq!(
            method, "cgroup.kill",
            "a v2 host (Linux 5.14+) kills through cgroup.kill: {cgroup:?}"
        );
    }
    eprintln!(
        "capability whole-tree kill: enforced: {method} ({} processes)",
        before.len()
    );
    k.kill().await;
    assert!(cellhost_sandbox::procfs::descendants(init as i32).is_empty());
    for p in before {
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists(),
            "pid {p} of the kernel's tree outlived the kill"
        );
    }
    for (_, d) in &groups {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}
