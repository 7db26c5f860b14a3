//! Cells that outlive a call: the registry's table of submitted cells
//! ([`crate::requests::SubmitRequest`]), each with its status, the events
//! it produced so far (replayable from any offset), and its result.
//!
//! A session's submitted cells run one at a time in submission order (its
//! *turn*); a cell waiting for its turn is `queued` and can be dropped
//! without running. Events are kept up to [`EVENT_BYTES_KEPT`] bytes a cell
//! (later stream events are counted, not kept; the result always is), and
//! finished cells are remembered up to [`CELLS_KEPT`] (the oldest
//! forgotten first).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use cellhost_kernel::CellResult;
use serde::Serialize;
use serde_json::Value;

/// Finished submitted cells remembered.
pub const CELLS_KEPT: usize = 1000;

/// Bytes of events kept per cell (the final event always is).
pub const EVENT_BYTES_KEPT: usize = 4 * 1024 * 1024;

/// Where a submitted cell is.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DetachedStatus {
    /// Waiting behind the session's earlier submitted cells.
    Queued,
    /// Running.
    Running,
    /// It ran; its result is there (whatever its own status).
    Done,
    /// It could not run (the error says why).
    Failed,
    /// Dropped from the queue before it ran.
    Cancelled,
}

impl DetachedStatus {
    /// No more events will come.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            DetachedStatus::Done | DetachedStatus::Failed | DetachedStatus::Cancelled
        )
    }
}

/// One event of a submitted cell: `stream` (`{"name", "text"}`), `display`
/// (a display bundle), then one of `result` (the `CellResult`), `error`
/// (`{"code", "message"}`) or `cancelled`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellEvent {
    /// The event's name.
    pub event: &'static str,
    /// Its value.
    pub data: Value,
}

#[derive(Debug)]
struct State {
    status: DetachedStatus,
    events: Vec<CellEvent>,
    bytes: usize,
    events_dropped: u64,
    stdout: String,
    stderr: String,
    result: Option<CellResult>,
    error: Option<Value>,
    cancel: Option<Arc<AtomicBool>>,
}

/// A submitted cell.
#[derive(Debug)]
pub struct Tracked {
    /// Its id (the handle every surface names it by).
    pub id: String,
    /// Who submitted it.
    pub owner: String,
    /// Its session.
    pub session: String,
    /// The working directory of its session (part of the session's key:
    /// the daemon's same-named sessions of two directories are two
    /// sessions, with a queue each).
    pub cwd: Option<std::path::PathBuf>,
    state: Mutex<State>,
    /// The number of events so far, for followers.
    count: tokio::sync::watch::Sender<usize>,
}

/// A snapshot of a submitted cell.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize)]
pub struct CellSnapshot {
    /// Its id.
    pub cell: String,
    /// Its session.
    pub session: String,
    /// Where it is.
    pub status: DetachedStatus,
    /// Its output so far (live, rendered and redacted; at most
    /// [`EVENT_BYTES_KEPT`] bytes of events are kept).
    pub stdout: String,
    /// Its error output so far.
    pub stderr: String,
    /// Events so far (the next event's offset).
    pub events: usize,
    /// Stream events not kept (over [`EVENT_BYTES_KEPT`]).
    pub events_dropped: u64,
    /// The result, once `done`.
    pub result: Option<CellResult>,
    /// Why it could not run, once `failed`: `{"code", "message"}`.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub error: Option<Value>,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Tracked {
    /// A snapshot.
    pub fn snapshot(&self) -> CellSnapshot {
        let s = lock(&self.state);
        CellSnapshot {
            cell: self.id.clone(),
            session: self.session.clone(),
            status: s.status,
            stdout: s.stdout.clone(),
            stderr: s.stderr.clone(),
            events: s.events.len(),
            events_dropped: s.events_dropped,
            result: s.result.clone(),
            error: s.error.clone(),
        }
    }

    /// Its status.
    pub fn status(&self) -> DetachedStatus {
        lock(&self.state).status
    }

    /// Events from `offset` on, and whether the cell is final (no more
    /// will come).
    pub fn events_from(&self, offset: usize) -> (Vec<CellEvent>, bool) {
        let s = lock(&self.state);
        let from = offset.min(s.events.len());
        (s.events[from..].to_vec(), s.status.is_final())
    }

    /// A receiver that changes whenever an event is added.
    pub fn follow(&self) -> tokio::sync::watch::Receiver<usize> {
        self.count.subscribe()
    }

    fn push(&self, s: &mut State, ev: CellEvent, always: bool) {
        let size = ev.data.to_string().len();
        if !always && s.bytes + size > EVENT_BYTES_KEPT {
            s.events_dropped += 1;
            return;
        }
        s.bytes += size;
        s.events.push(ev);
        let n = s.events.len();
        self.count.send_replace(n);
    }

    /// Live output of the running cell.
    pub(crate) fn output(&self, stream: &str, text: String) {
        let mut s = lock(&self.state);
        let room = EVENT_BYTES_KEPT.saturating_sub(s.stdout.len() + s.stderr.len());
        if text.len() <= room {
            if stream == "stderr" {
                s.stderr.push_str(&text);
            } else {
                s.stdout.push_str(&text);
            }
        }
        let ev = CellEvent {
            event: "stream",
            data: serde_json::json!({"name": stream, "text": text}),
        };
        self.push(&mut s, ev, false);
    }

    /// A display of the running cell.
    pub(crate) fn display(&self, data: Value) {
        let mut s = lock(&self.state);
        self.push(
            &mut s,
            CellEvent {
                event: "display",
                data,
            },
            false,
        );
    }

    /// The cell starts (unless it was cancelled while queued: then false).
    pub(crate) fn start(&self, cancel: Arc<AtomicBool>) -> bool {
        let mut s = lock(&self.state);
        if s.status != DetachedStatus::Queued {
            return false;
        }
        s.status = DetachedStatus::Running;
        s.cancel = Some(cancel);
        drop(s);
        self.count.send_modify(|_| {});
        true
    }

    /// The cell ran.
    pub(crate) fn finish(&self, r: CellResult) {
        let mut s = lock(&self.state);
        s.status = DetachedStatus::Done;
        let data = serde_json::to_value(&r).unwrap_or(Value::Null);
        s.result = Some(r);
        self.push(
            &mut s,
            CellEvent {
                event: "result",
                data,
            },
            true,
        );
    }

    /// The cell could not run.
    pub(crate) fn fail(&self, error: Value) {
        let mut s = lock(&self.state);
        s.status = DetachedStatus::Failed;
        s.error = Some(error.clone());
        self.push(
            &mut s,
            CellEvent {
                event: "error",
                data: error,
            },
            true,
        );
    }

    /// Drops the cell if it is still queued; true when it was.
    pub(crate) fn dequeue(&self) -> bool {
        let mut s = lock(&self.state);
        if s.status != DetachedStatus::Queued {
            return false;
        }
        s.status = DetachedStatus::Cancelled;
        let data = serde_json::json!({"cell": self.id, "reason": "dropped from the queue before it ran"});
        self.push(
            &mut s,
            CellEvent {
                event: "cancelled",
                data,
            },
            true,
        );
        true
    }

    /// Sets the running cell's stop flag (the registry interrupts it).
    pub(crate) fn stop_flag(&self) -> Option<Arc<AtomicBool>> {
        lock(&self.state).cancel.clone()
    }
}

#[derive(Debug, Default)]
struct Table {
    cells: HashMap<String, Arc<Tracked>>,
    order: VecDeque<String>,
    turns: HashMap<(String, String, Option<std::path::PathBuf>), Arc<tokio::sync::Mutex<()>>>,
}

/// The registry's submitted cells.
#[derive(Debug, Default)]
pub struct DetachedCells {
    table: Mutex<Table>,
}

fn new_id() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    format!("b{:016x}", u64::from_le_bytes(b))
}

impl DetachedCells {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new queued cell of `owner`'s `session` working in `cwd`, and the
    /// session's turn.
    pub(crate) fn add(
        &self,
        owner: &str,
        session: &str,
        cwd: Option<std::path::PathBuf>,
    ) -> (Arc<Tracked>, Arc<tokio::sync::Mutex<()>>) {
        let t = Arc::new(Tracked {
            id: new_id(),
            owner: owner.to_string(),
            session: session.to_string(),
            cwd: cwd.clone(),
            state: Mutex::new(State {
                status: DetachedStatus::Queued,
                events: Vec::new(),
                bytes: 0,
                events_dropped: 0,
                stdout: String::new(),
                stderr: String::new(),
                result: None,
                error: None,
                cancel: None,
            }),
            count: tokio::sync::watch::channel(0).0,
        });
        let mut tb = self.table();
        tb.cells.insert(t.id.clone(), t.clone());
        tb.order.push_back(t.id.clone());
        // Forget the oldest final cells beyond the cap (never a live one).
        while tb.order.len() > CELLS_KEPT {
            let Some(pos) = tb
                .order
                .iter()
                .position(|id| tb.cells.get(id).is_none_or(|c| c.status().is_final()))
            else {
                break;
            };
            if let Some(id) = tb.order.remove(pos) {
                tb.cells.remove(&id);
            }
        }
        let turn = tb
            .turns
            .entry((owner.to_string(), session.to_string(), cwd))
            .or_default()
            .clone();
        (t, turn)
    }

    /// `owner`'s cell `id`.
    pub fn get(&self, owner: &str, id: &str) -> Option<Arc<Tracked>> {
        self.table().cells.get(id).filter(|c| c.owner == owner).cloned()
    }

    /// `owner`'s cells of `session` (in the directories of `scope`) that
    /// are queued or running, in submission order.
    pub fn pending(
        &self,
        owner: &str,
        session: &str,
        scope: &crate::requests::CwdScope,
    ) -> Vec<Arc<Tracked>> {
        let tb = self.table();
        tb.order
            .iter()
            .filter_map(|id| tb.cells.get(id))
            .filter(|c| c.owner == owner && c.session == session && !c.status().is_final())
            .filter(|c| scope.admits(&c.cwd))
            .cloned()
            .collect()
    }

    /// Whether any submitted cell is queued or running.
    pub fn any_pending(&self) -> bool {
        self.table().cells.values().any(|c| !c.status().is_final())
    }

    /// Drops `owner`'s queued cells of `session` (in the directories of
    /// `scope`); their ids.
    pub fn drop_queued(&self, owner: &str, session: &str, scope: &crate::requests::CwdScope) -> Vec<String> {
        self.pending(owner, session, scope)
            .into_iter()
            .filter(|c| c.dequeue())
            .map(|c| c.id.clone())
            .collect()
    }
}
