//! Cells that outlive a call ([`cellhost_sessions::requests::SubmitRequest`]):
//!
//! - `POST /v1/sessions/{name}/cells` submits a cell: 202 `{cell}` at once;
//! - `GET /v1/sessions/{name}/cells` lists the session's queued and running
//!   submitted cells;
//! - `GET /v1/cells/{cell}`: status, output so far, and the result once done;
//! - `GET /v1/cells/{cell}/events`: its events as server-sent events, each
//!   with its offset as `id`, from `?offset=N` or after `Last-Event-ID`,
//!   live until the final `result`, `error` or `cancelled` event;
//! - `DELETE /v1/cells/{cell}`: drop it from the queue, or interrupt it.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cellhost_sessions::detached::{CellSnapshot, DetachedStatus};
use cellhost_sessions::requests::{CancelCellRequest, CellCancelled, CwdScope, SubmitRequest, Submitted};
use cellhost_sessions::{Origin, RequestError};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorBody};
use crate::http::{AppState, SessionPath, owned, owner_of, spec};

type St = State<Arc<AppState>>;

/// Body of `POST /v1/sessions/{name}/cells`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    /// Python source of one cell.
    pub code: String,
    /// The cell's deadline in seconds from when it starts running (0 =
    /// none; absent: the server's `cell_timeout_s`).
    #[schema(minimum = 0, maximum = 604800)]
    pub timeout_s: Option<f64>,
}

/// A submitted cell named in the path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct CellPath {
    /// The id `POST …/cells` answered.
    #[param(min_length = 1, max_length = 64)]
    pub cell: String,
}

/// Query of `cellEvents`.
#[derive(Debug, Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Offset of the first event to send (default 0, or one past the
    /// `Last-Event-ID` header).
    #[param(minimum = 0)]
    pub offset: Option<u64>,
}

/// A queued or running submitted cell.
#[derive(Debug, Serialize, ToSchema)]
pub struct PendingCell {
    /// Its id.
    pub cell: String,
    /// `queued` or `running`.
    pub status: DetachedStatus,
}

/// The session's queued and running submitted cells.
#[derive(Debug, Serialize, ToSchema)]
pub struct PendingCells {
    /// In submission order (the running one first).
    pub cells: Vec<PendingCell>,
}

/// Submit a cell that outlives the call: answered at once with its id; it runs after the session's earlier submitted cells.
#[utoipa::path(post, path = "/v1/sessions/{name}/cells", operation_id = "submitCell", tag = "cells",
    params(SessionPath),
    request_body(content = SubmitBody, content_type = "application/json"),
    responses(
        (status = 202, description = "submitted", body = Submitted),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
    ))]
pub(crate) async fn submit_cell(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
    ApiJson(body): ApiJson<SubmitBody>,
) -> Result<Response, ApiError> {
    let (owner, sandbox) = owned(&st, &caller, &name)?;
    let deadline = crate::http::deadline_of(body.timeout_s)?;
    let req = SubmitRequest {
        session: spec(&owner, &name, &sandbox),
        code: body.code,
        deadline,
        origin: Origin::new("http"),
    };
    let handle = req.execute(st.registry())?;
    Ok((StatusCode::ACCEPTED, axum::Json(handle)).into_response())
}

/// The session's queued and running submitted cells.
#[utoipa::path(get, path = "/v1/sessions/{name}/cells", operation_id = "listCells", tag = "cells",
    params(SessionPath),
    responses(
        (status = 200, description = "the cells", body = PendingCells),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
    ))]
pub(crate) async fn list_cells(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
) -> Result<axum::Json<PendingCells>, ApiError> {
    let (owner, _) = owned(&st, &caller, &name)?;
    let cells = st
        .registry()
        .detached()
        .pending(&owner, &name, &CwdScope::Any)
        .iter()
        .map(|c| PendingCell {
            cell: c.id.clone(),
            status: c.status(),
        })
        .collect();
    Ok(axum::Json(PendingCells { cells }))
}

fn tracked(
    st: &AppState,
    caller: &Caller,
    cell: &str,
) -> Result<Arc<cellhost_sessions::detached::Tracked>, ApiError> {
    st.registry()
        .detached()
        .get(&owner_of(caller), cell)
        .ok_or_else(|| {
            RequestError::CellNotFound {
                cell: cell.to_string(),
            }
            .into()
        })
}

/// A submitted cell: status, output so far, and its result once done.
#[utoipa::path(get, path = "/v1/cells/{cell}", operation_id = "getCell", tag = "cells",
    params(CellPath),
    responses(
        (status = 200, description = "the cell", body = CellSnapshot),
        (status = 404, description = "`cell_not_found`", body = ErrorBody),
    ))]
pub(crate) async fn get_cell(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(CellPath { cell }): ApiPath<CellPath>,
) -> Result<axum::Json<CellSnapshot>, ApiError> {
    Ok(axum::Json(tracked(&st, &caller, &cell)?.snapshot()))
}

/// Drop a queued submitted cell, or interrupt it when it runs.
#[utoipa::path(delete, path = "/v1/cells/{cell}", operation_id = "cancelCell", tag = "cells",
    params(CellPath),
    responses(
        (status = 200, description = "what was done", body = CellCancelled),
        (status = 404, description = "`cell_not_found`", body = ErrorBody),
    ))]
pub(crate) async fn cancel_cell(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(CellPath { cell }): ApiPath<CellPath>,
) -> Result<axum::Json<CellCancelled>, ApiError> {
    let done = CancelCellRequest {
        owner: owner_of(&caller),
        cell,
    }
    .execute(st.registry())
    .await?;
    Ok(axum::Json(done))
}

/// One server-sent event of a submitted cell (`id` is its offset).
#[derive(Debug, Serialize, ToSchema)]
pub struct CellEventDoc {
    /// `stream`, `display`, then one of `result`, `error`, `cancelled`.
    pub event: String,
    /// The event's offset, as decimal text (resume with `?offset=id+1` or
    /// `Last-Event-ID: id`).
    #[schema(pattern = "^[0-9]+$")]
    pub id: String,
    /// JSON text of the event's value.
    pub data: String,
}

/// A submitted cell's events as server-sent events, from any offset, live until it ends.
#[utoipa::path(get, path = "/v1/cells/{cell}/events", operation_id = "cellEvents", tag = "cells",
    params(CellPath, EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "resume after this event id")),
    responses(
        (status = 200, description = "the events", content((CellEventDoc = "text/event-stream"))),
        (status = 404, description = "`cell_not_found`", body = ErrorBody),
    ))]
pub(crate) async fn cell_events(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(CellPath { cell }): ApiPath<CellPath>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let t = tracked(&st, &caller, &cell)?;
    let after_last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|n| n.saturating_add(1));
    let start = q.offset.or(after_last).unwrap_or(0);
    let start = usize::try_from(start).unwrap_or(usize::MAX);
    let follow = t.follow();
    let stream = futures_util::stream::unfold(
        (t, follow, start, Vec::<(usize, Event)>::new(), false),
        |(t, mut follow, mut next, mut buf, mut ended)| async move {
            loop {
                if let Some(ev) = (!buf.is_empty()).then(|| buf.remove(0)) {
                    return Some((Ok::<Event, Infallible>(ev.1), (t, follow, next, buf, ended)));
                }
                if ended {
                    return None;
                }
                follow.borrow_and_update();
                let (events, fin) = t.events_from(next);
                for (i, e) in events.into_iter().enumerate() {
                    let ev = Event::default()
                        .event(e.event)
                        .id((next + i).to_string())
                        .json_data(&e.data)
                        .unwrap_or_else(|_| Event::default().event(e.event));
                    buf.push((next + i, ev));
                }
                next += buf.len();
                if fin {
                    ended = true;
                    continue;
                }
                if buf.is_empty() && follow.changed().await.is_err() {
                    return None;
                }
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}
