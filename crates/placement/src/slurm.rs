//! The Slurm placement: the node agent as a batch job (`sbatch`), its
//! state from `squeue` (then `sacct`), cancelled with `scancel`.
//!
//! # The job
//! `sbatch --parsable --export=NONE --no-requeue --job-name=<token> …`
//! with a generated job script on stdin. The script exports the request's
//! `env` (never secret by the seam's contract), runs the agent's argv with
//! [`CREDENTIAL_PLACEHOLDER`] replaced by the
//! credential file's path, and removes that file when the agent ends.
//! * `--export=NONE`: nothing of the host's environment reaches the job;
//!   Slurm adds its own job variables (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`,
//!   …), which the kernel sees through the sandbox's allowlist
//!   (`cellhost_sandbox::env::SCHEDULER_NAMES`).
//! * `--no-requeue`: a node failure must not start the agent a second
//!   time; its credential is single-use anyway.
//! * The job name is the request's token, the idempotency key: before
//!   submitting, `squeue --me --states=all --name=<token>` is asked, and a
//!   job found there (queued, running or ended) is returned instead of a
//!   second one.
//! * `partition`, `account`, `qos`, `time`, `gres` and `extra_args` are
//!   passed through; extra arguments that would undo the above
//!   (`--export`, `--job-name`, `--requeue`, …) are refused at construction.
//!
//! # The credential
//! Written before `sbatch` runs, as `<spool_dir>/<token>.credential`,
//! created exclusively (`O_EXCL`) with mode 0600 inside a spool directory
//! that must be a real directory owned by the submitting user with no group
//! or other access (checked on every placement). The job script carries only
//! the path. Why not in the script: `sbatch` stores the script in the
//! controller's `StateSaveLocation` and the node's `SlurmdSpoolDir`,
//! readable by the Slurm user and by `scontrol write batch_script`, and it
//! outlives the job. Why not in the environment: `/proc/<pid>/environ` and
//! `scontrol show job` expose it. The spool directory must therefore be on
//! a file system the compute nodes share with the host (the default,
//! `$HOME/.cellhost/slurm`, is usually such a share); the job runs as the
//! same user, so it can read the file and nobody else can.
//!
//! # Cancel and the job's cgroup
//! `scancel <id>` sends SIGTERM, then SIGKILL after the cluster's
//! `KillWait`, to every process of the job. With `ProctrackType=proctrack/cgroup`
//! Slurm tracks the job by its cgroup, so processes that left the agent's
//! process tree (`setsid`, double fork) end too: an extra layer beside the
//! agent's own tree kill. With `proctrack/linuxproc` only the process tree is
//! tracked. A job that already ended is not an error.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::command::{self, Invocation};
use crate::shell::{is_env_name, is_token, quote};
use crate::{CREDENTIAL_PLACEHOLDER, Placed, PlacedState, Placement, PlacementError, PlacementRequest};

/// Placement kind name.
pub const KIND: &str = "slurm";

/// `sbatch` arguments that [`SlurmOptions::extra_args`] may not contain:
/// they would undo the job's isolation or idempotency.
pub const RESERVED_ARGS: &[&str] = &[
    "--export",
    "--export-file",
    "-J",
    "--job-name",
    "--requeue",
    "--wrap",
    "--parsable",
    "-o",
    "--output",
    "-e",
    "--error",
    "-D",
    "--chdir",
    "--get-user-env",
];

/// The `[placement.<name>]` table of `kind = "slurm"`.
///
/// ```toml
/// [placement.gpu]
/// kind = "slurm"
/// partition = "gpu"
/// account = "lab42"
/// time = "04:00:00"
/// gres = "gpu:1"
/// extra_args = ["--mem=16G", "--cpus-per-task=4"]
/// spool_dir = "/shared/home/me/.cellhost/slurm"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmOptions {
    /// `--partition`.
    pub partition: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// `--qos`.
    pub qos: Option<String>,
    /// `--time`, in any format Slurm accepts (`minutes`, `HH:MM:SS`,
    /// `days-HH`…).
    pub time: Option<String>,
    /// `--gres`, e.g. `gpu:1`.
    pub gres: Option<String>,
    /// Further `sbatch` arguments, passed as given (not through a shell),
    /// except the [`RESERVED_ARGS`].
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Where credential files and job output go; must be shared with the
    /// compute nodes. Default `$HOME/.cellhost/slurm`.
    pub spool_dir: Option<PathBuf>,
    /// `SLURM_CONF` for the Slurm commands (default: theirs).
    pub slurm_conf: Option<PathBuf>,
    /// Directory holding `sbatch`, `squeue`, `scancel`, `sacct`
    /// (default: looked up in `PATH`).
    pub bin_dir: Option<PathBuf>,
    /// How long one Slurm command may take, in seconds (default 60).
    pub command_timeout_secs: Option<u64>,
}

/// Starts node agents as Slurm batch jobs. See the module docs.
#[derive(Debug)]
pub struct SlurmPlacement {
    name: String,
    options: SlurmOptions,
    spool_dir: PathBuf,
    timeout: Duration,
    /// Serialises the squeue check and the sbatch of one host, so two
    /// concurrent places of one token submit one job.
    submit: tokio::sync::Mutex<()>,
}

impl SlurmPlacement {
    /// Checks the options of the table `name`.
    ///
    /// # Errors
    /// [`PlacementError::Config`] for a reserved or NUL-carrying argument,
    /// a relative spool dir, or no spool dir and no `HOME`.
    pub fn new(name: &str, options: SlurmOptions) -> Result<Self, PlacementError> {
        let config = |message: String| PlacementError::Config {
            name: name.to_owned(),
            message,
        };
        for arg in &options.extra_args {
            let flag = arg.split('=').next().unwrap_or(arg);
            if RESERVED_ARGS.contains(&flag) {
                return Err(config(format!(
                    "extra_args may not contain {flag}: the placement sets it itself"
                )));
            }
            if arg.contains('\0') {
                return Err(config("extra_args contain a NUL byte".to_owned()));
            }
        }
        let spool_dir = match &options.spool_dir {
            Some(dir) => dir.clone(),
            None => match std::env::var_os("HOME") {
                Some(home) if !home.is_empty() => PathBuf::from(home).join(".cellhost/slurm"),
                _ => {
                    return Err(config(
                        "spool_dir is not set and HOME is not set to default it".to_owned(),
                    ));
                }
            },
        };
        if !spool_dir.is_absolute() {
            return Err(config(format!(
                "spool_dir {} is not an absolute path",
                spool_dir.display()
            )));
        }
        let timeout = Duration::from_secs(options.command_timeout_secs.unwrap_or(60).max(1));
        Ok(Self {
            name: name.to_owned(),
            options,
            spool_dir,
            timeout,
            submit: tokio::sync::Mutex::new(()),
        })
    }

    /// The directory credential files and job output go to.
    pub fn spool_dir(&self) -> &Path {
        &self.spool_dir
    }

    /// The credential file's path for `token`.
    pub fn credential_path(&self, token: &str) -> PathBuf {
        self.spool_dir.join(format!("{token}.credential"))
    }

    fn config(&self, message: String) -> PlacementError {
        PlacementError::Config {
            name: self.name.clone(),
            message,
        }
    }

    fn program(&self, tool: &str) -> OsString {
        match &self.options.bin_dir {
            Some(dir) => dir.join(tool).into_os_string(),
            None => OsString::from(tool),
        }
    }

    async fn slurm(
        &self,
        tool: &str,
        args: Vec<OsString>,
        stdin: Option<&[u8]>,
    ) -> Result<command::Output, PlacementError> {
        let program = self.program(tool);
        let env = match &self.options.slurm_conf {
            Some(conf) => vec![("SLURM_CONF".to_owned(), conf.clone().into_os_string())],
            None => Vec::new(),
        };
        command::run(Invocation {
            kind: KIND,
            program: &program,
            args,
            env,
            stdin,
            timeout: self.timeout,
        })
        .await
    }

    /// Creates the spool directory (0700) or checks the one there.
    fn prepare_spool(&self) -> Result<(), PlacementError> {
        let dir = &self.spool_dir;
        if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            return Err(self.config(format!("spool_dir {} cannot be created: {e}", dir.display())));
        }
        let meta = std::fs::symlink_metadata(dir)
            .map_err(|e| self.config(format!("spool_dir {}: {e}", dir.display())))?;
        if !meta.is_dir() {
            return Err(self.config(format!(
                "spool_dir {} is not a directory (a symbolic link is refused)",
                dir.display()
            )));
        }
        let me = rustix::process::geteuid().as_raw();
        if meta.uid() != me {
            return Err(self.config(format!(
                "spool_dir {} belongs to uid {}, not to this user (uid {me})",
                dir.display(),
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(self.config(format!(
                "spool_dir {} has mode {:o}; other users could read credentials (chmod 700 it)",
                dir.display(),
                meta.mode() & 0o7777
            )));
        }
        Ok(())
    }

    /// Writes the credential exclusively with mode 0600.
    fn write_credential(&self, path: &Path, bytes: &[u8]) -> Result<(), PlacementError> {
        let open = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
        };
        let mut file = match open() {
            Ok(f) => f,
            // Left by an attempt that failed before sbatch answered (no job
            // of this token exists, squeue said so under `submit`).
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::remove_file(path)
                .and_then(|()| open())
                .map_err(|e| self.config(format!("credential {}: {e}", path.display())))?,
            Err(e) => {
                return Err(self.config(format!("credential {}: {e}", path.display())));
            }
        };
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| self.config(format!("credential {}: {e}", path.display())))
    }

    /// The job script for `request` with the credential at `credential`.
    ///
    /// # Errors
    /// [`PlacementError::Config`] for an empty argv, an argv without the
    /// placeholder, a bad environment name or a NUL byte.
    pub fn job_script(
        &self,
        request: &PlacementRequest,
        credential: &Path,
    ) -> Result<String, PlacementError> {
        let cred = credential
            .to_str()
            .ok_or_else(|| self.config("the spool dir's path is not UTF-8".to_owned()))?;
        let argv = agent_argv(&self.name, request, cred)?;
        let mut script = String::from(
            "#!/bin/sh\n# cellhost node agent (generated). The credential file is removed when the agent ends.\n",
        );
        script.push_str(&format!("cred={}\n", quote(&self.name, "spool_dir", cred)?));
        script.push_str("trap 'rm -f -- \"$cred\"' EXIT\ntrap 'exit 143' HUP INT TERM\n");
        for (k, v) in &request.env {
            if !is_env_name(k) {
                return Err(self.config(format!("environment name {k:?} is not a valid name")));
            }
            script.push_str(&format!("export {k}={}\n", quote(&self.name, k, v)?));
        }
        let words = argv
            .iter()
            .map(|a| quote(&self.name, "agent_argv", a))
            .collect::<Result<Vec<_>, _>>()?;
        script.push_str(&words.join(" "));
        script.push('\n');
        Ok(script)
    }

    /// The `sbatch` arguments for `request` (the script comes on stdin).
    fn sbatch_args(&self, request: &PlacementRequest) -> Vec<OsString> {
        let o = &self.options;
        let mut args: Vec<OsString> = vec![
            "--parsable".into(),
            "--export=NONE".into(),
            "--no-requeue".into(),
            format!("--job-name={}", request.token).into(),
            format!(
                "--comment=cellhost session={} generation={}",
                comment_safe(&request.session),
                request.generation
            )
            .into(),
        ];
        let mut chdir = OsString::from("--chdir=");
        chdir.push(&self.spool_dir);
        args.push(chdir);
        let mut output = OsString::from("--output=");
        output.push(self.spool_dir.join(format!("{}.out", request.token)));
        args.push(output);
        for (flag, value) in [
            ("--partition", &o.partition),
            ("--account", &o.account),
            ("--qos", &o.qos),
            ("--time", &o.time),
            ("--gres", &o.gres),
        ] {
            if let Some(v) = value {
                args.push(format!("{flag}={v}").into());
            }
        }
        args.extend(o.extra_args.iter().map(OsString::from));
        args
    }

    /// A job of this user named `token`, as `squeue` lists it.
    async fn find_by_name(&self, token: &str) -> Result<Option<Placed>, PlacementError> {
        let out = self
            .slurm(
                "squeue",
                vec![
                    "--me".into(),
                    "--noheader".into(),
                    "--states=all".into(),
                    format!("--name={token}").into(),
                    "--format=%i|%T|%N".into(),
                ],
                None,
            )
            .await?;
        if !out.status.success() {
            return Err(PlacementError::Unavailable {
                kind: KIND.to_owned(),
                message: out.message(),
            });
        }
        Ok(out.stdout.lines().find_map(|line| {
            let mut parts = line.trim().split('|');
            let id = parts.next()?.trim();
            if id.is_empty() {
                return None;
            }
            let _state = parts.next();
            let node = parts.next().map(str::trim).filter(|n| !n.is_empty());
            Some(Placed {
                kind: KIND.to_owned(),
                job: id.to_owned(),
                node: node.map(str::to_owned),
            })
        }))
    }

    fn job_id<'a>(&self, placed: &'a Placed) -> Result<&'a str, PlacementError> {
        if placed.kind == KIND && !placed.job.is_empty() && placed.job.chars().all(|c| c.is_ascii_digit()) {
            Ok(&placed.job)
        } else {
            Err(self.config(format!(
                "{:?} of kind {:?} is not a Slurm job id",
                placed.job, placed.kind
            )))
        }
    }
}

/// The agent's argv with the placeholder replaced by `credential`.
pub(crate) fn agent_argv(
    name: &str,
    request: &PlacementRequest,
    credential: &str,
) -> Result<Vec<String>, PlacementError> {
    let config = |message: &str| PlacementError::Config {
        name: name.to_owned(),
        message: message.to_owned(),
    };
    if request.agent_argv.is_empty() {
        return Err(config("the agent's argv is empty"));
    }
    if !request
        .agent_argv
        .iter()
        .any(|a| a.contains(CREDENTIAL_PLACEHOLDER))
    {
        return Err(config(
            "the agent's argv does not name the credential file ({credential})",
        ));
    }
    Ok(request
        .agent_argv
        .iter()
        .map(|a| a.replace(CREDENTIAL_PLACEHOLDER, credential))
        .collect())
}

/// `s` with everything but `[A-Za-z0-9._-]` replaced by `_`, at most 64
/// characters (a session name in a job comment).
fn comment_safe(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Messages of Slurm's client library that mean the controller could not be
/// asked rather than that it refused.
const UNREACHABLE: &[&str] = &[
    "Unable to contact slurm controller",
    "Socket timed out",
    "Zero Bytes were transmitted",
    "Connection refused",
    "Communication connection failure",
    "Invalid authentication credential",
    "Protocol authentication error",
];

fn submit_error(message: String) -> PlacementError {
    if UNREACHABLE.iter().any(|m| message.contains(m)) {
        PlacementError::Unavailable {
            kind: KIND.to_owned(),
            message,
        }
    } else {
        PlacementError::Rejected {
            kind: KIND.to_owned(),
            message,
        }
    }
}

/// A job state as `squeue --format=%T` or `sacct --format=State` prints it,
/// with its nodes and reason.
pub fn parse_state(state: &str, nodes: &str, reason: &str) -> PlacedState {
    let state = state.trim();
    let word = state.split_whitespace().next().unwrap_or("");
    let reason = reason.trim();
    let reason = (!reason.is_empty() && reason != "None" && reason != "(null)")
        .then(|| reason.trim_matches(|c| c == '(' || c == ')').to_owned());
    let nodes = nodes.trim();
    match word {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD"
        | "SUSPENDED" | "STOPPED" | "RESIZING" => PlacedState::Queued {
            reason: reason.or_else(|| (word != "PENDING").then(|| word.to_owned())),
        },
        "RUNNING" | "SIGNALING" | "STAGE_OUT" => PlacedState::Running {
            node: (!nodes.is_empty() && nodes != "None assigned").then(|| nodes.to_owned()),
        },
        _ => PlacedState::Ended {
            detail: match reason {
                Some(r) => format!("{state} ({r})"),
                None => state.to_owned(),
            },
        },
    }
}

impl Placement for SlurmPlacement {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn place(&self, request: &PlacementRequest) -> Result<Placed, PlacementError> {
        if !is_token(&request.token) {
            return Err(self.config(format!("token {:?} is not [A-Za-z0-9-]{{1,63}}", request.token)));
        }
        let _submit = self.submit.lock().await;
        if let Some(existing) = self.find_by_name(&request.token).await? {
            return Ok(existing);
        }
        self.prepare_spool()?;
        let credential = self.credential_path(&request.token);
        let script = self.job_script(request, &credential)?;
        self.write_credential(&credential, &request.credential)?;
        let result = self
            .slurm("sbatch", self.sbatch_args(request), Some(script.as_bytes()))
            .await;
        let out = match result {
            Ok(out) if out.status.success() => out,
            Ok(out) => {
                let _ = std::fs::remove_file(&credential);
                return Err(submit_error(out.message()));
            }
            Err(e) => {
                let _ = std::fs::remove_file(&credential);
                return Err(e);
            }
        };
        // `--parsable`: `<job id>[;<cluster>]` on the last line.
        let id = out
            .stdout
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .and_then(|l| l.split(';').next())
            .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()));
        match id {
            Some(id) => Ok(Placed {
                kind: KIND.to_owned(),
                job: id.to_owned(),
                node: None,
            }),
            None => Err(PlacementError::Unavailable {
                kind: KIND.to_owned(),
                message: format!("sbatch printed no job id: {}", out.message()),
            }),
        }
    }

    async fn state(&self, placed: &Placed) -> Result<PlacedState, PlacementError> {
        let id = self.job_id(placed)?;
        let out = self
            .slurm(
                "squeue",
                vec![
                    "--noheader".into(),
                    "--states=all".into(),
                    format!("--jobs={id}").into(),
                    "--format=%T|%N|%r".into(),
                ],
                None,
            )
            .await?;
        if out.status.success() {
            if let Some(line) = out.stdout.lines().find(|l| !l.trim().is_empty()) {
                let mut parts = line.splitn(3, '|');
                let state = parts.next().unwrap_or("");
                let nodes = parts.next().unwrap_or("");
                let reason = parts.next().unwrap_or("");
                return Ok(parse_state(state, nodes, reason));
            }
        } else if !out.stderr.contains("Invalid job id") {
            return Err(PlacementError::Unavailable {
                kind: KIND.to_owned(),
                message: out.message(),
            });
        }
        // Purged from the controller's memory (older than MinJobAge): ask
        // the accounting database, when the cluster has one.
        let acct = self
            .slurm(
                "sacct",
                vec![
                    "--noheader".into(),
                    "--parsable2".into(),
                    "--allocations".into(),
                    format!("--jobs={id}").into(),
                    "--format=State,NodeList,ExitCode".into(),
                ],
                None,
            )
            .await;
        if let Ok(acct) = acct
            && acct.status.success()
            && let Some(line) = acct.stdout.lines().find(|l| !l.trim().is_empty())
        {
            let mut parts = line.splitn(3, '|');
            let state = parts.next().unwrap_or("");
            let nodes = parts.next().unwrap_or("");
            let exit = parts.next().unwrap_or("").trim();
            return Ok(match parse_state(state, nodes, "") {
                PlacedState::Ended { detail } if !exit.is_empty() => PlacedState::Ended {
                    detail: format!("{detail} (exit {exit})"),
                },
                other => other,
            });
        }
        Ok(PlacedState::Ended {
            detail: format!("job {id} is no longer known to Slurm"),
        })
    }

    async fn cancel(&self, placed: &Placed) -> Result<(), PlacementError> {
        let id = self.job_id(placed)?;
        // The job name tells which credential file to remove (the job script
        // removes it too, unless the job never started).
        let name = self
            .slurm(
                "squeue",
                vec![
                    "--noheader".into(),
                    "--states=all".into(),
                    format!("--jobs={id}").into(),
                    "--format=%j".into(),
                ],
                None,
            )
            .await
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| o.stdout.lines().next().map(|l| l.trim().to_owned()))
            .filter(|n| is_token(n));
        let out = self.slurm("scancel", vec![id.into()], None).await?;
        if let Some(name) = name {
            let _ = std::fs::remove_file(self.credential_path(&name));
        }
        if out.status.success()
            || out.stderr.contains("already completing or completed")
            || out.stderr.contains("Invalid job id")
        {
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
    use std::collections::BTreeMap;

    fn request() -> PlacementRequest {
        PlacementRequest {
            token: "cellhost-00ff".to_owned(),
            session: "my session\n#SBATCH --x".to_owned(),
            generation: 3,
            agent_argv: vec![
                "/opt/cellhost".to_owned(),
                "agent".to_owned(),
                "--credential".to_owned(),
                CREDENTIAL_PLACEHOLDER.to_owned(),
            ],
            credential: b"secret".to_vec(),
            env: BTreeMap::from([("CELLHOST_HOST".to_owned(), "h:1'x".to_owned())]),
            queue_timeout: Duration::from_secs(60),
        }
    }

    fn placement() -> SlurmPlacement {
        let options = SlurmOptions {
            spool_dir: Some(PathBuf::from("/shared/spool")),
            partition: Some("gpu".to_owned()),
            gres: Some("gpu:1".to_owned()),
            extra_args: vec!["--mem=1G".to_owned()],
            ..SlurmOptions::default()
        };
        match SlurmPlacement::new("p", options) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn job_script_names_the_credential_file_and_never_holds_the_credential() {
        let p = placement();
        let req = request();
        let script = match p.job_script(&req, &p.credential_path(&req.token)) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        assert!(!script.contains("secret"), "{script}");
        assert!(
            script
                .contains("'/opt/cellhost' 'agent' '--credential' '/shared/spool/cellhost-00ff.credential'")
        );
        assert!(script.contains("export CELLHOST_HOST='h:1'\\''x'"), "{script}");
    }

    #[test]
    fn sbatch_args_keep_the_isolation_flags_and_pass_options_through() {
        let p = placement();
        let args: Vec<String> = p
            .sbatch_args(&request())
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        for want in [
            "--export=NONE",
            "--no-requeue",
            "--job-name=cellhost-00ff",
            "--partition=gpu",
            "--gres=gpu:1",
            "--mem=1G",
            "--comment=cellhost session=my_session__SBATCH_--x generation=3",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing from {args:?}");
        }
    }

    #[test]
    fn extra_args_that_undo_the_isolation_are_refused() {
        for bad in ["--export=ALL", "-J", "--job-name=x", "--requeue", "--wrap=id"] {
            let options = SlurmOptions {
                spool_dir: Some(PathBuf::from("/s")),
                extra_args: vec![bad.to_owned()],
                ..SlurmOptions::default()
            };
            assert!(
                matches!(
                    SlurmPlacement::new("p", options),
                    Err(PlacementError::Config { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn squeue_states_map_to_placed_states() {
        assert_eq!(
            parse_state("PENDING", "", "(Resources)"),
            PlacedState::Queued {
                reason: Some("Resources".to_owned())
            }
        );
        assert_eq!(
            parse_state("RUNNING", "node7", "None"),
            PlacedState::Running {
                node: Some("node7".to_owned())
            }
        );
        assert_eq!(
            parse_state("FAILED", "node7", "NonZeroExitCode"),
            PlacedState::Ended {
                detail: "FAILED (NonZeroExitCode)".to_owned()
            }
        );
        assert_eq!(
            parse_state("CANCELLED by 0", "", ""),
            PlacedState::Ended {
                detail: "CANCELLED by 0".to_owned()
            }
        );
    }

    #[test]
    fn unreachable_controller_is_unavailable_and_a_refusal_is_rejected() {
        assert_eq!(
            submit_error("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)".to_owned()).code(),
            "placement_unavailable"
        );
        assert_eq!(
            submit_error(
                "sbatch: error: Batch job submission failed: Invalid partition name specified".to_owned()
            )
            .code(),
            "placement_rejected"
        );
    }
}
