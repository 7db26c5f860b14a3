//! The `run_notebook` tool: a whole notebook run in one call, a thin
//! adapter over the request layer's
//! [`RunNotebookRequest`](cellhost_sessions::requests::RunNotebookRequest)
//! (as `cellhost run` and `POST /v1/notebooks/run` are).

use std::path::{Path, PathBuf};

use cellhost_sessions::notebook::{Notebook, Quiet, RunOptions, default_output_path};
use cellhost_sessions::requests::{NotebookInput, RunNotebookRequest, parameters_from_json, summary_json};
use cellhost_sessions::{Deadline, Origin};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{CellhostMcp, params_error, request_tool_error, session_name, text_result, tool_error};

/// Characters of each cell's output quoted in the text of the answer.
const CELL_TEXT_MAX: usize = 2_000;

/// Parameters of `run_notebook`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunNotebookParams {
    /// Path of a notebook (.ipynb) or percent-format script (.py) on the
    /// server's machine. Exactly one of `path`, `notebook` and `script`.
    #[serde(default)]
    pub path: Option<String>,
    /// An nbformat 4 notebook as JSON.
    #[serde(default)]
    pub notebook: Option<Value>,
    /// A percent-format script (`# %%` starts a cell).
    #[serde(default)]
    pub script: Option<String>,
    /// Parameters injected as papermill does (a cell tagged
    /// `injected-parameters` after the cell tagged `parameters`, or first):
    /// an object of names to values.
    #[serde(default)]
    pub parameters: Option<serde_json::Map<String, Value>>,
    /// Run in this session (its variables are kept and seen by the
    /// notebook); absent: a session of its own, ended after the run.
    #[serde(default)]
    pub session: Option<String>,
    /// Each cell's deadline in seconds (default 300; 0 = none).
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Keep going after a failed cell (default false).
    #[serde(default)]
    pub allow_errors: Option<bool>,
    /// Write the executed notebook here (and its figures beside it, in
    /// `<stem>_files`); with `path` and no `output_path`, it goes to
    /// `<stem>.executed.ipynb` beside the input. Without a file, the
    /// executed notebook is only in the structured answer.
    #[serde(default)]
    pub output_path: Option<String>,
}

/// `s` cut to its last `max` bytes (at a character boundary).
fn last(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut at = s.len() - max;
    while !s.is_char_boundary(at) {
        at += 1;
    }
    &s[at..]
}

/// One line per code cell that ran, with the tail of its text outputs.
fn describe(nb: &Notebook) -> String {
    let mut text = String::new();
    let cells = nb.as_json()["cells"].as_array().cloned().unwrap_or_default();
    for (n, cell) in cells.iter().filter(|c| c["cell_type"] == "code").enumerate() {
        let Some(count) = cell["execution_count"].as_u64() else {
            continue;
        };
        let mut body = String::new();
        for o in cell["outputs"].as_array().into_iter().flatten() {
            match o["output_type"].as_str() {
                Some("stream") => body.push_str(o["text"].as_str().unwrap_or_default()),
                Some("execute_result") => {
                    body.push_str(o["data"]["text/plain"].as_str().unwrap_or_default());
                    body.push('\n');
                }
                Some("display_data") => {
                    let kinds: Vec<&str> = o["data"]
                        .as_object()
                        .map(|d| d.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    body.push_str(&format!("[display: {}]\n", kinds.join(", ")));
                }
                Some("error") => body.push_str(&format!(
                    "{}: {}\n",
                    o["ename"].as_str().unwrap_or_default(),
                    o["evalue"].as_str().unwrap_or_default()
                )),
                _ => {}
            }
        }
        text.push_str(&format!(
            "--- cell {} [{count}]\n{}",
            n + 1,
            last(&body, CELL_TEXT_MAX)
        ));
        if !body.is_empty() && !body.ends_with('\n') {
            text.push('\n');
        }
    }
    text
}

#[tool_router(router = notebook_router, vis = "pub(crate)")]
impl CellhostMcp {
    #[tool(
        description = "Run a whole Jupyter notebook (or percent-format script) cell by cell in one \
kernel and return it executed, as `cellhost run` does: give `path` (an .ipynb or .py file), or \
`notebook` (nbformat JSON), or `script` (percent format). `parameters` are injected as papermill \
does, after the cell tagged `parameters`. The run stops at the first failed cell unless \
`allow_errors` (a cell tagged raises-exception may fail). A notebook whose language has no \
runtime here fails with error code unsupported_language. Without `session` the notebook runs in \
a kernel of its own, ended afterwards. The text lists each cell's output; the structured content \
has the executed notebook, `total`, `ran` and `stop`; `output_path` (default beside `path`) \
receives the notebook file."
    )]
    pub(crate) async fn run_notebook(
        &self,
        Parameters(p): Parameters<RunNotebookParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut output = p.output_path.as_ref().map(PathBuf::from);
        let input = match (p.path, p.notebook, p.script) {
            (Some(path), None, None) => {
                let path = PathBuf::from(path);
                let nb = match Notebook::load(&path) {
                    Ok((nb, _)) => nb,
                    Err(e) => return Ok(tool_error("bad_request", e.to_string())),
                };
                output.get_or_insert_with(|| default_output_path(&path));
                Ok(nb)
            }
            (None, Some(nb), None) => NotebookInput::Ipynb(nb).parse(),
            (None, None, Some(s)) => NotebookInput::Percent(s).parse(),
            _ => return Err(params_error("give exactly one of path, notebook and script")),
        };
        let mut nb = match input {
            Ok(nb) => nb,
            Err(e) => return Ok(request_tool_error("status: the notebook cannot be run", &e)),
        };
        let parameters = match parameters_from_json(p.parameters.as_ref()) {
            Ok(x) => x,
            Err(e) => return Ok(request_tool_error("status: bad parameters", &e)),
        };
        let deadline =
            Deadline::from_secs(p.timeout_s).map_err(|e| params_error(format!("timeout_s: {e}")))?;
        let temporary = p.session.is_none();
        let session = session_name(p.session)?;
        let files_dir = output.as_deref().map(|o| {
            let stem = o
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            o.with_file_name(format!("{stem}_files"))
        });
        let req = RunNotebookRequest {
            session: self.spec(&session),
            deadline,
            options: RunOptions {
                files_dir,
                allow_errors: p.allow_errors == Some(true),
                timeout: None,
                stop: None,
            },
            origin: Origin::new("mcp:run_notebook"),
            parameters,
        };
        let registry = self.registry().clone();
        let joined = tokio::spawn(async move {
            let summary = if temporary {
                req.execute_temporary(&registry, &mut nb, &mut Quiet).await
            } else {
                req.execute(&registry, &mut nb, &mut Quiet).await
            };
            summary.map(|s| (nb, s))
        })
        .await;
        let (nb, summary) = match joined {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => return Ok(request_tool_error("status: the notebook did not run", &e)),
            Err(e) => {
                return Err(ErrorData::internal_error(
                    format!("notebook task failed: {e}"),
                    Some(json!({"code": "internal"})),
                ));
            }
        };
        let mut text = match &summary.stop {
            None => format!(
                "status: ok, {} of {} code cells ran\n",
                summary.ran, summary.total
            ),
            Some(stop) => format!(
                "status: stopped ({}), {} of {} code cells ran: {}\n",
                stop.code(),
                summary.ran,
                summary.total,
                stop.message()
            ),
        };
        let mut structured = summary_json(&summary);
        if let Some(out) = &output {
            match write_beside(&nb, out) {
                Ok(()) => {
                    text.push_str(&format!("wrote {}\n", out.display()));
                    structured["output_path"] = json!(out.display().to_string());
                }
                Err(e) => return Ok(tool_error("write_failed", e)),
            }
        }
        text.push_str(&describe(&nb));
        structured["notebook"] = serde_json::from_str(&nb.to_json_string()).unwrap_or(Value::Null);
        let mut r = text_result(text, structured);
        if summary.stop.is_some() {
            r.is_error = Some(true);
        }
        Ok(r)
    }
}

/// Writes the executed notebook to `out`, creating its directory.
fn write_beside(nb: &Notebook, out: &Path) -> Result<(), String> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    nb.write(out).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_cuts_at_a_char_boundary() {
        assert_eq!(last("abc", 5), "abc");
        assert_eq!(last("aé", 1), "");
        assert_eq!(last("éb", 2), "b");
    }
}
