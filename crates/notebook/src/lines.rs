//! Multi-line strings as nbformat stores them.
//!
//! On disk, nbformat allows a multi-line string to be a string or a list of
//! strings. In memory this crate keeps the joined string (as nbformat's
//! `rejoin_lines` does on read) and splits it again on write the way
//! nbformat's `split_lines` does, so a notebook saved by Jupyter comes back
//! out byte for byte.

use serde_json::{Map, Value};

/// Splits like Python's `str.splitlines(keepends=True)`: every line keeps
/// its terminator; the last line has none if the text does not end with one.
pub(crate) fn split_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if !is_line_break(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        if c == '\r'
            && let Some(&(_, '\n')) = chars.peek()
        {
            chars.next();
            end += 1;
        }
        lines.push(text[start..end].to_string());
        start = end;
    }
    if start < text.len() {
        lines.push(text[start..].to_string());
    }
    lines
}

/// The line boundaries of Python's `str.splitlines`.
fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// `value` as a multi-line string: a string, or a list of strings joined.
/// `None` for anything else.
pub(crate) fn join_multiline(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => {
            let mut joined = String::new();
            for item in items {
                joined.push_str(item.as_str()?);
            }
            Some(joined)
        }
        _ => None,
    }
}

/// A string as the list of its lines (JSON form).
pub(crate) fn lines_value(text: &str) -> Value {
    Value::Array(split_lines(text).into_iter().map(Value::String).collect())
}

/// Whether a MIME type holds JSON (left as JSON, never joined or split):
/// `application/json` and `application/*+json`.
pub(crate) fn is_json_mime(mime: &str) -> bool {
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// Whether nbformat writes values of this MIME type as a list of lines.
pub(crate) fn is_split_mime(mime: &str) -> bool {
    mime.starts_with("text/") || mime == "image/svg+xml" || mime == "application/javascript"
}

/// Rejoins the list-of-lines values of a MIME bundle in place (nbformat's
/// `_rejoin_mimebundle`).
pub(crate) fn rejoin_bundle(bundle: &mut Map<String, Value>) {
    for (mime, value) in bundle.iter_mut() {
        if !is_json_mime(mime)
            && value.is_array()
            && let Some(joined) = join_multiline(value)
        {
            *value = Value::String(joined);
        }
    }
}

/// Splits the text values of a MIME bundle into lines in place (nbformat's
/// `_split_mimebundle`).
pub(crate) fn split_bundle(bundle: &mut Map<String, Value>) {
    for (mime, value) in bundle.iter_mut() {
        if is_split_mime(mime)
            && let Value::String(s) = value
        {
            *value = lines_value(s);
        }
    }
}

/// A MIME bundle from a kernel, in the form the schema requires: JSON types
/// hold JSON (a string that parses as a JSON object or array becomes that
/// value), every other type holds a string (lists of strings are joined,
/// other JSON values become their JSON text).
pub(crate) fn normalize_bundle(data: Map<String, Value>) -> Map<String, Value> {
    data.into_iter()
        .map(|(mime, value)| {
            let value = if is_json_mime(&mime) {
                match value {
                    Value::String(s) => match serde_json::from_str::<Value>(&s) {
                        Ok(parsed @ (Value::Object(_) | Value::Array(_))) => parsed,
                        _ => Value::String(s),
                    },
                    other => other,
                }
            } else {
                match value {
                    Value::String(s) => Value::String(s),
                    other => match join_multiline(&other) {
                        Some(joined) => Value::String(joined),
                        None => Value::String(other.to_string()),
                    },
                }
            };
            (mime, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_lines_keeps_terminators_like_python() {
        assert_eq!(split_lines(""), Vec::<String>::new());
        assert_eq!(split_lines("a"), vec!["a"]);
        assert_eq!(split_lines("a\n"), vec!["a\n"]);
        assert_eq!(split_lines("a\nb"), vec!["a\n", "b"]);
        assert_eq!(split_lines("a\r\nb\rc\n\n"), vec!["a\r\n", "b\r", "c\n", "\n"]);
        assert_eq!(split_lines("x\u{2028}y\x0cz"), vec!["x\u{2028}", "y\x0c", "z"]);
        assert_eq!(split_lines("é\nü"), vec!["é\n", "ü"]);
    }

    #[test]
    fn split_then_join_is_identity() {
        for s in ["", "a", "\n\n", "a\r\n\rb", "tail\r", "x\u{85}y"] {
            let joined: String = split_lines(s).concat();
            assert_eq!(joined, s);
        }
    }

    #[test]
    fn join_multiline_rejects_non_strings() {
        assert_eq!(
            join_multiline(&serde_json::json!(["a\n", "b"])).as_deref(),
            Some("a\nb")
        );
        assert_eq!(join_multiline(&serde_json::json!("a")).as_deref(), Some("a"));
        assert_eq!(join_multiline(&serde_json::json!(["a", 1])), None);
        assert_eq!(join_multiline(&serde_json::json!(3)), None);
    }

    #[test]
    fn bundles_normalize_by_mime_type() {
        let data = serde_json::json!({
            "text/plain": ["a\n", "b"],
            "application/json": "{\"k\": [1, 2]}",
            "application/vnd.custom+json": "plain string",
            "image/png": "iVBORw0KGgo=",
            "text/x-number": 5,
        });
        let Value::Object(map) = data else {
            panic!("object")
        };
        let out = normalize_bundle(map);
        assert_eq!(out["text/plain"], "a\nb");
        assert_eq!(out["application/json"], serde_json::json!({"k": [1, 2]}));
        assert_eq!(out["application/vnd.custom+json"], "plain string");
        assert_eq!(out["image/png"], "iVBORw0KGgo=");
        assert_eq!(out["text/x-number"], "5");
    }
}
