//! The request layer against a real registry: the busy rule (refused with
//! `session_busy` unless queued; a queued cell's `duration_ms` is its own
//! run, `queued_ms` its wait, and its journal row records the run),
//! deadlines, owners of different surfaces, and codes of errors.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_kernel::{CellStatus, KernelConfig};
use cellhost_sessions::requests::{
    CwdScope, ExecuteRequest, HistoryRequest, InterruptRequest, KillRequest, ListRequest, VariablesRequest,
};
use cellhost_sessions::{
    Deadline, Durability, Journal, Origin, Registry, RegistryConfig, SessionSpec, Surface,
};

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

async fn start(dir: &Path, cell_timeout: Option<Duration>) -> Arc<Registry> {
    let mut t = KernelConfig::new(python(), dir.join("unused"));
    t.cwd = Some(dir.to_path_buf());
    t.cell_timeout = cell_timeout;
    let mut c = RegistryConfig::new(dir.join("state"), t);
    c.pool_size = 0;
    let j = Arc::new(Journal::open(dir.join("state/journal.sqlite3"), Durability::Normal).expect("journal"));
    Registry::start(c, Some(j)).await.expect("registry")
}

/// Shuts the registry down when the test ends, passed or failed.
struct Shutdown(Arc<Registry>);

impl Drop for Shutdown {
    fn drop(&mut self) {
        let reg = self.0.clone();
        // The test's runtime may be unwinding: shut down on a thread of
        // our own runtime.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                rt.block_on(reg.shutdown());
            }
        })
        .join();
    }
}

fn exec(owner: &str, session: &str, code: &str) -> ExecuteRequest {
    ExecuteRequest::new(SessionSpec::new(owner, session), code, Origin::new("test"))
}

async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let t0 = Instant::now();
    while !f().await {
        assert!(t0.elapsed() < Duration::from_secs(30), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn busy_session_refuses_a_second_execute_unless_queued_and_a_queued_cell_counts_its_own_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(dir.path(), None).await;
    let _guard = Shutdown(reg.clone());
    let owner = Surface::Library.owner("t");
    let go = dir.path().join("go");
    let first = {
        let reg = reg.clone();
        let code = format!(
            "import os, time\nwhile not os.path.exists({:?}): time.sleep(0.02)\n'first'",
            go.display().to_string()
        );
        let req = exec(&owner, "s", &code);
        tokio::spawn(async move { req.execute(&reg).await })
    };
    let key = SessionSpec::new(owner.as_str(), "s").key(&reg).expect("key");
    until("the first cell runs", async || {
        reg.kernel(&key).is_some_and(|k| k.is_busy())
    })
    .await;

    // Not queued: refused at once, with the session and the running cell.
    let e = exec(&owner, "s", "1 + 1").execute(&reg).await.expect_err("busy");
    assert_eq!(e.code(), "session_busy", "{e}");
    let v = e.to_json();
    assert_eq!(v["session"], "s");
    assert!(v["cell"].as_str().is_some_and(|c| !c.is_empty()), "{v}");

    // Queued: waits behind the first cell.
    let queued = {
        let reg = reg.clone();
        let mut req = exec(&owner, "s", "2 + 2");
        req.queue = true;
        tokio::spawn(async move { req.execute(&reg).await })
    };
    let j = reg.journal().expect("journal").clone();
    until("the queued cell is submitted", async || {
        j.history(&owner, "s").await.map(|c| c.len()).unwrap_or(0) >= 2
    })
    .await;
    std::fs::write(&go, "").expect("go");
    let a = first.await.expect("join").expect("first").result;
    let b = queued.await.expect("join").expect("queued").result;
    assert_eq!(a.status, CellStatus::Ok);
    assert_eq!(b.status, CellStatus::Ok);
    assert_eq!(
        b.result.as_ref().and_then(|r| r["text/plain"].as_str()),
        Some("4")
    );
    assert!(b.queued_ms > 0, "a queued cell says how long it waited: {b:?}");
    // The refused cell was never journaled; the journal row of the queued
    // one records its run (started after the first ended), not its wait.
    let rows = j.history(&owner, "s").await.expect("history");
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (ra, rb) = (&rows[0], &rows[1]);
    assert_eq!(rb.id, b.cell_id);
    assert_eq!(rb.duration_ms, Some(b.duration_ms as i64));
    assert!(
        rb.started_ms >= ra.ended_ms.expect("ended"),
        "the queued cell's row starts when it ran: {ra:?} {rb:?}"
    );
    // The host stays healthy: the session takes the next cell.
    let c = exec(&owner, "s", "3")
        .execute(&reg)
        .await
        .expect("later cell")
        .result;
    assert_eq!(c.status, CellStatus::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_deadline_is_the_registry_s_and_zero_means_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(dir.path(), Some(Duration::from_millis(500))).await;
    let _guard = Shutdown(reg.clone());
    let owner = Surface::Library.owner("t");
    let r = exec(&owner, "d", "import time; time.sleep(30)")
        .execute(&reg)
        .await
        .expect("cell")
        .result;
    assert_eq!(r.status, CellStatus::Timeout, "the configured default applies");
    let mut req = exec(&owner, "d", "import time; time.sleep(1); 'slept'");
    req.deadline = Deadline::None;
    let r = req.execute(&reg).await.expect("cell").result;
    assert_eq!(r.status, CellStatus::Ok, "Deadline::None is no deadline: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_of_two_surfaces_never_share_a_session_or_its_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(dir.path(), None).await;
    let _guard = Shutdown(reg.clone());
    let (cli, http) = (Surface::Cli.owner("local"), Surface::Http.owner("local"));
    exec(&cli, "same", "x = 'cli'")
        .execute(&reg)
        .await
        .expect("cli cell");
    let r = exec(&http, "same", "globals().get('x')")
        .execute(&reg)
        .await
        .expect("http cell")
        .result;
    assert_eq!(
        r.result, None,
        "the http owner's session is its own namespace: {r:?}"
    );
    assert_eq!(r.kernel.generation, 1);
    let h = HistoryRequest {
        owner: cli.clone(),
        session: "same".into(),
    }
    .execute(&reg)
    .await
    .expect("history");
    assert_eq!(h.cells.len(), 1, "{:?}", h.cells);
    assert_eq!(ListRequest { owner: cli.clone() }.execute(&reg).len(), 1);
    // Interrupt, kill and variables of one owner never reach the other's.
    let k = KillRequest {
        owner: cli.clone(),
        session: "same".into(),
        cwd: CwdScope::Any,
    };
    assert_eq!(k.execute(&reg).await.expect("kill").killed, 1);
    let e = k.execute(&reg).await.expect_err("gone");
    assert_eq!(e.code(), "session_not_found");
    let e = InterruptRequest {
        owner: cli,
        session: "same".into(),
        cwd: CwdScope::Any,
    }
    .execute(&reg)
    .await
    .expect_err("gone");
    assert_eq!(e.code(), "session_not_found");
    let v = VariablesRequest {
        session: SessionSpec::new(http.as_str(), "same"),
        limit: 10,
    }
    .execute(&reg)
    .await
    .expect("the http session lives on");
    assert!(v.variables.iter().all(|v| v["name"] != "x"), "{v:?}");
    let e = VariablesRequest {
        session: SessionSpec::new(http.as_str(), "same"),
        limit: 0,
    }
    .execute(&reg)
    .await
    .expect_err("bad limit");
    assert_eq!(e.code(), "bad_request");
}

/// Regression: Ctrl-C of `cellhost run` between two cells set the stop flag
/// and interrupted no cell (none was running yet); the next cell then ran
/// its full course. A cell submitted with its stop flag already set is
/// interrupted at once, and the state survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cell_submitted_after_its_stop_flag_was_set_is_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(dir.path(), None).await;
    let _guard = Shutdown(reg.clone());
    let owner = Surface::Library.owner("t");
    let r = exec(&owner, "s", "x = 41").execute(&reg).await.expect("first");
    assert_eq!(r.result.status, CellStatus::Ok);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut req = exec(&owner, "s", "import time\ntime.sleep(600)");
    req.cancel = Some(stop);
    let r = req.execute(&reg).await.expect("stopped cell");
    assert_eq!(r.result.status, CellStatus::Interrupted, "{:#?}", r.result);
    let r = exec(&owner, "s", "x + 1").execute(&reg).await.expect("after");
    assert_eq!(
        r.result
            .result
            .as_ref()
            .and_then(|b| b.get("text/plain"))
            .and_then(|v| v.as_str()),
        Some("42")
    );
}

/// A session keeps the language it was created with: an execute naming
/// another is `bad_request`, one naming none runs in the session's
/// language, and an unknown language is `bad_request`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_keeps_its_language_and_a_mismatch_is_a_clear_error() {
    if cellhost_kernel::resolve_r(None).is_err() {
        eprintln!("skipped: R is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = start(dir.path(), None).await;
    let _guard = Shutdown(reg.clone());
    let owner = Surface::Library.owner("t");
    let in_lang = |session: &str, language: Option<&str>, code: &str| {
        let spec = SessionSpec {
            language: language.map(str::to_string),
            ..SessionSpec::new(owner.as_str(), session)
        };
        ExecuteRequest::new(spec, code, Origin::new("test"))
    };
    let r = in_lang("s", Some("r"), "x <- 41; x + 1")
        .execute(&reg)
        .await
        .expect("R cell");
    assert_eq!(r.result.status, CellStatus::Ok, "{:#?}", r.result);
    let plain = |r: &cellhost_sessions::requests::Executed| {
        r.result
            .result
            .as_ref()
            .and_then(|b| b["text/plain"].as_str())
            .map(str::to_string)
    };
    assert_eq!(plain(&r).as_deref(), Some("[1] 42"));
    let r = in_lang("s", None, "x").execute(&reg).await.expect("same session");
    assert_eq!(plain(&r).as_deref(), Some("[1] 41"));
    let e = in_lang("s", Some("python"), "print(1)")
        .execute(&reg)
        .await
        .expect_err("mismatch");
    assert_eq!(e.code(), "bad_request");
    assert!(e.to_string().contains("keeps the language"), "{e}");
    let e = in_lang("t", Some("cobol"), "x")
        .execute(&reg)
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), "bad_request");
    // Python sessions beside it are unaffected.
    let r = in_lang("p", None, "40 + 2")
        .execute(&reg)
        .await
        .expect("python cell");
    assert_eq!(plain(&r).as_deref(), Some("42"));
}

/// R for the tests (`CELLHOST_TEST_R` or `R` on PATH), `None` (printed)
/// without one.
fn r_interpreter() -> Option<PathBuf> {
    cellhost_testkit::r::r_interpreter(|| cellhost_kernel::resolve_r(None))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_and_history_keep_an_r_sessions_language() {
    let Some(r) = r_interpreter() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let start_r = |dir: PathBuf| {
        let r = r.clone();
        async move {
            let mut t = KernelConfig::new(python(), dir.join("unused"));
            t.cwd = Some(dir.clone());
            let mut c = RegistryConfig::new(dir.join("state"), t);
            c.pool_size = 0;
            c.interpreters.insert("r".into(), r);
            let j = Arc::new(
                Journal::open(dir.join("state/journal.sqlite3"), Durability::Normal).expect("journal"),
            );
            Registry::start(c, Some(j)).await.expect("registry")
        }
    };
    let reg = start_r(dir.path().to_path_buf()).await;
    let guard = Shutdown(reg.clone());
    let mut spec = SessionSpec::new("o", "rs");
    spec.language = Some("r".into());
    for code in ["x <- 20", "stop('no')", "y <- x + 1"] {
        ExecuteRequest::new(spec.clone(), code, Origin::new("test"))
            .execute(&reg)
            .await
            .expect("R cell");
    }
    reg.shutdown().await;
    drop(guard);
    drop(reg);

    // A new host: history says R, and restore (naming no language)
    // replays the cells in R, not in the host's default Python.
    let reg = start_r(dir.path().to_path_buf()).await;
    let _guard = Shutdown(reg.clone());
    let h = HistoryRequest {
        owner: "o".into(),
        session: "rs".into(),
    }
    .execute(&reg)
    .await
    .expect("history");
    assert_eq!(h.language.as_deref(), Some("r"));
    assert_eq!(h.cells.len(), 3);
    let rep = cellhost_sessions::requests::RestoreRequest {
        into: SessionSpec::new("o", "rs"),
        from: None,
        force: false,
    }
    .execute(&reg)
    .await
    .expect("restore");
    assert_eq!(rep.replayed.len(), 2, "{rep:?}");
    assert_eq!(rep.skipped.len(), 1, "{rep:?}");
    let r = exec("o", "rs", "x + y")
        .execute(&reg)
        .await
        .expect("after restore")
        .result;
    assert_eq!(
        r.result
            .as_ref()
            .and_then(|b| b.get("text/plain"))
            .and_then(|v| v.as_str()),
        Some("[1] 41"),
        "{r:?}"
    );
    let reader =
        cellhost_sessions::JournalReader::open(&dir.path().join("state/journal.sqlite3")).expect("reader");
    assert_eq!(
        reader.session_language("o", "rs").expect("language").as_deref(),
        Some("r")
    );
}

/// A registry whose default language is R (`cellhost serve --language r`)
/// keeps a warm pool of R kernels: a new session's first cell runs in a
/// pooled kernel, not a cold one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_r_registry_hands_out_pooled_r_kernels() {
    let Some(r) = r_interpreter() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut t = KernelConfig::new(r, dir.path().join("unused"));
    t.runtime = Arc::new(cellhost_kernel::RRuntime);
    t.cwd = Some(dir.path().to_path_buf());
    let mut c = RegistryConfig::new(dir.path().join("state"), t);
    c.pool_size = 1;
    let reg = Registry::start(c, None).await.expect("registry");
    let _guard = Shutdown(reg.clone());
    until("the pool holds an R kernel", async || reg.stats().pooled >= 1).await;
    let x = exec("o", "pooled-r", "R.version$language")
        .execute(&reg)
        .await
        .expect("cell")
        .result;
    assert_eq!(
        x.result
            .as_ref()
            .and_then(|b| b.get("text/plain"))
            .and_then(|v| v.as_str()),
        Some("[1] \"R\""),
        "{x:?}"
    );
    assert_eq!(reg.stats().from_pool, 1, "{:?}", reg.stats());
    assert_eq!(reg.stats().spawned, 0);
}
