//! `…/files`: a session's files, by paths relative to its working
//! directory (the request layer's [`cellhost_sessions::requests::files`]
//! keeps every path below it).
//!
//! - `PUT /v1/sessions/{name}/files/{path}`: the body, streamed, becomes
//!   the file (atomically; missing directories created), up to the
//!   server's cap (`file_max_mb`, 413 `file_too_large` beyond);
//! - `GET /v1/sessions/{name}/files/{path}`: the file, streamed, with a
//!   single `Range: bytes=…` honoured (206, or 416 past the end);
//! - `GET /v1/sessions/{name}/files?path=DIR`: the directory's entries
//!   (name, path, type, size, mtime);
//! - `DELETE /v1/sessions/{name}/files/{path}`: the file, link or empty
//!   directory.

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cellhost_sessions::requests::files::{
    DeleteFileRequest, FileDeleted, FileKind, ListFilesRequest, ReadFileRequest, WriteFileRequest,
};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};
use utoipa::{IntoParams, ToSchema};

use super::encode_path;
use crate::auth::Caller;
use crate::error::{ApiError, ApiPath, ApiQuery, ErrorBody, ErrorCode};
use crate::http::{AppState, owned, spec};

type St = State<Arc<AppState>>;

/// A file of a session named in the path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct FilePath {
    /// The session's name.
    #[param(pattern = "^[A-Za-z0-9._-]{1,64}$", min_length = 1, max_length = 64)]
    pub name: String,
    /// The file's path relative to the session's workdir (`/` between
    /// directories; no `..`, not absolute).
    #[param(min_length = 1, max_length = 4096)]
    pub path: String,
}

/// A session named in the path (listing).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ListPath {
    /// The session's name.
    #[param(pattern = "^[A-Za-z0-9._-]{1,64}$", min_length = 1, max_length = 64)]
    pub name: String,
}

/// Query of `listFiles`.
#[derive(Debug, Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Directory relative to the workdir (default: the workdir).
    #[param(max_length = 4096)]
    pub path: Option<String>,
}

/// A file body (any bytes).
#[derive(Debug, ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct FileBytes(pub Vec<u8>);

/// What a write did.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileWrittenAnswer {
    /// The path, relative to the session's workdir.
    pub path: String,
    /// Bytes written.
    pub size: u64,
    /// A file existed at the path and was replaced.
    pub replaced: bool,
    /// Where to `GET` it.
    pub url: String,
}

/// One entry of a listing.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileEntryAnswer {
    /// Its name.
    pub name: String,
    /// Its path relative to the session's workdir.
    pub path: String,
    /// `file`, `dir`, `symlink` (never followed) or `other`.
    #[serde(rename = "type")]
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
    /// Where to `GET` it (a file) or list it (a directory).
    pub url: String,
}

/// A directory of a session's workdir.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileListingAnswer {
    /// The directory, relative to the workdir (`""`: the workdir).
    pub path: String,
    /// Its entries, by name.
    pub entries: Vec<FileEntryAnswer>,
    /// More than 10000 entries existed; the first are shown.
    pub truncated: bool,
}

/// The URL of a file of session `name`.
pub fn file_url(name: &str, path: &str) -> String {
    format!("/v1/sessions/{name}/files/{}", encode_path(path))
}

fn list_url(name: &str, path: &str) -> String {
    format!(
        "/v1/sessions/{name}/files?path={}",
        encode_path(path).replace('/', "%2F")
    )
}

/// Write a file into the session's workdir (atomically; missing directories are created).
#[utoipa::path(put, path = "/v1/sessions/{name}/files/{path}", operation_id = "writeFile", tag = "files",
    params(FilePath),
    request_body(content = FileBytes, content_type = "application/octet-stream",
        description = "the file's bytes, streamed; at most the server's `file_max_mb`"),
    responses(
        (status = 201, description = "written (a new file)", body = FileWrittenAnswer),
        (status = 200, description = "written over an existing file", body = FileWrittenAnswer),
        (status = 400, description = "`bad_request`: a directory is at the path", body = ErrorBody),
        (status = 403, description = "`path_refused`: the path leaves the workdir or is not a plain path", body = ErrorBody),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
        (status = 413, description = "`file_too_large`: over the server's cap", body = ErrorBody),
    ))]
pub(crate) async fn write_file(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(FilePath { name, path }): ApiPath<FilePath>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (owner, sandbox) = owned(&st, &caller, &name)?;
    let max_bytes = st.max_file_bytes();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_bytes) {
        return Err(ApiError::new(
            ErrorCode::FileTooLarge,
            format!("the body is larger than the cap of {max_bytes} bytes"),
        )
        .with("path", path.as_str())
        .with("max_bytes", max_bytes));
    }
    let req = WriteFileRequest {
        session: spec(&owner, &name, &sandbox),
        path,
        max_bytes,
    };
    // The body is piped into the request through a bounded in-memory pipe:
    // it is never held whole, and a client that stops sending stalls only
    // its own request (the server's body timeout ends it).
    let (reader, mut writer) = tokio::io::duplex(256 * 1024);
    let mut stream = body.into_data_stream();
    let pump = tokio::spawn(async move {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(std::io::Error::other)?;
            if writer.write_all(&chunk).await.is_err() {
                // The request stopped reading (over the cap, or failed).
                return Ok(());
            }
        }
        writer.shutdown().await
    });
    let written = req
        .execute(
            st.registry(),
            ReadOrFail {
                reader,
                pump: Some(pump),
            },
        )
        .await?;
    let status = if written.replaced {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let url = file_url(&name, &written.path);
    Ok((
        status,
        axum::Json(FileWrittenAnswer {
            path: written.path,
            size: written.size,
            replaced: written.replaced,
            url,
        }),
    )
        .into_response())
}

/// The pipe's reading end, which fails (instead of ending cleanly) when
/// the body could not be read to its end.
struct ReadOrFail {
    reader: tokio::io::DuplexStream,
    pump: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl tokio::io::AsyncRead for ReadOrFail {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.reader).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() == before => {
                // End of the pipe: the body ended, or its reading failed.
                let Some(pump) = self.pump.as_mut() else {
                    return Poll::Ready(Ok(()));
                };
                match std::pin::Pin::new(pump).poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(r) => {
                        self.pump = None;
                        match r {
                            Ok(Ok(())) => Poll::Ready(Ok(())),
                            Ok(Err(e)) => Poll::Ready(Err(e)),
                            Err(e) => Poll::Ready(Err(std::io::Error::other(e))),
                        }
                    }
                }
            }
            other => other,
        }
    }
}

use std::future::Future;

/// A single byte range of a `Range` header against a file of `size`
/// bytes: `Some(Ok((start, len)))`, `Some(Err(()))` when unsatisfiable,
/// `None` when absent or not one plain byte range (then the whole file is
/// sent, as RFC 9110 allows).
fn byte_range(headers: &HeaderMap, size: u64) -> Option<Result<(u64, u64), ()>> {
    let v = headers.get(header::RANGE)?.to_str().ok()?.trim();
    let spec = v.strip_prefix("bytes=")?.trim();
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        if n == 0 {
            return Some(Err(()));
        }
        let n = n.min(size);
        return Some(Ok((size - n, n)));
    }
    let start: u64 = a.parse().ok()?;
    let end: Option<u64> = if b.is_empty() { None } else { Some(b.parse().ok()?) };
    if end.is_some_and(|e| e < start) {
        return None;
    }
    if start >= size {
        return Some(Err(()));
    }
    let last = end.map_or(size - 1, |e| e.min(size - 1));
    Some(Ok((start, last - start + 1)))
}

/// Read a file of the session's workdir (streamed; one `Range: bytes=…` honoured).
#[utoipa::path(get, path = "/v1/sessions/{name}/files/{path}", operation_id = "readFile", tag = "files",
    params(FilePath,
        ("Range" = Option<String>, Header, description = "one byte range, `bytes=START-END`, `bytes=START-` or `bytes=-SUFFIX`")),
    responses(
        (status = 200, description = "the whole file", content((FileBytes = "application/octet-stream"))),
        (status = 206, description = "the asked range (`Content-Range` says which)", content((FileBytes = "application/octet-stream"))),
        (status = 400, description = "`bad_request`: the path is a directory", body = ErrorBody),
        (status = 403, description = "`path_refused`: the path leaves the workdir, or is a link out, a hard link or a special file", body = ErrorBody),
        (status = 404, description = "`session_not_found` or `file_not_found`", body = ErrorBody),
        (status = 416, description = "`range_not_satisfiable`", body = ErrorBody),
    ))]
pub(crate) async fn read_file(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(FilePath { name, path }): ApiPath<FilePath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (owner, sandbox) = owned(&st, &caller, &name)?;
    let mut opened = ReadFileRequest {
        session: spec(&owner, &name, &sandbox),
        path,
        offset: 0,
        length: None,
    }
    .execute(st.registry())
    .await?;
    let size = opened.size;
    let (status, start, len) = match byte_range(&headers, size) {
        None => (StatusCode::OK, 0, size),
        Some(Ok((start, len))) => (StatusCode::PARTIAL_CONTENT, start, len),
        Some(Err(())) => {
            let mut r = ApiError::new(
                ErrorCode::RangeNotSatisfiable,
                format!("the range is past the end of {} ({size} bytes)", opened.path),
            )
            .with("path", opened.path.as_str())
            .with("size", size)
            .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(r);
        }
    };
    if start > 0 {
        opened
            .file
            .seek(std::io::SeekFrom::Start(start))
            .await
            .map_err(|e| ApiError::new(ErrorCode::FileIoFailed, format!("{}: {e}", opened.path)))?;
    }
    let mut r = (status, super::reader_body(opened.file, len)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if status == StatusCode::PARTIAL_CONTENT
        && let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{size}", start + len - 1))
    {
        h.insert(header::CONTENT_RANGE, v);
    }
    Ok(r)
}

/// List a directory of the session's workdir (links are listed, not followed).
#[utoipa::path(get, path = "/v1/sessions/{name}/files", operation_id = "listFiles", tag = "files",
    params(ListPath, ListQuery),
    responses(
        (status = 200, description = "the entries", body = FileListingAnswer),
        (status = 400, description = "`bad_request`: not a directory", body = ErrorBody),
        (status = 403, description = "`path_refused`", body = ErrorBody),
        (status = 404, description = "`session_not_found` or `file_not_found`", body = ErrorBody),
    ))]
pub(crate) async fn list_files(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(ListPath { name }): ApiPath<ListPath>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<axum::Json<FileListingAnswer>, ApiError> {
    let (owner, sandbox) = owned(&st, &caller, &name)?;
    let listing = ListFilesRequest {
        session: spec(&owner, &name, &sandbox),
        path: q.path.unwrap_or_default(),
    }
    .execute(st.registry())
    .await?;
    Ok(axum::Json(FileListingAnswer {
        path: listing.path,
        entries: listing
            .entries
            .into_iter()
            .map(|e| FileEntryAnswer {
                url: if e.kind == FileKind::Dir {
                    list_url(&name, &e.path)
                } else {
                    file_url(&name, &e.path)
                },
                name: e.name,
                path: e.path,
                kind: e.kind,
                size: e.size,
                mtime_ms: e.mtime_ms,
            })
            .collect(),
        truncated: listing.truncated,
    }))
}

/// Delete a file, a link (never its target) or an empty directory of the session's workdir.
#[utoipa::path(delete, path = "/v1/sessions/{name}/files/{path}", operation_id = "deleteFile", tag = "files",
    params(FilePath),
    responses(
        (status = 200, description = "deleted", body = FileDeleted),
        (status = 400, description = "`bad_request`: a directory that is not empty", body = ErrorBody),
        (status = 403, description = "`path_refused`", body = ErrorBody),
        (status = 404, description = "`session_not_found` or `file_not_found`", body = ErrorBody),
    ))]
pub(crate) async fn delete_file(
    State(st): St,
    Extension(caller): Extension<Caller>,
    ApiPath(FilePath { name, path }): ApiPath<FilePath>,
) -> Result<axum::Json<FileDeleted>, ApiError> {
    let (owner, sandbox) = owned(&st, &caller, &name)?;
    let deleted = DeleteFileRequest {
        session: spec(&owner, &name, &sandbox),
        path,
    }
    .execute(st.registry())
    .await?;
    Ok(axum::Json(deleted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(v: &str, size: u64) -> Option<Result<(u64, u64), ()>> {
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, HeaderValue::from_str(v).expect("header"));
        byte_range(&h, size)
    }

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(range("bytes=0-9", 100), Some(Ok((0, 10))));
        assert_eq!(range("bytes=90-", 100), Some(Ok((90, 10))));
        assert_eq!(range("bytes=-5", 100), Some(Ok((95, 5))));
        assert_eq!(range("bytes=-500", 100), Some(Ok((0, 100))));
        assert_eq!(range("bytes=95-200", 100), Some(Ok((95, 5))));
        assert_eq!(range("bytes=100-", 100), Some(Err(())));
        assert_eq!(range("bytes=0-1,5-6", 100), None);
        assert_eq!(range("bytes=9-1", 100), None);
        assert_eq!(range("items=0-1", 100), None);
    }
}
