//! The driver over a scripted in-memory link: no process, no pipe; the
//! test plays the worker (frames and output bytes) and checks what the
//! driver does with them.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cellhost_protocol::{HostFrame, PROTOCOL_VERSION, ProtocolError, WorkerFrame};

use crate::cell::ExecOptions;
use crate::config::KernelConfig;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::link::fake::{FakeLink, Script};
use crate::link::{Launch, LinkEvent, Stream};
use crate::result::CellStatus;

const SIGKILL_STATUS: i32 = 9;

struct Fixture {
    kernel: Kernel,
    script: Script,
    _dir: tempfile::TempDir,
}

async fn fixture(interrupt: Result<(), String>, grace: Duration) -> Fixture {
    fixture_with(interrupt, grace, crate::runtime::default_runtime()).await
}

async fn fixture_with(
    interrupt: Result<(), String>,
    grace: Duration,
    runtime: std::sync::Arc<dyn crate::runtime::WorkerRuntime>,
) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = KernelConfig::new("/nonexistent/interpreter", dir.path().join("session"));
    cfg.session = "fake".into();
    cfg.runtime = runtime;
    cfg.interrupt_grace = grace;
    let (link, mut script) = FakeLink::new(interrupt, ExitStatus::from_raw(SIGKILL_STATUS));
    script.push(LinkEvent::Frame(WorkerFrame::Ready {
        pid: 4242,
        python: "fake 1.0".into(),
        executable: String::new(),
        protocol: PROTOCOL_VERSION,
        rings: Vec::new(),
    }));
    let launch = Launch {
        label: cfg.label(),
        sandboxed: false,
        host_layers: Vec::new(),
        template: None,
        limits: None,
        placement: None,
    };
    let kernel = Kernel::attach(cfg, link, launch)
        .await
        .expect("handshake over the fake link");
    Fixture {
        kernel,
        script,
        _dir: dir,
    }
}

/// The next `execute` frame: (cell id, start marker, end marker).
async fn next_cell(script: &mut Script) -> (String, String, String) {
    match script.sent().await {
        HostFrame::Execute { id, marker, .. } => {
            let start = marker.replacen("cellhost-end-", "cellhost-start-", 1);
            (id, start, marker)
        }
        other => panic!("expected an execute frame, got {other:?}"),
    }
}

fn response(id: &str, status: &str, execution_count: u64) -> LinkEvent {
    LinkEvent::Frame(WorkerFrame::Response {
        id: id.into(),
        status: status.into(),
        execution_count,
        result: None,
        error: None,
        usage: None,
        cwd: None,
        sigint_handler: None,
        files: None,
        result_at: None,
    })
}

fn started(id: &str) -> LinkEvent {
    LinkEvent::Frame(WorkerFrame::Started { id: id.into() })
}

#[tokio::test]
async fn a_cell_settles_only_on_its_response_and_both_end_markers() {
    let mut f = fixture(Ok(()), Duration::from_secs(2)).await;
    assert_eq!(f.kernel.info().pid, 4242);
    let h = f
        .kernel
        .submit("print('hi')", ExecOptions::default())
        .expect("submit");
    let (id, start, end) = next_cell(&mut f.script).await;
    assert_eq!(id, h.id());
    f.script.push(started(&id));
    f.script.output(Stream::Stdout, format!("{start}hi\n{end}"));
    f.script.output(Stream::Stderr, start.clone());
    f.script.drained().await;
    let p = h.peek().await.expect("progress");
    assert_eq!(p.state, "running", "no response yet");
    assert_eq!(p.stdout_tail, "hi\n");

    f.script.push(response(&id, "ok", 1));
    f.script.drained().await;
    let p = h.peek().await.expect("progress");
    assert_eq!(p.state, "running", "the stderr end marker is missing");

    f.script.output(Stream::Stderr, format!("oops\n{end}"));
    let r = h.wait().await.expect("result");
    assert_eq!(r.status, CellStatus::Ok);
    assert_eq!(r.stdout, "hi\n");
    assert_eq!(r.stderr, "oops\n");
    assert_eq!(r.execution_count, 1);
    assert!(r.background_output.is_none());
    assert_eq!(r.kernel.pid, 4242);
    assert!(f.kernel.is_alive());
}

#[tokio::test]
async fn a_malformed_frame_crashes_the_cell_and_kills_the_kernel() {
    let mut f = fixture(Ok(()), Duration::from_secs(2)).await;
    let h = f.kernel.submit("x", ExecOptions::default()).expect("submit");
    let (id, start, _) = next_cell(&mut f.script).await;
    f.script.push(started(&id));
    f.script.output(Stream::Stdout, format!("{start}half"));
    f.script.push(LinkEvent::ControlError(ProtocolError::Malformed {
        detail: "expected value".into(),
        preview: "{not json".into(),
    }));
    let r = h.wait().await.expect("result");
    assert_eq!(r.status, CellStatus::Crashed);
    let crash = r.crash.expect("crash report");
    assert!(crash.message.contains("protocol error"), "{}", crash.message);
    assert!(crash.message.contains("malformed frame"), "{}", crash.message);
    assert_eq!(r.stdout, "half");
    assert_eq!(
        f.script.terminations.load(Ordering::SeqCst),
        1,
        "the tree was killed"
    );
    assert!(!f.kernel.is_alive());
    match f.kernel.execute("y", ExecOptions::default()).await {
        Err(KernelError::Dead { reason, .. }) => assert!(reason.contains("killed"), "{reason}"),
        other => panic!("a dead kernel took a cell: {other:?}"),
    }
}

#[tokio::test]
async fn a_worker_that_dies_before_it_takes_the_cell_says_not_started() {
    let mut f = fixture(Ok(()), Duration::from_secs(2)).await;
    let h = f.kernel.submit("x = 1", ExecOptions::default()).expect("submit");
    let _ = next_cell(&mut f.script).await;
    // No `started`: the worker was already dying when the cell was sent.
    f.script.push(LinkEvent::ControlClosed);
    f.script.push(LinkEvent::OutputClosed(Stream::Stdout));
    f.script.push(LinkEvent::OutputClosed(Stream::Stderr));
    f.script
        .push(LinkEvent::Exited(ExitStatus::from_raw(libc::SIGKILL)));
    let r = h.wait().await.expect("result");
    assert_eq!(r.status, CellStatus::Crashed);
    let crash = r.crash.expect("crash report");
    assert_eq!(
        crash.reason.as_deref(),
        Some(crate::result::CRASH_NOT_STARTED),
        "{crash:?}"
    );
}

#[tokio::test]
async fn a_link_that_dies_mid_cell_gives_a_crash_with_the_exit_status() {
    let mut f = fixture(Ok(()), Duration::from_secs(2)).await;
    let h = f.kernel.submit("boom()", ExecOptions::default()).expect("submit");
    let (id, start, _) = next_cell(&mut f.script).await;
    f.script.push(started(&id));
    f.script.output(Stream::Stdout, format!("{start}partial"));
    f.script.push(LinkEvent::ControlClosed);
    f.script.push(LinkEvent::OutputClosed(Stream::Stdout));
    f.script.push(LinkEvent::OutputClosed(Stream::Stderr));
    f.script
        .push(LinkEvent::Exited(ExitStatus::from_raw(libc::SIGSEGV)));
    let r = h.wait().await.expect("result");
    assert_eq!(r.status, CellStatus::Crashed);
    let crash = r.crash.expect("crash report");
    assert_eq!(crash.signal, Some(libc::SIGSEGV));
    assert!(crash.message.contains("SIGSEGV"), "{}", crash.message);
    assert_eq!(crash.reason, None, "the cell had started");
    assert_eq!(r.stdout, "partial");
    assert!(r.hint.is_some_and(|h| h.contains("worker died")));
    assert_eq!(
        f.script.terminations.load(Ordering::SeqCst),
        0,
        "nobody killed it"
    );
    assert!(!f.kernel.is_alive());
    assert!(matches!(
        f.kernel.submit("y", ExecOptions::default()),
        Err(KernelError::Dead { .. })
    ));
}

#[tokio::test]
async fn an_interrupt_that_is_not_delivered_escalates_after_the_grace() {
    let mut f = fixture(Err("no such thread".into()), Duration::from_millis(50)).await;
    let h = f
        .kernel
        .submit("while True: pass", ExecOptions::default())
        .expect("submit");
    let (id, start, _) = next_cell(&mut f.script).await;
    f.script.push(started(&id));
    f.script.output(Stream::Stdout, start.clone());
    f.script.drained().await;
    let out = h.interrupt().await;
    assert!(!out.delivered);
    assert_eq!(out.cell.as_deref(), Some(id.as_str()));
    assert!(
        out.reason
            .as_deref()
            .is_some_and(|r| r.contains("no such thread")),
        "{out:?}"
    );
    match f.script.sent().await {
        HostFrame::Interrupt { id: i, signalled } => {
            assert_eq!(i, id);
            assert!(!signalled, "the wake-up failed, the frame says so");
        }
        other => panic!("expected an interrupt frame, got {other:?}"),
    }
    // The worker never answers: after the grace the driver probes, then
    // kills the tree.
    match f.script.sent().await {
        HostFrame::Interrupt { signalled, .. } => assert!(signalled, "the probe"),
        other => panic!("expected the probe, got {other:?}"),
    }
    let r = h.wait().await.expect("result");
    assert_eq!(r.status, CellStatus::Interrupted);
    let i = r.interrupt.expect("interrupt report");
    assert!(!i.delivered);
    assert!(i.escalated);
    assert!(!i.state_kept);
    assert!(
        i.reason.as_deref().is_some_and(|r| r.contains("did not answer")),
        "{i:?}"
    );
    assert!(r.crash.is_none());
    assert_eq!(f.script.terminations.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn output_after_the_end_marker_goes_to_the_next_results_background() {
    let mut f = fixture(Ok(()), Duration::from_secs(2)).await;
    let h = f.kernel.submit("one", ExecOptions::default()).expect("submit");
    let (id, start, end) = next_cell(&mut f.script).await;
    f.script.push(started(&id));
    f.script
        .output(Stream::Stdout, format!("{start}one\n{end}late\n"));
    f.script.output(Stream::Stderr, format!("{start}{end}"));
    f.script.push(response(&id, "ok", 1));
    let r1 = h.wait().await.expect("first result");
    assert_eq!(r1.stdout, "one\n");
    assert!(r1.background_output.is_none());

    // Between cells: output of no cell.
    f.script.output(Stream::Stdout, "later\n");
    f.script.drained().await;

    let h = f.kernel.submit("two", ExecOptions::default()).expect("submit");
    let (id, start, end) = next_cell(&mut f.script).await;
    f.script.push(started(&id));
    f.script.output(Stream::Stdout, format!("{start}two\n{end}"));
    f.script.output(Stream::Stderr, format!("{start}{end}"));
    f.script.push(response(&id, "ok", 2));
    let r2 = h.wait().await.expect("second result");
    assert_eq!(r2.stdout, "two\n");
    assert_eq!(r2.execution_count, 2);
    let bg = r2.background_output.expect("background output");
    assert_eq!(bg.stdout, "late\nlater\n");
    assert_eq!(bg.stderr, "");
}

/// An interrupt that reaches the host after `execute` went out but before
/// the worker's `started`: the frame goes alone. A worker that reads frames
/// only between cells (R) gets the wake-up as soon as it says `started`,
/// so the cell stops with its state kept instead of being escalated to a
/// tree kill after the grace; a worker with a reader thread (Python) acts
/// on the frame itself and gets no second signal.
#[tokio::test]
async fn an_interrupt_before_started_is_woken_on_started_for_a_worker_without_a_reader() {
    for (runtime, wakeups) in [
        (
            std::sync::Arc::new(crate::runtime::r::RRuntime)
                as std::sync::Arc<dyn crate::runtime::WorkerRuntime>,
            1,
        ),
        (crate::runtime::default_runtime(), 0),
    ] {
        let name = runtime.name();
        // A grace long enough that only a missing wake-up could escalate.
        let mut f = fixture_with(Ok(()), Duration::from_secs(600), runtime).await;
        let h = f
            .kernel
            .submit("Sys.sleep(60)", ExecOptions::default())
            .expect("submit");
        let (id, start, end) = next_cell(&mut f.script).await;
        let out = h.interrupt().await;
        assert!(out.delivered, "{name}: {out:?}");
        match f.script.sent().await {
            HostFrame::Interrupt { id: i, signalled } => {
                assert_eq!(i, id);
                assert!(!signalled, "{name}: no wake-up before started");
            }
            other => panic!("expected an interrupt frame, got {other:?}"),
        }
        assert_eq!(f.script.wakeups.load(Ordering::SeqCst), 0, "{name}");
        f.script.push(started(&id));
        f.script.output(Stream::Stdout, start.clone());
        f.script.output(Stream::Stderr, start.clone());
        f.script.drained().await;
        assert_eq!(f.script.wakeups.load(Ordering::SeqCst), wakeups, "{name}");
        f.script.output(Stream::Stdout, end.clone());
        f.script.output(Stream::Stderr, end.clone());
        f.script.push(response(&id, "interrupted", 1));
        let r = h.wait().await.expect("result");
        assert_eq!(r.status, CellStatus::Interrupted, "{name}");
        let i = r.interrupt.expect("interrupt report");
        assert!(i.delivered && !i.escalated && i.state_kept, "{name}: {i:?}");
        assert_eq!(f.script.terminations.load(Ordering::SeqCst), 0, "{name}");
        assert!(f.kernel.is_alive(), "{name}");
    }
}
