//! Reading, editing and writing `.ipynb` notebooks.

mod common;

use cellhost_notebook::{CodeCell, InputKind, Notebook, NotebookError, Output};
use common::{fixture, fixture_text, map, stream};
use serde_json::{Value, json};

#[test]
fn jupyter_written_notebook_round_trips_byte_for_byte() {
    let (nb, kind) = Notebook::load(&fixture("jupyter_written.ipynb")).expect("loads");
    assert_eq!(kind, InputKind::Ipynb);
    assert_eq!(nb.to_json_string(), fixture_text("jupyter_written.ipynb"));
}

#[test]
fn round_trip_keeps_cells_metadata_and_unknown_fields() {
    let (nb, _) = Notebook::load(&fixture("jupyter_written.ipynb")).expect("loads");
    let root = nb.as_json();
    assert_eq!(
        root["metadata"]["custom_tool"],
        json!({"setting": [1, 2.5, null, true]})
    );
    assert_eq!(root["metadata"]["authors"], json!([{"name": "Ada"}]));
    let cells = root["cells"].as_array().expect("cells");
    let types: Vec<&str> = cells
        .iter()
        .map(|c| c["cell_type"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(types, ["markdown", "raw", "code", "code", "code"]);
    assert_eq!(cells[0]["source"], "# Penguins ünïcode 🐧\n\nSome *text*.\n");
    assert_eq!(cells[0]["metadata"]["tags"], json!(["doc"]));
    assert!(cells[0]["attachments"]["logo.png"]["image/png"].is_string());
    assert_eq!(cells[1]["metadata"]["format"], "text/restructuredtext");
    assert_eq!(cells[2]["metadata"]["jupyter"]["source_hidden"], false);
    assert_eq!(nb.cell_count(), 5);

    // Through a file and back: same JSON.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("copy.ipynb");
    nb.write(&path).expect("writes");
    let (again, _) = Notebook::load(&path).expect("reloads");
    assert_eq!(again, nb);
}

#[test]
fn code_cells_give_indexes_among_all_cells() {
    let (nb, _) = Notebook::load(&fixture("jupyter_written.ipynb")).expect("loads");
    let cells = nb.code_cells();
    assert_eq!(
        cells,
        vec![
            CodeCell {
                index: 2,
                source: "import sys\nprint('hi')\n1 + 1".into()
            },
            CodeCell {
                index: 3,
                source: String::new()
            },
            CodeCell {
                index: 4,
                source: "# only a comment\n".into()
            },
        ]
    );
    assert!(!cells[0].is_blank());
    assert!(cells[1].is_blank());
    assert!(
        CodeCell {
            index: 0,
            source: " \n\t\n".into()
        }
        .is_blank()
    );
}

#[test]
fn sources_may_be_strings_or_lists() {
    let text = r#"{
      "nbformat": 4, "nbformat_minor": 5, "metadata": {},
      "cells": [
        {"cell_type": "code", "id": "a", "metadata": {}, "execution_count": null, "outputs": [],
         "source": "x = 1\ny = 2\n"},
        {"cell_type": "code", "id": "b", "metadata": {}, "execution_count": null, "outputs": [],
         "source": ["x = 1\n", "y = 2\n"]},
        {"cell_type": "code", "id": "c", "metadata": {}, "execution_count": null, "outputs": [],
         "source": "single line"},
        {"cell_type": "markdown", "id": "d", "metadata": {}, "source": []},
        {"cell_type": "code", "id": "e", "metadata": {}, "execution_count": 7, "outputs": [
          {"output_type": "stream", "name": "stdout", "text": ["a\n", "b"]},
          {"output_type": "execute_result", "execution_count": 7, "metadata": {},
           "data": {"text/plain": ["1\n", "2"], "image/png": ["iVBOR\n", "w0K"], "application/json": ["keep", "list"]}}
        ], "source": ""}
      ]
    }"#;
    let nb = Notebook::from_ipynb_str(text).expect("parses");
    let cells = nb.code_cells();
    assert_eq!(cells[0].source, "x = 1\ny = 2\n");
    assert_eq!(cells[1].source, cells[0].source);
    assert_eq!(cells[2].source, "single line");

    // Written the way Jupyter writes: lists of lines, each keeping its \n.
    let written: Value = serde_json::from_str(&nb.to_json_string()).expect("valid JSON");
    let c = &written["cells"];
    assert_eq!(c[0]["source"], json!(["x = 1\n", "y = 2\n"]));
    assert_eq!(c[1]["source"], json!(["x = 1\n", "y = 2\n"]));
    assert_eq!(c[2]["source"], json!(["single line"]));
    assert_eq!(c[3]["source"], json!([]));
    assert_eq!(c[4]["outputs"][0]["text"], json!(["a\n", "b"]));
    let data = &c[4]["outputs"][1]["data"];
    assert_eq!(data["text/plain"], json!(["1\n", "2"]));
    // Non-text MIME values are one string; JSON values are left alone.
    assert_eq!(data["image/png"], json!("iVBOR\nw0K"));
    assert_eq!(data["application/json"], json!(["keep", "list"]));
}

#[test]
fn output_is_pretty_with_one_space_and_a_trailing_newline() {
    let nb = Notebook::from_percent_str("x = 1\n");
    let text = nb.to_json_string();
    assert!(text.starts_with("{\n \"cells\": [\n  {\n   \"cell_type\": \"code\",\n"));
    assert!(text.ends_with("}\n"));
    assert!(!text.ends_with("}\n\n"));
}

#[test]
fn nbformat_4_4_is_upgraded_with_stable_ids() {
    let (nb, _) = Notebook::load(&fixture("v4_4_no_ids.ipynb")).expect("loads");
    let root = nb.as_json();
    assert_eq!(root["nbformat"], 4);
    assert_eq!(root["nbformat_minor"], 5);
    let ids: Vec<&str> = root["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .map(|c| c["id"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(ids, ["cell-0", "cell-1", "cell-2"]);
    // Transient fields are dropped as nbformat does on read.
    assert!(root["metadata"].get("orig_nbformat").is_none());
    assert!(root["cells"][1]["metadata"].get("trusted").is_none());
    // Outputs of cells that are not re-run are kept.
    assert_eq!(root["cells"][1]["outputs"][0]["text"], "one\ntwo\n");
    assert_eq!(root["cells"][1]["execution_count"], 3);
    // Loading twice gives the same ids.
    let (again, _) = Notebook::load(&fixture("v4_4_no_ids.ipynb")).expect("loads");
    assert_eq!(again, nb);
}

#[test]
fn missing_invalid_and_duplicate_ids_are_replaced() {
    let text = r#"{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "id": "same", "metadata": {}, "source": ""},
        {"cell_type": "markdown", "id": "same", "metadata": {}, "source": ""},
        {"cell_type": "markdown", "id": "not valid!", "metadata": {}, "source": ""},
        {"cell_type": "markdown", "metadata": {}, "source": ""},
        {"cell_type": "markdown", "id": "cell-3", "metadata": {}, "source": ""}
    ]}"#;
    let nb = Notebook::from_ipynb_str(text).expect("parses");
    let ids: Vec<&str> = nb.as_json()["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .map(|c| c["id"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(ids, ["same", "cell-1", "cell-2", "cell-3-1", "cell-3"]);
}

#[test]
fn missing_optional_structure_is_filled_in() {
    let text = r#"{"nbformat": 4, "nbformat_minor": 2, "cells": [
        {"cell_type": "code", "source": "1"}
    ]}"#;
    let nb = Notebook::from_ipynb_str(text).expect("parses");
    let root = nb.as_json();
    assert_eq!(root["metadata"], json!({}));
    assert_eq!(root["cells"][0]["metadata"], json!({}));
    assert_eq!(root["cells"][0]["outputs"], json!([]));
    assert_eq!(root["cells"][0]["execution_count"], Value::Null);
}

#[test]
fn set_outputs_clear_outputs_and_kernel_info() {
    let (mut nb, _) = Notebook::load(&fixture("jupyter_written.ipynb")).expect("loads");
    nb.clear_outputs();
    for cell in nb.as_json()["cells"].as_array().expect("cells") {
        if cell["cell_type"] == "code" {
            assert_eq!(cell["outputs"], json!([]));
            assert_eq!(cell["execution_count"], Value::Null);
        } else {
            assert!(cell.get("outputs").is_none());
        }
    }
    nb.set_outputs(
        2,
        Some(1),
        vec![
            stream("stdout", "hi\n"),
            Output::ExecuteResult {
                execution_count: 1,
                data: map(json!({"text/plain": "2"})),
                metadata: map(json!({})),
            },
        ],
    )
    .expect("code cell");
    nb.set_outputs(3, None, vec![]).expect("code cell");
    let cell = &nb.as_json()["cells"][2];
    assert_eq!(cell["execution_count"], 1);
    assert_eq!(
        Output::from_json(&cell["outputs"][1]),
        Some(Output::ExecuteResult {
            execution_count: 1,
            data: map(json!({"text/plain": "2"})),
            metadata: map(json!({})),
        })
    );
    assert_eq!(nb.as_json()["cells"][3]["execution_count"], Value::Null);

    let err = nb.set_outputs(0, Some(1), vec![]).expect_err("markdown");
    assert!(matches!(err, NotebookError::NotCodeCell { index: 0, ref cell_type } if cell_type == "markdown"));
    assert_eq!(err.to_string(), "cell 0 is a markdown cell, not a code cell");
    let err = nb.set_outputs(99, Some(1), vec![]).expect_err("no such cell");
    assert!(matches!(err, NotebookError::NoSuchCell { index: 99, len: 5 }));

    nb.set_kernel_info("3.12.1", "/opt/venv/bin/python3");
    let meta = &nb.as_json()["metadata"];
    // The notebook's own kernelspec and language_info are kept; the
    // version becomes the interpreter's, missing fields are filled in.
    assert_eq!(
        meta["kernelspec"],
        json!({"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"})
    );
    assert_eq!(
        meta["language_info"],
        json!({
            "codemirror_mode": {"name": "ipython", "version": 3},
            "name": "python",
            "version": "3.12.1",
            "file_extension": ".py",
            "mimetype": "text/x-python",
        })
    );
    assert_eq!(meta["cellhost"]["python"], "/opt/venv/bin/python3");
    // Other metadata is untouched.
    assert_eq!(meta["custom_tool"], json!({"setting": [1, 2.5, null, true]}));
}

#[test]
fn write_is_atomic_and_keeps_permissions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("out.ipynb");
    std::fs::write(&path, "old contents").expect("seed");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    }
    let nb = Notebook::from_percent_str("# %%\nprint(1)\n");
    nb.write(&path).expect("writes");
    assert_eq!(
        std::fs::read_to_string(&path).expect("reads"),
        nb.to_json_string()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["out.ipynb"], "no temporary file is left behind");

    let err = nb
        .write(&dir.path().join("missing-dir/out.ipynb"))
        .expect_err("no such directory");
    assert!(matches!(err, NotebookError::Write { .. }));
    assert!(err.to_string().contains("missing-dir/out.ipynb"), "{err}");
}

#[test]
fn invalid_json_names_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("broken.ipynb");
    std::fs::write(&path, "{\"cells\": [\n  {,}\n").expect("seed");
    let err = Notebook::load(&path).expect_err("invalid JSON");
    assert!(matches!(err, NotebookError::InvalidJson { .. }));
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("line 2"), "{msg}");

    let err = Notebook::from_ipynb_str("not json").expect_err("invalid JSON");
    assert!(err.to_string().starts_with("<string>: "), "{err}");

    std::fs::write(&path, "").expect("seed");
    let err = Notebook::load(&path).expect_err("empty");
    assert!(err.to_string().contains("broken.ipynb"), "{err}");
    assert!(err.to_string().contains("empty"), "{err}");
}

#[test]
fn nbformat_3_names_the_file_and_the_version() {
    let path = fixture("v3.ipynb");
    let err = Notebook::load(&path).expect_err("v3 is refused");
    assert!(matches!(err, NotebookError::UnsupportedVersion { ref version, .. } if version == "3"));
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("nbformat 3"), "{msg}");
    assert!(msg.contains("nbformat 4"), "{msg}");

    for (text, version) in [
        (r#"{"nbformat": 5, "cells": []}"#, "5"),
        (r#"{"nbformat": 2}"#, "2"),
    ] {
        let err = Notebook::from_ipynb_str(text).expect_err("not v4");
        assert!(matches!(err, NotebookError::UnsupportedVersion { version: ref v, .. } if v == version));
    }
}

#[test]
fn structural_errors_name_the_field() {
    let cases = [
        ("[]", "top level"),
        (r#"{"cells": []}"#, "\"nbformat\""),
        (r#"{"nbformat": "4", "cells": []}"#, "\"nbformat\""),
        (
            r#"{"nbformat": 4, "nbformat_minor": -1, "cells": []}"#,
            "nbformat_minor",
        ),
        (r#"{"nbformat": 4, "nbformat_minor": 5}"#, "\"cells\""),
        (
            r#"{"nbformat": 4, "nbformat_minor": 5, "cells": {}}"#,
            "\"cells\"",
        ),
        (
            r#"{"nbformat": 4, "nbformat_minor": 5, "metadata": [], "cells": []}"#,
            "\"metadata\"",
        ),
        (
            r#"{"nbformat": 4, "nbformat_minor": 5, "cells": [1]}"#,
            "cells[0]",
        ),
        (
            r#"{"nbformat": 4, "nbformat_minor": 5, "cells": [{"cell_type": "heading", "source": ""}]}"#,
            "cells[0].cell_type",
        ),
        (
            r#"{"nbformat": 4, "nbformat_minor": 5, "cells": [{"cell_type": "code"}]}"#,
            "cells[0] has no source",
        ),
        (
            r#"{"nbformat": 4, "nbformat_minor": 5, "cells": [{"cell_type": "code", "source": ["a", 1]}]}"#,
            "cells[0].source",
        ),
        (
            r#"{"nbformat": 4, "nbformat_minor": 5, "cells": [{"cell_type": "code", "source": "", "execution_count": "1"}]}"#,
            "cells[0].execution_count",
        ),
        (
            r#"{"nbformat": 4, "nbformat_minor": 5, "cells": [{"cell_type": "code", "source": "", "outputs": [{}]}]}"#,
            "cells[0].outputs[0]",
        ),
    ];
    for (text, needle) in cases {
        let err = Notebook::from_ipynb_str(text).expect_err(text);
        assert!(matches!(err, NotebookError::Malformed { .. }), "{text}: {err:?}");
        assert!(err.to_string().contains(needle), "{text}: {err}");
    }
}

#[test]
fn load_chooses_by_extension_and_reports_io_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let txt = dir.path().join("notes.txt");
    std::fs::write(&txt, "x").expect("seed");
    let err = Notebook::load(&txt).expect_err("unsupported");
    assert!(matches!(err, NotebookError::UnsupportedExtension { .. }));
    assert!(err.to_string().contains("notes.txt"), "{err}");

    let missing = dir.path().join("missing.ipynb");
    let err = Notebook::load(&missing).expect_err("missing");
    assert!(matches!(err, NotebookError::Read { .. }));
    assert!(err.to_string().contains("missing.ipynb"), "{err}");

    let upper = dir.path().join("UPPER.IPYNB");
    std::fs::copy(fixture("v4_4_no_ids.ipynb"), &upper).expect("copy");
    assert_eq!(Notebook::load(&upper).expect("loads").1, InputKind::Ipynb);

    let latin1 = dir.path().join("latin1.py");
    std::fs::write(&latin1, b"# %%\nprint('caf\xe9')\n").expect("seed");
    let err = Notebook::load(&latin1).expect_err("not UTF-8");
    assert!(
        matches!(err, NotebookError::NotUtf8 { valid_up_to: 15, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("latin1.py"), "{err}");
}

#[test]
fn byte_order_mark_is_ignored() {
    let text = format!("\u{feff}{}", fixture_text("v4_4_no_ids.ipynb"));
    let nb = Notebook::from_ipynb_str(&text).expect("parses");
    assert_eq!(nb.cell_count(), 3);
}

#[test]
fn language_comes_from_kernelspec_then_language_info() {
    let nb = |meta: Value| {
        Notebook::from_ipynb_str(
            &json!({"cells": [], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}).to_string(),
        )
        .expect("notebook")
    };
    let r = nb(
        json!({"kernelspec": {"name": "ir", "display_name": "R", "language": "R"},
                      "language_info": {"name": "R", "version": "4.3.1"}}),
    );
    assert_eq!(r.language().as_deref(), Some("r"));
    assert_eq!(
        nb(json!({"language_info": {"name": "julia"}}))
            .language()
            .as_deref(),
        Some("julia")
    );
    assert_eq!(
        nb(json!({"kernelspec": {"language": " "}, "language_info": {"name": "python"}}))
            .language()
            .as_deref(),
        Some("python")
    );
    assert_eq!(nb(json!({})).language(), None);
    // A notebook without a kernelspec gets cellhost's.
    let mut bare = nb(json!({}));
    bare.set_kernel_info("3.11.4", "/usr/bin/python3");
    assert_eq!(
        bare.as_json()["metadata"]["kernelspec"],
        json!({"name": "python3", "display_name": "Python 3 (cellhost)", "language": "python"})
    );
    assert_eq!(bare.as_json()["metadata"]["language_info"]["name"], "python");
}
