//! `POST /v1/sessions/{name}/packages`: install packages into a session
//! ([`cellhost_sessions::requests::InstallRequest`]): the host runs the
//! installer into the session's overlay while the kernel stays offline;
//! the next `execute` imports the packages.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use cellhost_sessions::Origin;
use cellhost_sessions::cell::CellResult;
use cellhost_sessions::packages::InstallReport;
use cellhost_sessions::requests::InstallRequest;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ErrorBody, ErrorCode};
use crate::http::{AppState, SessionPath, owned, spec};

/// Body of `POST /v1/sessions/{name}/packages`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstallBody {
    /// Requirement specs: `name`, `name[extra]`, `name>=1.0,<2`. Options
    /// (`-r`, `-e`, `--index-url`), markers, paths and URLs are refused
    /// with `invalid_package_spec`.
    #[schema(min_items = 1, max_items = 64)]
    pub packages: Vec<String>,
    /// Install into the interpreter's own environment, shared by every
    /// session using it (refused with `shared_venv_refused` unless the
    /// server's config sets `packages.shared_venv = true`).
    #[serde(default)]
    pub shared_venv: bool,
    /// Wait behind a running cell instead of `session_busy`.
    #[serde(default)]
    pub queue: bool,
}

/// What an install did.
#[derive(Debug, Serialize, ToSchema)]
pub struct InstallResponse {
    /// The installer's report: the distributions added, whether a restart
    /// is needed, its output.
    pub report: InstallReport,
    /// The `%pip install` cell the install ran as (journaled; `restore`
    /// replays it).
    pub result: CellResult,
}

/// Install packages into the session (its kernel started on first use): the host runs the installer with the configured index; the kernel stays offline.
#[utoipa::path(post, path = "/v1/sessions/{name}/packages", operation_id = "installPackages", tag = "sessions",
    params(SessionPath),
    request_body(content = InstallBody, content_type = "application/json"),
    responses(
        (status = 200, description = "installed", body = InstallResponse),
        (status = 403, description = "`shared_venv_refused`", body = ErrorBody),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
        (status = 409, description = "`session_busy`", body = ErrorBody),
        (status = 422, description = "`invalid_package_spec` (`spec`, `reason`)", body = ErrorBody),
        (status = 502, description = "`install_failed` (`status`, `stderr_tail`) or `kernel_failed`", body = ErrorBody),
        (status = 503, description = "`installer_unavailable`", body = ErrorBody),
    ))]
pub(crate) async fn install_packages(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
    ApiJson(body): ApiJson<InstallBody>,
) -> Result<axum::Json<InstallResponse>, ApiError> {
    let (owner, meta) = owned(&st, &caller, &name)?;
    let mut req = InstallRequest::new(spec(&owner, &name, &meta), body.packages, Origin::new("http"));
    req.shared_venv = body.shared_venv;
    req.queue = body.queue;
    // Its own task: a client that disconnects does not cancel the
    // installer half-way or the cell's journal row.
    let st2 = st.clone();
    let done = tokio::spawn(async move { req.execute(st2.registry()).await })
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("the install's task failed: {e}")))??;
    Ok(axum::Json(InstallResponse {
        report: done.report,
        result: done.result,
    }))
}
