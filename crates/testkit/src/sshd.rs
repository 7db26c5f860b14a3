//! A loopback `sshd` (openssh-server) for the SSH placement's tests: its
//! own config, host key and `authorized_keys` in a temporary directory, a
//! free port on 127.0.0.1, this user allowed by key only. Started by the
//! test, killed and reaped on drop. `None` (with the reason printed) when
//! `sshd` or `ssh-keygen` is missing.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const SSHD: &str = "/usr/sbin/sshd";

/// A running loopback sshd.
pub struct Sshd {
    dir: tempfile::TempDir,
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The account it lets in (this user).
    pub user: String,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn quiet(cmd: &mut Command) -> bool {
    matches!(cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status(), Ok(s) if s.success())
}

impl Sshd {
    /// Starts one; `None` when openssh-server is not installed.
    pub fn start() -> Option<Sshd> {
        if !Path::new(SSHD).exists() || Command::new("ssh-keygen").arg("-?").output().is_err() {
            eprintln!(
                "skipped: {SSHD} or ssh-keygen is missing (apt-get install openssh-server openssh-client)"
            );
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("cellhost-sshd-")
            .tempdir_in("/var/tmp")
            .expect("sshd dir");
        let d = dir.path();
        for key in ["host_key", "client_key"] {
            assert!(
                quiet(
                    Command::new("ssh-keygen")
                        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                        .arg(d.join(key))
                ),
                "ssh-keygen {key}"
            );
        }
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).expect("authorized_keys");
        let user = Command::new("id").arg("-un").output().expect("id -un");
        let user = String::from_utf8_lossy(&user.stdout).trim().to_owned();
        // A free port: bound, then released for sshd.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile none\n\
             AuthorizedKeysFile {ak}\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             PermitRootLogin prohibit-password\nAllowUsers {user}\nLogLevel INFO\n",
            hk = d.join("host_key").display(),
            ak = d.join("authorized_keys").display(),
        );
        std::fs::write(d.join("sshd_config"), config).expect("sshd_config");
        if rustix::process::geteuid().is_root() {
            // sshd's privilege separation directory (Debian's default path).
            let _ = std::fs::create_dir_all("/run/sshd");
        }
        let mut child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sshd");
        let stderr = child.stderr.take().expect("sshd stderr");
        let sshd = Sshd {
            dir,
            child,
            port,
            user,
        };
        // Ready once it says so; its later log lines are drained by a thread.
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
        assert!(ready, "sshd did not start: {said:?}");
        std::thread::spawn(move || for _ in lines.by_ref() {});
        let host_pub = std::fs::read_to_string(sshd.path("host_key.pub")).expect("host key");
        let known = format!("[127.0.0.1]:{} {}\n", sshd.port, host_pub.trim());
        std::fs::write(sshd.path("known_hosts"), known).expect("known_hosts");
        Some(sshd)
    }

    /// A file of its directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A `[placement.NAME]` table of kind `ssh` for this sshd, the agent
    /// `agent` (this build's `cellhost`), with extra `key = value` lines.
    pub fn table(&self, agent: &str, extra: &str) -> String {
        format!(
            "kind = \"ssh\"\nhost = \"127.0.0.1\"\nport = {}\nuser = {:?}\nidentity = {:?}\nknown_hosts = {:?}\nremote_dir = {:?}\nkill_grace_secs = 2\nagent = {:?}\n{extra}",
            self.port,
            self.user,
            self.path("client_key").display().to_string(),
            self.path("known_hosts").display().to_string(),
            self.path("remote").display().to_string(),
            agent,
        )
    }
}
