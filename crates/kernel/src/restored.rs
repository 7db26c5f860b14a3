//! What a session got back before a cell: an automatic restore from its
//! latest checkpoint after its kernel was lost, or the resume of a paused
//! session (the `restored` field of a [`crate::CellResult`]).

use serde::{Deserialize, Serialize};

/// The state a new kernel of the session was given before this cell ran.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoredState {
    /// Where the state came from: `checkpoint` (a namespace checkpoint).
    pub source: String,
    /// The session was paused and is resumed now (not lost).
    #[serde(default)]
    pub resumed: bool,
    /// Why the previous kernel is gone (`None` for a resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The generation the checkpoint was taken in.
    pub from_generation: u64,
    /// The checkpoint was taken after the cell of this execution_count;
    /// the new kernel's next cell continues the count from it.
    pub execution_count: u64,
    /// When the checkpoint was taken, milliseconds since the Unix epoch.
    pub checkpoint_ms: i64,
    /// Names bound again in the namespace (variables and modules).
    #[serde(default)]
    pub restored: Vec<String>,
    /// Names that were not saved or could not be loaded, and why.
    #[serde(default)]
    pub lost: Vec<LostName>,
    /// Cells that ran after the checkpoint: their effects are lost.
    #[serde(default)]
    pub lost_cells: Vec<LostCell>,
    /// Wall time of the restore in the new kernel, milliseconds.
    pub restore_ms: u64,
    /// The restore failed (the namespace is empty): why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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
