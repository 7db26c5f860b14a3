//! Real kernels, real R: the R runtime's console semantics, plots, control,
//! variables, host tools and sandbox.
//!
//! The interpreter is `CELLHOST_TEST_R` or `R` on PATH (scripts/test.sh
//! installs it with apt when missing); every test is skipped, saying why,
//! where R or its `jsonlite` package is not installed.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cellhost_kernel::{CellResult, CellStatus, ExecOptions, Kernel, KernelConfig, RRuntime, Session};
use tempfile::TempDir;

/// R for the tests, or `None` (printed) when it or jsonlite is missing.
fn r() -> Option<PathBuf> {
    cellhost_testkit::r::r_interpreter(|| cellhost_kernel::resolve_r(None))
}

struct Fixture {
    session: Session,
    dir: TempDir,
    r: PathBuf,
}

fn config(r: &std::path::Path, dir: &TempDir) -> KernelConfig {
    let mut cfg = KernelConfig::new(r.to_path_buf(), dir.path().join("session"));
    cfg.runtime = Arc::new(RRuntime);
    cfg.session = "test-r".into();
    cfg.cwd = Some(dir.path().to_path_buf());
    cfg
}

fn fixture_with(edit: impl FnOnce(&mut KernelConfig)) -> Option<Fixture> {
    let r = r()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&r, &dir);
    edit(&mut cfg);
    Some(Fixture {
        session: Session::new(cfg),
        dir,
        r,
    })
}

fn fixture() -> Option<Fixture> {
    fixture_with(|_| {})
}

impl Fixture {
    async fn run(&mut self, code: &str) -> CellResult {
        self.session
            .execute(code, ExecOptions::default())
            .await
            .expect("execute")
    }
}

fn assert_ok(r: &CellResult) {
    assert_eq!(r.status, CellStatus::Ok, "cell failed: {r:#?}");
}

fn plain(r: &CellResult) -> Option<&str> {
    r.result.as_ref()?.get("text/plain")?.as_str()
}

#[tokio::test]
async fn r_values_print_as_the_console_prints_them() {
    let Some(mut f) = fixture() else { return };
    let r = f.run("x <- 5.5\nx").await;
    assert_ok(&r);
    assert_eq!(plain(&r), Some("[1] 5.5"));
    assert_eq!(r.stdout, "");
    assert!(r.kernel.pid > 0);
    // Visible values before the last are printed in order; invisible()
    // and assignments print nothing; the last is the result.
    let r = f
        .run("print('a'); x * 2\ninvisible(7)\ny <- 1\nfactor(c('lo', 'hi', 'lo'))")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "[1] \"a\"\n[1] 11\n");
    assert_eq!(plain(&r), Some("[1] lo hi lo\nLevels: hi lo"));
    let r = f.run("invisible(x)").await;
    assert_ok(&r);
    assert!(r.result.is_none(), "{:?}", r.result);
    let r = f.run("list(a = 1, b = 'two')").await;
    assert_eq!(plain(&r), Some("$a\n[1] 1\n\n$b\n[1] \"two\"\n"));
    // Data frames also come back as an HTML table (escaped).
    let r = f.run("data.frame(n = 1:2, s = c('x', '<y>'))").await;
    assert_ok(&r);
    assert_eq!(plain(&r), Some("  n   s\n1 1   x\n2 2 <y>"));
    let html = r
        .result
        .as_ref()
        .and_then(|b| b.get("text/html"))
        .and_then(|v| v.as_str());
    let html = html.expect("html table");
    assert!(
        html.starts_with("<table") && html.contains("<td>&lt;y&gt;</td>"),
        "{html}"
    );
    assert_eq!(r.execution_count, 5);
    f.session.shutdown().await;
}

#[tokio::test]
async fn r_errors_warnings_and_messages() {
    let Some(mut f) = fixture() else { return };
    let r = f
        .run("f <- function(v) stop('bad value: ', v)\ng <- function() f(3)\ncat('before\\n')\ng()\ncat('never\\n')")
        .await;
    assert_eq!(r.status, CellStatus::Error);
    assert_eq!(r.stdout, "before\n");
    let e = r.error.expect("error");
    assert_eq!(e.ename, "simpleError");
    assert_eq!(e.evalue, "bad value: 3");
    let tb = e.traceback.join("\n");
    assert!(tb.starts_with("Error in f(3) : bad value: 3"), "{tb}");
    assert!(tb.contains("1. g()") && tb.contains("2. f(3)"), "{tb}");
    assert!(tb.contains("In the cell's expression: g()"), "{tb}");
    assert!(!tb.contains("cellhost_eval"), "no worker frames: {tb}");
    // Conditions of other classes keep their class; a parse error is one.
    let r = f.run("stop(structure(class = c('myError', 'error', 'condition'), list(message = 'mine', call = NULL)))").await;
    assert_eq!(r.error.expect("error").ename, "myError");
    let r = f.run("1 +* 2").await;
    assert_eq!(r.status, CellStatus::Error);
    assert!(r.error.expect("error").evalue.contains("unexpected"));
    // Messages on stderr as they come; warnings after the cell, as the
    // console reports them.
    let r = f
        .run("message('note'); h <- function() warning('careful'); h(); warning('top'); 1")
        .await;
    assert_ok(&r);
    assert_eq!(r.stderr, "note\nWarning messages:\n1: In h() : careful\n2: top\n");
    let r = f.run("warning('once')").await;
    assert_eq!(r.stderr, "Warning message:\nonce\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn r_quit_ends_the_cell_and_stdin_fails_at_once() {
    let Some(mut f) = fixture() else { return };
    assert_ok(&f.run("kept <- 42").await);
    for code in ["q()", "quit(save = 'no')", "base::q('no')"] {
        let r = f.run(&format!("cat('a\\n'); {code}; cat('b\\n')")).await;
        assert_ok(&r);
        assert_eq!(r.stdout, "a\n", "{code}");
        assert!(
            r.stderr.contains("quit() ends the cell"),
            "{code}: {:?}",
            r.stderr
        );
    }
    let r = f.run("kept").await;
    assert_eq!(plain(&r), Some("[1] 42"));
    assert!(!r.kernel.state_reset);
    for code in ["readline('name? ')", "menu(c('a', 'b'))"] {
        let r = f.run(code).await;
        assert_eq!(r.status, CellStatus::Error, "{code}");
        assert!(r.error.expect("error").evalue.contains("no stdin"), "{code}");
    }
    let r = f.run("readLines('stdin')").await;
    assert_eq!(plain(&r), Some("character(0)"), "stdin is /dev/null");
    f.session.shutdown().await;
}

#[tokio::test]
async fn r_plots_come_back_as_png_files_one_per_page() {
    let Some(mut f) = fixture() else { return };
    let r = f.run("plot(1:10)\nhist(rnorm(50))\nx <- 1").await;
    assert_ok(&r);
    assert_eq!(r.displays.len(), 2, "{:#?}", r.displays);
    for d in &r.displays {
        let png = &d.data["image/png"];
        let path = png["path"].as_str().unwrap_or_else(|| panic!("path: {png}"));
        let bytes = std::fs::read(path).expect("figure file");
        assert!(bytes.starts_with(b"\x89PNG"));
        assert!(path.starts_with(f.dir.path().to_str().expect("utf8")));
    }
    // A user dev.off() closes one device; the next plot opens another.
    let r = f
        .run("plot(1); dev.off(); plot(2); dev.off()\nbarplot(1:3)")
        .await;
    assert_ok(&r);
    assert_eq!(r.displays.len(), 3, "{:#?}", r.displays);
    let r = f.run("x + 1").await;
    assert!(r.displays.is_empty(), "no plot is repeated");
    // grid graphics (lattice draws with grid) and ggplot2 when installed.
    let r = f.run("grid::grid.newpage(); grid::grid.rect()").await;
    assert_ok(&r);
    assert_eq!(r.displays.len(), 1);
    if cellhost_testkit::r::has_package(&f.r, "lattice") {
        let r = f.run("library(lattice)\nxyplot(1:5 ~ 1:5)").await;
        assert_ok(&r);
        assert_eq!(r.displays.len(), 1, "{r:#?}");
        assert!(r.result.is_none(), "a drawn plot is not also text");
    } else {
        eprintln!("skipped: lattice is not installed");
    }
    if cellhost_testkit::r::has_package(&f.r, "ggplot2") {
        let r = f
            .run("library(ggplot2)\nggplot(data.frame(a = 1:3, b = 3:1), aes(a, b)) + geom_point()")
            .await;
        assert_ok(&r);
        assert_eq!(r.displays.len(), 1, "{r:#?}");
    } else {
        eprintln!("skipped: ggplot2 is not installed");
    }
    f.session.shutdown().await;
}

#[tokio::test]
async fn r_interrupt_keeps_the_session() {
    let Some(mut f) = fixture() else { return };
    assert_ok(&f.run("state <- 'kept'").await);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = ExecOptions {
        live: Some(tx),
        ..Default::default()
    };
    let h = f
        .session
        .submit("cat('sleeping\\n'); Sys.sleep(60); state <- 'late'", opts)
        .await
        .expect("submit");
    let k = f.session.kernel().cloned().expect("kernel");
    // Interrupt once the cell's code is running (its first output is live).
    let ev = rx.recv().await;
    assert_eq!(ev, Some(cellhost_kernel::LiveEvent::Stdout("sleeping\n".into())));
    assert!(k.interrupt().await.delivered);
    let r = f.session.finish(h).await.expect("result");
    assert_eq!(r.status, CellStatus::Interrupted, "{r:#?}");
    let i = r.interrupt.expect("report");
    assert!(i.delivered && !i.escalated && i.state_kept, "{i:#?}");
    let r = f.run("state").await;
    assert_eq!(plain(&r), Some("[1] \"kept\""));
    assert!(!r.kernel.state_reset);
    f.session.shutdown().await;
}

#[tokio::test]
async fn r_deadline_stops_the_cell_and_keeps_the_session() {
    let Some(mut f) = fixture() else { return };
    assert_ok(&f.run("n <- 1").await);
    let opts = ExecOptions {
        timeout: Some(Duration::from_millis(500)),
        ..Default::default()
    };
    let r = f
        .session
        .execute("repeat { n <- n + 1 }", opts)
        .await
        .expect("execute");
    assert_eq!(r.status, CellStatus::Timeout);
    assert!(r.interrupt.expect("report").state_kept);
    let r = f.run("n > 1").await;
    assert_eq!(plain(&r), Some("[1] TRUE"));
    f.session.shutdown().await;
}

#[tokio::test]
async fn r_crash_is_detected_and_the_next_cell_says_state_reset() {
    let Some(mut f) = fixture() else { return };
    assert_ok(&f.run("lost <- 1").await);
    let r = f.run("system(sprintf('kill -9 %d', Sys.getpid()))").await;
    assert_eq!(r.status, CellStatus::Crashed, "{r:#?}");
    assert_eq!(r.crash.expect("crash").signal_name.as_deref(), Some("SIGKILL"));
    let r = f.run("exists('lost')").await;
    assert_eq!(plain(&r), Some("[1] FALSE"));
    assert!(r.kernel.state_reset);
    f.session.shutdown().await;
}

#[tokio::test]
async fn r_children_are_captured_and_killed_with_the_tree() {
    let Some(mut f) = fixture() else { return };
    let r = f
        .run("system('echo from-system'); system2('sh', c('-c', shQuote('echo from-system2 >&2'))); cat('after\\n')")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "from-system\nafter\n");
    assert_eq!(r.stderr, "from-system2\n");
    let r = f.run("system('sleep 300 &')").await;
    assert_ok(&r);
    let k = f.session.kernel().cloned().expect("kernel");
    let init = i32::try_from(k.info().init_pid).expect("pid");
    let sleeps: Vec<i32> = cellhost_sandbox::procfs::descendants(init)
        .iter()
        .map(|p| p.pid)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\x00300"))
        })
        .collect();
    assert_eq!(sleeps.len(), 1, "the background sleep runs under the kernel");
    f.session.shutdown().await;
    let path = format!("/proc/{}", sleeps[0]);
    assert!(
        !std::path::Path::new(&path).exists(),
        "the sleep was killed with the tree"
    );
}

#[tokio::test]
async fn r_variables_are_described_without_printing() {
    let Some(mut f) = fixture() else { return };
    let setup = "print.evil <- function(x, ...) stop('print was called')\n\
                 e <- structure(list(1), class = 'evil')\nn <- 42\ns <- 'hello'\nv <- 1:10\n\
                 m <- matrix(0, 3, 4)\ndf <- data.frame(a = 1:2, b = c('x', 'y'))\n.hidden <- 1";
    assert_ok(&f.run(setup).await);
    let vars = f.session.inspect_variables(None, 100).await.expect("vars");
    let by_name = |n: &str| {
        vars.variables
            .iter()
            .find(|v| v["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(by_name("n")["type"], "numeric");
    assert_eq!(by_name("n")["preview"], "42");
    assert_eq!(by_name("s")["preview"], "\"hello\"");
    assert_eq!(by_name("v")["len"], 10);
    assert_eq!(by_name("m")["shape"], serde_json::json!([3, 4]));
    assert_eq!(by_name("df")["type"], "data.frame");
    assert_eq!(by_name("df")["shape"], serde_json::json!([2, 2]));
    assert_eq!(by_name("df")["columns"], serde_json::json!(["a", "b"]));
    assert_eq!(by_name("e")["type"], "evil");
    assert!(by_name(".hidden").is_null());
    let few = f.session.inspect_variables(None, 2).await.expect("vars");
    assert_eq!(few.variables.len(), 2);
    assert!(few.truncated);
    f.session.shutdown().await;
}

struct EchoTools;

impl cellhost_kernel::ToolHost for EchoTools {
    fn names(&self) -> Vec<String> {
        vec!["echo".into(), "fail".into()]
    }

    fn call(&self, call: cellhost_kernel::ToolCall) -> cellhost_kernel::ToolFuture {
        Box::pin(async move {
            match call.name.as_str() {
                "echo" => Ok(serde_json::json!({"args": call.args})),
                _ => Err("the tool failed on purpose".into()),
            }
        })
    }
}

#[tokio::test]
async fn r_host_tools_are_called_through_cellhost_tools() {
    let Some(mut f) = fixture_with(|cfg| {
        cfg.tool_host = Some(Arc::new(EchoTools));
        cfg.tool_budget = 5;
    }) else {
        return;
    };
    let r = f
        .run("r <- cellhost::tools$echo(x = 1, y = 'two')\nr$args$y")
        .await;
    assert_ok(&r);
    assert_eq!(plain(&r), Some("[1] \"two\""));
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].outcome, "ok");
    let r = f.run("sort(ls(cellhost::tools))").await;
    assert_eq!(plain(&r), Some("[1] \"echo\" \"fail\""));
    let r = f.run("cellhost::call('fail', list())").await;
    let e = r.error.expect("error");
    assert_eq!(e.ename, "cellhost_tool_error");
    assert_eq!(e.evalue, "the tool failed on purpose");
    let r = f.run("cellhost::call('nope', list())").await;
    assert!(r.error.expect("error").evalue.contains("not enabled"));
    f.session.shutdown().await;
}

#[tokio::test]
async fn r_sandboxed_kernel_runs_and_cannot_write_outside() {
    let Some(rpath) = r() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&rpath, &dir);
    cfg.sandbox = cellhost_sandbox::profile::SandboxProfile::default();
    let k = Kernel::spawn(cfg).await.expect("sandboxed R kernel");
    let r = k
        .execute("writeLines('ok', 'here.txt'); sum(1:10)", ExecOptions::default())
        .await
        .expect("execute");
    assert_ok(&r);
    assert_eq!(plain(&r), Some("[1] 55"));
    assert!(dir.path().join("here.txt").is_file());
    let landlock = k.info().sandbox.layer("landlock").is_some_and(|l| l.enforced);
    if landlock {
        let r = k
            .execute(
                "writeLines('x', '/usr/cellhost-r-escape')",
                ExecOptions::default(),
            )
            .await
            .expect("execute");
        assert_eq!(r.status, CellStatus::Error, "{r:#?}");
        assert!(!std::path::Path::new("/usr/cellhost-r-escape").exists());
    } else {
        eprintln!("skipped: landlock is not enforced here");
    }
    k.kill().await;
}

#[tokio::test]
async fn r_irdisplay_bundles_and_cellhost_display_become_displays() {
    let Some(mut f) = fixture() else { return };
    let r = f
        .run("getOption('jupyter.base_display_func')(list('text/html' = '<b>x</b>', 'text/plain' = 'x'))\ncellhost::display(1:3)\ninvisible()")
        .await;
    assert_ok(&r);
    assert_eq!(r.displays.len(), 2, "{:#?}", r.displays);
    assert_eq!(r.displays[0].data["text/html"], "<b>x</b>");
    assert_eq!(r.displays[1].data["text/plain"], "[1] 1 2 3");
    f.session.shutdown().await;
}

/// An interrupt right after the submit reaches the host before the
/// worker's `started` (the R worker reads control frames only between
/// cells): it still stops the cell with the session kept, never escalates.
#[tokio::test]
async fn r_interrupt_before_started_keeps_the_session() {
    let Some(mut f) = fixture() else { return };
    let first = f.run("state <- 'kept'").await;
    assert_ok(&first);
    for round in 0..5 {
        let h = f
            .session
            .submit("Sys.sleep(60); state <- 'late'", ExecOptions::default())
            .await
            .expect("submit");
        let k = f.session.kernel().cloned().expect("kernel");
        let out = k.interrupt().await;
        assert!(out.delivered, "round {round}: {out:?}");
        let r = f.session.finish(h).await.expect("result");
        assert_eq!(r.status, CellStatus::Interrupted, "round {round}: {r:#?}");
        let i = r.interrupt.expect("report");
        assert!(
            !i.escalated && i.state_kept,
            "round {round}: an interrupt before `started` escalated: {i:#?}"
        );
    }
    let r = f.run("state").await;
    assert_eq!(plain(&r), Some("[1] \"kept\""));
    assert_eq!(r.kernel.pid, first.kernel.pid, "the same process");
    assert!(!r.kernel.state_reset);
    f.session.shutdown().await;
}

/// A cell that catches the interrupt and goes on is killed with its tree
/// after the grace; the report says so and the next cell says
/// `state_reset`.
#[tokio::test]
async fn r_interrupt_the_cell_swallows_escalates_after_the_grace() {
    let Some(mut f) = fixture_with(|cfg| cfg.interrupt_grace = Duration::from_millis(300)) else {
        return;
    };
    assert_ok(&f.run("lost <- 1").await);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = ExecOptions {
        live: Some(tx),
        ..Default::default()
    };
    let h = f
        .session
        .submit(
            // `go` is printed once the cell's own handler is in place.
            "repeat tryCatch({ cat('go\\n'); Sys.sleep(60) }, interrupt = function(i) cat('caught\\n'))",
            opts,
        )
        .await
        .expect("submit");
    let k = f.session.kernel().cloned().expect("kernel");
    let ev = rx.recv().await;
    assert_eq!(ev, Some(cellhost_kernel::LiveEvent::Stdout("go\n".into())));
    assert!(k.interrupt().await.delivered);
    let r = f.session.finish(h).await.expect("result");
    assert_eq!(r.status, CellStatus::Interrupted, "{r:#?}");
    assert!(r.stdout.contains("caught"), "{:?}", r.stdout);
    let i = r.interrupt.expect("report");
    assert!(i.delivered && i.escalated && !i.state_kept, "{i:#?}");
    assert!(i.reason.is_some(), "{i:#?}");
    let r = f.run("exists('lost')").await;
    assert_eq!(plain(&r), Some("[1] FALSE"));
    assert!(r.kernel.state_reset);
    f.session.shutdown().await;
}

/// A package's native code that ignores SIGINT: the worker puts R's
/// handler back before the next cell, so a cell waiting in R (`Sys.sleep`)
/// or computing in R is interrupted with the session kept. Only a cell
/// that replaces the handler itself and then computes cannot be stopped
/// by R: it is killed with its tree after the grace and the next cell says
/// `state_reset`. (Unsandboxed: the worker builds its native part itself;
/// sandboxed forks are checked in r_template.rs.)
#[tokio::test]
async fn r_a_package_that_ignores_sigint_is_rearmed_before_the_next_cell() {
    let Some(mut f) = fixture_with(|cfg| {
        cfg.interrupt_grace = Duration::from_millis(300);
        cfg.sandbox = cellhost_sandbox::profile::SandboxProfile::off();
    }) else {
        return;
    };
    let Some(lib) = common::sigint_library(f.dir.path()) else {
        return;
    };
    let code = format!(
        "dyn.load('{}'); invisible(.C('ignore_sigint')); state <- 'kept'",
        lib.display()
    );
    assert_ok(&f.run(&code).await);
    for (code, kept) in [
        ("cat('go\\n'); Sys.sleep(60)", true),
        (
            "cat('go\\n'); repeat { state <- paste0(substr(state, 1, 4)) }",
            true,
        ),
        (
            "invisible(.C('ignore_sigint')); cat('go\\n'); repeat { state <- paste0(substr(state, 1, 4)) }",
            false,
        ),
    ] {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let opts = ExecOptions {
            live: Some(tx),
            ..Default::default()
        };
        let h = f.session.submit(code, opts).await.expect("submit");
        let k = f.session.kernel().cloned().expect("kernel");
        assert_eq!(
            rx.recv().await,
            Some(cellhost_kernel::LiveEvent::Stdout("go\n".into()))
        );
        assert!(k.interrupt().await.delivered);
        let r = f.session.finish(h).await.expect("result");
        assert_eq!(r.status, CellStatus::Interrupted, "{code}: {r:#?}");
        let i = r.interrupt.expect("report");
        assert_eq!(i.state_kept, kept, "{code}: {i:#?}");
        assert_eq!(i.escalated, !kept, "{code}: {i:#?}");
        if kept {
            assert_eq!(plain(&f.run("state").await), Some("[1] \"kept\""));
        }
    }
    let r = f.run("exists('state')").await;
    assert_eq!(plain(&r), Some("[1] FALSE"));
    assert!(r.kernel.state_reset);
    f.session.shutdown().await;
}

/// A segfault in R's own C code (bytecode reading past its constant pool
/// through `.Internal`) is a crash with the signal; the next cell runs in a
/// new process and says `state_reset`.
#[tokio::test]
async fn r_internal_segfault_is_a_crash_and_the_next_cell_says_state_reset() {
    let Some(mut f) = fixture() else { return };
    assert_ok(&f.run("lost <- 1").await);
    let r = f
        .run("eval(.Internal(mkCode(c(12L, 16L, 99999999L, 1L), list(1))))")
        .await;
    assert_eq!(r.status, CellStatus::Crashed, "{r:#?}");
    let crash = r.crash.expect("crash");
    assert_eq!(crash.signal_name.as_deref(), Some("SIGSEGV"), "{crash:#?}");
    assert!(r.stderr.contains("caught segfault"), "{:?}", r.stderr);
    let r = f.run("exists('lost')").await;
    assert_eq!(plain(&r), Some("[1] FALSE"));
    assert!(r.kernel.state_reset);
    f.session.shutdown().await;
}

/// `system()` and `system2()` children left running in the background
/// are killed with the tree when an interrupt escalates.
#[tokio::test]
async fn r_system_children_die_with_an_escalated_interrupt() {
    let Some(mut f) = fixture_with(|cfg| cfg.interrupt_grace = Duration::from_millis(300)) else {
        return;
    };
    assert_ok(
        &f.run("system('sleep 301 &'); system2('sh', c('-c', shQuote('sleep 302 &')))")
            .await,
    );
    let k = f.session.kernel().cloned().expect("kernel");
    let init = i32::try_from(k.info().init_pid).expect("pid");
    // A backgrounded child may not have exec'd `sleep` yet when `system`
    // returns: poll until both are there (at most 30 s).
    let find = || -> Vec<i32> {
        cellhost_sandbox::procfs::descendants(init)
            .iter()
            .map(|p| p.pid)
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\x0030"))
            })
            .collect()
    };
    let mut sleeps = find();
    for _ in 0..3000 {
        if sleeps.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        sleeps = find();
    }
    assert_eq!(sleeps.len(), 2, "both sleeps run under the kernel");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = ExecOptions {
        live: Some(tx),
        ..Default::default()
    };
    let h = f
        .session
        .submit(
            "repeat tryCatch({ cat('go\\n'); Sys.sleep(60) }, interrupt = function(i) NULL)",
            opts,
        )
        .await
        .expect("submit");
    assert_eq!(
        rx.recv().await,
        Some(cellhost_kernel::LiveEvent::Stdout("go\n".into()))
    );
    assert!(k.interrupt().await.delivered);
    let r = f.session.finish(h).await.expect("result");
    assert!(r.interrupt.as_ref().is_some_and(|i| i.escalated), "{r:#?}");
    for pid in sleeps {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "sleep {pid} outlived the escalation"
        );
    }
    f.session.shutdown().await;
}

/// Registered secrets are masked in what an R cell prints, warns and
/// raises.
#[tokio::test]
async fn r_secrets_are_redacted_from_output_and_errors() {
    const SECRET: &str = "sk-demo-3f9a1c7e5b2d4a6f8e0c";
    let Some(mut f) = fixture_with(|cfg| {
        cfg.env.push(("DEMO_TOKEN".into(), SECRET.into()));
        cfg.register_secret(SECRET);
    }) else {
        return;
    };
    let r = f
        .run("s <- Sys.getenv('DEMO_TOKEN')\ncat('DEMO_TOKEN=', s, '\\n', sep = '')\nmessage(s)\nprint(list(token = s))\nstop('bad token ', s)")
        .await;
    assert_eq!(r.status, CellStatus::Error);
    let json = serde_json::to_string(&r).expect("json");
    assert!(!json.contains(SECRET), "secret leaked: {json}");
    assert!(
        r.stdout.contains("DEMO_TOKEN=") && r.stdout.matches("[redacted]").count() >= 2,
        "{:?}",
        r.stdout
    );
    assert!(r.stderr.contains("[redacted]"), "{:?}", r.stderr);
    let e = r.error.expect("error");
    assert!(e.evalue.contains("[redacted]"), "{}", e.evalue);
    f.session.shutdown().await;
}

/// Output beyond the inline cap is cut with a note and spilled to a file
/// whole.
#[tokio::test]
async fn r_large_output_is_bounded_and_spilled() {
    let Some(mut f) = fixture() else { return };
    let r = f.run("cat(strrep('x', 2e6)); invisible(NULL)").await;
    assert_ok(&r);
    let t = r.truncated.get("stdout").expect("stdout truncated");
    assert_eq!(t.total_bytes, 2_000_000);
    assert_eq!(t.shown_bytes + t.omitted_bytes, t.total_bytes);
    assert!(
        r.stdout.len() < 100_000,
        "inline stays at the cap: {}",
        r.stdout.len()
    );
    let spill = t.spill_path.clone().expect("spill file");
    assert_eq!(std::fs::metadata(&spill).expect("spill").len(), 2_000_000);
    let r = f.run("1 + 1").await;
    assert_eq!(plain(&r), Some("[1] 2"));
    f.session.shutdown().await;
}
