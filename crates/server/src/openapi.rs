//! The OpenAPI 3.1 document of the HTTP API, served at `/openapi.json`.
//! Kept by hand; a test checks that its operations are exactly the
//! router's routes ([`crate::http::route_table`]).

use serde_json::{Value, json};

fn err(desc: &str) -> Value {
    json!({"description": desc, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

fn ok_json(desc: &str, schema: Value) -> Value {
    json!({"description": desc, "content": {"application/json": {"schema": schema}}})
}

fn name_param() -> Value {
    json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"}})
}

fn common_errors(mut responses: Value, with_404: bool) -> Value {
    if let Some(m) = responses.as_object_mut() {
        m.insert("401".into(), err("missing or invalid bearer token"));
        m.insert(
            "403".into(),
            err("the token is read-only and the route is not GET"),
        );
        if with_404 {
            m.insert(
                "404".into(),
                err("no such session for this token's owner (other owners' sessions are invisible)"),
            );
        }
    }
    responses
}

/// The document.
pub fn document() -> Value {
    let session_ref = json!({"$ref": "#/components/schemas/Session"});
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "cellhost HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Persistent Python sessions for agents. Every /v1 route needs `Authorization: Bearer TOKEN`; a token stands for an owner, and owners never see each other's sessions. Read-only tokens may call GET routes only. Request bodies are limited to 4 MiB (413 beyond). A session's variables persist across execute calls until it is restarted, deleted, or its kernel dies (the next result then says `kernel.state_reset`)."
        },
        "servers": [{"url": "http://127.0.0.1:8787"}],
        "security": [{"bearer": []}],
        "paths": {
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document (no auth)",
                    "security": [],
                    "responses": {"200": ok_json("the OpenAPI document", json!({"type": "object"}))}
                }
            },
            "/v1/sessions": {
                "post": {
                    "operationId": "createSession",
                    "summary": "Create a session and start its kernel",
                    "requestBody": {"required": false, "content": {"application/json": {"schema": {
                        "type": "object", "additionalProperties": false,
                        "properties": {"name": {"type": "string", "description": "default: a random name"}}
                    }}}},
                    "responses": common_errors(json!({
                        "201": ok_json("created", session_ref.clone()),
                        "400": err("bad name"),
                        "409": err("a session of this name exists"),
                        "413": err("body larger than 4 MiB"),
                        "429": err("too many sessions for this owner")
                    }), false)
                },
                "get": {
                    "operationId": "listSessions",
                    "summary": "The caller's sessions",
                    "responses": common_errors(json!({
                        "200": ok_json("sessions", json!({"type": "object", "properties": {"sessions": {"type": "array", "items": session_ref.clone()}}}))
                    }), false)
                }
            },
            "/v1/sessions/{name}": {
                "delete": {
                    "operationId": "deleteSession",
                    "summary": "Kill the session's kernel and forget the session",
                    "parameters": [name_param()],
                    "responses": common_errors(json!({"204": {"description": "deleted"}}), true)
                }
            },
            "/v1/sessions/{name}/execute": {
                "post": {
                    "operationId": "execute",
                    "summary": "Run a cell: wait for the CellResult, or stream server-sent events",
                    "description": "With `?stream=true` or `Accept: text/event-stream` the answer is an event stream: `stream` events `{name: stdout|stderr, text}` while the cell runs, `display` events (a MIME bundle, images as file references), then one `result` event with the CellResult (or an `error` event). Output beyond the inline limits is cut (head + tail) and spilled; page it with /v1/cells/{cell}/output/{stream}.",
                    "parameters": [name_param(), {"name": "stream", "in": "query", "required": false, "schema": {"type": "boolean"}}],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {
                        "type": "object", "additionalProperties": false, "required": ["code"],
                        "properties": {
                            "code": {"type": "string"},
                            "timeout_s": {"type": "number", "minimum": 0, "description": "deadline in seconds; 0 = none; default 300"}
                        }
                    }}}},
                    "responses": common_errors(json!({
                        "200": {
                            "description": "the cell's result (status ok, error, timeout, interrupted or crashed)",
                            "content": {
                                "application/json": {"schema": {"$ref": "#/components/schemas/CellResult"}},
                                "text/event-stream": {"schema": {"type": "string"}}
                            }
                        },
                        "400": err("bad body"),
                        "413": err("body larger than 4 MiB"),
                        "503": err("no room for another kernel, or shutting down")
                    }), true)
                }
            },
            "/v1/sessions/{name}/interrupt": {
                "post": {
                    "operationId": "interrupt",
                    "summary": "Interrupt the running cell (SIGINT to the worker's main thread; killed after a 2 s grace)",
                    "parameters": [name_param()],
                    "responses": common_errors(json!({
                        "200": ok_json("what the interrupt did", json!({"type": "object", "properties": {
                            "delivered": {"type": "boolean"}, "target": {"type": "string"}, "cell": {"type": "string"}, "reason": {"type": "string"}
                        }}))
                    }), true)
                }
            },
            "/v1/sessions/{name}/restart": {
                "post": {
                    "operationId": "restart",
                    "summary": "Kill the kernel and start a new one (all state is lost)",
                    "parameters": [name_param()],
                    "responses": common_errors(json!({"200": ok_json("the new kernel", session_ref.clone())}), true)
                }
            },
            "/v1/sessions/{name}/variables": {
                "get": {
                    "operationId": "variables",
                    "summary": "The session's user namespace (idle kernels only)",
                    "parameters": [name_param(), {"name": "limit", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1, "maximum": 500}}],
                    "responses": common_errors(json!({
                        "200": ok_json("variables", json!({"type": "object", "properties": {"variables": {"type": "array", "items": {"type": "object"}}, "truncated": {"type": "boolean"}}})),
                        "409": err("a cell is running")
                    }), true)
                }
            },
            "/v1/sessions/{name}/history": {
                "get": {
                    "operationId": "history",
                    "summary": "The session's journaled cells, oldest first",
                    "parameters": [name_param()],
                    "responses": common_errors(json!({
                        "200": ok_json("cells", json!({"type": "object", "properties": {"cells": {"type": "array", "items": {"type": "object"}}, "journal": {"type": "boolean"}}}))
                    }), true)
                }
            },
            "/v1/cells/{cell}/output/{stream}": {
                "get": {
                    "operationId": "cellOutput",
                    "summary": "Page through a cell's spilled output by byte offset (the caller's own cells only)",
                    "parameters": [
                        {"name": "cell", "in": "path", "required": true, "schema": {"type": "string"}},
                        {"name": "stream", "in": "path", "required": true, "schema": {"type": "string", "enum": ["stdout", "stderr"]}},
                        {"name": "offset", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 0}},
                        {"name": "length", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1, "description": "default 65536, at most 16 MiB"}}
                    ],
                    "responses": common_errors(json!({
                        "200": ok_json("a chunk, cut to whole characters", json!({"type": "object", "properties": {
                            "text": {"type": "string"}, "offset": {"type": "integer"}, "next_offset": {"type": ["integer", "null"]}, "total_bytes": {"type": "integer"}
                        }})),
                        "416": err("offset beyond the end")
                    }), true)
                }
            }
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
                "Session": {"type": "object", "required": ["name", "alive"], "properties": {
                    "name": {"type": "string"}, "alive": {"type": "boolean"}, "busy": {"type": "boolean"},
                    "generation": {"type": "integer"}, "pid": {"type": "integer"}, "python": {"type": "string"}
                }},
                "CellResult": {"type": "object", "required": ["cell_id", "status", "execution_count", "stdout", "stderr", "kernel", "duration_ms"], "properties": {
                    "cell_id": {"type": "string"},
                    "status": {"type": "string", "enum": ["ok", "error", "timeout", "interrupted", "crashed"]},
                    "execution_count": {"type": "integer"},
                    "stdout": {"type": "string"},
                    "stderr": {"type": "string"},
                    "result": {"type": ["object", "null"], "description": "MIME bundle of the last expression"},
                    "displays": {"type": "array", "items": {"type": "object"}},
                    "error": {"type": ["object", "null"], "properties": {"ename": {"type": "string"}, "evalue": {"type": "string"}, "traceback": {"type": "array", "items": {"type": "string"}}}},
                    "truncated": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                        "total_bytes": {"type": "integer"}, "shown_bytes": {"type": "integer"}, "omitted_bytes": {"type": "integer"}, "spill_path": {"type": ["string", "null"]}
                    }}},
                    "kernel": {"type": "object"},
                    "interrupt": {"type": "object"},
                    "crash": {"type": "object"},
                    "duration_ms": {"type": "integer"},
                    "usage": {"type": "object"},
                    "tool_calls": {"type": "array", "items": {"type": "object"}},
                    "background_output": {"type": "object"},
                    "cwd": {"type": "string"},
                    "hint": {"type": "string"}
                }}
            }
        }
    })
}
