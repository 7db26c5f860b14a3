//! Percent-format scripts (`# %%` cells).

mod common;

use cellhost_notebook::{InputKind, Notebook};
use serde_json::{Value, json};

/// `(cell_type, source, title)` of every cell.
fn cells(nb: &Notebook) -> Vec<(String, String, Option<String>)> {
    nb.as_json()["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .map(|c| {
            (
                c["cell_type"].as_str().unwrap_or("?").to_string(),
                c["source"].as_str().unwrap_or("?").to_string(),
                c["metadata"]["title"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn cell(kind: &str, source: &str, title: Option<&str>) -> (String, String, Option<String>) {
    (kind.into(), source.into(), title.map(str::to_string))
}

#[test]
fn markers_markdown_and_titles() {
    let text = "\
# %% [markdown]
# # Penguins
#
# Load and *summarise*.

# %% Load the data
import pandas as pd
df = pd.DataFrame({'a': [1, 2]})


# %%
df.describe()

# %% [raw]
# raw text
";
    let nb = Notebook::from_percent_str(text);
    assert_eq!(
        cells(&nb),
        vec![
            cell("markdown", "# Penguins\n\nLoad and *summarise*.", None),
            cell(
                "code",
                "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})",
                Some("Load the data")
            ),
            cell("code", "df.describe()", None),
            cell("raw", "raw text", None),
        ]
    );
    let code = nb.code_cells();
    assert_eq!(code.iter().map(|c| c.index).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn text_before_the_first_marker_is_a_code_cell_if_not_blank() {
    let nb = Notebook::from_percent_str("import os\nx = 1\n\n# %%\nprint(x)\n");
    assert_eq!(
        cells(&nb),
        vec![
            cell("code", "import os\nx = 1", None),
            cell("code", "print(x)", None)
        ]
    );
    let nb = Notebook::from_percent_str("\n   \n\n# %%\nprint(x)\n");
    assert_eq!(cells(&nb), vec![cell("code", "print(x)", None)]);
}

#[test]
fn a_script_without_markers_is_one_cell() {
    let nb = Notebook::from_percent_str("print('hello')\n");
    assert_eq!(cells(&nb), vec![cell("code", "print('hello')", None)]);
    assert_eq!(Notebook::from_percent_str("").cell_count(), 0);
    assert_eq!(Notebook::from_percent_str("\n\n").cell_count(), 0);
}

#[test]
fn crlf_line_endings() {
    let nb = Notebook::from_percent_str("# %%\r\nx = 1\r\ny = 2\r\n\r\n# %% [markdown]\r\n# Title\r\n");
    assert_eq!(
        cells(&nb),
        vec![
            cell("code", "x = 1\ny = 2", None),
            cell("markdown", "Title", None)
        ]
    );
    assert!(!nb.to_json_string().contains("\\r"));
}

#[test]
fn blank_lines_are_trimmed_at_cell_ends_only() {
    let nb = Notebook::from_percent_str("# %%\n\n\ndef f():\n\n    return 1\n   \n\t\n\n# %%\n\n");
    assert_eq!(
        cells(&nb),
        vec![
            cell("code", "def f():\n\n    return 1", None),
            cell("code", "", None)
        ]
    );
    // An empty cell is still a code cell, reported as blank.
    let code = nb.code_cells();
    assert_eq!(code.len(), 2);
    assert!(!code[0].is_blank());
    assert!(code[1].is_blank());
}

#[test]
fn look_alike_markers_are_code() {
    let text = "# %%\nx = 1  # %% not a marker\n    # %% indented\n# %%time\n# %%%\n";
    let nb = Notebook::from_percent_str(text);
    assert_eq!(
        cells(&nb),
        vec![cell(
            "code",
            "x = 1  # %% not a marker\n    # %% indented\n# %%time\n# %%%",
            None
        )]
    );
}

#[test]
fn jupytext_header_is_not_a_cell() {
    let text = "\
# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     name: python3
# ---

# %%
x = 1
";
    let nb = Notebook::from_percent_str(text);
    assert_eq!(cells(&nb), vec![cell("code", "x = 1", None)]);
}

/// A `.R` percent script loads as an R notebook (IRkernel's kernelspec),
/// so `cellhost run script.R` runs it in R; after a run its language_info
/// is IRkernel's, not Python's.
#[test]
fn an_r_script_is_an_r_notebook() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("analysis.R");
    std::fs::write(&path, "# %%\nx <- 1\n# %%\nprint(x)\n").expect("write");
    let (mut nb, _) = Notebook::load(&path).expect("load");
    assert_eq!(nb.language().as_deref(), Some("r"));
    let root = nb.as_json();
    assert_eq!(root["metadata"]["kernelspec"]["name"], "ir");
    assert_eq!(root["metadata"]["language_info"]["name"], "R");
    assert_eq!(cells(&nb).len(), 2);
    nb.set_kernel_info("R version 4.2.2", "/usr/lib/R/bin/R");
    let info = &nb.as_json()["metadata"]["language_info"];
    assert_eq!(info["name"], "R");
    assert_eq!(info["file_extension"], ".r");
    assert_eq!(info["mimetype"], "text/x-r-source");
    let py = dir.path().join("analysis.py");
    std::fs::write(&py, "# %%\nx = 1\n").expect("write");
    assert_eq!(
        Notebook::load(&py).expect("load").0.language().as_deref(),
        Some("python")
    );
}

#[test]
fn a_fresh_nbformat_4_5_notebook_with_a_python_kernelspec() {
    let nb = Notebook::from_percent_str("# %%\na\n# %% [md]\n# b\n# %%\nc\n");
    let root = nb.as_json();
    assert_eq!(root["nbformat"], 4);
    assert_eq!(root["nbformat_minor"], 5);
    assert_eq!(root["metadata"]["kernelspec"]["name"], "python3");
    assert_eq!(root["metadata"]["kernelspec"]["language"], "python");
    assert_eq!(root["metadata"]["language_info"]["name"], "python");
    let all = root["cells"].as_array().expect("cells");
    let ids: Vec<&str> = all.iter().map(|c| c["id"].as_str().unwrap_or("?")).collect();
    assert_eq!(ids, ["cell-0", "cell-1", "cell-2"]);
    for c in all {
        assert_eq!(c["metadata"], json!({}));
        if c["cell_type"] == "code" {
            assert_eq!(c["outputs"], json!([]));
            assert_eq!(c["execution_count"], Value::Null);
        } else {
            assert!(c.get("outputs").is_none());
            assert!(c.get("execution_count").is_none());
        }
    }
}

#[test]
fn load_reads_py_files_as_percent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("analysis.py");
    std::fs::write(&path, "# %%\nprint(1)\n").expect("seed");
    let (nb, kind) = Notebook::load(&path).expect("loads");
    assert_eq!(kind, InputKind::Percent);
    assert_eq!(nb.code_cells()[0].source, "print(1)");
}
