//! One-line hints for a language model after common failures.

use std::path::Path;

use crate::result::{CellResult, CellStatus};

/// The hint for a result, if one applies.
pub(crate) fn hint_for(r: &CellResult, python: &Path, truncated: bool) -> Option<String> {
    if let Some(e) = &r.error {
        match e.ename.as_str() {
            "ModuleNotFoundError" => {
                let module = e.evalue.split('\'').nth(1).unwrap_or("the module");
                return Some(format!(
                    "'{module}' is not installed in the kernel's interpreter {}; install it there (e.g. `{} -m pip install {module}`) or use another --python.",
                    python.display(),
                    python.display()
                ));
            }
            "FileNotFoundError" => {
                let cwd = r.cwd.as_deref().unwrap_or("(deleted)");
                return Some(format!(
                    "Relative paths resolve against the kernel's current directory {cwd}; check the path or use an absolute one."
                ));
            }
            "ToolError" if e.evalue.contains("budget") => {
                return Some("This cell spent its host-call budget; split the work across cells.".into());
            }
            "ToolError" if e.evalue.contains("not enabled") => {
                return Some(
                    "That tool is not enabled for this session; list tools with `dir(cellhost.tools)`."
                        .into(),
                );
            }
            _ => {}
        }
    }
    if r.status == CellStatus::Crashed {
        return Some(
            "The worker died, so the session's variables are gone; the next cell starts a fresh kernel."
                .into(),
        );
    }
    if truncated {
        return Some(
            "Output was cut; read the full stream from the spill file by offset (read_output / `cellhost output`) instead of re-running the cell."
                .into(),
        );
    }
    None
}
