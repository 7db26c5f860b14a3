//! What a session gets back after an unexpected death of its kernel (a
//! crash, an OOM kill, an eviction, the end of the host that ran it): the
//! session's `restore` setting and its bounds (config `[restore]`).
//!
//! - `checkpoint` (the default): the latest namespace checkpoint, when the
//!   session keeps them ([`crate::checkpoint`]).
//! - `replay`: the checkpoint if there is one, then the journaled `ok`
//!   cells of the lost generation that came after it (all of them without
//!   a checkpoint), in order, as silent cells: their outputs are dropped
//!   and execution_count ends where the original cells left it. A cell
//!   with side effects outside the namespace (files, network, installs)
//!   does them again; a replay stops at the first cell that fails, and at
//!   [`RestoreSettings::max_cells`] cells or [`RestoreSettings::timeout`],
//!   and the result's `restored.replay` says which cells ran, which failed
//!   and which were cut. Installs are cells (`%pip install …`): they are
//!   replayed as `restore` replays them.
//! - `none`: nothing; the next cell finds an empty namespace
//!   (`state_reset`).
//!
//! A death on purpose (`restart`, `kill`, `restore`) is never followed by a
//! replay; a paused session resumes from its checkpoint in every mode.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default bound on the cells one replay runs.
pub const DEFAULT_MAX_CELLS: usize = 200;
/// Default bound on the wall time of one replay (300 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// What happens after a session's kernel died unexpectedly.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestoreMode {
    /// The latest checkpoint (when the session keeps them).
    #[default]
    Checkpoint,
    /// The checkpoint (if any), then the lost generation's journaled cells
    /// after it.
    Replay,
    /// Nothing: an empty namespace.
    None,
}

impl RestoreMode {
    /// The wire name (`checkpoint`, `replay`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreMode::Checkpoint => "checkpoint",
            RestoreMode::Replay => "replay",
            RestoreMode::None => "none",
        }
    }

    /// Parses a wire name.
    ///
    /// # Errors
    /// A message naming the accepted values.
    pub fn parse(s: &str) -> Result<RestoreMode, String> {
        match s {
            "checkpoint" => Ok(RestoreMode::Checkpoint),
            "replay" => Ok(RestoreMode::Replay),
            "none" => Ok(RestoreMode::None),
            other => Err(format!(
                "restore is one of checkpoint, replay, none; got {other:?}"
            )),
        }
    }
}

impl std::str::FromStr for RestoreMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        RestoreMode::parse(s)
    }
}

/// Restore settings (config `[restore]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreSettings {
    /// The mode of sessions no pattern and no request names (`checkpoint`).
    pub default: RestoreMode,
    /// Modes by session-name pattern (`*` matches any run of characters;
    /// the exact name, then the most specific pattern wins).
    pub sessions: Vec<(String, RestoreMode)>,
    /// Most cells one replay runs ([`DEFAULT_MAX_CELLS`]); later ones are
    /// named as lost.
    pub max_cells: usize,
    /// Longest one replay runs ([`DEFAULT_TIMEOUT`]): the cell running at
    /// the bound is interrupted, it and later ones are named as lost.
    pub timeout: Duration,
}

impl Default for RestoreSettings {
    fn default() -> Self {
        RestoreSettings {
            default: RestoreMode::Checkpoint,
            sessions: Vec::new(),
            max_cells: DEFAULT_MAX_CELLS,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl RestoreSettings {
    /// The configured mode of a session named `session`.
    pub fn for_session(&self, session: &str) -> RestoreMode {
        self.sessions
            .iter()
            .filter(|(p, _)| crate::network::glob_match(p, session))
            .max_by_key(|(p, _)| (p == session, p.chars().filter(|c| *c != '*').count()))
            .map_or(self.default, |(_, m)| *m)
    }
}

/// The silent cell that sets the worker's execution_count to `count` after
/// a replay (the host accepts it as the cell's `resume_count`).
pub fn resume_count_code(count: u64) -> String {
    format!("__import__('cellhost_worker.checkpoint').checkpoint.resume_count({count})")
}

/// Kernel end reasons of a generation that ended on purpose: its cells are
/// not replayed.
pub(crate) const DELIBERATE_ENDS: &[&str] = &[
    "disposed",
    "owner disposed",
    "replaced by restore",
    "state dropped",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_patterns_pick_the_most_specific() {
        assert_eq!(RestoreMode::parse("replay"), Ok(RestoreMode::Replay));
        assert_eq!(RestoreMode::parse("none"), Ok(RestoreMode::None));
        assert!(RestoreMode::parse("yes").is_err());
        let s = RestoreSettings {
            sessions: vec![
                ("ana-*".into(), RestoreMode::Replay),
                ("ana-x".into(), RestoreMode::None),
            ],
            ..Default::default()
        };
        assert_eq!(s.for_session("ana-1"), RestoreMode::Replay);
        assert_eq!(s.for_session("ana-x"), RestoreMode::None);
        assert_eq!(s.for_session("bob"), RestoreMode::Checkpoint);
        assert_eq!(
            serde_json::to_string(&RestoreMode::None).expect("json"),
            "\"none\""
        );
    }
}
