//! `POST /v1/sessions/{name}/pause` and `…/checkpoint`: a session's
//! checkpoint taken now, and a pause (checkpoint, then the kernel stopped;
//! the next `execute` resumes it, also after `serve` restarted)
//! ([`cellhost_sessions::requests::PauseRequest`],
//! [`cellhost_sessions::requests::CheckpointRequest`]).

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use cellhost_sessions::requests::{CheckpointRequest, CwdScope, PauseRequest};
use cellhost_sessions::{CheckpointSummary, PauseReport};

use crate::auth::Caller;
use crate::error::{ApiError, ApiPath, ErrorBody};
use crate::http::{AppState, SessionPath, owned};

/// Pause the session: its namespace checkpointed, then its kernel stopped (memory freed). The journal records both; the next `execute` resumes it (its result says `restored.resumed`), also after the server restarted (create the session again first: a paused session is not restarted).
#[utoipa::path(post, path = "/v1/sessions/{name}/pause", operation_id = "pauseSession", tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "paused", body = PauseReport),
        (status = 404, description = "`session_not_found` (no live kernel: paused already, never started)", body = ErrorBody),
        (status = 409, description = "`session_busy`", body = ErrorBody),
        (status = 500, description = "`checkpoint_failed` (the kernel keeps running)", body = ErrorBody),
        (status = 501, description = "`checkpoint_unavailable`", body = ErrorBody),
    ))]
pub(crate) async fn pause_session(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
) -> Result<Json<PauseReport>, ApiError> {
    let (owner, _) = owned(&st, &caller, &name)?;
    let report = PauseRequest {
        owner,
        session: name,
        cwd: CwdScope::Any,
    }
    .execute(st.registry())
    .await?;
    Ok(Json(report))
}

/// Take the session's checkpoint now (namespace checkpoints: the picklable part of its namespace; `process` mode is refused with `checkpoint_unavailable` naming why CRIU cannot run here).
#[utoipa::path(post, path = "/v1/sessions/{name}/checkpoint", operation_id = "checkpointSession", tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "the checkpoint", body = CheckpointSummary),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
        (status = 409, description = "`session_busy`", body = ErrorBody),
        (status = 500, description = "`checkpoint_failed`", body = ErrorBody),
        (status = 501, description = "`checkpoint_unavailable`", body = ErrorBody),
    ))]
pub(crate) async fn checkpoint_session(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
) -> Result<Json<CheckpointSummary>, ApiError> {
    let (owner, _) = owned(&st, &caller, &name)?;
    let c = CheckpointRequest {
        owner,
        session: name,
        cwd: CwdScope::Any,
    }
    .execute(st.registry())
    .await?;
    Ok(Json(c))
}
