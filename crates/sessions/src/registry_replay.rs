//! The registry's side of a session's `restore` setting (see
//! [`crate::replay`]): what a new kernel of a session is given before any
//! cell of its generation runs.
//!
//! - A paused session resumes from its checkpoint, whatever the mode.
//! - `checkpoint`: the latest checkpoint, when the session keeps them.
//! - `replay`: after an unexpected end of the previous generation (not a
//!   restart, kill or `restore`), the checkpoint if there is one, then the
//!   journaled `ok` cells of the previous generation after it, in order, as
//!   silent cells of the new kernel; each replayed cell is journaled in the
//!   new generation (origin `replay`, context `{"replay_of": ID}`) with its
//!   original execution_count, so a later replay of this generation brings
//!   it back too. The worker's count is then set to where the original
//!   cells left it.
//! - `none`: nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_kernel::{
    CellStatus, ExecOptions, Kernel, LostCell, ReplayFailure, ReplayReport, ReplayedCell, RestoredState,
};

use super::{Key, Registry, Slot};
use crate::journal::{CellRow, CellStart, Journal};
use crate::replay::{DELIBERATE_ENDS, RestoreMode, resume_count_code};

/// How long the silent cell that sets the count may take.
const COUNT_CELL_TIMEOUT: Duration = Duration::from_secs(30);

impl Registry {
    /// The restore mode of `key`'s session: a request's (or the journal's,
    /// for a session an earlier host ran), else the configured one for its
    /// name.
    pub fn restore_mode(&self, key: &Key) -> RestoreMode {
        let set = self.slot_if_any(key).and_then(|s| s.lock().restore_mode);
        set.unwrap_or_else(|| self.config().restore.for_session(&key.session))
    }

    /// Sets `key`'s session's restore mode (kept in the journal with the
    /// session's own settings from its next kernel on).
    pub fn set_restore_mode(&self, key: &Key, mode: RestoreMode) {
        self.slot(key, None).lock().restore_mode = Some(mode);
    }

    /// `key`'s session, without a live kernel, has state its next kernel
    /// would get back (a checkpoint it keeps, or with `restore = "replay"`
    /// journaled cells of a generation that did not end on purpose): a
    /// caller that would start it afresh (HTTP's `POST /v1/sessions` after
    /// a restart of the server) leaves it to its next cell instead.
    pub async fn recoverable(&self, key: &Key) -> bool {
        if self.kernel(key).is_some() {
            return false;
        }
        let slot = self.slot(key, None);
        if slot.lock().restore_mode.is_none()
            && let Some(j) = self.journal()
            && let Ok(settings) = j.session_settings(&key.owner, &key.session).await
            && let Some(m) = settings.restore
        {
            slot.lock().restore_mode = Some(m);
        }
        let mode = self.restore_mode(key);
        if mode == RestoreMode::None {
            return false;
        }
        self.load_checkpoint(&slot).await;
        let has_ckpt = slot.lock().ckpt.is_some();
        if has_ckpt && self.checkpoint_mode(key) == crate::checkpoint::CheckpointMode::Namespace {
            return true;
        }
        if mode != RestoreMode::Replay {
            return false;
        }
        let Some(j) = self.journal() else { return false };
        let last = j.max_generation(&key.owner, &key.session).await.unwrap_or(0);
        if last == 0 {
            return false;
        }
        if let Ok(Some(why)) = j.kernel_end_reason(&key.owner, &key.session, last).await
            && DELIBERATE_ENDS.contains(&why.as_str())
        {
            return false;
        }
        j.history(&key.owner, &key.session)
            .await
            .is_ok_and(|rows| rows.iter().any(|c| c.generation == last && c.status == "ok"))
    }

    /// The hint of a `crashed` result in `slot`'s session when its next
    /// kernel gets state back (a checkpoint it keeps, or a replay of the
    /// journal), instead of the kernel's "the variables are gone"; `None`
    /// when the next kernel starts empty.
    pub(super) fn crash_hint(&self, slot: &Slot) -> Option<String> {
        let mode = self.restore_mode(&slot.key);
        let ckpt = slot.lock().ckpt.as_ref().map(|c| c.execution_count);
        match (mode, ckpt) {
            (RestoreMode::None, _) | (RestoreMode::Checkpoint, None) => None,
            (RestoreMode::Checkpoint, Some(n)) => Some(format!(
                "The worker died; the next cell starts a new kernel restored from the session's checkpoint \
                 (taken after execution count {n}): what ran after it is lost. The result's `restored` says what came back."
            )),
            (RestoreMode::Replay, Some(n)) => Some(format!(
                "The worker died; the next cell starts a new kernel restored from the session's checkpoint \
                 (taken after execution count {n}), then re-runs the journaled cells after it (restore = replay)."
            )),
            (RestoreMode::Replay, None) => Some(
                "The worker died; the next cell starts a new kernel that first re-runs this session's \
                 journaled cells (restore = replay). The result's `restored` says what came back."
                    .into(),
            ),
        }
    }

    /// Marks `key`'s session so its next kernel replays nothing (its state
    /// is dropped on purpose, or rebuilt by a caller).
    pub(super) fn skip_next_replay(&self, slot: &Slot) {
        slot.lock().no_replay_next = true;
    }

    /// What the new kernel `kernel`, the first of `generation`, is given
    /// before any cell of its generation runs (see the module's rules).
    pub(super) async fn recover_into(
        &self,
        slot: &Arc<Slot>,
        kernel: &Kernel,
        generation: u64,
    ) -> Option<RestoredState> {
        let mode = self.restore_mode(&slot.key);
        let (paused, dropped) = {
            let mut g = slot.lock();
            (g.paused.is_some(), std::mem::take(&mut g.no_replay_next))
        };
        match mode {
            _ if paused => return self.restore_into(slot, kernel, generation).await,
            RestoreMode::Checkpoint => return self.restore_into(slot, kernel, generation).await,
            RestoreMode::None => return None,
            RestoreMode::Replay if dropped => return None,
            RestoreMode::Replay => {}
        }
        let dead = generation.checked_sub(1).filter(|d| *d > 0)?;
        let j = self.journal()?.clone();
        let (owner, session) = (&slot.key.owner, &slot.key.session);
        match j.kernel_end_reason(owner, session, dead).await {
            Ok(Some(why)) if DELIBERATE_ENDS.contains(&why.as_str()) => return None,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("no replay for session {session}: {e}");
                return None;
            }
        }
        let note = self.restore_into(slot, kernel, generation).await;
        // The cells after a restored checkpoint; all of them without one.
        let after = note
            .as_ref()
            .filter(|n| n.error.is_none())
            .map(|n| n.execution_count);
        let cells: Vec<CellRow> = match j.history(owner, session).await {
            Ok(rows) => rows
                .into_iter()
                .filter(|c| c.generation == dead && after.is_none_or(|f| c.execution_count > f))
                .collect(),
            Err(e) => {
                tracing::warn!("no replay for session {session}: {e}");
                return note;
            }
        };
        if cells.is_empty() {
            return note;
        }
        let started = Instant::now();
        let mut note = note.unwrap_or_else(|| RestoredState {
            source: "replay".into(),
            from_generation: dead,
            ..RestoredState::default()
        });
        if note.source == "checkpoint" {
            note.source = "checkpoint+replay".into();
        }
        let (report, lost, count) = self
            .replay_cells(
                &slot.key,
                &j,
                kernel,
                generation,
                dead,
                &cells,
                after.unwrap_or(0),
            )
            .await;
        let redactor = self.config().template.redactor.clone();
        note.lost_cells = lost;
        note.execution_count = count;
        note.replay = Some(report).map(|mut r| {
            if let Some(f) = r.failed.as_mut() {
                f.error = redactor.redact(&f.error).into_owned();
            }
            r
        });
        note.restore_ms = note
            .restore_ms
            .saturating_add(started.elapsed().as_millis() as u64);
        Some(note)
    }

    /// Runs journaled cell `c` again in `kernel` as a silent cell within
    /// `left` of the replay's `bound`, journaled in `generation` as a replay
    /// of it with its original execution count.
    #[allow(clippy::too_many_arguments)]
    async fn replay_one(
        &self,
        key: &Key,
        j: &Arc<Journal>,
        kernel: &Kernel,
        generation: u64,
        c: &CellRow,
        left: Duration,
        bound: Duration,
    ) -> Step {
        let t0 = Instant::now();
        let opts = ExecOptions {
            silent: true,
            timeout: Some(left),
            ..ExecOptions::default()
        };
        let handle = match kernel.submit(c.code.clone(), opts) {
            Ok(h) => h,
            Err(e) => {
                return Step::Failed {
                    status: "not_run".into(),
                    error: e.to_string(),
                };
            }
        };
        let start = CellStart {
            id: handle.id().to_string(),
            owner: key.owner.clone(),
            session: key.session.clone(),
            generation,
            code: c.code.clone(),
            origin: "replay".into(),
            context: Some(serde_json::json!({"replay_of": c.id})),
        };
        j.cell_started(start.clone());
        let mut r = match handle.wait().await {
            Ok(r) => r,
            Err(e) => {
                if let Err(je) = j.cell_failed(&start.id, "failed", &e.to_string()).await {
                    tracing::warn!("{je}");
                }
                return Step::Failed {
                    status: "failed".into(),
                    error: e.to_string(),
                };
            }
        };
        // Journaled as the original cell: its count, this generation.
        r.execution_count = c.execution_count;
        r.kernel.session = key.session.clone();
        r.kernel.generation = generation;
        if let Err(e) = j.cell_settled(&start, &r).await {
            tracing::warn!("replayed cell {} not journaled: {e}", r.cell_id);
        }
        match r.status {
            CellStatus::Ok => Step::Replayed(ReplayedCell {
                cell: c.id.clone(),
                execution_count: c.execution_count,
                duration_ms: t0.elapsed().as_millis() as u64,
            }),
            CellStatus::Timeout => Step::Cut(format!(
                "the replay reached its time bound of {} s (restore.timeout_s) in cell {}",
                bound.as_secs_f64(),
                c.id
            )),
            status => Step::Failed {
                status: status.as_str().to_string(),
                error: r
                    .error
                    .as_ref()
                    .map(|e| format!("{}: {}", e.ename, e.evalue))
                    .unwrap_or_else(|| format!("its replay ended {}", status.as_str())),
            },
        }
    }

    /// Runs `cells` (one generation's, oldest first) again in `kernel`:
    /// the `ok` ones as silent cells until one fails or a bound is
    /// reached. Returns the report, the cells whose effects are lost, and
    /// the execution_count the kernel continues from (`count` is the
    /// restored checkpoint's).
    #[allow(clippy::too_many_arguments)]
    async fn replay_cells(
        &self,
        key: &Key,
        j: &Arc<Journal>,
        kernel: &Kernel,
        generation: u64,
        dead: u64,
        cells: &[CellRow],
        mut count: u64,
    ) -> (ReplayReport, Vec<LostCell>, u64) {
        let bounds = self.config().restore.clone();
        let started = Instant::now();
        let mut report = ReplayReport {
            from_generation: dead,
            ..ReplayReport::default()
        };
        let mut lost = Vec::new();
        let lost_cell = |c: &CellRow| LostCell {
            cell: c.id.clone(),
            execution_count: c.execution_count,
            status: c.status.clone(),
        };
        let original = cells.iter().map(|c| c.execution_count).max().unwrap_or(0);
        let mut stopped = false;
        for c in cells {
            if stopped || c.status != "ok" {
                lost.push(lost_cell(c));
                continue;
            }
            let left = bounds.timeout.saturating_sub(started.elapsed());
            let step = if left.is_zero() {
                Step::Cut(format!(
                    "the replay reached its time bound of {} s (restore.timeout_s)",
                    bounds.timeout.as_secs_f64()
                ))
            } else if report.replayed.len() >= bounds.max_cells {
                Step::Cut(format!(
                    "the replay reached its bound of {} cells (restore.max_cells)",
                    bounds.max_cells
                ))
            } else {
                self.replay_one(key, j, kernel, generation, c, left, bounds.timeout)
                    .await
            };
            match step {
                Step::Replayed(cell) => {
                    count = c.execution_count;
                    report.replayed.push(cell);
                }
                Step::Cut(why) => {
                    report.cut = Some(why);
                    stopped = true;
                    lost.push(lost_cell(c));
                }
                Step::Failed { status, error } => {
                    report.failed = Some(ReplayFailure {
                        cell: c.id.clone(),
                        execution_count: c.execution_count,
                        status,
                        error,
                    });
                    stopped = true;
                    lost.push(lost_cell(c));
                }
            }
        }
        // A whole replay leaves the count where the original cells did
        // (failed cells took numbers too); a stopped one at the last cell
        // that came back.
        if !stopped {
            count = count.max(original);
        }
        if kernel.is_alive() {
            let opts = ExecOptions {
                silent: true,
                timeout: Some(COUNT_CELL_TIMEOUT),
                resume_count: Some(count),
                ..ExecOptions::default()
            };
            let set = match kernel.submit(resume_count_code(count), opts) {
                Ok(h) => h.wait().await.map(|r| r.status),
                Err(e) => Err(e),
            };
            if !matches!(set, Ok(CellStatus::Ok)) {
                tracing::warn!(
                    "session {}: the count after a replay was not set: {set:?}",
                    key.session
                );
            }
        }
        report.replay_ms = started.elapsed().as_millis() as u64;
        (report, lost, count)
    }
}

/// How one replayed cell ended.
enum Step {
    /// It ran `ok`.
    Replayed(ReplayedCell),
    /// A bound stopped it (why).
    Cut(String),
    /// It did not run, or ended otherwise than `ok`.
    Failed { status: String, error: String },
}
