//! The registry's one index of what finished cells left on disk: the spill
//! files of their cut streams and the image files of their displays, by
//! cell id, each entry bound to the owner (and session) that ran the cell.
//! Every surface that serves a cell's output afterwards (HTTP
//! `/v1/cells/{cell}/output/{stream}` and `/v1/sessions/{name}/displays/{id}`,
//! MCP `read_output`) looks files up here, so a cell id alone never opens
//! another owner's files.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;

use cellhost_kernel::CellResult;

/// Cells remembered (the oldest is forgotten first).
pub const CELLS_KEPT: usize = 10_000;

/// An image a cell displayed, as the host saved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisplayFile {
    /// Its MIME type (`image/png`, `image/jpeg`, …).
    pub mime: String,
    /// The file the host wrote (in the kernel's session directory).
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
}

#[derive(Debug, Default)]
struct Entry {
    owner: String,
    session: String,
    spills: BTreeMap<String, PathBuf>,
    displays: BTreeMap<String, DisplayFile>,
}

/// What the registry knows of finished cells (bounded to [`CELLS_KEPT`]).
#[derive(Debug, Default)]
pub struct CellIndex {
    by_cell: HashMap<String, Entry>,
    order: VecDeque<String>,
}

/// The id of a cell's display: `<cell>.<n>` for its `n`-th display
/// (0-based, in the order of `displays`), `<cell>.result` for the bundle of
/// its last expression.
pub fn display_id(cell: &str, index: Option<usize>) -> String {
    match index {
        Some(n) => format!("{cell}.{n}"),
        None => format!("{cell}.result"),
    }
}

/// The image files of a bundle: `(mime, path, bytes)` of every binary
/// entry the host saved (`{"path", "bytes"}`).
pub fn bundle_images(bundle: &serde_json::Map<String, serde_json::Value>) -> Vec<DisplayFile> {
    bundle
        .iter()
        .filter(|(m, _)| m.starts_with("image/") && m.as_str() != "image/svg+xml")
        .filter_map(|(m, v)| {
            let path = v.get("path")?.as_str()?;
            Some(DisplayFile {
                mime: m.clone(),
                path: PathBuf::from(path),
                bytes: v.get("bytes").and_then(serde_json::Value::as_u64).unwrap_or(0),
            })
        })
        .collect()
}

impl CellIndex {
    /// Records what `r`, run by `owner` in `session`, left on disk (nothing
    /// when it spilled nothing and displayed no image).
    pub fn record(&mut self, owner: &str, session: &str, r: &CellResult) {
        let mut e = Entry {
            owner: owner.to_string(),
            session: session.to_string(),
            ..Entry::default()
        };
        for (stream, t) in &r.truncated {
            if let Some(p) = &t.spill_path {
                e.spills.insert(stream.clone(), p.clone());
            }
        }
        for (i, d) in r.displays.iter().enumerate() {
            if let Some(img) = bundle_images(&d.data).into_iter().next() {
                e.displays.insert(display_id(&r.cell_id, Some(i)), img);
            }
        }
        if let Some(img) = r
            .result
            .as_ref()
            .and_then(|b| bundle_images(b).into_iter().next())
        {
            e.displays.insert(display_id(&r.cell_id, None), img);
        }
        if e.spills.is_empty() && e.displays.is_empty() {
            return;
        }
        if self.by_cell.insert(r.cell_id.clone(), e).is_none() {
            self.order.push_back(r.cell_id.clone());
        }
        while self.order.len() > CELLS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.by_cell.remove(&old);
            }
        }
    }

    /// The spill file of `stream` of `owner`'s cell `cell`.
    pub fn spill(&self, owner: &str, cell: &str, stream: &str) -> Option<PathBuf> {
        let e = self.by_cell.get(cell).filter(|e| e.owner == owner)?;
        e.spills.get(stream).cloned()
    }

    /// The image of display `id` ([`display_id`]) of `owner`'s session
    /// `session`.
    pub fn display(&self, owner: &str, session: &str, id: &str) -> Option<DisplayFile> {
        let (cell, _) = id.rsplit_once('.')?;
        let e = self
            .by_cell
            .get(cell)
            .filter(|e| e.owner == owner && e.session == session)?;
        e.displays.get(id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, spill: bool, image: bool) -> CellResult {
        let mut v = serde_json::json!({
            "cell_id": id, "status": "ok", "execution_count": 1, "stdout": "", "stderr": "",
            "kernel": {"session": "s", "generation": 1, "pid": 1, "reused": false, "state_reset": false},
            "duration_ms": 0, "displays": [], "error": null, "result": null, "truncated": {},
        });
        if spill {
            v["truncated"] = serde_json::json!({"stdout": {"total_bytes": 10, "shown_bytes": 1,
                "omitted_bytes": 9, "spill_bytes": 10, "spill_path": "/x/stdout.txt"}});
        }
        if image {
            v["displays"] = serde_json::json!([{"data": {"image/png": {"path": "/x/d.png", "bytes": 3},
                "text/plain": "fig"}}]);
        }
        serde_json::from_value(v).expect("a result")
    }

    #[test]
    fn entries_are_bound_to_owner_and_session() {
        let mut ix = CellIndex::default();
        ix.record("http:a", "s", &result("c1", true, true));
        assert_eq!(
            ix.spill("http:a", "c1", "stdout"),
            Some(PathBuf::from("/x/stdout.txt"))
        );
        assert_eq!(ix.spill("http:b", "c1", "stdout"), None);
        assert_eq!(ix.spill("http:a", "c1", "stderr"), None);
        let d = ix.display("http:a", "s", "c1.0").expect("display");
        assert_eq!((d.mime.as_str(), d.bytes), ("image/png", 3));
        assert!(ix.display("http:a", "other", "c1.0").is_none());
        assert!(ix.display("http:b", "s", "c1.0").is_none());
        assert!(ix.display("http:a", "s", "c1.1").is_none());
    }

    #[test]
    fn the_index_is_bounded() {
        let mut ix = CellIndex::default();
        for i in 0..(CELLS_KEPT + 5) {
            ix.record("o", "s", &result(&format!("c{i}"), true, false));
        }
        assert!(ix.spill("o", "c0", "stdout").is_none());
        assert!(ix.spill("o", &format!("c{}", CELLS_KEPT + 4), "stdout").is_some());
        ix.record("o", "s", &result("quiet", false, false));
        assert!(ix.spill("o", "quiet", "stdout").is_none());
    }
}
