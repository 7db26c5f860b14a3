//! The SSH placement: the node agent started on one remote box over the
//! OpenSSH client (`ssh`), for a single machine without a scheduler.
//!
//! # The connection
//! `ssh -T -o BatchMode=yes -o StrictHostKeyChecking=yes …`: never a
//! password or passphrase prompt, and the host's key must already be in
//! `known_hosts` (the configured file, else the user's own); an unknown or
//! changed key fails the placement with ssh's own message. `identity`
//! selects the key (`IdentitiesOnly=yes`), `user`/`port` the account.
//! `ssh_options` are passed as `-o` values, except those that would undo the
//! above ([`RESERVED_OPTIONS`]).
//!
//! # The credential
//! Sent as the ssh session's stdin. The remote script (POSIX `sh`) sets
//! `umask 077` before anything else and copies stdin into
//! `<remote_dir>/<token>/credential`, so the file is 0600 from its first
//! byte; it never appears on a command line (local or remote) or in an
//! environment. The agent's argv names that path in place of
//! [`CREDENTIAL_PLACEHOLDER`] (substituted on
//! the remote side, where the home directory is known). The file is removed
//! when the agent ends and on cancel.
//!
//! # The agent's process group
//! The agent runs under `setsid` as the leader of a new session and process
//! group, detached from the ssh session (stdin from `/dev/null`, output to
//! `<remote_dir>/<token>/log`), so the placement survives the connection;
//! its pid, which is the group id, goes to `<remote_dir>/<token>/pid` and
//! into [`Placed::job`] as `<token>/<pgid>`. The token's directory is created
//! with `mkdir` (atomic), which makes the token the idempotency key: a second
//! place of one token finds the directory and returns the agent already
//! there. [`Placement::cancel`] sends SIGTERM to the whole group, then
//! SIGKILL after [`SshOptions::kill_grace_secs`]; processes the agent moved
//! out of its group (its worker's own tree) are the agent's to end, as on a
//! local host — there is no scheduler cgroup here.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::command::{self, Invocation};
use crate::shell::{is_env_name, is_token, quote};
use crate::{CREDENTIAL_PLACEHOLDER, Placed, PlacedState, Placement, PlacementError, PlacementRequest};

/// Placement kind name.
pub const KIND: &str = "ssh";

/// ssh `-o` options that [`SshOptions::ssh_options`] may not set: they would
/// allow prompts, skip the host key check, or run local commands.
pub const RESERVED_OPTIONS: &[&str] = &[
    "batchmode",
    "stricthostkeychecking",
    "userknownhostsfile",
    "globalknownhostsfile",
    "passwordauthentication",
    "kbdinteractiveauthentication",
    "permitlocalcommand",
    "localcommand",
    "requesttty",
    "remotecommand",
];

/// The `[placement.<name>]` table of `kind = "ssh"`.
///
/// ```toml
/// [placement.box]
/// kind = "ssh"
/// host = "box.example.org"
/// user = "me"
/// identity = "/home/me/.ssh/cellhost_ed25519"
/// known_hosts = "/home/me/.ssh/known_hosts"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SshOptions {
    /// The remote box (a name or address ssh resolves, or a `Host` alias of
    /// the user's ssh config).
    pub host: String,
    /// TCP port (default: ssh's, usually 22).
    pub port: Option<u16>,
    /// Remote user (default: ssh's).
    pub user: Option<String>,
    /// Private key file (`-i`, with `IdentitiesOnly=yes`).
    pub identity: Option<PathBuf>,
    /// `UserKnownHostsFile`; the host's key must be in it.
    pub known_hosts: Option<PathBuf>,
    /// Remote directory for credentials, pid files and logs; relative to
    /// the remote home unless absolute. Default `.cellhost/ssh`.
    pub remote_dir: Option<String>,
    /// The ssh client (default `ssh` from `PATH`).
    pub ssh: Option<PathBuf>,
    /// Further `-o` options, `Name=value`, except [`RESERVED_OPTIONS`].
    #[serde(default)]
    pub ssh_options: Vec<String>,
    /// `ConnectTimeout`, in seconds (default 15).
    pub connect_timeout_secs: Option<u64>,
    /// How long one ssh command may take, in seconds (default 60).
    pub command_timeout_secs: Option<u64>,
    /// Seconds between SIGTERM and SIGKILL on cancel (default 5).
    pub kill_grace_secs: Option<u64>,
}

/// Starts node agents over ssh. See the module docs.
#[derive(Debug)]
pub struct SshPlacement {
    name: String,
    options: SshOptions,
    remote_dir: String,
    timeout: Duration,
}

/// Runs on the remote side: `sh -c PLACE_SCRIPT cellhost-place DIR TOKEN ARGV…`.
/// Prints `cellhost-pid <pgid>`; the environment's exports are prepended.
const PLACE_SCRIPT: &str = r#"set -eu
umask 077
dir=$1; token=$2; shift 2
case $dir in /*) ;; *) dir=$HOME/$dir ;; esac
mkdir -p -- "$dir"
d=$dir/$token
wait_pid() {
    i=0
    while [ ! -s "$d/pid" ]; do
        i=$((i + 1))
        if [ "$i" -gt 200 ]; then echo "cellhost: $d has no pid file" >&2; exit 3; fi
        sleep 0.05
    done
    echo "cellhost-pid $(cat -- "$d/pid")"
}
if ! mkdir -- "$d" 2>/dev/null; then
    cat >/dev/null
    wait_pid
    exit 0
fi
cat >"$d/credential"
cred=$d/credential
n=$#
while [ "$n" -gt 0 ]; do
    a=$1; shift; n=$((n - 1))
    case $a in
        *"{credential}"*) a=${a%%"{credential}"*}$cred${a#*"{credential}"} ;;
    esac
    set -- "$@" "$a"
done
cd -- "$d"
setsid sh -c 'echo $$ >pid.new && mv -f pid.new pid; "$@"; echo $? >status; rm -f credential' cellhost-agent "$@" </dev/null >"$d/log" 2>&1 &
wait_pid
"#;

/// `sh -c STATE_SCRIPT cellhost-state DIR PGID`: `running`, `ended <status>`
/// or `gone`.
const STATE_SCRIPT: &str = r#"dir=$1; pgid=$2
case $dir in /*) ;; *) dir=$HOME/$dir ;; esac
if kill -s 0 -- "-$pgid" 2>/dev/null; then echo running
elif [ -s "$dir/status" ]; then echo "ended $(cat -- "$dir/status")"
else echo gone
fi
"#;

/// `sh -c CANCEL_SCRIPT cellhost-cancel DIR PGID GRACE`: TERM, then KILL
/// after GRACE seconds, then the token's directory removed.
const CANCEL_SCRIPT: &str = r#"dir=$1; pgid=$2; grace=$3
case $dir in /*) ;; *) dir=$HOME/$dir ;; esac
if kill -s TERM -- "-$pgid" 2>/dev/null; then
    i=0
    while kill -s 0 -- "-$pgid" 2>/dev/null; do
        i=$((i + 1))
        if [ "$i" -gt $((grace * 20)) ]; then kill -s KILL -- "-$pgid" 2>/dev/null; break; fi
        sleep 0.05
    done
fi
rm -rf -- "$dir"
echo cancelled
"#;

impl SshPlacement {
    /// Checks the options of the table `name`.
    ///
    /// # Errors
    /// [`PlacementError::Config`] for an empty or `-`-led host or user, a
    /// reserved or malformed `ssh_options` entry, or a NUL byte.
    pub fn new(name: &str, options: SshOptions) -> Result<Self, PlacementError> {
        let config = |message: String| PlacementError::Config {
            name: name.to_owned(),
            message,
        };
        let bad_word = |s: &str| s.is_empty() || s.starts_with('-') || s.contains(['\0', ' ', '\n']);
        if bad_word(&options.host) {
            return Err(config(format!("host {:?} is not a host name", options.host)));
        }
        if let Some(user) = &options.user
            && (bad_word(user) || user.contains('@'))
        {
            return Err(config(format!("user {user:?} is not a user name")));
        }
        for opt in &options.ssh_options {
            let Some((key, _)) = opt.split_once('=') else {
                return Err(config(format!("ssh_options entry {opt:?} is not Name=value")));
            };
            if RESERVED_OPTIONS.contains(&key.trim().to_ascii_lowercase().as_str()) {
                return Err(config(format!(
                    "ssh_options may not set {key}: the placement sets it itself"
                )));
            }
            if opt.contains('\0') {
                return Err(config("ssh_options contain a NUL byte".to_owned()));
            }
        }
        let remote_dir = options
            .remote_dir
            .clone()
            .unwrap_or_else(|| ".cellhost/ssh".to_owned());
        if remote_dir.is_empty() || remote_dir.contains('\0') {
            return Err(config("remote_dir is empty or contains a NUL byte".to_owned()));
        }
        let timeout = Duration::from_secs(options.command_timeout_secs.unwrap_or(60).max(1));
        Ok(Self {
            name: name.to_owned(),
            options,
            remote_dir,
            timeout,
        })
    }

    fn config(&self, message: String) -> PlacementError {
        PlacementError::Config {
            name: self.name.clone(),
            message,
        }
    }

    /// The remote path (relative to the remote home unless absolute) of
    /// the credential file for `token`.
    pub fn remote_credential_path(&self, token: &str) -> String {
        format!("{}/{token}/credential", self.remote_dir)
    }

    /// `user@host` as reported in errors and [`Placed::node`].
    fn destination(&self) -> String {
        match &self.options.user {
            Some(user) => format!("{user}@{}", self.options.host),
            None => self.options.host.clone(),
        }
    }

    /// ssh's arguments up to and including the host.
    fn ssh_args(&self) -> Vec<OsString> {
        let o = &self.options;
        let mut args: Vec<OsString> = vec![
            "-T".into(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "StrictHostKeyChecking=yes".into(),
            "-o".into(),
            format!("ConnectTimeout={}", o.connect_timeout_secs.unwrap_or(15).max(1)).into(),
        ];
        if let Some(kh) = &o.known_hosts {
            let mut v = OsString::from("UserKnownHostsFile=");
            v.push(kh);
            args.extend(["-o".into(), v]);
        }
        if let Some(id) = &o.identity {
            args.extend(["-i".into(), id.clone().into_os_string()]);
            args.extend(["-o".into(), "IdentitiesOnly=yes".into()]);
        }
        if let Some(port) = o.port {
            args.extend(["-p".into(), port.to_string().into()]);
        }
        if let Some(user) = &o.user {
            args.extend(["-l".into(), user.into()]);
        }
        for opt in &o.ssh_options {
            args.extend(["-o".into(), opt.into()]);
        }
        args.push("--".into());
        args.push(o.host.clone().into());
        args
    }

    /// Runs `sh -c SCRIPT ARG0 WORDS…` on the remote box, stdin from `stdin`.
    async fn remote(
        &self,
        script: &str,
        arg0: &str,
        words: &[String],
        stdin: Option<&[u8]>,
    ) -> Result<command::Output, PlacementError> {
        // ssh joins its remote arguments with spaces for the remote user's
        // shell to parse: each word goes quoted.
        let mut line = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            quote(&self.name, "script", script)?,
        ];
        line.push(quote(&self.name, "argument", arg0)?);
        for w in words {
            line.push(quote(&self.name, "argument", w)?);
        }
        let mut args = self.ssh_args();
        args.push(line.join(" ").into());
        let program = self
            .options
            .ssh
            .clone()
            .map(PathBuf::into_os_string)
            .unwrap_or_else(|| OsString::from("ssh"));
        let out = command::run(Invocation {
            kind: KIND,
            program: &program,
            args,
            env: Vec::new(),
            stdin,
            timeout: self.timeout,
        })
        .await?;
        // 255: ssh itself failed (connection, authentication, host key).
        if out.status.code() == Some(255) {
            return Err(PlacementError::Unavailable {
                kind: KIND.to_owned(),
                message: format!("ssh to {}: {}", self.destination(), out.message()),
            });
        }
        Ok(out)
    }

    fn parse_job<'a>(&self, placed: &'a Placed) -> Result<(&'a str, &'a str), PlacementError> {
        let parsed = (placed.kind == KIND)
            .then(|| placed.job.split_once('/'))
            .flatten()
            .filter(|(token, pgid)| {
                is_token(token)
                    && !pgid.is_empty()
                    && pgid.chars().all(|c| c.is_ascii_digit())
                    && *pgid != "0"
                    && *pgid != "1"
            });
        parsed.ok_or_else(|| {
            self.config(format!(
                "{:?} of kind {:?} is not an ssh placement (<token>/<pgid>)",
                placed.job, placed.kind
            ))
        })
    }
}

impl Placement for SshPlacement {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn place(&self, request: &PlacementRequest) -> Result<Placed, PlacementError> {
        if !is_token(&request.token) {
            return Err(self.config(format!("token {:?} is not [A-Za-z0-9-]{{1,63}}", request.token)));
        }
        if request.agent_argv.is_empty()
            || !request
                .agent_argv
                .iter()
                .any(|a| a.contains(CREDENTIAL_PLACEHOLDER))
        {
            return Err(self.config(
                "the agent's argv is empty or does not name the credential file ({credential})".to_owned(),
            ));
        }
        let mut script = String::new();
        for (k, v) in &request.env {
            if !is_env_name(k) {
                return Err(self.config(format!("environment name {k:?} is not a valid name")));
            }
            script.push_str(&format!("export {k}={}\n", quote(&self.name, k, v)?));
        }
        script.push_str(PLACE_SCRIPT);
        let mut words = vec![self.remote_dir.clone(), request.token.clone()];
        words.extend(request.agent_argv.iter().cloned());
        let out = self
            .remote(&script, "cellhost-place", &words, Some(&request.credential))
            .await?;
        let pgid = out
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("cellhost-pid "))
            .map(str::trim)
            .find(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
        match (out.status.success(), pgid) {
            (true, Some(pgid)) => Ok(Placed {
                kind: KIND.to_owned(),
                job: format!("{}/{pgid}", request.token),
                node: Some(self.options.host.clone()),
            }),
            _ => Err(PlacementError::Rejected {
                kind: KIND.to_owned(),
                message: format!(
                    "the agent could not be started on {}: {}",
                    self.destination(),
                    out.message()
                ),
            }),
        }
    }

    async fn state(&self, placed: &Placed) -> Result<PlacedState, PlacementError> {
        let (token, pgid) = self.parse_job(placed)?;
        let dir = format!("{}/{token}", self.remote_dir);
        let out = self
            .remote(STATE_SCRIPT, "cellhost-state", &[dir, pgid.to_owned()], None)
            .await?;
        let said = out.stdout.trim();
        if said == "running" {
            Ok(PlacedState::Running {
                node: Some(self.options.host.clone()),
            })
        } else if let Some(status) = said.strip_prefix("ended ") {
            Ok(PlacedState::Ended {
                detail: format!("exited with status {status}"),
            })
        } else if said == "gone" {
            Ok(PlacedState::Ended {
                detail: "not running (killed or cancelled)".to_owned(),
            })
        } else {
            Err(PlacementError::Unavailable {
                kind: KIND.to_owned(),
                message: out.message(),
            })
        }
    }

    async fn cancel(&self, placed: &Placed) -> Result<(), PlacementError> {
        let (token, pgid) = self.parse_job(placed)?;
        let dir = format!("{}/{token}", self.remote_dir);
        let grace = self.options.kill_grace_secs.unwrap_or(5).to_string();
        let out = self
            .remote(
                CANCEL_SCRIPT,
                "cellhost-cancel",
                &[dir, pgid.to_owned(), grace],
                None,
            )
            .await?;
        if out.status.success() && out.stdout.contains("cancelled") {
            Ok(())
        } else {
            Err(PlacementError::Unavailable {
                kind: KIND.to_owned(),
                message: out.message(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> SshOptions {
        SshOptions {
            host: "box".to_owned(),
            ..SshOptions::default()
        }
    }

    #[test]
    fn ssh_args_never_prompt_and_check_the_host_key() {
        let p = match SshPlacement::new(
            "b",
            SshOptions {
                user: Some("me".to_owned()),
                port: Some(2222),
                identity: Some("/k".into()),
                known_hosts: Some("/kh".into()),
                ..options()
            },
        ) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let args: Vec<String> = p
            .ssh_args()
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        for want in [
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            "UserKnownHostsFile=/kh",
            "IdentitiesOnly=yes",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing from {args:?}");
        }
        assert_eq!(&args[args.len() - 2..], ["--", "box"]);
    }

    #[test]
    fn options_that_undo_the_checks_and_option_like_hosts_are_refused() {
        for bad in [
            SshOptions {
                host: "-oProxyCommand=x".to_owned(),
                ..options()
            },
            SshOptions {
                ssh_options: vec!["StrictHostKeyChecking=no".to_owned()],
                ..options()
            },
            SshOptions {
                ssh_options: vec!["localcommand=id".to_owned()],
                ..options()
            },
            SshOptions {
                user: Some("-x".to_owned()),
                ..options()
            },
        ] {
            assert!(
                matches!(
                    SshPlacement::new("b", bad.clone()),
                    Err(PlacementError::Config { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
