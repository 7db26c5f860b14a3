//! Tool definitions that fit every MCP client, applied to *every* tool of a
//! router ([`fit_router`]), whatever module defines it:
//!
//! - no `["type", "null"]` unions (nor `anyOf`/`oneOf` with `{"type":
//!   "null"}`, nor `nullable`) in input or output schemas: an optional
//!   field is one that may be absent ([`portable`]). Strict-schema clients
//!   (the OpenAI Agents SDK) and the MCP Inspector's portability check
//!   reject the unions `schemars` writes for `Option<T>`;
//! - an `outputSchema` for every tool that returns `structuredContent`
//!   ([`output_schema`], or the tool-error envelope: [`or_tool_error`]),
//!   and results whose structured content matches
//!   it: `null` members of the objects the schema describes are dropped
//!   ([`conform`]), never members inside free-form maps (a MIME bundle
//!   keeps the data the cell produced);
//! - annotations ([`annotations`]): `readOnlyHint` for tools that only
//!   look, `destructiveHint` for those that drop state, `openWorldHint`
//!   false (a tool acts on the caller's own kernels only).
//!
//! A tool without an entry in [`output_schema`] or [`annotations`] fails
//! the crate's `every_tool_fits` test, so a new tool cannot ship without
//! them.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{JsonObject, ToolAnnotations};
use serde_json::{Map, Value, json};

/// Applies [`portable`], [`output_schema`] and [`annotations`] to every
/// tool of `router`.
pub fn fit_router<S>(router: &mut ToolRouter<S>) {
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        let mut input = Value::Object((*tool.input_schema).clone());
        portable(&mut input);
        if let Value::Object(m) = input {
            tool.input_schema = Arc::new(m);
        }
        let out = output_schema(&tool.name).or_else(|| {
            let mut out = Value::Object((*tool.output_schema.take()?).clone());
            portable(&mut out);
            match out {
                Value::Object(m) => Some(m),
                _ => None,
            }
        });
        tool.output_schema = out.map(|o| Arc::new(or_tool_error(o)));
        if let Some(a) = annotations(&tool.name) {
            tool.annotations = Some(a);
        }
    }
}

/// `schema`, or the envelope of a tool failure (`{"error": {"code",
/// "message", ...}}`, the structured content of an `isError` result):
/// clients validate the structured content of failures too (the MCP
/// Inspector, the TypeScript SDK). `schema`'s `$defs` move to the top, where
/// its references resolve.
pub fn or_tool_error(mut schema: JsonObject) -> JsonObject {
    let mut defs = match schema.remove("$defs") {
        Some(Value::Object(d)) => d,
        _ => Map::new(),
    };
    defs.insert(
        "ToolError".into(),
        json!({
            "type": "object",
            "description": "The tool failed (isError): the request layer's code and message.",
            "properties": {
                "error": {
                    "type": "object",
                    "properties": {
                        "code": {"type": "string", "description": "Stable error code (the HTTP API's)."},
                        "message": {"type": "string"}
                    },
                    "required": ["code", "message"],
                    "additionalProperties": true
                }
            },
            "required": ["error"]
        }),
    );
    let mut out = Map::new();
    out.insert("type".into(), json!("object"));
    out.insert(
        "anyOf".into(),
        json!([Value::Object(schema), {"$ref": "#/$defs/ToolError"}]),
    );
    out.insert("$defs".into(), Value::Object(defs));
    out
}

/// Removes every `null` alternative from `schema`, recursively: `"type":
/// ["string", "null"]` becomes `"type": "string"`, `anyOf`/`oneOf`
/// alternatives `{"type": "null"}` go (one left replaces the combinator),
/// `nullable` and `"default": null` go.
pub fn portable(schema: &mut Value) {
    match schema {
        Value::Object(m) => {
            if let Some(Value::Array(types)) = m.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    m.insert("type".into(), only);
                }
            }
            if m.get("default").is_some_and(Value::is_null) {
                m.remove("default");
            }
            m.remove("nullable");
            for key in ["anyOf", "oneOf"] {
                let Some(Value::Array(alts)) = m.get_mut(key) else {
                    continue;
                };
                alts.retain(|a| a.get("type") != Some(&json!("null")));
                if alts.len() == 1 {
                    let only = alts.remove(0);
                    m.remove(key);
                    if let Value::Object(o) = only {
                        for (k, v) in o {
                            m.entry(k).or_insert(v);
                        }
                    }
                }
            }
            for v in m.values_mut() {
                portable(v);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(portable),
        _ => {}
    }
}

/// Drops the `null` members of every object in `value` whose schema (in
/// `schema`, `$ref`s resolved against its `$defs`) declares that member
/// in `properties`: the portable schema has no `null`, so "absent" is how
/// such a value says "none". Members of free-form maps
/// (`additionalProperties`) are left as they are.
pub fn conform(value: &mut Value, schema: &Value) {
    let defs = schema.get("$defs").cloned().unwrap_or(Value::Null);
    conform_at(value, schema, &defs, 0);
}

fn conform_at(value: &mut Value, schema: &Value, defs: &Value, depth: u32) {
    // Schemas are ours and finite; the bound only stops a cyclic `$ref`.
    if depth > 64 {
        return;
    }
    let schema = resolve(schema, defs);
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = schema.get(key) {
            for alt in alts {
                conform_at(value, alt, defs, depth + 1);
            }
        }
    }
    match value {
        Value::Object(m) => {
            let Some(Value::Object(props)) = schema.get("properties") else {
                return;
            };
            m.retain(|k, v| !(v.is_null() && props.contains_key(k)));
            for (k, v) in m.iter_mut() {
                if let Some(p) = props.get(k) {
                    conform_at(v, p, defs, depth + 1);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for v in items {
                    conform_at(v, item, defs, depth + 1);
                }
            }
        }
        _ => {}
    }
}

fn resolve<'a>(schema: &'a Value, defs: &'a Value) -> &'a Value {
    let mut s = schema;
    for _ in 0..16 {
        let Some(name) = s
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"))
        else {
            break;
        };
        match defs.get(name) {
            Some(d) => s = d,
            None => break,
        }
    }
    s
}

/// The `outputSchema` of each tool by name (portable; `$defs` for shared
/// parts). `None` for a tool without structured content.
pub fn output_schema(tool: &str) -> Option<JsonObject> {
    let schema = match tool {
        "execute_code" => cell_result_schema(),
        "interrupt" => json!({
            "type": "object",
            "properties": {
                "delivered": {"type": "boolean", "description": "SIGINT reached the kernel's main thread."},
                "target": {"type": "string", "description": "pid/tid the signal was sent to."},
                "cell": {"type": "string", "description": "The cell the interrupt applies to."},
                "reason": {"type": "string", "description": "Why it was not delivered."}
            },
            "required": ["delivered"]
        }),
        "pause_session" => json!({
            "type": "object",
            "properties": {
                "session": {"type": "string", "description": "The session."},
                "generation": {"type": "integer", "description": "The kernel generation that was stopped."},
                "pid": {"type": "integer", "description": "The stopped worker's pid."},
                "memory_freed_bytes": {"type": "integer", "description": "Resident memory of the stopped worker, bytes."},
                "paused_ms": {"type": "integer", "description": "When, milliseconds since the Unix epoch."},
                "pause_ms": {"type": "integer", "description": "Wall time of the pause, milliseconds."},
                "checkpoint": {
                    "type": "object",
                    "description": "The checkpoint the session resumes from.",
                    "properties": {
                        "execution_count": {"type": "integer"},
                        "taken_ms": {"type": "integer"},
                        "bytes": {"type": "integer"},
                        "write_ms": {"type": "integer"},
                        "saved": {"type": "array", "items": {"type": "string"}},
                        "lost": {"type": "array", "items": {"type": "object", "properties": {
                            "name": {"type": "string"}, "type": {"type": "string"}, "reason": {"type": "string"}}}}
                    }
                }
            },
            "required": ["session", "generation", "pid", "checkpoint", "memory_freed_bytes", "paused_ms", "pause_ms"]
        }),
        "restart" => json!({
            "type": "object",
            "properties": {
                "session": {"type": "string"},
                "generation": {"type": "integer", "minimum": 0, "description": "The new kernel's generation."},
                "pid": {"type": "integer", "minimum": 0, "description": "The new kernel's pid."},
                "killed_previous": {"type": "boolean", "description": "A live kernel was killed first."}
            },
            "required": ["session", "generation", "pid", "killed_previous"]
        }),
        "fork_session" => json!({
            "type": "object",
            "properties": {
                "session": {"type": "string", "description": "The new session."},
                "parent": {"type": "string", "description": "The session it was forked from."},
                "parent_generation": {"type": "integer", "minimum": 0},
                "generation": {"type": "integer", "minimum": 0, "description": "The new kernel's generation."},
                "pid": {"type": "integer", "minimum": 0, "description": "The new kernel's pid."},
                "execution_count": {"type": "integer", "minimum": 0, "description": "The fork point: the new session counts on from it."},
                "names": {"type": "array", "items": {"type": "string"}, "description": "Names carried."},
                "lost": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Names not carried, with why."},
                "modules_failed": {"type": "object", "additionalProperties": {"type": "string"}},
                "threads_dropped": {"type": "array", "items": {"type": "string"}},
                "cwd": {"type": "string", "description": "The new session's working directory."},
                "files_copied": {"type": "integer", "minimum": 0},
                "bytes_copied": {"type": "integer", "minimum": 0},
                "skipped": {"type": "array", "items": {"type": "string"}},
                "snapshot_bytes": {"type": "integer", "minimum": 0},
                "duration_ms": {"type": "integer", "minimum": 0},
                "method": {"type": "string", "enum": ["cow", "pickle"], "description": "How the state was carried: cow (fork(2) of the parent's worker, pages shared copy-on-write) or pickle."},
                "pickle_reason": {"type": "string", "description": "Why pickle was used (absent for cow)."}
            },
            "required": ["session", "parent", "generation", "pid", "execution_count", "names", "lost"]
        }),
        "list_variables" => json!({
            "type": "object",
            "properties": {
                "variables": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "description": "One variable: name and type; where known len, shape, dtype, size_bytes, preview.",
                        "properties": {
                            "name": {"type": "string"},
                            "type": {"type": "string"}
                        },
                        "required": ["name", "type"],
                        "additionalProperties": true
                    }
                },
                "truncated": {"type": "boolean", "description": "More variables exist than were listed."}
            },
            "required": ["variables", "truncated"]
        }),
        "read_output" => json!({
            "type": "object",
            "properties": {
                "cell": {"type": "string"},
                "stream": {"type": "string", "enum": ["stdout", "stderr"]},
                "offset": {"type": "integer", "minimum": 0, "description": "Byte offset of `text`."},
                "next_offset": {"type": "integer", "minimum": 0, "description": "Where the next page starts; absent at the end."},
                "total_bytes": {"type": "integer", "minimum": 0},
                "text": {"type": "string"}
            },
            "required": ["cell", "stream", "offset", "total_bytes", "text"]
        }),
        "list_sessions" => json!({
            "type": "object",
            "properties": {
                "sessions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "session": {"type": "string"},
                            "generation": {"type": "integer", "minimum": 0},
                            "pid": {"type": "integer", "minimum": 0},
                            "busy": {"type": "boolean", "description": "A cell is running."},
                            "state": {"type": "string", "enum": ["live", "paused"], "description": "paused: the kernel was checkpointed and stopped; the next execute_code resumes it."},
                            "paused_ms": {"type": "integer", "description": "When it was paused, milliseconds since the Unix epoch."},
                            "checkpoint": {"type": "object", "description": "The checkpoint a paused session resumes from (execution_count, taken_ms, bytes, saved, lost, write_ms)."}
                        },
                        "required": ["session", "state", "generation", "pid", "busy"]
                    }
                }
            },
            "required": ["sessions"]
        }),
        "write_file" => schema_of::<cellhost_sessions::requests::FileWritten>(),
        "list_files" => schema_of::<cellhost_sessions::requests::FileListing>(),
        "submit_code" => schema_of::<cellhost_sessions::requests::Submitted>(),
        "install_packages" => schema_of::<cellhost_sessions::packages::InstallReport>(),
        // A done cell answers its result (the `execute_code` schema);
        // otherwise its snapshot so far.
        "get_cell" => {
            let mut result = cell_result_schema();
            let defs = result
                .as_object_mut()
                .and_then(|m| m.remove("$defs"))
                .unwrap_or_else(|| json!({}));
            json!({
                "type": "object",
                "$defs": defs,
                "anyOf": [
                    result,
                    {
                        "type": "object",
                        "properties": {
                            "cell": {"type": "string"},
                            "session": {"type": "string"},
                            "status": {"type": "string", "enum": ["queued", "running", "done", "failed", "cancelled"]},
                            "stdout": {"type": "string", "description": "Output so far (live, rendered, redacted)."},
                            "stderr": {"type": "string"},
                            "events": {"type": "integer", "minimum": 0, "description": "Events so far (the next event's offset)."},
                            "events_dropped": {"type": "integer", "minimum": 0},
                            "error": {"type": "object", "description": "Why the cell failed to run (code, message)."}
                        },
                        "required": ["cell", "session", "status", "stdout", "stderr", "events", "events_dropped"]
                    }
                ]
            })
        }
        "cancel_cell" => schema_of::<cellhost_sessions::requests::CellCancelled>(),
        "read_file" => json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Relative to the session's working directory."},
                "size": {"type": "integer", "minimum": 0, "description": "The whole file's size in bytes."},
                "offset": {"type": "integer", "minimum": 0},
                "length": {"type": "integer", "minimum": 0, "description": "Bytes in this answer."},
                "mtime_ms": {"type": "integer", "description": "Last modification, ms since the Unix epoch."},
                "next_offset": {"type": "integer", "minimum": 0, "description": "Where the next part starts; absent at the end."},
                "encoding": {"type": "string", "enum": ["text", "base64"]},
                "text": {"type": "string", "description": "The bytes as UTF-8 text (encoding text)."},
                "base64": {"type": "string", "description": "The bytes, base64 (encoding base64)."}
            },
            "required": ["path", "size", "offset", "length", "encoding"]
        }),
        "run_notebook" => json!({
            "type": "object",
            "properties": {
                "total": {"type": "integer", "minimum": 0, "description": "Code cells in the notebook."},
                "ran": {"type": "integer", "minimum": 0, "description": "Code cells that ran."},
                "stop": {
                    "type": "object",
                    "description": "Why the run stopped early; absent when every cell ran.",
                    "properties": {
                        "reason": {"type": "string"},
                        "cell": {"type": "integer", "minimum": 0},
                        "message": {"type": "string"},
                        "status": {"type": "string"}
                    },
                    "required": ["reason", "message"],
                    "additionalProperties": true
                },
                "notebook": {"type": "object", "description": "The executed notebook (nbformat 4)."},
                "output_path": {"type": "string", "description": "Where the executed notebook was written."}
            },
            "required": ["total", "ran", "notebook"]
        }),
        _ => return None,
    };
    match schema {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

/// The portable schema of a type with a `ToSchema` derive (the HTTP API's
/// own), its components in `$defs`.
fn schema_of<T: utoipa::ToSchema>() -> Value {
    use utoipa::PartialSchema;
    let mut parts = Vec::new();
    <T as utoipa::ToSchema>::schemas(&mut parts);
    let mut defs = Map::new();
    for (name, s) in parts {
        defs.insert(name, serde_json::to_value(s).unwrap_or(Value::Null));
    }
    let mut top = serde_json::to_value(<T as PartialSchema>::schema()).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut top
        && !defs.is_empty()
    {
        m.insert("$defs".into(), Value::Object(defs));
    }
    rewrite_refs(&mut top);
    portable(&mut top);
    top
}

/// The JSON Schema of a cell's result, from the same `ToSchema` derive
/// as the HTTP API's OpenAPI document, made portable: component
/// references point into `$defs`.
fn cell_result_schema() -> Value {
    static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(build_cell_result_schema).clone()
}

fn build_cell_result_schema() -> Value {
    schema_of::<cellhost_sessions::cell::CellResult>()
}

fn rewrite_refs(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref")
                && let Some(name) = r.strip_prefix("#/components/schemas/")
            {
                *r = format!("#/$defs/{name}");
            }
            m.values_mut().for_each(rewrite_refs);
        }
        Value::Array(a) => a.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// The annotations of each tool by name: a title, and the hints clients
/// use to decide what needs a confirmation. Every tool acts on the
/// caller's own kernels only (`openWorldHint: false`).
pub fn annotations(tool: &str) -> Option<ToolAnnotations> {
    // (title, read only, destructive, idempotent)
    let (title, read_only, destructive, idempotent) = match tool {
        "execute_code" => ("Run Python code", false, false, false),
        "interrupt" => ("Interrupt the running cell", false, false, true),
        "restart" => ("Restart the kernel", false, true, false),
        "fork_session" => ("Fork the session", false, false, false),
        "pause_session" => (
            "Pause the session (checkpoint, stop the kernel)",
            false,
            false,
            false,
        ),
        "list_variables" => ("List variables", true, false, true),
        "read_output" => ("Read a cell's full output", true, false, true),
        "list_sessions" => ("List sessions", true, false, true),
        "write_file" => ("Write a file into the session", false, true, true),
        "read_file" => ("Read a file of the session", true, false, true),
        "list_files" => ("List the session's files", true, false, true),
        "submit_code" => ("Run code in the background", false, false, false),
        "get_cell" => ("Status of a submitted cell", true, false, true),
        "cancel_cell" => ("Cancel a submitted cell", false, false, true),
        "run_notebook" => ("Run a notebook", false, false, false),
        "install_packages" => ("Install packages into the session", false, false, true),
        _ => return None,
    };
    let mut a = ToolAnnotations::with_title(title)
        .read_only(read_only)
        .open_world(false);
    if !read_only {
        a = a.destructive(destructive).idempotent(idempotent);
    }
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has_null(v: &Value) -> bool {
        match v {
            Value::Object(m) => {
                m.get("type").is_some_and(|t| {
                    t == "null" || t.as_array().is_some_and(|a| a.iter().any(|x| x == "null"))
                }) || m.contains_key("nullable")
                    || m.values().any(has_null)
            }
            Value::Array(a) => a.iter().any(has_null),
            _ => false,
        }
    }

    #[test]
    fn unions_with_null_go() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "a": {"type": ["string", "null"], "default": null},
                "b": {"anyOf": [{"$ref": "#/$defs/X"}, {"type": "null"}], "description": "d"},
                "c": {"oneOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}
            }
        });
        portable(&mut s);
        assert!(!has_null(&s), "{s}");
        assert_eq!(s["properties"]["a"], json!({"type": "string"}));
        assert_eq!(
            s["properties"]["b"],
            json!({"$ref": "#/$defs/X", "description": "d"})
        );
        assert_eq!(s["properties"]["c"]["oneOf"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn cell_result_schema_is_portable_and_resolvable() {
        let s = cell_result_schema();
        assert!(!has_null(&s), "{s}");
        assert!(!s.to_string().contains("#/components/"), "{s}");
        assert!(s["properties"]["status"].is_object(), "{s}");
        assert!(s["$defs"].as_object().is_some_and(|d| !d.is_empty()), "{s}");
    }

    #[test]
    fn conform_drops_declared_nulls_only() {
        let schema = json!({
            "type": "object",
            "properties": {
                "error": {"$ref": "#/$defs/E"},
                "result": {"type": "object", "additionalProperties": true},
                "items": {"type": "array", "items": {"$ref": "#/$defs/E"}}
            },
            "$defs": {"E": {"type": "object", "properties": {"x": {"type": "string"}}}}
        });
        let mut v = json!({
            "error": null,
            "result": {"application/json": {"k": null}},
            "items": [{"x": null, "y": null}]
        });
        conform(&mut v, &schema);
        assert_eq!(
            v,
            json!({"result": {"application/json": {"k": null}}, "items": [{"y": null}]})
        );
    }
}
