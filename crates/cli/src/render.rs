//! Human-readable rendering of a cell result for the terminal.

use std::io::Write;

use cellhost_kernel::{CellResult, CellStatus, LiveEvent};
use tokio::sync::mpsc;

/// Writes what the live stream did not show: the result value to stdout;
/// the error and notes (truncation, interrupt, crash, state reset,
/// background output, figures) to stderr. With `streamed == false` the
/// streams themselves are written first.
pub fn print_result(r: &CellResult, streamed: bool) {
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    if !streamed {
        let _ = out.write_all(r.stdout.as_bytes());
        let _ = err.write_all(r.stderr.as_bytes());
    }
    if let Some(plain) = r
        .result
        .as_ref()
        .and_then(|b| b.get("text/plain"))
        .and_then(|v| v.as_str())
    {
        let _ = writeln!(out, "{plain}");
    }
    let _ = out.flush();
    for note in notes(r) {
        let _ = writeln!(err, "cellhost: {note}");
    }
    if let Some(e) = &r.error {
        for line in &e.traceback {
            let _ = writeln!(err, "{line}");
        }
        if e.traceback.is_empty() {
            let _ = writeln!(err, "{}: {}", e.ename, e.evalue);
        }
    }
    let _ = err.flush();
}

/// One-line notes about a result, in the order a reader needs them.
pub fn notes(r: &CellResult) -> Vec<String> {
    let mut v = Vec::new();
    if r.kernel.state_reset {
        v.push(format!(
            "state reset: {} (a fresh kernel, generation {})",
            r.kernel.reset_reason.as_deref().unwrap_or("new kernel"),
            r.kernel.generation
        ));
    }
    if let Some(bg) = &r.background_output {
        if !bg.stdout.is_empty() {
            v.push(format!(
                "background stdout (from earlier cells' threads or children): {:?}",
                bg.stdout
            ));
        }
        if !bg.stderr.is_empty() {
            v.push(format!("background stderr: {:?}", bg.stderr));
        }
    }
    for d in &r.displays {
        for (mime, val) in &d.data {
            if let Some(p) = val.get("path").and_then(|p| p.as_str()) {
                v.push(format!(
                    "{mime} saved to {p} ({} bytes)",
                    val.get("bytes").and_then(|b| b.as_u64()).unwrap_or(0)
                ));
            }
        }
    }
    for (name, t) in &r.truncated {
        let spill = t
            .spill_path
            .as_ref()
            .map(|p| format!("; full output in {}", p.display()))
            .unwrap_or_default();
        v.push(format!(
            "{name} cut: {} of {} bytes shown{spill}",
            t.shown_bytes, t.total_bytes
        ));
    }
    if let Some(i) = &r.interrupt {
        v.push(format!(
            "{}: interrupt delivered={} escalated={} state_kept={}{}",
            r.status.as_str(),
            i.delivered,
            i.escalated,
            i.state_kept,
            i.reason.as_ref().map(|s| format!(" ({s})")).unwrap_or_default()
        ));
    }
    if let Some(c) = &r.crash {
        v.push(format!("crashed: {}", c.message));
    }
    if r.status != CellStatus::Ok
        && let Some(h) = &r.hint
    {
        v.push(format!("hint: {h}"));
    }
    v
}

/// Writes live output to the terminal as it arrives, until the cell's
/// sender is dropped.
pub async fn print_live(mut rx: mpsc::UnboundedReceiver<LiveEvent>) {
    while let Some(ev) = rx.recv().await {
        match ev {
            LiveEvent::Stdout(t) => {
                let mut o = std::io::stdout().lock();
                let _ = o.write_all(t.as_bytes());
                let _ = o.flush();
            }
            LiveEvent::Stderr(t) => {
                let _ = std::io::stderr().lock().write_all(t.as_bytes());
            }
            LiveEvent::Display(_) => {}
        }
    }
}
