//! Process checks of the tests that kill hosts, agents and kernels, read
//! from `/proc`.

use std::path::Path;
use std::time::Duration;

/// The process is gone or a zombie (a zombie runs nothing).
pub fn pid_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z')),
    }
}

/// Polls /proc until `pid` is gone (at most 30 s).
pub fn wait_gone(pid: i32) -> bool {
    for _ in 0..600 {
        if pid_gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The parent of `pid` (from /proc); `None` when it is gone.
pub fn ppid(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// Polls until the file at `path` holds a line ending in a newline (what a
/// cell writes there, at most 60 s) and returns its text.
///
/// # Panics
/// When nothing was written by then.
pub fn wait_line(path: &Path) -> String {
    for _ in 0..1200 {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{} never written", path.display());
}
