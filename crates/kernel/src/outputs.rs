//! Turning worker MIME bundles into result bundles: binary data saved as
//! files in the session directory, text redacted.

use std::fs;
use std::path::Path;

use base64::Engine;
use cellhost_capture::Redactor;
use serde_json::{Map, Value, json};

use crate::result::MimeBundle;

/// MIME types whose data is base64 in frames and a file on the host.
pub(crate) const BINARY_MIMES: &[(&str, &str)] =
    &[("image/png", "png"), ("image/jpeg", "jpg"), ("image/gif", "gif")];

/// Rewrites a bundle from the worker: binary entries become
/// `{"path", "bytes"}` (file `<dir>/<stem>.<ext>`), strings are redacted.
/// A binary entry that is not valid base64 or cannot be written becomes
/// `{"error": "..."}` rather than failing the cell.
pub(crate) fn save_bundle(
    data: Map<String, Value>,
    dir: &Path,
    stem: &str,
    redactor: &Redactor,
) -> MimeBundle {
    let mut out = Map::new();
    for (mime, value) in data {
        if let Some((_, ext)) = BINARY_MIMES.iter().find(|(m, _)| *m == mime) {
            let saved = value
                .as_str()
                .ok_or_else(|| "not a base64 string".to_string())
                .and_then(|s| {
                    base64::engine::general_purpose::STANDARD
                        .decode(s.trim())
                        .map_err(|e| e.to_string())
                })
                .and_then(|bytes| {
                    fs::create_dir_all(dir).map_err(|e| e.to_string())?;
                    let path = dir.join(format!("{stem}.{ext}"));
                    fs::write(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
                    Ok(json!({"path": path, "bytes": bytes.len()}))
                });
            out.insert(mime, saved.unwrap_or_else(|e| json!({"error": e})));
            continue;
        }
        out.insert(mime, redact_value(value, redactor));
    }
    out
}

/// Redacts every string inside a JSON value.
pub(crate) fn redact_value(value: Value, redactor: &Redactor) -> Value {
    match value {
        Value::String(s) => Value::String(redactor.redact(&s).into_owned()),
        Value::Array(a) => Value::Array(a.into_iter().map(|v| redact_value(v, redactor)).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, redact_value(v, redactor)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_is_saved_and_referenced_text_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut m = Map::new();
        m.insert("image/png".into(), Value::String("iVBORw0KGgo=".into()));
        m.insert("text/plain".into(), Value::String("<Figure>".into()));
        let out = save_bundle(m, dir.path(), "display-1", &Redactor::disabled());
        let png = &out["image/png"];
        assert_eq!(png["bytes"], 8);
        let path = png["path"].as_str().expect("path");
        assert_eq!(std::fs::read(path).expect("file"), b"\x89PNG\r\n\x1a\n");
        assert_eq!(out["text/plain"], "<Figure>");
    }

    #[test]
    fn bad_base64_is_an_error_entry_not_a_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut m = Map::new();
        m.insert("image/png".into(), Value::String("%%%".into()));
        let out = save_bundle(m, dir.path(), "d", &Redactor::disabled());
        assert!(out["image/png"]["error"].is_string());
    }
}
