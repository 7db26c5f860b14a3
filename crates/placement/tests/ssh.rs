//! The SSH placement against a loopback `sshd` (openssh-server) started
//! per test on a free port, with a generated host key and the current
//! user's key in a temporary `authorized_keys`. Every test prints why it is
//! skipped when `sshd` or `ssh-keygen` is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cellhost_placement::ssh::{SshOptions, SshPlacement};
use cellhost_placement::{PlacedState, Placement, PlacementError};
use cellhost_testkit::sshd::Sshd;

const WAIT: Duration = Duration::from_secs(60);

/// Whether `cmd` ran and succeeded (its output discarded).
fn run(cmd: &mut Command) -> bool {
    matches!(cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status(), Ok(s) if s.success())
}

/// The SSH placement's options for `sshd`.
fn options(sshd: &Sshd) -> SshOptions {
    SshOptions {
        host: "127.0.0.1".to_owned(),
        port: Some(sshd.port),
        user: Some(sshd.user.clone()),
        identity: Some(sshd.path("client_key")),
        known_hosts: Some(sshd.path("known_hosts")),
        remote_dir: Some(sshd.path("remote").display().to_string()),
        kill_grace_secs: Some(2),
        ..SshOptions::default()
    }
}

fn placement(options: SshOptions) -> SshPlacement {
    match SshPlacement::new("box", options) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn markers() -> tempfile::TempDir {
    match tempfile::Builder::new().prefix("cellhost-ssh-marker-").tempdir() {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    }
}

/// Kills pids the test saw when it ends (the setsid grandchild the SSH
/// placement does not reach, and everything on failure).
struct Reap(Vec<i32>);
impl Drop for Reap {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

#[tokio::test]
async fn ssh_agent_gets_its_credential_through_stdin_as_a_0600_file_never_in_argv_or_env() {
    let Some(sshd) = Sshd::start() else { return };
    let p = placement(options(&sshd));
    let m = markers();
    let request = common::stand_in_request(m.path(), b"ssh-credential-7f3a");
    let placed = match p.place(&request).await {
        Ok(placed) => placed,
        Err(e) => panic!("place: {e}"),
    };
    let Some(marker) = common::wait_marker(m.path(), WAIT) else {
        panic!("the stand-in never ran")
    };
    let mut reap = Reap(vec![]);
    reap.0.extend(marker["pid"].parse::<i32>().ok());
    reap.0.extend(common::read_pid(m.path(), "child.pid"));
    reap.0.extend(common::read_pid(m.path(), "setsid.pid"));
    assert_eq!(placed.kind, "ssh");
    assert_eq!(placed.node.as_deref(), Some("127.0.0.1"));
    assert_eq!(marker["mode"], "600");
    assert_eq!(marker["credential"], "ssh-credential-7f3a");
    assert_eq!(
        marker["credential_path"],
        p.remote_credential_path(&request.token)
    );
    assert_eq!(marker["standin_var"], "it's passed; $HOME stays literal");
    // It runs in a process group of its own (its wrapper's), named in the placement.
    assert_eq!(placed.job, format!("{}/{}", request.token, marker["pgid"]));
    assert_ne!(marker["pgid"], std::process::id().to_string());
    // Neither the agent's command line nor its environment holds the credential.
    let pid = &marker["pid"];
    for file in ["cmdline", "environ"] {
        let bytes = std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default();
        assert!(!bytes.is_empty(), "/proc/{pid}/{file}");
        assert!(
            !String::from_utf8_lossy(&bytes).contains("ssh-credential-7f3a"),
            "{file}"
        );
    }
    assert_eq!(
        p.state(&placed).await,
        Ok(PlacedState::Running {
            node: Some("127.0.0.1".to_owned())
        })
    );
    assert_eq!(p.cancel(&placed).await, Ok(()));
}

#[tokio::test]
async fn ssh_cancel_kills_the_agents_process_group_and_removes_the_credential() {
    let Some(sshd) = Sshd::start() else { return };
    let p = placement(options(&sshd));
    let m = markers();
    let request = common::stand_in_request(m.path(), b"c");
    let placed = match p.place(&request).await {
        Ok(placed) => placed,
        Err(e) => panic!("place: {e}"),
    };
    let Some(marker) = common::wait_marker(m.path(), WAIT) else {
        panic!("the stand-in never ran")
    };
    let agent: Option<i32> = marker["pid"].parse().ok();
    let child = common::read_pid(m.path(), "child.pid");
    let setsid = common::read_pid(m.path(), "setsid.pid");
    let _reap = Reap([agent, child, setsid].into_iter().flatten().collect());
    let (Some(agent), Some(child)) = (agent, child) else {
        panic!("{marker:?}")
    };
    let fds = [common::pidfd(agent), common::pidfd(child)];
    let credential = PathBuf::from(p.remote_credential_path(&request.token));
    assert!(credential.exists());
    assert_eq!(p.cancel(&placed).await, Ok(()));
    for (fd, pid) in fds.iter().zip([agent, child]) {
        let Some(fd) = fd else { panic!("pidfd {pid}") };
        assert!(common::wait_gone(fd, WAIT), "process {pid} outlived cancel");
    }
    assert!(!credential.exists());
    assert!(matches!(p.state(&placed).await, Ok(PlacedState::Ended { .. })));
    // Cancelling again is not an error.
    assert_eq!(p.cancel(&placed).await, Ok(()));
}

#[tokio::test]
async fn ssh_place_twice_with_one_token_starts_one_agent() {
    let Some(sshd) = Sshd::start() else { return };
    let p = placement(options(&sshd));
    let m = markers();
    let request = common::stand_in_request(m.path(), b"c");
    let first = p.place(&request).await;
    let second = p.place(&request).await;
    let Ok(first) = first else { panic!("{first:?}") };
    let Some(marker) = common::wait_marker(m.path(), WAIT) else {
        panic!("the stand-in never ran")
    };
    let _reap = Reap(
        [
            marker["pid"].parse().ok(),
            common::read_pid(m.path(), "child.pid"),
            common::read_pid(m.path(), "setsid.pid"),
        ]
        .into_iter()
        .flatten()
        .collect(),
    );
    assert_eq!(second, Ok(first.clone()));
    assert_eq!(p.cancel(&first).await, Ok(()));
}

#[tokio::test]
async fn ssh_refuses_a_host_whose_key_is_not_the_known_one() {
    let Some(sshd) = Sshd::start() else { return };
    // known_hosts holds another key for this host and port.
    let other = sshd.path("other_key");
    assert!(run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)));
    let other_pub = std::fs::read_to_string(other.with_extension("pub")).unwrap_or_default();
    let line = format!("[127.0.0.1]:{} {}\n", sshd.port, other_pub.trim());
    assert!(std::fs::write(sshd.path("known_hosts"), line).is_ok());
    let p = placement(options(&sshd));
    let m = markers();
    let request = common::stand_in_request(m.path(), b"c");
    match p.place(&request).await {
        Err(PlacementError::Unavailable { kind, message }) => {
            assert_eq!(kind, "ssh");
            assert!(message.contains("Host key verification failed"), "{message}");
        }
        other => panic!("expected the host key to be refused, got {other:?}"),
    }
    assert!(!Path::new(&p.remote_credential_path(&request.token)).exists());
}

#[tokio::test]
async fn ssh_agent_that_exits_reports_its_exit_status_and_leaves_no_credential() {
    let Some(sshd) = Sshd::start() else { return };
    let p = placement(options(&sshd));
    let m = markers();
    let mut request = common::stand_in_request(m.path(), b"c");
    request.agent_argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        "test -s \"$0\" && exit 7".to_owned(),
        "{credential}".to_owned(),
    ];
    let placed = match p.place(&request).await {
        Ok(placed) => placed,
        Err(e) => panic!("place: {e}"),
    };
    let start = std::time::Instant::now();
    let state = loop {
        match p.state(&placed).await {
            Ok(PlacedState::Running { .. }) if start.elapsed() < WAIT => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    };
    assert_eq!(
        state,
        Ok(PlacedState::Ended {
            detail: "exited with status 7".to_owned()
        })
    );
    assert!(!Path::new(&p.remote_credential_path(&request.token)).exists());
    assert_eq!(p.cancel(&placed).await, Ok(()));
}
