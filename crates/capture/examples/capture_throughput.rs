//! Throughput of the capture pipeline alone (no pipe, no process):
//! `cargo run --release -p cellhost-capture --example capture_throughput [MB]`.
//!
//! Feeds `MB` megabytes of 100-byte lines in 1 MiB pieces through a
//! [`StreamCapture`] with the default redactor and limits (taking the text
//! with `push_with`, as the kernel's driver does), and prints MB/s.

use std::sync::Arc;
use std::time::Instant;

use cellhost_capture::{RedactionConfig, Redactor, StreamCapture, StreamLimits};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mb: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let line = format!("{}\n", "x".repeat(99));
    let piece = line.repeat((1 << 20) / 100 + 1);
    let piece = &piece.as_bytes()[..1 << 20];
    let redactor = Arc::new(Redactor::new(RedactionConfig::default())?);
    let dir = std::env::temp_dir().join(format!("capture-throughput-{}", std::process::id()));
    let mut cap = StreamCapture::new(StreamLimits::stdout_default(), redactor, Some(dir.join("out")));
    let total = mb * 1_000_000;
    let t = Instant::now();
    let mut fed = 0;
    let mut live = 0;
    while fed < total {
        let n = piece.len().min(total - fed);
        // As the kernel driver does without a live subscriber: look at the
        // pieces, copy nothing.
        cap.push_with(&piece[..n], |text| live += text.len());
        fed += n;
    }
    let done = cap.finish();
    live += done.live_tail.len();
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{mb} MB in {secs:.3} s: {:.0} MB/s ({live} bytes out)",
        total as f64 / 1e6 / secs
    );
    Ok(())
}
