//! Where a `cellhost serve` a test started listens, read from its stderr.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// Reads the piped stderr of `child` (a `cellhost serve`) on a thread of
/// its own, line by line, and waits at most `within` (a hang guard) for
/// the line `serving http://ADDR/…`. Returns ADDR (`None` when it was not
/// said by then) and the receiver of the lines after it.
///
/// # Panics
/// When the child's stderr is not piped.
pub fn serve_address(child: &mut Child, within: Duration) -> (Option<String>, Receiver<String>) {
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut addr = None;
    let until = Instant::now() + within;
    while addr.is_none() && Instant::now() < until {
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(1))
            && let Some(rest) = line.split("serving http://").nth(1)
        {
            addr = rest.split('/').next().map(str::to_string);
        }
    }
    (addr, rx)
}
