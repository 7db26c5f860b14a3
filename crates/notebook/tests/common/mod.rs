//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cellhost_notebook::Output;
use serde_json::{Map, Value};

/// A fixture file's path.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fixture file's text.
pub fn fixture_text(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).expect("fixture is readable")
}

/// A JSON object literal as a `Map`.
pub fn map(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

/// A stream output.
pub fn stream(name: &str, text: &str) -> Output {
    Output::Stream {
        name: name.into(),
        text: text.into(),
    }
}

/// The interpreter named by `CELLHOST_TEST_PYTHON`, or `None` after
/// printing why the calling test is skipped.
pub fn test_python(test: &str) -> Option<PathBuf> {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => {
            eprintln!(
                "note: {test}: skipped the nbformat check, CELLHOST_TEST_PYTHON is not set \
                 (scripts/test.sh sets it to the venv's python)"
            );
            None
        }
    }
}

/// Checks a written notebook with the real nbformat package:
/// 1. the command CI documents,
///    `nbformat.validate(nbformat.read(FILE, as_version=4))`;
/// 2. the file exactly as written (lists of lines, no repair of ids),
///    with every nbformat warning turned into an error;
/// 3. nbformat writing the notebook back gives the same bytes.
///
/// Panics with the validator's output on failure.
pub fn nbformat_check(python: &Path, file: &Path) {
    if let Err(e) = nbformat_verdict(python, file) {
        panic!("{e}");
    }
}

/// [`nbformat_check`] as a `Result`: the validator's output on failure.
pub fn nbformat_verdict(python: &Path, file: &Path) -> Result<(), String> {
    run_python(
        python,
        "import nbformat,sys; nbformat.validate(nbformat.read(sys.argv[1], as_version=4))",
        file,
    )?;
    run_python(
        python,
        r#"
import json, sys, warnings
import nbformat
warnings.simplefilter("error")
with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
raw = json.loads(text)
nbformat.validate(raw)
nb = nbformat.reads(text, as_version=4)
nbformat.validate(nb)
ours, theirs = text, nbformat.writes(nb) + "\n"
if ours != theirs:
    import difflib
    sys.exit("layout differs from nbformat's writer:\n" + "".join(
        difflib.unified_diff(theirs.splitlines(True), ours.splitlines(True), "nbformat", "cellhost")))
"#,
        file,
    )
}

fn run_python(python: &Path, code: &str, file: &Path) -> Result<(), String> {
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(code)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "nbformat rejected {}:\nstdout:\n{}\nstderr:\n{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}
