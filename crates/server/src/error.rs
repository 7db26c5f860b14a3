//! Error answers of the HTTP API: one envelope with a stable code.
//!
//! Every error body is `{"error": {"code": "...", "message": "...",
//! <fields>}}` with `content-type: application/json`, whatever produced it:
//! a handler, the bearer-token check, axum's own rejections (malformed
//! JSON, wrong content type, a body that does not match the schema, a body
//! over the limit), an unknown route or a wrong method
//! ([`envelope_errors`] rewrites any other error answer as a last resort).
//! The HTTP status follows from the code alone ([`ErrorCode::status`]).

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cellhost_sessions::RequestError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The stable code of an error, the same on every surface. The HTTP status
/// is [`ErrorCode::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed (JSON syntax, an unreadable body).
    BadRequest,
    /// 422: the request is well-formed but a value is not what the
    /// document allows (type, range, length, pattern, unknown field).
    InvalidRequest,
    /// 415: a body that is not `application/json`.
    UnsupportedMediaType,
    /// 413: a body over [`crate::MAX_BODY_BYTES`].
    PayloadTooLarge,
    /// 404: no such route.
    NotFound,
    /// 405: the route exists, not with this method.
    MethodNotAllowed,
    /// 401: missing or unknown bearer token.
    Unauthorized,
    /// 403: a read-only token on a route that is not `GET`.
    Forbidden,
    /// 404: no session of that name for this token's owner (another
    /// owner's session answers the same).
    SessionNotFound,
    /// 409: a session of that name exists already.
    SessionExists,
    /// 409: a cell is running (or queued) in the session and the request
    /// did not ask to queue.
    SessionBusy,
    /// 409: a fork was refused because threads of the session's cells run
    /// (`threads`), and the request did not accept dropping them.
    ThreadsRunning,
    /// 500: a fork's snapshot or restore failed.
    ForkFailed,
    /// 429: the owner holds the most sessions allowed.
    TooManySessions,
    /// 404: no spilled output of that cell and stream for this owner.
    OutputNotFound,
    /// 416: an output offset or a file range past the end.
    RangeNotSatisfiable,
    /// 403: a file path outside the session's workdir (absolute, `..`, a
    /// link or mount leading out, NUL, too long), or a file the host does
    /// not read (a special file, a hard link).
    PathRefused,
    /// 404: no file at that path of the session's workdir.
    FileNotFound,
    /// 413: a file over the configured size cap.
    FileTooLarge,
    /// 500: reading or writing a file of the workdir failed.
    FileIoFailed,
    /// 404: no image display of that id in the caller's session.
    DisplayNotFound,
    /// 404: no cell of that id for this owner.
    CellNotFound,
    /// 403: the request asked for a sandbox mode below the host's floor.
    SandboxBelowFloor,
    /// 503: mode `enforce` and a sandbox layer is not available here.
    SandboxUnavailable,
    /// 503: every live kernel is busy, attached or pinned.
    RegistryFull,
    /// 503: the server is shutting down.
    ShutDown,
    /// 409: the request named a kernel generation that was replaced.
    StaleGeneration,
    /// 502: the kernel could not be started or failed (spawn, handshake,
    /// protocol, death).
    KernelFailed,
    /// 422: a notebook's language has no runtime here.
    UnsupportedLanguage,
    /// 422: a session limit over the operator's maximum (`field`, `value`,
    /// `max`).
    LimitOverMax,
    /// 507: a write would pass the session's disk cap (`disk_mb`; `path`,
    /// `bytes`, `used`, `max_mb`).
    DiskFull,
    /// 500: a restore could not be done.
    RestoreFailed,
    /// 501: a checkpoint mode this host or session cannot have (`process`
    /// where CRIU cannot run, with its error; a language or placement
    /// without namespace checkpoints).
    CheckpointUnavailable,
    /// 500: the kernel could not write a checkpoint (the session keeps
    /// its kernel).
    CheckpointFailed,
    /// 500: the journal could not be read or written.
    JournalFailed,
    /// 422: a package spec is not a plain requirement (options, markers,
    /// paths, URLs, shell syntax).
    InvalidPackageSpec,
    /// 403: an install into the interpreter's shared environment, which
    /// the config does not allow.
    SharedVenvRefused,
    /// 502: the installer ran and failed (`status`, `stderr_tail`).
    InstallFailed,
    /// 503: the installer could not be started or ran past its deadline.
    InstallerUnavailable,
    /// 409: the session runs on another placement than the request named
    /// (`session`, `placement`, `asked`); a session keeps the placement it
    /// was created with.
    PlacementMismatch,
    /// 502: the scheduler refused the node agent's job (`sbatch`, the
    /// Kubernetes API, `ssh`), with its own message.
    PlacementRejected,
    /// 503: the scheduler accepted the job but cannot run it (a Pod that
    /// cannot be scheduled).
    PlacementUnschedulable,
    /// 503: the scheduler could not be reached.
    PlacementUnavailable,
    /// 500: the `[placement.NAME]` table or the host's listener for node
    /// agents is not usable.
    PlacementConfig,
    /// 504: the node agent did not dial back within the placement's
    /// timeout.
    DialBackTimeout,
    /// 502: the node agent ended before it was admitted.
    DialBackFailed,
    /// 502: the host refused the node agent's credential.
    AdmissionRefused,
    /// 502: the node agent failed after it was admitted (its connection,
    /// its first message).
    RemoteFailed,
    /// 500: a fault of the server itself.
    Internal,
}

impl ErrorCode {
    /// The HTTP status of the code (one rule for every route).
    pub fn status(self) -> StatusCode {
        use ErrorCode::*;
        match self {
            BadRequest => StatusCode::BAD_REQUEST,
            InvalidRequest | UnsupportedLanguage | InvalidPackageSpec | LimitOverMax => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            SharedVenvRefused => StatusCode::FORBIDDEN,
            InstallFailed => StatusCode::BAD_GATEWAY,
            InstallerUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            DiskFull => StatusCode::INSUFFICIENT_STORAGE,
            UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            NotFound | SessionNotFound | OutputNotFound | FileNotFound | DisplayNotFound | CellNotFound => {
                StatusCode::NOT_FOUND
            }
            FileTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            PathRefused => StatusCode::FORBIDDEN,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Unauthorized => StatusCode::UNAUTHORIZED,
            Forbidden | SandboxBelowFloor => StatusCode::FORBIDDEN,
            SessionExists | SessionBusy | StaleGeneration | ThreadsRunning => StatusCode::CONFLICT,
            TooManySessions => StatusCode::TOO_MANY_REQUESTS,
            RangeNotSatisfiable => StatusCode::RANGE_NOT_SATISFIABLE,
            SandboxUnavailable | RegistryFull | ShutDown => StatusCode::SERVICE_UNAVAILABLE,
            KernelFailed | PlacementRejected | DialBackFailed | AdmissionRefused | RemoteFailed => {
                StatusCode::BAD_GATEWAY
            }
            PlacementMismatch => StatusCode::CONFLICT,
            PlacementUnschedulable | PlacementUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            DialBackTimeout => StatusCode::GATEWAY_TIMEOUT,
            PlacementConfig => StatusCode::INTERNAL_SERVER_ERROR,
            RestoreFailed | ForkFailed | JournalFailed | FileIoFailed | CheckpointFailed | Internal => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            CheckpointUnavailable => StatusCode::NOT_IMPLEMENTED,
        }
    }

    /// The wire name (`session_busy`, …).
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            BadRequest => "bad_request",
            InvalidRequest => "invalid_request",
            UnsupportedMediaType => "unsupported_media_type",
            PayloadTooLarge => "payload_too_large",
            NotFound => "not_found",
            MethodNotAllowed => "method_not_allowed",
            Unauthorized => "unauthorized",
            Forbidden => "forbidden",
            SessionNotFound => "session_not_found",
            SessionExists => "session_exists",
            SessionBusy => "session_busy",
            ThreadsRunning => "threads_running",
            ForkFailed => "fork_failed",
            TooManySessions => "too_many_sessions",
            OutputNotFound => "output_not_found",
            RangeNotSatisfiable => "range_not_satisfiable",
            PathRefused => "path_refused",
            FileNotFound => "file_not_found",
            FileTooLarge => "file_too_large",
            FileIoFailed => "file_io_failed",
            DisplayNotFound => "display_not_found",
            CellNotFound => "cell_not_found",
            SandboxBelowFloor => "sandbox_below_floor",
            SandboxUnavailable => "sandbox_unavailable",
            RegistryFull => "registry_full",
            ShutDown => "shut_down",
            StaleGeneration => "stale_generation",
            KernelFailed => "kernel_failed",
            UnsupportedLanguage => "unsupported_language",
            LimitOverMax => "limit_over_max",
            DiskFull => "disk_full",
            RestoreFailed => "restore_failed",
            CheckpointUnavailable => "checkpoint_unavailable",
            CheckpointFailed => "checkpoint_failed",
            JournalFailed => "journal_failed",
            InvalidPackageSpec => "invalid_package_spec",
            SharedVenvRefused => "shared_venv_refused",
            InstallFailed => "install_failed",
            InstallerUnavailable => "installer_unavailable",
            PlacementMismatch => "placement_mismatch",
            PlacementRejected => "placement_rejected",
            PlacementUnschedulable => "placement_unschedulable",
            PlacementUnavailable => "placement_unavailable",
            PlacementConfig => "placement_config",
            DialBackTimeout => "dial_back_timeout",
            DialBackFailed => "dial_back_failed",
            AdmissionRefused => "admission_refused",
            RemoteFailed => "remote_failed",
            Internal => "internal",
        }
    }

    /// The code of a request-layer error: [`RequestError::code`] (the one
    /// mapping of errors to codes, the same on every surface), as this
    /// enum spells it; a code this API does not know is `internal`.
    pub fn of_request(e: &RequestError) -> ErrorCode {
        use serde::de::IntoDeserializer;
        let code: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
            e.code().into_deserializer();
        ErrorCode::deserialize(code).unwrap_or(ErrorCode::Internal)
    }

    /// The code an error status stands for, for answers no handler made
    /// (see [`envelope_errors`]).
    pub fn of_status(status: StatusCode) -> ErrorCode {
        match status {
            StatusCode::BAD_REQUEST => ErrorCode::BadRequest,
            StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
            StatusCode::FORBIDDEN => ErrorCode::Forbidden,
            StatusCode::NOT_FOUND => ErrorCode::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
            StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
            StatusCode::UNPROCESSABLE_ENTITY => ErrorCode::InvalidRequest,
            StatusCode::SERVICE_UNAVAILABLE => ErrorCode::ShutDown,
            s if s.is_client_error() => ErrorCode::BadRequest,
            _ => ErrorCode::Internal,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The error itself: a code, a message for a reader, and fields a caller
/// can act on (e.g. `session` and `cell` for `session_busy`, `limit` for
/// `too_many_sessions`, `limit_bytes` for `payload_too_large`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// The stable code; the HTTP status follows from it.
    pub code: ErrorCode,
    /// One or two sentences for a reader.
    pub message: String,
    /// Fields of the code, beside `code` and `message`.
    #[serde(flatten)]
    #[schema(ignore)]
    pub fields: BTreeMap<String, Value>,
}

/// An error answer of the API.
#[derive(Debug, Clone)]
pub struct ApiError(pub ErrorDetail);

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError(ErrorDetail {
            code,
            message: message.into(),
            fields: BTreeMap::new(),
        })
    }

    /// The same error with one more field.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> ApiError {
        self.0.fields.insert(name.to_string(), value.into());
        self
    }

    /// The code.
    pub fn code(&self) -> ErrorCode {
        self.0.code
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0.code, self.0.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.0.code.status();
        let body = serde_json::to_vec(&ErrorBody { error: self.0 }).unwrap_or_else(|_| {
            br#"{"error":{"code":"internal","message":"the error could not be encoded"}}"#.to_vec()
        });
        let mut r = (status, body).into_response();
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

impl From<RequestError> for ApiError {
    /// The request layer's code, message and fields
    /// ([`RequestError::to_json`]).
    fn from(e: RequestError) -> Self {
        let mut err = ApiError::new(ErrorCode::of_request(&e), e.to_string());
        if let serde_json::Value::Object(fields) = e.to_json() {
            for (k, v) in fields {
                if k != "code" && k != "message" {
                    err.0.fields.insert(k, v);
                }
            }
        }
        err
    }
}

fn bytes_rejection(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("the body is larger than {} bytes", crate::MAX_BODY_BYTES),
        )
        .with("limit_bytes", crate::MAX_BODY_BYTES as u64)
    } else {
        ApiError::new(ErrorCode::BadRequest, format!("the body could not be read: {e}"))
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|m| {
            let m = m.trim().to_ascii_lowercase();
            m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
        })
        .unwrap_or(false)
}

/// Parses a JSON body: a syntax error is `bad_request` (400), a value the
/// type refuses `invalid_request` (422).
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de);
    let value = match value {
        Ok(v) => v,
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let code = if inner.is_data() {
                ErrorCode::InvalidRequest
            } else {
                ErrorCode::BadRequest
            };
            let mut err = ApiError::new(code, format!("the JSON body is not valid: {inner}"));
            if code == ErrorCode::InvalidRequest && path != "." {
                err = err.with("field", path);
            }
            return Err(err);
        }
    };
    de.end()
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("the JSON body is not valid: {e}")))?;
    Ok(value)
}

/// A JSON request body (`application/json`), with the API's error codes:
/// 415 without a JSON content type, 400 for a syntax error, 422 for a value
/// the type refuses, 413 over the body limit.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the body must be JSON (Content-Type: application/json)",
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(bytes_rejection)?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// An optional JSON request body: no body (and no content type), or a JSON
/// `null`, is `T::default()`; otherwise as [`ApiJson`].
#[derive(Debug)]
pub struct OptionalJson<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let typed = req.headers().contains_key(header::CONTENT_TYPE);
        let json = is_json(req.headers());
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(bytes_rejection)?;
        if bytes.is_empty() && (!typed || json) {
            return Ok(OptionalJson(T::default()));
        }
        if !json {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the body must be JSON (Content-Type: application/json)",
            ));
        }
        parse_json::<Option<T>>(&bytes).map(|b| OptionalJson(b.unwrap_or_default()))
    }
}

/// Query parameters, refused with `invalid_request` (422).
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("bad query parameters: {}", e.body_text()),
                )
            })
    }
}

/// Path parameters, refused with `invalid_request` (422).
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|e: PathRejection| {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("bad path parameters: {}", e.body_text()),
                )
            })
    }
}

/// The answer to a route that does not exist.
pub async fn route_not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

/// The answer to a route that exists, with another method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "this route does not take this method",
    )
}

/// Last resort: an error answer (status 400 or more) whose body is not
/// JSON — from a layer that answers by itself — becomes the envelope, its
/// code taken from the status. Answers that are JSON already pass.
pub async fn envelope_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if status.as_u16() < 400 || is_json(resp.headers()) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    let code = ErrorCode::of_status(status);
    let mut r = ApiError::new(code, text).into_response();
    // The status stays the one the layer chose; headers it set (Allow,
    // Retry-After, WWW-Authenticate) are kept.
    *r.status_mut() = status;
    for (k, v) in &parts.headers {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            r.headers_mut().insert(k.clone(), v.clone());
        }
    }
    r.map(Body::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_status_and_name() {
        use ErrorCode::*;
        for (code, status, name) in [
            (SessionBusy, 409, "session_busy"),
            (SessionNotFound, 404, "session_not_found"),
            (Unauthorized, 401, "unauthorized"),
            (Forbidden, 403, "forbidden"),
            (SandboxBelowFloor, 403, "sandbox_below_floor"),
            (BadRequest, 400, "bad_request"),
            (InvalidRequest, 422, "invalid_request"),
            (UnsupportedMediaType, 415, "unsupported_media_type"),
            (PayloadTooLarge, 413, "payload_too_large"),
            (KernelFailed, 502, "kernel_failed"),
            (PlacementMismatch, 409, "placement_mismatch"),
            (PlacementRejected, 502, "placement_rejected"),
            (PlacementUnschedulable, 503, "placement_unschedulable"),
            (PlacementUnavailable, 503, "placement_unavailable"),
            (PlacementConfig, 500, "placement_config"),
            (DialBackTimeout, 504, "dial_back_timeout"),
            (DialBackFailed, 502, "dial_back_failed"),
            (AdmissionRefused, 502, "admission_refused"),
            (RemoteFailed, 502, "remote_failed"),
            (Internal, 500, "internal"),
        ] {
            assert_eq!(code.status().as_u16(), status, "{name}");
            assert_eq!(code.as_str(), name);
            assert_eq!(serde_json::to_value(code).ok(), Some(Value::from(name)));
        }
    }

    #[test]
    fn request_codes_are_reused() {
        use cellhost_sessions::RegistryError;
        use cellhost_sessions::cell::KernelError;
        let busy = RequestError::SessionBusy {
            session: "s".into(),
            cell: "c1".into(),
        };
        let e = ApiError::from(busy);
        assert_eq!(e.code(), ErrorCode::SessionBusy);
        assert_eq!(e.code().status().as_u16(), 409);
        assert_eq!(e.0.fields.get("cell"), Some(&Value::from("c1")));
        assert_eq!(e.0.fields.get("session"), Some(&Value::from("s")));
        assert!(!e.0.fields.contains_key("code"));
        // Every code the request layer gives is one this API knows (never
        // `internal` by accident).
        for (err, code) in [
            (RequestError::bad_request("x"), ErrorCode::BadRequest),
            (
                RequestError::SessionNotFound {
                    session: "s".into(),
                    live: false,
                },
                ErrorCode::SessionNotFound,
            ),
            (
                RequestError::Journal { message: "x".into() },
                ErrorCode::JournalFailed,
            ),
            (RegistryError::ShutDown.into(), ErrorCode::ShutDown),
            (RegistryError::Full { max: 2 }.into(), ErrorCode::RegistryFull),
            (
                RegistryError::Restore("x".into()).into(),
                ErrorCode::RestoreFailed,
            ),
            (
                RegistryError::Kernel(KernelError::KernelBusy {
                    kernel: "s/1".into(),
                    cell: "c1".into(),
                })
                .into(),
                ErrorCode::SessionBusy,
            ),
        ] {
            assert_eq!(ErrorCode::of_request(&err), code, "{err}");
        }
        let full = ApiError::from(RequestError::from(RegistryError::Full { max: 2 }));
        assert_eq!(full.0.fields.get("max_live_kernels"), Some(&Value::from(2u64)));
    }

    #[test]
    fn json_errors_are_told_apart() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct B {
            n: u32,
        }
        assert_eq!(
            parse_json::<B>(b"{").map(|_| ()).map_err(|e| e.code()),
            Err(ErrorCode::BadRequest)
        );
        let e = parse_json::<B>(br#"{"n": "x"}"#)
            .map(|_| ())
            .map_err(|e| e.code());
        assert_eq!(e, Err(ErrorCode::InvalidRequest));
        assert_eq!(
            parse_json::<B>(br#"{"n": 1} x"#)
                .map(|_| ())
                .map_err(|e| e.code()),
            Err(ErrorCode::BadRequest)
        );
        assert!(parse_json::<B>(br#"{"n": 1}"#).is_ok());
    }
}
