//! `cellhost history SESSION [--json] [--owner OWNER]`: a session's cells
//! from the journal, oldest first, with their kernel generations.

use cellhost_sessions::requests::HistoryRequest;
use cellhost_sessions::{CellRow, JournalReader};

use crate::common;

/// Arguments of `history`.
#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// Session name (`cellhost run` uses the input file's stem).
    #[arg(value_name = "SESSION")]
    session: String,
    /// Owner of the session (default: this user's CLI owner, `cli:<user>`,
    /// which `run` and `exec --session` use; `serve`'s sessions are
    /// keyed by their token's owner).
    #[arg(long)]
    owner: Option<String>,
    /// Print JSON: `{session, owner, language, kernels, cells}`.
    #[arg(long)]
    json: bool,
}

fn first_line(s: &str, max: usize) -> String {
    let line = s.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim_end();
    let more = s.lines().filter(|l| !l.trim().is_empty()).count() > 1;
    let mut out: String = line.chars().take(max).collect();
    if more || line.chars().count() > max {
        out.push_str(" …");
    }
    out
}

fn print_cell(c: &CellRow) {
    let dur = c
        .duration_ms
        .map(|d| format!("{d} ms"))
        .unwrap_or_else(|| "-".into());
    println!(
        "[{}] g{} {} {} ({}, {}) {}",
        c.execution_count,
        c.generation,
        c.status,
        dur,
        if c.origin.is_empty() { "?" } else { &c.origin },
        c.id,
        first_line(&c.code, 70)
    );
    if let Some(e) = &c.error {
        println!("    error: {}", first_line(e, 100));
    }
    let out = c.stdout_head.trim_end();
    if !out.is_empty() {
        println!("    stdout: {}", first_line(out, 100));
    }
    if !c.files_read.is_empty() || !c.files_written.is_empty() {
        println!(
            "    files: read {}, wrote {}{}",
            c.files_read.len(),
            c.files_written.len(),
            if c.files_truncated { " (truncated)" } else { "" }
        );
    }
    if let Some(n) = c.tool_calls.as_array().map(Vec::len).filter(|n| *n > 0) {
        println!("    tool calls: {n}");
    }
}

/// Runs `history`.
pub fn run(args: HistoryArgs) -> u8 {
    let path = common::journal_path();
    if !path.exists() {
        eprintln!("cellhost: no journal at {}", path.display());
        return 1;
    }
    let reader = match JournalReader::open(&path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 1;
        }
    };
    let owner = args.owner.clone().unwrap_or_else(common::cli_owner);
    let req = HistoryRequest {
        owner: owner.clone(),
        session: args.session.clone(),
    };
    let h = match req.execute_on(&reader) {
        Ok(h) => h,
        Err(e @ cellhost_sessions::RequestError::SessionNotFound { .. }) => {
            eprintln!("cellhost: {e} of owner {owner:?} in {}", path.display());
            return 1;
        }
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 1;
        }
    };
    let language = h.language.unwrap_or_else(|| "python".into());
    let (cells, kernels) = (h.cells, h.kernels);
    if args.json {
        let v = serde_json::json!({
            "owner": owner, "session": args.session, "language": language,
            "kernels": kernels, "cells": cells,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return 0;
    }
    println!(
        "session {} (owner {}, {}): {} cells, {} kernels",
        args.session,
        owner,
        language,
        cells.len(),
        kernels.len()
    );
    for k in &kernels {
        let forked = match (&k.parent_session, k.parent_generation, k.fork_point) {
            (Some(p), Some(g), Some(n)) => format!(" (forked from {p} g{g} at execution_count {n})"),
            _ => String::new(),
        };
        let place = k
            .placement
            .as_ref()
            .map(|p| format!(" on {} ({} {} job {})", p.node, p.name, p.kind, p.job))
            .unwrap_or_default();
        println!(
            "  kernel g{} pid {}{place}{forked}: {}",
            k.generation,
            k.pid,
            k.end_reason
                .as_deref()
                .unwrap_or(if k.ended_ms.is_some() { "ended" } else { "running" })
        );
    }
    for c in &cells {
        print_cell(c);
    }
    0
}
