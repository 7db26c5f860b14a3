//! `fork` against a real registry and real kernels: mutations in one branch
//! are invisible to the other (numpy arrays, pandas frames, module globals,
//! files), the execution count is carried, a busy parent or a taken name is
//! refused with its code, threads refuse a fork unless dropped, the disk cap
//! bounds the copy, and `history` shows the lineage. Each for a confined
//! parent (forked by pickle) and a sandbox-off one (forked copy-on-write),
//! whose fork and parent end without stray processes in either order, and
//! survive each other's death.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH; the
//! numpy/pandas checks run where the interpreter has them and say so when
//! it does not.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cellhost_kernel::{CellStatus, KernelConfig, LiveEvent};
use cellhost_sandbox::profile::SandboxMode;
use cellhost_sessions::requests::{
    CwdScope, ExecuteRequest, ForkMethod, ForkRequest, ForkThreads, HistoryRequest, KillRequest,
};
use cellhost_sessions::{Durability, Journal, Origin, Registry, RegistryConfig, SessionSpec, Surface};

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

async fn start(dir: &Path) -> Arc<Registry> {
    start_with(dir, None).await
}

/// A registry whose kernels (and floor) have sandbox mode `mode` (`None`:
/// the default, `auto`).
async fn start_with(dir: &Path, mode: Option<SandboxMode>) -> Arc<Registry> {
    let mut t = KernelConfig::new(python(), dir.join("unused"));
    if let Some(m) = mode {
        t.sandbox.mode = m;
    }
    let work = dir.join("work");
    std::fs::create_dir_all(&work).expect("workdir");
    t.cwd = Some(work);
    let mut c = RegistryConfig::new(dir.join("state"), t);
    c.pool_size = 0;
    let j = Arc::new(Journal::open(dir.join("state/journal.sqlite3"), Durability::Normal).expect("journal"));
    Registry::start(c, Some(j)).await.expect("registry")
}

/// Shuts the registry down (killing every kernel) when the test ends,
/// passed or failed.
struct Shutdown(Arc<Registry>);

impl Drop for Shutdown {
    fn drop(&mut self) {
        let reg = self.0.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                rt.block_on(reg.shutdown());
            }
        })
        .join();
    }
}

fn owner() -> String {
    Surface::Library.owner("t")
}

async fn run(reg: &Registry, session: &str, code: &str) -> cellhost_kernel::CellResult {
    let r = ExecuteRequest::new(SessionSpec::new(owner(), session), code, Origin::new("test"))
        .execute(reg)
        .await
        .expect("execute")
        .result;
    assert_eq!(r.status, CellStatus::Ok, "{code}: {:?} {}", r.error, r.stderr);
    r
}

fn text(r: &cellhost_kernel::CellResult) -> String {
    r.result
        .as_ref()
        .and_then(|b| b.get("text/plain"))
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string()
}

fn fork(parent: &str, name: &str) -> ForkRequest {
    ForkRequest {
        session: SessionSpec::new(owner(), parent),
        name: name.into(),
        threads: ForkThreads::Refuse,
    }
}

/// A fork of `p`, where the thread `waiter` runs, to `t`: refused with
/// `threads_running` naming the thread, then made with `threads: drop`,
/// which names it among the threads dropped.
async fn fork_dropping_threads(reg: &Registry) -> cellhost_sessions::requests::ForkReport {
    let e = fork("p", "t").execute(reg).await.expect_err("threads");
    assert_eq!(e.code(), "threads_running", "{e}");
    assert!(e.to_string().contains("waiter"), "{e}");
    let mut drop_req = fork("p", "t");
    drop_req.threads = ForkThreads::Drop;
    let r = drop_req.execute(reg).await.expect("fork dropping threads");
    assert!(
        r.threads_dropped.iter().any(|t| t.starts_with("waiter")),
        "{:?}",
        r.threads_dropped
    );
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fork_has_the_parents_state_and_its_own_and_counts_on() {
    let report = state_and_isolation(None).await;
    assert_eq!(report.method, ForkMethod::Pickle);
    assert!(
        report
            .pickle_reason
            .as_deref()
            .is_some_and(|r| r.contains("confined")),
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_off_fork_is_copy_on_write_with_the_parents_state_and_its_own() {
    let report = state_and_isolation(Some(SandboxMode::Off)).await;
    assert_eq!(report.method, ForkMethod::Cow, "{report:?}");
    assert_eq!(report.pickle_reason, None);
    assert_eq!(report.snapshot_bytes, 0);
}

/// The state test for a registry of sandbox mode `mode`: returns the
/// fork's report.
async fn state_and_isolation(mode: Option<SandboxMode>) -> cellhost_sessions::requests::ForkReport {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start_with(dir.path(), mode).await;
    let _guard = Shutdown(reg.clone());
    let has_np = run(
        &reg,
        "p",
        "import importlib.util as u\nbool(u.find_spec('numpy') and u.find_spec('pandas'))",
    )
    .await;
    let has_np = text(&has_np) == "True";
    run(
        &reg,
        "p",
        "import json, random\nx = [1, 2, 3]\ncounter = {'n': 1}\ndef bump(k):\n    counter['n'] += k\n    return counter['n']\nopen('data.txt', 'w').write('parent')\nmarker = 'p'\ndef set_marker(v):\n    global marker\n    marker = v",
    )
    .await;
    if has_np {
        run(
            &reg,
            "p",
            "import numpy as np, pandas as pd\narr = np.arange(1000.0)\ndf = pd.DataFrame({'a': [1, 2, 3]})",
        )
        .await;
    } else {
        eprintln!(
            "capability: numpy/pandas missing in {}: array and frame checks skipped",
            python().display()
        );
    }
    let before = run(&reg, "p", "5").await.execution_count;

    let report = fork("p", "c").execute(&reg).await.expect("fork");
    assert_eq!(report.session, "c");
    assert_eq!(report.parent, "p");
    assert_eq!(report.execution_count, before);
    assert!(report.names.iter().any(|n| n == "x"), "{:?}", report.names);
    assert!(report.lost.is_empty(), "{:?}", report.lost);
    assert_eq!(report.files_copied, 1);
    assert!(report.cwd.join("data.txt").exists());
    // Its own kernel.
    let parent_pid = reg
        .kernel(&reg.key(&owner(), "p"))
        .expect("parent live")
        .info()
        .pid;
    assert_ne!(report.pid, parent_pid);

    // The count goes on from the fork point.
    let r = run(&reg, "c", "x").await;
    assert_eq!(r.execution_count, before + 1);
    assert_eq!(text(&r), "[1, 2, 3]");
    // Functions of the cells and imported modules are there.
    assert_eq!(text(&run(&reg, "c", "bump(10)").await), "11");
    assert_eq!(
        text(&run(&reg, "c", "marker, json.dumps([1])").await),
        "('p', '[1]')"
    );

    // Mutations in each branch stay in it: lists, module globals, files.
    run(
        &reg,
        "c",
        "x.append(4); set_marker('c'); open('data.txt', 'w').write('child')",
    )
    .await;
    run(&reg, "p", "x.append(99)").await;
    assert_eq!(text(&run(&reg, "p", "x").await), "[1, 2, 3, 99]");
    assert_eq!(text(&run(&reg, "c", "x").await), "[1, 2, 3, 4]");
    assert_eq!(text(&run(&reg, "p", "marker, counter['n']").await), "('p', 1)");
    assert_eq!(text(&run(&reg, "c", "marker, counter['n']").await), "('c', 11)");
    assert_eq!(text(&run(&reg, "p", "open('data.txt').read()").await), "'parent'");
    assert_eq!(text(&run(&reg, "c", "open('data.txt').read()").await), "'child'");
    if has_np {
        run(&reg, "c", "arr[:10] = -1; df.loc[0, 'a'] = 100").await;
        assert_eq!(
            text(&run(&reg, "p", "float(arr[:10].sum()), int(df.a[0])").await),
            "(45.0, 1)"
        );
        assert_eq!(
            text(&run(&reg, "c", "float(arr[:10].sum()), int(df.a[0])").await),
            "(-10.0, 100)"
        );
        // Random generators are reseeded: the branches do not draw the same.
        let p = text(&run(&reg, "p", "np.random.random(), random.random()").await);
        let c = text(&run(&reg, "c", "np.random.random(), random.random()").await);
        assert_ne!(p, c);
    }

    // Lineage in history.
    let h = HistoryRequest {
        owner: owner(),
        session: "c".into(),
    }
    .execute(&reg)
    .await
    .expect("history");
    let k = h.kernels.first().expect("a kernel row");
    assert_eq!(k.parent_session.as_deref(), Some("p"));
    assert_eq!(k.parent_generation, Some(report.parent_generation));
    assert_eq!(k.fork_point, Some(before));

    // Killing one leaves the other.
    KillRequest {
        owner: owner(),
        session: "p".into(),
        cwd: CwdScope::Any,
    }
    .execute(&reg)
    .await
    .expect("kill parent");
    assert_eq!(text(&run(&reg, "c", "len(x)").await), "4");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_parent_a_taken_name_and_running_threads_are_refused_with_their_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(dir.path()).await;
    let _guard = Shutdown(reg.clone());
    run(&reg, "p", "y = 1").await;
    run(&reg, "other", "z = 1").await;

    // A taken name (a live session; the parent's own name).
    for name in ["other", "p"] {
        let e = fork("p", name).execute(&reg).await.expect_err("taken");
        assert_eq!(e.code(), "session_exists", "{e}");
    }
    // No such parent.
    let e = fork("nobody", "n").execute(&reg).await.expect_err("missing");
    assert_eq!(e.code(), "session_not_found");

    // Busy: a cell that waits on a file; the fork is refused while it runs.
    let go = dir.path().join("work/go");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut req = ExecuteRequest::new(
        SessionSpec::new(owner(), "p"),
        format!(
            "import os, time\nprint('started', flush=True)\nwhile not os.path.exists({:?}): time.sleep(0.01)",
            go.display().to_string()
        ),
        Origin::new("test"),
    );
    req.live = Some(tx);
    let running = {
        let reg = reg.clone();
        tokio::spawn(async move { req.execute(&reg).await })
    };
    match rx.recv().await {
        Some(LiveEvent::Stdout(s)) => assert!(s.contains("started"), "{s}"),
        other => panic!("expected the cell's first output, got {other:?}"),
    }
    let e = fork("p", "b").execute(&reg).await.expect_err("busy");
    assert_eq!(e.code(), "session_busy", "{e}");
    std::fs::write(&go, b"").expect("go");
    assert_eq!(
        running.await.expect("join").expect("cell").result.status,
        CellStatus::Ok
    );

    // A thread of a cell refuses the fork, naming it, unless dropped.
    run(
        &reg,
        "p",
        "import threading\nstop = threading.Event()\nt = threading.Thread(target=stop.wait, name='waiter', daemon=True)\nt.start()",
    )
    .await;
    let r = fork_dropping_threads(&reg).await;
    assert!(r.lost.contains_key("t") && r.lost.contains_key("stop"), "{r:?}");
    assert!(r.names.iter().any(|n| n == "y"), "{r:?}");
    assert_eq!(text(&run(&reg, "t", "y").await), "1");
    run(&reg, "p", "stop.set(); t.join()").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workdir_past_the_disk_cap_is_refused_and_leaves_no_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(dir.path()).await;
    let _guard = Shutdown(reg.clone());
    let mut spec = SessionSpec::new(owner(), "big");
    spec.limits.disk_mb = Some(1);
    let r = ExecuteRequest::new(
        spec,
        "open('a.bin', 'wb').write(b'x' * 800_000)",
        Origin::new("test"),
    )
    .execute(&reg)
    .await
    .expect("execute")
    .result;
    assert_eq!(r.status, CellStatus::Ok, "{:?}", r.error);
    run(&reg, "big", "open('b.bin', 'wb').write(b'y' * 800_000)").await;
    let e = fork("big", "big2").execute(&reg).await.expect_err("over the cap");
    assert_eq!(e.code(), "disk_full", "{e}");
    assert!(reg.kernel(&reg.key(&owner(), "big2")).is_none());
    // No snapshot left behind in the parent's directory.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("work"))
        .expect("workdir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(".cellhost-fork-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

async fn kill_session(reg: &Registry, session: &str) {
    KillRequest {
        owner: owner(),
        session: session.into(),
        cwd: CwdScope::Any,
    }
    .execute(reg)
    .await
    .expect("kill");
}

/// The worker and init pids of `session`'s live kernel.
fn pids_of(reg: &Registry, session: &str) -> Vec<u32> {
    let info = reg
        .kernel(&reg.key(&owner(), session))
        .expect("live")
        .info()
        .clone();
    vec![info.pid, info.init_pid]
}

fn gone(pids: &[u32]) -> Vec<(u32, String)> {
    pids.iter()
        .filter_map(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .map(|s| (*p, s))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_on_write_fork_and_its_parent_end_without_strays_in_either_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start_with(dir.path(), Some(SandboxMode::Off)).await;
    let _guard = Shutdown(reg.clone());
    for parent_first in [true, false] {
        let (p, c) = if parent_first { ("p1", "c1") } else { ("p2", "c2") };
        run(&reg, p, "import subprocess\nv = list(range(1000))").await;
        let report = fork(p, c).execute(&reg).await.expect("fork");
        assert_eq!(report.method, ForkMethod::Cow, "{report:?}");
        // Each runs a child process of its own, which must go with it.
        run(&reg, p, "sp = subprocess.Popen(['sleep', '1000'])").await;
        run(&reg, c, "sp = subprocess.Popen(['sleep', '1000'])").await;
        let mut pids = pids_of(&reg, p);
        pids.push(text(&run(&reg, p, "sp.pid").await).parse().expect("pid"));
        let mut child = pids_of(&reg, c);
        child.push(text(&run(&reg, c, "sp.pid").await).parse().expect("pid"));
        let (first, second) = if parent_first { (p, c) } else { (c, p) };
        kill_session(&reg, first).await;
        // The other lives on.
        assert_eq!(text(&run(&reg, second, "len(v)").await), "1000");
        kill_session(&reg, second).await;
        pids.extend(child);
        assert!(gone(&pids).is_empty(), "left: {:?}", gone(&pids));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parent_killed_by_sigkill_leaves_its_copy_on_write_fork_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start_with(dir.path(), Some(SandboxMode::Off)).await;
    let _guard = Shutdown(reg.clone());
    run(&reg, "p", "state = {'k': 41}\nfh = open('log.txt', 'w')").await;
    let report = fork("p", "c").execute(&reg).await.expect("fork");
    assert_eq!(report.method, ForkMethod::Cow);
    // The parent's open file is not the fork's: using it fails there as on
    // a closed file, and closing it closes nothing the fork's kernel uses.
    let r = run(
        &reg,
        "c",
        "import errno\ntry:\n    fh.write('c'); fh.flush(); r = 'written'\nexcept OSError as e:\n    r = errno.errorcode[e.errno]\nr",
    )
    .await;
    assert_eq!(text(&r), "'EBADF'");
    run(
        &reg,
        "c",
        "try:\n    fh.close()\nexcept OSError:\n    pass\nopen('own.txt', 'w').write('c')",
    )
    .await;
    assert_eq!(text(&run(&reg, "c", "print('still here'); 2").await), "2");
    run(&reg, "p", "fh.write('p'); fh.flush()").await;
    let parent = pids_of(&reg, "p");
    let status = std::process::Command::new("kill")
        .args(["-KILL", &parent[0].to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    assert_eq!(text(&run(&reg, "c", "state['k'] + 1").await), "42");
    // The parent's next cell finds its kernel gone (`crashed` when it was
    // sent before the host saw the death), then a new kernel runs it.
    let next = || async {
        ExecuteRequest::new(SessionSpec::new(owner(), "p"), "1", Origin::new("test"))
            .execute(&reg)
            .await
            .expect("execute")
            .result
    };
    let mut r = next().await;
    if r.status == CellStatus::Crashed {
        r = next().await;
    }
    assert_eq!(r.status, CellStatus::Ok, "{:?}", r.error);
    assert!(r.kernel.state_reset && r.kernel.generation == 2, "{:?}", r.kernel);
    // The fork is untouched by all of it.
    assert_eq!(text(&run(&reg, "c", "state['k']").await), "41");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_on_write_fork_is_refused_for_threads_unless_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start_with(dir.path(), Some(SandboxMode::Off)).await;
    let _guard = Shutdown(reg.clone());
    run(
        &reg,
        "p",
        "import threading\ny = 1\nstop = threading.Event()\nt = threading.Thread(target=stop.wait, name='waiter', daemon=True)\nt.start()",
    )
    .await;
    let r = fork_dropping_threads(&reg).await;
    assert_eq!(r.method, ForkMethod::Cow);
    assert_eq!(text(&run(&reg, "t", "y").await), "1");
    run(&reg, "p", "stop.set(); t.join()").await;
}

fn pid_alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z")
}

/// The child half of `a_sigkilled_host_leaves_no_copy_on_write_fork`: a
/// host with two copy-on-write forks, one whose parent it killed (the
/// fork's init is then the host's child) and one whose parent lives, each
/// kernel with a child process. Does nothing unless the parent set
/// `CELLHOST_COW_CHILD`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cow_host_child_helper() {
    let Some(dir) = std::env::var_os("CELLHOST_COW_CHILD") else {
        return;
    };
    let reg = start_with(Path::new(&dir), Some(SandboxMode::Off)).await;
    for (p, c) in [("p1", "c1"), ("p2", "c2")] {
        run(
            &reg,
            p,
            "import subprocess\nsp = subprocess.Popen(['sleep', '1000'])",
        )
        .await;
        let report = fork(p, c).execute(&reg).await.expect("fork");
        assert_eq!(report.method, ForkMethod::Cow);
        run(&reg, c, "sp2 = subprocess.Popen(['sleep', '1000'])").await;
        let mut pids = pids_of(&reg, c);
        pids.push(text(&run(&reg, c, "sp2.pid").await).parse().expect("pid"));
        if p == "p1" {
            kill_session(&reg, p).await;
        } else {
            pids.extend(pids_of(&reg, p));
            pids.push(text(&run(&reg, p, "sp.pid").await).parse().expect("pid"));
        }
        println!(
            "PID {}",
            pids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
        );
    }
    println!("READY");
    let _ = run(&reg, "c2", "import time; time.sleep(60)").await;
}

#[test]
fn a_sigkilled_host_leaves_no_copy_on_write_fork() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args([
            "cow_host_child_helper",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CELLHOST_COW_CHILD", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("child host");
    let out = child.stdout.take().expect("stdout");
    let mut pids: Vec<u32> = Vec::new();
    for line in std::io::BufReader::new(out).lines() {
        let line = line.expect("line");
        if let Some(at) = line.find("PID ") {
            pids.extend(line[at + 4..].split(' ').filter_map(|p| p.parse::<u32>().ok()));
        }
        if line.contains("READY") {
            break;
        }
    }
    // c1: worker, init, its child; c2 the same, and its parent p2's.
    assert_eq!(pids.len(), 9, "{pids:?}");
    let _ = child.kill();
    let _ = child.wait();
    let t0 = std::time::Instant::now();
    while pids.iter().any(|p| pid_alive(*p)) && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left: Vec<u32> = pids.into_iter().filter(|p| pid_alive(*p)).collect();
    assert!(left.is_empty(), "survived the host: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_on_write_fork_of_a_fork_outlives_both_and_leaves_no_strays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start_with(dir.path(), Some(SandboxMode::Off)).await;
    let _guard = Shutdown(reg.clone());
    run(&reg, "p", "v = [1]").await;
    assert_eq!(
        fork("p", "c").execute(&reg).await.expect("fork").method,
        ForkMethod::Cow
    );
    run(&reg, "c", "v.append(2)").await;
    assert_eq!(
        fork("c", "g")
            .execute(&reg)
            .await
            .expect("fork of the fork")
            .method,
        ForkMethod::Cow
    );
    let mut pids = pids_of(&reg, "p");
    pids.extend(pids_of(&reg, "c"));
    pids.extend(pids_of(&reg, "g"));
    // Ending the middle one leaves its parent and its fork.
    kill_session(&reg, "c").await;
    assert_eq!(text(&run(&reg, "g", "v").await), "[1, 2]");
    assert_eq!(text(&run(&reg, "p", "v").await), "[1]");
    kill_session(&reg, "p").await;
    assert_eq!(text(&run(&reg, "g", "v + [3]").await), "[1, 2, 3]");
    kill_session(&reg, "g").await;
    assert!(gone(&pids).is_empty(), "left: {:?}", gone(&pids));
}
