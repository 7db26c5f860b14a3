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

/// The sandbox layers not in force, said once per kernel (on the first
/// cell it runs).
pub fn degradation(r: &CellResult) -> Option<String> {
    if r.kernel.reused {
        return None;
    }
    r.kernel.sandbox.degradation()
}

/// One-line notes about a result, in the order a reader needs them.
pub fn notes(r: &CellResult) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(line) = degradation(r) {
        v.push(line);
    }
    if let Some(back) = &r.restored {
        v.push(back.summary());
    }
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
    if let Some(d) = &r.displays_dropped {
        v.push(format!(
            "displays not kept: {} dropped ({} bytes) over the cell's display limit, {} withheld because their data contained a registered secret",
            d.count, d.bytes, d.withheld
        ));
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
    if let Some(f) = r.fault {
        v.push(format!("fault: {f}: {}", f.explain()));
    }
    if r.status != CellStatus::Ok
        && let Some(h) = &r.hint
    {
        v.push(format!("hint: {h}"));
    }
    v
}

/// Bytes of each stream written live before the terminal waits for the
/// result: the 40 % head of the default 50,000-byte inline view.
pub const LIVE_HEAD_BYTES: usize = 20_000;

/// Writes live output to the terminal as it arrives, at most
/// [`LIVE_HEAD_BYTES`] per stream, until the cell's sender is dropped.
/// Returns what it wrote, per stream (`[stdout, stderr]`), so
/// [`print_rest`] can finish from the bounded result without repeating it.
pub async fn print_live(mut rx: mpsc::UnboundedReceiver<LiveEvent>) -> [String; 2] {
    let mut printed = [String::new(), String::new()];
    while let Some(ev) = rx.recv().await {
        let (idx, text) = match ev {
            LiveEvent::Stdout(t) => (0, t),
            LiveEvent::Stderr(t) => (1, t),
            LiveEvent::Display(_) => continue,
        };
        let room = LIVE_HEAD_BYTES.saturating_sub(printed[idx].len());
        if room == 0 {
            continue;
        }
        let mut cut = text.len().min(room);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let part = &text[..cut];
        if idx == 0 {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(part.as_bytes());
            let _ = o.flush();
        } else {
            let _ = std::io::stderr().lock().write_all(part.as_bytes());
        }
        printed[idx].push_str(part);
    }
    printed
}

/// Ends a cell whose output streamed live: the whole result as JSON with
/// `json`, else the rest of the bounded view and the result. Returns the
/// exit code of the cell's status.
pub fn finish_streamed(printed: &[String; 2], r: &CellResult, json: bool) -> u8 {
    if json {
        if let Some(line) = degradation(r) {
            eprintln!("cellhost: {line}");
        }
        match serde_json::to_string_pretty(r) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("cellhost: cannot encode the result: {e}"),
        }
    } else {
        print_rest(printed, r);
        print_result(r, true);
    }
    r.status.exit_code() as u8
}

/// Writes the part of the result's bounded streams that the live view did
/// not show (for a cut stream: the omission line and the tail).
pub fn print_rest(printed: &[String; 2], r: &CellResult) {
    for (idx, full) in [&r.stdout, &r.stderr].into_iter().enumerate() {
        let shown = &printed[idx];
        let common = shown
            .bytes()
            .zip(full.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let mut start = common;
        while !full.is_char_boundary(start) {
            start -= 1;
        }
        let rest = &full[start..];
        if rest.is_empty() {
            continue;
        }
        if idx == 0 {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(rest.as_bytes());
            let _ = o.flush();
        } else {
            let _ = std::io::stderr().lock().write_all(rest.as_bytes());
        }
    }
}
