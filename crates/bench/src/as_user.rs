//! `--as-user NAME`: the library workloads again as another (non-root)
//! user, in the same run, their rows beside root's.
//!
//! Run as root, the bench starts itself once more under the user's uid and
//! gid (no supplementary groups, an environment of `PATH`, `HOME`, `LANG`
//! only, so the user's kernels get the user's defaults: the sandbox of a
//! user that is not root, templates in their own user namespaces) for the
//! workloads of [`AS_USER`] that were asked for, with the same
//! interpreter, sandbox mode and sample counts, and reads its rows back
//! from a JSON file (the hidden `--rows-json`). The interpreter and this
//! executable must be readable by the user (a venv under `/var/tmp`, say).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::BenchArgs;
use super::stats::Row;

/// The workloads `--as-user` repeats: those that start kernels in the
/// bench's own process (the surfaces run servers of their own).
pub const AS_USER: &[&str] = &["W1", "W2", "W2S", "W2T", "W4", "KILL", "POOL"];

/// A local account: name, uid, gid, home (from `/etc/passwd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory.
    pub home: String,
}

/// The account `name` in `passwd` (the text of `/etc/passwd`).
pub fn find_account(passwd: &str, name: &str) -> Option<Account> {
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 7 || f[0] != name {
            return None;
        }
        Some(Account {
            name: f[0].to_string(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5].to_string(),
        })
    })
}

/// `rows` as the JSON `--rows-json` writes.
pub fn rows_json(rows: &[Row]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({"workload": r.workload, "system": r.system, "n": r.n, "p50": r.p50,
                       "p99": r.p99, "unit": r.unit, "ratio": r.ratio, "note": r.note})
            })
            .collect(),
    )
}

fn unit_of(s: &str) -> &'static str {
    match s {
        "MB/s" => "MB/s",
        "MB" => "MB",
        _ => "ms",
    }
}

/// Rows read back from `--rows-json`'s file.
///
/// # Errors
/// Not a JSON array of rows (the message says what is wrong).
pub fn parse_rows(text: &str) -> Result<Vec<Row>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("rows are not JSON: {e}"))?;
    let Some(items) = v.as_array() else {
        return Err("rows are not a JSON array".into());
    };
    items
        .iter()
        .map(|r| {
            let text = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_string);
            let num = |k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
            Ok(Row {
                workload: text("workload").ok_or("a row without a workload")?,
                system: text("system").ok_or("a row without a system")?,
                n: r.get("n").and_then(Value::as_u64).unwrap_or(0) as usize,
                p50: num("p50"),
                p99: num("p99"),
                unit: unit_of(&text("unit").unwrap_or_default()),
                ratio: r.get("ratio").and_then(Value::as_f64),
                note: text("note").unwrap_or_default(),
            })
        })
        .collect()
}

/// Puts each of `theirs` (the user's rows) right after root's row of the
/// same workload and system, named for the user, with the ratio of the two
/// medians in its note (its ratio column stays the user's own comparison);
/// a row root has no counterpart of goes last.
pub fn merge(rows: &mut Vec<Row>, theirs: Vec<Row>, who: &Account) {
    for mut r in theirs {
        let at = rows
            .iter()
            .rposition(|m| m.workload == r.workload && m.system == r.system);
        let base = at.map(|i| rows[i].p50);
        r.system = format!("{}, as {} (uid {})", r.system, who.name, who.uid);
        let ratio = base
            .filter(|b| *b > 0.0 && r.unit == "ms")
            .map(|b| format!("{:.2}× root's p50", r.p50 / b));
        r.note = match (ratio, r.note.is_empty()) {
            (Some(x), true) => x,
            (Some(x), false) => format!("{x}; {}", r.note),
            (None, _) => r.note,
        };
        match at {
            Some(i) => {
                // After root's row and the user's rows already placed there.
                let mut j = i + 1;
                while j < rows.len() && rows[j].workload == r.workload && rows[j].system.contains(", as ") {
                    j += 1;
                }
                rows.insert(j, r);
            }
            None => rows.push(r),
        }
    }
}

/// Runs this executable as `who` for `workloads` and returns its rows and
/// the workloads that did not run there, with the reason.
///
/// # Errors
/// The user's run could not start, failed before writing its rows, or
/// wrote rows that do not parse (the message names the command's stderr).
pub fn run_as(
    args: &BenchArgs,
    python: &Path,
    who: &Account,
    workloads: &[String],
) -> Result<(Vec<Row>, Vec<String>), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    // A directory the user owns for its report and rows.
    let dir = tempfile::Builder::new()
        .prefix("cellhost-bench-as-user-")
        .tempdir()
        .map_err(|e| format!("scratch directory: {e}"))?;
    std::os::unix::fs::chown(dir.path(), Some(who.uid), Some(who.gid))
        .map_err(|e| format!("chown {} to {}: {e}", dir.path().display(), who.name))?;
    let rows_file = dir.path().join("rows.json");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").map_err(|e| format!("{}: {e}", config.display()))?;
    let mut cmd = Command::new(&exe);
    cmd.arg("--workload")
        .arg(workloads.join(","))
        .arg("--python")
        .arg(python)
        .arg("--cells")
        .arg(args.cells.to_string())
        .arg("--kernels")
        .arg(args.kernels.to_string())
        .arg("--interrupts")
        .arg(args.interrupts.to_string())
        .arg("--output")
        .arg(dir.path().join("BENCHMARKS.md"))
        .arg("--rows-json")
        .arg(&rows_file);
    if let Some(m) = args.sandbox {
        cmd.arg("--sandbox").arg(m.as_str());
    }
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &who.home)
        .env("LANG", "C.UTF-8")
        .env("CELLHOST_CONFIG", &config)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // std drops the supplementary groups when root changes the uid.
        .gid(who.gid)
        .uid(who.uid);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {} as {}: {e}", exe.display(), who.name))?;
    let said = String::from_utf8_lossy(&out.stderr);
    let text = std::fs::read_to_string(&rows_file).map_err(|e| {
        format!(
            "the run as {} wrote no rows ({e}; exit {:?}): {}",
            who.name,
            out.status.code(),
            said.trim()
        )
    })?;
    let missing: Vec<String> = said
        .lines()
        .filter_map(|l| l.strip_prefix("cellhost-bench: "))
        .filter(|l| l.contains(" did not run: "))
        .map(|l| format!("as {}: {l}", who.name))
        .collect();
    Ok((parse_rows(&text)?, missing))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::row;

    #[test]
    fn accounts_are_found_by_name_only() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nbob:x:1002:1003::/home/bob:/bin/sh\nbad:line\n";
        assert_eq!(
            find_account(passwd, "bob"),
            Some(Account {
                name: "bob".into(),
                uid: 1002,
                gid: 1003,
                home: "/home/bob".into()
            })
        );
        assert_eq!(find_account(passwd, "bo"), None);
        assert_eq!(find_account(passwd, "bad"), None);
    }

    #[test]
    fn rows_round_trip_and_land_beside_roots() {
        let who = Account {
            name: "bob".into(),
            uid: 1002,
            gid: 1002,
            home: "/home/bob".into(),
        };
        let mut rows = vec![
            row("W2 cold", "cellhost", &[100.0]),
            row("W2T t", "cellhost", &[20.0]),
        ];
        let theirs = parse_rows(
            &rows_json(&[row("W2 cold", "cellhost", &[150.0]), row("X", "y", &[1.0])]).to_string(),
        )
        .expect("rows");
        merge(&mut rows, theirs, &who);
        let systems: Vec<&str> = rows.iter().map(|r| r.system.as_str()).collect();
        assert_eq!(
            systems,
            [
                "cellhost",
                "cellhost, as bob (uid 1002)",
                "cellhost",
                "y, as bob (uid 1002)"
            ]
        );
        assert_eq!(rows[1].note, "1.50× root's p50");
        assert!(parse_rows("{}").is_err() && parse_rows("[{\"n\": 1}]").is_err());
    }
}
