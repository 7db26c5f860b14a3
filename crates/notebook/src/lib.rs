//! Jupyter notebooks for cellhost: read a notebook (`.ipynb`, nbformat 4) or
//! a percent-format script (`.py` with `# %%` cells), hand out its code
//! cells, take their outputs back, and write a notebook that is valid
//! nbformat 4.5.
//!
//! The crate knows no kernel lifecycle: the caller runs each [`CodeCell`]'s
//! source wherever it likes and reports [`Output`]s with
//! [`Notebook::set_outputs`], or hands the whole notebook to
//! [`execute_notebook`] with a [`CellRunner`] (`cellhost-sessions` has one
//! over its registry).
//!
//! A [`Notebook`] holds the nbformat JSON itself, so everything this crate
//! does not touch (notebook and cell metadata, unknown fields, attachments,
//! outputs of cells that are not re-run) is kept as it was. On load,
//! multi-line strings are joined and cells without a valid, unique `id` get
//! one (`cell-<index>`), upgrading `nbformat_minor` to 5 as nbformat does.
//! On write, the layout is nbformat's own: keys sorted, one-space indent,
//! multi-line text as lists of lines, so a notebook saved by Jupyter and
//! written back unchanged is byte-identical.
//!
//! ```
//! use cellhost_notebook::{Notebook, Output, merge_streams};
//!
//! let mut nb = Notebook::from_percent_str("# %% [markdown]\n# # Sums\n\n# %%\nprint(1 + 1)\n");
//! nb.clear_outputs();
//! for (n, cell) in nb.code_cells().into_iter().enumerate() {
//!     assert_eq!(cell.source, "print(1 + 1)");
//!     let outputs = vec![Output::Stream { name: "stdout".into(), text: "2\n".into() }];
//!     nb.set_outputs(cell.index, Some(n as u64 + 1), merge_streams(outputs))?;
//! }
//! assert!(nb.to_json_string().contains("\"output_type\": \"stream\""));
//! # Ok::<(), cellhost_notebook::NotebookError>(())
//! ```

#![forbid(unsafe_code)]

mod atomic;
mod error;
pub mod executor;
mod lines;
mod output;
mod params;
mod percent;
mod timing;

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value, json};

pub use error::NotebookError;
pub use executor::{CellRun, CellRunner, Observer, Quiet, RunOptions, RunSummary, Stop, execute_notebook};
pub use output::{Output, merge_streams};
pub use params::{PARAMETERS_COMMENT, ParamError, ParamValue, Parameters, is_identifier, parameters_source};
pub use timing::ExecutionTiming;

/// `metadata.kernelspec.name` of notebooks cellhost writes.
const KERNEL_NAME: &str = "python3";
/// `metadata.kernelspec.display_name` of notebooks cellhost writes.
const KERNEL_DISPLAY_NAME: &str = "Python 3 (cellhost)";
/// `origin` of errors about notebooks parsed from a string.
const STRING_ORIGIN: &str = "<string>";

/// What kind of file a notebook was loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// A Jupyter notebook, `.ipynb`.
    Ipynb,
    /// A percent-format Python script, `.py` with `# %%` cell markers.
    Percent,
}

/// A code cell to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeCell {
    /// Position of the cell among all cells of the notebook (markdown and
    /// raw cells included): the index to pass to [`Notebook::set_outputs`].
    pub index: usize,
    /// The cell's code, lines joined.
    pub source: String,
}

impl CodeCell {
    /// Whether the source is empty or only whitespace (nothing to run).
    pub fn is_blank(&self) -> bool {
        self.source.trim().is_empty()
    }
}

/// An nbformat 4 notebook (always at least minor version 5 once loaded).
///
/// Invariants kept by every constructor and method: the JSON is an object
/// with `nbformat` 4, `nbformat_minor` ≥ 5, a `metadata` object and a
/// `cells` list; every cell is an object with a `cell_type` of `code`,
/// `markdown` or `raw`, a unique valid `id`, a `metadata` object and a
/// string `source`; every code cell has an `outputs` list and an
/// `execution_count` that is null or an integer.
#[derive(Debug, Clone, PartialEq)]
pub struct Notebook {
    root: Value,
}

impl Notebook {
    /// Loads a notebook, choosing the format by extension (case-insensitive):
    /// `.ipynb` is a Jupyter notebook, which must be nbformat 4; `.py` and
    /// `.R` are percent-format scripts (a `.R` one becomes an R notebook,
    /// [`Notebook::from_r_percent_str`]). Every error names the file.
    pub fn load(path: &Path) -> Result<(Notebook, InputKind), NotebookError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let kind = match ext.as_deref() {
            Some("ipynb") => InputKind::Ipynb,
            Some("py" | "r") => InputKind::Percent,
            _ => {
                return Err(NotebookError::UnsupportedExtension {
                    path: path.to_path_buf(),
                });
            }
        };
        let bytes = std::fs::read(path).map_err(|source| NotebookError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let text = String::from_utf8(bytes).map_err(|e| NotebookError::NotUtf8 {
            path: path.to_path_buf(),
            valid_up_to: e.utf8_error().valid_up_to(),
        })?;
        let notebook = match kind {
            InputKind::Ipynb => parse_ipynb(&text, &path.display().to_string())?,
            InputKind::Percent if ext.as_deref() == Some("r") => Notebook::from_r_percent_str(&text),
            InputKind::Percent => Notebook::from_percent_str(&text),
        };
        Ok((notebook, kind))
    }

    /// Parses the text of an `.ipynb` file (nbformat 4.x; a leading
    /// byte-order mark is ignored). Errors name the origin `<string>`.
    pub fn from_ipynb_str(text: &str) -> Result<Notebook, NotebookError> {
        parse_ipynb(text, STRING_ORIGIN)
    }

    /// Builds a fresh nbformat 4.5 notebook with a Python kernelspec from a
    /// percent-format script.
    ///
    /// * A line starting with `# %%` (or `#%%`) starts a code cell; text
    ///   after the marker is the cell's title, kept as `metadata.title`.
    /// * `# %% [markdown]` (or `[md]`) starts a markdown cell and
    ///   `# %% [raw]` a raw cell; their lines lose the leading `# ` (or `#`).
    /// * jupytext's `tags=["parameters"]` on a marker line becomes the
    ///   cell's `metadata.tags` (so parameters are injected after it).
    /// * Text before the first marker is a code cell unless it is blank; a
    ///   jupytext YAML header (`# ---` … `# ---` at the top) is dropped.
    /// * Blank lines at the start and end of each cell are trimmed; `\r\n`
    ///   line endings read as `\n`.
    ///
    /// Any text is a valid script, so this cannot fail.
    pub fn from_percent_str(text: &str) -> Notebook {
        Notebook::percent(text, kernelspec(), json!({"name": "python"}))
    }

    /// As [`Notebook::from_percent_str`], for an R script: the kernelspec
    /// is IRkernel's (`{name: "ir", display_name: "R", language: "R"}`) and
    /// `language_info.name` is `R`, so the notebook runs in R and opens in
    /// Jupyter as an R notebook.
    pub fn from_r_percent_str(text: &str) -> Notebook {
        Notebook::percent(
            text,
            json!({"name": "ir", "display_name": "R", "language": "R"}),
            json!({"name": "R"}),
        )
    }

    fn percent(text: &str, kernelspec: Value, language_info: Value) -> Notebook {
        let mut cells: Vec<Value> = percent::parse(text)
            .into_iter()
            .map(|cell| {
                let mut metadata = Map::new();
                if let Some(title) = cell.title {
                    metadata.insert("title".into(), Value::String(title));
                }
                if !cell.tags.is_empty() {
                    metadata.insert("tags".into(), json!(cell.tags));
                }
                match cell.kind {
                    percent::CellKind::Code => json!({
                        "cell_type": "code",
                        "execution_count": null,
                        "metadata": metadata,
                        "outputs": [],
                        "source": cell.source,
                    }),
                    kind => json!({
                        "cell_type": kind.cell_type(),
                        "metadata": metadata,
                        "source": cell.source,
                    }),
                }
            })
            .collect();
        assign_ids(&mut cells);
        Notebook {
            root: json!({
                "cells": cells,
                "metadata": {
                    "kernelspec": kernelspec,
                    "language_info": language_info,
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }),
        }
    }

    /// The code cells in notebook order, blank ones included (see
    /// [`CodeCell::is_blank`]).
    pub fn code_cells(&self) -> Vec<CodeCell> {
        self.cells()
            .iter()
            .enumerate()
            .filter(|(_, cell)| cell_type(cell) == Some("code"))
            .map(|(index, cell)| CodeCell {
                index,
                source: cell
                    .get("source")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            })
            .collect()
    }

    /// Number of cells of every type.
    pub fn cell_count(&self) -> usize {
        self.cells().len()
    }

    /// The notebook's JSON as held in memory: multi-line strings joined
    /// (they are split into lines only by [`Notebook::to_json_string`]).
    pub fn as_json(&self) -> &Value {
        &self.root
    }

    /// Replaces the outputs and execution count of the code cell at `index`
    /// (its position among all cells, as in [`CodeCell::index`]). MIME
    /// bundles are normalized as [`Output::to_json`] describes. Outputs are
    /// stored as given; use [`merge_streams`] first to join stream chunks.
    pub fn set_outputs(
        &mut self,
        index: usize,
        execution_count: Option<u64>,
        outputs: Vec<Output>,
    ) -> Result<(), NotebookError> {
        let len = self.cells().len();
        let cell = self
            .cells_mut()
            .and_then(|cells| cells.get_mut(index))
            .and_then(Value::as_object_mut)
            .ok_or(NotebookError::NoSuchCell { index, len })?;
        let kind = cell.get("cell_type").and_then(Value::as_str).unwrap_or_default();
        if kind != "code" {
            return Err(NotebookError::NotCodeCell {
                index,
                cell_type: kind.to_string(),
            });
        }
        cell.insert(
            "outputs".into(),
            Value::Array(outputs.iter().map(Output::to_json).collect()),
        );
        cell.insert(
            "execution_count".into(),
            execution_count.map_or(Value::Null, Value::from),
        );
        Ok(())
    }

    /// Empties the outputs of every code cell and sets its execution count
    /// to null. Markdown and raw cells are not touched.
    pub fn clear_outputs(&mut self) {
        let Some(cells) = self.cells_mut() else {
            return;
        };
        for cell in cells.iter_mut() {
            if cell_type(cell) != Some("code") {
                continue;
            }
            if let Some(obj) = cell.as_object_mut() {
                obj.insert("outputs".into(), Value::Array(Vec::new()));
                obj.insert("execution_count".into(), Value::Null);
            }
        }
    }

    /// Records the Python kernel that ran the notebook, keeping what the
    /// notebook says of itself: `metadata.kernelspec` is kept as it is
    /// (`{name: "python3", display_name: "Python 3 (cellhost)", language:
    /// "python"}` when there is none); `metadata.language_info` keeps its
    /// fields, gets the interpreter's `version` (as nbclient writes the
    /// kernel's) and, where missing, `name: "python"`, `file_extension:
    /// ".py"`, `mimetype: "text/x-python"` (for a notebook whose
    /// `language_info.name` is `R`: `file_extension: ".r"`, `mimetype:
    /// "text/x-r-source"`, as IRkernel writes them);
    /// `metadata.cellhost.python` is the interpreter's path.
    pub fn set_kernel_info(&mut self, python_version: &str, executable: &str) {
        let Some(metadata) = self.metadata_mut() else {
            return;
        };
        if !metadata.get("kernelspec").is_some_and(Value::is_object) {
            metadata.insert("kernelspec".into(), kernelspec());
        }
        let info = metadata
            .entry("language_info")
            .or_insert_with(|| Value::Object(Map::new()));
        if !info.is_object() {
            *info = Value::Object(Map::new());
        }
        let is_r = info
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| n.eq_ignore_ascii_case("r"));
        // IRkernel's language_info for an R notebook, ipykernel's otherwise.
        let defaults = if is_r {
            [
                ("name", "R"),
                ("file_extension", ".r"),
                ("mimetype", "text/x-r-source"),
            ]
        } else {
            [
                ("name", "python"),
                ("file_extension", ".py"),
                ("mimetype", "text/x-python"),
            ]
        };
        if let Some(info) = info.as_object_mut() {
            for (k, v) in defaults {
                info.entry(k).or_insert_with(|| Value::String(v.into()));
            }
            info.insert("version".into(), Value::String(python_version.into()));
        }
        let cellhost = metadata
            .entry("cellhost")
            .or_insert_with(|| Value::Object(Map::new()));
        if !cellhost.is_object() {
            *cellhost = Value::Object(Map::new());
        }
        if let Some(obj) = cellhost.as_object_mut() {
            obj.insert("python".into(), Value::String(executable.to_string()));
        }
    }

    /// The notebook's language as Jupyter reads it:
    /// `metadata.kernelspec.language`, else `metadata.language_info.name`,
    /// else what the kernelspec's `name` says (`ir` is IRkernel: `r`;
    /// `python3`/`python2`: `python`) — trimmed, lower-cased; `None` when
    /// the notebook names none of them.
    pub fn language(&self) -> Option<String> {
        let meta = self.root.get("metadata")?;
        let by_kernel = meta
            .pointer("/kernelspec/name")
            .and_then(Value::as_str)
            .and_then(|n| match n.trim().to_ascii_lowercase().as_str() {
                "ir" => Some(Value::String("r".into())),
                n if n.starts_with("python") => Some(Value::String("python".into())),
                _ => None,
            });
        [
            meta.get("kernelspec").and_then(|k| k.get("language")).cloned(),
            meta.get("language_info").and_then(|l| l.get("name")).cloned(),
            by_kernel,
        ]
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(|s| s.trim().to_ascii_lowercase()))
        .find(|s| !s.is_empty())
    }

    /// Index of the first cell (any type) whose `metadata.tags` has `tag`.
    pub fn find_tagged(&self, tag: &str) -> Option<usize> {
        (0..self.cells().len()).find(|&i| self.cell_has_tag(i, tag))
    }

    /// Whether the cell at `index` has `tag` in its `metadata.tags`.
    pub fn cell_has_tag(&self, index: usize, tag: &str) -> bool {
        self.cells()
            .get(index)
            .and_then(|cell| cell.get("metadata"))
            .and_then(|m| m.get("tags"))
            .and_then(Value::as_array)
            .is_some_and(|tags| tags.iter().any(|t| t.as_str() == Some(tag)))
    }

    /// Injects `params` as papermill does: a new code cell tagged
    /// `injected-parameters` whose source is `source` (papermill's
    /// `# Parameters` comment and one assignment per parameter, see
    /// [`Parameters::python_source`]) replaces an earlier injected cell,
    /// else goes right after the first cell tagged `parameters`, else
    /// first; `metadata.papermill.parameters` records the values. Returns
    /// the new cell's index. Nothing is injected for no parameters.
    pub fn inject_parameters(&mut self, params: &Parameters, source: &str) -> Option<usize> {
        if params.is_empty() {
            return None;
        }
        let injected = self.find_tagged("injected-parameters");
        let tagged = self.find_tagged("parameters");
        let used: HashSet<String> = self
            .cells()
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != injected)
            .filter_map(|(_, c)| c.get("id").and_then(Value::as_str).map(str::to_string))
            .collect();
        let mut id = "injected-parameters".to_string();
        let mut n = 1;
        while used.contains(&id) {
            id = format!("injected-parameters-{n}");
            n += 1;
        }
        let cell = json!({
            "cell_type": "code",
            "execution_count": null,
            "id": id,
            "metadata": {"tags": ["injected-parameters"]},
            "outputs": [],
            "source": source,
        });
        let cells = self.cells_mut()?;
        let index = match (injected, tagged) {
            (Some(i), _) => {
                cells[i] = cell;
                i
            }
            (None, Some(p)) => {
                cells.insert(p + 1, cell);
                p + 1
            }
            (None, None) => {
                cells.insert(0, cell);
                0
            }
        };
        if let Some(metadata) = self.metadata_mut() {
            let pm = metadata
                .entry("papermill")
                .or_insert_with(|| Value::Object(Map::new()));
            if !pm.is_object() {
                *pm = Value::Object(Map::new());
            }
            if let Some(pm) = pm.as_object_mut() {
                pm.insert("parameters".into(), params.to_json());
            }
        }
        Some(index)
    }

    /// Sets the code cell at `index`'s `metadata.execution` to `timing`
    /// (nbclient's `record_timing` keys), replacing what a previous run
    /// left there.
    pub fn set_execution_timing(&mut self, index: usize, timing: &ExecutionTiming) {
        if let Some(meta) = self
            .cells_mut()
            .and_then(|cells| cells.get_mut(index))
            .and_then(Value::as_object_mut)
            .map(|c| c.entry("metadata").or_insert_with(|| Value::Object(Map::new())))
            .and_then(Value::as_object_mut)
        {
            meta.insert("execution".into(), timing.to_json());
        }
    }

    /// Records the sandbox the notebook ran under (`mode`, `missing`
    /// layers) as `metadata.cellhost.sandbox`.
    pub fn set_sandbox(&mut self, sandbox: Value) {
        let Some(metadata) = self.metadata_mut() else {
            return;
        };
        let cellhost = metadata
            .entry("cellhost")
            .or_insert_with(|| Value::Object(Map::new()));
        if !cellhost.is_object() {
            *cellhost = Value::Object(Map::new());
        }
        if let Some(obj) = cellhost.as_object_mut() {
            obj.insert("sandbox".into(), sandbox);
        }
    }

    /// The notebook as nbformat writes it: keys sorted, one-space indent,
    /// sources, stream text and text-like MIME values (`text/*`,
    /// `image/svg+xml`, `application/javascript`) as lists of lines each
    /// keeping its line break, other MIME values (such as base64
    /// `image/png`) as one string, JSON MIME values as JSON; ends with a
    /// newline.
    pub fn to_json_string(&self) -> String {
        let mut root = self.root.clone();
        split_for_disk(&mut root);
        root.sort_all_objects();
        let mut buf = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
        let mut serializer = serde_json::Serializer::with_formatter(&mut buf, formatter);
        // Serializing a `Value` into memory cannot fail: its keys are strings.
        root.serialize(&mut serializer)
            .expect("a serde_json::Value always serializes");
        buf.push(b'\n');
        // serde_json writes only valid UTF-8.
        String::from_utf8(buf).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Writes [`Notebook::to_json_string`] to `path` atomically: a temporary
    /// file in the same directory is renamed over the target, so a reader
    /// never sees a half-written notebook. An existing file's permissions
    /// are kept.
    pub fn write(&self, path: &Path) -> Result<(), NotebookError> {
        atomic::write_atomic(path, self.to_json_string().as_bytes()).map_err(|source| NotebookError::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    fn cells(&self) -> &[Value] {
        self.root
            .get("cells")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    fn cells_mut(&mut self) -> Option<&mut Vec<Value>> {
        self.root.get_mut("cells").and_then(Value::as_array_mut)
    }

    fn metadata_mut(&mut self) -> Option<&mut Map<String, Value>> {
        self.root.get_mut("metadata").and_then(Value::as_object_mut)
    }
}

/// Where `cellhost run` writes the executed notebook by default:
/// `<dir>/<stem>.executed.ipynb` beside the input (`analysis.ipynb` →
/// `analysis.executed.ipynb`, `script.py` → `script.executed.ipynb`).
pub fn default_output_path(input: &Path) -> PathBuf {
    let mut name = input
        .file_stem()
        .map_or_else(|| OsString::from("notebook"), |s| s.to_os_string());
    name.push(".executed.ipynb");
    input.with_file_name(name)
}

/// The kernelspec of notebooks cellhost runs.
fn kernelspec() -> Value {
    json!({
        "name": KERNEL_NAME,
        "display_name": KERNEL_DISPLAY_NAME,
        "language": "python",
    })
}

fn cell_type(cell: &Value) -> Option<&str> {
    cell.get("cell_type").and_then(Value::as_str)
}

/// Parses `.ipynb` text; `origin` names it in errors.
fn parse_ipynb(text: &str, origin: &str) -> Result<Notebook, NotebookError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim().is_empty() {
        return Err(NotebookError::Malformed {
            origin: origin.to_string(),
            reason: "the file is empty".into(),
        });
    }
    let root: Value = serde_json::from_str(text).map_err(|source| NotebookError::InvalidJson {
        origin: origin.to_string(),
        source,
    })?;
    let root = normalize(root, origin)?;
    Ok(Notebook { root })
}

/// Checks the structure this crate relies on and brings the notebook to its
/// in-memory form (see [`Notebook`]'s invariants): multi-line strings
/// joined, missing `metadata` / `outputs` / `execution_count` filled in,
/// transient metadata dropped (as nbformat does on read), ids assigned and
/// `nbformat_minor` raised to 5.
fn normalize(mut root: Value, origin: &str) -> Result<Value, NotebookError> {
    let malformed = |reason: String| NotebookError::Malformed {
        origin: origin.to_string(),
        reason,
    };
    let Some(obj) = root.as_object_mut() else {
        return Err(malformed("the top level is not a JSON object".into()));
    };
    match obj.get("nbformat") {
        None => return Err(malformed("there is no \"nbformat\" field".into())),
        Some(v) if v.as_u64() == Some(4) => {}
        Some(v @ Value::Number(_)) => {
            return Err(NotebookError::UnsupportedVersion {
                origin: origin.to_string(),
                version: v.to_string(),
            });
        }
        Some(v) => return Err(malformed(format!("\"nbformat\" is {v}, not a number"))),
    }
    let minor = match obj.get("nbformat_minor") {
        None => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| malformed(format!("\"nbformat_minor\" is {v}, not a non-negative integer")))?,
    };
    if minor < 5 {
        obj.insert("nbformat_minor".into(), Value::from(5));
    }
    match obj.entry("metadata").or_insert_with(|| Value::Object(Map::new())) {
        Value::Object(metadata) => {
            for key in ["orig_nbformat", "orig_nbformat_minor", "signature"] {
                metadata.remove(key);
            }
        }
        _ => return Err(malformed("\"metadata\" is not an object".into())),
    }
    let cells = match obj.get_mut("cells") {
        Some(Value::Array(cells)) => cells,
        Some(_) => return Err(malformed("\"cells\" is not a list".into())),
        None => return Err(malformed("there is no \"cells\" list".into())),
    };
    for (i, cell) in cells.iter_mut().enumerate() {
        normalize_cell(i, cell).map_err(malformed)?;
    }
    assign_ids(cells);
    Ok(root)
}

/// One cell of [`normalize`]; the error is the reason, naming the field.
fn normalize_cell(i: usize, cell: &mut Value) -> Result<(), String> {
    let Some(c) = cell.as_object_mut() else {
        return Err(format!("cells[{i}] is not an object"));
    };
    let is_code = match c.get("cell_type") {
        Some(Value::String(t)) if t == "code" => true,
        Some(Value::String(t)) if t == "markdown" || t == "raw" => false,
        Some(t) => {
            return Err(format!(
                "cells[{i}].cell_type is {t}; expected \"code\", \"markdown\" or \"raw\""
            ));
        }
        None => return Err(format!("cells[{i}] has no cell_type")),
    };
    match c.entry("metadata").or_insert_with(|| Value::Object(Map::new())) {
        Value::Object(metadata) => {
            metadata.remove("trusted");
        }
        _ => return Err(format!("cells[{i}].metadata is not an object")),
    }
    let source = c
        .get("source")
        .ok_or_else(|| format!("cells[{i}] has no source"))?;
    let source = lines::join_multiline(source)
        .ok_or_else(|| format!("cells[{i}].source is not a string or a list of strings"))?;
    c.insert("source".into(), Value::String(source));
    if let Some(Value::Object(attachments)) = c.get_mut("attachments") {
        for bundle in attachments.values_mut() {
            if let Value::Object(bundle) = bundle {
                lines::rejoin_bundle(bundle);
            }
        }
    }
    if !is_code {
        return Ok(());
    }
    match c.entry("execution_count").or_insert(Value::Null) {
        Value::Null => {}
        v if v.as_u64().is_some() => {}
        v => {
            return Err(format!(
                "cells[{i}].execution_count is {v}, not null or a non-negative integer"
            ));
        }
    }
    let outputs = match c.entry("outputs").or_insert_with(|| Value::Array(Vec::new())) {
        Value::Array(outputs) => outputs,
        _ => return Err(format!("cells[{i}].outputs is not a list")),
    };
    for (j, output) in outputs.iter_mut().enumerate() {
        let Some(o) = output.as_object_mut() else {
            return Err(format!("cells[{i}].outputs[{j}] is not an object"));
        };
        let is_rich = match o.get("output_type") {
            Some(Value::String(t)) => t == "execute_result" || t == "display_data",
            _ => return Err(format!("cells[{i}].outputs[{j}] has no output_type")),
        };
        if is_rich {
            if let Some(Value::Object(data)) = o.get_mut("data") {
                lines::rejoin_bundle(data);
            }
        } else if let Some(text) = o.get_mut("text")
            && text.is_array()
            && let Some(joined) = lines::join_multiline(text)
        {
            *text = Value::String(joined);
        }
    }
    Ok(())
}

/// Whether `id` matches the nbformat 4.5 cell id pattern
/// `^[a-zA-Z0-9-_]+$`, 1 to 64 characters.
fn is_valid_cell_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Gives every cell without a valid id, or with the id of an earlier cell,
/// the id `cell-<index>` (with a `-<n>` suffix if that is taken).
fn assign_ids(cells: &mut [Value]) {
    let mut used = HashSet::new();
    let mut missing = Vec::new();
    for (i, cell) in cells.iter().enumerate() {
        match cell.get("id").and_then(Value::as_str) {
            Some(id) if is_valid_cell_id(id) && used.insert(id.to_string()) => {}
            _ => missing.push(i),
        }
    }
    for i in missing {
        let mut id = format!("cell-{i}");
        let mut n = 1;
        while used.contains(&id) {
            id = format!("cell-{i}-{n}");
            n += 1;
        }
        used.insert(id.clone());
        if let Some(obj) = cells.get_mut(i).and_then(Value::as_object_mut) {
            obj.insert("id".into(), Value::String(id));
        }
    }
}

/// Splits multi-line strings into lists of lines as nbformat's
/// `split_lines` does on write.
fn split_for_disk(root: &mut Value) {
    let Some(cells) = root.get_mut("cells").and_then(Value::as_array_mut) else {
        return;
    };
    for cell in cells.iter_mut() {
        let Some(c) = cell.as_object_mut() else {
            continue;
        };
        if let Some(Value::String(source)) = c.get("source") {
            let lines = lines::lines_value(source);
            c.insert("source".into(), lines);
        }
        if let Some(Value::Object(attachments)) = c.get_mut("attachments") {
            for bundle in attachments.values_mut() {
                if let Value::Object(bundle) = bundle {
                    lines::split_bundle(bundle);
                }
            }
        }
        if c.get("cell_type").and_then(Value::as_str) != Some("code") {
            continue;
        }
        let Some(Value::Array(outputs)) = c.get_mut("outputs") else {
            continue;
        };
        for output in outputs.iter_mut() {
            let Some(o) = output.as_object_mut() else {
                continue;
            };
            match o.get("output_type").and_then(Value::as_str) {
                Some("execute_result" | "display_data") => {
                    if let Some(Value::Object(data)) = o.get_mut("data") {
                        lines::split_bundle(data);
                    }
                }
                Some("stream") => {
                    if let Some(Value::String(text)) = o.get("text") {
                        let lines = lines::lines_value(text);
                        o.insert("text".into(), lines);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_ids_follow_the_schema_pattern() {
        assert!(is_valid_cell_id("a1-B_2"));
        assert!(is_valid_cell_id(&"x".repeat(64)));
        assert!(!is_valid_cell_id(""));
        assert!(!is_valid_cell_id(&"x".repeat(65)));
        assert!(!is_valid_cell_id("has space"));
        assert!(!is_valid_cell_id("dot.ted"));
    }

    #[test]
    fn ids_are_assigned_without_collisions() {
        let mut cells = vec![
            json!({"id": "cell-1"}),
            json!({}),
            json!({"id": "cell-1"}),
            json!({"id": "bad id"}),
            json!({"id": "keep"}),
        ];
        assign_ids(&mut cells);
        let ids: Vec<&str> = cells
            .iter()
            .map(|c| c["id"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(ids, vec!["cell-1", "cell-1-1", "cell-2", "cell-3", "keep"]);
    }

    #[test]
    fn default_output_path_sits_beside_the_input() {
        assert_eq!(
            default_output_path(Path::new("/a/b/analysis.ipynb")),
            PathBuf::from("/a/b/analysis.executed.ipynb")
        );
        assert_eq!(
            default_output_path(Path::new("script.py")),
            PathBuf::from("script.executed.ipynb")
        );
        assert_eq!(
            default_output_path(Path::new("dir/noext")),
            PathBuf::from("dir/noext.executed.ipynb")
        );
        assert_eq!(
            default_output_path(Path::new("dir/v1.2.ipynb")),
            PathBuf::from("dir/v1.2.executed.ipynb")
        );
    }
}
