//! `fork`: a new session with the state of a live, idle one.
//!
//! # Design: a new confined kernel that receives the parent's state
//!
//! A fork is a kernel of its own, started exactly like a cold or
//! template-forked kernel of a new session (own sandbox, cgroup,
//! generation, journal lineage), into which the parent's state is carried:
//!
//! 1. The parent must be live and idle: a cell running or queued is
//!    `session_busy` (the snapshot is a silent cell sent with
//!    `fail_if_busy`, so no cell can slip in between the check and it).
//!    Python threads of the parent's cells cannot be carried into another
//!    process: they refuse the fork with `threads_running` naming them,
//!    unless the request accepts [`ForkThreads::Drop`].
//! 2. The parent's worker writes its namespace to a file in its working
//!    directory (`cellhost_worker.forkstate`: one pickle, protocol 5, of
//!    every user name; modules by name; functions of the cells by their
//!    code; what cannot be pickled is named in [`ForkReport::lost`]). It
//!    never gets a count of its own (a silent cell).
//! 3. The host copies the parent's working directory into the fork's
//!    ([`crate::workdir_copy`]: links never followed, `copy_file_range`,
//!    which reflinks where the filesystem can), bounded by the session's
//!    `disk_mb` (`disk_full` past it), and moves the snapshot there.
//! 4. The fork's kernel starts with its parent's environment, network
//!    policy and limits; a silent cell imports the parent's modules, loads
//!    the values, sets `execution_count` to the fork point, reseeds
//!    `random` and numpy's global generator and deletes the snapshot.
//! 5. The journal records the fork's kernel with its parent session,
//!    parent generation and fork point (schema version 5); `history` shows
//!    them.
//!
//! # Copy-on-write, where it is sound
//!
//! A parent whose sandbox is off (nothing confines its worker: no
//! namespaces, mounts, Landlock domain, seccomp filter or kernel uid of its
//! own) is forked with `fork(2)` instead ([`ForkMethod::Cow`],
//! `cellhost_kernel::cow`): a silent cell arms the fork, the worker forks
//! the new kernel's init and worker between cells exactly as a template
//! forks a kernel, the copy closes the parent's channel and every other
//! inherited descriptor, connects to the new channel, enters its own copy
//! of the working directory, joins its own cgroup and reseeds `random` and
//! numpy; steps 3 and 5 are as above, steps 2 and 4 are not needed (the
//! pages are shared until written). The whole namespace travels, threads
//! aside (refused, or dropped), and open files and sockets are closed in
//! the copy. Its supervision: [`cellhost_kernel::cow`]. Every other parent
//! is forked by pickle, and [`ForkReport::pickle_reason`] says why
//! (confined, remote, an egress allowlist, not Python).
//!
//! Why not `fork(2)` of a confined parent's worker: the
//! worker is confined, and a process it forks inherits that confinement in
//! ways that make the child *share* rather than own its sandbox. Landlock
//! forbids every mount to a confined process, so the child could not get
//! a `/tmp`, `/proc` or working directory of its own (its rules name the
//! parent's inodes: it could write only where the parent writes); a pid
//! namespace the child makes is nested in the parent's, so killing the
//! parent's kernel (its pid 1) kills the child too; and both run under the
//! same kernel uid with no capability to take another, so the parent could
//! signal the child. The child would not be a sandbox of its own, and a
//! fork's sandbox must be no weaker than a cold kernel's. The price of this
//! design is time and memory proportional to the state (a pickle written
//! and read back, a second copy of the data) instead of a copy-on-write
//! fork; `cellhost bench --workload fork` measures it.
//!
//! What does not travel: threads (refused or dropped), open files and
//! sockets, and objects pickle refuses (named in `lost`); classes defined
//! in cells, and instances of them, travel only when the interpreter has
//! `cloudpickle` or `dill`. `In`/`Out` history starts empty.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellhost_kernel::{CellStatus, ExecOptions, KernelError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{RequestError, SessionSpec, validate_session};
use crate::registry::{Registry, RegistryError};
use crate::workdir_copy::{CopyError, copy_tree};

/// How long the snapshot and the restore may each take.
const STEP_TIMEOUT: Duration = Duration::from_secs(600);

/// What a fork does with Python threads of the parent's cells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ForkThreads {
    /// Refuse the fork (`threads_running`, naming them).
    #[default]
    Refuse,
    /// Fork anyway; the fork starts without them.
    Drop,
}

/// How a fork carried the parent's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ForkMethod {
    /// `fork(2)` of the parent's worker: pages shared copy-on-write (a
    /// parent whose sandbox is off).
    Cow,
    /// The namespace pickled by the parent and loaded by a new kernel.
    #[default]
    Pickle,
}

/// Fork the live, idle session `session` into the new session `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkRequest {
    /// The parent session (owner, name, interpreter, mode, cwd).
    pub session: SessionSpec,
    /// The new session's name (same owner; must not exist).
    pub name: String,
    /// What to do with the parent's threads.
    pub threads: ForkThreads,
}

/// What a fork made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkReport {
    /// The new session.
    pub session: String,
    /// The parent session.
    pub parent: String,
    /// The parent's kernel generation the fork was taken from.
    pub parent_generation: u64,
    /// The new session's kernel generation.
    pub generation: u64,
    /// The new kernel's worker pid.
    pub pid: u32,
    /// The fork point: the parent's `execution_count`, which the new
    /// session's cells count on from.
    pub execution_count: u64,
    /// Names carried into the new session's namespace.
    pub names: Vec<String>,
    /// Names that could not be carried, with why.
    pub lost: std::collections::BTreeMap<String, String>,
    /// Modules the parent had imported that the fork could not import.
    pub modules_failed: std::collections::BTreeMap<String, String>,
    /// Threads of the parent the fork started without (`threads: "drop"`).
    pub threads_dropped: Vec<String>,
    /// The new session's working directory (host path).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub cwd: PathBuf,
    /// Files of the working directory copied.
    pub files_copied: u64,
    /// Bytes of those files.
    pub bytes_copied: u64,
    /// Paths of the working directory not copied (links are copied as
    /// links; sockets, FIFOs, devices and hard-linked files are not).
    pub skipped: Vec<String>,
    /// Bytes of the namespace snapshot.
    pub snapshot_bytes: u64,
    /// Wall time of the whole fork, in milliseconds.
    pub duration_ms: u64,
    /// How the state was carried: `cow` (a `fork(2)` of the parent's
    /// worker) or `pickle`.
    #[serde(default)]
    pub method: ForkMethod,
    /// Why `pickle` was used (`None` for `cow`): the parent's kernel is
    /// confined, remote, has an egress allowlist, or is not Python.
    #[serde(default)]
    pub pickle_reason: Option<String>,
}

fn failed(session: &str, reason: impl Into<String>) -> RequestError {
    RequestError::ForkFailed {
        session: session.to_string(),
        reason: reason.into(),
    }
}

impl ForkThreads {
    /// The name a forkstate step takes for it.
    fn as_arg(self) -> &'static str {
        match self {
            ForkThreads::Refuse => "refuse",
            ForkThreads::Drop => "drop",
        }
    }
}

/// How a forkstate step runs: silent, refused by a busy kernel, bounded by
/// [`STEP_TIMEOUT`].
fn silent() -> ExecOptions {
    ExecOptions {
        silent: true,
        fail_if_busy: true,
        timeout: Some(STEP_TIMEOUT),
        ..Default::default()
    }
}

/// The JSON line a forkstate step printed last on stdout.
fn step_answer(session: &str, what: &str, r: &cellhost_kernel::CellResult) -> Result<Value, RequestError> {
    if r.status != CellStatus::Ok {
        let why = r
            .error
            .as_ref()
            .map(|e| format!("{}: {}", e.ename, e.evalue))
            .unwrap_or_else(|| r.status.as_str().to_string());
        return Err(failed(
            session,
            format!("the {what} ended {}: {why}", r.status.as_str()),
        ));
    }
    r.stdout
        .lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<Value>(l.trim())
                .ok()
                .filter(Value::is_object)
        })
        .ok_or_else(|| failed(session, format!("the {what} gave no answer")))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn string_map(v: &Value) -> std::collections::BTreeMap<String, String> {
    v.as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// A Python string literal of `s` (JSON's is one).
fn py_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "''".into())
}

impl ForkRequest {
    /// Runs the request.
    ///
    /// # Errors
    /// `bad_request` (a name), `session_not_found` (no live kernel of the
    /// parent), `session_busy` (a cell runs or queues), `session_exists`
    /// (the new name is taken: a live kernel, journaled cells, or a
    /// working directory with files), `threads_running`, `disk_full` (the
    /// working directory and snapshot pass the session's `disk_mb`),
    /// `fork_failed` (the snapshot or restore failed, with why; for a
    /// copy-on-write fork, the fork's socket could not be made),
    /// `kernel_failed` (also a copy-on-write fork the parent's worker did
    /// not make: it never connected, or the forked kernel failed to start),
    /// `registry_full`, `shut_down`.
    pub async fn execute(&self, reg: &Registry) -> Result<ForkReport, RequestError> {
        let started = Instant::now();
        validate_session(&self.name)?;
        let parent = self.session.key(reg)?;
        if self.name == parent.session {
            return Err(RequestError::SessionExists {
                session: self.name.clone(),
            });
        }
        let Some((kernel, parent_generation, _hold)) = reg.hold_live(&parent) else {
            return Err(RequestError::SessionNotFound {
                session: parent.session.clone(),
                live: true,
            });
        };
        let busy = |cell: String| RequestError::SessionBusy {
            session: parent.session.clone(),
            cell,
        };
        if kernel.is_busy() {
            return Err(busy("running".into()));
        }
        let (child, child_dir) = reg.fork_workdir(&parent, &self.name);
        let journaled = match reg.journal() {
            Some(j) => j.max_generation(&child.owner, &child.session).await.unwrap_or(0) > 0,
            None => false,
        };
        let dir_used = std::fs::read_dir(&child_dir).is_ok_and(|mut d| d.next().is_some());
        if reg.kernel(&child).is_some()
            || journaled
            || dir_used
            || reg
                .sessions_of(&child.owner)
                .iter()
                .any(|(k, _)| k.session == self.name)
        {
            return Err(RequestError::SessionExists {
                session: self.name.clone(),
            });
        }
        let _ = std::fs::remove_dir(&child_dir);
        let Some(parent_dir) = reg.workdir_files(&parent) else {
            return Err(failed(&parent.session, "the session has no working directory"));
        };
        let pickle_reason = pickle_reason(reg, &parent, &kernel);
        if pickle_reason.is_none() {
            let ctx = CowFork {
                parent: &parent,
                child: &child,
                kernel: &kernel,
                parent_generation,
                parent_dir: &parent_dir,
                child_dir: &child_dir,
                started,
            };
            return self.execute_cow(reg, ctx).await;
        }
        let mut token = [0u8; 8];
        getrandom::fill(&mut token).map_err(|e| failed(&parent.session, e.to_string()))?;
        let snap_name = format!(
            ".cellhost-fork-{}.pickle",
            token.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let snap_host = parent_dir.join(&snap_name);
        let snap_kernel = reg.kernel_path(&parent, &snap_host);
        let threads = self.threads.as_arg();
        let code = format!(
            "__import__('cellhost_worker.forkstate').forkstate.snapshot({}, {})",
            py_str(&snap_kernel.display().to_string()),
            py_str(threads)
        );
        let remove_snapshot = || {
            let _ = std::fs::remove_file(&snap_host);
        };
        let snap = match kernel.execute(code, silent()).await {
            Ok(r) => r,
            Err(KernelError::KernelBusy { cell, .. }) => return Err(busy(cell)),
            Err(e) => {
                remove_snapshot();
                return Err(RegistryError::Kernel(e).into());
            }
        };
        let answer = match step_answer(&parent.session, "snapshot", &snap) {
            Ok(a) => a,
            Err(e) => {
                remove_snapshot();
                return Err(e);
            }
        };
        let threads_dropped = match step_threads(&parent.session, &answer) {
            Ok(t) => t,
            Err(e) => {
                remove_snapshot();
                return Err(e);
            }
        };
        let fork_point = answer.get("execution_count").and_then(Value::as_u64).unwrap_or(0);
        let snapshot_bytes = answer.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        // The working directory, bounded by the session's disk cap (the
        // snapshot counts: it lands in the fork's directory too).
        let disk_mb = reg.session_limits(&parent).disk_mb;
        let cap = disk_mb.map(|mb| (mb << 20).saturating_sub(snapshot_bytes));
        let copied = {
            let (src, dst, name) = (parent_dir.clone(), child_dir.clone(), snap_name.clone());
            tokio::task::spawn_blocking(move || copy_tree(&src, &dst, &[OsStr::new(&name)], cap))
                .await
                .map_err(|e| failed(&parent.session, e.to_string()))
        };
        let copied = match copied {
            Ok(Ok(c)) => c,
            Ok(Err(CopyError::OverCap { path, bytes, .. })) => {
                remove_snapshot();
                return Err(RequestError::DiskFull {
                    path,
                    bytes,
                    used: bytes.saturating_sub(snapshot_bytes),
                    max_mb: disk_mb.unwrap_or(0),
                });
            }
            Ok(Err(e)) => {
                remove_snapshot();
                return Err(failed(
                    &parent.session,
                    format!("copying the working directory: {e}"),
                ));
            }
            Err(e) => {
                remove_snapshot();
                return Err(e);
            }
        };
        let snap_child = child_dir.join(&snap_name);
        if std::fs::rename(&snap_host, &snap_child).is_err() {
            let moved = std::fs::copy(&snap_host, &snap_child);
            remove_snapshot();
            if let Err(e) = moved {
                let _ = std::fs::remove_dir_all(&child_dir);
                return Err(failed(&parent.session, format!("moving the snapshot: {e}")));
            }
        }
        let undo = || {
            let _ = std::fs::remove_dir_all(&child_dir);
        };
        reg.inherit_session(&parent, &child);
        reg.set_fork_dir(&child, &child_dir);
        let (child_kernel, generation) = match reg.acquire(&child).await {
            Ok(x) => x,
            Err(e) => {
                reg.dispose(&child).await;
                undo();
                return Err(e.into());
            }
        };
        let modules: Vec<String> = strings(answer.get("modules").unwrap_or(&Value::Null));
        let code = format!(
            "__import__('cellhost_worker.forkstate').forkstate.restore({}, {fork_point}, {})",
            py_str(&reg.kernel_path(&child, &snap_child).display().to_string()),
            serde_json::to_string(&modules).unwrap_or_else(|_| "[]".into())
        );
        let resume = ExecOptions {
            resume_count: Some(fork_point),
            ..silent()
        };
        let restored = match child_kernel.execute(code, resume).await {
            Ok(r) => step_answer(&parent.session, "restore", &r),
            Err(e) => Err(RegistryError::Kernel(e).into()),
        };
        let restored = match restored {
            Ok(a) => a,
            Err(e) => {
                reg.dispose(&child).await;
                undo();
                return Err(e);
            }
        };
        if let Some(j) = reg.journal() {
            j.kernel_forked(
                &child.owner,
                &child.session,
                generation,
                &parent.session,
                parent_generation,
                fork_point,
            );
        }
        let mut lost = string_map(answer.get("lost").unwrap_or(&Value::Null));
        lost.extend(string_map(restored.get("lost").unwrap_or(&Value::Null)));
        Ok(ForkReport {
            session: child.session.clone(),
            parent: parent.session.clone(),
            parent_generation,
            generation,
            pid: child_kernel.info().pid,
            execution_count: fork_point,
            names: strings(restored.get("names").unwrap_or(&Value::Null)),
            lost,
            modules_failed: string_map(restored.get("modules_failed").unwrap_or(&Value::Null)),
            threads_dropped,
            cwd: child_dir.clone(),
            files_copied: copied.files,
            bytes_copied: copied.bytes,
            skipped: copied.skipped.into_iter().map(|(p, _)| p).collect(),
            snapshot_bytes,
            duration_ms: started.elapsed().as_millis() as u64,
            method: ForkMethod::Pickle,
            pickle_reason,
        })
    }

    /// The copy-on-write path (see the module's documentation).
    async fn execute_cow(&self, reg: &Registry, c: CowFork<'_>) -> Result<ForkReport, RequestError> {
        let (parent, child) = (c.parent, c.child);
        let busy = |cell: String| RequestError::SessionBusy {
            session: parent.session.clone(),
            cell,
        };
        // The working directory first (nothing of the parent changes if the
        // copy is refused), bounded by the session's disk cap.
        let disk_mb = reg.session_limits(parent).disk_mb;
        let cap = disk_mb.map(|mb| mb << 20);
        let copied = {
            let (src, dst) = (c.parent_dir.to_path_buf(), c.child_dir.to_path_buf());
            tokio::task::spawn_blocking(move || copy_tree(&src, &dst, &[], cap))
                .await
                .map_err(|e| failed(&parent.session, e.to_string()))?
        };
        let undo = || {
            let _ = std::fs::remove_dir_all(c.child_dir);
        };
        let copied = match copied {
            Ok(x) => x,
            Err(CopyError::OverCap { path, bytes, .. }) => {
                return Err(RequestError::DiskFull {
                    path,
                    bytes,
                    used: bytes,
                    max_mb: disk_mb.unwrap_or(0),
                });
            }
            Err(e) => {
                return Err(failed(
                    &parent.session,
                    format!("copying the working directory: {e}"),
                ));
            }
        };
        let invite = match cellhost_kernel::CowInvite::new() {
            Ok(i) => i,
            Err(e) => {
                undo();
                return Err(failed(&parent.session, format!("the fork's socket: {e}")));
            }
        };
        let threads = self.threads.as_arg();
        let code = format!(
            "__import__('cellhost_worker.forkstate').forkstate.cow_arm({}, {}, {})",
            py_str(&invite.path().display().to_string()),
            py_str(invite.token()),
            py_str(threads)
        );
        let armed = match c.kernel.execute(code, silent()).await {
            Ok(r) => step_answer(&parent.session, "fork", &r),
            Err(KernelError::KernelBusy { cell, .. }) => Err(busy(cell)),
            Err(e) => Err(RegistryError::Kernel(e).into()),
        };
        let answer = match armed {
            Ok(a) => a,
            Err(e) => {
                undo();
                return Err(e);
            }
        };
        let threads_dropped = match step_threads(&parent.session, &answer) {
            Ok(t) => t,
            Err(e) => {
                undo();
                return Err(e);
            }
        };
        let fork_point = answer.get("execution_count").and_then(Value::as_u64).unwrap_or(0);
        reg.inherit_session(parent, child);
        reg.set_fork_dir(child, c.child_dir);
        reg.set_cow_fork(child, invite, c.kernel.info().pid);
        let (child_kernel, generation) = match reg.acquire(child).await {
            Ok(x) => x,
            Err(e) => {
                reg.dispose(child).await;
                undo();
                return Err(e.into());
            }
        };
        // The host's count of the new kernel starts at the fork point (the
        // worker's is its parent's already).
        let resume = ExecOptions {
            resume_count: Some(fork_point),
            ..silent()
        };
        let code = "__import__('cellhost_worker.forkstate').forkstate.cow_resumed()".to_string();
        let resumed = match child_kernel.execute(code, resume).await {
            Ok(r) => step_answer(&parent.session, "fork's first cell", &r),
            Err(e) => Err(RegistryError::Kernel(e).into()),
        };
        let resumed = match resumed {
            Ok(a) => a,
            Err(e) => {
                reg.dispose(child).await;
                undo();
                return Err(e);
            }
        };
        if let Some(j) = reg.journal() {
            j.kernel_forked(
                &child.owner,
                &child.session,
                generation,
                &parent.session,
                c.parent_generation,
                fork_point,
            );
        }
        Ok(ForkReport {
            session: child.session.clone(),
            parent: parent.session.clone(),
            parent_generation: c.parent_generation,
            generation,
            pid: child_kernel.info().pid,
            execution_count: fork_point,
            names: strings(resumed.get("names").unwrap_or(&Value::Null)),
            lost: Default::default(),
            modules_failed: Default::default(),
            threads_dropped,
            cwd: c.child_dir.to_path_buf(),
            files_copied: copied.files,
            bytes_copied: copied.bytes,
            skipped: copied.skipped.into_iter().map(|(p, _)| p).collect(),
            snapshot_bytes: 0,
            duration_ms: c.started.elapsed().as_millis() as u64,
            method: ForkMethod::Cow,
            pickle_reason: None,
        })
    }
}

/// What the copy-on-write path needs of the checks `execute` made.
struct CowFork<'a> {
    parent: &'a crate::registry::Key,
    child: &'a crate::registry::Key,
    kernel: &'a cellhost_kernel::Kernel,
    parent_generation: u64,
    parent_dir: &'a std::path::Path,
    child_dir: &'a std::path::Path,
    started: Instant,
}

/// Why the parent cannot be forked copy-on-write (`None`: it can).
fn pickle_reason(
    reg: &Registry,
    parent: &crate::registry::Key,
    kernel: &cellhost_kernel::Kernel,
) -> Option<String> {
    use cellhost_sandbox::profile::SandboxMode;
    if parent.language != "python" {
        return Some(format!(
            "copy-on-write forks are of Python kernels, not {}",
            parent.language
        ));
    }
    if kernel.info().placement.is_some() {
        return Some("the parent's kernel is remote".into());
    }
    if parent.sandbox != SandboxMode::Off {
        let enforced: Vec<&str> = kernel
            .info()
            .sandbox
            .layers
            .iter()
            .filter(|l| l.enforced && l.name != "env" && l.name != "rlimits" && l.name != "cgroup")
            .map(|l| l.name.as_str())
            .collect();
        return Some(format!(
            "the parent's kernel is confined (sandbox {}: {}): a fork(2) of it would share its \
             confinement (Landlock forbids it mounts of its own and names the parent's directories; \
             a pid namespace would nest in the parent's; same kernel uid) instead of owning a sandbox",
            parent.sandbox.as_str(),
            if enforced.is_empty() {
                "no layer enforced beyond the environment and limits".to_string()
            } else {
                enforced.join(", ")
            }
        ));
    }
    if matches!(
        reg.session_network(parent),
        cellhost_kernel::egress::NetworkPolicy::Allow(_)
    ) {
        return Some(
            "the session's network allowlist needs the egress proxy only a cold kernel's init binds".into(),
        );
    }
    None
}

/// The threads a forkstate step's answer names: those it dropped when the
/// answer says `ok`, else `threads_running` naming those that refused it.
fn step_threads(session: &str, answer: &Value) -> Result<Vec<String>, RequestError> {
    let threads: Vec<String> = answer
        .get("threads")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(thread_label).collect())
        .unwrap_or_default();
    if answer.get("ok").and_then(Value::as_bool) != Some(true) {
        return Err(RequestError::ThreadsRunning {
            session: session.to_string(),
            threads,
        });
    }
    Ok(threads)
}

fn thread_label(t: &Value) -> String {
    format!(
        "{} ({})",
        t.get("name").and_then(Value::as_str).unwrap_or("?"),
        t.get("native_id").and_then(Value::as_u64).unwrap_or(0)
    )
}
