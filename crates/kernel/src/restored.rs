//! What a session got back before a cell: an automatic restore from its
//! latest checkpoint after its kernel was lost, a replay of the lost
//! kernel's journaled cells, or the resume of a paused session (the
//! `restored` field of a [`crate::CellResult`]).

use serde::{Deserialize, Serialize};

/// The state a new kernel of the session was given before this cell ran.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoredState {
    /// Where the state came from: `checkpoint` (a namespace checkpoint),
    /// `replay` (the lost kernel's journaled cells run again) or
    /// `checkpoint+replay` (the checkpoint, then the cells after it).
    pub source: String,
    /// The session was paused and is resumed now (not lost).
    #[serde(default)]
    pub resumed: bool,
    /// Why the previous kernel is gone (`None` for a resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The generation the checkpoint was taken in (for `replay`: the
    /// generation whose cells were replayed).
    pub from_generation: u64,
    /// The state is the one after the cell of this execution_count (the
    /// checkpoint's, or the last replayed cell's); the new kernel's next
    /// cell continues the count from it.
    pub execution_count: u64,
    /// When the checkpoint was taken, milliseconds since the Unix epoch (0:
    /// no checkpoint was restored).
    pub checkpoint_ms: i64,
    /// Names bound again in the namespace (variables and modules).
    #[serde(default)]
    pub restored: Vec<String>,
    /// Names that were not saved or could not be loaded, and why.
    #[serde(default)]
    pub lost: Vec<LostName>,
    /// Cells whose effects are lost: ones that ran after the checkpoint
    /// (and were not replayed), did not end `ok`, or came after a replay
    /// failed or was cut.
    #[serde(default)]
    pub lost_cells: Vec<LostCell>,
    /// The replay of the lost kernel's journaled cells (session setting
    /// `restore = "replay"`); absent when none ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayReport>,
    /// Wall time of the restore in the new kernel, milliseconds.
    pub restore_ms: u64,
    /// The restore failed (the namespace is empty): why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RestoredState {
    /// One line for text surfaces (the CLI, MCP): where the state came
    /// from, what was replayed, what failed or was cut, what is lost.
    pub fn summary(&self) -> String {
        let mut s = if self.resumed {
            format!(
                "resumed from the pause's checkpoint (after cell {})",
                self.execution_count
            )
        } else {
            format!(
                "state restored ({}) after the previous kernel was lost{}",
                self.source,
                self.reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            )
        };
        if self.checkpoint_ms > 0 {
            s.push_str(&format!(
                "; the checkpoint of generation {} brought back {} names",
                self.from_generation,
                self.restored.len()
            ));
        }
        if let Some(r) = &self.replay {
            s.push_str(&format!(
                "; {} cells of generation {} replayed (the count goes on from {})",
                r.replayed.len(),
                r.from_generation,
                self.execution_count
            ));
            if let Some(f) = &r.failed {
                s.push_str(&format!(
                    ", stopped at cell {} (execution_count {}) which ended {}: {}",
                    f.cell, f.execution_count, f.status, f.error
                ));
            }
            if let Some(c) = &r.cut {
                s.push_str(&format!(", cut: {c}"));
            }
        }
        if let Some(e) = &self.error {
            s.push_str(&format!("; the checkpoint could not be restored: {e}"));
        }
        if !self.lost.is_empty() {
            let names: Vec<&str> = self.lost.iter().map(|l| l.name.as_str()).take(10).collect();
            s.push_str(&format!("; names lost: {}", names.join(", ")));
        }
        if !self.lost_cells.is_empty() {
            let cells: Vec<String> = self
                .lost_cells
                .iter()
                .take(10)
                .map(|c| format!("{} ({})", c.cell, c.status))
                .collect();
            s.push_str(&format!("; cells whose effects are lost: {}", cells.join(", ")));
        }
        s
    }
}

/// A name of the namespace a checkpoint does not bring back.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostName {
    /// The variable's name.
    pub name: String,
    /// Its type (`module.Qualname`; `?` when unknown).
    #[serde(rename = "type", default)]
    pub type_name: String,
    /// Why (not picklable, over the size cap, defined in a cell without
    /// cloudpickle or dill, failed to load).
    pub reason: String,
}

/// A cell whose effects a restore could not bring back.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostCell {
    /// Cell id.
    pub cell: String,
    /// Its execution_count (0 when it never started).
    pub execution_count: u64,
    /// How it ended (`ok`, `error`, `crashed`, `lost`, …).
    pub status: String,
}

/// What the replay of a lost kernel's journaled cells did: each `ok` cell of
/// that generation (after the restored checkpoint, if any) run again in
/// order as a silent cell (no outputs, no new execution_count), stopping at
/// the first that fails.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The generation whose cells were replayed.
    pub from_generation: u64,
    /// Cells that ran again and ended `ok`, in order.
    #[serde(default)]
    pub replayed: Vec<ReplayedCell>,
    /// The cell whose replay failed (the replay stopped there; it and
    /// every later cell are in `lost_cells`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<ReplayFailure>,
    /// The replay was cut by its bounds (config `restore.max_cells`,
    /// `restore.timeout_s`): why; the cells not run are in `lost_cells`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<String>,
    /// Wall time of the replay, milliseconds.
    pub replay_ms: u64,
}

/// A cell a replay ran again.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayedCell {
    /// The original cell's id.
    pub cell: String,
    /// The original cell's execution_count.
    pub execution_count: u64,
    /// Wall time of the replay of this cell, milliseconds.
    pub duration_ms: u64,
}

/// The cell at which a replay stopped.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayFailure {
    /// The original cell's id.
    pub cell: String,
    /// The original cell's execution_count.
    pub execution_count: u64,
    /// How its replay ended (`error`, `interrupted` at the time bound,
    /// `crashed`, …).
    pub status: String,
    /// The error (`Name: value`) or why it could not run.
    pub error: String,
}
