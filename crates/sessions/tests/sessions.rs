//! Real kernels, real Python: the registry, its lifecycle, the warm pool,
//! external tools, and the journal (including a host SIGKILLed mid-run).
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_kernel::{CellStatus, ExecOptions, KernelConfig, ToolCall, ToolFuture, ToolHost};
use cellhost_sessions::{
    CommandTools, Durability, Journal, JournalReader, Origin, Registry, RegistryConfig, ToolSpec,
};
use tempfile::TempDir;

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

fn template(dir: &Path) -> KernelConfig {
    let mut cfg = KernelConfig::new(python(), dir.join("unused"));
    cfg.cwd = Some(dir.to_path_buf());
    cfg
}

fn reg_config(dir: &Path) -> RegistryConfig {
    let mut c = RegistryConfig::new(dir.join("state"), template(dir));
    c.pool_size = 0;
    c
}

async fn start(cfg: RegistryConfig, journal: bool) -> Arc<Registry> {
    let j = journal.then(|| {
        Arc::new(Journal::open(cfg.root.join("journal.sqlite3"), Durability::Normal).expect("journal"))
    });
    Registry::start(cfg, j).await.expect("registry")
}

fn o() -> Origin {
    Origin::new("test")
}

fn pid_alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z")
}

async fn wait_dead(pid: u32) -> bool {
    for _ in 0..200 {
        if !pid_alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_calls_spawn_one_kernel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(reg_config(dir.path()), true).await;
    let key = reg.key("alice", "s1");
    let mut tasks = Vec::new();
    for i in 0..20 {
        let reg = reg.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            reg.execute(
                &key,
                &format!("v{i} = {i}\nimport os\nos.getpid()"),
                ExecOptions::default(),
                &o(),
            )
            .await
        }));
    }
    let mut pids = std::collections::BTreeSet::new();
    for t in tasks {
        let r = t.await.expect("join").expect("execute");
        assert_eq!(r.status, CellStatus::Ok, "{r:?}");
        assert_eq!(r.kernel.generation, 1);
        assert_eq!(r.kernel.session, "s1");
        pids.insert(r.kernel.pid);
    }
    assert_eq!(pids.len(), 1, "one kernel ran every cell: {pids:?}");
    assert_eq!(reg.stats().spawned, 1);
    let hist = reg
        .journal()
        .expect("journal")
        .history("alice", "s1")
        .await
        .expect("history");
    assert_eq!(hist.len(), 20);
    assert!(hist.iter().all(|c| c.status == "ok" && c.origin == "test"));
    reg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_never_see_each_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(reg_config(dir.path()), false).await;
    let a = reg.key("alice", "work");
    let b = reg.key("bob", "work");
    reg.execute(&a, "secret = 'alice'", ExecOptions::default(), &o())
        .await
        .expect("a");
    let r = reg
        .execute(&b, "globals().get('secret')", ExecOptions::default(), &o())
        .await
        .expect("b");
    assert!(r.result.is_none(), "bob saw alice's namespace: {:?}", r.result);
    let ra = reg
        .execute(&a, "secret", ExecOptions::default(), &o())
        .await
        .expect("a2");
    assert_ne!(ra.kernel.pid, r.kernel.pid);
    assert_eq!(reg.sessions_of("alice").len(), 1);
    assert_eq!(reg.sessions_of("alice")[0].0.owner, "alice");
    assert_eq!(reg.sessions_of("bob").len(), 1);
    reg.dispose_owner("alice").await;
    assert!(
        wait_dead(ra.kernel.pid).await,
        "alice's kernel survived dispose_owner"
    );
    assert!(reg.sessions_of("alice").is_empty());
    assert!(pid_alive(r.kernel.pid), "bob's kernel was killed with alice's");
    reg.shutdown().await;
    assert!(wait_dead(r.kernel.pid).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lru_cap_evicts_idle_unpinned_and_reports_the_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.max_live = 2;
    let reg = start(cfg, true).await;
    let parent = reg.key("o", "parent");
    let child = reg.child_key(&parent, "helper");
    let s1 = reg.key("o", "s1");
    let s2 = reg.key("o", "s2");
    let rc = reg
        .execute(&child, "c = 1", ExecOptions::default(), &o())
        .await
        .expect("child");
    let r1 = reg
        .execute(&s1, "x = 1", ExecOptions::default(), &o())
        .await
        .expect("s1");
    // At the cap: s2 needs room; the pinned child is skipped, s1 goes.
    reg.execute(&s2, "y = 2", ExecOptions::default(), &o())
        .await
        .expect("s2");
    assert_eq!(reg.stats().evicted, 1);
    assert!(wait_dead(r1.kernel.pid).await, "s1 was not evicted");
    assert!(pid_alive(rc.kernel.pid), "the pinned child was evicted");
    let again = reg
        .execute(&s1, "'x' in globals()", ExecOptions::default(), &o())
        .await
        .expect("s1 again");
    assert!(again.kernel.state_reset);
    assert_eq!(again.kernel.generation, 2);
    let why = again.kernel.reset_reason.clone().unwrap_or_default();
    assert!(why.contains("evicted"), "{why}");
    // Disposing the parent disposes its delegated child.
    reg.dispose(&parent).await;
    assert!(
        wait_dead(rc.kernel.pid).await,
        "the child survived its parent's disposal"
    );
    reg.shutdown().await;
    let j = JournalReader::open(&dir.path().join("state/journal.sqlite3")).expect("reader");
    let k = j.kernels("o", "s1").expect("kernels");
    assert_eq!(k.len(), 2);
    assert_eq!(k[0].end_reason.as_deref(), Some("evicted (LRU cap)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_registry_refuses_when_nothing_can_be_evicted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.max_live = 1;
    let reg = start(cfg, false).await;
    let s1 = reg.key("o", "s1");
    reg.set_pinned(&s1, true);
    reg.execute(&s1, "1", ExecOptions::default(), &o())
        .await
        .expect("s1");
    let e = reg
        .execute(&reg.key("o", "s2"), "1", ExecOptions::default(), &o())
        .await
        .expect_err("full");
    assert!(e.to_string().contains("live kernels"), "{e}");
    // An unpinned kernel with a cell running (attached) is not evicted either.
    reg.set_pinned(&s1, false);
    let busy = {
        let reg = reg.clone();
        let s1 = s1.clone();
        tokio::spawn(async move {
            reg.execute(
                &s1,
                "import time; time.sleep(1.5); 'done'",
                ExecOptions::default(),
                &o(),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let e = reg
        .execute(&reg.key("o", "s3"), "1", ExecOptions::default(), &o())
        .await
        .expect_err("attached kernel kept");
    assert!(e.to_string().contains("live kernels"), "{e}");
    let r = busy.await.expect("join").expect("busy cell");
    assert_eq!(
        r.status,
        CellStatus::Ok,
        "the attached kernel's cell was disturbed: {r:?}"
    );
    // Idle now: it can be evicted.
    reg.execute(&reg.key("o", "s3"), "1", ExecOptions::default(), &o())
        .await
        .expect("s3");
    assert_eq!(reg.stats().evicted, 1);
    reg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_reaper_runs_without_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.idle_timeout = Duration::from_millis(400);
    cfg.reaper_interval = Some(Duration::from_millis(100));
    let reg = start(cfg, false).await;
    let k = reg.key("o", "idle");
    let r = reg
        .execute(&k, "1", ExecOptions::default(), &o())
        .await
        .expect("cell");
    // No call arrives from here on.
    assert!(wait_dead(r.kernel.pid).await, "the idle kernel was not reaped");
    assert_eq!(reg.stats().reaped, 1);
    assert_eq!(reg.stats().live, 0);
    let r2 = reg
        .execute(&k, "2", ExecOptions::default(), &o())
        .await
        .expect("again");
    assert!(r2.kernel.state_reset);
    assert!(r2.kernel.reset_reason.unwrap_or_default().contains("idle"));
    reg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_staging_of_dead_hosts_is_swept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let staging = dir.path().join("state/staging");
    let dead = {
        let mut c = Command::new("true").spawn().expect("true");
        let pid = c.id();
        c.wait().expect("wait");
        pid
    };
    let old_dead = staging.join("old-dead");
    let young_dead = staging.join("young-dead");
    let old_alive = staging.join("old-alive");
    for (d, pid) in [
        (&old_dead, dead),
        (&young_dead, dead),
        (&old_alive, std::process::id()),
    ] {
        std::fs::create_dir_all(d.join("k1")).expect("mkdir");
        std::fs::write(d.join("host.pid"), pid.to_string()).expect("pid");
    }
    let eight_days = std::time::SystemTime::now() - Duration::from_secs(8 * 24 * 3600);
    for d in [&old_dead, &old_alive] {
        let f = std::fs::File::open(d).expect("open dir");
        f.set_modified(eight_days).expect("set mtime");
    }
    let reg = start(reg_config(dir.path()), false).await;
    assert!(
        !old_dead.exists(),
        "a week-old staging dir of a dead host was kept"
    );
    assert!(young_dead.exists(), "a young staging dir was swept");
    assert!(old_alive.exists(), "a live host's staging dir was swept");
    assert!(reg.staging_dir().exists());
    reg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_pool_hands_out_fresh_kernels_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.pool_size = 2;
    let reg = start(cfg, true).await;
    let t0 = Instant::now();
    while reg.stats().pooled < 2 {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let k = reg.key("o", "pooled");
    let r = reg
        .execute(&k, "import os; os.getpid()", ExecOptions::default(), &o())
        .await
        .expect("cell");
    assert_eq!(r.kernel.session, "pooled");
    assert_eq!(r.kernel.generation, 1);
    assert_eq!(reg.stats().from_pool, 1);
    assert_eq!(reg.stats().spawned, 0);
    // Refilled in the background; the used kernel is never among them.
    let t0 = Instant::now();
    while reg.stats().pooled < 2 {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never refilled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = reg.key("o", "other");
    let r2 = reg
        .execute(&other, "1", ExecOptions::default(), &o())
        .await
        .expect("other");
    assert_ne!(r2.kernel.pid, r.kernel.pid, "a used kernel was handed out again");
    // A pooled kernel as the session's second generation: the session's
    // count is what the registry reports (the kernel itself says 1).
    if let Some(kernel) = reg.kernel(&other) {
        kernel.kill().await;
    }
    let t0 = Instant::now();
    while reg.stats().pooled < 1 {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never refilled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r3 = reg
        .execute(&other, "1", ExecOptions::default(), &o())
        .await
        .expect("second generation");
    assert_eq!(r3.kernel.generation, 2);
    let (kernel, generation) = reg.kernel_and_generation(&other).expect("live");
    assert_eq!(generation, 2);
    assert_eq!(kernel.info().generation, 1, "expected a pooled kernel");
    // A non-default configuration does not take from the pool.
    let odd = reg.key("o", "odd").with_cwd(std::env::temp_dir());
    reg.execute(&odd, "1", ExecOptions::default(), &o())
        .await
        .expect("odd");
    assert_eq!(reg.stats().spawned, 1);
    reg.shutdown().await;
    assert_eq!(reg.stats().pooled, 0);
    assert!(wait_dead(r.kernel.pid).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_kills_every_kernel_and_flushes_the_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(reg_config(dir.path()), true).await;
    let mut pids = Vec::new();
    for s in ["a", "b", "c"] {
        let r = reg
            .execute(&reg.key("o", s), "1", ExecOptions::default(), &o())
            .await
            .expect("cell");
        pids.push(r.kernel.pid);
    }
    reg.shutdown().await;
    for p in pids {
        assert!(!pid_alive(p), "kernel {p} survived shutdown");
    }
    let j = JournalReader::open(&dir.path().join("state/journal.sqlite3")).expect("reader");
    for s in ["a", "b", "c"] {
        let k = j.kernels("o", s).expect("kernels");
        assert_eq!(k[0].end_reason.as_deref(), Some("host shutdown"));
    }
    assert!(
        reg.execute(&reg.key("o", "a"), "1", ExecOptions::default(), &o())
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_a_cell_opened_are_reported_and_journaled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(reg_config(dir.path()), true).await;
    let k = reg.key("o", "files");
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "hello").expect("write");
    let code = format!(
        "import json, os\nopen({inp:?}).read()\nwith open('out.txt', 'w') as f: f.write('x')\nfd = os.open('raw.bin', os.O_WRONLY | os.O_CREAT); os.close(fd)\n",
        inp = input.display().to_string()
    );
    let r = reg
        .execute(&k, &code, ExecOptions::default(), &o())
        .await
        .expect("cell");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    let files = r.files.clone().expect("files");
    let out = dir.path().join("out.txt").display().to_string();
    let raw = dir.path().join("raw.bin").display().to_string();
    assert_eq!(files.read, vec![input.display().to_string()], "{files:?}");
    assert_eq!(files.write, vec![out, raw], "{files:?}");
    assert!(!files.truncated);
    // Imports (library files) are not reported; a cell that opens nothing
    // reports nothing; more than 256 paths are cut.
    let r2 = reg
        .execute(&k, "import csv, decimal\n1", ExecOptions::default(), &o())
        .await
        .expect("c2");
    let f2 = r2.files.expect("files");
    assert!(f2.read.is_empty() && f2.write.is_empty(), "{f2:?}");
    let r3 = reg
        .execute(
            &k,
            "for i in range(300):\n    open('f%d.txt' % i, 'w').close()",
            ExecOptions::default(),
            &o(),
        )
        .await
        .expect("c3");
    let f3 = r3.files.expect("files");
    assert_eq!(f3.write.len(), 256);
    assert!(f3.truncated);
    let hist = reg
        .journal()
        .expect("journal")
        .history("o", "files")
        .await
        .expect("history");
    assert_eq!(hist[0].files_written, files.write);
    assert_eq!(hist[0].files_read, vec![input.display().to_string()]);
    assert!(hist[2].files_truncated);
    reg.shutdown().await;
}

struct Echo;

impl ToolHost for Echo {
    fn names(&self) -> Vec<String> {
        vec!["echo".into()]
    }
    fn call(&self, call: ToolCall) -> ToolFuture {
        Box::pin(async move { Ok(serde_json::json!({"session": call.session, "args": call.args})) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_see_the_session_name_and_calls_are_journaled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.pool_size = 1;
    let mut specs = BTreeMap::new();
    specs.insert(
        "cat".to_string(),
        ToolSpec {
            command: vec!["cat".into()],
            timeout_s: 10.0,
            description: "echo the request".into(),
        },
    );
    cfg.template.tool_host = Some(Arc::new(CommandTools::new(specs)));
    let reg = start(cfg, true).await;
    let t0 = Instant::now();
    while reg.stats().pooled < 1 {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let k = reg.key("o", "tooling");
    let r = reg
        .execute(
            &k,
            "import cellhost\nr = cellhost.tools.cat(q='hi', token='x')\n(r['session'], r['args']['q'], r['name'])",
            ExecOptions::default(),
            &o(),
        )
        .await
        .expect("cell");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    let text = r
        .result
        .as_ref()
        .and_then(|b| b.get("text/plain"))
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    assert_eq!(
        text, "('tooling', 'hi', 'cat')",
        "the pooled kernel's tool calls name the session"
    );
    assert_eq!(r.tool_calls.len(), 1);
    let hist = reg
        .journal()
        .expect("journal")
        .history("o", "tooling")
        .await
        .expect("history");
    assert_eq!(hist[0].tool_calls[0]["name"], "cat");
    assert_eq!(hist[0].tool_calls[0]["outcome"], "ok");
    reg.shutdown().await;
    // A trait-object host works the same way.
    let mut cfg = reg_config(dir.path());
    cfg.template.tool_host = Some(Arc::new(Echo));
    let reg = start(cfg, false).await;
    let r = reg
        .execute(
            &reg.key("o", "echo"),
            "import cellhost\ncellhost.call('echo', {'a': 1})['session']",
            ExecOptions::default(),
            &o(),
        )
        .await
        .expect("cell");
    assert_eq!(
        r.result
            .as_ref()
            .and_then(|b| b.get("text/plain"))
            .and_then(|v| v.as_str()),
        Some("'echo'")
    );
    reg.shutdown().await;
}

/// The child half of `journal_survives_host_sigkill`: a host journaling
/// real cells until it is killed. Does nothing unless the parent set
/// `CELLHOST_JOURNAL_CHILD`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_child_helper() {
    let Some(dir) = std::env::var_os("CELLHOST_JOURNAL_CHILD") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let reg = start(reg_config(&dir), true).await;
    let k = reg.key("o", "crashy");
    for i in 0..20 {
        let r = reg
            .execute(
                &k,
                &format!("x{i} = {i}\nprint('cell {i}')"),
                ExecOptions::default(),
                &o(),
            )
            .await
            .expect("cell");
        println!("SETTLED {} {}", r.cell_id, r.status.as_str());
    }
    println!("LONG");
    let _ = reg
        .execute(&k, "import time; time.sleep(60)", ExecOptions::default(), &o())
        .await;
}

#[test]
fn journal_survives_host_sigkill() {
    let dir: TempDir = tempfile::tempdir().expect("tempdir");
    let (mut child, out) = child_host("journal_child_helper", "CELLHOST_JOURNAL_CHILD", dir.path());
    let mut settled = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.expect("line");
        // libtest may print `test NAME ... ` before the first line.
        if let Some(at) = line.find("SETTLED ") {
            let rest = &line[at + "SETTLED ".len()..];
            settled.push(rest.split(' ').next().unwrap_or_default().to_string());
        }
        if line.contains("LONG") {
            break;
        }
    }
    assert_eq!(settled.len(), 20);
    // Let the long cell start (it is journaled as running), then SIGKILL.
    std::thread::sleep(Duration::from_millis(500));
    let _ = cellhost_sandbox::signal::kill(child.id() as i32, libc_sigkill());
    let _ = child.wait();
    let path = dir.path().join("state/journal.sqlite3");
    {
        let r = JournalReader::open(&path).expect("reader");
        assert_eq!(r.integrity_check().expect("check"), "ok");
    }
    let j = Journal::open(&path, Durability::Normal).expect("reopen");
    assert_eq!(j.lost_at_open(), 1, "the cell in flight is marked lost");
    drop(j);
    let r = JournalReader::open(&path).expect("reader");
    assert_eq!(r.integrity_check().expect("check"), "ok");
    let cells = r.cells("o", "crashy").expect("cells");
    for id in &settled {
        let c = cells
            .iter()
            .find(|c| &c.id == id)
            .unwrap_or_else(|| panic!("settled cell {id} missing"));
        assert_eq!(c.status, "ok");
    }
    assert_eq!(cells.iter().filter(|c| c.status == "lost").count(), 1);
    let lost = cells.iter().find(|c| c.status == "lost").expect("lost");
    assert!(lost.code.contains("sleep(60)"));
    assert_eq!(cells[3].stdout_head, "cell 3\n");
}

/// Runs the test `helper` of this binary as a separate host process, with
/// `env` naming its directory; returns it and its standard output.
fn child_host(helper: &str, env: &str, dir: &Path) -> (std::process::Child, std::process::ChildStdout) {
    let exe = std::env::current_exe().expect("exe");
    let mut child = Command::new(exe)
        .args([helper, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("child host");
    let out = child.stdout.take().expect("stdout");
    (child, out)
}

/// Every file below `dir`.
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn libc_sigkill() -> i32 {
    9
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_replays_successful_cells_into_a_new_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(reg_config(dir.path()), true).await;
    let k = reg.key("o", "r");
    for code in ["x = 20", "1/0", "y = x + 1", "print('side effect')"] {
        reg.execute(&k, code, ExecOptions::default(), &o())
            .await
            .expect("cell");
    }
    assert!(matches!(
        reg.restore(&k, false).await,
        Err(cellhost_sessions::RegistryError::Restore(_))
    ));
    reg.shutdown().await;
    drop(reg);
    // A new host: the generation numbering continues from the journal.
    let reg = start(reg_config(dir.path()), true).await;
    let rep = reg.restore(&k, false).await.expect("restore");
    assert_eq!(rep.from_generation, 1);
    assert_eq!(rep.generation, 2);
    assert_eq!(rep.replayed.len(), 3, "{rep:?}");
    assert_eq!(rep.skipped.len(), 1);
    assert_eq!(rep.skipped[0].status, "error");
    let r = reg
        .execute(&k, "x + y", ExecOptions::default(), &o())
        .await
        .expect("after");
    assert_eq!(r.kernel.generation, 2);
    assert_eq!(
        r.result
            .as_ref()
            .and_then(|b| b.get("text/plain"))
            .and_then(|v| v.as_str()),
        Some("41")
    );
    let hist = reg
        .journal()
        .expect("j")
        .history("o", "r")
        .await
        .expect("history");
    assert_eq!(hist.iter().filter(|c| c.origin == "restore").count(), 3);
    reg.shutdown().await;
}

/// A cell queued behind one whose kernel is SIGKILLed never ran: the
/// driver fails it with `Dead` without sending it, and the registry runs
/// it on the next generation instead of answering `kernel_failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cell_queued_behind_a_killed_kernel_runs_on_the_next_generation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(reg_config(dir.path()), true).await;
    let k = reg.key("o", "queued");
    let first = reg
        .execute(&k, "x = 1", ExecOptions::default(), &o())
        .await
        .expect("cell");
    let flag = dir.path().join("running");
    let long = {
        let (reg, k) = (reg.clone(), k.clone());
        let code = format!(
            "import time\nopen({:?}, 'w').close()\ntime.sleep(120)",
            flag.display().to_string()
        );
        tokio::spawn(async move { reg.execute(&k, &code, ExecOptions::default(), &o()).await })
    };
    let kernel = reg.kernel(&k).expect("live kernel");
    while !flag.exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let queued = {
        let (reg, k) = (reg.clone(), k.clone());
        tokio::spawn(async move { reg.execute(&k, "41 + 1", ExecOptions::default(), &o()).await })
    };
    while kernel.queued() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = cellhost_sandbox::signal::kill(first.kernel.pid as i32, libc_sigkill());
    let long = long.await.expect("join").expect("the running cell's answer");
    assert_eq!(long.status, cellhost_kernel::CellStatus::Crashed, "{long:?}");
    let r = queued
        .await
        .expect("join")
        .expect("the queued cell ran, not kernel_failed");
    assert_eq!(r.status, cellhost_kernel::CellStatus::Ok, "{r:?}");
    assert_eq!(
        r.result
            .as_ref()
            .and_then(|b| b.get("text/plain"))
            .and_then(|v| v.as_str()),
        Some("42")
    );
    assert_eq!(r.kernel.generation, 2, "{r:?}");
    reg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_killed_from_outside_is_replaced_with_a_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(reg_config(dir.path()), true).await;
    let k = reg.key("o", "victim");
    let r = reg
        .execute(&k, "x = 1", ExecOptions::default(), &o())
        .await
        .expect("cell");
    let _ = cellhost_sandbox::signal::kill(r.kernel.pid as i32, libc_sigkill());
    assert!(wait_dead(r.kernel.pid).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r2 = reg
        .execute(&k, "'x' in globals()", ExecOptions::default(), &o())
        .await
        .expect("replaced");
    assert_eq!(r2.kernel.generation, 2);
    assert!(r2.kernel.state_reset, "{r2:?}");
    assert_eq!(
        r2.result
            .as_ref()
            .and_then(|b| b.get("text/plain"))
            .and_then(|v| v.as_str()),
        Some("False")
    );
    reg.shutdown().await;
    let j = JournalReader::open(&dir.path().join("state/journal.sqlite3")).expect("reader");
    let ks = j.kernels("o", "victim").expect("kernels");
    assert_eq!(ks.len(), 2);
    assert!(
        ks[0]
            .end_reason
            .as_deref()
            .unwrap_or_default()
            .contains("SIGKILL"),
        "{ks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn preload_forks_pooled_and_other_kernels_from_a_template() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.pool_size = 1;
    // A module no worker imports by itself.
    cfg.preload = vec!["colorsys".into()];
    let reg = start(cfg, false).await;
    let probe = "import sys\nprint('colorsys' in sys.modules)";
    let t0 = Instant::now();
    while reg.stats().pooled < 1 {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let k = reg.key("o", "pooled");
    let r = reg
        .execute(&k, probe, ExecOptions::default(), &o())
        .await
        .expect("cell");
    assert_eq!(r.stdout, "True\n", "{r:#?}");
    assert_eq!(reg.stats().from_pool, 1);
    // Beyond the pool (another workdir): forked from the same template.
    let odd = reg.key("o", "odd").with_cwd(std::env::temp_dir());
    let r2 = reg
        .execute(&odd, probe, ExecOptions::default(), &o())
        .await
        .expect("odd");
    assert_eq!(r2.stdout, "True\n", "{r2:#?}");
    let r3 = reg
        .execute(
            &odd,
            "import os\nprint(os.getcwd())",
            ExecOptions::default(),
            &o(),
        )
        .await
        .expect("cwd");
    assert_eq!(
        std::path::Path::new(r3.stdout.trim()),
        std::fs::canonicalize(std::env::temp_dir()).expect("tmp")
    );
    reg.shutdown().await;
    assert!(wait_dead(r.kernel.pid).await);
    assert!(wait_dead(r2.kernel.pid).await);
}

/// Python's template imports `preload` only: the R packages of
/// `r_preload` never reach it, and with only `r_preload` set Python
/// kernels start cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r_preload_never_reaches_python() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.pool_size = 0;
    cfg.r_preload = vec!["ggplot2".into()];
    let reg = start(cfg, false).await;
    let k = reg.key("o", "a");
    let r = reg
        .execute(&k, "print(1)", ExecOptions::default(), &o())
        .await
        .expect("cell");
    assert_eq!(r.stdout, "1\n", "{r:#?}");
    assert_eq!(reg.kernel(&k).and_then(|k| k.info().template), None);
    reg.shutdown().await;
    let templates = std::sync::Arc::new(cellhost_sessions::templates::Templates::new(
        [
            ("python".to_string(), vec!["colorsys".to_string()]),
            ("r".to_string(), vec!["ggplot2".to_string()]),
        ]
        .into_iter()
        .collect(),
    ));
    let t = templates
        .template_for(&template(dir.path()))
        .await
        .expect("Python template");
    assert_eq!(t.info().preloaded, vec!["colorsys".to_string()]);
    assert!(t.info().failed.is_empty(), "{:?}", t.info().failed);
    templates.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_template_is_replaced_and_its_kernels_live_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.preload = vec!["colorsys".into()];
    let reg = start(cfg, false).await;
    let probe = "import sys\nprint('colorsys' in sys.modules)";
    let a = reg.key("o", "a");
    let r = reg
        .execute(&a, probe, ExecOptions::default(), &o())
        .await
        .expect("a");
    assert_eq!(r.stdout, "True\n");
    // Kill the template behind the registry's back.
    let t = reg
        .kernel(&a)
        .and_then(|k| k.info().template)
        .expect("forked from a template");
    let _ = cellhost_sandbox::signal::kill(t as i32, libc_sigkill());
    assert!(wait_dead(t).await);
    // Its kernel is unaffected; the next session gets a new template.
    let r = reg
        .execute(&a, "print('still here')", ExecOptions::default(), &o())
        .await
        .expect("a");
    assert_eq!(r.stdout, "still here\n");
    let b = reg.key("o", "b");
    let r = reg
        .execute(&b, probe, ExecOptions::default(), &o())
        .await
        .expect("b");
    assert_eq!(r.stdout, "True\n", "{r:#?}");
    let t2 = reg.kernel(&b).and_then(|k| k.info().template).expect("forked");
    assert_ne!(t2, t);
    reg.shutdown().await;
    assert!(wait_dead(t2).await, "the template outlived the registry");
}

/// The child half of `host_sigkill_ends_forked_kernels`: a host with a
/// template and two busy forked kernels. Does nothing unless the parent set
/// `CELLHOST_TEMPLATE_CHILD`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_child_helper() {
    let Some(dir) = std::env::var_os("CELLHOST_TEMPLATE_CHILD") else {
        return;
    };
    let mut cfg = reg_config(&PathBuf::from(dir));
    cfg.preload = vec!["colorsys".into()];
    let reg = start(cfg, false).await;
    for name in ["x", "y"] {
        let k = reg.key("o", name);
        let r = reg
            .execute(&k, "import os\nprint(os.getpid())", ExecOptions::default(), &o())
            .await
            .expect("cell");
        assert_eq!(r.stdout, "2\n", "{r:#?}");
        let kernel = reg.kernel(&k).expect("kernel");
        let info = kernel.info();
        println!(
            "PID {} {} {}",
            info.pid,
            info.init_pid,
            info.template.unwrap_or(0)
        );
    }
    println!("READY");
    let k = reg.key("o", "x");
    let _ = reg
        .execute(&k, "import time; time.sleep(60)", ExecOptions::default(), &o())
        .await;
}

#[test]
fn host_sigkill_ends_forked_kernels() {
    let dir: TempDir = tempfile::tempdir().expect("tempdir");
    let (mut child, out) = child_host("template_child_helper", "CELLHOST_TEMPLATE_CHILD", dir.path());
    let mut pids: Vec<u32> = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.expect("line");
        if let Some(at) = line.find("PID ") {
            pids.extend(
                line[at + 4..]
                    .split(' ')
                    .filter_map(|p| p.parse::<u32>().ok())
                    .filter(|p| *p > 0),
            );
        }
        if line.contains("READY") {
            break;
        }
    }
    assert_eq!(
        pids.len(),
        6,
        "worker, init and template of two kernels: {pids:?}"
    );
    std::thread::sleep(Duration::from_millis(200));
    let _ = cellhost_sandbox::signal::kill(child.id() as i32, libc_sigkill());
    let _ = child.wait();
    let t0 = Instant::now();
    while pids.iter().any(|p| pid_alive(*p)) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = pids.into_iter().filter(|p| pid_alive(*p)).collect();
    assert!(left.is_empty(), "survived the host: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_template_never_holds_kernels_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mods = dir.path().join("mods");
    std::fs::create_dir_all(&mods).expect("mkdir");
    // Imports for 8 s: longer than a kernel waits for its template.
    std::fs::write(mods.join("slow_stack.py"), "import time\ntime.sleep(8)\n").expect("module");
    let mut cfg = reg_config(dir.path());
    cfg.template
        .env
        .push(("PYTHONPATH".into(), mods.clone().into_os_string()));
    cfg.preload = vec!["slow_stack".into()];
    let reg = start(cfg, false).await;
    let probe = "import sys\nprint('slow_stack' in sys.modules)";
    // The first kernel waits a while for the template, then starts cold.
    let first = reg.key("o", "first");
    let r = reg
        .execute(&first, probe, ExecOptions::default(), &o())
        .await
        .expect("first");
    assert_eq!(r.stdout, "False\n", "{r:#?}");
    // Kernels started while it is still importing do not wait at all, and
    // once it is ready they are forked from it.
    let mut forked = false;
    for i in 0..200 {
        let k = reg.key("o", &format!("k{i}"));
        let r = reg
            .execute(&k, probe, ExecOptions::default(), &o())
            .await
            .expect("cell");
        reg.dispose(&k).await;
        if r.stdout == "True\n" {
            forked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(forked, "no kernel was ever forked from the template");
    reg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_keeps_its_own_workdir_across_kernels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.template.cwd = None;
    cfg.pool_size = 1;
    cfg.session_workdirs = Some(dir.path().join("work"));
    let reg = start(cfg, false).await;
    let t0 = Instant::now();
    while reg.stats().pooled < 1 {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let list = "import os\nprint(sorted(os.listdir('.')))";
    let a = reg.key("o", "a/b");
    let r = reg
        .execute(
            &a,
            "open('mine.txt', 'w').write('a')",
            ExecOptions::default(),
            &o(),
        )
        .await
        .expect("a");
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    assert_eq!(reg.stats().from_pool, 1, "the pooled kernel was not used");
    // The pooled kernel's directory became the session's.
    let work = dir.path().join("work");
    let found: Vec<_> = walk_files(&work)
        .into_iter()
        .filter(|p| p.ends_with("mine.txt"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    // A new kernel of the same session starts in that directory.
    if let Some(k) = reg.kernel(&a) {
        k.kill().await;
    }
    let r = reg
        .execute(
            &a,
            "import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))",
            ExecOptions::default(),
            &o(),
        )
        .await
        .expect("a again");
    assert_eq!(r.kernel.generation, 2);
    let mut lines = r.stdout.lines();
    let cwd = std::path::PathBuf::from(lines.next().unwrap_or_default());
    assert_eq!(Some(cwd.as_path()), found[0].parent(), "{r:#?}");
    assert_eq!(lines.next(), Some("['mine.txt']"));
    // Another session (even one whose name sanitises alike) has its own.
    for (owner, name) in [("o", "a_b"), ("p", "a/b")] {
        let k = reg.key(owner, name);
        let r = reg
            .execute(&k, list, ExecOptions::default(), &o())
            .await
            .expect("other");
        assert_eq!(r.stdout, "[]\n", "{owner}/{name}");
    }
    reg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_cannot_fork_leaves_kernels_cold_and_working() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mods = dir.path().join("mods");
    std::fs::create_dir_all(&mods).expect("mkdir");
    // Starts a thread at import: the template refuses to fork.
    std::fs::write(
        mods.join("threaded_stack.py"),
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n",
    )
    .expect("module");
    let mut cfg = reg_config(dir.path());
    cfg.template
        .env
        .push(("PYTHONPATH".into(), mods.clone().into_os_string()));
    cfg.preload = vec!["threaded_stack".into()];
    let reg = start(cfg, false).await;
    for name in ["a", "b", "c"] {
        let k = reg.key("o", name);
        let r = reg
            .execute(
                &k,
                "import sys\nprint('threaded_stack' in sys.modules)",
                ExecOptions::default(),
                &o(),
            )
            .await
            .expect("cell");
        assert_eq!(r.stdout, "False\n", "{name}: {r:#?}");
        let kernel = reg.kernel(&k).expect("kernel");
        assert_eq!(kernel.info().template, None, "{name} was forked");
    }
    reg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_kernels_cwd_is_the_sessions_real_workdir_and_its_files_are_served() {
    // Regression: a kernel taken from the pool reported the pool's staging
    // directory as its `cwd` (in a sandbox the kernel keeps the path it
    // was started in, and that directory was moved to the session's).
    use cellhost_sessions::SessionSpec;
    use cellhost_sessions::requests::{ListFilesRequest, ReadFileRequest, WriteFileRequest};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = reg_config(dir.path());
    cfg.template.cwd = None;
    cfg.template.sandbox.mode = cellhost_sandbox::profile::SandboxMode::Auto;
    cfg.pool_size = 1;
    cfg.session_workdirs = Some(dir.path().join("work"));
    let reg = start(cfg, false).await;
    let t0 = Instant::now();
    while reg.stats().pooled < 1 {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spec = SessionSpec {
        sandbox: Some(cellhost_sandbox::profile::SandboxMode::Auto),
        ..SessionSpec::new("o", "s")
    };
    let key = spec.key(&reg).expect("key");
    let r = reg
        .execute(
            &key,
            "open('out.txt', 'w').write('cell')",
            ExecOptions::default(),
            &o(),
        )
        .await
        .expect("cell");
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    assert_eq!(reg.stats().from_pool, 1, "the pooled kernel was not used");
    let cwd = PathBuf::from(r.cwd.clone().expect("a cwd"));
    assert_eq!(Some(cwd.clone()), reg.workdir(&key), "{r:#?}");
    assert!(cwd.starts_with(dir.path().join("work")), "{r:#?}");
    assert_eq!(
        std::fs::read_to_string(cwd.join("out.txt")).expect("in cwd"),
        "cell"
    );
    // The file the cell wrote is read at once; a written one is seen by
    // the next cell.
    let read = ReadFileRequest {
        session: spec.clone(),
        path: "out.txt".into(),
        offset: 1,
        length: Some(2),
    };
    let (f, bytes) = read.read_to_vec(&reg, 1024).await.expect("read");
    assert_eq!((f.size, bytes.as_slice()), (4, b"el".as_slice()));
    let w = WriteFileRequest {
        session: spec.clone(),
        path: "in/data.csv".into(),
        max_bytes: 1024,
    };
    let written = w.execute(&reg, b"a,b\n1,2\n".as_slice()).await.expect("write");
    assert_eq!(
        (written.path.as_str(), written.size, written.replaced),
        ("in/data.csv", 8, false)
    );
    let r = reg
        .execute(
            &key,
            "print(open('in/data.csv').read(), end='')",
            ExecOptions::default(),
            &o(),
        )
        .await
        .expect("cell");
    assert_eq!(r.stdout, "a,b\n1,2\n", "{r:#?}");
    // Over the cap: refused, and the old file is untouched.
    let too_big = WriteFileRequest { max_bytes: 4, ..w };
    let e = too_big
        .execute(&reg, b"0123456789".as_slice())
        .await
        .expect_err("cap");
    assert_eq!(e.code(), "file_too_large");
    let listed = ListFilesRequest {
        session: spec.clone(),
        path: "in".into(),
    }
    .execute(&reg)
    .await
    .expect("list");
    let names: Vec<&str> = listed.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["data.csv"],
        "no temporary file is left behind: {listed:?}"
    );
    assert_eq!(
        std::fs::read_to_string(cwd.join("in/data.csv")).expect("kept"),
        "a,b\n1,2\n"
    );
    reg.shutdown().await;
}
