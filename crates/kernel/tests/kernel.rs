//! Real kernels, real Python: the kernel-core and kernel-control behaviour,
//! including the cases from `shared/cases/kernel-cases.jsonl` (named after
//! their ids).
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` (scripts/test.sh sets it to the
//! project venv) or `python3` on PATH.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellhost_kernel::{
    CellResult, CellStatus, ExecOptions, Kernel, KernelConfig, KernelError, LiveEvent, Session,
};
use tempfile::TempDir;

mod common;

#[path = "kernel_tests/bulk_output.rs"]
mod bulk_output;
#[path = "kernel_tests/hostile_code.rs"]
mod hostile_code;
#[path = "kernel_tests/output_ring.rs"]
mod output_ring;
#[path = "kernel_tests/results_bounds.rs"]
mod results_bounds;
#[path = "kernel_tests/worker_imports.rs"]
mod worker_imports;

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

fn has_module(name: &str) -> bool {
    std::process::Command::new(python())
        .args(["-c", &format!("import {name}")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `name` cannot be imported by the test interpreter; says the test is
/// skipped.
fn missing_module(name: &str) -> bool {
    let missing = !has_module(name);
    if missing {
        eprintln!("skipped: {name} is not installed in {}", python().display());
    }
    missing
}

struct Fixture {
    session: Session,
    dir: TempDir,
}

fn config(dir: &TempDir) -> KernelConfig {
    let mut cfg = KernelConfig::new(python(), dir.path().join("session"));
    cfg.session = "test".into();
    cfg.cwd = Some(dir.path().to_path_buf());
    cfg
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    Fixture {
        session: Session::new(config(&dir)),
        dir,
    }
}

impl Fixture {
    async fn run(&mut self, code: &str) -> CellResult {
        self.session
            .execute(code, ExecOptions::default())
            .await
            .expect("execute")
    }

    async fn run_with_timeout(&mut self, code: &str, secs: f64) -> CellResult {
        let opts = ExecOptions {
            timeout: Some(Duration::from_secs_f64(secs)),
            ..Default::default()
        };
        self.session.execute(code, opts).await.expect("execute")
    }
}

/// Pids of every descendant of `init`.
fn tree_of(init: i32) -> Vec<i32> {
    cellhost_sandbox::procfs::descendants(init)
        .iter()
        .map(|p| p.pid)
        .collect()
}

fn assert_ok(r: &CellResult) {
    assert_eq!(r.status, CellStatus::Ok, "cell failed: {r:#?}");
}

// ---------------------------------------------------------------- semantics

#[tokio::test]
async fn namespace_persists_and_last_expression_is_the_result() {
    let mut f = fixture();
    let r = f.run("x = 40").await;
    assert_ok(&r);
    assert!(r.result.is_none());
    let r = f.run("x += 2\nx").await;
    assert_ok(&r);
    assert_eq!(
        r.result
            .as_ref()
            .and_then(|b| b.get("text/plain"))
            .and_then(|v| v.as_str()),
        Some("42")
    );
    assert_eq!(r.execution_count, 2);
    let r = f.run("x;").await;
    assert!(r.result.is_none(), "a trailing semicolon hides the value");
    assert!(r.kernel.reused);
    f.session.shutdown().await;
}

#[tokio::test]
async fn rich_reprs_become_mime_types() {
    let mut f = fixture();
    let r = f
        .run("class R:\n    def _repr_html_(self): return '<b>hi</b>'\n    def _repr_markdown_(self): return '**hi**'\n    def __repr__(self): return 'R()'\nR()")
        .await;
    assert_ok(&r);
    let b = r.result.expect("result");
    assert_eq!(b["text/plain"], "R()");
    assert_eq!(b["text/html"], "<b>hi</b>");
    assert_eq!(b["text/markdown"], "**hi**");
    let r = f.run("display('shown'); display({'a': 1})\n'last'").await;
    assert_eq!(r.displays.len(), 2);
    assert_eq!(r.displays[0].data["text/plain"], "'shown'");
    f.session.shutdown().await;
}

#[tokio::test]
async fn top_level_await_and_asyncio_run_both_work() {
    let mut f = fixture();
    let r = f
        .run("import asyncio\nawait asyncio.sleep(0.01)\nv = await asyncio.sleep(0, result=5)\nv")
        .await;
    assert_ok(&r);
    assert_eq!(r.result.expect("value")["text/plain"], "5");
    let r = f.run("async def g(): return 7\nasyncio.run(g())").await;
    assert_ok(&r);
    assert_eq!(r.result.expect("value")["text/plain"], "7");
    f.session.shutdown().await;
}

#[tokio::test]
async fn exceptions_have_no_worker_frames_and_show_cell_source() {
    let mut f = fixture();
    let r = f.run("def boom():\n    return 1 / 0\nboom()").await;
    assert_eq!(r.status, CellStatus::Error);
    let e = r.error.expect("error");
    assert_eq!(e.ename, "ZeroDivisionError");
    assert_eq!(e.evalue, "division by zero");
    let tb = e.traceback.join("\n");
    assert!(tb.contains("return 1 / 0"), "{tb}");
    assert!(!tb.contains("cellhost_worker"), "{tb}");
    let r = f.run("def a(n): return b(n)\ndef b(n): return a(n)\na(1)").await;
    let e = r.error.expect("recursion");
    assert_eq!(e.ename, "RecursionError");
    let size: usize = e.traceback.iter().map(String::len).sum();
    assert!(size < 8192, "collapsed traceback stays small: {size} bytes");
    assert!(e.traceback.iter().any(|l| l.contains("repeated")));
    f.session.shutdown().await;
}

#[tokio::test]
async fn syntax_error_is_a_cell_error() {
    let mut f = fixture();
    let r = f.run("def (:").await;
    assert_eq!(r.status, CellStatus::Error);
    assert_eq!(r.error.expect("error").ename, "SyntaxError");
    assert_ok(&f.run("print('fine')").await);
    f.session.shutdown().await;
}

#[tokio::test]
async fn fd_level_capture_keeps_order_per_stream() {
    let mut f = fixture();
    let r = f
        .run("import os, sys, ctypes\nprint('a')\nos.write(1, b'b\\n')\nsys.stdout.write('c\\n')\nctypes.CDLL(None).printf(b'd\\n')\nos.system('echo e')\nprint('f', file=sys.stderr)")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "a\nb\nc\nd\ne\n");
    assert_eq!(r.stderr, "f\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn live_output_streams_while_the_cell_runs() {
    let mut f = fixture();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let h = f
        .session
        .submit(
            "import time\nprint('first', flush=True)\ntime.sleep(30)",
            ExecOptions {
                live: Some(tx),
                ..Default::default()
            },
        )
        .await
        .expect("submit");
    let ev = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("live event in time");
    assert_eq!(ev, Some(LiveEvent::Stdout("first\n".into())));
    let k = f.session.kernel().cloned().expect("kernel");
    k.interrupt().await;
    let r = f.session.finish(h).await.expect("result");
    assert_eq!(r.status, CellStatus::Interrupted);
    f.session.shutdown().await;
}

#[tokio::test]
async fn fork_child_never_acts_as_a_second_worker() {
    let mut f = fixture();
    let r = f
        .run("import os\npid = os.fork()\nif pid == 0:\n    print('child', flush=True)\nelse:\n    os.waitpid(pid, 0)\n    print('parent')")
        .await;
    assert_ok(&r);
    assert!(
        r.stdout.contains("child\n") && r.stdout.contains("parent\n"),
        "{:?}",
        r.stdout
    );
    let r2 = f.run("1 + 1").await;
    assert_ok(&r2);
    assert_eq!(r2.execution_count, r.execution_count + 1);
    f.session.shutdown().await;
}

#[tokio::test]
async fn closed_fds_do_not_hang_the_host() {
    let mut f = fixture();
    let r = f.run("import os\nos.close(1)\nos.close(2)").await;
    assert_ok(&r);
    let r = f
        .run("import sys\nprint('out again')\nprint('err again', file=sys.stderr)")
        .await;
    assert_eq!(r.stdout, "out again\n");
    assert_eq!(r.stderr, "err again\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn replaced_stdout_without_flush_is_survived() {
    let mut f = fixture();
    let r = f.run("import sys\nclass W:\n    def write(self, s): return len(s)\nsys.stdout = W()\nprint('swallowed')").await;
    assert_ok(&r);
    assert_eq!(r.stdout, "");
    assert_eq!(f.run("print('back')").await.stdout, "back\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn matplotlib_figures_come_back_as_files() {
    if missing_module("matplotlib") {
        return;
    }
    let mut f = fixture();
    let r = f
        .run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.figure()\nplt.bar([1], [2])\n")
        .await;
    assert_ok(&r);
    assert_eq!(r.displays.len(), 2, "{:#?}", r.displays);
    for d in &r.displays {
        let png = &d.data["image/png"];
        let path = png["path"].as_str().expect("path");
        let bytes = std::fs::read(path).expect("figure file");
        assert!(bytes.starts_with(b"\x89PNG"));
        assert_eq!(png["bytes"].as_u64(), Some(bytes.len() as u64));
        assert!(path.starts_with(f.dir.path().to_str().expect("utf8")));
    }
    let r = f.run("plt.get_fignums()").await;
    assert_eq!(r.result.expect("value")["text/plain"], "[]");
    f.session.shutdown().await;
}

// ---------------------------------------------------------------- protocol

fn fake_python(dir: &TempDir, body: &str) -> PathBuf {
    let p = dir.path().join("fake-python");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write fake");
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&p)
        .status()
        .expect("chmod");
    p
}

#[tokio::test]
async fn protocol_version_mismatch_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.python = fake_python(
        &dir,
        r#"printf '{"type":"ready","pid":1,"python":"fake","protocol":99}\n' >&3; sleep 30"#,
    );
    let err = Kernel::spawn(cfg).await.expect_err("mismatch");
    assert!(
        matches!(
            err,
            KernelError::ProtocolMismatch {
                worker: 99,
                host: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("test/1"), "names the kernel: {err}");
}

#[tokio::test]
async fn interpreter_that_dies_at_start_reports_its_stderr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.python = fake_python(&dir, "echo 'no such module: numpy_core_broken' >&2; exit 3");
    let err = Kernel::spawn(cfg).await.expect_err("dies");
    let msg = err.to_string();
    assert!(
        msg.contains("numpy_core_broken") && msg.contains("code 3"),
        "{msg}"
    );
}

#[tokio::test]
async fn oversized_frame_fails_the_cell_without_hanging() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.python = fake_python(
        &dir,
        r#"read -r config <&3; printf '{"type":"ready","pid":1,"python":"fake","protocol":1}\n' >&3; read -r execute <&3; head -c 70000000 /dev/zero | tr '\0' x >&3; sleep 30"#,
    );
    let k = Kernel::spawn(cfg).await.expect("spawn");
    let t = Instant::now();
    let r = k
        .execute("1", ExecOptions::default())
        .await
        .expect("a result, not a hang");
    assert_eq!(r.status, CellStatus::Crashed);
    let msg = r.crash.expect("crash").message;
    assert!(
        msg.contains("protocol error") && msg.contains("test/1") && msg.contains("exceeds"),
        "{msg}"
    );
    assert!(t.elapsed() < Duration::from_secs(20));
    assert!(!k.is_alive());
}

#[tokio::test]
async fn malformed_frame_fails_the_cell_without_hanging() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.python = fake_python(
        &dir,
        r#"read -r config <&3; printf '{"type":"ready","pid":1,"python":"fake","protocol":1}\n' >&3; read -r execute <&3; printf 'not json\n' >&3; sleep 30"#,
    );
    let k = Kernel::spawn(cfg).await.expect("spawn");
    let r = k.execute("1", ExecOptions::default()).await.expect("a result");
    assert_eq!(r.status, CellStatus::Crashed);
    assert!(r.crash.expect("crash").message.contains("malformed"));
}

// ---------------------------------------------------------------- cases (kernel core)

#[tokio::test]
async fn hk06_input_blocks_on_stdin() {
    let mut f = fixture();
    let t = Instant::now();
    let r = f.run("answer = input('Continue? [y/n] ')").await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(r.status, CellStatus::Error);
    let e = r.error.expect("error");
    assert_eq!(e.ename, "EOFError");
    assert!(e.evalue.contains("not supported"), "{}", e.evalue);
    assert_eq!(f.run("print('still alive')").await.stdout, "still alive\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk07_background_thread_output_misrouted() {
    let mut f = fixture();
    let r0 = f
        .run("import threading, time\ndef ticker():\n    for i in range(3):\n        time.sleep(1)\n        print(f'tick {i}', flush=True)\nthreading.Thread(target=ticker, daemon=True).start()\nprint('A returned')")
        .await;
    assert_ok(&r0);
    assert_eq!(r0.stdout, "A returned\n");
    let r1 = f.run("import time\ntime.sleep(4)\nprint('B done')").await;
    assert_ok(&r1);
    assert_eq!(r1.stdout, "B done\n");
    let bg = r1.background_output.clone().unwrap_or_default().stdout;
    let all = format!("{}{}", r0.stdout, bg);
    for i in 0..3 {
        assert_eq!(
            all.matches(&format!("tick {i}\n")).count(),
            1,
            "tick {i} exactly once: {all:?}"
        );
    }
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk09_grandchild_holds_output_pipe() {
    let mut f = fixture();
    let t = Instant::now();
    let r = f
        .run("import os, subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\nos.system('sleep 60 &')\nprint('launched')")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "launched\n");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "returned in {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    assert_eq!(f.run("print('next cell')").await.stdout, "next cell\n");
    assert!(t.elapsed() < Duration::from_secs(2));
    // The background processes are reaped when the session ends.
    let k = f.session.kernel().cloned().expect("kernel");
    let init = k.info().init_pid as i32;
    let tree: Vec<i32> = tree_of(init);
    assert!(tree.len() >= 3, "python + 2 sleepers: {tree:?}");
    f.session.shutdown().await;
    for pid in tree.into_iter().chain([init]) {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} survived the session"
        );
    }
}

#[tokio::test]
async fn hk12_invalid_utf8_on_fd() {
    let mut f = fixture();
    let r = f
        .run("import os\nos.write(1, b'before\\n\\xff\\xfe\\x80 raw\\n')\nos.write(2, b'\\xc3\\x28 bad stderr\\n')\nos.system(\"printf 'shell \\\\377\\\\n'\")\nprint('after')")
        .await;
    assert_ok(&r);
    assert!(r.stdout.starts_with("before\n"), "{:?}", r.stdout);
    assert!(r.stdout.contains("\u{FFFD} raw\n"), "{:?}", r.stdout);
    assert!(r.stdout.contains("shell \u{FFFD}\n"), "{:?}", r.stdout);
    assert!(r.stdout.ends_with("after\n"));
    assert_eq!(r.stderr, "\u{FFFD}( bad stderr\n");
    assert_eq!(f.run("print('next cell ok')").await.stdout, "next cell ok\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk15_forged_protocol_markers() {
    let mut f = fixture();
    let r = f
        .run("import os, sys\nprint('<|EOF|>')\nprint('##end_of_execution##')\nprint('##active_line')\nsys.stdout.write('{\"type\": \"result\", \"status\": \"ok\", \"value\": \"forged\"}\\n')\nos.write(1, b'\\x00\\x00\\x00\\x10<|EOF|>\\n')\nprint('tail line')\nx = 7")
        .await;
    assert_ok(&r);
    for line in [
        "<|EOF|>\n",
        "##end_of_execution##\n",
        "##active_line\n",
        "{\"type\": \"result\", \"status\": \"ok\", \"value\": \"forged\"}\n",
        "tail line\n",
    ] {
        assert!(r.stdout.contains(line), "{line:?} missing from {:?}", r.stdout);
    }
    assert_eq!(r.stdout.matches("<|EOF|>").count(), 2);
    assert!(r.result.is_none());
    assert_eq!(f.run("print(x * 6)").await.stdout, "42\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk17_subprocess_given_sys_stdout() {
    let mut f = fixture();
    let r = f
        .run("import subprocess, sys\nr1 = subprocess.run(['echo', 'child via sys.stdout'], stdout=sys.stdout)\nr2 = subprocess.run(['echo', 'child inherits fd 1'])\nos_rc = __import__('os').system('echo child via os.system')\nprint('codes', r1.returncode, r2.returncode, os_rc)")
        .await;
    assert_ok(&r);
    assert_eq!(
        r.stdout,
        "child via sys.stdout\nchild inherits fd 1\nchild via os.system\ncodes 0 0 0\n"
    );
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk18_sys_exit_quit_exit() {
    let mut f = fixture();
    let r = f
        .run("keep = 1\nimport sys\nsys.exit(3)\nprint('not reached')")
        .await;
    assert_eq!(r.status, CellStatus::Error);
    let e = r.error.expect("error");
    assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("SystemExit", "3"));
    assert!(!r.stdout.contains("not reached"));
    assert_eq!(
        f.run("print('after sys.exit', keep)").await.stdout,
        "after sys.exit 1\n"
    );
    let r = f.run("quit()\nprint('not reached either')").await;
    assert_eq!(r.status, CellStatus::Error);
    assert_eq!(r.error.expect("error").ename, "SystemExit");
    assert!(!r.stdout.contains("not reached"));
    let r = f.run("print('after quit', keep)").await;
    assert_eq!(r.stdout, "after quit 1\n");
    assert!(!r.kernel.state_reset);
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk19_os_exit_kills_worker() {
    let mut f = fixture();
    let t = Instant::now();
    let r = f.run("keep = 1\nimport os\nos._exit(1)").await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(r.status, CellStatus::Crashed);
    let c = r.crash.expect("crash");
    assert_eq!(c.exit_code, Some(1));
    assert!(c.message.contains("exited with code 1"), "{}", c.message);
    let r = f.run("print('keep' in globals())").await;
    assert_eq!(r.stdout, "False\n");
    assert!(r.kernel.state_reset);
    assert!(r.kernel.reset_reason.expect("why").contains("exited with code 1"));
    assert_eq!(r.kernel.generation, 2);
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk20_segfault_in_native_code() {
    let mut f = fixture();
    let t = Instant::now();
    let r = f.run("import ctypes\nctypes.memmove(0, 1, 1)").await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(r.status, CellStatus::Crashed);
    let c = r.crash.expect("crash");
    assert_eq!(c.signal_name.as_deref(), Some("SIGSEGV"));
    assert!(
        r.stderr.contains("Fatal Python error: Segmentation fault"),
        "{:?}",
        r.stderr
    );
    assert!(
        r.stderr.contains("line 2"),
        "faulthandler's Python stack: {:?}",
        r.stderr
    );
    let r = f.run("print('recovered')").await;
    assert_eq!(r.stdout, "recovered\n");
    assert!(r.kernel.state_reset);
    assert!(r.kernel.reset_reason.expect("why").contains("SIGSEGV"));
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk25_sys_stdout_closed() {
    let mut f = fixture();
    assert_ok(&f.run("import sys\nsys.stdout.close()").await);
    assert_eq!(f.run("print('visible again')").await.stdout, "visible again\n");
    let r = f
        .run("import sys\nsys.stderr.write('stderr fine\\n')\nprint('stdout fine')")
        .await;
    assert_eq!(r.stdout, "stdout fine\n");
    assert_eq!(r.stderr, "stderr fine\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk27_cwd_changed_and_deleted() {
    let mut f = fixture();
    let r = f
        .run("import os, tempfile, shutil\nhome = os.getcwd()\nscratch = tempfile.mkdtemp()\nos.chdir(scratch)\nopen('note.txt', 'w').write('hi')\nprint(os.path.exists(os.path.join(scratch, 'note.txt')))")
        .await;
    assert_eq!(r.stdout, "True\n");
    let scratch = r.cwd.clone().expect("cwd reported");
    let r = f.run("print(os.getcwd() == scratch)").await;
    assert_eq!(r.stdout, "True\n");
    assert_eq!(r.cwd.as_deref(), Some(scratch.as_str()));
    let r = f.run("shutil.rmtree(scratch)\nprint('cwd deleted')").await;
    assert_eq!(r.stdout, "cwd deleted\n");
    assert_eq!(r.cwd, None, "a deleted cwd is reported as none");
    assert_eq!(
        f.run("print('host still runs cells')").await.stdout,
        "host still runs cells\n"
    );
    assert_eq!(
        f.run("os.chdir(home)\nprint(os.getcwd() == home)").await.stdout,
        "True\n"
    );
    f.session.shutdown().await;
}

async fn hk29_once(display: Option<&str>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    if let Some(d) = display {
        cfg.env.push(("DISPLAY".into(), d.into()));
    }
    let mut s = Session::new(cfg);
    let t = Instant::now();
    let r = s
        .execute("import matplotlib\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 1])\nplt.show()\nprint('after show', matplotlib.get_backend())", ExecOptions::default())
        .await
        .expect("execute");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_ok(&r);
    assert!(
        r.stdout
            .starts_with("after show module://cellhost_worker.mpl_backend"),
        "{:?}",
        r.stdout
    );
    assert_eq!(r.displays.len(), 1);
    assert!(r.displays[0].data["image/png"]["path"].is_string());
    s.shutdown().await;
}

#[tokio::test]
async fn hk29_plt_show_blocks() {
    if missing_module("matplotlib") {
        return;
    }
    hk29_once(None).await;
    // With DISPLAY set to a live X server (Xvfb, when installed).
    let xvfb = PathBuf::from("/usr/bin/Xvfb");
    if xvfb.exists() {
        let mut x = std::process::Command::new(&xvfb)
            .args([":97", "-nolisten", "tcp"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("Xvfb");
        for _ in 0..100 {
            if std::path::Path::new("/tmp/.X11-unix/X97").exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        hk29_once(Some(":97")).await;
        let _ = x.kill();
        let _ = x.wait();
    } else {
        eprintln!("note: Xvfb not installed; the DISPLAY half of hk29 ran with an unreachable display");
        hk29_once(Some(":97")).await;
    }
}

// ---------------------------------------------------------------- control (issue 3 cases)

#[tokio::test]
async fn hk02_keyboardinterrupt_swallowed() {
    let mut f = fixture();
    assert_ok(&f.run("progress = []").await);
    let h = f
        .session
        .submit("import time\nwhile True:\n    try:\n        time.sleep(0.2)\n        progress.append(1)\n    except BaseException:\n        pass", ExecOptions::default())
        .await
        .expect("submit");
    let k = f.session.kernel().cloned().expect("kernel");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    assert!(k.interrupt().await.delivered);
    tokio::time::sleep(Duration::from_secs(1)).await;
    k.interrupt().await;
    let r = f.session.finish(h).await.expect("result");
    assert!(
        t.elapsed() <= Duration::from_secs(5),
        "escalated in {:?}",
        t.elapsed()
    );
    assert_eq!(r.status, CellStatus::Interrupted);
    let i = r.interrupt.expect("interrupt report");
    assert!(i.escalated && !i.state_kept);
    assert!(i.reason.expect("reason").contains("caught the KeyboardInterrupt"));
    let r = f.run("print('session usable')").await;
    assert_eq!(r.stdout, "session usable\n");
    assert!(r.kernel.state_reset, "the restart is said explicitly");
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk04_sigint_ignored_by_user_code() {
    let mut f = fixture();
    assert_ok(&f.run("keep = 'before'").await);
    let h = f
        .session
        .submit("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)\nkeep = 'after'", ExecOptions::default())
        .await
        .expect("submit");
    let k = f.session.kernel().cloned().expect("kernel");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    k.interrupt().await;
    let r = f.session.finish(h).await.expect("result");
    assert!(t.elapsed() <= Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(r.status, CellStatus::Interrupted);
    let i = r.interrupt.expect("report");
    assert!(i.escalated);
    assert!(i.reason.expect("reason").contains("ignores SIGINT"));
    let r = f.run("print(keep)").await;
    assert!(r.kernel.state_reset);
    assert!(
        r.status == CellStatus::Error,
        "keep is gone with the killed kernel: {r:#?}"
    );
    // The next interrupt works normally.
    let h = f
        .session
        .submit("import time\ntime.sleep(30)", ExecOptions::default())
        .await
        .expect("submit");
    let k = f.session.kernel().cloned().expect("kernel");
    tokio::time::sleep(Duration::from_millis(500)).await;
    k.interrupt().await;
    let r = f.session.finish(h).await.expect("result");
    assert_eq!(r.status, CellStatus::Interrupted);
    let i = r.interrupt.expect("report");
    assert!(!i.escalated && i.state_kept);
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk32_timeout_returns_promptly_and_stops_work() {
    let mut f = fixture();
    assert_ok(&f.run("import time\nresult = 'initial'").await);
    let t = Instant::now();
    let r = f
        .run_with_timeout("time.sleep(5)\nresult = 'late write'", 1.0)
        .await;
    assert!(t.elapsed() <= Duration::from_millis(1500), "{:?}", t.elapsed());
    assert_eq!(r.status, CellStatus::Timeout);
    let i = r.interrupt.expect("report");
    assert!(i.delivered && !i.escalated && i.state_kept);
    let r = f.run_with_timeout("time.sleep(6)\nprint(result)", 10.0).await;
    assert_eq!(r.stdout, "initial\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn interrupt_before_the_code_starts_is_not_lost() {
    let mut f = fixture();
    assert_ok(&f.run("x = 1").await);
    let k = f.session.kernel().cloned().expect("kernel");
    // Interrupt as soon as the cell is submitted: whether the SIGINT lands
    // before, during or after the worker picks the cell up, the cell ends
    // interrupted and the next cell is untouched.
    for _ in 0..5 {
        let h = k
            .submit("import time\ntime.sleep(20)", ExecOptions::default())
            .expect("submit");
        let mut out = k.interrupt().await;
        for _ in 0..100 {
            if out.delivered {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            out = k.interrupt().await;
        }
        let r = h.wait().await.expect("result");
        assert_eq!(r.status, CellStatus::Interrupted, "{r:#?}");
        assert_ok(&k.execute("x += 1", ExecOptions::default()).await.expect("next"));
    }
    assert_eq!(
        k.execute("x", ExecOptions::default())
            .await
            .expect("x")
            .result
            .expect("v")["text/plain"],
        "6"
    );
    k.kill().await;
}

// ---------------------------------------------------------------- resource limits

fn cgroups_usable() -> bool {
    let probe = cellhost_sandbox::cgroup::KernelCgroup::create(
        &format!("probe-{}", std::process::id()),
        &cellhost_sandbox::cgroup::CgroupLimits {
            pids_max: Some(8),
            memory_bytes: Some(64 << 20),
            cpu_cores: None,
        },
    );
    match probe {
        Ok(mut cg) => {
            cg.remove();
            true
        }
        Err(e) => {
            eprintln!("skipped: cgroups are not usable here: {e}");
            false
        }
    }
}

#[tokio::test]
async fn hk23_fork_bomb() {
    if !cgroups_usable() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // The default sandbox profile's limits (512 processes, 4 GiB).
    let cfg = config(&dir);
    assert!(cfg.limits.is_empty());
    let mut s = Session::new(cfg);
    let k = s.ensure_kernel().await.expect("kernel");
    let init = k.info().init_pid as i32;
    let t = Instant::now();
    let opts = ExecOptions {
        timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let r = s
        .execute("import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)", opts)
        .await
        .expect("result");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(r.status, CellStatus::Timeout);
    let i = r.interrupt.expect("report");
    assert!(i.escalated && !i.state_kept, "{i:?}");
    assert!(i.reason.expect("reason").contains("process limit"));
    // No forked process survives.
    assert!(cellhost_sandbox::procfs::descendants(init).is_empty());
    assert!(!std::path::Path::new(&format!("/proc/{init}")).exists());
    let r = s
        .execute("print('alive')", ExecOptions::default())
        .await
        .expect("alive");
    assert_eq!(r.stdout, "alive\n");
    assert!(r.kernel.state_reset);
    assert!(r.kernel.reset_reason.expect("why").contains("process limit"));
    s.shutdown().await;
}

#[tokio::test]
async fn hk22_memory_exhaustion() {
    if !cgroups_usable() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // The default sandbox profile's limits (512 processes, 4 GiB).
    let cfg = config(&dir);
    assert!(cfg.limits.is_empty());
    let mut s = Session::new(cfg);
    let mut other = fixture();
    assert_ok(&other.run("y = 5").await);
    let t = Instant::now();
    let r = s
        .execute(
            "hold = []\nwhile True:\n    hold.append(b'\\x01' * (256 * 1024 * 1024))",
            ExecOptions::default(),
        )
        .await
        .expect("result");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    match r.status {
        CellStatus::Error => assert_eq!(r.error.expect("error").ename, "MemoryError"),
        CellStatus::Crashed => {
            let msg = r.crash.expect("crash").message;
            assert!(msg.contains("out of memory"), "{msg}");
        }
        other => panic!("unexpected status {other:?}"),
    }
    let r = s
        .execute("print('alive')", ExecOptions::default())
        .await
        .expect("alive");
    assert_eq!(r.stdout, "alive\n");
    // Other sessions are not affected.
    assert_eq!(other.run("print(y)").await.stdout, "5\n");
    s.shutdown().await;
    other.session.shutdown().await;
}

// ---------------------------------------------------------------- output (issue 4 cases)

#[tokio::test]
async fn hk10_100mb_line_without_newline() {
    let mut f = fixture();
    let r = f
        .run("import sys\nblob = 'x' * (100 * 1024 * 1024)\nsys.stdout.write(blob)\nsize = len(blob)\ndel blob")
        .await;
    assert_ok(&r);
    let t = r.truncated.get("stdout").expect("stdout truncated");
    assert_eq!(t.total_bytes, 104_857_600);
    assert_eq!(t.shown_bytes + t.omitted_bytes, t.total_bytes);
    assert!(
        r.stdout.len() <= 50_000 + 400,
        "inline stdout stays at the cap: {}",
        r.stdout.len()
    );
    assert!(r.stdout.contains("omitted"), "one line says what was cut");
    let spill = t.spill_path.clone().expect("spill file");
    let meta = std::fs::metadata(&spill).expect("spill exists");
    assert_eq!(meta.len(), 50_000_000, "spill capped at 50 MB");
    let chunk = cellhost_kernel::read_spill(&spill, 1_000_000, 10).expect("page");
    assert_eq!(chunk.text, "xxxxxxxxxx");
    assert_eq!(chunk.next_offset, Some(1_000_010));
    assert!(r.hint.expect("hint").contains("spill"));
    assert_eq!(f.run("print(size)").await.stdout, "104857600\n");
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk11_carriage_return_progress_frames() {
    let mut f = fixture();
    let r = f
        .run("import sys\nfor i in range(1, 5001):\n    sys.stdout.write(f'\\rstep {i}/5000')\n    sys.stdout.flush()\nprint()\nprint('finished')")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "step 5000/5000\nfinished\n");
    let r = f
        .run("try:\n    from tqdm import tqdm\n    for _ in tqdm(range(3000), mininterval=0):\n        pass\nexcept ImportError:\n    pass\nprint('tqdm done')")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "tqdm done\n");
    if has_module("tqdm") {
        assert!(r.stderr.contains("3000/3000"), "{:?}", r.stderr);
        assert_eq!(
            r.stderr.matches("it/s").count() + r.stderr.matches("s/it").count(),
            1,
            "one frame: {:?}",
            r.stderr
        );
        assert!(!r.stderr.contains('\r'));
    }
    f.session.shutdown().await;
}

#[tokio::test]
async fn hk31_secret_redaction_output_only() {
    const SECRET: &str = "sk-demo-3f9a1c7e5b2d4a6f8e0c";
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.env.push(("DEMO_TOKEN".into(), SECRET.into()));
    cfg.register_secret(SECRET);
    let mut s = Session::new(cfg);
    let r = s
        .execute("import os\nsecret = os.environ['DEMO_TOKEN']\nprint('DEMO_TOKEN=' + secret)\nprint({'token': secret})\nprint(secret[:10], end='')\nprint(secret[10:])\nraise ValueError('bad token ' + secret)", ExecOptions::default())
        .await
        .expect("execute");
    assert_eq!(r.status, CellStatus::Error);
    let json = serde_json::to_string(&r).expect("json");
    assert!(!json.contains(SECRET), "secret leaked: {json}");
    assert!(
        !json.contains("3f9a1c7e5b2d4a6f8e0c"),
        "secret tail leaked: {json}"
    );
    assert!(
        r.stdout.contains("DEMO_TOKEN=") && r.stdout.matches("[redacted]").count() >= 3,
        "{:?}",
        r.stdout
    );
    let e = r.error.expect("error");
    assert_eq!(e.ename, "ValueError");
    assert!(
        e.evalue.starts_with("bad token ") && e.evalue.contains("[redacted]"),
        "{}",
        e.evalue
    );
    let r = s
        .execute("literal = 'sk-demo-3f9a1c7e5b2d4a6f8e0c'\nprint(len(literal), literal == os.environ['DEMO_TOKEN'])", ExecOptions::default())
        .await
        .expect("execute");
    assert_eq!(r.stdout, "28 True\n", "the cell's code runs unmodified");
    s.shutdown().await;
}

// ---------------------------------------------------------------- control (issue 3)

#[tokio::test]
async fn restart_bumps_the_generation_and_refuses_stale_callers() {
    let mut f = fixture();
    assert_ok(&f.run("a = 1").await);
    assert_eq!(f.session.generation(), 1);
    let old = f.session.kernel().cloned().expect("kernel");
    let g = f.session.restart(Some(1)).await.expect("restart");
    assert_eq!(g, 2);
    assert!(!old.is_alive(), "the old kernel is gone");
    assert!(matches!(
        old.submit("1", ExecOptions::default()),
        Err(KernelError::Dead { .. })
    ));
    let err = f.session.interrupt(Some(1)).await.expect_err("stale");
    assert!(
        matches!(
            err,
            KernelError::StaleGeneration {
                requested: 1,
                current: 2,
                ..
            }
        ),
        "{err}"
    );
    let err = f.session.restart(Some(1)).await.expect_err("stale restart");
    assert!(matches!(err, KernelError::StaleGeneration { .. }));
    let r = f.run("print('a' in globals())").await;
    assert_eq!(r.stdout, "False\n");
    assert!(r.kernel.state_reset && r.kernel.generation == 2);
    assert!(r.kernel.reset_reason.expect("why").contains("restarted"));
    f.session.shutdown().await;
}

#[tokio::test]
async fn background_cells_peek_wait_and_queue_in_order() {
    let mut f = fixture();
    let k = f.session.ensure_kernel().await.expect("kernel");
    let mut h1 = k
        .submit(
            "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.3)",
            ExecOptions::default(),
        )
        .expect("submit");
    let h2 = k
        .submit("print('second')", ExecOptions::default())
        .expect("queued");
    let busy = k.submit(
        "1",
        ExecOptions {
            fail_if_busy: true,
            ..Default::default()
        },
    );
    assert!(matches!(busy, Err(KernelError::KernelBusy { .. })));
    assert!(
        h1.wait_timeout(Duration::from_millis(100)).await.is_none(),
        "still running"
    );
    let mut seen = None;
    for _ in 0..100 {
        let p = h1.peek().await.expect("progress");
        if p.stdout_tail.contains("step 0") {
            seen = Some(p);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let p = seen.expect("peek shows output so far");
    assert_eq!(p.state, "running");
    assert_eq!(h2.peek().await.expect("queued").state, "queued");
    let r1 = h1
        .wait_timeout(Duration::from_secs(10))
        .await
        .expect("settled")
        .as_ref()
        .expect("ok")
        .clone();
    assert_eq!(r1.stdout, "step 0\nstep 1\nstep 2\n");
    let r2 = h2.wait().await.expect("second");
    assert_eq!(r2.stdout, "second\n");
    assert_eq!(r2.execution_count, r1.execution_count + 1);
    f.session.shutdown().await;
}

#[tokio::test]
async fn queued_cell_has_its_own_deadline() {
    let mut f = fixture();
    let k = f.session.ensure_kernel().await.expect("kernel");
    let h1 = k
        .submit("import time\ntime.sleep(1.5)", ExecOptions::default())
        .expect("first");
    let h2 = k
        .submit(
            "time.sleep(0.2)\nprint('done')",
            ExecOptions {
                timeout: Some(Duration::from_secs(1)),
                ..Default::default()
            },
        )
        .expect("second");
    assert_ok(&h1.wait().await.expect("first"));
    let r2 = h2.wait().await.expect("second");
    assert_ok(&r2);
    assert_eq!(
        r2.stdout, "done\n",
        "the wait in the queue does not count against the deadline"
    );
    f.session.shutdown().await;
}

#[tokio::test]
async fn inspect_variables_describes_without_calling_repr() {
    let mut f = fixture();
    let setup = "class Evil:\n    def __repr__(self):\n        raise SystemExit('repr was called')\n    def __len__(self):\n        raise SystemExit('len was called')\n\
                 e = Evil()\nn = 42\ns = 'x' * 1000\nl = [1, 2, 3]\nd = {'a': 1}\nimport os\n_hidden = 1";
    assert_ok(&f.run(setup).await);
    let vars = f.session.inspect_variables(None, 100).await.expect("vars");
    let by_name = |n: &str| {
        vars.variables
            .iter()
            .find(|v| v["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(by_name("n")["preview"], "42");
    assert_eq!(by_name("l")["len"], 3);
    assert_eq!(by_name("d")["type"], "dict");
    assert_eq!(by_name("s")["len"], 1000);
    assert!(by_name("s")["preview"].as_str().expect("preview").len() < 200);
    assert_eq!(by_name("e")["type"], "__main__.Evil");
    assert!(by_name("os").is_null(), "modules are not listed");
    assert!(by_name("_hidden").is_null(), "private names are not listed");
    let few = f.session.inspect_variables(None, 2).await.expect("vars");
    assert_eq!(few.variables.len(), 2);
    assert!(few.truncated);
    assert!(matches!(
        f.session.inspect_variables(None, 0).await,
        Err(KernelError::InvalidRequest(_))
    ));
    assert!(matches!(
        f.session.inspect_variables(None, 501).await,
        Err(KernelError::InvalidRequest(_))
    ));
    if has_module("numpy") && has_module("pandas") {
        assert_ok(&f.run("import numpy as np, pandas as pd\narr = np.zeros((3, 4), dtype='float32')\ndf = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})").await);
        let vars = f.session.inspect_variables(None, 100).await.expect("vars");
        let arr = vars.variables.iter().find(|v| v["name"] == "arr").expect("arr");
        assert_eq!(arr["shape"], serde_json::json!([3, 4]));
        assert_eq!(arr["dtype"], "float32");
        let df = vars.variables.iter().find(|v| v["name"] == "df").expect("df");
        assert_eq!(df["shape"], serde_json::json!([2, 2]));
        assert_eq!(df["columns"], serde_json::json!(["a", "b"]));
    }
    f.session.shutdown().await;
}

#[tokio::test]
async fn inspect_on_a_busy_kernel_answers_at_once() {
    let mut f = fixture();
    let k = f.session.ensure_kernel().await.expect("kernel");
    let h = k
        .submit("import time\ntime.sleep(30)", ExecOptions::default())
        .expect("submit");
    let t = Instant::now();
    let err = k.inspect_variables(10).await.expect_err("busy");
    assert!(matches!(err, KernelError::KernelBusy { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(1));
    k.interrupt().await;
    assert_eq!(h.wait().await.expect("result").status, CellStatus::Interrupted);
    f.session.shutdown().await;
}

#[tokio::test]
async fn kill_reaches_setsid_children_and_grandchildren() {
    let mut f = fixture();
    let r = f
        .run("import subprocess, os\nps = [subprocess.Popen(['sleep', '600']) for _ in range(3)]\nps += [subprocess.Popen(['setsid', 'sleep', '600']) for _ in range(3)]\nos.system('sh -c \"sleep 600 &\"')\nprint('ok')")
        .await;
    assert_ok(&r);
    let k = f.session.kernel().cloned().expect("kernel");
    let init = k.info().init_pid as i32;
    let tree: Vec<i32> = tree_of(init);
    assert!(tree.len() >= 8, "python + 7 sleepers: {tree:?}");
    k.kill().await;
    for pid in tree.iter().chain([&init]) {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} survived (or was not reaped)"
        );
    }
}

#[tokio::test]
async fn sigint_handling_is_rearmed_for_every_cell() {
    let mut f = fixture();
    assert_ok(
        &f.run("import signal\nsignal.signal(signal.SIGINT, lambda *a: None)")
            .await,
    );
    let k = f.session.kernel().cloned().expect("kernel");
    let h = k
        .submit("import time\ntime.sleep(30)", ExecOptions::default())
        .expect("submit");
    tokio::time::sleep(Duration::from_millis(300)).await;
    k.interrupt().await;
    let r = h.wait().await.expect("result");
    assert_eq!(r.status, CellStatus::Interrupted);
    assert!(
        r.interrupt.expect("report").state_kept,
        "the worker's own handler was back in place"
    );
    f.session.shutdown().await;
}

// ---------------------------------------------------------------- host tools, hints, live stream

struct EchoTools;

impl cellhost_kernel::ToolHost for EchoTools {
    fn names(&self) -> Vec<String> {
        vec!["echo".into(), "slow".into(), "fail".into()]
    }

    fn call(&self, call: cellhost_kernel::ToolCall) -> cellhost_kernel::ToolFuture {
        Box::pin(async move {
            match call.name.as_str() {
                "echo" => Ok(serde_json::json!({"cell": call.cell, "args": call.args})),
                "slow" => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok(call.args)
                }
                _ => Err("the tool failed on purpose".into()),
            }
        })
    }
}

fn tools_fixture(budget: u32) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.tool_host = Some(std::sync::Arc::new(EchoTools));
    cfg.tool_budget = budget;
    Fixture {
        session: Session::new(cfg),
        dir,
    }
}

#[tokio::test]
async fn host_tools_answer_each_call_and_enforce_authority_and_budget() {
    let mut f = tools_fixture(5);
    let r = f
        .run("import cellhost\nr = cellhost.tools.echo(x=1)\nprint(r['args'])\nsorted(dir(cellhost.tools))")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "{'x': 1}\n");
    assert_eq!(r.result.expect("names")["text/plain"], "['echo', 'fail', 'slow']");
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].outcome, "ok");
    // Threads calling at once each get their own answer.
    let r = f
        .run("import threading\nout = {}\ndef go(i):\n    out[i] = cellhost.call('slow', {'i': i})['i']\nts = [threading.Thread(target=go, args=(i,)) for i in range(4)]\n[t.start() for t in ts]\n[t.join() for t in ts]\nsorted(out.items())")
        .await;
    assert_ok(&r);
    assert_eq!(
        r.result.expect("v")["text/plain"],
        "[(0, 0), (1, 1), (2, 2), (3, 3)]"
    );
    // A tool error and an unknown tool are clear errors in the cell.
    let r = f.run("cellhost.tools.fail()").await;
    assert_eq!(r.error.expect("error").evalue, "the tool failed on purpose");
    let r = f.run("cellhost.tools.nope()").await;
    let e = r.error.expect("error");
    assert_eq!(e.ename, "ToolError");
    assert!(e.evalue.contains("not enabled"), "{}", e.evalue);
    assert!(r.hint.expect("hint").contains("not enabled"));
    // The budget.
    let r = f.run("for i in range(6):\n    cellhost.tools.echo(i=i)").await;
    let e = r.error.expect("budget error");
    assert!(e.evalue.contains("budget of 5"), "{}", e.evalue);
    assert!(r.hint.expect("hint").contains("budget"));
    // A thread left behind by a settled cell has no authority.
    assert_ok(&f.run("import time\nlate = []\ndef later():\n    time.sleep(0.5)\n    try:\n        cellhost.tools.echo()\n        late.append('answered')\n    except cellhost.ToolError as e:\n        late.append(str(e))\nthreading.Thread(target=later).start()").await);
    let r = f.run("time.sleep(1)\nprint(late)").await;
    assert!(
        r.stdout.contains("authority ends when the cell settles"),
        "{:?}",
        r.stdout
    );
    f.session.shutdown().await;
}

#[tokio::test]
async fn hints_name_the_interpreter_and_the_cwd() {
    let mut f = fixture();
    let r = f.run("import no_such_module_xyz").await;
    let hint = r.hint.expect("hint");
    assert!(
        hint.contains("no_such_module_xyz") && hint.contains(python().to_str().expect("utf8")),
        "{hint}"
    );
    let r = f.run("open('missing-file.csv')").await;
    let hint = r.hint.expect("hint");
    assert!(hint.contains(f.dir.path().to_str().expect("utf8")), "{hint}");
    f.session.shutdown().await;
}

#[tokio::test]
async fn live_stream_equals_the_final_text() {
    const SECRET: &str = "tok-9f8e7d6c5b4a3f2e1d0c";
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.register_secret(SECRET);
    let mut s = Session::new(cfg);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let code = format!(
        "import sys, time\nfor i in range(50):\n    sys.stdout.write(f'\\rprogress {{i}}')\n    sys.stdout.flush()\nprint()\ns = '{SECRET}'\nsys.stdout.write(s[:7]); sys.stdout.flush(); time.sleep(0.05)\nprint(s[7:])\nprint('\\x1b[31mred\\x1b[0m done')"
    );
    let r = s
        .execute(
            &code,
            ExecOptions {
                live: Some(tx),
                ..Default::default()
            },
        )
        .await
        .expect("run");
    let mut live = String::new();
    while let Ok(ev) = rx.try_recv() {
        if let LiveEvent::Stdout(t) = ev {
            live.push_str(&t);
        }
    }
    assert_eq!(live, r.stdout);
    assert!(!live.contains(SECRET) && !live.contains("9f8e7d6c5b4a"));
    assert!(
        r.stdout.starts_with("progress 49\n") && r.stdout.ends_with("red done\n"),
        "{:?}",
        r.stdout
    );
    s.shutdown().await;
}

#[tokio::test]
async fn lone_surrogates_never_break_capture_or_framing() {
    let mut f = fixture();
    let r = f
        .run("print('a\\ud800b')\ndisplay({'text/plain': 'x\\udcffy'}, raw=True)\n'\\ud800'")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "a\\ud800b\n");
    assert_eq!(r.displays.len(), 1);
    assert!(r.result.is_some());
    assert_eq!(f.run("print('next')").await.stdout, "next\n");
    f.session.shutdown().await;
}

// ---- sandbox
//
// The escape suite: one test per promise of the default (`auto`) profile.
// A test skips, saying why, only when this machine lacks the layer that
// keeps the promise.

use cellhost_sandbox::profile::{SandboxMode, SandboxProfile};

async fn sandboxed(dir: &TempDir, profile: SandboxProfile) -> Kernel {
    let mut cfg = config(dir);
    cfg.sandbox = profile;
    Kernel::spawn(cfg).await.expect("sandboxed kernel")
}

/// The layer is enforced in `k`, or the reason it is not (printed).
fn layer_on(k: &Kernel, name: &str) -> bool {
    match k.info().sandbox.layer(name) {
        Some(l) if l.enforced => true,
        Some(l) => {
            eprintln!("skipped: layer {name} is not enforced here: {}", l.detail);
            false
        }
        None => {
            eprintln!("skipped: layer {name} is not reported");
            false
        }
    }
}

async fn run(k: &Kernel, code: &str) -> CellResult {
    k.execute(code, ExecOptions::default()).await.expect("execute")
}

#[tokio::test]
async fn sandbox_default_profile_reports_its_layers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::default()).await;
    let s = &k.info().sandbox;
    assert_eq!(s.mode, SandboxMode::Auto);
    for l in &s.layers {
        eprintln!(
            "{:<13} {:<8} {}",
            l.name,
            if l.enforced { "enforced" } else { "missing" },
            l.detail
        );
    }
    for name in common::SANDBOX_LAYERS {
        assert!(s.layer(name).is_some(), "{name} missing from {s:?}");
    }
    // The worker really is a low pid below the ns-init (pid 1; the ns-init's
    // short-lived helpers may take the first pids), and the host pid is right.
    if layer_on(&k, "pidns") {
        let r = run(&k, "import os; print(os.getpid())").await;
        let pid: i32 = r.stdout.trim().parse().expect("pid");
        assert!((2..10).contains(&pid), "{r:?}");
        let ns = cellhost_sandbox::procfs::ns_pids(k.info().pid as i32);
        assert_eq!(ns.last(), Some(&pid), "{ns:?}");
    }
    if layer_on(&k, "cgroupns") {
        let r = run(&k, "print(open('/proc/self/cgroup').read().count('cellhost'))").await;
        assert_eq!(r.stdout, "0\n", "{r:#?}");
    }
    k.kill().await;
}

#[tokio::test]
async fn sandbox_off_behaves_as_before() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::off()).await;
    assert_eq!(k.info().sandbox.mode, SandboxMode::Off);
    assert!(k.info().sandbox.layers.is_empty());
    let r = run(&k, "import os; print(os.getpid())").await;
    assert_eq!(r.stdout, format!("{}\n", k.info().pid));
    k.kill().await;
}

/// An init that cannot act (stopped by its own worker: with the sandbox
/// off they share a uid) does not hang `kill`: its tree is swept, then the
/// init is SIGKILLed and reaped, the worker with it.
#[tokio::test]
async fn a_kill_ends_a_kernel_whose_init_was_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::off()).await;
    let init = k.info().init_pid as i32;
    let pid = k.info().pid as i32;
    let r = run(
        &k,
        "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nos.getppid()",
    )
    .await;
    assert_ok(&r);
    assert_eq!(
        r.result.and_then(|b| b.get("text/plain").cloned()),
        Some(init.to_string().into())
    );
    tokio::time::timeout(Duration::from_secs(30), k.kill())
        .await
        .expect("kill returns");
    assert!(!k.is_alive());
    assert!(
        !std::path::Path::new(&format!("/proc/{init}")).exists(),
        "the init {init} is reaped"
    );
    let worker = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        worker.is_empty()
            || cellhost_sandbox::procfs::parse_stat(pid, &worker).is_some_and(|p| p.state == 'Z'),
        "the worker {pid} is dead: {worker}"
    );
}

/// A killed kernel is reaped before `kill` returns, also when its worker
/// is a large, many-threaded process whose group stays unwaitable for a
/// while after its leader shows as a zombie (sandbox off: the init spares
/// forked kernels and used to stop at "only zombies left").
#[tokio::test]
async fn a_killed_many_threaded_worker_is_reaped_before_kill_returns() {
    for round in 0..4 {
        let dir = tempfile::tempdir().expect("tempdir");
        let k = sandboxed(&dir, SandboxProfile::off()).await;
        let r = run(
            &k,
            "import threading, time\n\
             ev = threading.Event()\n\
             ts = [threading.Thread(target=ev.wait, daemon=True) for _ in range(16)]\n\
             [t.start() for t in ts]\n\
             heap = b'x' * (768 << 20)\n\
             len(threading.enumerate())",
        )
        .await;
        assert_ok(&r);
        let pid = k.info().pid;
        k.kill().await;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
        assert!(
            status.is_none(),
            "round {round}: the worker {pid} is still listed after kill: {:?}",
            status.as_deref().map(|s| s
                .lines()
                .filter(|l| l.starts_with("State") || l.starts_with("PPid"))
                .collect::<Vec<_>>())
        );
    }
}

#[tokio::test]
async fn sandbox_writing_outside_the_workdir_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::default()).await;
    if !layer_on(&k, "landlock") {
        return;
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let outside = [
        format!("{home}/.cellhost-escape-{}", std::process::id()),
        "/usr/cellhost-escape".into(),
        "/var/tmp/cellhost-escape".into(),
        "/etc/cellhost-escape".into(),
    ];
    for path in &outside {
        let r = run(&k, &format!("open({path:?}, 'w').write('x')")).await;
        assert_eq!(r.status, CellStatus::Error, "{path}: {r:#?}");
        assert!(!std::path::Path::new(path).exists(), "{path} was written");
    }
    // The workdir, the session directory and the private /tmp are writable.
    let r = run(
        &k,
        "import os, tempfile\nopen('here.txt', 'w').write('ok')\nopen('/tmp/mine.txt', 'w').write('ok')\nprint(tempfile.mkdtemp())",
    )
    .await;
    assert_ok(&r);
    assert!(dir.path().join("here.txt").is_file());
    if layer_on(&k, "mountns") {
        assert!(
            !std::path::Path::new("/tmp/mine.txt").exists(),
            "/tmp is not private"
        );
    }
    k.kill().await;
}

#[tokio::test]
async fn sandbox_planted_secret_is_unreadable() {
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
    let secret = home.join(format!(".cellhost-planted-secret-{}", std::process::id()));
    std::fs::write(&secret, "hunter2-planted").expect("plant");
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::default()).await;
    let r = run(
        &k,
        &format!(
            "try:\n    print(open({:?}).read())\nexcept OSError as e:\n    print(type(e).__name__)",
            secret.display()
        ),
    )
    .await;
    let on = layer_on(&k, "landlock");
    let _ = std::fs::remove_file(&secret);
    if layer_on(&k, "rootfs") {
        // Not in the kernel's view at all.
        assert_eq!(r.stdout, "FileNotFoundError\n", "{r:#?}");
    } else if on {
        assert_eq!(r.stdout, "PermissionError\n", "{r:#?}");
    }
    // /etc/shadow reads as empty (masked), whatever the layer says.
    if layer_on(&k, "mountns") && std::path::Path::new("/etc/shadow").exists() {
        let r = run(&k, "print(len(open('/etc/shadow').read()))").await;
        assert_eq!(r.stdout, "0\n", "{r:#?}");
    }
    k.kill().await;
}

#[tokio::test]
async fn sandbox_host_environ_is_unreadable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::default()).await;
    if !layer_on(&k, "pidns") || !layer_on(&k, "mountns") {
        return;
    }
    let host = std::process::id();
    let r = run(
        &k,
        &format!("try:\n    print(len(open('/proc/{host}/environ', 'rb').read()))\nexcept OSError as e:\n    print(type(e).__name__)"),
    )
    .await;
    assert!(
        r.stdout == "FileNotFoundError\n" || r.stdout == "PermissionError\n",
        "{r:#?}"
    );
    k.kill().await;
}

#[tokio::test]
async fn sandbox_loopback_connect_to_the_host_fails() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::default()).await;
    if !layer_on(&k, "netns") {
        return;
    }
    let r = run(
        &k,
        &format!("import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)"),
    )
    .await;
    assert_ok(&r);
    assert_ne!(r.stdout, "connected\n");
    // With network on, the same connect succeeds.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let on = SandboxProfile {
        network: true,
        ..Default::default()
    };
    let k2 = sandboxed(&dir2, on).await;
    let r = run(
        &k2,
        &format!("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3).close()\nprint('connected')"),
    )
    .await;
    assert_eq!(r.stdout, "connected\n", "{r:#?}");
    k.kill().await;
    k2.kill().await;
}

#[tokio::test]
async fn sandbox_ptrace_of_the_host_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::default()).await;
    if !layer_on(&k, "seccomp") {
        return;
    }
    let host = std::process::id();
    let r = run(
        &k,
        &format!("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.ptrace(16, {host}, 0, 0)\nprint(rc, os.strerror(ctypes.get_errno()))\nrc = libc.ptrace(0, 0, 0, 0)\nprint(rc, os.strerror(ctypes.get_errno()))"),
    )
    .await;
    assert_eq!(
        r.stdout, "-1 Operation not permitted\n-1 Operation not permitted\n",
        "{r:#?}"
    );
    // Namespaces cannot be made from inside either.
    let r = run(
        &k,
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.unshare(0x10000000), ctypes.get_errno())",
    )
    .await;
    assert_eq!(r.stdout, "-1 1\n", "{r:#?}");
    k.kill().await;
}

/// joblib/loky's `cpu_count()` (used by scikit-learn) reads the CPU quota
/// from `/sys/fs/cgroup` and failed with `PermissionError`: the kernel sees
/// its own groups read-only at the hierarchies' mount points. With joblib
/// in the interpreter (`CELLHOST_TEST_JOBLIB_PYTHON`, else the test
/// interpreter), `joblib.cpu_count()` itself must say 1 under a 1-core cap.
#[tokio::test]
async fn sandbox_cpu_quota_is_readable_where_loky_reads_it() {
    if !cgroups_usable() {
        return;
    }
    let python = std::env::var_os("CELLHOST_TEST_JOBLIB_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(python);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.python = python.clone();
    cfg.sandbox = SandboxProfile::default();
    cfg.limits.cpu_cores = Some(1.0);
    let k = Kernel::spawn(cfg).await.expect("kernel");
    if !layer_on(&k, "cgroup") {
        k.kill().await;
        return;
    }
    // loky's _cpu_count_cgroup, step by step.
    let r = run(
        &k,
        "import os\nif os.path.exists('/sys/fs/cgroup/cpu.max'):\n    q, p = open('/sys/fs/cgroup/cpu.max').read().split()\nelse:\n    q = open('/sys/fs/cgroup/cpu/cpu.cfs_quota_us').read().strip()\n    p = open('/sys/fs/cgroup/cpu/cpu.cfs_period_us').read().strip()\nprint(int(q) / int(p))",
    )
    .await;
    assert_eq!(r.stdout, "1.0\n", "{r:#?}");
    let r = run(
        &k,
        "try:\n    import joblib\nexcept ImportError:\n    print('no joblib')\nelse:\n    print(joblib.cpu_count())",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    if r.stdout == "no joblib\n" {
        eprintln!("skipped: joblib is not installed in {}", python.display());
    } else {
        assert_eq!(r.stdout, "1\n", "joblib.cpu_count() under a 1-core cap: {r:#?}");
    }
    k.kill().await;
}

#[tokio::test]
async fn sandbox_fork_beyond_the_pids_limit_fails() {
    if !cgroups_usable() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut p = SandboxProfile::default();
    p.limits.pids_max = Some(40);
    let k = sandboxed(&dir, p).await;
    if !layer_on(&k, "cgroup") {
        return;
    }
    let r = run(
        &k,
        "import subprocess\nps = []\ntry:\n    for _ in range(100):\n        ps.append(subprocess.Popen(['sleep', '60']))\n    print('all started')\nexcept OSError as e:\n    print('refused after', len(ps))\nfor p in ps:\n    p.kill(); p.wait()",
    )
    .await;
    assert!(r.stdout.starts_with("refused after"), "{r:#?}");
    k.kill().await;
}

#[tokio::test]
async fn sandbox_daemonised_grandchild_cannot_escape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::default()).await;
    let r = run(
        &k,
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '600'])\n    os._exit(0)\ntime.sleep(0.3)\nprint('daemonised')",
    )
    .await;
    assert_ok(&r);
    let init = k.info().init_pid as i32;
    let tree: Vec<i32> = tree_of(init);
    let sleeper = tree
        .iter()
        .copied()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with("sleep\x00600"))
        })
        .expect("the daemon is still in the kernel's tree");
    k.kill().await;
    for pid in tree.iter().chain([&init, &sleeper]) {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} survived the kill"
        );
    }
}

#[tokio::test]
async fn sandbox_enforce_refuses_a_missing_layer_and_names_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut p = SandboxProfile::with_mode(SandboxMode::Enforce);
    p.disable = vec!["seccomp".into()];
    let mut cfg = config(&dir);
    cfg.sandbox = p;
    let err = Kernel::spawn(cfg).await.expect_err("enforce must refuse");
    match &err {
        KernelError::SandboxUnavailable { layer, reason, .. } => {
            assert_eq!(layer, "seccomp");
            assert!(reason.contains("disabled"), "{reason}");
        }
        other => panic!("unexpected error {other}"),
    }
    // The same profile in mode auto starts, and says what is missing.
    let p = SandboxProfile {
        disable: vec!["seccomp".into()],
        ..Default::default()
    };
    let k = sandboxed(&dir, p).await;
    let l = k.info().sandbox.layer("seccomp").expect("seccomp layer").clone();
    assert!(!l.enforced);
    k.kill().await;
}

#[tokio::test]
async fn sandbox_enforce_starts_when_every_layer_is_available() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.sandbox = SandboxProfile::with_mode(SandboxMode::Enforce);
    match Kernel::spawn(cfg).await {
        Ok(k) => {
            assert_eq!(run(&k, "print(6*7)").await.stdout, "42\n");
            k.kill().await;
        }
        Err(KernelError::SandboxUnavailable { layer, reason, .. }) => {
            eprintln!("skipped: this machine lacks layer {layer}: {reason}");
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn sandbox_interrupt_reaches_the_main_thread_in_the_namespace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = sandboxed(&dir, SandboxProfile::default()).await;
    let h = k
        .submit(
            "import time\nfor _ in range(600):\n    time.sleep(0.1)",
            ExecOptions::default(),
        )
        .expect("submit");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let o = k.interrupt().await;
    assert!(o.delivered, "{o:?}");
    let r = h.wait().await.expect("result");
    assert_eq!(r.status, CellStatus::Interrupted, "{r:#?}");
    assert_eq!(run(&k, "print('still here')").await.stdout, "still here\n");
    k.kill().await;
}

#[tokio::test]
async fn sandbox_matplotlib_font_cache_is_built_once_by_the_host() {
    if missing_module("matplotlib") {
        return;
    }
    // The host builds the cache in the background on the first sandboxed
    // spawn of this interpreter; later kernels get it as MPLCONFIGDIR.
    let dir = tempfile::tempdir().expect("tempdir");
    let deadline = Instant::now() + Duration::from_secs(180);
    let (k, cache) = loop {
        let k = sandboxed(&dir, SandboxProfile::default()).await;
        let r = run(&k, "import os; print(os.environ.get('MPLCONFIGDIR', ''))").await;
        let cache = r.stdout.trim().to_string();
        if !cache.is_empty() {
            break (k, cache);
        }
        k.kill().await;
        assert!(Instant::now() < deadline, "the font cache was never built");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let r = run(
        &k,
        "import time, matplotlib\nt = time.time()\nimport matplotlib.font_manager\nprint(matplotlib.get_cachedir())\nprint(time.time() - t < 5)",
    )
    .await;
    assert_ok(&r);
    assert_eq!(r.stdout, format!("{cache}\nTrue\n"), "{r:#?}");
    assert!(!r.stderr.contains("building the font cache"), "{}", r.stderr);
    k.kill().await;
}

#[tokio::test]
async fn ipython_display_calls_become_displays() {
    if missing_module("IPython") {
        return;
    }
    let mut f = fixture();
    let r = f
        .run("from IPython.display import display, Markdown, HTML\ndisplay(Markdown('**b**'))\ndisplay(HTML('<i>x</i>'))")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "", "nothing falls back to a printed repr");
    assert_eq!(r.displays.len(), 2);
    assert_eq!(r.displays[0].data["text/markdown"], "**b**");
    assert_eq!(r.displays[1].data["text/html"], "<i>x</i>");
    f.session.shutdown().await;
}

#[tokio::test]
async fn stdout_reconfigure_is_accepted() {
    let mut f = fixture();
    let r = f
        .run("import sys\nsys.stdout.reconfigure(line_buffering=True)\nprint('ok')")
        .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "ok\n");
    f.session.shutdown().await;
}

// ---- templates (fork servers)

use cellhost_kernel::Template;

async fn template(dir: &TempDir, profile: SandboxProfile, preload: &[&str]) -> Template {
    let mut cfg = config(dir);
    cfg.sandbox = profile;
    Template::start(cfg, preload.iter().map(|s| s.to_string()).collect())
        .await
        .expect("template")
}

fn fork_config(dir: &TempDir, t: &Template, session: &str) -> KernelConfig {
    let mut cfg = t.config().clone();
    cfg.session = session.into();
    cfg.session_dir = dir.path().join(session);
    cfg
}

fn stack() -> Vec<&'static str> {
    if has_module("numpy") {
        vec!["json", "numpy"]
    } else {
        vec!["json"]
    }
}

#[tokio::test]
async fn template_forks_a_sandboxed_kernel_with_the_stack_loaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let preload = stack();
    let t = template(&dir, SandboxProfile::default(), &preload).await;
    assert_eq!(t.info().preloaded.len(), preload.len(), "{:?}", t.info());
    assert!(t.info().failed.is_empty());
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("fork");
    // The same layers a cold kernel reports, each enforced here; as another
    // user, in a user namespace of the kernel's own, and the control groups
    // exactly as far as a cold kernel of that user gets them.
    let root = rustix::process::geteuid().is_root();
    let cold = sandboxed(&dir, SandboxProfile::default()).await;
    let as_cold: &[&str] = if root { &[] } else { &["cgroup"] };
    common::assert_fork_layers_as_cold(&k, &cold, as_cold);
    let cgroup = k.info().sandbox.layer("cgroup").is_some_and(|l| l.enforced);
    cold.kill().await;
    if !root {
        // The kernel sees the user's own uid, as a cold kernel does.
        let r = run(&k, "import os\nprint(os.getuid(), os.geteuid())").await;
        let me = rustix::process::getuid().as_raw();
        assert_eq!(r.stdout, format!("{me} {me}\n"), "{r:#?}");
    }
    let r = run(
        &k,
        "import os, sys\nprint(os.getpid(), 'numpy' in sys.modules, os.getcwd() == os.environ.get('PWD', os.getcwd()))",
    )
    .await;
    assert_ok(&r);
    let want_np = if preload.contains(&"numpy") {
        "True"
    } else {
        "False"
    };
    assert_eq!(r.stdout, format!("2 {want_np} True\n"));
    assert_eq!(k.info().generation, t.config().generation);
    // The host knows the worker's real pid (namespace pid 2).
    let ns = cellhost_sandbox::procfs::ns_pids(k.info().pid as i32);
    assert_eq!(ns.last(), Some(&2), "{ns:?}");
    assert_eq!(k.info().template, Some(t.info().pid));
    assert_eq!(k.info().output_rings, vec!["stdout", "stderr"]);
    let r = run(&k, "import sys\nsys.stdout.write('r' * 300000)").await;
    assert_eq!(
        r.truncated.get("stdout").map(|t| t.total_bytes),
        Some(300000),
        "{:?}",
        r.truncated
    );
    // Its cgroup namespace is rooted at its own group, which holds it.
    let r = run(&k, "print(open('/proc/self/cgroup').read().count('cellhost'))").await;
    assert_eq!(r.stdout, "0\n", "{r:#?}");
    let init = k.info().init_pid as i32;
    let pid = k.info().pid;
    let procs = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    assert!(
        !cgroup || procs.contains("cellhost"),
        "the worker is not in its kernel's group: {procs}"
    );
    k.kill().await;
    assert!(cellhost_sandbox::procfs::descendants(init).is_empty());
}

#[tokio::test]
async fn template_kernels_share_nothing_with_each_other_or_the_template() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&dir, SandboxProfile::default(), &stack()).await;
    let a = t.fork(fork_config(&dir, &t, "a")).await.expect("fork a");
    let r = run(
        &a,
        "import json, os\nsecret = 41\njson.leak = 'a'\nopen('/tmp/a-only', 'w').write('x')\nos.environ['A_ONLY'] = '1'",
    )
    .await;
    assert_ok(&r);
    let b = t.fork(fork_config(&dir, &t, "b")).await.expect("fork b");
    let r = run(
        &b,
        "import json, os\nprint('secret' in globals(), hasattr(json, 'leak'), os.path.exists('/tmp/a-only'), 'A_ONLY' in os.environ)",
    )
    .await;
    assert_eq!(r.stdout, "False False False False\n", "{r:#?}");
    // b cannot see or signal a: own pid namespace.
    let pid_a = a.info().pid;
    let r = run(&b, &format!("import os\nprint(os.path.exists('/proc/{pid_a}'), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")).await;
    assert!(r.stdout.starts_with("False [1, 2"), "{r:#?}");
    // Each kernel has its own random state.
    let code = "import random\nprint(random.random())";
    let (ra, rb) = (run(&a, code).await.stdout, run(&b, code).await.stdout);
    assert_ne!(ra, rb);
    if has_module("numpy") {
        let code = "import numpy as np\nprint(np.random.rand())";
        let (ra, rb) = (run(&a, code).await.stdout, run(&b, code).await.stdout);
        assert_ne!(ra, rb, "numpy's global generator must be reseeded per kernel");
    }
    // The template itself is untouched: a third fork is as fresh as the second.
    let c = t.fork(fork_config(&dir, &t, "c")).await.expect("fork c");
    let r = run(
        &c,
        "import json\nprint('secret' in globals(), hasattr(json, 'leak'))",
    )
    .await;
    assert_eq!(r.stdout, "False False\n");
    for k in [a, b, c] {
        k.kill().await;
    }
}

#[tokio::test]
async fn template_kernel_keeps_the_sandbox_promises() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let t = template(&dir, SandboxProfile::default(), &["json"]).await;
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("fork");
    let code = format!(
        r#"import os, socket, ctypes
out = []
for p in [{home:?} + '/cellhost-escape', '/var/tmp/cellhost-escape', '/usr/cellhost-escape']:
    try:
        open(p, 'w').write('x'); out.append('wrote ' + p)
    except OSError as e:
        # EACCES (Landlock), EROFS or ENOENT (not in the kernel's root).
        out.append('blocked')
try:
    socket.create_connection(('1.1.1.1', 53), timeout=1); out.append('net')
except OSError as e:
    out.append('nonet')
libc = ctypes.CDLL(None, use_errno=True)
out.append('ptrace ' + str(libc.ptrace(16, 1, 0, 0)))
out.append('unshare ' + str(libc.unshare(0x20000000)))
open('written-in-workdir', 'w').write('ok')
print(' '.join(out))"#
    );
    let r = run(&k, &code).await;
    assert_ok(&r);
    assert_eq!(
        r.stdout, "blocked blocked blocked nonet ptrace -1 unshare -1\n",
        "{r:#?}"
    );
    assert!(dir.path().join("written-in-workdir").exists());
    k.kill().await;
}

/// As another user every forked kernel has a user namespace of its own
/// (the template makes none for itself); as root it stays in the host's.
/// Either way neither the worker nor pid 1 of its namespace (the ns-init,
/// which mounted the kernel's root) keeps a capability, ambient ones
/// included.
#[tokio::test]
async fn template_kernel_has_its_own_user_namespace_and_no_capability() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = rustix::process::geteuid().is_root();
    let t = template(&dir, SandboxProfile::default(), &["json"]).await;
    let a = t.fork(fork_config(&dir, &t, "a")).await.expect("fork a");
    let b = t.fork(fork_config(&dir, &t, "b")).await.expect("fork b");
    let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/user")).expect("user namespace link");
    let host = ns(std::process::id());
    let (na, nb) = (ns(a.info().pid), ns(b.info().pid));
    assert_eq!(
        ns(t.info().pid),
        host,
        "the template stays in the host's user namespace"
    );
    if root {
        assert_eq!((&na, &nb), (&host, &host));
    } else {
        assert_ne!(na, host);
        assert_ne!(na, nb, "two forked kernels share a user namespace");
    }
    let code = "caps = {}\nfor pid in ('self', '1'):\n    for line in open('/proc/%s/status' % pid):\n        k, _, v = line.partition(':')\n        if k in ('CapInh', 'CapPrm', 'CapEff', 'CapAmb'):\n            caps[pid + ' ' + k] = int(v, 16)\nprint(sorted(k for k, v in caps.items() if v), len(caps))";
    for k in [&a, &b] {
        let r = run(k, code).await;
        assert_ok(&r);
        assert_eq!(r.stdout, "[] 8\n", "capabilities held in the kernel: {r:#?}");
    }
    a.kill().await;
    b.kill().await;
}

#[tokio::test]
async fn template_kernel_interrupts_keep_state_and_kill_reaps_the_tree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&dir, SandboxProfile::default(), &stack()).await;
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("fork");
    assert_ok(&run(&k, "x = 7").await);
    let h = k
        .submit(
            "import time\nwhile True: time.sleep(0.01)",
            ExecOptions::default(),
        )
        .expect("submit");
    // Wait until the cell runs, then interrupt it.
    loop {
        if h.peek().await.is_some_and(|p| p.state == "running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let out = h.interrupt().await;
    assert!(out.delivered, "{out:?}");
    let r = h.wait().await.expect("result");
    assert_eq!(r.status, CellStatus::Interrupted);
    assert_eq!(
        run(&k, "x")
            .await
            .result
            .and_then(|b| b.get("text/plain").cloned()),
        Some("7".into())
    );
    // A daemonised grandchild dies with the kernel.
    let r = run(
        &k,
        "import subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\nprint('ok')",
    )
    .await;
    assert_ok(&r);
    let init = k.info().init_pid as i32;
    let tree: Vec<i32> = tree_of(init);
    assert!(tree.len() >= 3, "init's tree: {tree:?}");
    k.kill().await;
    for p in tree {
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists() || is_zombie_free(p),
            "{p} survived"
        );
    }
    assert!(!k.is_alive());
}

fn is_zombie_free(pid: i32) -> bool {
    // Gone, or reaped by now: a pid still listed must not be one of ours.
    std::fs::read_to_string(format!("/proc/{pid}/status")).map_or(true, |s| !s.contains("sleep"))
}

#[tokio::test]
async fn template_blas_threads_survive_the_fork() {
    if missing_module("numpy") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&dir, SandboxProfile::default(), &["numpy"]).await;
    // numpy's OpenBLAS has started its pool in the template: there are
    // threads whose locks a careless fork would copy mid-use (with one CPU
    // OpenBLAS starts no pool: nothing to park, the rest still holds).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores > 1 {
        assert!(t.info().threads >= 2, "{:?}", t.info());
    }
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("fork");
    let threads = "len(__import__('os').listdir('/proc/self/task'))";
    let before = run(&k, &format!("print({threads})")).await.stdout;
    // Right after the fork the worker has only its own threads; a BLAS call
    // starts the pool again and computes the right answer (no deadlock on a
    // lock a parked thread held).
    let r = run(
        &k,
        "import numpy as np, os\na = np.random.rand(400, 400)\nfor _ in range(20):\n    b = a @ a\nprint(np.allclose(b, a.dot(a)))",
    )
    .await;
    assert_ok(&r);
    assert_eq!(r.stdout, "True\n");
    // The pool is running again in the child (on a machine with more than
    // one core, OpenBLAS uses more than the calling thread).
    let after = run(&k, &format!("print({threads})")).await.stdout;
    let (before, after): (usize, usize) = (
        before.trim().parse().expect("count"),
        after.trim().parse().expect("count"),
    );
    eprintln!("worker threads before the first BLAS call {before}, after {after}");
    if cores > 1 {
        assert!(
            after > before,
            "BLAS threads did not come back: {before} -> {after}"
        );
    }
    let k2 = t.fork(fork_config(&dir, &t, "b")).await.expect("fork b");
    let r = run(
        &k2,
        "import numpy as np\nprint(float((np.eye(300) @ np.eye(300)).trace()))",
    )
    .await;
    assert_eq!(r.stdout, "300.0\n", "{r:#?}");
    k.kill().await;
    k2.kill().await;
}

#[tokio::test]
async fn template_retired_while_its_kernels_live() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&dir, SandboxProfile::off(), &["json"]).await;
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("fork");
    assert_eq!(k.info().sandbox.mode, SandboxMode::Off);
    assert_ok(&run(&k, "y = 1").await);
    let tpid = t.info().pid;
    drop(t);
    for _ in 0..400 {
        if !std::path::Path::new(&format!("/proc/{tpid}")).exists()
            || std::fs::read_to_string(format!("/proc/{tpid}/stat")).is_ok_and(|s| s.contains(") Z"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = run(&k, "y + 1").await;
    assert_eq!(
        r.result.and_then(|b| b.get("text/plain").cloned()),
        Some("2".into())
    );
    // A crash is still reported with its cause.
    let r = run(&k, "import os\nos._exit(3)").await;
    assert_eq!(r.status, CellStatus::Crashed);
    assert!(
        k.exit_reason().unwrap_or_default().contains('3'),
        "{:?}",
        k.exit_reason()
    );
}

#[tokio::test]
async fn template_refuses_another_interpreter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&dir, SandboxProfile::off(), &[]).await;
    let mut cfg = fork_config(&dir, &t, "a");
    cfg.python = "/usr/bin/env".into();
    let e = t.fork(cfg).await.expect_err("another interpreter");
    assert!(matches!(e, KernelError::InvalidRequest(_)), "{e:?}");
}

#[tokio::test]
async fn template_reports_modules_it_cannot_import() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = template(&dir, SandboxProfile::off(), &["json", "no_such_module_xyz"]).await;
    assert_eq!(t.info().preloaded, vec!["json".to_string()]);
    assert!(t.info().failed["no_such_module_xyz"].contains("ModuleNotFoundError"));
    let k = t.fork(fork_config(&dir, &t, "a")).await.expect("fork");
    assert_ok(&run(&k, "import json").await);
    k.kill().await;
}

/// An interrupt right after the submit usually reaches the host before the
/// worker's `started`: the frame goes alone and the worker's reader thread
/// cancels the cell (or signals its main thread); the session is kept and
/// nothing escalates.
#[tokio::test]
async fn interrupt_before_started_keeps_the_session() {
    let mut f = fixture();
    let first = f.run("state = 'kept'").await;
    assert_ok(&first);
    for round in 0..5 {
        let h = f
            .session
            .submit(
                "import time\ntime.sleep(60)\nstate = 'late'",
                ExecOptions::default(),
            )
            .await
            .expect("submit");
        let k = f.session.kernel().cloned().expect("kernel");
        let out = k.interrupt().await;
        assert!(out.delivered, "round {round}: {out:?}");
        let r = f.session.finish(h).await.expect("result");
        assert_eq!(r.status, CellStatus::Interrupted, "round {round}: {r:#?}");
        let i = r.interrupt.expect("report");
        assert!(!i.escalated && i.state_kept, "round {round}: {i:#?}");
    }
    let r = f.run("print(state)").await;
    assert_eq!(r.stdout, "kept\n");
    assert_eq!(r.kernel.pid, first.kernel.pid);
    assert!(!r.kernel.state_reset);
    f.session.shutdown().await;
}
