//! The MCP server of cellhost, built on the official Rust SDK (`rmcp`).
//!
//! Tools: `execute_code`, `interrupt`, `restart`, `fork_session`, `list_variables`,
//! `write_file`, `read_file`, `list_files`, `submit_code`, `get_cell`, `cancel_cell`,
//! `read_output`, `list_sessions`, `run_notebook` (a whole notebook, see
//! `notebook.rs`). One MCP connection (stdio) or one MCP
//! session (streamable HTTP) is one *owner* of the [`Registry`],
//! `mcp:<connection id>` ([`new_owner_id`]): it sees only its own sessions,
//! and its kernels are disposed when it ends.
//!
//! Every tool is a thin adapter over the request layer
//! ([`cellhost_sessions::requests`]): parameters → one typed request →
//! the registry → a rendered result, and every tool error carries the
//! request layer's code ([`RequestError::code`]), the same as HTTP's and
//! the daemon's.
//!
//! - [`serve_stdio`] serves one connection on standard input/output
//!   (`cellhost mcp`).
//! - [`http_router`] is the streamable HTTP endpoint at `/mcp`, an axum
//!   router to merge behind the HTTP API's authentication (`cellhost
//!   serve`); every MCP session is bound to the caller that opened it.
//!
//! Results are text for a language model (status first), the
//! [`cellhost_sessions::cell::CellResult`] as `structuredContent`, and every figure
//! as `image` content. A running `execute_code` streams its live output as
//! progress notifications (when the client sent a progress token), and an
//! MCP cancellation of it interrupts the cell.
#![forbid(unsafe_code)]

mod cells;
mod files;
pub mod fit;
mod notebook;
mod packages;
pub mod render;
mod session_settings;

pub use session_settings::{LimitsParam, NetworkParam};

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::IntoResponse;
use cellhost_sessions::cell::LiveEvent;
use cellhost_sessions::requests::{
    CwdScope, ExecuteRequest, ForkRequest, ForkThreads, InterruptRequest, ListRequest, ReadOutputRequest,
    RestartRequest, VariablesRequest,
};
use cellhost_sessions::{Deadline, Origin, Registry, RequestError, SessionSpec, Surface};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, ProtocolVersion,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::json;

/// Errors of the MCP server.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The client's `initialize` handshake failed.
    #[error("MCP handshake failed: {0}")]
    Initialize(String),
    /// The server task ended abnormally.
    #[error("MCP server task failed: {0}")]
    Task(String),
}

/// Default session name when a tool call gives none.
pub const DEFAULT_SESSION: &str = "default";

/// Default and largest `length` of one `read_output` page.
const READ_DEFAULT: u64 = 65_536;
const READ_MAX: u64 = 1024 * 1024;

/// How often buffered live output goes out as a progress notification.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// A running `execute_code` with a progress token and no new output sends
/// a progress notification this often as a keepalive, so a client with a
/// fixed request timeout that resets on progress does not give up.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(10);
/// Largest message of one progress notification (the tail is kept).
const PROGRESS_MAX_BYTES: usize = 16 * 1024;

const INSTRUCTIONS: &str = "cellhost runs Python code in persistent kernels. \
Call execute_code with a cell of Python: variables, imports and open files persist \
between calls in the same session (default session \"default\"; pass `session` to keep \
several independent namespaces). The last expression's value is returned; matplotlib \
figures come back as images. Output is cut to 50,000 bytes of stdout and 10,000 of stderr \
(40% head, 60% tail); the full output can be paged with read_output. A cell stops at its \
deadline (timeout_s, default 300 s): it is interrupted and, when the code can be stopped, \
the variables survive. Use interrupt to stop a running cell, restart for a fresh kernel, \
list_variables to see what a session holds, list_sessions to see your sessions, \
run_notebook to run a whole .ipynb or percent-format script with papermill-style parameters.";

/// Size limits of the MCP tools (the config's `mcp_file_max_kb` and
/// `mcp_image_max_kb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McpLimits {
    /// Largest file `read_file` returns and `write_file` takes, in bytes.
    pub file_max_bytes: u64,
    /// Images larger than this many bytes are sent as a resource link, not
    /// inline base64.
    pub image_max_bytes: u64,
}

impl Default for McpLimits {
    /// 1 MiB files, 256 KiB images.
    fn default() -> Self {
        McpLimits {
            file_max_bytes: 1024 * 1024,
            image_max_bytes: render::DEFAULT_IMAGE_BUDGET,
        }
    }
}

struct Inner {
    registry: Arc<Registry>,
    /// The registry owner of this connection's sessions: its own
    /// (`mcp:<id>`), or over HTTP with [`SessionScope::Caller`] the
    /// caller's, set when the session is bound to it.
    owner: Mutex<String>,
    scope: SessionScope,
    limits: McpLimits,
    /// One `execute_code` at a time per session: a cancellation then always
    /// names the cell that is running (a queued call just stops waiting).
    turns: Mutex<HashMap<String, Arc<Turn>>>,
    /// Over HTTP: the authenticated caller the MCP session is bound to.
    caller: Mutex<Option<String>>,
}

/// The turn of one session's `execute_code` calls.
#[derive(Default)]
struct Turn {
    /// Held by the call whose cell runs.
    lock: Arc<tokio::sync::Mutex<()>>,
    /// The holder's call was cancelled and its cell is being stopped: the
    /// next call waits for it instead of being refused as busy.
    stopping: std::sync::atomic::AtomicBool,
    /// The cancellation token of the call holding the turn. rmcp cancels it
    /// in its serve loop when the `notifications/cancelled` arrives, before
    /// it reads the client's next message, so a call that follows a
    /// cancellation sees it here even when the cancelled handler has not
    /// run since (`stopping` is set only once it does).
    holder: Mutex<Option<tokio_util::sync::CancellationToken>>,
}

impl Turn {
    /// True when the call holding the turn was cancelled: its cell is
    /// being (or about to be) interrupted, so the next call waits for it.
    fn holder_cancelled(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
            || self
                .holder
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|ct| ct.is_cancelled())
    }
}

/// Who sent an HTTP request, as the HTTP layer's authentication established
/// it (e.g. the owner of a bearer token). Insert it into the request's
/// extensions before [`http_router`]: an MCP session is bound to the caller
/// of the `initialize` that created it, and every request of any other
/// caller naming it answers 404, so knowing a session id is not enough to
/// use, watch or end it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCaller(pub String);

/// Whose sessions an MCP session of the HTTP endpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionScope {
    /// Its own: the kernels end with the MCP session (`DELETE`, idle
    /// expiry), and no other MCP session sees them.
    #[default]
    Connection,
    /// The authenticated caller's ([`HttpCaller`]): every MCP session of
    /// one caller shares its sessions, and they outlive the MCP session,
    /// for clients that open one connection per call (LangChain's MCP
    /// adapter, CLI clients). The kernels end when the registry's idle
    /// limit reaps them or the server stops. `read_output` still pages
    /// only cells run through the same MCP session.
    Caller,
}

/// The registry owner of every MCP session of `caller` under
/// [`SessionScope::Caller`], `mcp:@<caller>` (`@` never occurs in
/// [`new_owner_id`]'s ids).
pub fn caller_owner_id(caller: &str) -> String {
    Surface::Mcp.owner(&format!("@{caller}"))
}

impl Drop for Inner {
    /// The connection (or HTTP session) is gone: end its kernels, unless
    /// they are the caller's ([`SessionScope::Caller`]).
    fn drop(&mut self) {
        if self.scope == SessionScope::Caller {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let registry = self.registry.clone();
            let owner = std::mem::take(self.owner.get_mut().unwrap_or_else(|e| e.into_inner()));
            rt.spawn(async move { registry.dispose_owner(&owner).await });
        }
    }
}

/// The MCP server of one owner (one connection or one HTTP session).
#[derive(Clone)]
pub struct CellhostMcp {
    inner: Arc<Inner>,
    tool_router: ToolRouter<CellhostMcp>,
}

impl std::fmt::Debug for CellhostMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellhostMcp")
            .field("owner", &self.owner())
            .finish_non_exhaustive()
    }
}

/// Parameters of `execute_code`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecuteCodeParams {
    /// Source of one cell (Python; R with `language: "r"`). Top-level `await` works in Python; the value of the
    /// last expression is returned (a trailing `;` hides it).
    pub code: String,
    /// Session name (default "default"). Each session is its own namespace
    /// and kernel; state persists between calls of the same session.
    #[serde(default)]
    pub session: Option<String>,
    /// Deadline in seconds (default 300; 0 = none). At the deadline the cell
    /// is interrupted; if it does not stop within 2 s the kernel is killed
    /// and the session's variables are lost.
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Wait behind a cell already running in the session instead of being
    /// refused with error code `session_busy` (default false).
    #[serde(default)]
    pub queue: Option<bool>,
    /// Start from a fresh kernel (all variables of the session are dropped)
    /// before running the code.
    #[serde(default)]
    pub reset: Option<bool>,
    /// Language of the code: "python" (default) or "r". A session keeps the
    /// language it was created with; naming another is an error
    /// (`bad_request`). Omitted: the session's language.
    #[serde(default)]
    pub language: Option<String>,
    /// Limits of a session this call creates: memory_mb, pids, cpu (cores),
    /// disk_mb, cell_timeout_s; each bounded by the operator's maximum
    /// (error code `limit_over_max`). A running session keeps its own
    /// unless `reset: true`.
    #[serde(default)]
    pub limits: Option<LimitsParam>,
    /// Network policy of a session this call creates: "off" (default),
    /// "on", or a list of "HOST[:PORT]" rules; a running session keeps its
    /// own.
    #[serde(default)]
    pub network: Option<NetworkParam>,
}

/// Parameters naming a session.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SessionParams {
    /// Session name (default "default").
    #[serde(default)]
    pub session: Option<String>,
}

/// Parameters of `fork_session`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ForkParams {
    /// The live, idle session to fork (default "default").
    #[serde(default)]
    pub session: Option<String>,
    /// The new session's name (must not exist).
    pub name: String,
    /// Threads of the session's cells: "refuse" (default: the fork is
    /// refused naming them) or "drop" (the fork starts without them).
    #[serde(default)]
    pub threads: Option<String>,
}

/// Parameters of `read_output`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReadOutputParams {
    /// The cell id given in a result ("cell id: ...", `cell_id` in the
    /// structured content).
    pub cell: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// Byte offset to start at (default 0).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Bytes to read (default 65536, at most 1048576).
    #[serde(default)]
    pub length: Option<u64>,
}

/// Parameters of `list_sessions` (none).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct NoParams {}

fn text_result(text: impl Into<String>, structured: serde_json::Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text.into())]);
    r.structured_content = Some(structured);
    r
}

/// A tool error: the text says `error CODE: message` (after any status
/// line the caller gave), and `structuredContent` is the same envelope as
/// the HTTP API's, `{"error": {"code", "message", ...fields}}`.
fn tool_error(code: &str, message: impl Into<String>) -> CallToolResult {
    tool_error_with(code, message, serde_json::Map::new())
}

fn tool_error_with(
    code: &str,
    message: impl Into<String>,
    fields: serde_json::Map<String, serde_json::Value>,
) -> CallToolResult {
    let message = message.into();
    let mut error = fields;
    error.insert("code".into(), json!(code));
    error.insert("message".into(), json!(message));
    let mut r = CallToolResult::error(vec![ContentBlock::text(format!("error {code}: {message}"))]);
    r.structured_content = Some(json!({ "error": error }));
    r
}

/// A protocol-level error (bad parameters, a foreign caller) with its
/// code in `data`: `{"code": "invalid_request"}`.
fn params_error(message: impl Into<String>) -> ErrorData {
    let message: String = message.into();
    ErrorData::invalid_params(message, Some(json!({"code": "invalid_request"})))
}

/// A tool error from the request layer: its code, message and fields
/// ([`RequestError::to_json`]), after `context`.
fn request_tool_error(context: &str, e: &RequestError) -> CallToolResult {
    let mut fields = match e.to_json() {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    fields.remove("code");
    fields.remove("message");
    tool_error_with(e.code(), format!("{context}: {e}"), fields)
}

fn session_name(s: Option<String>) -> Result<String, ErrorData> {
    let s = s.unwrap_or_else(|| DEFAULT_SESSION.to_string());
    if s.is_empty() || s.len() > 100 || s.chars().any(char::is_control) {
        return Err(params_error(
            "session must be 1 to 100 characters without control characters",
        ));
    }
    Ok(s)
}

#[tool_router]
impl CellhostMcp {
    /// A server for `owner` over `registry`.
    pub fn new(registry: Arc<Registry>, owner: impl Into<String>) -> Self {
        Self::with_scope_and_limits(registry, owner, SessionScope::Connection, McpLimits::default())
    }

    /// A server for `owner` over `registry` within `limits`.
    pub fn with_limits(registry: Arc<Registry>, owner: impl Into<String>, limits: McpLimits) -> Self {
        Self::with_scope_and_limits(registry, owner, SessionScope::Connection, limits)
    }

    /// A server for `owner` over `registry`; with [`SessionScope::Caller`]
    /// the owner becomes the HTTP caller's at the first request that names
    /// one ([`caller_owner_id`]), and the kernels outlive the server.
    pub fn with_scope(registry: Arc<Registry>, owner: impl Into<String>, scope: SessionScope) -> Self {
        Self::with_scope_and_limits(registry, owner, scope, McpLimits::default())
    }

    /// [`CellhostMcp::with_scope`] within `limits`.
    pub fn with_scope_and_limits(
        registry: Arc<Registry>,
        owner: impl Into<String>,
        scope: SessionScope,
        limits: McpLimits,
    ) -> Self {
        // Every tool, whichever module adds it, made to fit its clients.
        let mut tool_router = Self::tool_router()
            + Self::files_router()
            + Self::cells_router()
            + Self::notebook_router()
            + Self::packages_router();
        fit::fit_router(&mut tool_router);
        CellhostMcp {
            inner: Arc::new(Inner {
                registry,
                owner: Mutex::new(owner.into()),
                scope,
                limits,
                turns: Mutex::new(HashMap::new()),
                caller: Mutex::new(None),
            }),
            tool_router,
        }
    }

    /// The registry this server runs kernels in.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    /// The owner this server acts for.
    pub fn owner(&self) -> String {
        self.inner.owner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every tool as listed to clients (schemas, annotations).
    pub fn tools(&self) -> Vec<rmcp::model::Tool> {
        self.tool_router.list_all()
    }

    /// Binds the MCP session to its first HTTP caller (the one of its
    /// `initialize`); refuses others. A second layer behind the binding
    /// check of [`http_router`].
    fn check_caller(&self, ctx: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let Some(HttpCaller(caller)) = ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<HttpCaller>())
        else {
            return Ok(());
        };
        let mut bound = self.inner.caller.lock().unwrap_or_else(|e| e.into_inner());
        match bound.as_deref() {
            None => {
                *bound = Some(caller.clone());
                if self.inner.scope == SessionScope::Caller {
                    *self.inner.owner.lock().unwrap_or_else(|e| e.into_inner()) = caller_owner_id(caller);
                }
                Ok(())
            }
            Some(b) if b == caller => Ok(()),
            Some(_) => Err(ErrorData::invalid_request(
                "this MCP session belongs to another caller",
                Some(json!({"code": "forbidden"})),
            )),
        }
    }

    fn turn(&self, session: &str) -> Arc<Turn> {
        let mut turns = self.inner.turns.lock().unwrap_or_else(|e| e.into_inner());
        turns.entry(session.to_string()).or_default().clone()
    }

    /// The request layer's view of one of this owner's sessions.
    pub(crate) fn spec(&self, session: &str) -> SessionSpec {
        SessionSpec::new(self.owner(), session)
    }

    /// Interrupts the session's running cell for an MCP cancellation;
    /// true when the signal was delivered.
    async fn interrupt_for_cancel(&self, session: &str) -> bool {
        let asked = InterruptRequest {
            owner: self.owner(),
            session: session.to_string(),
            cwd: CwdScope::Any,
        };
        let Ok(outcome) = asked.execute(&self.inner.registry).await else {
            return false;
        };
        tracing::info!(
            "MCP cancellation of a cell in session {session}: interrupt delivered {}",
            outcome.delivered
        );
        outcome.delivered
    }

    #[tool(
        description = "Run a cell of Python code in a persistent kernel and return its output. \
State persists: variables, imports, open files and the working directory survive between calls \
of the same `session` (default \"default\"); other sessions are separate namespaces. \
The result text starts with the status (ok, error, timeout, interrupted, crashed), then stdout, \
stderr, the value of the last expression and the error with its traceback; matplotlib figures \
(and other displayed images) are returned as image content. Output is limited to 50,000 bytes of \
stdout and 10,000 bytes of stderr inline (40% head + 60% tail); when a stream is cut the text \
says so and the full stream can be paged with read_output {cell, stream, offset, length}. \
Deadline: timeout_s (default 300 s, 0 = none); at the deadline the cell is interrupted and the \
variables are kept when the code can be stopped (otherwise the kernel is killed and the result \
says state was lost). `reset: true` starts from a fresh kernel. While another cell of the \
session runs, the call fails with error code session_busy unless `queue: true` (then it waits). \
Cancelling the call interrupts the cell. Live output is sent as progress notifications when a progress token is given."
    )]
    async fn execute_code(
        &self,
        Parameters(p): Parameters<ExecuteCodeParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let deadline =
            Deadline::from_secs(p.timeout_s).map_err(|e| params_error(format!("timeout_s: {e}")))?;
        let queue = p.queue == Some(true);
        let turn = self.turn(&session);
        // The busy rule is the request layer's (every surface): a cell
        // running in the session refuses the call with `session_busy` unless
        // it asks to queue. The turn only orders calls that wait — queued
        // ones, and any call after a cancelled one whose cell is being
        // stopped — so a cancellation always names the cell that runs.
        // A held turn whose call was cancelled is waited for (its cell is
        // being interrupted); the holder's token is looked at only while it
        // holds the turn, so a finished call's token means nothing.
        let (_turn, waited_for_cancelled) = match turn.lock.clone().try_lock_owned() {
            Ok(g) => (Some(g), false),
            Err(_) => {
                let stopping = turn.holder_cancelled();
                if !queue && !stopping {
                    // Not waiting: the request layer refuses with `session_busy`.
                    (None, false)
                } else {
                    tokio::select! {
                        g = turn.lock.clone().lock_owned() => (Some(g), stopping),
                        _ = ctx.ct.cancelled() => {
                            return Ok(tool_error("cancelled", "status: cancelled before the cell started (another cell of the session was running)"));
                        }
                    }
                }
            }
        };
        // The turn may be free while the kernel still stops the cell of a
        // cancelled call (its handler is dropped at the cancellation): this
        // call then waits behind that cell instead of being refused.
        let after_cancel = _turn.is_some()
            && (turn.stopping.swap(false, std::sync::atomic::Ordering::SeqCst) || waited_for_cancelled);
        if _turn.is_some() {
            *turn.holder.lock().unwrap_or_else(|e| e.into_inner()) = Some(ctx.ct.clone());
        }
        let mut spec = SessionSpec {
            language: p.language.clone(),
            ..self.spec(&session)
        };
        let notes = match self.apply_session_settings(&mut spec, p.limits, p.network.as_ref()) {
            Ok(n) => n,
            Err(refused) => return Ok(refused),
        };
        if p.reset == Some(true) {
            let fresh = RestartRequest {
                session: spec.clone(),
            };
            if let Err(e) = fresh.execute(&self.inner.registry).await {
                return Ok(request_tool_error("status: failed to reset the kernel", &e));
            }
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut req = ExecuteRequest::new(spec, p.code, Origin::new("mcp"));
        req.deadline = deadline;
        req.queue = queue || after_cancel;
        req.live = Some(tx);
        let registry = self.inner.registry.clone();
        let mut task = tokio::spawn(async move { req.execute(&registry).await });
        let token = ctx.meta.get_progress_token();
        let mut pending = String::new();
        let mut progress = 0u64;
        let mut live_open = true;
        let mut cancelled = false;
        let mut interrupted = false;
        let started = std::time::Instant::now();
        let mut last_progress = std::time::Instant::now();
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let joined = loop {
            tokio::select! {
                r = &mut task => break r,
                ev = rx.recv(), if live_open => match ev {
                    Some(LiveEvent::Stdout(t)) | Some(LiveEvent::Stderr(t)) => pending.push_str(&t),
                    Some(LiveEvent::Display(d)) => {
                        let kinds: Vec<&str> = d.data.keys().map(String::as_str).collect();
                        pending.push_str(&format!("[display: {}]\n", kinds.join(", ")));
                    }
                    None => live_open = false,
                },
                _ = tick.tick() => {
                    // A cancellation that came while the kernel was still
                    // starting (or before the cell ran) is retried.
                    if cancelled && !interrupted {
                        interrupted = self.interrupt_for_cancel(&session).await;
                    }
                    let keepalive = pending.is_empty() && last_progress.elapsed() >= KEEPALIVE_EVERY;
                    if let Some(token) = &token && (!pending.is_empty() || keepalive) && !cancelled {
                        progress += 1;
                        last_progress = std::time::Instant::now();
                        let msg = if keepalive {
                            format!("running for {} s", started.elapsed().as_secs())
                        } else {
                            tail(&std::mem::take(&mut pending), PROGRESS_MAX_BYTES)
                        };
                        let n = ProgressNotificationParam::new(token.clone(), progress as f64)
                            .with_message(msg);
                        if let Err(e) = ctx.peer.notify_progress(n).await {
                            tracing::debug!("progress notification not sent: {e}");
                        }
                    } else if token.is_none() {
                        pending.clear();
                    }
                }
                _ = ctx.ct.cancelled(), if !cancelled => {
                    cancelled = true;
                    turn.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
                    interrupted = self.interrupt_for_cancel(&session).await;
                }
            }
        };
        let result = match joined {
            Ok(Ok(x)) => {
                if let Some(e) = &x.journal_error {
                    tracing::warn!(
                        "cell {} ran but its journal row was not written: {e}",
                        x.result.cell_id
                    );
                }
                x.result
            }
            Ok(Err(e)) => return Ok(request_tool_error("status: failed to run the cell", &e)),
            Err(e) => {
                return Err(ErrorData::internal_error(
                    format!("cell task failed: {e}"),
                    Some(json!({"code": "internal"})),
                ));
            }
        };
        Ok(session_settings::with_notes(
            render::cell_result_with(&result, self.inner.limits.image_max_bytes),
            notes,
        ))
    }

    #[tool(
        description = "Interrupt the cell running in a session (like Ctrl-C: KeyboardInterrupt in \
the cell). Variables are kept when the code can be stopped; if it does not stop within 2 s the \
kernel is killed and the session's state is lost. The interrupted execute_code call returns with \
status interrupted."
    )]
    async fn interrupt(&self, Parameters(p): Parameters<SessionParams>) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let asked = InterruptRequest {
            owner: self.owner(),
            session: session.clone(),
            cwd: CwdScope::Any,
        };
        let (outcome, dropped) = match asked.execute_dropping_queued(&self.inner.registry).await {
            Ok(i) => (i.outcome, i.dropped),
            Err(e) => return Ok(request_tool_error("nothing to interrupt", &e)),
        };
        let mut text = if outcome.delivered {
            format!(
                "interrupt delivered to session \"{session}\"{}",
                outcome
                    .cell
                    .as_deref()
                    .map(|c| format!(" (cell {c})"))
                    .unwrap_or_default()
            )
        } else {
            format!(
                "interrupt not delivered to session \"{session}\": {}",
                outcome.reason.as_deref().unwrap_or("no cell is running")
            )
        };
        if !dropped.is_empty() {
            text.push_str(&format!(
                "; dropped queued submitted cells: {}",
                dropped.join(", ")
            ));
        }
        let mut structured = json!(outcome);
        structured["dropped"] = json!(dropped);
        Ok(text_result(text, structured))
    }

    #[tool(
        description = "Pause an idle session: the picklable part of its namespace is checkpointed, \
then its kernel is stopped and its memory freed. The next execute_code of the session resumes it \
transparently (its result says restored.resumed, with the names restored and those that could \
not be saved, such as generators, open files or sockets). A paused session survives a restart \
of the server."
    )]
    async fn pause_session(
        &self,
        Parameters(p): Parameters<SessionParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let asked = cellhost_sessions::requests::PauseRequest {
            owner: self.owner(),
            session: session.clone(),
            cwd: CwdScope::Any,
        };
        match asked.execute(&self.inner.registry).await {
            Ok(r) => {
                let lost: Vec<String> = r
                    .checkpoint
                    .lost
                    .iter()
                    .map(|l| format!("{} ({})", l.name, l.reason))
                    .collect();
                Ok(text_result(
                    format!(
                        "session \"{session}\" paused: kernel generation {} (pid {}) stopped, {} MiB freed; checkpoint after cell {} saved {} names{}; the next execute_code resumes it",
                        r.generation,
                        r.pid,
                        r.memory_freed_bytes >> 20,
                        r.checkpoint.execution_count,
                        r.checkpoint.saved.len(),
                        if lost.is_empty() {
                            String::new()
                        } else {
                            format!("; not saved: {}", lost.join(", "))
                        }
                    ),
                    json!(r),
                ))
            }
            Err(e) => Ok(request_tool_error(
                &format!("pause of session \"{session}\" failed"),
                &e,
            )),
        }
    }

    #[tool(
        description = "Restart a session's kernel: the running cell (if any) is stopped, every \
variable and import of the session is dropped, and a fresh kernel (a new generation) is started."
    )]
    async fn restart(&self, Parameters(p): Parameters<SessionParams>) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let asked = RestartRequest {
            session: self.spec(&session),
        };
        match asked.execute(&self.inner.registry).await {
            Ok(r) => Ok(text_result(
                format!(
                    "session \"{session}\" restarted: {}kernel generation {} (pid {}); all earlier variables are gone",
                    if r.killed_previous {
                        "old kernel killed, new "
                    } else {
                        "new "
                    },
                    r.generation,
                    r.pid
                ),
                json!(r),
            )),
            Err(e) => Ok(request_tool_error(
                &format!("restart of session \"{session}\" failed"),
                &e,
            )),
        }
    }

    #[tool(
        description = "Fork a live, idle session into a new session `name`: the new session has the \
same variables, imports, execution count and a copy of the working directory's files, as a kernel of its \
own; changes in one never reach the other. Use it to try several next steps from the same state. \
Refused while a cell runs (session_busy), for a name in use (session_exists), and while threads of \
the session's cells run (threads_running) unless threads is \"drop\"."
    )]
    async fn fork_session(&self, Parameters(p): Parameters<ForkParams>) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let name = session_name(Some(p.name))?;
        let threads = match p.threads.as_deref() {
            None | Some("refuse") => ForkThreads::Refuse,
            Some("drop") => ForkThreads::Drop,
            Some(other) => {
                return Ok(tool_error(
                    "bad_request",
                    format!("threads is \"refuse\" or \"drop\", got {other:?}"),
                ));
            }
        };
        let asked = ForkRequest {
            session: self.spec(&session),
            name: name.clone(),
            threads,
        };
        match asked.execute(&self.inner.registry).await {
            Ok(r) => {
                let mut text = format!(
                    "session \"{session}\" forked into \"{name}\" ({}) at execution count {}: {} names, {} files ({} bytes), kernel generation {} (pid {}), {} ms",
                    match r.method {
                        cellhost_sessions::requests::ForkMethod::Cow => "copy-on-write".to_string(),
                        cellhost_sessions::requests::ForkMethod::Pickle => format!(
                            "pickled: {}",
                            r.pickle_reason.as_deref().unwrap_or("no reason given")
                        ),
                    },
                    r.execution_count,
                    r.names.len(),
                    r.files_copied,
                    r.bytes_copied,
                    r.generation,
                    r.pid,
                    r.duration_ms
                );
                if !r.lost.is_empty() {
                    let lost: Vec<String> = r.lost.iter().map(|(n, why)| format!("{n} ({why})")).collect();
                    text.push_str(&format!("; not carried: {}", lost.join(", ")));
                }
                if !r.threads_dropped.is_empty() {
                    text.push_str(&format!("; threads dropped: {}", r.threads_dropped.join(", ")));
                }
                Ok(text_result(text, json!(r)))
            }
            Err(e) => Ok(request_tool_error(
                &format!("fork of session \"{session}\" failed"),
                &e,
            )),
        }
    }

    #[tool(
        description = "List the variables of a session's namespace: name, type, and where known \
length, shape, dtype, size and a short preview. Only while no cell runs in that session."
    )]
    async fn list_variables(
        &self,
        Parameters(p): Parameters<SessionParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let asked = VariablesRequest {
            session: self.spec(&session),
            limit: 200,
        };
        match asked.execute(&self.inner.registry).await {
            Ok(v) => {
                let mut text = format!("{} variables in session \"{session}\"", v.variables.len());
                if v.truncated {
                    text.push_str(" (more exist; the first 200 shown)");
                }
                text.push('\n');
                for var in &v.variables {
                    let name = var.get("name").and_then(|x| x.as_str()).unwrap_or("?");
                    let ty = var.get("type").and_then(|x| x.as_str()).unwrap_or("?");
                    text.push_str(&format!("{name}: {ty}"));
                    for field in ["shape", "len", "dtype", "preview"] {
                        if let Some(x) = var.get(field).filter(|x| !x.is_null()) {
                            let shown = x.as_str().map_or_else(|| x.to_string(), str::to_string);
                            text.push_str(&format!(", {field} {shown}"));
                        }
                    }
                    text.push('\n');
                }
                Ok(text_result(text, json!(v)))
            }
            Err(e) => Ok(request_tool_error(
                &format!("cannot list variables of session \"{session}\""),
                &e,
            )),
        }
    }

    #[tool(
        description = "Page through the full output of a cell whose stdout or stderr was cut in \
the result. `cell` is the cell id of that result, `stream` is stdout or stderr, `offset` a byte \
offset (default 0) and `length` the bytes to read (default 65536, at most 1048576). The answer \
says the byte range returned and the next offset; only cells run through this connection can be read."
    )]
    async fn read_output(
        &self,
        Parameters(p): Parameters<ReadOutputParams>,
    ) -> Result<CallToolResult, ErrorData> {
        if p.stream != "stdout" && p.stream != "stderr" {
            return Err(params_error("stream must be stdout or stderr"));
        }
        let path = self.inner.registry.spill_of(&self.owner(), &p.cell, &p.stream);
        let Some(path) = path else {
            return Ok(tool_error(
                "output_not_found",
                format!(
                    "no spilled {} for cell {} (only cells of this connection whose {} was truncated can be read)",
                    p.stream, p.cell, p.stream
                ),
            ));
        };
        let offset = p.offset.unwrap_or(0);
        let length = p.length.unwrap_or(READ_DEFAULT).min(READ_MAX);
        match (ReadOutputRequest { path, offset, length }).execute() {
            Ok(chunk) => {
                let end = chunk.next_offset.unwrap_or(chunk.total_bytes);
                let mut text = format!(
                    "{} of cell {}: bytes {}..{end} of {}",
                    p.stream, p.cell, chunk.offset, chunk.total_bytes
                );
                match chunk.next_offset {
                    Some(n) => text.push_str(&format!("; next offset {n}\n")),
                    None => text.push_str(" (end of output)\n"),
                }
                text.push_str(&chunk.text);
                Ok(text_result(
                    text,
                    json!({"cell": p.cell, "stream": p.stream, "offset": chunk.offset,
                           "next_offset": chunk.next_offset, "total_bytes": chunk.total_bytes,
                           "text": chunk.text}),
                ))
            }
            Err(e) => Ok(tool_error(
                "range_not_satisfiable",
                format!("cannot read the output: {e}"),
            )),
        }
    }

    #[tool(
        description = "List this connection's sessions that have a live kernel (name, kernel \
generation, pid, whether a cell is running) and its paused ones (state \"paused\", when, the \
checkpoint they resume from)."
    )]
    async fn list_sessions(&self, Parameters(_p): Parameters<NoParams>) -> Result<CallToolResult, ErrorData> {
        let listed = ListRequest { owner: self.owner() }
            .execute_with_paused(&self.inner.registry)
            .await;
        let mut rows = Vec::new();
        let mut text = String::new();
        for l in listed {
            if let (Some(at), Some(c)) = (l.paused_ms, l.checkpoint.as_ref()) {
                text.push_str(&format!(
                    "{}: paused (generation {} stopped at {at} ms since the epoch; checkpoint after cell {}, {} names); the next execute_code resumes it\n",
                    l.name,
                    l.generation,
                    c.execution_count,
                    c.saved.len()
                ));
                rows.push(
                    json!({"session": l.name, "state": l.state, "generation": l.generation,
                    "pid": 0, "busy": false, "paused_ms": at, "checkpoint": c}),
                );
                continue;
            }
            text.push_str(&format!(
                "{}: generation {}, pid {}, {}\n",
                l.name,
                l.generation,
                l.pid,
                if l.busy { "running a cell" } else { "idle" }
            ));
            rows.push(json!({"session": l.name, "state": l.state, "generation": l.generation, "pid": l.pid, "busy": l.busy}));
        }
        if rows.is_empty() {
            text.push_str("no live or paused sessions (execute_code starts one)");
        }
        Ok(text_result(text, json!({"sessions": rows})))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CellhostMcp {
    /// The handshake binds an HTTP session to its caller at once, not at
    /// the first tool call.
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        self.check_caller(&context)?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("cellhost", env!("CARGO_PKG_VERSION")).with_title("cellhost"),
            )
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
            .with_instructions(INSTRUCTIONS)
    }

    /// Versions with an `initialize` handshake only: one connection (or
    /// HTTP session) is one owner, whose sessions persist across calls; the
    /// sessionless 2026-07-28 revision has no such scope (clients fall back
    /// to the handshake).
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        self.check_caller(&context)?;
        let schema = self
            .tool_router
            .get(&request.name)
            .and_then(|t| t.output_schema.clone());
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        let mut response = self.tool_router.call(tcc).await?;
        // Structured content matches the tool's portable outputSchema:
        // "none" is an absent member, never `null`.
        if let rmcp::model::CallToolResponse::Complete(r) = &mut response
            && r.is_error != Some(true)
            && let (Some(sc), Some(schema)) = (r.structured_content.as_mut(), schema)
        {
            fit::conform(sc, &serde_json::Value::Object((*schema).clone()));
        }
        Ok(response)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }
}

/// The last `max` bytes of `s`, cut at a character boundary.
fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &s[start..])
}

/// A fresh owner for one MCP connection or session, `mcp:<id>`
/// ([`Surface::owner`]), the id 96 random bits and
/// a process-wide sequence number, so two sessions never share an owner
/// (and so each other's kernels) even if the OS random source failed.
pub fn new_owner_id() -> String {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut b = [0u8; 12];
    if let Err(e) = getrandom::fill(&mut b) {
        tracing::warn!("no random source for an MCP owner id ({e}); using the sequence number alone");
    }
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Surface::Mcp.owner(&format!("{hex}-{seq}"))
}

/// Serves one MCP connection on standard input and output as `owner`,
/// until the client disconnects; then ends the owner's kernels. Logs go to
/// standard error (standard output carries the protocol).
///
/// # Errors
/// [`McpError::Initialize`] when the handshake fails, [`McpError::Task`]
/// when the server task panics.
pub async fn serve_stdio(registry: Arc<Registry>, owner: String) -> Result<(), McpError> {
    serve_stdio_with(registry, owner, McpLimits::default()).await
}

/// [`serve_stdio`] within `limits`.
///
/// # Errors
/// As [`serve_stdio`].
pub async fn serve_stdio_with(
    registry: Arc<Registry>,
    owner: String,
    limits: McpLimits,
) -> Result<(), McpError> {
    let server = CellhostMcp::with_limits(registry.clone(), owner.clone(), limits);
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Initialize(e.to_string()))?;
    let quit = running.waiting().await;
    registry.dispose_owner(&owner).await;
    quit.map(|_| ()).map_err(|e| McpError::Task(e.to_string()))
}

/// Path of the MCP endpoint in [`http_router`].
pub const MCP_PATH: &str = "/mcp";

/// The answer to a request naming an MCP session that does not exist *or
/// belongs to another caller*: the same bytes rmcp sends for an unknown
/// session, so a foreign session id is not confirmed to exist.
fn session_not_found() -> axum::response::Response {
    (http::StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

/// Which authenticated caller opened each live MCP session.
///
/// A session is bound when rmcp answers the `initialize` that created it
/// (the response carrying its new `Mcp-Session-Id`), before the client can
/// know the id; a binding ends with a successful `DELETE` of its owner, and
/// bindings of sessions rmcp ended itself (idle keep-alive, init timeout)
/// are pruned at the next `initialize`.
struct Bindings {
    by_session: Mutex<HashMap<String, String>>,
    sessions: Arc<LocalSessionManager>,
}

impl Bindings {
    fn caller_of(&self, session: &str) -> Option<String> {
        self.by_session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session)
            .cloned()
    }

    async fn bind(&self, session: String, caller: String) {
        let live: std::collections::HashSet<String> = self
            .sessions
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        let mut map = self.by_session.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|id, _| live.contains(id));
        map.insert(session, caller);
    }

    fn unbind(&self, session: &str) {
        self.by_session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
    }
}

struct Guarded {
    service: StreamableHttpService<CellhostMcp, LocalSessionManager>,
    bindings: Bindings,
}

/// The MCP endpoint at [`MCP_PATH`] (streamable HTTP), as an axum router to
/// merge into the HTTP API, with every MCP session bound to the caller that
/// opened it.
///
/// Every request must carry an [`HttpCaller`] in its extensions, put there
/// by the authentication in front of this router (a request without one
/// answers 401: a router mounted without authentication serves nothing).
/// A request naming an `Mcp-Session-Id` — `POST` of any JSON-RPC message
/// (a replayed `initialize`, `ping`, notifications, tool calls, responses),
/// `GET` (the event stream, resumption) or `DELETE` — reaches the session
/// only when its caller is the one whose `initialize` created it; any other
/// answers 404 exactly like an unknown session and leaves the session
/// untouched. Session ids are rmcp's random UUIDv4 (122 bits from the OS
/// generator), so they cannot be guessed either.
///
/// Each MCP session gets its own owner id in the registry; its kernels end
/// with the session. Only loopback `Host` headers are accepted
/// (DNS-rebinding protection).
pub fn http_router(registry: Arc<Registry>) -> axum::Router {
    http_router_with(registry, StreamableHttpServerConfig::default())
}

/// [`http_router`] with an explicit transport configuration (allowed
/// hosts, keep-alive, cancellation token, body limit).
pub fn http_router_with(registry: Arc<Registry>, config: StreamableHttpServerConfig) -> axum::Router {
    http_router_scoped(registry, config, SessionScope::Connection)
}

/// [`http_router_with`] whose MCP sessions use the sessions of `scope`:
/// with [`SessionScope::Caller`], every MCP session of one authenticated
/// caller shares that caller's sessions, kept across MCP sessions
/// (`cellhost serve --mcp-sessions caller`).
pub fn http_router_scoped(
    registry: Arc<Registry>,
    config: StreamableHttpServerConfig,
    scope: SessionScope,
) -> axum::Router {
    let sessions: Arc<LocalSessionManager> = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(
        move || Ok(CellhostMcp::with_scope(registry.clone(), new_owner_id(), scope)),
        sessions.clone(),
        config.with_legacy_session_mode(true),
    );
    let guarded = Arc::new(Guarded {
        service,
        bindings: Bindings {
            by_session: Mutex::new(HashMap::new()),
            sessions,
        },
    });
    // One handler for every method: there is no way to reach the rmcp
    // service but through the binding check.
    axum::Router::new()
        .route(MCP_PATH, axum::routing::any(guarded_endpoint))
        .with_state(guarded)
}

async fn guarded_endpoint(
    axum::extract::State(g): axum::extract::State<Arc<Guarded>>,
    req: axum::extract::Request,
) -> axum::response::Response {
    let Some(HttpCaller(caller)) = req.extensions().get::<HttpCaller>().cloned() else {
        return (
            http::StatusCode::UNAUTHORIZED,
            "the MCP endpoint needs an authenticated caller",
        )
            .into_response();
    };
    let named = req
        .headers()
        .get_all(HEADER_SESSION_ID)
        .iter()
        .map(|v| v.to_str().map(str::to_string))
        .collect::<Vec<_>>();
    match named.as_slice() {
        [] => {
            // No session named: at most an `initialize` creating one.
            let resp = g.service.handle(req).await;
            if let Some(id) = resp
                .headers()
                .get(HEADER_SESSION_ID)
                .and_then(|v| v.to_str().ok())
            {
                g.bindings.bind(id.to_string(), caller).await;
            }
            resp.map(axum::body::Body::new)
        }
        [Ok(id)] => {
            if g.bindings.caller_of(id).as_deref() != Some(caller.as_str()) {
                if g.bindings.caller_of(id).is_some() {
                    tracing::warn!("MCP request of caller {caller} for another caller's session refused");
                }
                return session_not_found();
            }
            let id = id.clone();
            let delete = req.method() == http::Method::DELETE;
            let resp = g.service.handle(req).await;
            if delete && resp.status().is_success() {
                g.bindings.unbind(&id);
            }
            resp.map(axum::body::Body::new)
        }
        // Several ids, or one that is not text: not a session of anyone.
        _ => session_not_found(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_cuts_at_char_boundary() {
        assert_eq!(tail("abc", 10), "abc");
        let t = tail("ééééé", 3);
        assert!(t.starts_with('…'));
        assert!(t.ends_with('é'));
    }

    #[test]
    fn owner_ids_differ() {
        assert_ne!(new_owner_id(), new_owner_id());
        assert!(new_owner_id().starts_with("mcp:"));
    }

    /// Every tool, whichever module adds it: an outputSchema (each returns
    /// structured content), annotations, and no `null` anywhere in its
    /// schemas.
    #[test]
    fn every_tool_fits() {
        let mut router = CellhostMcp::tool_router();
        fit::fit_router(&mut router);
        let tools = router.list_all();
        assert!(tools.len() >= 6);
        for t in tools {
            let input = serde_json::Value::Object((*t.input_schema).clone());
            let output = t
                .output_schema
                .as_ref()
                .map(|o| serde_json::Value::Object((**o).clone()));
            let a = t.annotations.as_ref();
            assert!(output.is_some(), "{} has no outputSchema", t.name);
            assert!(a.is_some(), "{} has no annotations", t.name);
            for s in [Some(input), output].into_iter().flatten() {
                let text = s.to_string();
                assert!(!text.contains("\"null\""), "{}: null in a schema: {text}", t.name);
                assert!(!text.contains("nullable"), "{}: {text}", t.name);
                assert_eq!(s["type"], "object", "{}: {text}", t.name);
            }
            let ro = ["list_variables", "list_sessions", "read_output"].contains(&t.name.as_ref());
            assert_eq!(a.and_then(|a| a.read_only_hint), Some(ro), "{}", t.name);
            if t.name == "restart" {
                assert_eq!(a.and_then(|a| a.destructive_hint), Some(true));
            }
        }
    }

    #[test]
    fn session_names_are_checked() {
        assert_eq!(session_name(None).ok().as_deref(), Some("default"));
        assert!(session_name(Some(String::new())).is_err());
        assert!(session_name(Some("a\nb".into())).is_err());
    }
}
