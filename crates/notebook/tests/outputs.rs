//! Jupyter outputs of one cell's result: the order the inline backend
//! gives them.

use cellhost_kernel::CellResult;
use cellhost_notebook::executor::to_outputs;
use cellhost_notebook::{Output, Quiet};

fn result(extra: serde_json::Value) -> CellResult {
    let mut base = serde_json::json!({
        "cell_id": "c1", "status": "ok", "execution_count": 3,
        "stdout": "", "stderr": "", "duration_ms": 0, "error": null,
        "result": {"text/plain": "[<matplotlib.lines.Line2D at 0x7f>]"},
        "displays": [
            {"data": {"text/plain": "shown by display()"}, "metadata": {}},
            {"data": {"text/plain": "<Figure size 640x480 with 1 Axes>"}, "metadata": {}},
        ],
        "kernel": {"session": "s", "generation": 1, "pid": 1, "reused": false,
                   "state_reset": false, "sandbox": {"mode": "off"}},
    });
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    serde_json::from_value(base).expect("a cell result")
}

fn kinds(outputs: &[Output]) -> Vec<String> {
    outputs
        .iter()
        .map(|o| match o {
            Output::ExecuteResult { .. } => "execute_result".to_string(),
            Output::DisplayData { data, .. } => data
                .get("text/plain")
                .and_then(|v| v.as_str())
                .unwrap_or("display")
                .to_string(),
            other => format!("{other:?}"),
        })
        .collect()
}

/// `plt.plot(...)` as a cell's last line: its value comes before the
/// figure flushed at the cell's end, after what the cell displayed itself.
#[test]
fn execute_result_comes_before_the_figures_flushed_at_the_end() {
    let r = result(serde_json::json!({"result_index": 1}));
    let out = to_outputs(&r, None, 1, &mut 0, None, &mut Quiet);
    assert_eq!(
        kinds(&out),
        [
            "shown by display()",
            "execute_result",
            "<Figure size 640x480 with 1 Axes>"
        ]
    );
}

/// Without `result_index` (the result came after every display) it is last.
#[test]
fn execute_result_without_an_index_comes_last() {
    let r = result(serde_json::json!({}));
    let out = to_outputs(&r, None, 1, &mut 0, None, &mut Quiet);
    assert_eq!(kinds(&out).last().map(String::as_str), Some("execute_result"));
    // An index past the displays (a forged or stale one) is the same.
    let r = result(serde_json::json!({"result_index": 99}));
    let out = to_outputs(&r, None, 1, &mut 0, None, &mut Quiet);
    assert_eq!(kinds(&out).len(), 3);
    assert_eq!(kinds(&out).last().map(String::as_str), Some("execute_result"));
}
