//! Shared by the placement tests: the stand-in agent and waiting for what
//! it reports.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cellhost_placement::{CREDENTIAL_PLACEHOLDER, PlacementRequest};

/// The stand-in agent script (tests/fixtures/stand-in-agent.sh).
pub fn stand_in() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stand-in-agent.sh")
}

/// A fresh token per request (`cellhost-<hex>`), unique across runs.
pub fn token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("cellhost-{:x}{:x}{n:x}", std::process::id(), nanos)
}

/// A request running the stand-in agent, which reports into `marker_dir`.
pub fn stand_in_request(marker_dir: &Path, credential: &[u8]) -> PlacementRequest {
    PlacementRequest {
        token: token(),
        session: "placement-test".to_owned(),
        generation: 1,
        agent_argv: vec![
            stand_in().display().to_string(),
            marker_dir.display().to_string(),
            "--credential".to_owned(),
            CREDENTIAL_PLACEHOLDER.to_owned(),
        ],
        credential: credential.to_vec(),
        env: BTreeMap::from([(
            "CELLHOST_STANDIN_VAR".to_owned(),
            "it's passed; $HOME stays literal".to_owned(),
        )]),
        queue_timeout: Duration::from_secs(120),
    }
}

/// Waits up to `limit` for the stand-in's marker file and parses it.
pub fn wait_marker(dir: &Path, limit: Duration) -> Option<BTreeMap<String, String>> {
    let path = dir.join("marker");
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            return Some(
                text.lines()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            );
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid in `dir/name`.
pub fn read_pid(dir: &Path, name: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(name)).ok()?.trim().parse().ok()
}

/// A pidfd for `pid`, opened while it runs (so its end is an event).
pub fn pidfd(pid: i32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Waits up to `limit` for the process behind `fd` to end; `true` if it did.
pub fn wait_gone(fd: &OwnedFd, limit: Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let timeout = rustix::event::Timespec::try_from(limit).ok();
    matches!(poll(&mut fds, timeout.as_ref()), Ok(n) if n > 0)
}
