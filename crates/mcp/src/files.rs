//! The file tools: `write_file`, `read_file`, `list_files` — adapters over
//! the request layer's files requests
//! ([`cellhost_sessions::requests::files`]: paths relative to the session's
//! workdir, kept below it, writes atomic), within [`crate::McpLimits`].

use base64::Engine as _;
use cellhost_sessions::requests::files::{FileKind, ListFilesRequest, ReadFileRequest, WriteFileRequest};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::json;

use crate::{CellhostMcp, params_error, request_tool_error, session_name, text_result};

/// Parameters of `write_file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WriteFileParams {
    /// Session name (default "default").
    #[serde(default)]
    pub session: Option<String>,
    /// Path relative to the session's working directory (missing
    /// directories are created; no `..`, not absolute).
    pub path: String,
    /// The content as text (UTF-8). Give exactly one of `text` and `base64`.
    #[serde(default)]
    pub text: Option<String>,
    /// The content as base64 (for binary files).
    #[serde(default)]
    pub base64: Option<String>,
}

/// Parameters of `read_file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReadFileParams {
    /// Session name (default "default").
    #[serde(default)]
    pub session: Option<String>,
    /// Path relative to the session's working directory.
    pub path: String,
    /// `text` (UTF-8; refused for a binary file), `base64`, or `auto`
    /// (default: text when the bytes are UTF-8, else base64).
    #[serde(default)]
    pub encoding: Option<String>,
    /// Byte offset to start at (default 0).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Bytes to read (default: to the end, within the size cap).
    #[serde(default)]
    pub length: Option<u64>,
}

/// Parameters of `list_files`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ListFilesParams {
    /// Session name (default "default").
    #[serde(default)]
    pub session: Option<String>,
    /// Directory relative to the session's working directory (default: the
    /// working directory itself).
    #[serde(default)]
    pub path: Option<String>,
}

#[tool_router(router = files_router, vis = "pub(crate)")]
impl CellhostMcp {
    #[tool(
        description = "Write a file into a session's working directory (the directory its cells \
run in: `open(path)` in a cell sees it at once). `path` is relative to that directory; missing \
directories are created; the write is atomic (readers see the old file or the new one). Give the \
content as `text` or as `base64`. Files over the server's size cap are refused with error code \
file_too_large; paths that leave the directory (`..`, absolute, links out) with path_refused."
    )]
    async fn write_file(
        &self,
        Parameters(p): Parameters<WriteFileParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let bytes = match (p.text, p.base64) {
            (Some(t), None) => t.into_bytes(),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .map_err(|e| params_error(format!("base64: {e}")))?,
            _ => return Err(params_error("give exactly one of `text` and `base64`")),
        };
        let req = WriteFileRequest {
            session: self.spec(&session),
            path: p.path,
            max_bytes: self.inner.limits.file_max_bytes,
        };
        match req.execute(&self.inner.registry, bytes.as_slice()).await {
            Ok(w) => Ok(text_result(
                format!(
                    "wrote {} ({} bytes{}) in session \"{session}\"",
                    w.path,
                    w.size,
                    if w.replaced {
                        ", replacing the old file"
                    } else {
                        ""
                    }
                ),
                json!(w),
            )),
            Err(e) => Ok(request_tool_error("write_file failed", &e)),
        }
    }

    #[tool(
        description = "Read a file of a session's working directory (e.g. a CSV or plot a cell \
wrote). `path` is relative to that directory. Text comes back as text, binary files as base64 \
(`encoding`: auto (default), text or base64). At most the server's size cap is returned at once \
(1 MiB unless configured): page larger files with `offset` and `length` (bytes)."
    )]
    async fn read_file(
        &self,
        Parameters(p): Parameters<ReadFileParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let encoding = p.encoding.unwrap_or_else(|| "auto".into());
        if !["auto", "text", "base64"].contains(&encoding.as_str()) {
            return Err(params_error("encoding must be auto, text or base64"));
        }
        let cap = self.inner.limits.file_max_bytes;
        let req = ReadFileRequest {
            session: self.spec(&session),
            path: p.path,
            offset: p.offset.unwrap_or(0),
            length: p.length,
        };
        let (opened, bytes) = match req.read_to_vec(&self.inner.registry, cap).await {
            Ok(x) => x,
            Err(e) => return Ok(request_tool_error("read_file failed", &e)),
        };
        let end = opened.offset + opened.length;
        let range = format!(
            "{} bytes {}..{end} of {} in session \"{session}\"{}",
            opened.path,
            opened.offset,
            opened.size,
            if end < opened.size {
                format!("; next offset {end}")
            } else {
                String::new()
            }
        );
        let as_text = match encoding.as_str() {
            "base64" => None,
            _ => String::from_utf8(bytes.clone()).ok(),
        };
        let meta = json!({"path": opened.path, "size": opened.size, "offset": opened.offset,
            "length": opened.length, "mtime_ms": opened.mtime_ms,
            "next_offset": (end < opened.size).then_some(end)});
        match as_text {
            Some(t) => {
                let mut m = meta;
                m["encoding"] = "text".into();
                m["text"] = t.clone().into();
                Ok(text_result(format!("{range} (text)\n{t}"), m))
            }
            None if encoding == "text" => Ok(crate::tool_error(
                "bad_request",
                format!("{} is not UTF-8 text; read it with encoding base64", opened.path),
            )),
            None => {
                let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
                let mut m = meta;
                m["encoding"] = "base64".into();
                m["base64"] = b64.clone().into();
                Ok(text_result(format!("{range} (base64)\n{b64}"), m))
            }
        }
    }

    #[tool(
        description = "List a directory of a session's working directory: name, type (file, dir, \
symlink, other), size in bytes and modification time of each entry. `path` is relative to the \
working directory (default: the directory itself)."
    )]
    async fn list_files(
        &self,
        Parameters(p): Parameters<ListFilesParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let req = ListFilesRequest {
            session: self.spec(&session),
            path: p.path.unwrap_or_default(),
        };
        match req.execute(&self.inner.registry).await {
            Ok(l) => {
                let mut text = format!(
                    "{} in session \"{session}\": {} entries{}\n",
                    if l.path.is_empty() { "." } else { l.path.as_str() },
                    l.entries.len(),
                    if l.truncated { " (more exist)" } else { "" }
                );
                for e in &l.entries {
                    let kind = match e.kind {
                        FileKind::File => "file",
                        FileKind::Dir => "dir",
                        FileKind::Symlink => "symlink",
                        FileKind::Other => "other",
                    };
                    text.push_str(&format!("{}  {kind}  {} bytes\n", e.path, e.size));
                }
                Ok(text_result(text, json!(l)))
            }
            Err(e) => Ok(request_tool_error("list_files failed", &e)),
        }
    }
}
