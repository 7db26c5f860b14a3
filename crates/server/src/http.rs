//! The HTTP API: REST + server-sent events over a session [`Registry`].
//!
//! Every handler is a thin adapter over the request layer
//! ([`cellhost_sessions::requests`]): it parses the HTTP request into one
//! typed request, runs it against the registry, and renders the answer or
//! the error envelope (whose code is [`RequestError::code`]).
//!
//! Every `/v1` route needs `Authorization: Bearer TOKEN`; the token's owner
//! keys every session as `http:<token owner>` ([`Surface::owner`]), so one
//! owner never sees another's (a foreign session answers 404, like a
//! missing one) and a session of the API never shares a journal or a
//! generation count with a same-named session of the CLI or MCP. Read-only tokens may call
//! `GET` routes only (403 otherwise). Request bodies are capped at
//! [`MAX_BODY_BYTES`] (413 beyond). `/openapi.json` is public.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use axum::{Extension, Json, Router};
use cellhost_sandbox::profile::SandboxMode;
use cellhost_sessions::cell::{CellResult, LiveEvent};
use cellhost_sessions::requests::{
    CwdScope, ExecuteRequest as RunCell, HistoryRequest, InterruptRequest, KillRequest, ListRequest,
    ReadOutputRequest, RestartRequest, SessionSummary, VariablesRequest,
};
use cellhost_sessions::{Deadline, Origin, Registry, RequestError, SessionSpec, Surface};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use utoipa::{IntoParams, ToSchema};

use crate::auth::{Caller, Scope, Tokens};
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorBody, ErrorCode, OptionalJson};
use crate::routes;
use crate::routes::displays::ImagesMode;

/// Where `cellhost serve` listens unless told otherwise (loopback only).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";

/// Largest request body accepted (4 MiB); larger ones answer 413.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Sessions one owner may hold through the API.
const SESSIONS_PER_OWNER: usize = 64;

/// A session created through the API.
#[derive(Clone)]
pub(crate) struct SessionMeta {
    /// The sandbox mode it was created with (every request on it asks for
    /// this mode).
    pub(crate) sandbox: SandboxMode,
    /// The language it was created with (`python`, `r`), which every
    /// kernel of it runs.
    pub(crate) language: String,
    /// The placement it was created with (`local` or a configured
    /// `[placement.NAME]`), where every kernel of it runs.
    pub(crate) placement: String,
}

/// Shared state of the API.
pub struct AppState {
    registry: Arc<Registry>,
    tokens: Tokens,
    /// Sessions created through the API: (owner, name) → the session; the
    /// owner is `http:<token owner>`.
    sessions: Mutex<BTreeMap<(String, String), SessionMeta>>,
    /// Largest file a `PUT …/files/{path}` accepts, in bytes.
    max_file_bytes: u64,
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
            max_file_bytes: cellhost_sessions::requests::files::DEFAULT_MAX_WRITE,
        })
    }

    /// State over `registry`, accepting `tokens`, with a cap on the files a
    /// `PUT …/files/{path}` writes (bytes; the config's `file_max_mb`).
    pub fn with_max_file_bytes(
        registry: Arc<Registry>,
        tokens: Tokens,
        max_file_bytes: u64,
    ) -> Arc<AppState> {
        Arc::new(AppState {
            registry,
            tokens,
            sessions: Mutex::new(BTreeMap::new()),
            max_file_bytes,
        })
    }

    /// Puts `owner`'s sessions the journal records as paused (by this
    /// server before a restart) into the session table, as they were
    /// created: listed as `paused`, and their next `execute` resumes them.
    pub(crate) async fn adopt_paused(&self, owner: &str) {
        let paused = self.registry.paused_sessions(owner).await;
        let Ok(mut s) = self.sessions.lock() else { return };
        for p in paused {
            let k = (owner.to_string(), p.key.session.clone());
            if s.contains_key(&k) || s.keys().filter(|(o, _)| o == owner).count() >= SESSIONS_PER_OWNER {
                continue;
            }
            s.insert(
                k,
                SessionMeta {
                    sandbox: p.key.sandbox,
                    language: p.key.language.clone(),
                    placement: p.key.placement.clone(),
                },
            );
        }
    }

    /// Largest file a `PUT …/files/{path}` accepts, in bytes.
    pub fn max_file_bytes(&self) -> u64 {
        self.max_file_bytes
    }

    /// The registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Logs a cell whose journal row was not written (the registry keeps
    /// its spills and images in its own index).
    fn remember(&self, x: &cellhost_sessions::requests::Executed) {
        if let Some(e) = &x.journal_error {
            tracing::warn!(
                "cell {} ran but its journal row was not written: {e}",
                x.result.cell_id
            );
        }
    }
}

type St = State<Arc<AppState>>;

/// The registry owner of a caller's sessions: `http:<token owner>`.
pub(crate) fn owner_of(caller: &Caller) -> String {
    Surface::Http.owner(&caller.owner)
}

/// The request layer's view of one of the caller's API sessions.
pub(crate) fn spec(owner: &str, name: &str, meta: &SessionMeta) -> SessionSpec {
    SessionSpec {
        sandbox: Some(meta.sandbox),
        language: Some(meta.language.clone()),
        placement: Some(meta.placement.clone()),
        ..SessionSpec::new(owner, name)
    }
}

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
        (
            Method::POST,
            "/v1/sessions/{name}/fork",
            post(routes::fork::fork_session),
        ),
        (Method::GET, "/v1/sessions/{name}/variables", get(variables)),
        (Method::GET, "/v1/sessions/{name}/history", get(history)),
        (Method::GET, "/v1/cells/{cell}/output/{stream}", get(cell_output)),
        (
            Method::GET,
            "/v1/sessions/{name}/files",
            get(routes::files::list_files),
        ),
        (
            Method::PUT,
            "/v1/sessions/{name}/files/{path}",
            put(routes::files::write_file),
        ),
        (
            Method::GET,
            "/v1/sessions/{name}/files/{path}",
            get(routes::files::read_file),
        ),
        (
            Method::DELETE,
            "/v1/sessions/{name}/files/{path}",
            delete(routes::files::delete_file),
        ),
        (
            Method::POST,
            "/v1/sessions/{name}/packages",
            post(routes::packages::install_packages),
        ),
        (
            Method::POST,
            "/v1/sessions/{name}/pause",
            post(routes::checkpoints::pause_session),
        ),
        (
            Method::POST,
            "/v1/sessions/{name}/checkpoint",
            post(routes::checkpoints::checkpoint_session),
        ),
        (
            Method::GET,
            "/v1/sessions/{name}/displays/{id}",
            get(routes::displays::read_display),
        ),
        (
            Method::POST,
            "/v1/sessions/{name}/cells",
            post(routes::cells::submit_cell),
        ),
        (
            Method::GET,
            "/v1/sessions/{name}/cells",
            get(routes::cells::list_cells),
        ),
        (Method::GET, "/v1/cells/{cell}", get(routes::cells::get_cell)),
        (
            Method::DELETE,
            "/v1/cells/{cell}",
            delete(routes::cells::cancel_cell),
        ),
        (
            Method::GET,
            "/v1/cells/{cell}/events",
            get(routes::cells::cell_events),
        ),
        (
            Method::POST,
            "/v1/notebooks/run",
            post(crate::http_notebook::run_notebook),
        ),
    ]
}

/// The API's router (auth, body limit, every route of [`route_table`]);
/// every error answer is the JSON envelope of [`crate::error`], unknown
/// routes (404 `not_found`) and wrong methods (405 `method_not_allowed`)
/// included.
pub fn router(state: Arc<AppState>) -> Router {
    let mut v1: Router<Arc<AppState>> = Router::new();
    let mut public: Router<Arc<AppState>> = Router::new();
    for (_, path, mr) in route_table() {
        // A file's path spans segments: axum's catch-all parameter.
        let path = path.replace("/files/{path}", "/files/{*path}");
        if path.starts_with("/v1/") {
            v1 = v1.route(&path, mr);
        } else {
            public = public.route(&path, mr);
        }
    }
    let v1 = v1.layer(middleware::from_fn_with_state(state.clone(), authenticate));
    public
        .merge(v1)
        .fallback(crate::error::route_not_found)
        .method_not_allowed_fallback(crate::error::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(crate::error::envelope_errors))
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
        return ApiError::new(ErrorCode::Unauthorized, msg).into_response();
    };
    if caller.scope == Scope::ReadOnly && req.method() != Method::GET {
        return ApiError::new(
            ErrorCode::Forbidden,
            "this token is read-only: it may call GET routes only",
        )
        .into_response();
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// The OpenAPI 3.1 document of this API (no authentication).
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "meta",
    security(()),
    responses((status = 200, description = "the OpenAPI document", body = Object)))]
async fn openapi_doc() -> Json<Value> {
    Json(crate::openapi::document())
}

/// A session name: 1-64 characters of `A-Z a-z 0-9 - _ .`.
pub const NAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,64}$";

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "a session name is 1-64 characters of A-Z a-z 0-9 - _ .",
        )
        .with("field", "name"))
    }
}

/// Body of `POST /v1/sessions`.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// The session's name (default: a random `s-…` name).
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$", min_length = 1, max_length = 64)]
    pub name: Option<String>,
    /// The sandbox mode of the session's kernels (default: the server's,
    /// its floor; a weaker mode is refused with `sandbox_below_floor`).
    pub sandbox: Option<SandboxMode>,
    /// The language of the session's kernels: `python` (default) or `r`;
    /// another is refused with `bad_request`. The session keeps it.
    pub language: Option<String>,
    /// The session's network policy (default: the server's, `off` unless
    /// configured); a list needs a sandbox (`bad_request` with mode `off`).
    #[schema(value_type = Option<crate::http_network::NetworkField>)]
    pub network: Option<cellhost_sessions::egress::NetworkPolicy>,
    /// The session's limits (each optional; absent: the server's for the
    /// session's name). A value over the server's maximum is refused with
    /// 422 `limit_over_max` naming the `field` and the `max`.
    pub limits: Option<cellhost_sessions::SessionLimits>,
    /// Where the session's kernels run: `local` or the name of a
    /// `[placement.NAME]` table of the server's config (default: the
    /// config's `placement`); an unknown name is refused with
    /// `bad_request`. The session keeps it.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$", min_length = 1, max_length = 64)]
    pub placement: Option<String>,
    /// The session's checkpoints: `off`, `namespace` (the picklable part
    /// of its namespace after each successful cell; a lost kernel is
    /// restored from it before the next cell, whose result says
    /// `restored`) or `process` (refused with 501
    /// `checkpoint_unavailable` where CRIU cannot run). Default: the
    /// server's for the session's name.
    pub checkpoint: Option<cellhost_sessions::CheckpointMode>,
    /// What the session gets back after an unexpected death of its kernel
    /// (a crash, an OOM kill, an eviction, a restart of the server):
    /// `checkpoint` (its latest checkpoint, when it keeps them), `replay`
    /// (the checkpoint if any, then the lost kernel's journaled `ok` cells
    /// after it, run again silently, stopping at the first that fails;
    /// the next result's `restored.replay` names them) or `none`. Default:
    /// the server's for the session's name.
    pub restore: Option<cellhost_sessions::RestoreMode>,
}

/// A session of the caller.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionInfo {
    /// The name.
    pub name: String,
    /// A kernel is live (false after its kernel died or was reaped; the
    /// next `execute` starts a new generation).
    pub alive: bool,
    /// `live` (a kernel runs), `paused` (its kernel was checkpointed and
    /// stopped by a pause, on this server or one before a restart; the
    /// next `execute` resumes it) or `stopped` (no kernel; the next
    /// `execute` starts one).
    pub state: String,
    /// When a paused session was paused, milliseconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_ms: Option<i64>,
    /// The checkpoint a paused session resumes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<cellhost_sessions::CheckpointSummary>,
    /// The sandbox mode of the session's kernels.
    pub sandbox: SandboxMode,
    /// The language of the session's kernels (`python`, `r`), kept from
    /// its creation.
    pub language: String,
    /// A cell is running or queued (live kernels only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy: Option<bool>,
    /// The session's kernel generation (1 for its first kernel).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The worker's host pid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The interpreter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// The limits the session's kernel runs under (live kernels only):
    /// `memory_mb`, `pids`, `cpu`, `disk_mb`, `cell_timeout_s`, each absent
    /// when not limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<cellhost_sessions::SessionLimits>,
    /// Where the session's kernels run, for a session of a remote
    /// placement (absent: on this host): the placement's `name` and
    /// `kind`, and while a kernel lives the `node` and the scheduler's
    /// `job` (Slurm job id, Pod name, ssh destination and pid) — empty
    /// when none lives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<cellhost_sessions::cell::KernelPlacement>,
}

/// The caller's sessions.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    /// Oldest name first (by name).
    pub sessions: Vec<SessionInfo>,
}

/// A session of the table, rendered with its live kernel's summary (from
/// [`ListRequest`]) if one lives.
fn session_info(
    placements: &cellhost_sessions::placement::Placements,
    name: &str,
    meta: &SessionMeta,
    live: Option<&SessionSummary>,
) -> SessionInfo {
    let sandbox = meta.sandbox;
    let language = meta.language.clone();
    let placement = live.and_then(|l| l.placement.clone()).or_else(|| {
        (meta.placement != cellhost_sessions::placement::LOCAL).then(|| {
            cellhost_sessions::cell::KernelPlacement {
                name: meta.placement.clone(),
                kind: placements.kind(&meta.placement),
                node: String::new(),
                job: String::new(),
                start: None,
            }
        })
    });
    match live {
        Some(l) if l.state == "paused" => SessionInfo {
            name: name.to_string(),
            alive: false,
            state: "paused".into(),
            paused_ms: l.paused_ms,
            checkpoint: l.checkpoint.clone(),
            sandbox,
            language,
            busy: None,
            generation: Some(l.generation),
            pid: None,
            python: Some(l.python.display().to_string()),
            limits: None,
            placement,
        },
        Some(l) => SessionInfo {
            name: name.to_string(),
            alive: true,
            state: "live".into(),
            paused_ms: None,
            checkpoint: None,
            sandbox,
            language,
            busy: Some(l.busy),
            generation: Some(l.generation),
            pid: Some(l.pid),
            python: Some(l.python.display().to_string()),
            limits: Some(l.limits),
            placement,
        },
        None => SessionInfo {
            name: name.to_string(),
            alive: false,
            state: "stopped".into(),
            paused_ms: None,
            checkpoint: None,
            sandbox,
            language,
            busy: None,
            generation: None,
            pid: None,
            python: None,
            limits: None,
            placement,
        },
    }
}

/// The live summary of `name` in `sandbox` mode, if its kernel lives.
fn live_summary(st: &AppState, owner: &str, name: &str, sandbox: SandboxMode) -> Option<SessionSummary> {
    ListRequest {
        owner: owner.to_string(),
    }
    .execute(&st.registry)
    .into_iter()
    .find(|l| l.name == name && l.sandbox == sandbox)
}

/// Create a session and start its kernel.
#[utoipa::path(post, path = "/v1/sessions", operation_id = "createSession", tag = "sessions",
    request_body(content = Option<CreateSession>, content_type = "application/json",
        description = "optional: no body gives a random name and the server's sandbox mode"),
    responses(
        (status = 201, description = "created, its kernel started", body = SessionInfo),
        (status = 400, description = "`bad_request`: a network allowlist with sandbox mode `off`, a limit out of its range, or an unknown placement", body = ErrorBody),
        (status = 403, description = "`sandbox_below_floor`: a sandbox mode below the server's", body = ErrorBody),
        (status = 409, description = "`session_exists`", body = ErrorBody),
        (status = 422, description = "`limit_over_max`: a limit over the server's maximum (`field`, `value`, `max`), or `invalid_request`: a malformed body (a bad network rule, say)", body = ErrorBody),
        (status = 429, description = "`too_many_sessions` (64 an owner)", body = ErrorBody),
        (status = 500, description = "`placement_config`: the placement's table or the listener for node agents is not usable", body = ErrorBody),
        (status = 502, description = "`kernel_failed`: the kernel could not start; `placement_rejected`, `dial_back_failed`, `admission_refused`, `remote_failed`: a remote kernel could not be placed or admitted (the scheduler's message)", body = ErrorBody),
        (status = 503, description = "`sandbox_unavailable`, `registry_full`, `shut_down`, `placement_unschedulable` or `placement_unavailable`", body = ErrorBody),
        (status = 504, description = "`dial_back_timeout`: the node agent did not dial back in time", body = ErrorBody),
    ))]
async fn create_session(
    State(st): St,
    Extension(caller): Extension<Caller>,
    OptionalJson(body): OptionalJson<CreateSession>,
) -> Result<Response, ApiError> {
    let name = match body.name {
        Some(n) => n,
        None => format!("s-{}", &crate::auth::new_token()[..12]),
    };
    check_name(&name)?;
    let owner = owner_of(&caller);
    // Validated once by the request layer: the mode never below the floor.
    let key = SessionSpec {
        sandbox: body.sandbox,
        language: body.language.clone(),
        placement: body.placement.clone(),
        checkpoint: body.checkpoint,
        restore: body.restore,
        ..SessionSpec::new(owner.as_str(), name.as_str())
    }
    .key(&st.registry)?;
    let meta = SessionMeta {
        sandbox: key.sandbox,
        language: key.language.clone(),
        placement: key.placement.clone(),
    };
    let sandbox = key.sandbox;
    {
        let mut s = st
            .sessions
            .lock()
            .map_err(|_| ApiError::new(ErrorCode::Internal, "the session table is poisoned"))?;
        let k = (owner.clone(), name.clone());
        if s.contains_key(&k) {
            return Err(
                ApiError::new(ErrorCode::SessionExists, format!("session {name:?} exists"))
                    .with("session", name.as_str()),
            );
        }
        if s.keys().filter(|(o, _)| *o == owner).count() >= SESSIONS_PER_OWNER {
            return Err(ApiError::new(
                ErrorCode::TooManySessions,
                format!("at most {SESSIONS_PER_OWNER} sessions per owner; delete one first"),
            )
            .with("limit", SESSIONS_PER_OWNER as u64));
        }
        s.insert(k, meta.clone());
    }
    // Created again after a restart of the server (the session was not
    // deleted), a session keeps the network policy it had unless the body
    // gives one; its limits likewise (the registry adopts them when the
    // body gives none).
    let network = match body.network.clone() {
        Some(n) => Some(n),
        None => st.registry.journaled_network(&key).await,
    };
    if let Err(e) = crate::http_network::apply(&st.registry, &key, network.as_ref()) {
        if let Ok(mut s) = st.sessions.lock() {
            s.remove(&(owner.clone(), name.clone()));
        }
        return Err(e);
    }
    // A new session has no kernel yet: a restart starts its first one. A
    // paused one (of this server or an earlier one) keeps its checkpoint:
    // its next execute resumes it.
    let paused = st.registry.paused_key(&owner, &name).await.is_some();
    // One whose kernel was lost with the previous server (its checkpoint,
    // or its journaled cells with `restore: replay`) gets its state back
    // before its next cell likewise, instead of a fresh kernel now.
    let keep = paused || st.registry.recoverable(&key).await;
    let started = if keep {
        Ok(())
    } else {
        RestartRequest {
            session: with_limits(spec(&owner, &name, &meta), body.limits),
        }
        .execute(&st.registry)
        .await
        .map(|_| ())
    };
    if let Err(e) = started {
        if let Ok(mut s) = st.sessions.lock() {
            s.remove(&(owner.clone(), name.clone()));
        }
        return Err(e.into());
    }
    let live = live_summary(&st, &owner, &name, sandbox);
    Ok((
        StatusCode::CREATED,
        Json(session_info(
            &st.registry.config().placements,
            &name,
            &meta,
            live.as_ref(),
        )),
    )
        .into_response())
}

/// A session's spec with the limits a create request asked for.
fn with_limits(mut spec: SessionSpec, limits: Option<cellhost_sessions::SessionLimits>) -> SessionSpec {
    spec.limits = limits.unwrap_or_default();
    spec
}

/// The caller's sessions.
#[utoipa::path(get, path = "/v1/sessions", operation_id = "listSessions", tag = "sessions",
    responses((status = 200, description = "the caller's sessions", body = SessionList)))]
async fn list_sessions(State(st): St, Extension(caller): Extension<Caller>) -> Json<SessionList> {
    let owner = owner_of(&caller);
    st.adopt_paused(&owner).await;
    let table: Vec<(String, SessionMeta)> = st
        .sessions
        .lock()
        .map(|s| {
            s.iter()
                .filter(|((o, _), _)| *o == owner)
                .map(|((_, n), m)| (n.clone(), m.clone()))
                .collect()
        })
        .unwrap_or_default();
    let live = ListRequest { owner }.execute_with_paused(&st.registry).await;
    Json(SessionList {
        sessions: table
            .iter()
            .map(|(n, meta)| {
                let l = live.iter().find(|l| &l.name == n && l.sandbox == meta.sandbox);
                session_info(&st.registry.config().placements, n, meta, l)
            })
            .collect(),
    })
}

/// A session named in the path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    /// The session's name.
    #[param(pattern = "^[A-Za-z0-9._-]{1,64}$", min_length = 1, max_length = 64)]
    pub name: String,
}

/// Kill a session's kernel and forget the session.
#[utoipa::path(delete, path = "/v1/sessions/{name}", operation_id = "deleteSession", tag = "sessions",
    params(SessionPath),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
    ))]
async fn delete_session(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    let owner = owner_of(&caller);
    let removed = st
        .sessions
        .lock()
        .map(|mut s| s.remove(&(owner.clone(), name.clone())))
        .ok()
        .flatten();
    if removed.is_none() {
        return Err(not_found(&name));
    }
    // A session whose kernel died has nothing left to kill: deleted all
    // the same.
    match (KillRequest {
        owner,
        session: name,
        cwd: CwdScope::Any,
    })
    .execute(&st.registry)
    .await
    {
        Ok(_) | Err(RequestError::SessionNotFound { .. }) => Ok(StatusCode::NO_CONTENT),
        Err(e) => Err(e.into()),
    }
}

/// Longest cell deadline a request may ask for, in seconds (7 days).
pub const MAX_TIMEOUT_S: f64 = 604_800.0;

/// Body of `POST /v1/sessions/{name}/execute`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// Python source of one cell; the value of its last expression is the
    /// result.
    pub code: String,
    /// The cell's deadline in seconds, counted from when it starts running
    /// (0 = none; absent: the server's `cell_timeout_s`, 300 by default).
    #[schema(minimum = 0, maximum = 604800)]
    pub timeout_s: Option<f64>,
    /// Wait behind a running cell of the session instead of being refused
    /// with 409 `session_busy` (default false).
    #[serde(default)]
    pub queue: bool,
    /// How images come back: `url` (default: each image entry also
    /// carries the URL of `GET /v1/sessions/{name}/displays/{id}`),
    /// `inline` (base64 text in the bundle) or `none` (left out).
    #[serde(default)]
    pub images: ImagesMode,
}

/// Query of `execute`.
#[derive(Debug, Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExecuteQuery {
    /// Answer with server-sent events (also with `Accept: text/event-stream`).
    pub stream: Option<bool>,
}

fn wants_stream(q: &ExecuteQuery, headers: &HeaderMap) -> bool {
    q.stream.unwrap_or_else(|| {
        headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/event-stream"))
    })
}

/// The deadline of `timeout_s`: the request layer's [`Deadline`] (absent:
/// the server's `cell_timeout_s`; 0: none), within the documented range.
pub(crate) fn deadline_of(t: Option<f64>) -> Result<Deadline, ApiError> {
    let field = |e: ApiError| e.with("field", "timeout_s");
    if let Some(s) = t
        && (!s.is_finite() || !(0.0..=MAX_TIMEOUT_S).contains(&s))
    {
        return Err(field(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("timeout_s must be a number of seconds from 0 to {MAX_TIMEOUT_S}, got {s}"),
        )));
    }
    Deadline::from_secs(t).map_err(|e| field(ApiError::new(ErrorCode::InvalidRequest, e.to_string())))
}

/// Run a cell.
///
/// Answers the `CellResult` as JSON, or with `?stream=true` (or `Accept:
/// text/event-stream`) server-sent events: `stream` events
/// (`{"name": "stdout"|"stderr", "text"}`), `display` events (a display
/// bundle), then one `result` event (the `CellResult`) or one `error`
/// event (the error envelope).
#[utoipa::path(post, path = "/v1/sessions/{name}/execute", operation_id = "execute", tag = "cells",
    params(SessionPath, ExecuteQuery),
    request_body(content = ExecuteRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "the cell's result; or its events", content(
            (CellResult = "application/json"),
            (ExecuteEvent = "text/event-stream"),
        )),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
        (status = 409, description = "`session_busy`: a cell is running and `queue` is not true", body = ErrorBody),
        (status = 502, description = "`kernel_failed`", body = ErrorBody),
        (status = 503, description = "`sandbox_unavailable`, `registry_full` or `shut_down`", body = ErrorBody),
    ))]
async fn execute(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
    ApiQuery(q): ApiQuery<ExecuteQuery>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ExecuteRequest>,
) -> Result<Response, ApiError> {
    if owned(&st, &caller, &name).is_err() {
        // A session paused before a restart of the server resumes without
        // being created again.
        st.adopt_paused(&owner_of(&caller)).await;
    }
    let (owner, meta) = owned(&st, &caller, &name)?;
    let mut req = RunCell::new(spec(&owner, &name, &meta), body.code, Origin::new("http"));
    req.deadline = deadline_of(body.timeout_s)?;
    req.queue = body.queue;
    let images = body.images;
    if !wants_stream(&q, &headers) {
        // The cell runs in its own task: a client that disconnects does not
        // cancel its bookkeeping (journal row, spill pages).
        let st2 = st.clone();
        let r = tokio::spawn(async move {
            let r = req.execute(&st2.registry).await;
            if let Ok(x) = &r {
                st2.remember(x);
            }
            r
        })
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("the cell's task failed: {e}")))??;
        let mut result = r.result;
        routes::displays::render_images(&mut result, &st, &owner, &name, images);
        return Ok(Json(result).into_response());
    }
    let (live_tx, mut live_rx) = mpsc::unbounded_channel();
    req.live = Some(live_tx);
    let (tx, rx) = mpsc::channel::<Event>(256);
    let st2 = st.clone();
    tokio::spawn(async move {
        let run = req.execute(&st2.registry);
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
            Ok(mut x) => {
                st2.remember(&x);
                routes::displays::render_images(&mut x.result, &st2, &owner, &name, images);
                Event::default()
                    .event("result")
                    .json_data(&x.result)
                    .unwrap_or_else(|_| Event::default().event("error").data("encode"))
            }
            Err(e) => Event::default()
                .event("error")
                .json_data(ErrorBody {
                    error: ApiError::from(e).0,
                })
                .unwrap_or_else(|_| Event::default().event("error").data("error")),
        };
        let _ = tx.send(ev).await;
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<Event, Infallible>(e), rx))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

/// The name of a server-sent event of a streamed `execute`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecuteEventName {
    /// Output that became final: `{"name": "stdout"|"stderr", "text"}`.
    Stream,
    /// A display: a display bundle (`data`, `metadata`).
    Display,
    /// The last event of a cell that ran: the `CellResult`.
    Result,
    /// The last event of a cell that could not run: the error envelope.
    Error,
}

/// One server-sent event of a streamed `execute` (the schema describes
/// each event of the stream).
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecuteEvent {
    /// What the event carries.
    pub event: ExecuteEventName,
    /// JSON text of the event's value.
    pub data: String,
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

fn not_found(name: &str) -> ApiError {
    ApiError::new(ErrorCode::SessionNotFound, format!("no session named {name:?}")).with("session", name)
}

/// The owner and sandbox mode of `name` when it is one of the caller's
/// sessions; another owner's session answers 404, exactly like a missing
/// one.
pub(crate) fn owned(st: &AppState, caller: &Caller, name: &str) -> Result<(String, SessionMeta), ApiError> {
    check_name(name)?;
    let owner = owner_of(caller);
    let meta = st
        .sessions
        .lock()
        .ok()
        .and_then(|s| s.get(&(owner.clone(), name.to_string())).cloned())
        .ok_or_else(|| not_found(name))?;
    Ok((owner, meta))
}

/// Takes `name` for a new session of `owner` (a fork) before its kernel
/// starts, as `POST /v1/sessions` does.
///
/// # Errors
/// `invalid_request` (the name), `session_exists`, `too_many_sessions`.
pub(crate) fn reserve_session(
    st: &AppState,
    owner: &str,
    name: &str,
    meta: &SessionMeta,
) -> Result<(), ApiError> {
    check_name(name)?;
    let mut s = st
        .sessions
        .lock()
        .map_err(|_| ApiError::new(ErrorCode::Internal, "the session table is poisoned"))?;
    let k = (owner.to_string(), name.to_string());
    if s.contains_key(&k) {
        return Err(
            ApiError::new(ErrorCode::SessionExists, format!("session {name:?} exists")).with("session", name),
        );
    }
    if s.keys().filter(|(o, _)| o == owner).count() >= SESSIONS_PER_OWNER {
        return Err(ApiError::new(
            ErrorCode::TooManySessions,
            format!("at most {SESSIONS_PER_OWNER} sessions per owner; delete one first"),
        )
        .with("limit", SESSIONS_PER_OWNER as u64));
    }
    s.insert(k, meta.clone());
    Ok(())
}

/// Gives back a name [`reserve_session`] took (the fork failed).
pub(crate) fn release_session(st: &AppState, owner: &str, name: &str) {
    if let Ok(mut s) = st.sessions.lock() {
        s.remove(&(owner.to_string(), name.to_string()));
    }
}

/// What an interrupt did.
#[derive(Debug, Serialize, ToSchema)]
pub struct InterruptAnswer {
    /// SIGINT reached the worker's main thread.
    pub delivered: bool,
    /// `pid/tid` the signal was sent to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The cell the interrupt applies to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell: Option<String>,
    /// Why it was not delivered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Submitted cells (`POST …/cells`) that were queued in the session
    /// and were dropped by this interrupt (they will not run).
    #[serde(default)]
    pub dropped: Vec<String>,
}

/// Interrupt the running cell (variables kept when the code can be stopped).
#[utoipa::path(post, path = "/v1/sessions/{name}/interrupt", operation_id = "interrupt", tag = "cells",
    params(SessionPath),
    responses(
        (status = 200, description = "what the interrupt did", body = InterruptAnswer),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
    ))]
async fn interrupt(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
) -> Result<Json<InterruptAnswer>, ApiError> {
    let (owner, _) = owned(&st, &caller, &name)?;
    let out = match (InterruptRequest {
        owner,
        session: name,
        cwd: CwdScope::Any,
    })
    .execute_dropping_queued(&st.registry)
    .await
    {
        Ok(i) => InterruptAnswer {
            delivered: i.outcome.delivered,
            target: i.outcome.target,
            cell: i.outcome.cell,
            reason: i.outcome.reason,
            dropped: i.dropped,
        },
        Err(RequestError::SessionNotFound { .. }) => InterruptAnswer {
            delivered: false,
            target: None,
            cell: None,
            reason: Some("the session has no live kernel".into()),
            dropped: Vec::new(),
        },
        Err(e) => return Err(e.into()),
    };
    Ok(Json(out))
}

/// Kill the kernel and start a new one (all state is lost).
#[utoipa::path(post, path = "/v1/sessions/{name}/restart", operation_id = "restart", tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "the new kernel", body = SessionInfo),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
        (status = 502, description = "`kernel_failed`", body = ErrorBody),
        (status = 503, description = "`sandbox_unavailable`, `registry_full` or `shut_down`", body = ErrorBody),
    ))]
async fn restart(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
) -> Result<Json<SessionInfo>, ApiError> {
    let (owner, meta) = owned(&st, &caller, &name)?;
    let sandbox = meta.sandbox;
    RestartRequest {
        session: spec(&owner, &name, &meta),
    }
    .execute(&st.registry)
    .await?;
    let live = live_summary(&st, &owner, &name, sandbox);
    Ok(Json(session_info(
        &st.registry.config().placements,
        &name,
        &meta,
        live.as_ref(),
    )))
}

/// Query of `variables`.
#[derive(Debug, Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct VariablesQuery {
    /// Variables at most (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// A session's namespace.
#[derive(Debug, Serialize, ToSchema)]
pub struct VariablesAnswer {
    /// One object per variable: `name`, `type`, and where known `len`,
    /// `shape`, `dtype`, `size_bytes`, `preview`.
    #[schema(value_type = Vec<Object>)]
    pub variables: Vec<Value>,
    /// More variables existed than the limit.
    pub truncated: bool,
    /// The session has a live kernel (no variables otherwise).
    pub alive: bool,
}

/// The session's user namespace (idle kernels only).
#[utoipa::path(get, path = "/v1/sessions/{name}/variables", operation_id = "variables", tag = "sessions",
    params(SessionPath, VariablesQuery),
    responses(
        (status = 200, description = "the variables", body = VariablesAnswer),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
        (status = 409, description = "`session_busy`: a cell is running", body = ErrorBody),
        (status = 502, description = "`kernel_failed`", body = ErrorBody),
    ))]
async fn variables(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
    ApiQuery(q): ApiQuery<VariablesQuery>,
) -> Result<Json<VariablesAnswer>, ApiError> {
    let (owner, meta) = owned(&st, &caller, &name)?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("limit must be 1 to 500, got {limit}"),
        )
        .with("field", "limit"));
    }
    let asked = VariablesRequest {
        session: spec(&owner, &name, &meta),
        limit,
    };
    match asked.execute(&st.registry).await {
        Ok(v) => Ok(Json(VariablesAnswer {
            variables: v.variables,
            truncated: v.truncated,
            alive: true,
        })),
        Err(RequestError::SessionNotFound { .. }) => Ok(Json(VariablesAnswer {
            variables: Vec::new(),
            truncated: false,
            alive: false,
        })),
        Err(e) => Err(e.into()),
    }
}

/// A session's journaled cells.
#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryAnswer {
    /// Oldest first: `id`, `generation`, `execution_count`, `code`,
    /// `status`, times, output heads and tails, …
    #[schema(value_type = Vec<Object>)]
    pub cells: Vec<Value>,
    /// The session's kernels, oldest first: `generation`, `pid`,
    /// `started_ms`, `ended_ms`, `end_reason`, and for a forked kernel
    /// `parent_session`, `parent_generation` and `fork_point` (the
    /// parent's `execution_count`).
    #[schema(value_type = Vec<Object>)]
    pub kernels: Vec<Value>,
    /// The server keeps a journal (no cells otherwise).
    pub journal: bool,
}

/// The session's journaled cells, oldest first.
#[utoipa::path(get, path = "/v1/sessions/{name}/history", operation_id = "history", tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "the cells", body = HistoryAnswer),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
    ))]
async fn history(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(SessionPath { name }): ApiPath<SessionPath>,
) -> Result<Json<HistoryAnswer>, ApiError> {
    let (owner, _) = owned(&st, &caller, &name)?;
    if st.registry.journal().is_none() {
        return Ok(Json(HistoryAnswer {
            cells: Vec::new(),
            kernels: Vec::new(),
            journal: false,
        }));
    }
    let (cells, kernels) = match (HistoryRequest { owner, session: name })
        .execute(&st.registry)
        .await
    {
        Ok(h) => (
            h.cells
                .iter()
                .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
                .collect(),
            h.kernels
                .iter()
                .map(|k| serde_json::to_value(k).unwrap_or(Value::Null))
                .collect(),
        ),
        // A session of the table with nothing journaled yet.
        Err(RequestError::SessionNotFound { .. }) => (Vec::new(), Vec::new()),
        Err(e) => return Err(e.into()),
    };
    Ok(Json(HistoryAnswer {
        cells,
        kernels,
        journal: true,
    }))
}

/// A stream of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamName {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl StreamName {
    fn as_str(self) -> &'static str {
        match self {
            StreamName::Stdout => "stdout",
            StreamName::Stderr => "stderr",
        }
    }
}

/// A cell's stream named in the path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct OutputPath {
    /// The cell id of the result (`cell_id`).
    pub cell: String,
    /// `stdout` or `stderr`.
    pub stream: StreamName,
}

/// Largest `length` of an output page, in bytes (16 MiB, the spill
/// reader's own cap).
pub const OUTPUT_MAX_LENGTH: u64 = 16 * 1024 * 1024;

/// Default `length` of an output page, in bytes.
pub const OUTPUT_DEFAULT_LENGTH: u64 = 65_536;

/// Query of `cellOutput`.
#[derive(Debug, Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// Byte offset to start at (default 0; moved forward to a character
    /// boundary).
    #[param(minimum = 0)]
    pub offset: Option<u64>,
    /// Bytes to read (default 65536, at most 16 MiB).
    #[param(minimum = 1, maximum = 16777216)]
    pub length: Option<u64>,
}

/// A page of a cell's spilled output.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutputChunk {
    /// The cell id.
    pub cell: String,
    /// The stream.
    pub stream: StreamName,
    /// The text, cut to whole characters.
    pub text: String,
    /// Byte offset of `text`.
    pub offset: u64,
    /// Offset of the next page; null at the end.
    pub next_offset: Option<u64>,
    /// Size of the whole stream in bytes.
    pub total_bytes: u64,
}

/// Page through a cell's spilled output by byte offset (the caller's own cells only).
#[utoipa::path(get, path = "/v1/cells/{cell}/output/{stream}", operation_id = "cellOutput", tag = "cells",
    params(OutputPath, OutputQuery),
    responses(
        (status = 200, description = "a page, cut to whole characters", body = OutputChunk),
        (status = 404, description = "`output_not_found`: no spilled stream of that cell for this owner", body = ErrorBody),
        (status = 416, description = "`range_not_satisfiable`: offset past the end", body = ErrorBody),
    ))]
async fn cell_output(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(OutputPath { cell, stream }): ApiPath<OutputPath>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> Result<Json<OutputChunk>, ApiError> {
    let offset = q.offset.unwrap_or(0);
    let length = q.length.unwrap_or(OUTPUT_DEFAULT_LENGTH);
    if !(1..=OUTPUT_MAX_LENGTH).contains(&length) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("length must be 1 to {OUTPUT_MAX_LENGTH}, got {length}"),
        )
        .with("field", "length"));
    }
    let owner = owner_of(&caller);
    let path = st.registry.spill_of(&owner, &cell, stream.as_str());
    let Some(path) = path else {
        return Err(ApiError::new(
            ErrorCode::OutputNotFound,
            format!("no spilled {} for cell {cell:?} of this owner", stream.as_str()),
        )
        .with("cell", cell.as_str())
        .with("stream", stream.as_str()));
    };
    let chunk = tokio::task::spawn_blocking(move || {
        let total = std::fs::metadata(&path)
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("the spill file is unreadable: {e}")))?
            .len();
        if offset > total {
            return Err(ApiError::new(
                ErrorCode::RangeNotSatisfiable,
                format!("offset {offset} is past the end of the output ({total} bytes)"),
            )
            .with("offset", offset)
            .with("total_bytes", total));
        }
        ReadOutputRequest { path, offset, length }
            .execute()
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::Internal, format!("the read failed: {e}")))??;
    Ok(Json(OutputChunk {
        cell,
        stream,
        text: chunk.text,
        offset: chunk.offset,
        next_offset: chunk.next_offset,
        total_bytes: chunk.total_bytes,
    }))
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
