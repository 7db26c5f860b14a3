//! `GET /v1/sessions/{name}/displays/{id}`: the image of one display of a
//! cell the caller ran (the id is `<cell>.<n>` for its `n`-th display, or
//! `<cell>.result` for its last expression's value), as the bytes of its
//! MIME type. Results of `execute` carry this URL in each image's entry
//! (`images: "url"`, the default).

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cellhost_sessions::requests::ReadDisplayRequest;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::{ApiError, ApiPath, ErrorBody};
use crate::http::{AppState, owned};
use crate::routes::files::FileBytes;

/// A display of a session named in the path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DisplayPath {
    /// The session's name.
    #[param(pattern = "^[A-Za-z0-9._-]{1,64}$", min_length = 1, max_length = 64)]
    pub name: String,
    /// The display's id: `<cell>.<n>` or `<cell>.result`.
    #[param(min_length = 1, max_length = 200)]
    pub id: String,
}

/// The URL of display `id` of session `name`.
pub fn display_url(name: &str, id: &str) -> String {
    format!("/v1/sessions/{name}/displays/{}", super::encode_path(id))
}

/// The image of a display (its own MIME type).
#[utoipa::path(get, path = "/v1/sessions/{name}/displays/{id}", operation_id = "readDisplay", tag = "cells",
    params(DisplayPath),
    responses(
        (status = 200, description = "the image", content(
            (FileBytes = "image/png"), (FileBytes = "image/jpeg"), (FileBytes = "image/gif"),
            (FileBytes = "image/webp"), (FileBytes = "application/octet-stream"))),
        (status = 404, description = "`session_not_found` or `display_not_found`", body = ErrorBody),
    ))]
pub(crate) async fn read_display(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(DisplayPath { name, id }): ApiPath<DisplayPath>,
) -> Result<Response, ApiError> {
    let (owner, _) = owned(&st, &caller, &name)?;
    let (d, f) = ReadDisplayRequest {
        owner,
        session: name,
        id,
    }
    .execute(st.registry())?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(d.bytes);
    let mime = match d.mime.as_str() {
        m @ ("image/png" | "image/jpeg" | "image/gif" | "image/webp") => m.to_string(),
        _ => "application/octet-stream".to_string(),
    };
    let mut r = (
        StatusCode::OK,
        super::reader_body(tokio::fs::File::from_std(f), len),
    )
        .into_response();
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&mime) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    Ok(r)
}

/// How `execute` returns the images of a result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImagesMode {
    /// Each image entry (`{"path", "bytes"}`) also carries `url`, the
    /// display's `GET /v1/sessions/{name}/displays/{id}` (default).
    #[default]
    Url,
    /// Each image entry is its base64 text, as in a Jupyter bundle.
    Inline,
    /// Image entries are left out (the bundle keeps its text types).
    None,
}

/// Rewrites the image entries of `r`'s displays and result bundle for
/// `mode` (`name` is the session, `owner` the caller's owner).
pub(crate) fn render_images(
    r: &mut cellhost_sessions::cell::CellResult,
    st: &AppState,
    owner: &str,
    name: &str,
    mode: ImagesMode,
) {
    use base64::Engine as _;
    use cellhost_sessions::cell_index::{bundle_images, display_id};
    let cell = r.cell_id.clone();
    let mut bundles: Vec<(String, &mut serde_json::Map<String, serde_json::Value>)> = r
        .displays
        .iter_mut()
        .enumerate()
        .map(|(i, d)| (display_id(&cell, Some(i)), &mut d.data))
        .collect();
    if let Some(b) = r.result.as_mut() {
        bundles.push((display_id(&cell, None), b));
    }
    for (id, bundle) in bundles {
        let images: Vec<String> = bundle_images(bundle).into_iter().map(|d| d.mime).collect();
        for mime in images {
            match mode {
                ImagesMode::Url => {
                    if let Some(serde_json::Value::Object(e)) = bundle.get_mut(&mime) {
                        e.insert("url".into(), display_url(name, &id).into());
                    }
                }
                ImagesMode::None => {
                    bundle.remove(&mime);
                }
                ImagesMode::Inline => {
                    let read = ReadDisplayRequest {
                        owner: owner.to_string(),
                        session: name.to_string(),
                        id: id.clone(),
                    }
                    .execute(st.registry())
                    .ok()
                    .and_then(|(_, mut f)| {
                        let mut buf = Vec::new();
                        std::io::Read::read_to_end(&mut f, &mut buf).ok().map(|_| buf)
                    });
                    match read {
                        Some(bytes) => {
                            bundle.insert(
                                mime,
                                base64::engine::general_purpose::STANDARD.encode(bytes).into(),
                            );
                        }
                        None => {
                            if let Some(serde_json::Value::Object(e)) = bundle.get_mut(&mime) {
                                e.insert("error".into(), "the image file is no longer readable".into());
                            }
                        }
                    }
                }
            }
        }
    }
}
