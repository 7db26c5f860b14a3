//! The worker binds what it needs before any cell (or preloaded module)
//! runs: what a cell breaks in builtins, stdlib modules, tracing, signals
//! or descriptors changes its own later cells at most, never the worker's
//! protocol. The escape suite (`crates/cli/tests/escape/hostile_code.rs`)
//! runs the long list through the daemon; these are the kernel-level
//! regressions with the details a list cannot check.

use std::time::Duration;

use cellhost_kernel::{CellResult, CellStatus, ExecOptions, Kernel};
use cellhost_sandbox::profile::SandboxProfile;

use super::{config, fork_config, template};

async fn run(k: &Kernel, code: &str) -> CellResult {
    k.execute(code, ExecOptions::default()).await.expect("execute")
}

fn plain(r: &CellResult) -> Option<String> {
    r.result
        .as_ref()
        .and_then(|b| b.get("text/plain"))
        .and_then(|v| v.as_str())
        .map(str::to_string)
}

/// Kills the kernel when the test ends, also when it fails.
struct Guard(Kernel);

impl Drop for Guard {
    fn drop(&mut self) {
        let k = self.0.clone();
        // Drop runs inside the test's runtime: kill without awaiting it.
        tokio::spawn(async move { k.kill().await });
    }
}

#[tokio::test]
async fn a_cell_that_wipes_builtins_and_patches_json_leaves_the_protocol_working() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = Guard(Kernel::spawn(config(&dir)).await.expect("spawn"));
    let r = run(
        &k.0,
        "x = 20\nimport json, os, builtins\njson.dumps = json.loads = None\nos.write = print\nd = vars(builtins)\nsaved = dict(d)\nd.clear()",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    // No builtin is left, but arithmetic, the result and the count go on.
    let r = run(&k.0, "x * 2 + 2").await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    assert_eq!(plain(&r).as_deref(), Some("42"));
    assert_eq!(r.execution_count, 2);
    // An error is still formatted (NameError: `print` is gone).
    let r = run(&k.0, "print('x')").await;
    assert_eq!(r.status, CellStatus::Error, "{r:#?}");
    let e = r.error.as_ref().expect("error");
    assert_eq!(e.ename, "NameError", "{e:?}");
    assert!(e.traceback.iter().any(|l| l.contains("<cell-3>")), "{e:?}");
    // Putting the builtins back is the cell's business, and it works.
    let r = run(&k.0, "d.update(saved)\nprint('back', len('abc'))").await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    assert_eq!(r.stdout, "back 3\n");
}

#[tokio::test]
async fn hostile_values_settle_with_fallbacks_not_dead_kernels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = Guard(Kernel::spawn(config(&dir)).await.expect("spawn"));
    // NaN is not JSON: the rich entry is dropped with a note, the text kept.
    let r = run(
        &k.0,
        "class E:\n    def _repr_json_(self): return {'a': float('nan')}\n    def __repr__(self): return 'E()'\nE()",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    let b = r.result.as_ref().expect("result");
    assert!(b.get("application/json").is_none(), "{b:?}");
    let text = b["text/plain"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("E()") && text.contains("could not be encoded"),
        "{text}"
    );
    // A __repr__ that raises or returns a non-string: a fallback repr.
    let r = run(
        &k.0,
        "class R:\n    def __repr__(self): raise RuntimeError('nope')\nR()",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    let text = plain(&r).unwrap_or_default();
    assert!(text.contains("repr failed: RuntimeError: nope"), "{text}");
    let r = run(&k.0, "class N:\n    def __repr__(self): return 42\nN()").await;
    assert!(plain(&r).unwrap_or_default().contains("non-string"), "{r:#?}");
    // An exception whose __str__ raises SystemExit, in a class whose
    // metaclass lies about its name: an error with the real class name.
    let r = run(
        &k.0,
        "class M(type):\n    @property\n    def __name__(cls): raise SystemExit('name')\nclass X(Exception, metaclass=M):\n    def __str__(self): raise SystemExit('str')\nraise X()",
    )
    .await;
    assert_eq!(r.status, CellStatus::Error, "{r:#?}");
    assert_eq!(r.error.as_ref().map(|e| e.ename.as_str()), Some("X"), "{r:#?}");
    // An error message over the frame cap: cut (by the worker to fit the
    // frame, then by the host to its error bound), said so, not lost.
    let r = run(&k.0, "raise ValueError('e' * (80 * 1024 * 1024))").await;
    assert_eq!(r.status, CellStatus::Error, "{r:#?}");
    let e = r.error.as_ref().expect("error");
    assert!(
        e.evalue.len() < 1024 * 1024 && e.evalue.starts_with("eeee") && e.evalue.contains("bytes cut]"),
        "{}",
        e.evalue.len()
    );
    let r = run(&k.0, "6 * 7").await;
    assert_eq!(plain(&r).as_deref(), Some("42"), "{r:#?}");
}

#[tokio::test]
async fn a_cell_that_ignores_and_blocks_sigint_can_still_be_interrupted_next_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = Guard(Kernel::spawn(config(&dir)).await.expect("spawn"));
    let r = run(
        &k.0,
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\ny = 5",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    // The worker re-arms its handler and unblocks SIGINT for every cell: a
    // timeout interrupts the loop and the namespace survives.
    let opts = ExecOptions {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let r =
        k.0.execute("while True: time.sleep(0.01)", opts)
            .await
            .expect("execute");
    assert_eq!(r.status, CellStatus::Timeout, "{r:#?}");
    let i = r.interrupt.as_ref().expect("interrupt report");
    assert!(i.delivered && !i.escalated && i.state_kept, "{i:?}");
    let r = run(&k.0, "y").await;
    assert_eq!(plain(&r).as_deref(), Some("5"), "{r:#?}");
}

#[tokio::test]
async fn a_cells_tracer_and_recursion_limit_are_its_own_not_the_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = Guard(Kernel::spawn(config(&dir)).await.expect("spawn"));
    let r = run(
        &k.0,
        "import sys\nseen = []\ndef t(frame, ev, arg):\n    seen.append(frame.f_code.co_filename)\nsys.settrace(t)\nsys.setrecursionlimit(40)",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    // The next cell runs traced and with its limit, as a cell that set them
    // expects; the worker's code between the two cells was not traced.
    let r = run(
        &k.0,
        "def f(): pass\nn = len(seen)\nf()\nsys.settrace(None)\n(len(seen) > n, sys.getrecursionlimit(), [s for s in seen if 'cellhost_worker' in s])",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    assert_eq!(plain(&r).as_deref(), Some("(True, 40, [])"), "{r:#?}");
    // A deep error still gets its traceback formatted under the low limit.
    let r = run(&k.0, "def g(n): return g(n + 1)\ng(0)").await;
    assert_eq!(r.status, CellStatus::Error, "{r:#?}");
    assert_eq!(r.error.as_ref().map(|e| e.ename.as_str()), Some("RecursionError"));
    // A tracer that raises, set at a cell's end, raises in the cell's
    // next cell (an honest error there, not in the worker), and the
    // interpreter drops it: the cell after that is clean.
    let r = run(
        &k.0,
        "def bad(*a):\n    raise RuntimeError('tracer')\nsys.settrace(bad)",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    let r = run(&k.0, "1 + 1").await;
    assert_eq!(r.status, CellStatus::Error, "{r:#?}");
    assert_eq!(
        r.error.as_ref().map(|e| e.evalue.as_str()),
        Some("tracer"),
        "{r:#?}"
    );
    let r = run(&k.0, "print('clean'); 2 + 2").await;
    assert_eq!(r.stdout, "clean\n", "{r:#?}");
    assert_eq!(plain(&r).as_deref(), Some("4"), "{r:#?}");
    assert_eq!(r.execution_count, 6);
}

#[tokio::test]
async fn closing_or_replacing_the_control_descriptor_is_repaired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = Guard(Kernel::spawn(config(&dir)).await.expect("spawn"));
    let find = "import os, socket\nsocks = sorted(fd for fd in map(int, os.listdir('/proc/self/fd')) if fd > 2 and os.path.exists('/proc/self/fd/%d' % fd) and os.readlink('/proc/self/fd/%d' % fd).startswith('socket:'))\n";
    let r = run(&k.0, &format!("{find}os.close(socks[0])\nz = 1")).await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    let r = run(
        &k.0,
        &format!("{find}a, b = socket.socketpair()\nos.dup2(a.fileno(), socks[0])\nz += 1"),
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    let r = run(&k.0, "print('still here'); z").await;
    assert_eq!(r.stdout, "still here\n", "{r:#?}");
    assert_eq!(plain(&r).as_deref(), Some("2"), "{r:#?}");
    assert_eq!(r.execution_count, 3);
}

#[tokio::test]
async fn a_preloaded_module_that_patches_the_stdlib_cannot_change_forked_kernels() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The template imports this from its cwd (the kernel's directory).
    std::fs::write(
        dir.path().join("cellhost_hostile_preload.py"),
        "import json, signal, threading, traceback, sys\njson.dumps = json.loads = None\nsignal.signal = None\nthreading.Thread = None\ntraceback.TracebackException = None\nsys.modules['queue'] = None\n",
    )
    .expect("write module");
    let t = template(&dir, SandboxProfile::off(), &["cellhost_hostile_preload"]).await;
    assert_eq!(
        t.info().preloaded,
        vec!["cellhost_hostile_preload".to_string()],
        "{:?}",
        t.info()
    );
    let k = Guard(t.fork(fork_config(&dir, &t, "a")).await.expect("fork"));
    let r = run(&k.0, "print('hi'); 6 * 7").await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    assert_eq!(r.stdout, "hi\n");
    assert_eq!(plain(&r).as_deref(), Some("42"));
    // Tracebacks come from the formatter bound before the preload ran.
    let r = run(&k.0, "1/0").await;
    let e = r.error.as_ref().expect("error");
    assert!(e.traceback.iter().any(|l| l.trim() == "1/0"), "{e:?}");
}

#[tokio::test]
async fn inspecting_a_hostile_namespace_answers_and_keeps_the_kernel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = Guard(Kernel::spawn(config(&dir)).await.expect("spawn"));
    // A metaclass that lies about names and equality, a non-str key in
    // the namespace, a list subclass with a hostile __len__.
    let r = run(
        &k.0,
        "class M(type):\n    def __getattribute__(cls, n): raise SystemExit(n)\n    def __eq__(cls, o): raise SystemExit('eq')\n    __hash__ = type.__hash__\nclass E(metaclass=M):\n    pass\nclass L(list):\n    def __len__(self): raise SystemExit('len')\ne = E()\nl = L([1])\nglobals()[7] = 'seven'\nok = 1",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    let vars = k.0.inspect_variables(100).await.expect("variables");
    let names: Vec<&str> = vars.variables.iter().filter_map(|v| v["name"].as_str()).collect();
    assert!(
        names.contains(&"ok") && names.contains(&"e") && names.contains(&"l"),
        "{names:?}"
    );
    let e = vars.variables.iter().find(|v| v["name"] == "e").expect("e");
    assert_eq!(e["type"], "__main__.E", "{e}");
    let r = run(&k.0, "ok + 1").await;
    assert_eq!(plain(&r).as_deref(), Some("2"), "{r:#?}");
}
