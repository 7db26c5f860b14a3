//! Hints for Python's errors.

use std::path::Path;

use crate::result::{CellError, CellResult};

/// The hint for `e`, the error of `r`, if one applies.
pub(super) fn error_hint(e: &CellError, r: &CellResult, python: &Path) -> Option<String> {
    match e.ename.as_str() {
        "ModuleNotFoundError" => {
            let module = e.evalue.split('\'').nth(1).unwrap_or("the module");
            Some(format!(
                "'{module}' is not installed in the kernel's interpreter {}; install it there (e.g. `{} -m pip install {module}`) or use another --python.",
                python.display(),
                python.display()
            ))
        }
        "FileNotFoundError" => {
            let cwd = r.cwd.as_deref().unwrap_or("(deleted)");
            Some(format!(
                "Relative paths resolve against the kernel's current directory {cwd}; check the path or use an absolute one."
            ))
        }
        "ToolError" if e.evalue.contains("budget") => {
            Some("This cell spent its host-call budget; split the work across cells.".into())
        }
        "ToolError" if e.evalue.contains("not enabled") => {
            Some("That tool is not enabled for this session; list tools with `dir(cellhost.tools)`.".into())
        }
        _ => None,
    }
}
