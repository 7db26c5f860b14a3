//! `POST /v1/notebooks/run`: run a whole notebook, answer it executed — a
//! thin adapter over the request layer's
//! [`RunNotebookRequest`](cellhost_sessions::requests::RunNotebookRequest),
//! as `cellhost run` is.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use cellhost_sessions::notebook::{Quiet, RunOptions};
use cellhost_sessions::requests::{NotebookInput, RunNotebookRequest, parameters_from_json, summary_json};
use cellhost_sessions::{Origin, SessionSpec};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ErrorBody, ErrorCode};
use crate::http::{AppState, deadline_of, owned, owner_of, spec};

/// Body of `POST /v1/notebooks/run`: exactly one of `notebook` and
/// `script`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunNotebookBody {
    /// An nbformat 4 notebook (the JSON of an `.ipynb` file). Its
    /// `kernelspec.language` (else `language_info.name`) must be a language
    /// the server has a runtime for (`python`), else 422
    /// `unsupported_language`.
    #[schema(value_type = Option<Object>)]
    pub notebook: Option<Value>,
    /// A percent-format script (`# %%` cells) instead of a notebook.
    #[schema(max_length = 4194304)]
    pub script: Option<String>,
    /// Parameters injected as papermill does: a cell tagged
    /// `injected-parameters` after the cell tagged `parameters` (or first)
    /// assigning each name (a Python identifier) its value (`null` is
    /// `None`, objects are dicts).
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Map<String, Value>>,
    /// Run in this existing session of the caller (its variables are
    /// kept and seen by the notebook); absent: a session of its own,
    /// deleted when the run ends.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub session: Option<String>,
    /// Each cell's deadline in seconds (0 = none; absent: the server's
    /// `cell_timeout_s`).
    #[schema(minimum = 0, maximum = 604800)]
    pub timeout_s: Option<f64>,
    /// Keep going after a cell fails (default false: stop there; a cell
    /// tagged `raises-exception` may always fail).
    #[serde(default)]
    pub allow_errors: bool,
}

/// Why a run stopped before its end.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunStop {
    /// `cell_failed`, `interrupted`, `runner_failed`, `journal_failed` or
    /// `notebook_failed`.
    pub reason: String,
    /// The 1-based number of the code cell it stopped at.
    pub cell: u64,
    /// One line saying why.
    pub message: String,
    /// The failed cell's status (`error`, `timeout`, `crashed`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// Answer of `POST /v1/notebooks/run`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunNotebookAnswer {
    /// The executed notebook, nbformat 4.5 as `cellhost run` writes it
    /// (outputs, figures embedded, `metadata.execution` timestamps).
    #[schema(value_type = Object)]
    pub notebook: Value,
    /// Code cells in the notebook.
    pub total: u64,
    /// Cells that ran.
    pub ran: u64,
    /// Why the run stopped early (absent: every cell ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<RunStop>,
}

/// Run a notebook.
///
/// Runs every code cell in order in one session and answers the executed
/// notebook; a failed cell stops the run (unless `allow_errors`) and is
/// reported in `stop`, not as an error answer; a named session that is
/// running a cell refuses the run (409 `session_busy`). The body is limited to 4 MiB like every
/// body, and to 10000 cells (400 `bad_request`).
#[utoipa::path(post, path = "/v1/notebooks/run", operation_id = "runNotebook", tag = "notebooks",
    request_body(content = RunNotebookBody, content_type = "application/json"),
    responses(
        (status = 200, description = "the executed notebook", body = RunNotebookAnswer),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
        (status = 409, description = "`session_busy`: the named session is running a cell", body = ErrorBody),
        (status = 502, description = "`kernel_failed`", body = ErrorBody),
        (status = 503, description = "`sandbox_unavailable`, `registry_full` or `shut_down`", body = ErrorBody),
    ))]
pub(crate) async fn run_notebook(
    State(st): State<std::sync::Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiJson(body): ApiJson<RunNotebookBody>,
) -> Result<Json<RunNotebookAnswer>, ApiError> {
    let input = match (body.notebook, body.script) {
        (Some(nb), None) => NotebookInput::Ipynb(nb),
        (None, Some(s)) => NotebookInput::Percent(s),
        _ => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "give exactly one of `notebook` (nbformat JSON) and `script` (percent format)",
            ));
        }
    };
    let mut nb = input
        .parse()
        .map_err(|e| ApiError::from(e).with("field", "notebook"))?;
    let parameters = parameters_from_json(body.parameters.as_ref())
        .map_err(|e| ApiError::from(e).with("field", "parameters"))?;
    let deadline = deadline_of(body.timeout_s)?;
    let owner = owner_of(&caller);
    let session = match &body.session {
        Some(name) => {
            let (owner, sandbox) = owned(&st, &caller, name)?;
            spec(&owner, name, &sandbox)
        }
        None => SessionSpec::new(owner, "notebook"),
    };
    let temporary = body.session.is_none();
    let req = RunNotebookRequest {
        session,
        deadline,
        options: RunOptions {
            files_dir: None,
            allow_errors: body.allow_errors,
            timeout: None,
            stop: None,
        },
        origin: Origin::new("http:run_notebook"),
        parameters,
    };
    // The run is its own task: a client that disconnects does not cut a
    // cell's bookkeeping short.
    let registry = st.registry().clone();
    let (nb, summary) = tokio::spawn(async move {
        let summary = if temporary {
            req.execute_temporary(&registry, &mut nb, &mut Quiet).await
        } else {
            req.execute(&registry, &mut nb, &mut Quiet).await
        };
        summary.map(|s| (nb, s))
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::Internal, format!("the notebook's task failed: {e}")))??;
    let s = summary_json(&summary);
    let notebook = serde_json::from_str(&nb.to_json_string())
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("the executed notebook: {e}")))?;
    Ok(Json(RunNotebookAnswer {
        notebook,
        total: summary.total as u64,
        ran: summary.ran as u64,
        stop: s.get("stop").filter(|v| !v.is_null()).map(|v| RunStop {
            reason: v["reason"].as_str().unwrap_or_default().to_string(),
            cell: v["cell"].as_u64().unwrap_or_default(),
            message: v["message"].as_str().unwrap_or_default().to_string(),
            status: v.get("status").and_then(Value::as_str).map(str::to_string),
        }),
    }))
}
