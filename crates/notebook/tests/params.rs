//! Papermill-style parameters: typing of `-p` values, the injected cell's
//! source and where it goes. The expected sources were produced by
//! papermill 2.7.0 itself (`_resolve_type` + `translate_parameters`,
//! black not installed); `injection_matches_papermill` compares against a
//! live papermill when `CELLHOST_TEST_PAPERMILL_PYTHON` (else
//! `CELLHOST_TEST_PYTHON`) names an interpreter that has it.

use std::process::Command;

use cellhost_notebook::{Notebook, ParamValue, Parameters, parameters_source};
use serde_json::{Value, json};

/// The `-p` values of the papermill reference run, in order.
const CLI_VALUES: &[&str] = &[
    "True",
    "None",
    "12",
    " +0012 ",
    "1_000",
    "1__0",
    "0.5",
    "1e3",
    ".5",
    "-Infinity",
    "nan",
    "1e",
    "0x10",
    "",
    "abc",
    "1e16",
    "1.5e-05",
    "123456789012345678901234567890",
    "a\"b'c\\d\ne\u{7f}\u{e9}\u{20ac}\u{1f600}",
    "3.0",
    "-0",
    "1e-7",
];

/// papermill 2.7.0's `translate_parameters("python3", "python", ...)` of
/// `{f"v{i}": _resolve_type(v)}` for [`CLI_VALUES`], then `lst` and `d`.
const PAPERMILL_SOURCE: &str = "# Parameters\nv0 = True\nv1 = None\nv2 = 12\nv3 = 12\nv4 = 1000\nv5 = \"1__0\"\nv6 = 0.5\nv7 = 1000.0\nv8 = 0.5\nv9 = float('-inf')\nv10 = float('nan')\nv11 = \"1e\"\nv12 = \"0x10\"\nv13 = \"\"\nv14 = \"abc\"\nv15 = 1e+16\nv16 = 1.5e-05\nv17 = 123456789012345678901234567890\nv18 = \"a\\\"b'c\\\\d\\ne\\x7f\\xe9\\u20ac\\U0001f600\"\nv19 = 3.0\nv20 = 0\nv21 = 1e-07\nlst = [1, 2.5, \"x\", None, True]\nd = {\"k\": True, \"1\": \"one\"}\n";

fn reference_parameters() -> Parameters {
    let mut p = Parameters::new();
    for (i, v) in CLI_VALUES.iter().enumerate() {
        p.set(&format!("v{i}"), ParamValue::from_cli(v))
            .expect("identifier");
    }
    let rest = Parameters::from_yaml_str("lst: [1, 2.5, x, null, true]\nd: {k: true, 1: one}\n", "ref.yaml")
        .expect("yaml");
    p.update(rest);
    p
}

#[test]
fn cli_values_and_source_match_papermill() {
    let p = reference_parameters();
    assert_eq!(p.python_source(), PAPERMILL_SOURCE);
    assert_eq!(parameters_source("python", &p).as_deref(), Some(PAPERMILL_SOURCE));
    assert_eq!(parameters_source("r", &p), None);
}

fn notebook(tagged: Option<usize>, injected: Option<usize>) -> Notebook {
    let mut cells = vec![
        json!({"cell_type": "markdown", "metadata": {}, "source": "# Title", "id": "md"}),
        json!({"cell_type": "code", "metadata": {}, "source": "alpha = 0.1\nname = 'x'", "id": "defaults",
               "outputs": [], "execution_count": null}),
        json!({"cell_type": "code", "metadata": {}, "source": "print(alpha, name)", "id": "use",
               "outputs": [], "execution_count": null}),
    ];
    if let Some(i) = tagged {
        cells[i]["metadata"]["tags"] = json!(["parameters"]);
    }
    if let Some(i) = injected {
        cells[i]["metadata"]["tags"] = json!(["injected-parameters"]);
    }
    let root = json!({
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    });
    Notebook::from_ipynb_str(&root.to_string()).expect("notebook")
}

/// (source, tags) of every cell.
fn shape(nb: &Notebook) -> Vec<(String, Value)> {
    nb.as_json()["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .map(|c| {
            (
                c["source"].as_str().unwrap_or_default().to_string(),
                c["metadata"].get("tags").cloned().unwrap_or(Value::Null),
            )
        })
        .collect()
}

fn params() -> Parameters {
    let mut p = Parameters::new();
    p.set("alpha", ParamValue::from_cli("0.6")).expect("name");
    p.set("name", ParamValue::from_cli("run 2")).expect("name");
    p
}

#[test]
fn injected_cell_goes_after_parameters_else_first_and_replaces_an_earlier_one() {
    let p = params();
    let src = p.python_source();
    assert_eq!(src, "# Parameters\nalpha = 0.6\nname = \"run 2\"\n");
    // After the cell tagged `parameters`.
    let mut nb = notebook(Some(1), None);
    assert_eq!(nb.inject_parameters(&p, &src), Some(2));
    let cells = shape(&nb);
    assert_eq!(cells.len(), 4);
    assert_eq!(cells[2], (src.clone(), json!(["injected-parameters"])));
    assert_eq!(nb.as_json()["cells"][2]["cell_type"], "code");
    assert_eq!(nb.as_json()["cells"][2]["id"], "injected-parameters");
    assert_eq!(
        nb.as_json()["metadata"]["papermill"]["parameters"],
        json!({"alpha": 0.6, "name": "run 2"})
    );
    // Injecting again replaces the injected cell.
    let mut again = Parameters::new();
    again.set("alpha", ParamValue::from_cli("1")).expect("name");
    let src2 = again.python_source();
    assert_eq!(nb.inject_parameters(&again, &src2), Some(2));
    assert_eq!(shape(&nb).len(), 4);
    assert_eq!(shape(&nb)[2].0, "# Parameters\nalpha = 1\n");
    // No `parameters` tag: first.
    let mut nb = notebook(None, None);
    assert_eq!(nb.inject_parameters(&p, &src), Some(0));
    assert_eq!(shape(&nb)[0].1, json!(["injected-parameters"]));
    // No parameters: nothing.
    let mut nb = notebook(Some(1), None);
    assert_eq!(nb.inject_parameters(&Parameters::new(), ""), None);
    assert_eq!(shape(&nb).len(), 3);
    // The written notebook is still valid (unique ids).
    let mut nb = notebook(Some(1), None);
    nb.inject_parameters(&p, &src);
    let text = nb.to_json_string();
    let back = Notebook::from_ipynb_str(&text).expect("reads back");
    assert_eq!(shape(&back), shape(&nb));
}

#[test]
fn percent_scripts_take_jupytext_parameters_tags() {
    let mut nb =
        Notebook::from_percent_str("# %% tags=[\"parameters\"]\nalpha = 0.1\n\n# %%\nprint(alpha)\n");
    let p = params();
    assert_eq!(nb.inject_parameters(&p, &p.python_source()), Some(1));
    let cells = shape(&nb);
    assert_eq!(cells[0], ("alpha = 0.1".to_string(), json!(["parameters"])));
    assert_eq!(cells[1].1, json!(["injected-parameters"]));
    assert_eq!(cells[2].0, "print(alpha)");
}

/// An interpreter that imports papermill: `CELLHOST_TEST_PAPERMILL_PYTHON`,
/// else `CELLHOST_TEST_PYTHON` when it has papermill.
fn papermill_python() -> Option<String> {
    ["CELLHOST_TEST_PAPERMILL_PYTHON", "CELLHOST_TEST_PYTHON"]
        .iter()
        .filter_map(|v| std::env::var(v).ok().filter(|p| !p.is_empty()))
        .find(|py| {
            Command::new(py)
                .args(["-c", "import papermill"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// The same notebooks through papermill's own loader and
/// `parameterize_notebook`: the same cells (source and tags) in the same
/// order (papermill's loader gives untagged cells `tags: []`, read here as
/// no tags).
#[test]
fn injection_matches_papermill() {
    let Some(python) = papermill_python() else {
        eprintln!(
            "skipped: neither CELLHOST_TEST_PAPERMILL_PYTHON nor CELLHOST_TEST_PYTHON has papermill: not comparing with it"
        );
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for (tagged, injected) in [(Some(1), None), (None, None), (Some(1), Some(2)), (Some(2), None)] {
        let nb = notebook(tagged, injected);
        let input = dir.path().join("in.ipynb");
        nb.write(&input).expect("write");
        let script = r#"
import json, sys
from papermill.iorw import load_notebook_node
from papermill.parameterize import parameterize_notebook
from papermill.cli import _resolve_type
nb = load_notebook_node(sys.argv[1])
params = {"alpha": _resolve_type("0.6"), "name": _resolve_type("run 2")}
nb = parameterize_notebook(nb, params)
print(json.dumps([[c.source, c.metadata.get("tags") or None] for c in nb.cells]))
print(json.dumps(nb.metadata.papermill["parameters"]))
"#;
        let out = Command::new(&python)
            .arg("-c")
            .arg(script)
            .arg(&input)
            .output()
            .expect("run papermill");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let mut lines = text.lines();
        let theirs: Vec<(String, Value)> = serde_json::from_str(lines.next().expect("cells")).expect("json");
        let their_params: Value = serde_json::from_str(lines.next().expect("params")).expect("json");
        let mut ours = nb.clone();
        let p = params();
        ours.inject_parameters(&p, &p.python_source());
        assert_eq!(shape(&ours), theirs, "tagged {tagged:?}, injected {injected:?}");
        assert_eq!(
            ours.as_json()["metadata"]["papermill"]["parameters"],
            their_params
        );
    }
    // And `-p` typing plus translation of the reference values.
    let script = r#"
import json, sys
from papermill.cli import _resolve_type
from papermill.translators import translate_parameters
params = {f"v{i}": _resolve_type(v) for i, v in enumerate(json.loads(sys.argv[1]))}
params["lst"] = [1, 2.5, "x", None, True]
params["d"] = {"k": True, 1: "one"}
sys.stdout.write(translate_parameters("python3", "python", params, "Parameters"))
"#;
    let out = Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(serde_json::to_string(CLI_VALUES).expect("json"))
        .output()
        .expect("run papermill");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        reference_parameters().python_source()
    );
}
