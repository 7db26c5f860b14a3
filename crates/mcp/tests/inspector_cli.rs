//! The MCP Inspector's CLI (`@modelcontextprotocol/inspector` on npm) as a
//! client of the stdio server: every tool listed with an `outputSchema`,
//! annotations and no `null` unions; an exception in a cell is a
//! successful call saying `status: error`; a bad argument is a failure.
//!
//! Needs `CELLHOST_TEST_NPM_DIR`, a directory where `npm install
//! @modelcontextprotocol/inspector` ran (scripts/test.sh makes one under
//! /var/tmp), and `CELLHOST_TEST_PYTHON`; without them the test says so on
//! stderr and passes without running.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn setup() -> Option<(PathBuf, String)> {
    let dir = std::env::var_os("CELLHOST_TEST_NPM_DIR").map(PathBuf::from)?;
    if !dir.join("node_modules/@modelcontextprotocol/inspector").is_dir() {
        eprintln!("skipped: no @modelcontextprotocol/inspector in {}", dir.display());
        return None;
    }
    let py = std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    Some((dir, py))
}

/// One `npx @modelcontextprotocol/inspector --cli` run against a fresh
/// stdio server; its JSON answer and whether it exited 0.
fn inspect(dir: &PathBuf, py: &str, args: &[&str]) -> (Value, bool) {
    let state = tempfile::tempdir().expect("tempdir");
    let out = Command::new("npx")
        .current_dir(dir)
        .args(["--no-install", "@modelcontextprotocol/inspector", "--cli"])
        .arg(env!("CARGO_BIN_EXE_cellhost-mcp-test"))
        .args(["--python", py, "--state"])
        .arg(state.path())
        .args(args)
        .output()
        .expect("run npx");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let v = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
    (v, out.status.success())
}

fn has_null(v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            m.get("type")
                .is_some_and(|t| t == "null" || t.as_array().is_some_and(|a| a.iter().any(|x| x == "null")))
                || m.contains_key("nullable")
                || m.values().any(has_null)
        }
        Value::Array(a) => a.iter().any(has_null),
        _ => false,
    }
}

#[test]
fn inspector_lists_fitting_tools() {
    let Some((dir, py)) = setup() else {
        eprintln!("skipped: set CELLHOST_TEST_NPM_DIR to a directory with the MCP Inspector installed");
        return;
    };
    let (v, ok) = inspect(&dir, &py, &["--method", "tools/list"]);
    assert!(ok, "{v}");
    let tools = v["tools"].as_array().expect("tools");
    assert!(tools.len() >= 6, "{v}");
    for t in tools {
        assert!(t["outputSchema"].is_object(), "no outputSchema: {t}");
        assert!(t["annotations"].is_object(), "no annotations: {t}");
        assert!(
            !has_null(&t["inputSchema"]) && !has_null(&t["outputSchema"]),
            "null union: {t}"
        );
    }
    let hint = |name: &str, key: &str| {
        tools
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["annotations"][key].clone())
            .unwrap_or(Value::Null)
    };
    for ro in ["list_variables", "list_sessions", "read_output"] {
        assert_eq!(hint(ro, "readOnlyHint"), Value::Bool(true), "{ro}");
    }
    assert_eq!(hint("restart", "destructiveHint"), Value::Bool(true));
}

#[test]
fn inspector_cell_exception_is_a_successful_call() {
    let Some((dir, py)) = setup() else {
        eprintln!("skipped: set CELLHOST_TEST_NPM_DIR to a directory with the MCP Inspector installed");
        return;
    };
    let (v, ok) = inspect(
        &dir,
        &py,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "execute_code",
            "--tool-arg",
            "code=1/0",
        ],
    );
    assert!(ok, "{v}");
    assert_ne!(v["isError"], Value::Bool(true), "{v}");
    assert_eq!(v["structuredContent"]["status"], "error", "{v}");
    assert_eq!(
        v["structuredContent"]["error"]["ename"], "ZeroDivisionError",
        "{v}"
    );
    // Null members are absent (the outputSchema has no null).
    assert!(v["structuredContent"].get("result").is_none(), "{v}");

    // A tool failure stays one, with its code.
    let (bad, _) = inspect(
        &dir,
        &py,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "read_output",
            "--tool-arg",
            "cell=nope",
            "--tool-arg",
            "stream=stdout",
        ],
    );
    assert_eq!(bad["isError"], Value::Bool(true), "{bad}");
    assert_eq!(
        bad["structuredContent"]["error"]["code"], "output_not_found",
        "{bad}"
    );
}
