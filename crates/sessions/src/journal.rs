//! The session journal: SQLite in WAL mode, written by one dedicated thread.
//!
//! Tables: `sessions`, `kernels` (one row per generation: pid, start, end and
//! why), `cells` (code, status, timings, redacted output head + tail,
//! displays' files, tool calls, origin, audit context, files opened) and
//! `tool_calls` (one row per host call).
//!
//! Durability: `journal_mode=WAL` with `synchronous=NORMAL`. A commit is a
//! `write()` of the transaction's frames to the `-wal` file; once it
//! returned, the data is in the operating system's page cache and survives
//! the death of the *process* (SIGKILL, panic, OOM kill), which is the
//! failure the journal must survive. Only a crash of the whole machine can
//! lose the last few commits, and WAL never corrupts the database either
//! way. `synchronous=FULL` would add an `fsync` per cell (milliseconds on a
//! loaded disk) for power-loss durability; [`Durability::Full`] selects it.
//!
//! Every write goes through a channel to the writer thread, so no async task
//! blocks on SQLite. A cell is written as `running` when it starts (fire and
//! forget: the channel keeps the order), and its settled row is committed
//! *before* [`Journal::cell_settled`] returns, so a caller never holds a
//! result that the journal lacks. Rows still `running` when a journal is
//! opened belong to a host that died: they are marked `lost`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use cellhost_kernel::CellResult;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::journal_schema::{self, SchemaError};

/// Bytes of stdout/stderr kept at each end (head and tail) of a cell's row.
pub const OUTPUT_KEEP: usize = 4096;

/// Errors of the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// SQLite failed.
    #[error("journal {path}: {source}")]
    Sqlite {
        /// Database file.
        path: String,
        /// The error.
        #[source]
        source: rusqlite::Error,
    },
    /// The writer thread is gone (the journal was closed).
    #[error("journal {0}: closed")]
    Closed(String),
    /// The file's schema cannot be used or brought up to date (see
    /// [`crate::journal_schema`]).
    #[error("journal {path}: {source}")]
    Schema {
        /// Database file.
        path: String,
        /// Why.
        #[source]
        source: SchemaError,
    },
    /// I/O around the database file.
    #[error("journal {path}: {source}")]
    Io {
        /// Database file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// How hard a commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// `synchronous=NORMAL`: survives a process kill (the default).
    #[default]
    Normal,
    /// `synchronous=FULL`: an fsync per commit, survives power loss.
    Full,
}

/// What is known of a cell when it starts.
#[derive(Debug, Clone, Default)]
pub struct CellStart {
    /// Cell id (the kernel's).
    pub id: String,
    /// Owner of the session.
    pub owner: String,
    /// Session name.
    pub session: String,
    /// Kernel generation running it.
    pub generation: u64,
    /// Source code.
    pub code: String,
    /// Who asked for it (`cli:run`, `mcp`, `restore`, …).
    pub origin: String,
    /// Caller-provided audit context (a JSON object), if any.
    pub context: Option<Value>,
}

/// A journaled cell, as `cellhost history` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRow {
    /// Cell id.
    pub id: String,
    /// Owner.
    pub owner: String,
    /// Session.
    pub session: String,
    /// Kernel generation.
    pub generation: u64,
    /// Jupyter execution count (0 while running or lost).
    pub execution_count: u64,
    /// Source code.
    pub code: String,
    /// `running`, `ok`, `error`, `timeout`, `interrupted`, `crashed`, `lost`.
    pub status: String,
    /// Start, ms since the epoch.
    pub started_ms: i64,
    /// End, ms since the epoch.
    pub ended_ms: Option<i64>,
    /// Wall time the kernel reported.
    pub duration_ms: Option<i64>,
    /// First bytes of stdout (redacted).
    pub stdout_head: String,
    /// Last bytes of stdout when it was longer than head + tail.
    pub stdout_tail: String,
    /// First bytes of stderr.
    pub stderr_head: String,
    /// Last bytes of stderr.
    pub stderr_tail: String,
    /// Files of the displays (figures).
    pub display_files: Vec<String>,
    /// Host calls (the result's `tool_calls`).
    pub tool_calls: Value,
    /// The caller's origin.
    pub origin: String,
    /// The caller's audit context.
    pub context: Option<Value>,
    /// Files opened for reading.
    pub files_read: Vec<String>,
    /// Files opened for writing.
    pub files_written: Vec<String>,
    /// More files were opened than kept.
    pub files_truncated: bool,
    /// `ename: evalue` of an error.
    pub error: Option<String>,
}

/// A kernel generation of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRow {
    /// Generation.
    pub generation: u64,
    /// Worker pid.
    pub pid: u32,
    /// Start, ms since the epoch.
    pub started_ms: i64,
    /// End, ms since the epoch.
    pub ended_ms: Option<i64>,
    /// Why it ended.
    pub end_reason: Option<String>,
    /// A forked kernel's parent session (same owner); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session: Option<String>,
    /// The parent's kernel generation the fork was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_generation: Option<u64>,
    /// The fork point: the parent's `execution_count` when it was forked
    /// (the forked kernel's cells count on from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_point: Option<u64>,
    /// Where it ran (`None`: locally, on the host): the placement's name
    /// and kind, the node and the scheduler's job or pod id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<cellhost_kernel::KernelPlacement>,
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The journal handle; cheap to share behind an `Arc`.
pub struct Journal {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    path: PathBuf,
    lost_at_open: u64,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A session's own settings as the journal keeps them (`sessions.settings`,
/// JSON): the limits a request resolved for it and the network policy a
/// request gave it, and its restore mode. Absent fields: the configured ones.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SessionSettings {
    /// The limits the session asked for (request, rule or default table
    /// values), resolved again against the host's policy when applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::limits::SessionLimits>,
    /// The network policy (`off`, `on` or the list's rules, as
    /// [`cellhost_kernel::egress::NetworkPolicy::to_text`] writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// What the session gets back after an unexpected death
    /// ([`crate::replay::RestoreMode`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<crate::replay::RestoreMode>,
}

impl SessionSettings {
    /// Nothing of the session's own.
    pub fn is_empty(&self) -> bool {
        self.limits.is_none() && self.network.is_none() && self.restore.is_none()
    }

    /// The settings of a journal row; an unreadable one (written by hand,
    /// or by a build with other fields) is empty, logged.
    pub fn parse(text: &str) -> SessionSettings {
        serde_json::from_str(text).unwrap_or_else(|e| {
            tracing::warn!("journal: unreadable session settings ignored: {e}");
            SessionSettings::default()
        })
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn open_conn(path: &Path, durability: Durability) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(
        None,
        "synchronous",
        match durability {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        },
    )?;
    Ok(conn)
}

/// Head and tail of `s`, each at most [`OUTPUT_KEEP`] bytes; the tail is
/// empty when the whole text fits in the head and the tail.
pub fn head_tail(s: &str) -> (String, String) {
    if s.len() <= 2 * OUTPUT_KEEP {
        return (s.to_string(), String::new());
    }
    let mut h = OUTPUT_KEEP;
    while !s.is_char_boundary(h) {
        h -= 1;
    }
    let mut t = s.len() - OUTPUT_KEEP;
    while !s.is_char_boundary(t) {
        t += 1;
    }
    (s[..h].to_string(), s[t..].to_string())
}

impl Journal {
    /// Opens (or creates) the journal at `path`, marks cells a dead host left
    /// `running` as `lost` and kernels it left open as ended.
    ///
    /// # Errors
    /// [`JournalError`] when the file cannot be created or read as SQLite.
    pub fn open(path: impl Into<PathBuf>, durability: Durability) -> Result<Journal, JournalError> {
        let path = path.into();
        let pstr = path.display().to_string();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| JournalError::Io {
                path: pstr.clone(),
                source,
            })?;
        }
        let sq = |source| JournalError::Sqlite {
            path: pstr.clone(),
            source,
        };
        let mut conn = open_conn(&path, durability).map_err(sq)?;
        journal_schema::migrate(&mut conn).map_err(|source| JournalError::Schema {
            path: pstr.clone(),
            source,
        })?;
        let now = now_ms();
        let lost = conn
            .execute(
                "UPDATE cells SET status='lost', ended_ms=?1 WHERE status='running'",
                params![now],
            )
            .map_err(sq)? as u64;
        conn.execute(
            "UPDATE kernels SET ended_ms=?1, end_reason='the host ended without closing it' WHERE ended_ms IS NULL",
            params![now],
        )
        .map_err(sq)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("cellhost-journal".into())
            .spawn(move || {
                let mut conn = conn;
                while let Ok(job) = rx.recv() {
                    job(&mut conn);
                }
                let _ = conn.pragma_update(None, "wal_checkpoint", "TRUNCATE");
            })
            .map_err(|source| JournalError::Io {
                path: pstr.clone(),
                source,
            })?;
        Ok(Journal {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            path,
            lost_at_open: lost,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Cells found `running` (and marked `lost`) when the journal was opened.
    pub fn lost_at_open(&self) -> u64 {
        self.lost_at_open
    }

    fn send(&self, job: Job) -> Result<(), JournalError> {
        let guard = self
            .tx
            .lock()
            .map_err(|_| JournalError::Closed(self.path.display().to_string()))?;
        guard
            .as_ref()
            .and_then(|tx| tx.send(job).ok())
            .ok_or_else(|| JournalError::Closed(self.path.display().to_string()))
    }

    /// Runs `f` on the writer thread and waits for its answer.
    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, JournalError> {
        let (reply, rx) = oneshot::channel();
        self.send(Box::new(move |c| {
            let _ = reply.send(f(c));
        }))?;
        let pstr = self.path.display().to_string();
        match rx.await {
            Ok(r) => r.map_err(|source| JournalError::Sqlite { path: pstr, source }),
            Err(_) => Err(JournalError::Closed(pstr)),
        }
    }

    fn fire(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<()> + Send + 'static,
    ) {
        let path = self.path.display().to_string();
        let r = self.send(Box::new(move |c| {
            if let Err(e) = f(c) {
                tracing::warn!("journal {path}: {what}: {e}");
            }
        }));
        if let Err(e) = r {
            tracing::warn!("{e}");
        }
    }

    /// Records that a session exists (or was used again): its interpreter,
    /// working directory, tools label, sandbox profile, language (the
    /// runtime name, `python` or `r`, that `restore` replays it in) and its
    /// own limits and network policy (`settings`; empty: the configured
    /// ones).
    #[allow(clippy::too_many_arguments)]
    pub fn session_used(
        &self,
        owner: &str,
        session: &str,
        python: &str,
        cwd: &str,
        tools: &str,
        profile: &str,
        language: &str,
        settings: &SessionSettings,
    ) {
        let a = [owner, session, python, cwd, tools, profile, language].map(str::to_string);
        let settings = (!settings.is_empty()).then(|| serde_json::to_string(settings).unwrap_or_default());
        self.fire("session", move |c| {
            let now = now_ms();
            c.execute(
                "INSERT INTO sessions (owner, session, created_ms, last_used_ms, python, cwd, tools, profile, language, settings)
                 VALUES (?1, ?2, ?3, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (owner, session) DO UPDATE SET last_used_ms=?3, python=?4, cwd=?5, tools=?6, profile=?7, language=?8, settings=?9",
                params![a[0], a[1], now, a[2], a[3], a[4], a[5], a[6], settings],
            )?;
            Ok(())
        });
    }

    /// Forgets the session's own settings (it was killed or deleted: its
    /// name, used again, is a new session under the configured ones).
    pub fn session_forgotten(&self, owner: &str, session: &str) {
        let (o, s) = (owner.to_string(), session.to_string());
        self.fire("session forgotten", move |c| {
            c.execute(
                "UPDATE sessions SET settings=NULL WHERE owner=?1 AND session=?2",
                params![o, s],
            )?;
            Ok(())
        });
    }

    /// The own limits and network policy the session's last kernel ran
    /// under, as [`Journal::session_used`] recorded them (empty when the
    /// journal does not know the session, it had none of its own, or the
    /// row is unreadable).
    ///
    /// # Errors
    /// [`JournalError`].
    pub async fn session_settings(
        &self,
        owner: &str,
        session: &str,
    ) -> Result<SessionSettings, JournalError> {
        let (o, s) = (owner.to_string(), session.to_string());
        self.call(move |c| query_settings(c, &o, &s)).await
    }

    /// The language a session's kernels last ran (`python`, `r`), `None`
    /// when the journal does not know the session or it was journaled
    /// before languages were (those sessions ran Python).
    ///
    /// # Errors
    /// [`JournalError`].
    pub async fn session_language(&self, owner: &str, session: &str) -> Result<Option<String>, JournalError> {
        let (o, s) = (owner.to_string(), session.to_string());
        self.call(move |c| query_language(c, &o, &s)).await
    }

    /// Burns a remote agent's credential nonce: `Ok(true)` when it was
    /// fresh (and is now recorded, committed before this returns),
    /// `Ok(false)` when it was used before. The host refuses the agent on
    /// `false` or an error.
    ///
    /// # Errors
    /// [`JournalError`] (SQLite, or the journal closed).
    pub async fn burn_nonce(&self, nonce: &str) -> Result<bool, JournalError> {
        let n = nonce.to_string();
        self.call(move |c| {
            let added = c.execute(
                "INSERT OR IGNORE INTO credential_nonces (nonce, used_ms) VALUES (?1, ?2)",
                params![n, now_ms()],
            )?;
            Ok(added == 1)
        })
        .await
    }

    /// Records a new kernel generation.
    pub fn kernel_started(
        &self,
        owner: &str,
        session: &str,
        generation: u64,
        pid: u32,
        placement: Option<&cellhost_kernel::KernelPlacement>,
    ) {
        let (o, s) = (owner.to_string(), session.to_string());
        let placement = placement.and_then(|p| serde_json::to_string(p).ok());
        self.fire("kernel start", move |c| {
            c.execute(
                "INSERT OR REPLACE INTO kernels (owner, session, generation, pid, started_ms, placement) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![o, s, generation as i64, pid, now_ms(), placement],
            )?;
            Ok(())
        });
    }

    /// Records that `generation` of `session` was forked from
    /// `parent_generation` of `parent_session` (same owner) when the
    /// parent's `execution_count` was `fork_point`.
    pub fn kernel_forked(
        &self,
        owner: &str,
        session: &str,
        generation: u64,
        parent_session: &str,
        parent_generation: u64,
        fork_point: u64,
    ) {
        let (o, s, p) = (owner.to_string(), session.to_string(), parent_session.to_string());
        self.fire("kernel fork", move |c| {
            c.execute(
                "UPDATE kernels SET parent_session=?4, parent_generation=?5, fork_point=?6 WHERE owner=?1 AND session=?2 AND generation=?3",
                params![o, s, generation as i64, p, parent_generation as i64, fork_point as i64],
            )?;
            Ok(())
        });
    }

    /// Records the end of a kernel generation and why.
    pub fn kernel_ended(&self, owner: &str, session: &str, generation: u64, reason: &str) {
        let (o, s, r) = (owner.to_string(), session.to_string(), reason.to_string());
        self.fire("kernel end", move |c| {
            c.execute(
                "UPDATE kernels SET ended_ms=?4, end_reason=?5 WHERE owner=?1 AND session=?2 AND generation=?3 AND ended_ms IS NULL",
                params![o, s, generation as i64, now_ms(), r],
            )?;
            Ok(())
        });
    }

    /// Writes a cell as `running` (ordered before its settled row).
    pub fn cell_started(&self, cell: CellStart) {
        self.fire("cell start", move |c| {
            c.execute(
                "INSERT OR REPLACE INTO cells (id, owner, session, generation, code, status, started_ms, origin, context)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, ?7, ?8)",
                params![
                    cell.id,
                    cell.owner,
                    cell.session,
                    cell.generation as i64,
                    cell.code,
                    now_ms(),
                    cell.origin,
                    cell.context.map(|v| v.to_string()),
                ],
            )?;
            Ok(())
        });
    }

    /// Writes a settled cell and waits until it is committed. Its row
    /// records the run, not a wait behind earlier cells: `started_ms` is
    /// when the cell started running (its end less its `duration_ms`).
    ///
    /// # Errors
    /// [`JournalError`] if the row could not be written.
    pub async fn cell_settled(&self, start: &CellStart, r: &CellResult) -> Result<(), JournalError> {
        let start = start.clone();
        let (oh, ot) = head_tail(&r.stdout);
        let (eh, et) = head_tail(&r.stderr);
        let displays: Vec<String> = r
            .displays
            .iter()
            .flat_map(|d| d.data.values())
            .chain(r.result.iter().flat_map(|b| b.values()))
            .filter_map(|v| v.get("path").and_then(Value::as_str).map(str::to_string))
            .collect();
        let tool_calls = serde_json::to_value(&r.tool_calls).unwrap_or(Value::Null);
        let files = r.files.clone().unwrap_or_default();
        let error = r.error.as_ref().map(|e| format!("{}: {}", e.ename, e.evalue));
        let calls = r.tool_calls.clone();
        let denied = r.network.as_ref().map(|n| n.denied.clone()).unwrap_or_default();
        let id = r.cell_id.clone();
        let status = r.status.as_str();
        let (ec, dur) = (r.execution_count as i64, r.duration_ms as i64);
        // The run's end as the driver stamped it (a queued cell's row then
        // starts no earlier than the row of the cell it waited for).
        let ended = r
            .settled_at
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or_else(now_ms, |d| d.as_millis() as i64);
        let generation = r.kernel.generation as i64;
        self.call(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO cells (id, owner, session, generation, execution_count, code, status, started_ms,
                   ended_ms, duration_ms, stdout_head, stdout_tail, stderr_head, stderr_tail, display_files,
                   tool_calls, origin, context, files_read, files_written, files_truncated, error)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8 - ?9, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)
                 ON CONFLICT (id) DO UPDATE SET generation=?4, execution_count=?5, status=?7, started_ms=?8 - ?9, ended_ms=?8,
                   duration_ms=?9, stdout_head=?10, stdout_tail=?11, stderr_head=?12, stderr_tail=?13,
                   display_files=?14, tool_calls=?15, files_read=?18, files_written=?19, files_truncated=?20, error=?21",
                params![
                    id,
                    start.owner,
                    start.session,
                    generation,
                    ec,
                    start.code,
                    status,
                    ended,
                    dur,
                    oh,
                    ot,
                    eh,
                    et,
                    serde_json::to_string(&displays).unwrap_or_default(),
                    tool_calls.to_string(),
                    start.origin,
                    start.context.map(|v| v.to_string()),
                    serde_json::to_string(&files.read).unwrap_or_default(),
                    serde_json::to_string(&files.write).unwrap_or_default(),
                    files.truncated,
                    error,
                ],
            )?;
            for (i, t) in calls.iter().enumerate() {
                tx.execute(
                    "INSERT OR REPLACE INTO tool_calls (cell_id, seq, tool, args_preview, duration_ms, outcome, error)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![id, i as i64, t.name, t.args_preview, t.duration_ms as i64, t.outcome, t.error],
                )?;
            }
            for (i, d) in denied.iter().enumerate() {
                tx.execute(
                    "INSERT OR REPLACE INTO network_denials (cell_id, seq, host, port, reason, sni)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![id, i as i64, d.host, d.port as i64, d.reason.code(), d.sni],
                )?;
            }
            tx.commit()
        })
        .await
    }

    /// Marks a cell that never produced a result (its kernel failed to
    /// start or died before it ran) with `status`.
    pub async fn cell_failed(&self, id: &str, status: &str, message: &str) -> Result<(), JournalError> {
        let (id, status, message) = (id.to_string(), status.to_string(), message.to_string());
        self.call(move |c| {
            c.execute(
                "UPDATE cells SET status=?2, ended_ms=?3, error=?4 WHERE id=?1",
                params![id, status, now_ms(), message],
            )?;
            Ok(())
        })
        .await
    }

    /// The highest kernel generation the journal knows for a session (0 if
    /// none), so a new host continues the numbering.
    ///
    /// # Errors
    /// [`JournalError`].
    pub async fn max_generation(&self, owner: &str, session: &str) -> Result<u64, JournalError> {
        let (o, s) = (owner.to_string(), session.to_string());
        self.call(move |c| {
            c.query_row(
                "SELECT MAX(g) FROM (SELECT MAX(generation) AS g FROM kernels WHERE owner=?1 AND session=?2
                 UNION ALL SELECT MAX(generation) FROM cells WHERE owner=?1 AND session=?2)",
                params![o, s],
                |r| r.get::<_, Option<i64>>(0),
            )
            .map(|g| g.unwrap_or(0).max(0) as u64)
        })
        .await
    }

    /// Records `ckpt` as the session's latest checkpoint (replacing the
    /// one before; a pause mark stays until [`Journal::checkpoint_paused`]
    /// clears it).
    pub fn checkpoint_saved(&self, owner: &str, session: &str, ckpt: &crate::checkpoint::Checkpoint) {
        let (o, s) = (owner.to_string(), session.to_string());
        let c = ckpt.clone();
        self.fire("checkpoint", move |conn| {
            conn.execute(
                "INSERT INTO checkpoints (owner, session, mode, generation, execution_count, taken_ms, path, bytes, saved, lost)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT (owner, session) DO UPDATE SET mode=?3, generation=?4, execution_count=?5,
                   taken_ms=?6, path=?7, bytes=?8, saved=?9, lost=?10",
                params![
                    o,
                    s,
                    c.mode.as_str(),
                    c.generation as i64,
                    c.execution_count as i64,
                    c.taken_ms,
                    c.path.display().to_string(),
                    c.bytes as i64,
                    serde_json::to_string(&c.saved).unwrap_or_else(|_| "[]".into()),
                    serde_json::to_string(&c.lost).unwrap_or_else(|_| "[]".into()),
                ],
            )?;
            Ok(())
        });
    }

    /// Marks the session paused at `paused_ms` (`None`: resumed), and
    /// waits until that is committed (a paused session must survive the
    /// host).
    ///
    /// # Errors
    /// [`JournalError`].
    pub async fn checkpoint_paused(
        &self,
        owner: &str,
        session: &str,
        paused_ms: Option<i64>,
    ) -> Result<(), JournalError> {
        let (o, s) = (owner.to_string(), session.to_string());
        self.call(move |c| {
            c.execute(
                "UPDATE checkpoints SET paused_ms=?3 WHERE owner=?1 AND session=?2",
                params![o, s, paused_ms],
            )
            .map(|_| ())
        })
        .await
    }

    /// Forgets the session's checkpoint (a restart or kill dropped its state).
    pub fn checkpoint_dropped(&self, owner: &str, session: &str) {
        let (o, s) = (owner.to_string(), session.to_string());
        self.fire("checkpoint drop", move |c| {
            c.execute(
                "DELETE FROM checkpoints WHERE owner=?1 AND session=?2",
                params![o, s],
            )?;
            Ok(())
        });
    }

    /// Marks the session's latest generation, when it has ended, as one
    /// whose state was dropped on purpose (`end_reason` `state dropped`: a
    /// kill of a paused session), so no later host replays its cells.
    pub fn state_dropped(&self, owner: &str, session: &str) {
        let (o, s) = (owner.to_string(), session.to_string());
        self.fire("state drop", move |c| {
            c.execute(
                "UPDATE kernels SET end_reason='state dropped' WHERE owner=?1 AND session=?2
                   AND ended_ms IS NOT NULL
                   AND generation=(SELECT MAX(generation) FROM kernels WHERE owner=?1 AND session=?2)",
                params![o, s],
            )?;
            Ok(())
        });
    }

    /// Why generation `generation` of a session ended, as journaled
    /// (`None`: not journaled as ended, or unknown).
    ///
    /// # Errors
    /// [`JournalError`].
    pub async fn kernel_end_reason(
        &self,
        owner: &str,
        session: &str,
        generation: u64,
    ) -> Result<Option<String>, JournalError> {
        let (o, s) = (owner.to_string(), session.to_string());
        self.call(move |c| {
            c.query_row(
                "SELECT end_reason FROM kernels WHERE owner=?1 AND session=?2 AND generation=?3",
                params![o, s, generation as i64],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()
            .map(Option::flatten)
        })
        .await
    }

    /// The sessions of `owner` the journal records as paused: (session,
    /// its checkpoint, when it was paused), by session name.
    ///
    /// # Errors
    /// [`JournalError`].
    pub async fn paused_sessions(&self, owner: &str) -> Result<Vec<PausedRow>, JournalError> {
        let o = owner.to_string();
        self.call(move |c| query_paused(c, &o)).await
    }

    /// The session's latest checkpoint and when it was paused (`None`: not
    /// paused); `None` when it has none.
    ///
    /// # Errors
    /// [`JournalError`].
    pub async fn checkpoint_of(
        &self,
        owner: &str,
        session: &str,
    ) -> Result<Option<(crate::checkpoint::Checkpoint, Option<i64>)>, JournalError> {
        let (o, s) = (owner.to_string(), session.to_string());
        self.call(move |c| query_checkpoint(c, &o, &s)).await
    }

    /// Waits until every write sent so far is committed.
    ///
    /// # Errors
    /// [`JournalError::Closed`].
    pub async fn flush(&self) -> Result<(), JournalError> {
        self.call(|_| Ok(())).await
    }

    /// Stops the writer thread after the queued writes and checkpoints the
    /// WAL into the database file. Later writes are dropped with a warning.
    pub fn close(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }

    /// The cells of a session, oldest first (on the writer thread, so it
    /// sees every write sent before).
    ///
    /// # Errors
    /// [`JournalError`].
    pub async fn history(&self, owner: &str, session: &str) -> Result<Vec<CellRow>, JournalError> {
        let (o, s) = (owner.to_string(), session.to_string());
        self.call(move |c| query_cells(c, &o, &s)).await
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close();
    }
}

type CheckpointRow = (crate::checkpoint::Checkpoint, Option<i64>);

fn query_checkpoint(c: &Connection, o: &str, s: &str) -> rusqlite::Result<Option<CheckpointRow>> {
    c.query_row(
        "SELECT mode, generation, execution_count, taken_ms, path, bytes, saved, lost, paused_ms
                 FROM checkpoints WHERE owner=?1 AND session=?2",
        params![o, s],
        |r| {
            let mode: String = r.get(0)?;
            let saved: String = r.get(6)?;
            let lost: String = r.get(7)?;
            Ok((
                crate::checkpoint::Checkpoint {
                    mode: crate::checkpoint::CheckpointMode::parse(&mode)
                        .unwrap_or(crate::checkpoint::CheckpointMode::Namespace),
                    generation: r.get::<_, i64>(1)?.max(0) as u64,
                    execution_count: r.get::<_, i64>(2)?.max(0) as u64,
                    taken_ms: r.get(3)?,
                    path: PathBuf::from(r.get::<_, String>(4)?),
                    bytes: r.get::<_, i64>(5)?.max(0) as u64,
                    saved: serde_json::from_str(&saved).unwrap_or_default(),
                    lost: serde_json::from_str(&lost).unwrap_or_default(),
                    write_ms: 0,
                },
                r.get::<_, Option<i64>>(8)?,
            ))
        },
    )
    .optional()
}

/// A paused session of the journal: (session, its checkpoint, when).
pub type PausedRow = (String, crate::checkpoint::Checkpoint, i64);

fn query_paused(c: &Connection, owner: &str) -> rusqlite::Result<Vec<PausedRow>> {
    let mut st = c.prepare(
        "SELECT session FROM checkpoints WHERE owner=?1 AND paused_ms IS NOT NULL ORDER BY session",
    )?;
    let names: Vec<String> = st
        .query_map(params![owner], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut out = Vec::new();
    for n in names {
        if let Some((ck, Some(at))) = query_checkpoint(c, owner, &n)? {
            out.push((n, ck, at));
        }
    }
    Ok(out)
}

fn json_list(s: String) -> Vec<String> {
    serde_json::from_str(&s).unwrap_or_default()
}

fn query_settings(c: &Connection, owner: &str, session: &str) -> rusqlite::Result<SessionSettings> {
    let text = c
        .query_row(
            "SELECT settings FROM sessions WHERE owner=?1 AND session=?2",
            params![owner, session],
            |r| r.get::<_, Option<String>>(0),
        )
        .optional()?
        .flatten();
    Ok(text.map(|t| SessionSettings::parse(&t)).unwrap_or_default())
}

fn query_language(c: &Connection, owner: &str, session: &str) -> rusqlite::Result<Option<String>> {
    c.query_row(
        "SELECT language FROM sessions WHERE owner=?1 AND session=?2",
        params![owner, session],
        |r| r.get::<_, Option<String>>(0),
    )
    .optional()
    .map(Option::flatten)
}

fn query_cells(c: &Connection, owner: &str, session: &str) -> rusqlite::Result<Vec<CellRow>> {
    let mut st = c.prepare(
        "SELECT id, owner, session, generation, execution_count, code, status, started_ms, ended_ms, duration_ms,
                stdout_head, stdout_tail, stderr_head, stderr_tail, display_files, tool_calls, origin, context,
                files_read, files_written, files_truncated, error
         FROM cells WHERE owner=?1 AND session=?2 ORDER BY started_ms, rowid",
    )?;
    let rows = st.query_map(params![owner, session], |r| {
        Ok(CellRow {
            id: r.get(0)?,
            owner: r.get(1)?,
            session: r.get(2)?,
            generation: r.get::<_, i64>(3)? as u64,
            execution_count: r.get::<_, i64>(4)? as u64,
            code: r.get(5)?,
            status: r.get(6)?,
            started_ms: r.get(7)?,
            ended_ms: r.get(8)?,
            duration_ms: r.get(9)?,
            stdout_head: r.get(10)?,
            stdout_tail: r.get(11)?,
            stderr_head: r.get(12)?,
            stderr_tail: r.get(13)?,
            display_files: json_list(r.get(14)?),
            tool_calls: serde_json::from_str(&r.get::<_, String>(15)?).unwrap_or(Value::Null),
            origin: r.get(16)?,
            context: r
                .get::<_, Option<String>>(17)?
                .and_then(|s| serde_json::from_str(&s).ok()),
            files_read: json_list(r.get(18)?),
            files_written: json_list(r.get(19)?),
            files_truncated: r.get(20)?,
            error: r.get(21)?,
        })
    })?;
    rows.collect()
}

fn query_kernels(c: &Connection, owner: &str, session: &str) -> rusqlite::Result<Vec<KernelRow>> {
    let mut st = c.prepare(
        "SELECT generation, pid, started_ms, ended_ms, end_reason, parent_session,
                parent_generation, fork_point, placement FROM kernels
         WHERE owner=?1 AND session=?2 ORDER BY generation",
    )?;
    let rows = st.query_map(params![owner, session], |r| {
        Ok(KernelRow {
            generation: r.get::<_, i64>(0)? as u64,
            pid: r.get::<_, Option<u32>>(1)?.unwrap_or(0),
            started_ms: r.get(2)?,
            ended_ms: r.get(3)?,
            end_reason: r.get(4)?,
            parent_session: r.get(5)?,
            parent_generation: r.get::<_, Option<i64>>(6)?.map(|g| g as u64),
            fork_point: r.get::<_, Option<i64>>(7)?.map(|g| g as u64),
            // A value this build cannot read is shown as no placement,
            // never an error for the whole history.
            placement: r
                .get::<_, Option<String>>(8)?
                .and_then(|p| serde_json::from_str(&p).ok()),
        })
    })?;
    rows.collect()
}

/// A read-only view of a journal file (for `cellhost history` and tests),
/// independent of any writer.
pub struct JournalReader {
    conn: Connection,
    path: String,
}

impl JournalReader {
    /// Opens `path` for reading. A journal of an older schema is first
    /// brought up to date (which needs write access to it).
    ///
    /// # Errors
    /// [`JournalError`] when it is missing or not a journal,
    /// [`JournalError::Schema`] when its schema is newer than this build's
    /// or cannot be migrated.
    pub fn open(path: &Path) -> Result<JournalReader, JournalError> {
        let pstr = path.display().to_string();
        let schema = |source| JournalError::Schema {
            path: pstr.clone(),
            source,
        };
        let found = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|c| journal_schema::version(&c))
            .map_err(|source| JournalError::Sqlite {
                path: pstr.clone(),
                source,
            })?;
        if found != journal_schema::SCHEMA_VERSION {
            let mut rw = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE)
                .map_err(|e| schema(SchemaError::Sqlite(e)))?;
            let _ = rw.busy_timeout(std::time::Duration::from_secs(5));
            journal_schema::migrate(&mut rw).map_err(schema)?;
        }
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(
            |source| JournalError::Sqlite {
                path: pstr.clone(),
                source,
            },
        )?;
        let _ = conn.busy_timeout(std::time::Duration::from_secs(5));
        Ok(JournalReader { conn, path: pstr })
    }

    fn sq(&self, source: rusqlite::Error) -> JournalError {
        JournalError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Cells of a session, oldest first.
    ///
    /// # Errors
    /// [`JournalError`].
    pub fn cells(&self, owner: &str, session: &str) -> Result<Vec<CellRow>, JournalError> {
        query_cells(&self.conn, owner, session).map_err(|e| self.sq(e))
    }

    /// Kernel generations of a session.
    ///
    /// # Errors
    /// [`JournalError`].
    pub fn kernels(&self, owner: &str, session: &str) -> Result<Vec<KernelRow>, JournalError> {
        query_kernels(&self.conn, owner, session).map_err(|e| self.sq(e))
    }

    /// The language the session's kernels last ran, as
    /// [`Journal::session_language`].
    ///
    /// # Errors
    /// [`JournalError`].
    pub fn session_language(&self, owner: &str, session: &str) -> Result<Option<String>, JournalError> {
        query_language(&self.conn, owner, session).map_err(|e| self.sq(e))
    }

    /// The sessions of `owner` the journal records as paused, as
    /// [`Journal::paused_sessions`].
    ///
    /// # Errors
    /// [`JournalError`].
    pub fn paused_sessions(&self, owner: &str) -> Result<Vec<PausedRow>, JournalError> {
        query_paused(&self.conn, owner).map_err(|e| self.sq(e))
    }

    /// The session exists in the journal.
    ///
    /// # Errors
    /// [`JournalError`].
    pub fn has_session(&self, owner: &str, session: &str) -> Result<bool, JournalError> {
        self.conn
            .query_row(
                "SELECT 1 FROM sessions WHERE owner=?1 AND session=?2",
                params![owner, session],
                |_| Ok(()),
            )
            .optional()
            .map(|o| o.is_some())
            .map_err(|e| self.sq(e))
    }

    /// `PRAGMA integrity_check`'s answer (`ok` when sound).
    ///
    /// # Errors
    /// [`JournalError`].
    pub fn integrity_check(&self) -> Result<String, JournalError> {
        self.conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| self.sq(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn paused_sessions_and_deliberate_ends_are_read_back() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("journal.db");
        let ckpt = |n: u64| crate::checkpoint::Checkpoint {
            mode: crate::checkpoint::CheckpointMode::Namespace,
            generation: n,
            execution_count: n + 1,
            taken_ms: 5,
            path: dir.path().join(format!("c{n}")),
            bytes: 9,
            saved: vec!["a".into()],
            lost: Vec::new(),
            write_ms: 0,
        };
        {
            let j = Journal::open(&path, Durability::Normal).expect("open");
            for (s, g) in [("b", 1), ("a", 2), ("live", 1)] {
                j.kernel_started("o", s, g, 42, None);
                j.checkpoint_saved("o", s, &ckpt(g));
            }
            j.checkpoint_paused("o", "b", Some(11)).await.expect("pause");
            j.checkpoint_paused("o", "a", Some(12)).await.expect("pause");
            j.kernel_ended("o", "a", 2, "paused");
            // A live kernel's row is not marked: only an ended one is.
            j.state_dropped("o", "live");
            j.flush().await.expect("flush");
            assert_eq!(j.kernel_end_reason("o", "live", 1).await.expect("reason"), None);
            let paused = j.paused_sessions("o").await.expect("paused");
            let names: Vec<(&str, i64)> = paused.iter().map(|(n, _, at)| (n.as_str(), *at)).collect();
            assert_eq!(names, vec![("a", 12), ("b", 11)]);
            assert_eq!(paused[0].1.execution_count, 3);
            assert!(j.paused_sessions("other").await.expect("paused").is_empty());
            j.state_dropped("o", "a");
            j.flush().await.expect("flush");
            assert_eq!(
                j.kernel_end_reason("o", "a", 2).await.expect("reason").as_deref(),
                Some("state dropped")
            );
        }
        let r = JournalReader::open(&path).expect("reader");
        assert_eq!(r.paused_sessions("o").expect("paused").len(), 2);
    }

    #[tokio::test]
    async fn session_settings_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("journal.db");
        let own = SessionSettings {
            limits: Some(crate::limits::SessionLimits {
                pids: Some(64),
                disk_mb: Some(8),
                ..Default::default()
            }),
            network: Some("127.0.0.1:9".into()),
            restore: Some(crate::replay::RestoreMode::Replay),
        };
        {
            let j = Journal::open(&path, Durability::Normal).expect("open");
            j.session_used("o", "s", "py", "", "", "default", "python", &own);
            j.session_used(
                "o",
                "plain",
                "py",
                "",
                "",
                "default",
                "python",
                &SessionSettings::default(),
            );
            j.flush().await.expect("flush");
            j.close();
        }
        let j = Journal::open(&path, Durability::Normal).expect("reopen");
        assert_eq!(j.session_settings("o", "s").await.expect("settings"), own);
        assert!(
            j.session_settings("o", "plain")
                .await
                .expect("settings")
                .is_empty()
        );
        assert!(
            j.session_settings("o", "unknown")
                .await
                .expect("settings")
                .is_empty()
        );
        // Another owner's session of that name is not this one.
        assert!(j.session_settings("p", "s").await.expect("settings").is_empty());
        assert!(SessionSettings::parse("{\"limits\": {\"pidz\": 1}}").is_empty());
        j.session_forgotten("o", "s");
        assert!(j.session_settings("o", "s").await.expect("settings").is_empty());
    }

    #[tokio::test]
    async fn credential_nonces_burn_once_and_stay_burned_across_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j.sqlite");
        let j = Journal::open(&path, Durability::Normal).expect("open");
        assert!(j.burn_nonce("n1").await.expect("burn"), "fresh");
        assert!(!j.burn_nonce("n1").await.expect("burn"), "used");
        assert!(j.burn_nonce("n2").await.expect("burn"));
        j.close();
        let j = Journal::open(&path, Durability::Normal).expect("reopen");
        assert!(
            !j.burn_nonce("n1").await.expect("burn"),
            "still burned after a restart"
        );
        j.close();
    }

    #[test]
    fn head_tail_bounds_and_char_boundaries() {
        let short = "abc";
        assert_eq!(head_tail(short), ("abc".into(), String::new()));
        let long = "é".repeat(10_000);
        let (h, t) = head_tail(&long);
        assert!(h.len() <= OUTPUT_KEEP && t.len() <= OUTPUT_KEEP);
        assert!(h.len() >= OUTPUT_KEEP - 1 && t.len() >= OUTPUT_KEEP - 1);
    }

    #[tokio::test]
    async fn running_cells_become_lost_on_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j.sqlite3");
        {
            let j = Journal::open(&path, Durability::Normal).expect("open");
            j.session_used(
                "o",
                "s",
                "py",
                "",
                "",
                "default",
                "python",
                &SessionSettings::default(),
            );
            j.kernel_started("o", "s", 1, 42, None);
            j.cell_started(CellStart {
                id: "c1".into(),
                owner: "o".into(),
                session: "s".into(),
                generation: 1,
                code: "x = 1".into(),
                origin: "test".into(),
                context: Some(serde_json::json!({"who": "t"})),
            });
            j.flush().await.expect("flush");
            // Dropped without settling: like a host that died.
        }
        let j = Journal::open(&path, Durability::Normal).expect("reopen");
        assert_eq!(j.lost_at_open(), 1);
        let cells = j.history("o", "s").await.expect("history");
        assert_eq!(cells.len(), 1);
        assert_eq!(cells[0].status, "lost");
        assert_eq!(cells[0].context, Some(serde_json::json!({"who": "t"})));
        j.close();
        let r = JournalReader::open(&path).expect("reader");
        let k = r.kernels("o", "s").expect("kernels");
        assert_eq!(k.len(), 1);
        assert!(k[0].end_reason.is_some());
        assert_eq!(r.integrity_check().expect("check"), "ok");
    }

    /// Regression: a journal of an older layout made `history` fail with
    /// `no such column` and left `run`'s cells `running`.
    #[tokio::test]
    async fn journal_of_an_older_layout_is_migrated_on_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.sqlite3");
        {
            let c = Connection::open(&path).expect("create");
            c.execute_batch(
                "CREATE TABLE sessions (owner TEXT NOT NULL, session TEXT NOT NULL,
                   created_ms INTEGER NOT NULL, last_used_ms INTEGER NOT NULL,
                   PRIMARY KEY (owner, session));
                 CREATE TABLE kernels (owner TEXT NOT NULL, session TEXT NOT NULL,
                   generation INTEGER NOT NULL, pid INTEGER, started_ms INTEGER NOT NULL,
                   ended_ms INTEGER, PRIMARY KEY (owner, session, generation));
                 CREATE TABLE cells (id TEXT PRIMARY KEY, owner TEXT NOT NULL,
                   session TEXT NOT NULL, generation INTEGER NOT NULL, code TEXT NOT NULL,
                   status TEXT NOT NULL, started_ms INTEGER NOT NULL, ended_ms INTEGER,
                   duration_ms INTEGER);
                 INSERT INTO cells (id, owner, session, generation, code, status, started_ms)
                   VALUES ('old', 'o', 's', 1, 'x = 1', 'ok', 5);",
            )
            .expect("old layout");
        }
        // The reader alone (what `history` opens) migrates it.
        let r = JournalReader::open(&path).expect("reader on an old journal");
        let cells = r.cells("o", "s").expect("history of an old journal");
        assert_eq!(cells.len(), 1);
        assert_eq!((cells[0].id.as_str(), cells[0].status.as_str()), ("old", "ok"));
        drop(r);
        let j = Journal::open(&path, Durability::Normal).expect("open");
        j.session_used(
            "o",
            "s",
            "py",
            "",
            "",
            "default",
            "python",
            &SessionSettings::default(),
        );
        // A generation placed on another node says where it ran.
        let place = cellhost_kernel::KernelPlacement {
            name: "cluster".into(),
            kind: "slurm".into(),
            node: "node7".into(),
            job: "4711".into(),
            start: None,
        };
        j.kernel_started("o", "s", 2, 42, Some(&place));
        let start = CellStart {
            id: "new".into(),
            owner: "o".into(),
            session: "s".into(),
            generation: 2,
            code: "y = 2".into(),
            origin: "run".into(),
            context: None,
        };
        j.cell_started(start.clone());
        j.cell_failed(&start.id, "failed", "boom")
            .await
            .expect("settled row");
        let cells = j.history("o", "s").await.expect("history");
        let new = cells.iter().find(|c| c.id == "new").expect("new cell");
        assert_eq!(new.status, "failed", "the new cell settled, not left running");
        j.kernel_ended("o", "s", 2, "done");
        j.close();
        let r = JournalReader::open(&path).expect("reader");
        let k = r.kernels("o", "s").expect("kernels");
        assert_eq!(k.last().and_then(|k| k.end_reason.as_deref()), Some("done"));
        assert_eq!(k.last().and_then(|k| k.placement.as_ref()), Some(&place));
    }

    /// The egress proxy's refusals of a cell are journaled with it, and a
    /// journal of schema 1 gains their table on open.
    #[tokio::test]
    async fn network_denials_are_journaled_and_version_1_is_migrated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v1.sqlite3");
        {
            let c = Connection::open(&path).expect("create");
            let v1 = crate::journal_schema::SCHEMA
                .split("CREATE TABLE IF NOT EXISTS network_denials")
                .next()
                .expect("schema")
                .to_string();
            c.execute_batch(&format!("{v1}\nPRAGMA user_version = 1;"))
                .expect("v1 layout");
        }
        let j = Journal::open(&path, Durability::Normal).expect("open");
        j.session_used(
            "o",
            "s",
            "py",
            "",
            "",
            "default",
            "python",
            &SessionSettings::default(),
        );
        j.kernel_started("o", "s", 1, 42, None);
        let start = CellStart {
            id: "c1".into(),
            owner: "o".into(),
            session: "s".into(),
            generation: 1,
            code: "urlopen(...)".into(),
            origin: "test".into(),
            context: None,
        };
        j.cell_started(start.clone());
        let r: CellResult = serde_json::from_value(serde_json::json!({
            "cell_id": "c1", "status": "ok", "execution_count": 1, "stdout": "", "stderr": "",
            "result": null, "displays": [], "error": null,
            "kernel": {"session": "s", "generation": 1, "pid": 42, "reused": false, "state_reset": false},
            "duration_ms": 3,
            "network": {"denied": [
                {"host": "evil.test", "port": 443, "reason": "not_allowed"},
                {"host": "allowed.test", "port": 443, "reason": "sni_mismatch", "sni": "evil.test"}
            ]}
        }))
        .expect("result");
        j.cell_settled(&start, &r).await.expect("settled");
        j.close();
        let c = Connection::open(&path).expect("read");
        let version: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(version, crate::journal_schema::SCHEMA_VERSION);
        let mut st = c
            .prepare("SELECT host, port, reason, sni FROM network_denials WHERE cell_id = 'c1' ORDER BY seq")
            .expect("query");
        let rows: Vec<(String, i64, String, Option<String>)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .expect("rows")
            .map(|r| r.expect("row"))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("evil.test".into(), 443, "not_allowed".into(), None),
                (
                    "allowed.test".into(),
                    443,
                    "sni_mismatch".into(),
                    Some("evil.test".into())
                ),
            ]
        );
    }

    #[test]
    fn journal_of_a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("new.sqlite3");
        Connection::open(&path)
            .and_then(|c| c.execute_batch("PRAGMA user_version = 99;"))
            .expect("future journal");
        for err in [
            Journal::open(&path, Durability::Normal).map(drop).err(),
            JournalReader::open(&path).map(drop).err(),
        ] {
            match err {
                Some(JournalError::Schema {
                    source: SchemaError::Newer { found: 99, .. },
                    ..
                }) => {}
                other => panic!("expected a newer-schema error, got {other:?}"),
            }
        }
    }
}
