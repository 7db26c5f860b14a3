//! The registry's side of checkpoints, pauses and automatic restores (see
//! [`crate::checkpoint`] for the files and the trust rules).
//!
//! - After a successful cell of a session in `namespace` mode, a silent
//!   checkpoint cell is queued on its kernel before the result is returned;
//!   a task collects the file while the session is idle. The session's next
//!   cell (and a pause) waits for it.
//! - When a session that keeps checkpoints (or was paused) gets a new
//!   kernel, the kernel is given the latest checkpoint before any cell of
//!   its generation runs, and that generation's next result carries
//!   `restored` (what came back, from when, what was lost).
//! - A pause takes a checkpoint, stops the kernel (its memory freed) and
//!   journals the pause; the next cell resumes the session.
//! - In `process` mode the checkpoint is the kernel's whole tree dumped by
//!   CRIU (on request and on pause, never after each cell), and the new
//!   kernel of the next generation is that tree restored
//!   (`restore_process_kernel`) instead of a fresh one; a failed restore
//!   starts a fresh kernel and the note says why.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cellhost_kernel::{
    CellResult, CellStatus, ExecOptions, Kernel, KernelError, LostCell, LostName, RestoredState,
};
use serde::{Deserialize, Serialize};

use super::{Attach, Key, Registry, RegistryError, Slot, path_name};
use crate::checkpoint::{self, Checkpoint, CheckpointMode};
use crate::journal::{Journal, now_ms};

/// What a pause did.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseReport {
    /// The session.
    pub session: String,
    /// The generation that was stopped.
    pub generation: u64,
    /// The stopped worker's pid (gone now).
    pub pid: u32,
    /// The checkpoint the session resumes from.
    pub checkpoint: CheckpointSummary,
    /// Resident memory of the stopped worker just before the stop, bytes
    /// (`/proc/<pid>/status` VmRSS; 0 when unreadable).
    pub memory_freed_bytes: u64,
    /// When it was paused, milliseconds since the Unix epoch.
    pub paused_ms: i64,
    /// Wall time of the pause (checkpoint and stop), milliseconds.
    pub pause_ms: u64,
}

/// A paused session as [`Registry::paused_sessions`] lists it.
#[derive(Debug, Clone)]
pub struct PausedSession {
    /// Its key (the default key for one only the journal knows).
    pub key: Key,
    /// The generation that was stopped.
    pub generation: u64,
    /// When, milliseconds since the Unix epoch.
    pub paused_ms: i64,
    /// The checkpoint it resumes from.
    pub checkpoint: CheckpointSummary,
}

/// A checkpoint as a request's answer shows it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSummary {
    /// What it holds: `namespace` (the picklable names, listed in `saved`
    /// and `lost`) or `process` (a CRIU image of the kernel's whole tree:
    /// `saved` and `lost` stay empty). Absent in replies of older hosts:
    /// `namespace`.
    #[serde(default = "namespace_mode")]
    pub mode: CheckpointMode,
    /// Taken after the cell of this execution_count.
    pub execution_count: u64,
    /// When, milliseconds since the Unix epoch.
    pub taken_ms: i64,
    /// Size of the checkpoint file, bytes.
    pub bytes: u64,
    /// Names saved.
    pub saved: Vec<String>,
    /// Names left out, and why.
    pub lost: Vec<LostName>,
    /// Time the kernel took to write it, milliseconds.
    pub write_ms: u64,
}

impl From<&Checkpoint> for CheckpointSummary {
    fn from(c: &Checkpoint) -> Self {
        CheckpointSummary {
            mode: c.mode,
            execution_count: c.execution_count,
            taken_ms: c.taken_ms,
            bytes: c.bytes,
            saved: c.saved.clone(),
            lost: c.lost.clone(),
            write_ms: c.write_ms,
        }
    }
}

fn namespace_mode() -> CheckpointMode {
    CheckpointMode::Namespace
}

/// One checkpoint to write: where the kernel writes it, where the host
/// keeps it.
struct Job {
    host_tmp: PathBuf,
    stored: PathBuf,
    code: String,
    max_bytes: u64,
    mode: CheckpointMode,
    generation: u64,
    execution_count: u64,
    started: Instant,
}

impl Job {
    /// The checkpoint from the silent cell's result (the kernel's file
    /// taken into the store), or why there is none.
    fn finish(
        self,
        waited: Result<CellResult, KernelError>,
    ) -> (
        Result<Checkpoint, String>,
        Option<cellhost_kernel::BackgroundOutput>,
    ) {
        let r = match waited {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&self.host_tmp);
                return (Err(e.to_string()), None);
            }
        };
        let background = r.background_output.clone();
        let out = (|| {
            if r.status != CellStatus::Ok {
                let why = r
                    .error
                    .as_ref()
                    .map(|e| format!("{}: {}", e.ename, e.evalue))
                    .unwrap_or_default();
                return Err(format!("the checkpoint cell ended {} {why}", r.status.as_str()));
            }
            let report = checkpoint::parse_report(&r.stdout)?;
            if !report.ok {
                return Err(report
                    .error
                    .unwrap_or_else(|| "the kernel wrote no checkpoint".into()));
            }
            let bytes = checkpoint::collect(&self.host_tmp, &self.stored, self.max_bytes)?;
            let mut saved = report.saved;
            saved.extend(report.modules);
            Ok(Checkpoint {
                mode: self.mode,
                generation: self.generation,
                execution_count: self.execution_count,
                taken_ms: now_ms(),
                path: self.stored.clone(),
                bytes,
                saved,
                lost: report.lost,
                write_ms: self.started.elapsed().as_millis() as u64,
            })
        })();
        let _ = std::fs::remove_file(&self.host_tmp);
        (out, background)
    }
}

/// Makes `c` the slot's latest checkpoint (the file of the one before is
/// removed) and journals it.
fn keep(slot: &Slot, journal: Option<&Arc<Journal>>, c: Checkpoint) {
    let old = {
        let mut g = slot.lock();
        g.ckpt.replace(c.clone())
    };
    if let Some(old) = old
        && old.path != c.path
    {
        checkpoint::remove_stored(&old.path);
    }
    if let Some(j) = journal {
        j.checkpoint_saved(&slot.key.owner, &slot.key.session, &c);
    }
}

/// Appends background output a checkpoint cell saw to a user cell's result.
pub(crate) fn merge_background(r: &mut CellResult, b: cellhost_kernel::BackgroundOutput) {
    match r.background_output.as_mut() {
        None => r.background_output = Some(b),
        Some(mine) => {
            let mut out = b;
            out.stdout.push_str(&mine.stdout);
            out.stderr.push_str(&mine.stderr);
            out.dropped_bytes = out.dropped_bytes.saturating_add(mine.dropped_bytes);
            *mine = out;
        }
    }
}

/// The live kernel's writable directory: (the host's path, the kernel's).
fn kernel_dirs(g: &super::SlotInner) -> Option<(PathBuf, PathBuf)> {
    if let Some(d) = &g.ckpt_dir {
        return Some(d.clone());
    }
    let w = g.workdir.clone()?;
    let k = match &g.cwd_alias {
        Some((seen, real)) if *real == w => seen.clone(),
        _ => w.clone(),
    };
    // The workdir is the session's tmpfs: the host reaches it through its
    // holder.
    if let Some(h) = &g.disk {
        return Some((h.view(), k));
    }
    Some((w, k))
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn unavailable(message: impl Into<String>) -> RegistryError {
    RegistryError::Checkpoint {
        code: "checkpoint_unavailable",
        message: message.into(),
    }
}

/// `slot`'s live kernel, its generation and the execution count of its
/// last cell, for a checkpoint taken now.
///
/// # Errors
/// `checkpoint_unavailable` (no live kernel), a busy kernel.
fn idle_live_kernel(slot: &Slot) -> Result<(Kernel, u64, u64), RegistryError> {
    let (kernel, generation, count) = {
        let g = slot.lock();
        let k = g
            .lineage
            .live()
            .cloned()
            .ok_or_else(|| unavailable(format!("session {:?} has no live kernel", slot.key.session)))?;
        (k, g.lineage.generation(), g.last_count)
    };
    if kernel.is_busy() {
        return Err(RegistryError::Kernel(KernelError::KernelBusy {
            kernel: kernel.label().to_string(),
            cell: "running".into(),
        }));
    }
    Ok((kernel, generation, count))
}

impl Registry {
    /// The checkpoint mode of `key`'s session: a request's (or the
    /// journal's, for a session an earlier host ran), else the configured
    /// one for its name.
    pub fn checkpoint_mode(&self, key: &Key) -> CheckpointMode {
        let set = self.slot_if_any(key).and_then(|s| s.lock().ckpt_mode);
        set.unwrap_or_else(|| self.config().checkpoint.for_session(&key.session))
    }

    pub(super) fn effective_mode(&self, slot: &Slot) -> CheckpointMode {
        let set = slot.lock().ckpt_mode;
        set.unwrap_or_else(|| self.config().checkpoint.for_session(&slot.key.session))
    }

    /// Checks that `mode` can work for `key`'s session here.
    ///
    /// # Errors
    /// `checkpoint_unavailable`: `process` (CRIU cannot run here, with
    /// its error), `namespace` for a language other than Python.
    pub fn check_checkpoint_mode(&self, key: &Key, mode: CheckpointMode) -> Result<(), RegistryError> {
        match mode {
            CheckpointMode::Off => Ok(()),
            CheckpointMode::Process => self.check_process_mode(key),
            CheckpointMode::Namespace if key.language != "python" => Err(unavailable(format!(
                "namespace checkpoints are taken of Python sessions; session {:?} runs {}",
                key.session, key.language
            ))),
            CheckpointMode::Namespace => Ok(()),
        }
    }

    /// Sets the checkpoint mode of `key`'s session (from its next cell on).
    ///
    /// # Errors
    /// As [`Registry::check_checkpoint_mode`].
    pub fn set_checkpoint_mode(&self, key: &Key, mode: CheckpointMode) -> Result<(), RegistryError> {
        self.check_checkpoint_mode(key, mode)?;
        self.slot(key, None).lock().ckpt_mode = Some(mode);
        Ok(())
    }

    /// The session's latest checkpoint and whether it is paused.
    pub async fn checkpoint_of(&self, key: &Key) -> (Option<CheckpointSummary>, bool) {
        let slot = self.slot(key, None);
        self.load_checkpoint(&slot).await;
        let g = slot.lock();
        (g.ckpt.as_ref().map(CheckpointSummary::from), g.paused.is_some())
    }

    /// Reads the journal's checkpoint row of the slot's session once (a
    /// session an earlier host ran, or paused).
    pub(super) async fn load_checkpoint(&self, slot: &Arc<Slot>) {
        if std::mem::replace(&mut slot.lock().ckpt_loaded, true) {
            return;
        }
        let Some(j) = self.journal() else { return };
        match j.checkpoint_of(&slot.key.owner, &slot.key.session).await {
            Ok(Some((c, paused))) => {
                let mut g = slot.lock();
                if g.ckpt.is_none() && c.path.exists() {
                    if g.ckpt_mode.is_none() {
                        g.ckpt_mode = Some(c.mode);
                    }
                    g.paused = paused;
                    g.last_count = g.last_count.max(c.execution_count);
                    g.ckpt = Some(c);
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("checkpoint of {}: {e}", slot.key.session),
        }
    }

    /// The paths of a new checkpoint of the slot's live kernel.
    fn job(&self, slot: &Slot, kernel: &Kernel, generation: u64, count: u64) -> Result<Job, RegistryError> {
        if kernel.info().placement.is_some() {
            return Err(unavailable("checkpoints are taken of local kernels only"));
        }
        self.check_checkpoint_mode(&slot.key, CheckpointMode::Namespace)?;
        let (host_dir, kernel_dir, mode) = {
            let g = slot.lock();
            let (w, k) = kernel_dirs(&g)
                .ok_or_else(|| unavailable("the kernel has no working directory to write a checkpoint in"))?;
            (w, k, g.ckpt_mode)
        };
        let name = checkpoint::fresh_name("checkpoint");
        let kernel_path = kernel_dir.join(&name);
        let kernel_path = kernel_path
            .to_str()
            .ok_or_else(|| unavailable("the kernel's working directory is not UTF-8"))?;
        let store = self
            .ckpt_store
            .session_dir(&path_name(&slot.key.owner), &path_name(&slot.key.session))
            .map_err(|e| RegistryError::Checkpoint {
                code: "checkpoint_failed",
                message: format!("the checkpoint store: {e}"),
            })?;
        let max_bytes = self.config().checkpoint.max_bytes;
        Ok(Job {
            host_tmp: host_dir.join(&name),
            stored: store.join(format!("g{generation}-c{count}{name}.ckpt")),
            code: checkpoint::save_code(kernel_path, max_bytes, count),
            max_bytes,
            mode: mode.unwrap_or_else(|| self.config().checkpoint.for_session(&slot.key.session)),
            generation,
            execution_count: count,
            started: Instant::now(),
        })
    }

    fn silent(&self) -> ExecOptions {
        ExecOptions {
            silent: true,
            timeout: Some(self.config().checkpoint.timeout),
            ..Default::default()
        }
    }

    /// Queues a checkpoint after a successful cell; a task collects it.
    pub(super) fn schedule_checkpoint(&self, slot: &Arc<Slot>, kernel: &Kernel, generation: u64, count: u64) {
        let Ok(guard) = slot.ckpt_busy.clone().try_lock_owned() else {
            return;
        };
        let job = match self.job(slot, kernel, generation, count) {
            Ok(j) => j,
            Err(e) => {
                tracing::debug!("no checkpoint of {}: {e}", slot.key.session);
                return;
            }
        };
        let handle = match kernel.submit(job.code.clone(), self.silent()) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!("no checkpoint of {}: {e}", slot.key.session);
                return;
            }
        };
        let slot = slot.clone();
        let journal = self.journal().cloned();
        tokio::spawn(async move {
            let _busy = guard;
            let (out, background) = job.finish(handle.wait().await);
            if let Some(b) = background.filter(|b| !b.is_empty()) {
                slot.lock().carry_background = Some(b);
            }
            match out {
                Ok(c) => keep(&slot, journal.as_ref(), c),
                Err(e) => tracing::warn!("checkpoint of session {} failed: {e}", slot.key.session),
            }
        });
    }

    /// Takes a checkpoint of the live kernel now (after one in flight).
    ///
    /// # Errors
    /// `checkpoint_unavailable` (no live kernel, a remote kernel, not
    /// Python), `checkpoint_failed`, a busy kernel.
    pub async fn checkpoint_now(&self, key: &Key) -> Result<CheckpointSummary, RegistryError> {
        let slot = self.slot(key, None);
        let _attach = Attach::new(&slot);
        let _busy = slot.ckpt_busy.lock().await;
        let c = self.checkpoint_locked(&slot).await?;
        Ok(CheckpointSummary::from(&c))
    }

    async fn checkpoint_locked(&self, slot: &Arc<Slot>) -> Result<Checkpoint, RegistryError> {
        let (kernel, generation, count) = idle_live_kernel(slot)?;
        if self.effective_mode(slot) == CheckpointMode::Process {
            return self
                .process_checkpoint(slot, &kernel, generation, count, true)
                .await;
        }
        let job = self.job(slot, &kernel, generation, count)?;
        let handle = kernel.submit(job.code.clone(), self.silent())?;
        let (out, background) = job.finish(handle.wait().await);
        if let Some(b) = background.filter(|b| !b.is_empty()) {
            slot.lock().carry_background = Some(b);
        }
        let c = out.map_err(|message| RegistryError::Checkpoint {
            code: "checkpoint_failed",
            message,
        })?;
        keep(slot, self.journal(), c.clone());
        Ok(c)
    }

    /// Pauses `key`'s session: a checkpoint, then its kernel stopped; the
    /// journal records both (committed before this returns). The next cell
    /// resumes it.
    ///
    /// # Errors
    /// As [`Registry::checkpoint_now`] (the kernel is kept when the
    /// checkpoint fails); `checkpoint_failed` when the pause cannot be
    /// journaled.
    pub async fn pause(&self, key: &Key) -> Result<PauseReport, RegistryError> {
        let started = Instant::now();
        let slot = self.slot(key, None);
        let _attach = Attach::new(&slot);
        let _busy = slot.ckpt_busy.lock().await;
        let _spawn = slot.spawn_lock.lock().await;
        let process = self.effective_mode(&slot) == CheckpointMode::Process;
        let process_rss = if process {
            self.process_pause_dump(&slot).await?
        } else {
            None
        };
        let (c, process_rss) = match process_rss {
            Some((c, rss)) => (c, Some(rss)),
            None => (self.checkpoint_locked(&slot).await?, None),
        };
        let (kernel, generation) = {
            let mut g = slot.lock();
            let gen_ = g.lineage.generation();
            (g.lineage.take(), gen_)
        };
        let Some(kernel) = kernel else {
            return Err(unavailable("the kernel ended during the pause"));
        };
        let pid = kernel.info().pid;
        let memory_freed_bytes = process_rss.unwrap_or_else(|| rss_bytes(pid));
        let paused_ms = now_ms();
        slot.lock().paused = Some(paused_ms);
        if let Some(j) = self.journal() {
            j.kernel_ended(&key.owner, &key.session, generation, "paused");
            j.checkpoint_paused(&key.owner, &key.session, Some(paused_ms))
                .await
                .map_err(|e| RegistryError::Checkpoint {
                    code: "checkpoint_failed",
                    message: format!("the pause could not be journaled: {e}"),
                })?;
        }
        kernel.kill().await;
        Ok(PauseReport {
            session: key.session.clone(),
            generation,
            pid,
            checkpoint: CheckpointSummary::from(&c),
            memory_freed_bytes,
            paused_ms,
            pause_ms: started.elapsed().as_millis() as u64,
        })
    }

    /// Forgets the session's checkpoint and pause (a restart or kill: its
    /// state is dropped on purpose; no replay brings it back). `true` when
    /// there was one.
    pub async fn drop_checkpoint(&self, key: &Key) -> bool {
        let slot = self.slot(key, None);
        self.load_checkpoint(&slot).await;
        let had = {
            let mut g = slot.lock();
            g.paused = None;
            g.restored_note = None;
            g.no_replay_next = true;
            g.ckpt.take()
        };
        if let Some(j) = self.journal() {
            j.checkpoint_dropped(&key.owner, &key.session);
            j.state_dropped(&key.owner, &key.session);
        }
        match had {
            Some(c) => {
                checkpoint::remove_stored(&c.path);
                true
            }
            None => false,
        }
    }

    /// `owner`'s paused sessions: this host's, then those the journal
    /// records as paused (an earlier host's, with the default key), by
    /// name.
    pub async fn paused_sessions(&self, owner: &str) -> Vec<PausedSession> {
        let mut out: Vec<PausedSession> = self
            .all_slots()
            .into_iter()
            .filter(|s| s.key.owner == owner)
            .filter_map(|s| {
                let g = s.lock();
                let (at, c) = (g.paused?, g.ckpt.as_ref()?);
                Some(PausedSession {
                    key: s.key.clone(),
                    generation: c.generation,
                    paused_ms: at,
                    checkpoint: CheckpointSummary::from(c),
                })
            })
            .collect();
        if let Some(j) = self.journal() {
            match j.paused_sessions(owner).await {
                Ok(rows) => {
                    for (session, c, at) in rows {
                        let here = self.all_slots().into_iter().any(|s| {
                            s.key.owner == owner && s.key.session == session && {
                                let g = s.lock();
                                g.ckpt_loaded && g.paused.is_none()
                            }
                        });
                        if here || out.iter().any(|p| p.key.session == session) || !c.path.is_file() {
                            continue;
                        }
                        out.push(PausedSession {
                            key: self.key(owner, &session),
                            generation: c.generation,
                            paused_ms: at,
                            checkpoint: CheckpointSummary::from(&c),
                        });
                    }
                }
                Err(e) => tracing::warn!("paused sessions of {owner}: {e}"),
            }
        }
        out.sort_by(|a, b| a.key.session.cmp(&b.key.session));
        out
    }

    /// The key of `owner`'s paused session `session`: one this host paused,
    /// else one the journal records as paused (with the default key).
    pub async fn paused_key(&self, owner: &str, session: &str) -> Option<Key> {
        let here = self
            .all_slots()
            .into_iter()
            .find(|s| s.key.owner == owner && s.key.session == session && s.lock().paused.is_some());
        if let Some(s) = here {
            return Some(s.key.clone());
        }
        let j = self.journal()?;
        match j.checkpoint_of(owner, session).await {
            Ok(Some((_, Some(_)))) => Some(self.key(owner, session)),
            _ => None,
        }
    }

    /// The session's state from its latest checkpoint into `kernel`, the
    /// first kernel of `generation`, when the session keeps checkpoints or
    /// is paused and the checkpoint is of an earlier generation (each
    /// generation once).
    pub(super) async fn restore_into(
        &self,
        slot: &Arc<Slot>,
        kernel: &Kernel,
        generation: u64,
    ) -> Option<RestoredState> {
        let mode = self.effective_mode(slot);
        if slot
            .lock()
            .ckpt
            .as_ref()
            .is_some_and(|c| c.mode == CheckpointMode::Process)
        {
            return self.process_restore_note(slot, generation).await;
        }
        let (c, resumed, host_dir, kernel_dir) = {
            let mut g = slot.lock();
            let c = g.ckpt.clone()?;
            let resumed = g.paused.is_some();
            if !(resumed || mode == CheckpointMode::Namespace)
                || c.generation >= generation
                || g.restored_into == generation
            {
                return None;
            }
            g.restored_into = generation;
            let (w, k) = kernel_dirs(&g)?;
            (c, resumed, w, k)
        };
        let started = Instant::now();
        let mut note = RestoredState {
            lost: c.lost.clone(),
            ..self.restored_from(&slot.key, &c, "checkpoint", resumed).await
        };
        let outcome = self.run_restore(kernel, &c, &host_dir, &kernel_dir).await;
        match outcome {
            Ok(report) => {
                note.restored = report.restored;
                note.lost.extend(report.lost);
            }
            Err(e) => note.error = Some(e),
        }
        let redactor = self.config().template.redactor.clone();
        for l in &mut note.lost {
            l.reason = redactor.redact(&l.reason).into_owned();
            l.name = redactor.redact(&l.name).into_owned();
        }
        for n in &mut note.restored {
            *n = redactor.redact(n).into_owned();
        }
        note.restore_ms = started.elapsed().as_millis() as u64;
        if resumed {
            self.end_pause(slot).await;
        }
        Some(note)
    }

    /// A paused session was resumed: it is no longer paused, here and in
    /// the journal.
    async fn end_pause(&self, slot: &Slot) {
        slot.lock().paused = None;
        if let Some(j) = self.journal()
            && let Err(e) = j
                .checkpoint_paused(&slot.key.owner, &slot.key.session, None)
                .await
        {
            tracing::warn!("resume of {} not journaled: {e}", slot.key.session);
        }
    }

    async fn run_restore(
        &self,
        kernel: &Kernel,
        c: &Checkpoint,
        host_dir: &std::path::Path,
        kernel_dir: &std::path::Path,
    ) -> Result<checkpoint::Report, String> {
        if kernel.info().placement.is_some() {
            return Err("checkpoints are restored into local kernels only".into());
        }
        let name = checkpoint::fresh_name("restore");
        let host_path = host_dir.join(&name);
        let kernel_path = kernel_dir.join(&name);
        let kernel_path = kernel_path
            .to_str()
            .ok_or_else(|| "the kernel's working directory is not UTF-8".to_string())?
            .to_string();
        checkpoint::stage(&c.path, &host_path)
            .map_err(|e| format!("the checkpoint file could not be staged: {e}"))?;
        let opts = ExecOptions {
            resume_count: Some(c.execution_count),
            ..self.silent()
        };
        let waited = match kernel.submit(checkpoint::restore_code(&kernel_path), opts) {
            Ok(h) => h.wait().await,
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&host_path);
        let r = waited.map_err(|e| e.to_string())?;
        if r.status != CellStatus::Ok {
            return Err(format!(
                "the restore cell ended {}{}",
                r.status.as_str(),
                r.error
                    .map(|e| format!(": {}: {}", e.ename, e.evalue))
                    .unwrap_or_default()
            ));
        }
        let report = checkpoint::parse_report(&r.stdout)?;
        if !report.ok {
            return Err(report.error.unwrap_or_else(|| "the restore failed".into()));
        }
        Ok(report)
    }

    /// The note of a restore from checkpoint `c` (`source` `checkpoint` or
    /// `process`) before it runs: where from, and the cells it lacks.
    async fn restored_from(&self, key: &Key, c: &Checkpoint, source: &str, resumed: bool) -> RestoredState {
        RestoredState {
            source: source.into(),
            resumed,
            from_generation: c.generation,
            execution_count: c.execution_count,
            checkpoint_ms: c.taken_ms,
            lost_cells: self.cells_after(key, c).await,
            ..RestoredState::default()
        }
    }

    /// Cells of the session journaled after checkpoint `c` was taken (at
    /// most 100): their effects are not in it.
    async fn cells_after(&self, key: &Key, c: &Checkpoint) -> Vec<LostCell> {
        let Some(j) = self.journal() else {
            return Vec::new();
        };
        let Ok(cells) = j.history(&key.owner, &key.session).await else {
            return Vec::new();
        };
        cells
            .into_iter()
            .filter(|row| row.started_ms >= c.taken_ms)
            .take(100)
            .map(|row| LostCell {
                cell: row.id,
                execution_count: row.execution_count,
                status: row.status,
            })
            .collect()
    }
}

/// The layer a process checkpoint of a sandboxed session would lose.
const LANDLOCK_REFUSAL: &str = "process checkpoints are refused for sandboxed sessions: CRIU does not dump or \
restore Landlock domains, so a restored kernel would come back without its filesystem confinement (and \
its seccomp filter, namespaces and mounts would have to be rebuilt by CRIU outside the kernel init that \
sets them up); run the session with sandbox off for process checkpoints, or use checkpoint = \"namespace\"";

impl Registry {
    /// Checks that `process` checkpoints can work for `key`'s session: a
    /// working CRIU run as root, a local session without a sandbox.
    fn check_process_mode(&self, key: &Key) -> Result<(), RegistryError> {
        checkpoint::process_available().map_err(unavailable)?;
        if key.sandbox != cellhost_sandbox::profile::SandboxMode::Off {
            return Err(RegistryError::CheckpointLayer {
                layer: "landlock".into(),
                message: LANDLOCK_REFUSAL.into(),
            });
        }
        if key.placement != self.cfg.placements.default {
            return Err(unavailable("process checkpoints are taken of local kernels only"));
        }
        Ok(())
    }

    /// Dumps the slot's live kernel with CRIU into a fresh image directory
    /// of the store and keeps it as the session's latest checkpoint.
    async fn process_checkpoint(
        &self,
        slot: &Arc<Slot>,
        kernel: &Kernel,
        generation: u64,
        count: u64,
        leave_running: bool,
    ) -> Result<Checkpoint, RegistryError> {
        self.check_process_mode(&slot.key)?;
        if let Some(why) = kernel.process_checkpoint_refusal() {
            let layered = kernel.info().placement.is_none() && kernel.info().template.is_none();
            return Err(
                if layered && kernel.info().sandbox.layers.iter().any(|l| l.enforced) {
                    RegistryError::CheckpointLayer {
                        layer: "landlock".into(),
                        message: LANDLOCK_REFUSAL.into(),
                    }
                } else {
                    unavailable(why)
                },
            );
        }
        let failed = |message: String| RegistryError::Checkpoint {
            code: "checkpoint_failed",
            message,
        };
        let store = self
            .ckpt_store
            .session_dir(&path_name(&slot.key.owner), &path_name(&slot.key.session))
            .map_err(|e| failed(format!("the checkpoint store: {e}")))?;
        let dir = store.join(format!(
            "g{generation}-c{count}{}.criu",
            checkpoint::fresh_name("process")
        ));
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&dir)
            .map_err(|e| failed(format!("{}: {e}", dir.display())))?;
        let started = Instant::now();
        if let Err(e) = kernel
            .dump_process(&dir, leave_running, self.config().checkpoint.timeout)
            .await
        {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(failed(format!("criu could not dump the kernel: {e}")));
        }
        let c = Checkpoint {
            mode: CheckpointMode::Process,
            generation,
            execution_count: count,
            taken_ms: now_ms(),
            bytes: cellhost_kernel::criu::dir_bytes(&dir),
            path: dir,
            saved: Vec::new(),
            lost: Vec::new(),
            write_ms: started.elapsed().as_millis() as u64,
        };
        keep(slot, self.journal(), c.clone());
        Ok(c)
    }

    /// Before an idle kernel of a `process` session is stopped (evicted
    /// to make room, or reaped after its idle timeout): a process
    /// checkpoint, so the session's next cell gets it back. Skipped while
    /// another checkpoint or a pause of the session runs; a failure is
    /// logged (the kernel is stopped anyway).
    pub(super) async fn process_checkpoint_before_stop(&self, slot: &Arc<Slot>, kernel: &Kernel) {
        if self.effective_mode(slot) != CheckpointMode::Process || !kernel.is_alive() || kernel.is_busy() {
            return;
        }
        let Ok(_busy) = slot.ckpt_busy.clone().try_lock_owned() else {
            return;
        };
        let count = slot.lock().last_count;
        let generation = kernel.info().generation;
        if let Err(e) = self
            .process_checkpoint(slot, kernel, generation, count, true)
            .await
        {
            tracing::warn!(
                "no process checkpoint of {} before its kernel stopped: {e}",
                slot.key.session
            );
        }
    }

    /// A pause of a `process` session: the kernel dumped (the caller stops
    /// it); its resident memory just before.
    async fn process_pause_dump(&self, slot: &Arc<Slot>) -> Result<Option<(Checkpoint, u64)>, RegistryError> {
        let (kernel, generation, count) = idle_live_kernel(slot)?;
        let rss = rss_bytes(kernel.info().pid);
        // Left running and then stopped by the kernel init as any kernel
        // is: a tree CRIU kills itself leaves its worker to whichever
        // process adopts orphans, which may never reap it (and the pid a
        // restore needs stays taken).
        let c = self
            .process_checkpoint(slot, &kernel, generation, count, true)
            .await?;
        Ok(Some((c, rss)))
    }

    /// The kernel of `generation` restored from the session's process
    /// checkpoint, when it keeps process checkpoints (or was paused) and
    /// the checkpoint is of an earlier generation. `None`: no such
    /// checkpoint, or the restore failed (the slot remembers why; a fresh
    /// kernel is started and its first result says so).
    pub(super) async fn restore_process_kernel(&self, slot: &Arc<Slot>, generation: u64) -> Option<Kernel> {
        let mode = self.effective_mode(slot);
        let c = {
            let g = slot.lock();
            let c = g.ckpt.clone()?;
            let wanted = g.paused.is_some() || mode == CheckpointMode::Process;
            if c.mode != CheckpointMode::Process || !wanted || c.generation >= generation {
                return None;
            }
            c
        };
        let started = Instant::now();
        let outcome = match self.check_process_mode(&slot.key) {
            Err(e) => Err(e.to_string()),
            Ok(()) => {
                let (cfg, _tools) = self.kernel_config(slot, generation);
                {
                    let mut g = slot.lock();
                    g.workdir = Some(cfg.cwd.clone().unwrap_or_else(|| cfg.session_dir.clone()));
                    g.cwd_alias = None;
                    g.ckpt_dir = None;
                }
                match Kernel::restore_process(cfg, &c.path).await {
                    Ok(k) => {
                        // The host's count goes on from the restored
                        // worker's (a silent cell answers it unchanged).
                        let opts = ExecOptions {
                            resume_count: Some(c.execution_count),
                            ..self.silent()
                        };
                        match k.execute("None", opts).await {
                            Ok(r) if r.status == CellStatus::Ok => Ok(k),
                            Ok(r) => {
                                k.kill().await;
                                let said = r
                                    .background_output
                                    .as_ref()
                                    .map(|b| b.stderr.trim().to_string())
                                    .unwrap_or_default();
                                Err(format!(
                                    "the restored kernel's first cell ended {}: {}",
                                    r.status.as_str(),
                                    said.chars().take(400).collect::<String>()
                                ))
                            }
                            Err(e) => {
                                k.kill().await;
                                Err(format!("the restored kernel does not answer: {e}"))
                            }
                        }
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        let ms = started.elapsed().as_millis() as u64;
        let mut g = slot.lock();
        match outcome {
            Ok(k) => {
                g.process_restore = Some((generation, Ok(ms)));
                Some(k)
            }
            Err(e) => {
                tracing::warn!("process restore of {} failed: {e}", slot.key.session);
                g.process_restore = Some((generation, Err(e)));
                None
            }
        }
    }

    /// The `restored` note of a generation whose kernel came (or failed to
    /// come) from a process checkpoint.
    async fn process_restore_note(&self, slot: &Arc<Slot>, generation: u64) -> Option<RestoredState> {
        let (c, resumed, outcome) = {
            let mut g = slot.lock();
            let c = g.ckpt.clone()?;
            let outcome = match g.process_restore.take() {
                Some((gen_, o)) if gen_ == generation => o,
                other => {
                    g.process_restore = other;
                    return None;
                }
            };
            if g.restored_into == generation {
                return None;
            }
            g.restored_into = generation;
            (c, g.paused.is_some(), outcome)
        };
        let mut note = self.restored_from(&slot.key, &c, "process", resumed).await;
        match outcome {
            Ok(ms) => note.restore_ms = ms,
            Err(e) => note.error = Some(self.config().template.redactor.redact(&e).into_owned()),
        }
        if resumed {
            self.end_pause(slot).await;
        }
        Some(note)
    }
}
