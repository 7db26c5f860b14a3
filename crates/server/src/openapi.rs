//! The OpenAPI 3.1 document of the HTTP API, served at `/openapi.json`.
//!
//! Generated from the types (utoipa): the request and response structs of
//! [`crate::http`] and the kernel's `CellResult` derive their schemas, and
//! every handler carries its `#[utoipa::path]`. What every route shares is
//! added here once ([`Shared`]): the bearer scheme, and the error answers
//! the layers in front of the handlers give (401 on `/v1`, 403 on routes
//! that are not `GET`, 400/413/415/422 where a body is read, 422 where
//! parameters are parsed, 500). A test checks that the operations are
//! exactly the router's routes ([`crate::http::route_table`]).

use serde_json::Value;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::error::{ErrorBody, ErrorCode, ErrorDetail};
use crate::{http, http_notebook};

const DESCRIPTION: &str = "Persistent Python sessions for agents. Every /v1 route needs \
`Authorization: Bearer TOKEN`; a token stands for an owner, and owners never see each other's \
sessions (404, like a missing one). Read-only tokens may call GET routes only (403). JSON request \
bodies are limited to 4 MiB (413); a file written by PUT …/files/{path} is streamed, up to the \
server's `file_max_mb`. A session's variables persist across execute calls until it \
is restarted, deleted, or its kernel dies (the next result then says `kernel.state_reset`). \
Every error answer is `{\"error\": {\"code\", \"message\", ...fields}}` as application/json; the \
HTTP status follows from the code. A second execute on a busy session is refused with 409 \
`session_busy` unless its body says `\"queue\": true`.";

/// The document's generator.
#[derive(OpenApi)]
#[openapi(
    info(title = "cellhost HTTP API", description = DESCRIPTION),
    servers((url = "http://127.0.0.1:8787")),
    security(("bearer" = [])),
    paths(
        http::openapi_doc,
        http::create_session,
        http::list_sessions,
        http::delete_session,
        http::execute,
        http::interrupt,
        http::restart,
        crate::routes::fork::fork_session,
        http::variables,
        http::history,
        http::cell_output,
        crate::routes::files::list_files,
        crate::routes::files::write_file,
        crate::routes::files::read_file,
        crate::routes::files::delete_file,
        crate::routes::packages::install_packages,
        crate::routes::checkpoints::pause_session,
        crate::routes::checkpoints::checkpoint_session,
        crate::routes::displays::read_display,
        crate::routes::cells::submit_cell,
        crate::routes::cells::list_cells,
        crate::routes::cells::get_cell,
        crate::routes::cells::cancel_cell,
        crate::routes::cells::cell_events,
        http_notebook::run_notebook,
    ),
    components(schemas(ErrorBody, ErrorDetail, ErrorCode)),
    modifiers(&Shared),
)]
pub struct ApiDoc;

/// What every operation shares: the bearer scheme and the errors of the
/// layers in front of the handlers.
struct Shared;

fn error_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build(),
    )
}

fn add_errors(path: &str, method: &str, op: &mut Operation) {
    let r = &mut op.responses.responses;
    let mut add = |status: &str, desc: &str| {
        r.entry(status.to_string())
            .or_insert_with(|| error_response(desc));
    };
    if path.starts_with("/v1/") {
        add("401", "`unauthorized`: missing or unknown bearer token");
        add("500", "`internal`: a fault of the server");
        if method != "get" {
            add("403", "`forbidden`: a read-only token on a route that is not GET");
        }
    }
    let json_body = op
        .request_body
        .as_ref()
        .is_some_and(|b| b.content.contains_key("application/json"));
    if json_body {
        add("400", "`bad_request`: the body is not JSON, or could not be read");
        add("413", "`payload_too_large`: the body is over 4 MiB");
        add(
            "415",
            "`unsupported_media_type`: the body is not application/json",
        );
        add("422", "`invalid_request`: a value the document does not allow");
    }
    if op.parameters.as_ref().is_some_and(|p| !p.is_empty()) {
        add(
            "422",
            "`invalid_request`: a parameter the document does not allow",
        );
    }
}

impl Modify for Shared {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        if let Some(c) = doc.components.as_mut() {
            c.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
        }
        for (path, item) in doc.paths.paths.iter_mut() {
            let PathItem {
                get,
                put,
                post,
                delete,
                patch,
                ..
            } = item;
            for (method, op) in [
                ("get", get),
                ("put", put),
                ("post", post),
                ("delete", delete),
                ("patch", patch),
            ] {
                if let Some(op) = op.as_mut() {
                    add_errors(path, method, op);
                }
            }
        }
    }
}

/// The document, as served.
pub fn document() -> Value {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    serde_json::to_value(&doc).unwrap_or(Value::Null)
}
