//! Turning worker MIME bundles into result bundles: binary data saved as
//! files in the session directory (unless it holds a registered secret),
//! text redacted and bounded, and every cell's displays kept within its
//! [`DisplayLimits`].

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use cellhost_capture::Redactor;
use serde_json::{Map, Value, json};

use crate::config::DisplayLimits;
use crate::result::{DisplayOutput, DisplaysDropped, MimeBundle};

/// MIME types whose data is base64 in frames and a file on the host.
pub(crate) const BINARY_MIMES: &[(&str, &str)] = &[
    ("image/png", "png"),
    ("image/jpeg", "jpg"),
    ("image/gif", "gif"),
    ("image/webp", "webp"),
    ("image/bmp", "bmp"),
    ("application/pdf", "pdf"),
];

/// Whether a result bundle's `mime` entry is a file the host saved
/// (`{"path", "bytes"}`, or `{"error"}`): only these entries' paths may be
/// read, never a path in any other entry (a worker can put any JSON there).
pub fn is_saved_file_mime(mime: &str) -> bool {
    BINARY_MIMES.iter().any(|(m, _)| *m == mime)
}

/// MIME types whose data is text (kept inline, redacted): `text/*`, JSON,
/// XML, SVG and JavaScript. Everything else is binary data (base64 in a
/// frame), which cannot be masked, only refused.
pub(crate) fn is_text_mime(mime: &str) -> bool {
    let m = mime.split(';').next().unwrap_or("").trim();
    m.starts_with("text/")
        || m.ends_with("+json")
        || m.ends_with("+xml")
        || matches!(
            m,
            "application/json" | "application/javascript" | "application/xml" | "application/x-latex"
        )
}

/// What became of a bundle from the worker.
#[derive(Debug)]
pub(crate) enum Saved {
    /// The bundle for the result: binary entries as `{"path", "bytes"}`,
    /// text redacted and bounded.
    Bundle(MimeBundle),
    /// A binary entry of this MIME type contained a registered secret:
    /// nothing of the bundle was written or is sent.
    Withheld(String),
}

/// One cell's display budget ([`DisplayLimits`]) and what it dropped.
#[derive(Debug)]
pub(crate) struct DisplayBudget {
    limits: DisplayLimits,
    kept: usize,
    bytes: u64,
    dropped: DisplaysDropped,
}

impl DisplayBudget {
    pub(crate) fn new(limits: DisplayLimits) -> Self {
        DisplayBudget {
            limits,
            kept: 0,
            bytes: 0,
            dropped: DisplaysDropped::default(),
        }
    }

    /// Charges a bundle of `size` bytes ([`bundle_size`]) when it fits the
    /// count and byte budget; otherwise tallies it as dropped and answers
    /// false (the caller must not save or send it).
    pub(crate) fn admit(&mut self, size: u64) -> bool {
        if self.kept >= self.limits.max_count || self.bytes.saturating_add(size) > self.limits.max_bytes {
            self.dropped.count += 1;
            self.dropped.bytes = self.dropped.bytes.saturating_add(size);
            return false;
        }
        self.kept += 1;
        self.bytes += size;
        true
    }

    /// Counts a display withheld for a secret.
    pub(crate) fn withheld(&mut self) {
        self.dropped.withheld += 1;
    }

    /// Displays kept so far (the file stem of the next one is this + 1).
    pub(crate) fn kept(&self) -> usize {
        self.kept
    }

    /// What was dropped or withheld, if anything.
    pub(crate) fn report(&self) -> Option<DisplaysDropped> {
        (!self.dropped.is_empty()).then(|| self.dropped.clone())
    }

    /// The note that ends the displays of a cell that lost some to the budget.
    pub(crate) fn drop_note(&self) -> Option<DisplayOutput> {
        let d = &self.dropped;
        (d.count > 0).then(|| {
            note(
                format!(
                    "[{} display(s) of {} bytes dropped: a cell keeps at most {} displays and {} bytes of display data]",
                    d.count, d.bytes, self.limits.max_count, self.limits.max_bytes
                ),
                "dropped",
            )
        })
    }
}

/// A `text/plain` display standing for data the host did not keep;
/// `metadata.cellhost.<why>` is `true`.
pub(crate) fn note(text: String, why: &str) -> DisplayOutput {
    let mut data = Map::new();
    data.insert("text/plain".into(), Value::String(text));
    let mut metadata = Map::new();
    metadata.insert("cellhost".into(), json!({ why: true }));
    DisplayOutput { data, metadata }
}

/// The note for a display withheld because its `mime` data held a secret.
pub(crate) fn withheld_note(mime: &str) -> DisplayOutput {
    note(
        format!("[display withheld: its {mime} data contained a registered secret]"),
        "withheld",
    )
}

/// Bytes a bundle and its metadata hold: every string's length plus 8 for
/// every other scalar (binary data counts as its base64 text, which is
/// more than the file it becomes).
pub(crate) fn bundle_size(data: &Map<String, Value>, metadata: &Map<String, Value>) -> u64 {
    data.iter()
        .chain(metadata.iter())
        .map(|(k, v)| k.len() as u64 + value_size(v))
        .sum()
}

/// Bytes of one JSON value as [`bundle_size`] counts them.
pub(crate) fn value_size(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.len() as u64,
        Value::Array(a) => a.iter().map(value_size).sum::<u64>() + 8,
        Value::Object(o) => o.iter().map(|(k, v)| k.len() as u64 + value_size(v)).sum::<u64>() + 8,
        _ => 8,
    }
}

/// Rewrites a bundle from the worker.
///
/// First every non-text entry is checked for a registered secret, in its
/// base64 text and in the decoded bytes: if one holds a secret nothing is
/// written and the answer is [`Saved::Withheld`]. Then binary entries of
/// [`BINARY_MIMES`] become `{"path", "bytes"}` (file `<dir>/<stem>.<ext>`;
/// an entry that is not valid base64 or cannot be written becomes
/// `{"error": "..."}` rather than failing the cell), and strings are
/// redacted; a text entry longer than `max_inline_text` bytes is replaced
/// by a note. Files are created below `root` (the session directory the
/// kernel can write) without following any link there
/// ([`cellhost_capture::hostfs::create_beneath`]); `dir` lies below it.
pub(crate) fn save_bundle(
    data: Map<String, Value>,
    root: &Path,
    dir: &Path,
    stem: &str,
    redactor: &Redactor,
    max_inline_text: usize,
) -> Saved {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let mut decoded: Vec<(String, Result<Vec<u8>, String>)> = Vec::new();
    for (mime, value) in &data {
        if is_text_mime(mime) {
            continue;
        }
        let Some(text) = value.as_str() else {
            continue;
        };
        if redactor.contains_secret(text.as_bytes()) {
            return Saved::Withheld(mime.clone());
        }
        let bytes = b64.decode(text.trim()).map_err(|e| e.to_string());
        if let Ok(b) = &bytes
            && redactor.contains_secret(b)
        {
            return Saved::Withheld(mime.clone());
        }
        if BINARY_MIMES.iter().any(|(m, _)| m == mime) {
            decoded.push((mime.clone(), bytes));
        }
    }
    let mut out = Map::new();
    for (mime, value) in data {
        if let Some((_, ext)) = BINARY_MIMES.iter().find(|(m, _)| *m == mime) {
            let bytes = match decoded.iter().position(|(m, _)| *m == mime) {
                Some(i) => decoded.swap_remove(i).1,
                None => Err("not a base64 string".to_string()),
            };
            let saved = bytes.and_then(|bytes| {
                let name = dir.join(format!("{stem}.{ext}"));
                let (root, rel) = match name.strip_prefix(root) {
                    Ok(rel) => (root, rel.to_path_buf()),
                    Err(_) => (dir, PathBuf::from(format!("{stem}.{ext}"))),
                };
                fs::create_dir_all(root).map_err(|e| e.to_string())?;
                let (mut f, path) = cellhost_capture::hostfs::create_beneath(root, &rel)
                    .map_err(|e| format!("{}: {e}", name.display()))?;
                f.write_all(&bytes)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Ok(json!({"path": path, "bytes": bytes.len()}))
            });
            out.insert(mime, saved.unwrap_or_else(|e| json!({"error": e})));
            continue;
        }
        // Binary data of other types is a base64 string; anything else
        // (an object such as `{"path": "/etc/shadow"}`) would look like a
        // file the host saved to whoever reads the bundle.
        if !is_text_mime(&mime) && !value.is_string() {
            out.insert(mime, json!({"error": "not a base64 string"}));
            continue;
        }
        let value = if value_size(&value) > max_inline_text as u64 {
            Value::String(format!(
                "[{mime} data not kept inline: more than {max_inline_text} bytes]"
            ))
        } else {
            redact_value(value, redactor)
        };
        out.insert(mime, value);
    }
    Saved::Bundle(out)
}

/// Redacts every string inside a JSON value (object keys too).
pub(crate) fn redact_value(value: Value, redactor: &Redactor) -> Value {
    match value {
        Value::String(s) => Value::String(redactor.redact(&s).into_owned()),
        Value::Array(a) => Value::Array(a.into_iter().map(|v| redact_value(v, redactor)).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (redactor.redact(&k).into_owned(), redact_value(v, redactor)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(pairs: &[(&str, &str)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), Value::String((*v).to_string())))
            .collect()
    }

    fn saved(s: Saved) -> MimeBundle {
        match s {
            Saved::Bundle(b) => b,
            Saved::Withheld(m) => panic!("withheld {m}"),
        }
    }

    #[test]
    fn png_is_saved_and_referenced_text_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = bundle(&[("image/png", "iVBORw0KGgo="), ("text/plain", "<Figure>")]);
        let out = saved(save_bundle(
            m,
            dir.path(),
            dir.path(),
            "display-1",
            &Redactor::disabled(),
            1 << 20,
        ));
        let png = &out["image/png"];
        assert_eq!(png["bytes"], 8);
        let path = png["path"].as_str().expect("path");
        assert_eq!(std::fs::read(path).expect("file"), b"\x89PNG\r\n\x1a\n");
        assert_eq!(out["text/plain"], "<Figure>");
    }

    #[test]
    fn bad_base64_is_an_error_entry_not_a_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = bundle(&[("image/png", "%%%")]);
        let out = saved(save_bundle(
            m,
            dir.path(),
            dir.path(),
            "d",
            &Redactor::disabled(),
            1 << 20,
        ));
        assert!(out["image/png"]["error"].is_string());
    }

    fn secret_redactor() -> Redactor {
        let mut r = Redactor::new(Default::default()).expect("redactor");
        r.add_secrets(["Zq7-very-secret-Value".to_string()]);
        r
    }

    #[test]
    fn binary_data_holding_a_secret_is_withheld_and_never_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = secret_redactor();
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend_from_slice(b"tEXtComment\0Zq7-very-secret-Value");
        let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
        for mime in ["image/png", "application/pdf", "application/octet-stream"] {
            let m = bundle(&[(mime, &b64), ("text/plain", "<Figure>")]);
            match save_bundle(m, dir.path(), dir.path(), "display-1", &r, 1 << 20) {
                Saved::Withheld(got) => assert_eq!(got, mime),
                Saved::Bundle(b) => panic!("{mime} kept: {b:?}"),
            }
        }
        // The base64 text itself carrying the value is refused too.
        let m = bundle(&[("image/gif", "Zq7-very-secret-Value")]);
        assert!(matches!(
            save_bundle(m, dir.path(), dir.path(), "d", &r, 1 << 20),
            Saved::Withheld(_)
        ));
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            0,
            "nothing written"
        );
        // Text is masked, not withheld.
        let m = bundle(&[("text/html", "<b>Zq7-very-secret-Value</b>")]);
        let out = saved(save_bundle(m, dir.path(), dir.path(), "d", &r, 1 << 20));
        assert!(!out["text/html"].as_str().expect("html").contains("very-secret"));
    }

    #[test]
    fn long_inline_text_is_replaced_by_a_note() {
        let dir = tempfile::tempdir().expect("tempdir");
        let big = "x".repeat(5000);
        let m = bundle(&[("text/html", &big), ("text/plain", "ok")]);
        let out = saved(save_bundle(
            m,
            dir.path(),
            dir.path(),
            "d",
            &Redactor::disabled(),
            4096,
        ));
        assert_eq!(out["text/plain"], "ok");
        let html = out["text/html"].as_str().expect("note");
        assert!(html.contains("not kept inline") && html.len() < 200, "{html}");
    }

    #[test]
    fn budget_drops_past_count_and_bytes_and_says_so() {
        let mut b = DisplayBudget::new(DisplayLimits {
            max_count: 2,
            max_bytes: 100,
            max_inline_text: 10,
        });
        assert!(b.admit(40));
        assert!(!b.admit(70), "over the bytes");
        assert!(b.admit(60));
        assert!(!b.admit(0), "over the count");
        let d = b.report().expect("dropped");
        assert_eq!((d.count, d.bytes, d.withheld), (2, 70, 0));
        let note = b.drop_note().expect("note");
        assert!(
            note.data["text/plain"]
                .as_str()
                .expect("text")
                .contains("2 display(s) of 70 bytes")
        );
    }
}
