//! The `loopback` placement: the agent as a child process of the host, on
//! this machine. For tests, the bench, and a box where a second sandbox
//! boundary over TLS is wanted; it keeps the [`Placement`] contract
//! exactly (credential written 0600 to a temporary file, idempotent by
//! token, cancel kills the agent).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use cellhost_placement::{
    CREDENTIAL_PLACEHOLDER, Placed, PlacedState, Placement, PlacementError, PlacementRequest,
};

const KIND: &str = "loopback";

enum Runner {
    /// `cellhost agent` as a child process.
    Child(tokio::process::Child),
    /// [`crate::run_agent`] as a task of this process (`in_process`).
    Task(tokio::task::JoinHandle<Result<crate::AgentExit, crate::AgentError>>),
}

struct Job {
    runner: Runner,
    /// Removed with the job (the agent removes it once read).
    _credential: tempfile::TempPath,
}

/// Starts agents as local child processes.
#[derive(Debug, Clone, Default)]
pub struct LoopbackPlacement {
    /// Replaces the first element of the agent's command line (the
    /// `cellhost` binary), e.g. a build under test; default: the running
    /// executable (the host's own `cellhost`).
    pub program: Option<PathBuf>,
    /// Extra arguments appended to the agent's command line
    /// (`--connect-grace 2s`).
    pub extra_args: Vec<String>,
    /// Runs the agent's code as a task of this process instead of a child
    /// (the same code path as `cellhost agent`: many agents in one process
    /// for the bench and fast tests). Its grace is
    /// [`LoopbackPlacement::grace`].
    pub in_process: bool,
    /// The in-process agent's connect grace (30 s).
    pub grace: Option<std::time::Duration>,
    jobs: Arc<Mutex<HashMap<String, JobSlot>>>,
}

#[derive(Clone)]
struct JobSlot {
    placed: Placed,
    job: Arc<tokio::sync::Mutex<Option<Job>>>,
}

impl std::fmt::Debug for JobSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.placed.fmt(f)
    }
}

impl LoopbackPlacement {
    /// Agents run as tasks of this process with connect grace `grace`
    /// (see [`LoopbackPlacement::in_process`]).
    pub fn in_process(grace: std::time::Duration) -> Self {
        LoopbackPlacement {
            in_process: true,
            grace: Some(grace),
            ..LoopbackPlacement::default()
        }
    }

    /// Agents as child processes running `program` (`cellhost`), with
    /// `extra_args` appended to their command line.
    pub fn with_program(program: impl Into<PathBuf>, extra_args: Vec<String>) -> Self {
        LoopbackPlacement {
            program: Some(program.into()),
            extra_args,
            ..LoopbackPlacement::default()
        }
    }

    /// From a `[placement.<name>]` table: `program` (path) and `args`
    /// (list of strings), both optional.
    ///
    /// # Errors
    /// [`PlacementError::Config`] for options of the wrong type or unknown.
    pub fn from_options(name: &str, options: &toml::Table) -> Result<Self, PlacementError> {
        let bad = |message: String| PlacementError::Config {
            name: name.to_string(),
            message,
        };
        let mut p = LoopbackPlacement::default();
        for (k, v) in options {
            match (k.as_str(), v) {
                ("kind", _) => {}
                ("program", toml::Value::String(s)) => p.program = Some(PathBuf::from(s)),
                ("in_process", toml::Value::Boolean(b)) => p.in_process = *b,
                ("args", toml::Value::Array(a)) => {
                    for x in a {
                        match x {
                            toml::Value::String(s) => p.extra_args.push(s.clone()),
                            _ => return Err(bad("`args` must be a list of strings".into())),
                        }
                    }
                }
                (k, _) => return Err(bad(format!("unknown or mistyped option `{k}` for kind loopback"))),
            }
        }
        Ok(p)
    }

    fn slot(&self, token: &str) -> Option<JobSlot> {
        self.jobs.lock().ok().and_then(|j| j.get(token).cloned())
    }

    fn find(&self, placed: &Placed) -> Option<JobSlot> {
        self.jobs
            .lock()
            .ok()
            .and_then(|j| j.values().find(|s| s.placed.job == placed.job).cloned())
    }
}

fn unavailable(message: String) -> PlacementError {
    PlacementError::Unavailable {
        kind: KIND.into(),
        message,
    }
}

impl Placement for LoopbackPlacement {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn place(&self, request: &PlacementRequest) -> Result<Placed, PlacementError> {
        if let Some(s) = self.slot(&request.token) {
            return Ok(s.placed);
        }
        let mut file = tempfile::Builder::new()
            .prefix("cellhost-credential-")
            .tempfile()
            .map_err(|e| unavailable(format!("cannot write the credential file: {e}")))?;
        // `tempfile` creates the file 0600.
        std::io::Write::write_all(&mut file, &request.credential)
            .map_err(|e| unavailable(format!("cannot write the credential file: {e}")))?;
        let path = file.into_temp_path();
        let mut argv: Vec<String> = request
            .agent_argv
            .iter()
            .map(|a| {
                if a == CREDENTIAL_PLACEHOLDER {
                    path.display().to_string()
                } else {
                    a.clone()
                }
            })
            .collect();
        // The agent is this host's own binary unless the table names one.
        let program = self.program.clone().or_else(|| std::env::current_exe().ok());
        if let Some(p) = program
            && let Some(first) = argv.first_mut()
        {
            *first = p.display().to_string();
        }
        argv.extend(self.extra_args.iter().cloned());
        if self.in_process {
            let opts = crate::AgentOptions {
                credential: path.to_path_buf(),
                connect_grace: self.grace.unwrap_or(std::time::Duration::from_secs(30)),
                python: None,
                state_dir: None,
            };
            let task = tokio::spawn(crate::run_agent(opts));
            let job = format!("task-{}", hex::encode(crate::random_bytes::<4>()));
            return Ok(self.record(request, job, Runner::Task(task), path));
        }
        let Some((program, args)) = argv.split_first() else {
            return Err(PlacementError::Rejected {
                kind: KIND.into(),
                message: "empty agent command line".into(),
            });
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(&request.env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| unavailable(format!("cannot start {program}: {e}")))?;
        let pid = child.id().unwrap_or(0);
        Ok(self.record(request, pid.to_string(), Runner::Child(child), path))
    }

    async fn state(&self, placed: &Placed) -> Result<PlacedState, PlacementError> {
        let Some(slot) = self.find(placed) else {
            return Ok(PlacedState::Ended {
                detail: "unknown job".into(),
            });
        };
        let mut job = slot.job.lock().await;
        let Some(j) = job.as_mut() else {
            return Ok(PlacedState::Ended {
                detail: "cancelled".into(),
            });
        };
        match &mut j.runner {
            Runner::Child(child) => match child.try_wait() {
                Ok(None) => Ok(PlacedState::Running {
                    node: placed.node.clone(),
                }),
                Ok(Some(st)) => Ok(PlacedState::Ended {
                    detail: format!("agent {st}"),
                }),
                Err(e) => Err(unavailable(e.to_string())),
            },
            Runner::Task(t) if t.is_finished() => Ok(PlacedState::Ended {
                detail: "agent task ended".into(),
            }),
            Runner::Task(_) => Ok(PlacedState::Running {
                node: placed.node.clone(),
            }),
        }
    }

    async fn cancel(&self, placed: &Placed) -> Result<(), PlacementError> {
        let Some(slot) = self.find(placed) else {
            return Ok(());
        };
        if let Ok(mut j) = self.jobs.lock() {
            j.retain(|_, s| s.placed.job != placed.job);
        }
        let job = slot.job.lock().await.take();
        match job.map(|j| j.runner) {
            Some(Runner::Child(mut child)) => {
                // The agent kills its worker's tree when its host connection
                // ends; SIGKILL to the agent is the scheduler's cancel.
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            Some(Runner::Task(t)) => {
                // Dropping the agent's local link kills and reaps the tree.
                t.abort();
                let _ = t.await;
            }
            None => {}
        }
        Ok(())
    }
}

impl LoopbackPlacement {
    fn record(
        &self,
        request: &PlacementRequest,
        job: String,
        runner: Runner,
        path: tempfile::TempPath,
    ) -> Placed {
        let placed = Placed {
            kind: KIND.into(),
            job,
            node: Some(crate::agent::node_name()),
        };
        let slot = JobSlot {
            placed: placed.clone(),
            job: Arc::new(tokio::sync::Mutex::new(Some(Job {
                runner,
                _credential: path,
            }))),
        };
        if let Ok(mut j) = self.jobs.lock() {
            j.insert(request.token.clone(), slot);
        }
        placed
    }

    /// Waits for a placed agent to end by itself; its process exit code
    /// (`cellhost agent`'s: 0 done, 3 host lost, 1 failed), or for an
    /// in-process agent the same numbers for its outcome.
    pub async fn wait(&self, placed: &Placed) -> Option<i32> {
        let slot = self.find(placed)?;
        let mut job = slot.job.lock().await;
        if let Some(Job {
            runner: Runner::Child(c),
            ..
        }) = job.as_mut()
        {
            return c.wait().await.ok().map(|s| s.code().unwrap_or(-1));
        }
        match job.take()?.runner {
            Runner::Child(_) => None,
            Runner::Task(t) => Some(match t.await {
                Ok(Ok(crate::AgentExit::Done)) => 0,
                Ok(Ok(crate::AgentExit::HostLost)) => 3,
                _ => 1,
            }),
        }
    }

    /// Pid of a placed agent's process (`None` in process or ended).
    pub async fn pid(&self, placed: &Placed) -> Option<u32> {
        let slot = self.find(placed)?;
        let job = slot.job.lock().await;
        match &job.as_ref()?.runner {
            Runner::Child(c) => c.id(),
            Runner::Task(_) => None,
        }
    }
}
