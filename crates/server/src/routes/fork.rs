//! `POST /v1/sessions/{name}/fork`: fork the caller's live, idle session
//! into a new session of the caller with the same state
//! ([`cellhost_sessions::requests::ForkRequest`]).

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use cellhost_sessions::requests::{ForkReport, ForkRequest, ForkThreads};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ErrorBody};
use crate::http::{AppState, SessionPath, owned, release_session, reserve_session, spec};

/// Body of `POST /v1/sessions/{name}/fork`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// The new session's name (the caller's; must not exist).
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub name: String,
    /// Threads of the session's cells: `refuse` (default: `threads_running`
    /// naming them) or `drop` (the fork starts without them).
    #[serde(default)]
    pub threads: ForkThreads,
}

/// Fork the live, idle session into a new session with its variables, imports, execution count and a copy of its files, as a kernel of its own.
#[utoipa::path(post, path = "/v1/sessions/{name}/fork", operation_id = "forkSession", tag = "sessions",
    params(SessionPath),
    request_body(content = ForkBody, content_type = "application/json"),
    responses(
        (status = 201, description = "forked: the new session runs", body = ForkReport),
        (status = 404, description = "`session_not_found`: no such session, or no live kernel of it", body = ErrorBody),
        (status = 409, description = "`session_busy` (a cell runs), `session_exists` (the name is taken) or `threads_running` (`threads`)", body = ErrorBody),
        (status = 429, description = "`too_many_sessions` (64 an owner)", body = ErrorBody),
        (status = 500, description = "`fork_failed`: the snapshot or its restore failed", body = ErrorBody),
        (status = 502, description = "`kernel_failed`", body = ErrorBody),
        (status = 503, description = "`sandbox_unavailable`, `registry_full` or `shut_down`", body = ErrorBody),
        (status = 507, description = "`disk_full`: the files pass the session's disk cap", body = ErrorBody),
    ))]
pub(crate) async fn fork_session(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
    ApiJson(body): ApiJson<ForkBody>,
) -> Result<(StatusCode, axum::Json<ForkReport>), ApiError> {
    let (owner, meta) = owned(&st, &caller, &name)?;
    reserve_session(&st, &owner, &body.name, &meta)?;
    let req = ForkRequest {
        session: spec(&owner, &name, &meta),
        name: body.name.clone(),
        threads: body.threads,
    };
    // Its own task: a client that disconnects does not leave a fork half made.
    let st2 = st.clone();
    let done = tokio::spawn(async move { req.execute(st2.registry()).await }).await;
    match done {
        Ok(Ok(report)) => Ok((StatusCode::CREATED, axum::Json(report))),
        Ok(Err(e)) => {
            release_session(&st, &owner, &body.name);
            Err(e.into())
        }
        Err(e) => {
            release_session(&st, &owner, &body.name);
            Err(ApiError::new(
                crate::error::ErrorCode::Internal,
                format!("the fork's task failed: {e}"),
            ))
        }
    }
}
