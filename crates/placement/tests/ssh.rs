//! The SSH placement against a loopback `sshd` (openssh-server) started
//! per test on a free port, with a generated host key and the current
//! user's key in a temporary `authorized_keys`. Every test prints why it is
//! skipped when `sshd` or `ssh-keygen` is missing.

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cellhost_placement::ssh::{SshOptions, SshPlacement};
use cellhost_placement::{PlacedState, Placement, PlacementError};

const WAIT: Duration = Duration::from_secs(60);
const SSHD: &str = "/usr/sbin/sshd";

/// A loopback sshd; killed and reaped on drop.
struct Sshd {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
    user: String,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(cmd: &mut Command) -> bool {
    matches!(cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status(), Ok(s) if s.success())
}

impl Sshd {
    fn start() -> Option<Sshd> {
        if !Path::new(SSHD).exists() || Command::new("ssh-keygen").arg("-?").output().is_err() {
            eprintln!(
                "skipped: {SSHD} or ssh-keygen is missing (apt-get install openssh-server openssh-client)"
            );
            return None;
        }
        let dir = match tempfile::Builder::new().prefix("cellhost-sshd-").tempdir() {
            Ok(d) => d,
            Err(e) => panic!("temp dir: {e}"),
        };
        let d = dir.path();
        for key in ["host_key", "client_key"] {
            assert!(
                run(Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                    .arg(d.join(key))),
                "ssh-keygen {key}"
            );
        }
        let copy = std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys"));
        assert!(copy.is_ok(), "authorized_keys: {copy:?}");
        let user = match Command::new("id").arg("-un").output() {
            Ok(o) => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            Err(e) => panic!("id -un: {e}"),
        };
        // A free port: bound, then released for sshd.
        let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
            Ok(a) => a.port(),
            Err(e) => panic!("free port: {e}"),
        };
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile none\n\
             AuthorizedKeysFile {ak}\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             PermitRootLogin prohibit-password\nAllowUsers {user}\nLogLevel INFO\n",
            hk = d.join("host_key").display(),
            ak = d.join("authorized_keys").display(),
        );
        assert!(std::fs::write(d.join("sshd_config"), config).is_ok());
        if rustix::process::geteuid().is_root() {
            // sshd's privilege separation directory (Debian's default path).
            let _ = std::fs::create_dir_all("/run/sshd");
        }
        let mut child = match Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => panic!("sshd: {e}"),
        };
        // Ready once it says so; its later log lines are drained by a thread.
        let Some(stderr) = child.stderr.take() else {
            panic!("sshd stderr")
        };
        let mut lines = BufReader::new(stderr).lines();
        let mut said = Vec::new();
        let ready = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    let listening = line.contains("Server listening");
                    said.push(line);
                    if listening {
                        break true;
                    }
                }
                _ => break false,
            }
        };
        let mut sshd = Sshd {
            dir,
            child,
            port,
            user,
        };
        if !ready {
            let _ = sshd.child.kill();
            let _ = sshd.child.wait();
            panic!("sshd did not start: {said:?}");
        }
        std::thread::spawn(move || for _ in lines.by_ref() {});
        let host_pub = match std::fs::read_to_string(sshd.dir.path().join("host_key.pub")) {
            Ok(s) => s,
            Err(e) => panic!("host key: {e}"),
        };
        let known = format!("[127.0.0.1]:{} {}", sshd.port, host_pub.trim());
        assert!(std::fs::write(sshd.path("known_hosts"), known + "\n").is_ok());
        Some(sshd)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn options(&self) -> SshOptions {
        SshOptions {
            host: "127.0.0.1".to_owned(),
            port: Some(self.port),
            user: Some(self.user.clone()),
            identity: Some(self.path("client_key")),
            known_hosts: Some(self.path("known_hosts")),
            remote_dir: Some(self.path("remote").display().to_string()),
            kill_grace_secs: Some(2),
            ..SshOptions::default()
        }
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
    let p = placement(sshd.options());
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
    let p = placement(sshd.options());
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
    let p = placement(sshd.options());
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
    let p = placement(sshd.options());
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
    let p = placement(sshd.options());
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
