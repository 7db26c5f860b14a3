//! The HTTP API: REST + server-sent events over a session [`Registry`].
//!
//! Every `/v1` route needs `Authorization: Bearer TOKEN`; the token's owner
//! keys every session, so one owner never sees another's (a foreign
//! session answers 404, like a missing one). Read-only tokens may call
//! `GET` routes only (403 otherwise). Request bodies are capped at
//! [`MAX_BODY_BYTES`] (413 beyond). `/openapi.json` is public.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use axum::{Extension, Json, Router};
use cellhost_kernel::{CellResult, ExecOptions, KernelError, LiveEvent};
use cellhost_sessions::{Origin, Registry, RegistryError};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::auth::{Caller, Scope, Tokens};

/// Where `cellhost serve` listens unless told otherwise (loopback only).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";

/// Largest request body accepted (4 MiB); larger ones answer 413.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Cells whose spill files are remembered for `/v1/cells/…/output`.
const CELLS_KEPT: usize = 10_000;

/// Sessions one owner may hold through the API.
const SESSIONS_PER_OWNER: usize = 64;

struct CellMeta {
    owner: String,
    spills: BTreeMap<String, PathBuf>,
}

#[derive(Default)]
struct Cells {
    by_id: HashMap<String, CellMeta>,
    order: VecDeque<String>,
}

/// Shared state of the API.
pub struct AppState {
    registry: Arc<Registry>,
    tokens: Tokens,
    /// Sessions created through the API: (owner, name) → created (ms).
    sessions: Mutex<BTreeMap<(String, String), i64>>,
    cells: Mutex<Cells>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

impl AppState {
    /// State over `registry`, accepting `tokens`.
    pub fn new(registry: Arc<Registry>, tokens: Tokens) -> Arc<AppState> {
        Arc::new(AppState {
            registry,
            tokens,
            sessions: Mutex::new(BTreeMap::new()),
            cells: Mutex::new(Cells::default()),
        })
    }

    /// The registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    fn has_session(&self, owner: &str, name: &str) -> bool {
        self.sessions
            .lock()
            .map(|s| s.contains_key(&(owner.to_string(), name.to_string())))
            .unwrap_or(false)
    }

    fn remember_cell(&self, owner: &str, r: &CellResult) {
        let spills: BTreeMap<String, PathBuf> = r
            .truncated
            .iter()
            .filter_map(|(k, t)| t.spill_path.clone().map(|p| (k.clone(), p)))
            .collect();
        if spills.is_empty() {
            return;
        }
        let Ok(mut c) = self.cells.lock() else { return };
        c.by_id.insert(
            r.cell_id.clone(),
            CellMeta {
                owner: owner.to_string(),
                spills,
            },
        );
        c.order.push_back(r.cell_id.clone());
        while c.order.len() > CELLS_KEPT {
            if let Some(old) = c.order.pop_front() {
                c.by_id.remove(&old);
            }
        }
    }
}

/// An error answer: `{"error": message}` with a status.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no session named {name:?}"))
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let status = match &e {
            RegistryError::Full { .. } | RegistryError::ShutDown => StatusCode::SERVICE_UNAVAILABLE,
            RegistryError::Kernel(KernelError::KernelBusy { .. }) => StatusCode::CONFLICT,
            RegistryError::Kernel(KernelError::InvalidRequest(_)) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

type St = State<Arc<AppState>>;

/// Every route of the API: (method, path, handler). The router is built
/// from this table, and a test checks it against the OpenAPI document.
pub fn route_table() -> Vec<(Method, &'static str, MethodRouter<Arc<AppState>>)> {
    vec![
        (Method::GET, "/openapi.json", get(openapi_doc)),
        (Method::POST, "/v1/sessions", post(create_session)),
        (Method::GET, "/v1/sessions", get(list_sessions)),
        (Method::DELETE, "/v1/sessions/{name}", delete(delete_session)),
        (Method::POST, "/v1/sessions/{name}/execute", post(execute)),
        (Method::POST, "/v1/sessions/{name}/interrupt", post(interrupt)),
        (Method::POST, "/v1/sessions/{name}/restart", post(restart)),
        (Method::GET, "/v1/sessions/{name}/variables", get(variables)),
        (Method::GET, "/v1/sessions/{name}/history", get(history)),
        (Method::GET, "/v1/cells/{cell}/output/{stream}", get(cell_output)),
    ]
}

/// The API's router (auth, body limit, every route of [`route_table`]).
pub fn router(state: Arc<AppState>) -> Router {
    let mut v1: Router<Arc<AppState>> = Router::new();
    let mut public: Router<Arc<AppState>> = Router::new();
    for (_, path, mr) in route_table() {
        if path.starts_with("/v1/") {
            v1 = v1.route(path, mr);
        } else {
            public = public.route(path, mr);
        }
    }
    let v1 = v1.layer(middleware::from_fn_with_state(state.clone(), authenticate));
    public
        .merge(v1)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn authenticate(State(st): St, mut req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let Some(caller) = presented.and_then(|t| st.tokens.check(t)) else {
        let msg = if presented.is_some() {
            "invalid bearer token"
        } else {
            "missing bearer token (Authorization: Bearer TOKEN)"
        };
        let mut r = ApiError(StatusCode::UNAUTHORIZED, msg.into()).into_response();
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return r;
    };
    if caller.scope == Scope::ReadOnly && req.method() != Method::GET {
        return ApiError(
            StatusCode::FORBIDDEN,
            "this token is read-only: it may call GET routes only".into(),
        )
        .into_response();
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

async fn openapi_doc() -> Json<Value> {
    Json(crate::openapi::document())
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: Option<String>,
}

fn session_json(st: &AppState, owner: &str, name: &str) -> Value {
    let key = st.registry.key(owner, name);
    match st.registry.kernel_and_generation(&key) {
        Some((k, generation)) => json!({
            "name": name,
            "alive": true,
            "busy": k.is_busy(),
            "generation": generation,
            "pid": k.info().pid,
            "python": k.info().python,
        }),
        None => json!({"name": name, "alive": false}),
    }
}

async fn create_session(
    State(st): St,
    Extension(caller): Extension<Caller>,
    body: Option<Json<CreateBody>>,
) -> Result<Response, ApiError> {
    let name = match body.and_then(|b| b.0.name) {
        Some(n) => n,
        None => format!("s-{}", &crate::auth::new_token()[..12]),
    };
    if !valid_name(&name) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "a session name is 1-64 characters of A-Z a-z 0-9 - _ .".into(),
        ));
    }
    {
        let mut s = st
            .sessions
            .lock()
            .map_err(|_| ApiError(StatusCode::INTERNAL_SERVER_ERROR, "lock".into()))?;
        let k = (caller.owner.clone(), name.clone());
        if s.contains_key(&k) {
            return Err(ApiError(StatusCode::CONFLICT, format!("session {name:?} exists")));
        }
        if s.keys().filter(|(o, _)| *o == caller.owner).count() >= SESSIONS_PER_OWNER {
            return Err(ApiError(
                StatusCode::TOO_MANY_REQUESTS,
                format!("at most {SESSIONS_PER_OWNER} sessions per owner; delete one first"),
            ));
        }
        s.insert(k, cellhost_sessions::journal::now_ms());
    }
    let key = st.registry.key(&caller.owner, &name);
    if let Err(e) = st.registry.acquire(&key).await {
        if let Ok(mut s) = st.sessions.lock() {
            s.remove(&(caller.owner.clone(), name.clone()));
        }
        return Err(e.into());
    }
    Ok((StatusCode::CREATED, Json(session_json(&st, &caller.owner, &name))).into_response())
}

async fn list_sessions(State(st): St, Extension(caller): Extension<Caller>) -> Json<Value> {
    let names: Vec<String> = st
        .sessions
        .lock()
        .map(|s| {
            s.keys()
                .filter(|(o, _)| *o == caller.owner)
                .map(|(_, n)| n.clone())
                .collect()
        })
        .unwrap_or_default();
    let list: Vec<Value> = names
        .iter()
        .map(|n| session_json(&st, &caller.owner, n))
        .collect();
    Json(json!({ "sessions": list }))
}

async fn delete_session(
    State(st): St,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let removed = st
        .sessions
        .lock()
        .map(|mut s| s.remove(&(caller.owner.clone(), name.clone())).is_some())
        .unwrap_or(false);
    if !removed {
        return Err(not_found(&name));
    }
    st.registry.dispose(&st.registry.key(&caller.owner, &name)).await;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteBody {
    code: String,
    /// Deadline in seconds (0 = none; default: the server's).
    timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize, Default)]
struct ExecuteQuery {
    stream: Option<bool>,
}

fn wants_stream(q: &ExecuteQuery, headers: &HeaderMap) -> bool {
    q.stream.unwrap_or_else(|| {
        headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/event-stream"))
    })
}

fn timeout_of(t: Option<f64>) -> Result<Option<Duration>, ApiError> {
    match t {
        None => Ok(None),
        Some(s) if !s.is_finite() || s < 0.0 => Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("timeout_s must be a number >= 0, got {s}"),
        )),
        Some(s) => Duration::try_from_secs_f64(s)
            .map(Some)
            .map_err(|_| ApiError(StatusCode::BAD_REQUEST, "timeout_s is too large".into())),
    }
}

async fn execute(
    State(st): St,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<ExecuteQuery>,
    headers: HeaderMap,
    Json(body): Json<ExecuteBody>,
) -> Result<Response, ApiError> {
    let key = owned_key(&st, &caller, &name)?;
    let timeout = timeout_of(body.timeout_s)?;
    let origin = Origin::new("http");
    if !wants_stream(&q, &headers) {
        let opts = ExecOptions {
            timeout,
            ..Default::default()
        };
        // The cell runs in its own task: a client that disconnects does not
        // cancel its bookkeeping (journal row, spill pages).
        let st2 = st.clone();
        let owner = caller.owner.clone();
        let r = tokio::spawn(async move {
            let r = st2.registry.execute(&key, &body.code, opts, &origin).await;
            if let Ok(r) = &r {
                st2.remember_cell(&owner, r);
            }
            r
        })
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
        return Ok(Json(r).into_response());
    }
    let (live_tx, mut live_rx) = mpsc::unbounded_channel();
    let opts = ExecOptions {
        timeout,
        live: Some(live_tx),
        ..Default::default()
    };
    let (tx, rx) = mpsc::channel::<Event>(256);
    let st2 = st.clone();
    tokio::spawn(async move {
        let code = body.code;
        let run = st2.registry.execute(&key, &code, opts, &origin);
        tokio::pin!(run);
        let mut live_open = true;
        let outcome = loop {
            tokio::select! {
                ev = live_rx.recv(), if live_open => match ev {
                    Some(ev) => { let _ = tx.send(live_event(ev)).await; }
                    None => live_open = false,
                },
                r = &mut run => break r,
            }
        };
        while let Ok(ev) = live_rx.try_recv() {
            let _ = tx.send(live_event(ev)).await;
        }
        let ev = match outcome {
            Ok(r) => {
                st2.remember_cell(&caller.owner, &r);
                Event::default()
                    .event("result")
                    .json_data(&r)
                    .unwrap_or_else(|_| Event::default().event("error").data("encode"))
            }
            Err(e) => Event::default()
                .event("error")
                .json_data(json!({"error": e.to_string()}))
                .unwrap_or_else(|_| Event::default().event("error").data("error")),
        };
        let _ = tx.send(ev).await;
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<Event, Infallible>(e), rx))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

fn live_event(ev: LiveEvent) -> Event {
    let v = match ev {
        LiveEvent::Stdout(t) => ("stream", json!({"name": "stdout", "text": t})),
        LiveEvent::Stderr(t) => ("stream", json!({"name": "stderr", "text": t})),
        LiveEvent::Display(d) => ("display", serde_json::to_value(d).unwrap_or(Value::Null)),
    };
    Event::default()
        .event(v.0)
        .json_data(v.1)
        .unwrap_or_else(|_| Event::default().event(v.0))
}

/// The registry key of `name` when it is one of the caller's sessions;
/// another owner's session answers 404, exactly like a missing one.
fn owned_key(st: &AppState, caller: &Caller, name: &str) -> Result<cellhost_sessions::Key, ApiError> {
    if !st.has_session(&caller.owner, name) {
        return Err(not_found(name));
    }
    Ok(st.registry.key(&caller.owner, name))
}

async fn interrupt(
    State(st): St,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let key = owned_key(&st, &caller, &name)?;
    let out = match st.registry.kernel(&key) {
        Some(k) => serde_json::to_value(k.interrupt().await).unwrap_or(Value::Null),
        None => json!({"delivered": false, "reason": "the session has no live kernel"}),
    };
    Ok(Json(out))
}

async fn restart(
    State(st): St,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let key = owned_key(&st, &caller, &name)?;
    st.registry.dispose(&key).await;
    st.registry.acquire(&key).await?;
    Ok(Json(session_json(&st, &caller.owner, &name)))
}

#[derive(Debug, Deserialize, Default)]
struct VariablesQuery {
    limit: Option<u32>,
}

async fn variables(
    State(st): St,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<VariablesQuery>,
) -> Result<Json<Value>, ApiError> {
    let key = owned_key(&st, &caller, &name)?;
    let Some(k) = st.registry.kernel(&key) else {
        return Ok(Json(json!({"variables": [], "truncated": false, "alive": false})));
    };
    let v = k
        .inspect_variables(q.limit.unwrap_or(100))
        .await
        .map_err(|e| ApiError::from(RegistryError::from(e)))?;
    Ok(Json(serde_json::to_value(v).unwrap_or(Value::Null)))
}

async fn history(
    State(st): St,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    owned_key(&st, &caller, &name)?;
    let Some(j) = st.registry.journal() else {
        return Ok(Json(json!({"cells": [], "journal": false})));
    };
    let cells = j
        .history(&caller.owner, &name)
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(json!({ "cells": cells, "journal": true })))
}

#[derive(Debug, Deserialize, Default)]
struct OutputQuery {
    offset: Option<u64>,
    length: Option<u64>,
}

async fn cell_output(
    State(st): St,
    Extension(caller): Extension<Caller>,
    Path((cell, stream)): Path<(String, String)>,
    Query(q): Query<OutputQuery>,
) -> Result<Json<Value>, ApiError> {
    let path = st.cells.lock().ok().and_then(|c| {
        c.by_id
            .get(&cell)
            .filter(|m| m.owner == caller.owner)
            .and_then(|m| m.spills.get(&stream).cloned())
    });
    let Some(path) = path else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no spilled {stream} for cell {cell:?} of this owner"),
        ));
    };
    let offset = q.offset.unwrap_or(0);
    let length = q.length.unwrap_or(65_536);
    let chunk = tokio::task::spawn_blocking(move || cellhost_kernel::read_spill(&path, offset, length))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError(StatusCode::RANGE_NOT_SATISFIABLE, e.to_string()))?;
    Ok(Json(json!({
        "cell": cell,
        "stream": stream,
        "text": chunk.text,
        "offset": chunk.offset,
        "next_offset": chunk.next_offset,
        "total_bytes": chunk.total_bytes,
    })))
}

/// Serves the API on `listener` until `shutdown` resolves (in-flight
/// requests finish first). The caller shuts the registry down afterwards.
///
/// # Errors
/// I/O errors of the listener.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(listener, router(state), shutdown).await
}

/// Serves any router (the API with other services nested, e.g. MCP) within
/// the default [`ServeLimits`](crate::ServeLimits); see
/// [`crate::listen::serve_with_limits`] to choose them.
///
/// # Errors
/// I/O errors of the listener.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::listen::serve_with_limits(listener, app, crate::ServeLimits::default(), shutdown).await
}

/// Puts the API's bearer-token check (401 without a valid token, 403 for a
/// read-only token on a non-GET route) and body limit in front of another
/// service, e.g. the MCP endpoint nested at `/mcp`.
pub fn protect(state: Arc<AppState>, inner: Router) -> Router {
    inner
        .layer(middleware::from_fn_with_state(state, authenticate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}
