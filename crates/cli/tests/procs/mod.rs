//! Process checks shared by the remote-kernel tests.

use std::time::Duration;

/// The process is gone or a zombie.
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
