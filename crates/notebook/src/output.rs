//! Code cell outputs.

use serde_json::{Map, Value, json};

use crate::lines::{join_multiline, normalize_bundle, rejoin_bundle};

/// One output of a code cell, as nbformat 4 stores it.
///
/// MIME bundles (`data`) map a MIME type to its value: text types hold a
/// string, `image/png` a base64 string, `application/json` (and
/// `application/*+json`) any JSON value. [`Output::to_json`] normalizes a
/// bundle to that form; writing the notebook splits text types into lines
/// the way Jupyter does.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Text written to a stream.
    Stream {
        /// The stream: `stdout` or `stderr`.
        name: String,
        /// The text, lines joined.
        text: String,
    },
    /// The value of the cell's last expression.
    ExecuteResult {
        /// The execution count of the cell that produced it.
        execution_count: u64,
        /// The MIME bundle.
        data: Map<String, Value>,
        /// Per-MIME-type metadata (e.g. image sizes).
        metadata: Map<String, Value>,
    },
    /// A value shown during the cell (`display()`, figures).
    DisplayData {
        /// The MIME bundle.
        data: Map<String, Value>,
        /// Per-MIME-type metadata (e.g. image sizes).
        metadata: Map<String, Value>,
    },
    /// The exception that ended the cell.
    Error {
        /// The exception's class name.
        ename: String,
        /// The exception's message.
        evalue: String,
        /// The traceback, one entry per frame or line.
        traceback: Vec<String>,
    },
}

impl Output {
    /// The nbformat JSON object of this output, with its MIME bundle
    /// normalized: a JSON MIME type given as a string that parses as a JSON
    /// object or array holds the parsed value; any other MIME type holds a
    /// string (a list of strings is joined, another JSON value becomes its
    /// JSON text).
    pub fn to_json(&self) -> Value {
        match self {
            Output::Stream { name, text } => json!({
                "output_type": "stream",
                "name": name,
                "text": text,
            }),
            Output::ExecuteResult {
                execution_count,
                data,
                metadata,
            } => json!({
                "output_type": "execute_result",
                "execution_count": execution_count,
                "data": normalize_bundle(data.clone()),
                "metadata": metadata,
            }),
            Output::DisplayData { data, metadata } => json!({
                "output_type": "display_data",
                "data": normalize_bundle(data.clone()),
                "metadata": metadata,
            }),
            Output::Error {
                ename,
                evalue,
                traceback,
            } => json!({
                "output_type": "error",
                "ename": ename,
                "evalue": evalue,
                "traceback": traceback,
            }),
        }
    }

    /// Reads an nbformat output object (multi-line strings may be strings
    /// or lists of strings). `None` when it is not one of the four output
    /// types or lacks a required field; missing `metadata` reads as empty,
    /// a null `execution_count` as 0.
    pub fn from_json(value: &Value) -> Option<Output> {
        let obj = value.as_object()?;
        let bundle = |key: &str| -> Option<Map<String, Value>> {
            let mut map = obj.get(key)?.as_object()?.clone();
            rejoin_bundle(&mut map);
            Some(map)
        };
        let metadata = || -> Option<Map<String, Value>> {
            match obj.get("metadata") {
                None => Some(Map::new()),
                Some(m) => m.as_object().cloned(),
            }
        };
        match obj.get("output_type")?.as_str()? {
            "stream" => Some(Output::Stream {
                name: obj.get("name")?.as_str()?.to_string(),
                text: join_multiline(obj.get("text")?)?,
            }),
            "execute_result" => Some(Output::ExecuteResult {
                execution_count: match obj.get("execution_count") {
                    None | Some(Value::Null) => 0,
                    Some(n) => n.as_u64()?,
                },
                data: bundle("data")?,
                metadata: metadata()?,
            }),
            "display_data" => Some(Output::DisplayData {
                data: bundle("data")?,
                metadata: metadata()?,
            }),
            "error" => Some(Output::Error {
                ename: obj.get("ename")?.as_str()?.to_string(),
                evalue: obj.get("evalue")?.as_str()?.to_string(),
                traceback: obj
                    .get("traceback")?
                    .as_array()?
                    .iter()
                    .map(|line| line.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()?,
            }),
            _ => None,
        }
    }
}

/// Joins adjacent [`Output::Stream`]s of the same stream into one, as
/// Jupyter front ends do, and drops streams with empty text. Every other
/// output keeps its place; a stream of another name or any other output
/// between two streams keeps them apart.
pub fn merge_streams(outputs: Vec<Output>) -> Vec<Output> {
    let mut merged: Vec<Output> = Vec::with_capacity(outputs.len());
    for output in outputs {
        match output {
            Output::Stream { name, text } => {
                if text.is_empty() {
                    continue;
                }
                if let Some(Output::Stream {
                    name: last_name,
                    text: last_text,
                }) = merged.last_mut()
                    && *last_name == name
                {
                    last_text.push_str(&text);
                    continue;
                }
                merged.push(Output::Stream { name, text });
            }
            other => merged.push(other),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(name: &str, text: &str) -> Output {
        Output::Stream {
            name: name.into(),
            text: text.into(),
        }
    }

    #[test]
    fn merge_joins_adjacent_same_name_only() {
        let err = Output::Error {
            ename: "E".into(),
            evalue: "v".into(),
            traceback: vec![],
        };
        let merged = merge_streams(vec![
            stream("stdout", "a\n"),
            stream("stdout", "b"),
            stream("stderr", "x"),
            stream("stdout", ""),
            stream("stderr", "y\n"),
            stream("stdout", "c"),
            err.clone(),
            stream("stdout", "d"),
        ]);
        assert_eq!(
            merged,
            vec![
                stream("stdout", "a\nb"),
                stream("stderr", "xy\n"),
                stream("stdout", "c"),
                err,
                stream("stdout", "d"),
            ]
        );
        assert!(merge_streams(vec![stream("stdout", "")]).is_empty());
    }

    #[test]
    fn to_json_and_back() {
        let mut data = Map::new();
        data.insert("text/plain".into(), json!(["1\n", "2"]));
        data.insert("application/json".into(), json!("[1, 2]"));
        let mut metadata = Map::new();
        metadata.insert("isolated".into(), json!(true));
        let out = Output::ExecuteResult {
            execution_count: 3,
            data,
            metadata: metadata.clone(),
        };
        let value = out.to_json();
        assert_eq!(value["output_type"], "execute_result");
        assert_eq!(value["data"]["text/plain"], "1\n2");
        assert_eq!(value["data"]["application/json"], json!([1, 2]));
        let back = Output::from_json(&value);
        let mut expected = Map::new();
        expected.insert("text/plain".into(), json!("1\n2"));
        expected.insert("application/json".into(), json!([1, 2]));
        assert_eq!(
            back,
            Some(Output::ExecuteResult {
                execution_count: 3,
                data: expected,
                metadata,
            })
        );
        for o in [
            stream("stderr", "warn\n"),
            Output::Error {
                ename: "ValueError".into(),
                evalue: "bad".into(),
                traceback: vec!["Traceback".into(), "ValueError: bad".into()],
            },
            Output::DisplayData {
                data: Map::new(),
                metadata: Map::new(),
            },
        ] {
            assert_eq!(Output::from_json(&o.to_json()), Some(o));
        }
        assert_eq!(Output::from_json(&json!({"output_type": "other"})), None);
        assert_eq!(Output::from_json(&json!({"output_type": "stream"})), None);
        assert_eq!(Output::from_json(&json!(["not", "an", "object"])), None);
    }
}
