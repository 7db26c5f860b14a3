//! Notebooks this crate writes are valid nbformat 4.5, checked with the
//! real `nbformat` package when `CELLHOST_TEST_PYTHON` names a Python that
//! has it (CI sets it; without it these tests print a note and check only
//! the JSON shape).

mod common;

use std::path::Path;

use cellhost_notebook::{Notebook, Output, merge_streams};
use common::{fixture, map, nbformat_check, nbformat_verdict, stream, test_python};
use serde_json::{Value, json};

/// A 1×1 PNG, base64.
const PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// A notebook from a percent script with outputs of every kind.
fn every_output_kind() -> Notebook {
    let script = "\
# %% [markdown]
# # Every output kind
#
# Ünïcode and an emoji 🐧.

# %% Streams
print('a')
print('b', file=sys.stderr)

# %% Rich
1 + 1

# %% Failing
1 / 0

# %% [raw]
# raw text

# %% Never run
x = 1

# %%
";
    let mut nb = Notebook::from_percent_str(script);
    nb.clear_outputs();
    nb.set_kernel_info("3.11.4", "/opt/venv/bin/python3");
    let cells = nb.code_cells();
    assert_eq!(cells.len(), 5);

    let streams = merge_streams(vec![
        stream("stdout", "a\n"),
        stream("stdout", "partial line, "),
        stream("stdout", "finished\r\nprogress 50%\rprogress 100%\n"),
        stream("stderr", "b\n\u{1b}[31mred\u{1b}[0m\n"),
        stream("stdout", "no final newline"),
    ]);
    assert_eq!(streams.len(), 3);
    nb.set_outputs(cells[0].index, Some(1), streams)
        .expect("code cell");

    let rich = vec![
        Output::DisplayData {
            data: map(json!({
                "image/png": PNG,
                "text/plain": "<Figure size 640x480 with 1 Axes>",
            })),
            metadata: map(json!({"image/png": {"width": 640, "height": 480}})),
        },
        Output::DisplayData {
            data: map(json!({
                "image/svg+xml": "<svg xmlns=\"http://www.w3.org/2000/svg\">\n<circle r=\"1\"/>\n</svg>\n",
                "text/plain": "<Drawing>",
            })),
            metadata: map(json!({})),
        },
        Output::DisplayData {
            // JSON given as text by a kernel becomes an object.
            data: map(json!({
                "application/json": "{\"rows\": [1, 2, 3], \"ok\": true}",
                "application/vnd.dataresource+json": {"schema": {"fields": []}, "data": []},
                "text/plain": ["{'rows': [1, 2, 3],\n", " 'ok': True}"],
            })),
            metadata: map(json!({"application/json": {"expanded": false}})),
        },
        Output::ExecuteResult {
            execution_count: 2,
            data: map(json!({
                "text/plain": "   a  b\n0  1  2\n1  3  4",
                "text/html": "<table>\n<tr><td>1</td></tr>\n</table>",
                "text/markdown": "**2**",
                "text/latex": "$2$",
                "image/png": PNG,
            })),
            metadata: map(json!({})),
        },
    ];
    nb.set_outputs(cells[1].index, Some(2), rich).expect("code cell");

    let failing = vec![
        stream("stdout", "before the error\n"),
        Output::Error {
            ename: "ZeroDivisionError".into(),
            evalue: "division by zero".into(),
            traceback: vec![
                "Traceback (most recent call last):".into(),
                "  File \"<cell 3>\", line 1, in <module>".into(),
                "ZeroDivisionError: division by zero".into(),
            ],
        },
    ];
    nb.set_outputs(cells[2].index, Some(3), failing)
        .expect("code cell");
    // cells[3] was never run: no outputs, null count. cells[4] is blank.
    nb.set_outputs(cells[4].index, None, vec![]).expect("code cell");
    nb
}

#[test]
fn every_output_kind_is_valid_nbformat() {
    let nb = every_output_kind();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("every-output.executed.ipynb");
    nb.write(&path).expect("writes");

    // The shape nbformat expects, checked here too so the test says
    // something without Python.
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("reads")).expect("JSON");
    assert_eq!(written["nbformat"], 4);
    assert_eq!(written["nbformat_minor"], 5);
    let cells = written["cells"].as_array().expect("cells");
    let streams = &cells[1]["outputs"];
    assert_eq!(streams[0]["output_type"], "stream");
    assert_eq!(
        streams[0]["text"],
        json!([
            "a\n",
            "partial line, finished\r\n",
            "progress 50%\r",
            "progress 100%\n"
        ])
    );
    assert_eq!(streams[1]["name"], "stderr");
    assert_eq!(streams[2]["text"], json!(["no final newline"]));
    let rich = &cells[2]["outputs"];
    assert_eq!(rich[0]["output_type"], "display_data");
    assert_eq!(rich[0]["data"]["image/png"], PNG);
    assert_eq!(
        rich[0]["data"]["text/plain"],
        json!(["<Figure size 640x480 with 1 Axes>"])
    );
    assert_eq!(rich[0]["metadata"]["image/png"]["width"], 640);
    assert!(rich[1]["data"]["image/svg+xml"].is_array());
    assert_eq!(
        rich[2]["data"]["application/json"],
        json!({"rows": [1, 2, 3], "ok": true})
    );
    assert!(rich[2]["data"]["application/vnd.dataresource+json"].is_object());
    assert_eq!(rich[3]["output_type"], "execute_result");
    assert_eq!(rich[3]["execution_count"], 2);
    assert_eq!(
        rich[3]["data"]["text/html"],
        json!(["<table>\n", "<tr><td>1</td></tr>\n", "</table>"])
    );
    assert_eq!(cells[3]["outputs"][1]["output_type"], "error");
    assert_eq!(cells[3]["execution_count"], 3);
    assert_eq!(cells[5]["execution_count"], Value::Null);
    assert_eq!(
        written["metadata"]["kernelspec"]["display_name"],
        "Python 3 (cellhost)"
    );

    // Reading it back gives the same notebook.
    let (again, _) = Notebook::load(&path).expect("reloads");
    assert_eq!(again, nb);

    if let Some(python) = test_python("every_output_kind_is_valid_nbformat") {
        nbformat_check(&python, &path);
    }
}

#[test]
fn upgraded_and_rerun_notebooks_are_valid_nbformat() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut written = Vec::new();
    for name in ["v4_4_no_ids.ipynb", "jupyter_written.ipynb"] {
        let (mut nb, _) = Notebook::load(&fixture(name)).expect("loads");
        let out = dir.path().join(name);
        nb.write(&out).expect("writes");
        written.push(out);

        // Re-run: new outputs on the first code cell, the rest cleared.
        nb.clear_outputs();
        let first = nb.code_cells()[0].index;
        nb.set_outputs(
            first,
            Some(1),
            vec![
                stream("stdout", "one\n"),
                Output::ExecuteResult {
                    execution_count: 1,
                    data: map(json!({"text/plain": "1"})),
                    metadata: map(json!({})),
                },
            ],
        )
        .expect("code cell");
        nb.set_kernel_info("3.12.1", "/usr/bin/python3");
        let out = dir.path().join(format!("rerun-{name}"));
        nb.write(&out).expect("writes");
        written.push(out);
    }
    let Some(python) = test_python("upgraded_and_rerun_notebooks_are_valid_nbformat") else {
        return;
    };
    for path in &written {
        nbformat_check(&python, path);
    }
}

#[test]
fn percent_notebooks_are_valid_nbformat() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("script.executed.ipynb");
    Notebook::from_percent_str("import os\n# %% [markdown]\n# hi\n# %% t\n\n")
        .write(&path)
        .expect("writes");
    let empty = dir.path().join("empty.ipynb");
    Notebook::from_percent_str("").write(&empty).expect("writes");
    if let Some(python) = test_python("percent_notebooks_are_valid_nbformat") {
        for p in [&path, &empty] {
            nbformat_check(&python, Path::new(p));
        }
    }
}

/// The check above is not vacuous: it rejects what nbformat rejects.
#[test]
fn the_nbformat_check_rejects_invalid_notebooks() {
    let Some(python) = test_python("the_nbformat_check_rejects_invalid_notebooks") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let good = every_output_kind().to_json_string();
    let cases = [
        // A code cell without its id.
        ("no-id", good.replacen("\"id\": \"cell-1\",", "", 1)),
        // Two cells with one id.
        (
            "dup-id",
            good.replacen("\"id\": \"cell-2\"", "\"id\": \"cell-1\"", 1),
        ),
        // An output type that does not exist.
        (
            "bad-output",
            good.replacen(
                "\"output_type\": \"display_data\"",
                "\"output_type\": \"figure\"",
                1,
            ),
        ),
        // Valid, but not laid out the way nbformat writes.
        ("layout", good.replacen("\n \"cells\"", "\n  \"cells\"", 1)),
    ];
    for (name, text) in cases {
        assert_ne!(text, good, "{name}: the edit applies");
        let path = dir.path().join(format!("{name}.ipynb"));
        std::fs::write(&path, text).expect("writes");
        assert!(nbformat_verdict(&python, &path).is_err(), "{name} was accepted");
    }
}
