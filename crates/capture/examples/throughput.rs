//! Capture throughput, without a benchmark harness.
//!
//! Pushes output through the whole library path (UTF-8 decode, terminal
//! rendering, redaction with one registered secret and the pattern set,
//! head/tail, spill file of 50 MB) in 64 KiB pieces, as a pipe reader would,
//! and prints MB/s (10^6 bytes per second of input):
//!
//! * 1 GB of `"x" * 99 + "\n"` lines;
//! * one 100 MB line without a newline;
//! * 100 MB of log lines that contain pattern triggers (`tokens`, `api_key`)
//!   and colour escapes, so every line runs the regexes;
//! * the same 1 GB of lines with the whole stream spilled (no cap), and
//!   with redaction disabled, for comparison.
//!
//! Run with `cargo run --release -p cellhost-capture --example throughput`.
//! An optional argument scales the sizes (e.g. `0.1`).

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use cellhost_capture::{RedactionConfig, Redactor, StreamCapture, StreamLimits};

const PIECE: usize = 64 * 1024;
/// The default spill cap (50 MB).
const CAP: u64 = 50_000_000;

/// Peak resident set size of this process in KiB (Linux), if known.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> Result<(), Box<dyn Error>> {
    let scale: f64 = std::env::args().nth(1).map_or(Ok(1.0), |a| a.parse())?;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let size = |bytes: f64| ((bytes * scale) as usize).max(PIECE);
    let dir = std::env::temp_dir().join(format!("cellhost-capture-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let spill = dir.join("stdout.spill");

    let redactor = Arc::new(Redactor::new(RedactionConfig {
        secrets: vec!["sk-demo-3f9a1c7e5b2d4a6f8e0c".into()],
        ..RedactionConfig::default()
    })?);
    let mut line = vec![b'x'; 99];
    line.push(b'\n');
    let lines_1g = size(1e9);
    let result = (|| -> Result<(), Box<dyn Error>> {
        run(
            "1 GB of 100-byte lines (redaction on)",
            &line,
            lines_1g,
            redactor.clone(),
            &spill,
            CAP,
        )?;
        run(
            "one 100 MB line (redaction on)",
            b"x",
            size(100.0 * 1024.0 * 1024.0),
            redactor.clone(),
            &spill,
            CAP,
        )?;
        run(
            "100 MB of log lines that trigger patterns",
            b"epoch 3 step 1234 loss=0.4312 tokens/s=10234 api_key=None grad_norm=1.21 \x1b[32mok\x1b[0m\n",
            size(100e6),
            redactor.clone(),
            &spill,
            CAP,
        )?;
        run(
            "1 GB of 100-byte lines, all spilled",
            &line,
            lines_1g,
            redactor.clone(),
            &spill,
            u64::MAX,
        )?;
        run(
            "1 GB of 100-byte lines (redaction off)",
            &line,
            lines_1g,
            Arc::new(Redactor::disabled()),
            &spill,
            CAP,
        )?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    if let Some(kib) = peak_rss_kib() {
        println!("peak RSS of this process: {:.1} MiB", kib as f64 / 1024.0);
    }
    Ok(())
}

/// Feeds `total` bytes of `pattern` repeated, in pieces of 64 KiB cut at
/// varying points of the pattern, and prints the throughput.
fn run(
    name: &str,
    pattern: &[u8],
    total: usize,
    redactor: Arc<Redactor>,
    spill: &std::path::Path,
    spill_cap: u64,
) -> Result<(), Box<dyn Error>> {
    // `pattern.len()` pieces' worth of whole patterns, fed PIECE bytes at a time.
    let buf: Vec<u8> = pattern
        .iter()
        .copied()
        .cycle()
        .take(PIECE * pattern.len())
        .collect();
    let limits = StreamLimits {
        spill_bytes: spill_cap,
        ..StreamLimits::stdout_default()
    };
    let mut cap = StreamCapture::new(limits, redactor, Some(spill.to_path_buf()));
    let start = Instant::now();
    let mut fed = 0;
    let mut off = 0;
    let mut live = 0usize;
    while fed < total {
        let n = PIECE.min(total - fed);
        if off + n > buf.len() {
            off = 0;
        }
        live += cap.push(&buf[off..off + n]).len();
        off += n;
        fed += n;
    }
    let done = cap.finish();
    live += done.live_tail.len();
    let secs = start.elapsed().as_secs_f64();
    let t = done.truncation.ok_or("expected a truncated result")?;
    if t.total_bytes != live as u64 || (!pattern.contains(&0x1b) && live != total) {
        return Err(format!(
            "{name}: rendered {} bytes, live {live}, fed {total}",
            t.total_bytes
        )
        .into());
    }
    #[allow(clippy::cast_precision_loss)]
    let mbps = total as f64 / 1e6 / secs;
    println!(
        "{name:<40} {:>8.1} MB in {secs:>6.2} s = {mbps:>7.0} MB/s  (inline {} bytes, spill {} bytes)",
        total as f64 / 1e6,
        done.text.len(),
        t.spill_bytes
    );
    Ok(())
}
