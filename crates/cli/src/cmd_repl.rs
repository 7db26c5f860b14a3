//! `cellhost repl [--python PATH]`: an interactive session.
//!
//! Ctrl-C while a cell runs interrupts it; a second Ctrl-C within the grace
//! kills the kernel (the next cell starts a fresh one and says so). Ctrl-C
//! at the prompt clears the line; Ctrl-D leaves.

use std::time::{Duration, Instant};

use std::sync::Arc;

use cellhost_sessions::requests::ExecuteRequest;
use cellhost_sessions::{Deadline, Key, Origin, Registry, RequestError, SessionSpec};
use rustyline::error::ReadlineError;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::KernelArgs;
use crate::common;
use crate::render;

/// Arguments of `repl`.
#[derive(Debug, clap::Args)]
pub struct ReplArgs {
    #[command(flatten)]
    kernel: KernelArgs,
}

/// True while `code` still needs lines: an open bracket, an unterminated
/// triple-quoted string, a trailing `\`, or a block opened with `:` that a
/// blank line has not closed yet. Comments and string contents are skipped,
/// so a `(` or a quote inside them does not count.
pub fn needs_more(code: &str) -> bool {
    let chars: Vec<char> = code.chars().collect();
    let mut depth: i64 = 0;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '\'' | '"' => {
                let triple = i + 2 < chars.len() && chars[i + 1] == c && chars[i + 2] == c;
                let len = if triple { 3 } else { 1 };
                i += len;
                let mut closed = false;
                while i < chars.len() {
                    if chars[i] == '\\' {
                        i += 2;
                        continue;
                    }
                    if !triple && chars[i] == '\n' {
                        // An unterminated one-line string: a syntax error the
                        // kernel reports; no more lines are needed for it.
                        closed = true;
                        break;
                    }
                    if chars[i] == c
                        && (!triple || (i + 2 < chars.len() && chars[i + 1] == c && chars[i + 2] == c))
                    {
                        i += len;
                        closed = true;
                        break;
                    }
                    i += 1;
                }
                if !closed && triple {
                    return true;
                }
                continue;
            }
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    let last = code.lines().last().unwrap_or("");
    if depth > 0 || last.trim_end().ends_with('\\') {
        return true;
    }
    let opened_block = code.lines().any(|l| {
        let t = l.split('#').next().unwrap_or("").trim_end();
        t.ends_with(':')
    });
    opened_block && !code.ends_with("\n\n") && !last.trim().is_empty() && !closes_block(code, last)
}

/// Whether `last`, the latest line of a cell with a block, ends that block
/// as IPython's `check_complete` sees it: a line at column 0 after the
/// block's body (`f()` after a pasted `def`) that neither opens a block
/// nor continues one (`else:`, `except`, …), so a pasted block runs
/// without a blank line after it.
fn closes_block(code: &str, last: &str) -> bool {
    const CONTINUES: &[&str] = &["else", "elif", "except", "finally", "case"];
    let t = last.split('#').next().unwrap_or("").trim_end();
    let first_word = t
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .next()
        .unwrap_or("");
    code.lines().count() > 1
        && !last.starts_with([' ', '\t'])
        && !t.is_empty()
        && !t.ends_with(':')
        && !t.starts_with('@')
        && !CONTINUES.contains(&first_word)
}

/// Runs the REPL; returns the exit code.
pub fn run(args: ReplArgs) -> u8 {
    let rt = match common::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost: cannot start the runtime: {e}");
            return 1;
        }
    };
    let dir = common::new_session_dir("repl");
    let cfg = match common::kernel_config(&args.kernel, "repl", &dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 1;
        }
    };
    let grace = cfg.interrupt_grace;
    // One kernel through the registry (the single-kernel case); not
    // journaled, no deadline.
    let registry = match rt.block_on(common::start_one_shot(cfg, false)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 1;
        }
    };
    let spec = SessionSpec::new(common::cli_owner(), "repl");
    let started = match spec.key(&registry) {
        Ok(key) => rt
            .block_on(registry.acquire(&key))
            .map(|(k, _)| (key, k))
            .map_err(RequestError::from),
        Err(e) => Err(e),
    };
    let (key, kernel) = match started {
        Ok(x) => x,
        Err(e) => {
            eprintln!("cellhost: {e}");
            rt.block_on(registry.shutdown());
            return 1;
        }
    };
    let mut editor = match rustyline::DefaultEditor::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cellhost: cannot open the line editor: {e}");
            return 1;
        }
    };
    let history = common::state_dir().join("repl_history");
    let _ = editor.load_history(&history);
    {
        let k = &kernel;
        let v = k.info().python_version.lines().next().unwrap_or("").to_string();
        // R's version string names the language itself ("R version 4.2.2 …").
        let v = if v.starts_with("R ") {
            v
        } else {
            format!("Python {v}")
        };
        println!(
            "cellhost repl — {v} ({}). Ctrl-C interrupts, Ctrl-D quits.",
            k.info().python.display()
        );
    }
    let mut count = 1u64;
    let mut eof = false;
    loop {
        if eof {
            let _ = std::fs::create_dir_all(common::state_dir());
            let _ = editor.append_history(&history);
            rt.block_on(registry.shutdown());
            return 0;
        }
        let mut code = String::new();
        let mut prompt = format!("In [{count}]: ");
        loop {
            match editor.readline(&prompt) {
                Ok(line) => {
                    code.push_str(&line);
                    code.push('\n');
                    if !needs_more(&code) {
                        break;
                    }
                    prompt = format!("{:>width$}: ", "...", width = prompt.len() - 2);
                }
                Err(ReadlineError::Interrupted) => {
                    code.clear();
                    break;
                }
                Err(ReadlineError::Eof) if !code.trim().is_empty() => {
                    // End of input with a cell still open: run it, then leave.
                    eof = true;
                    break;
                }
                Err(ReadlineError::Eof) => {
                    let _ = std::fs::create_dir_all(common::state_dir());
                    let _ = editor.append_history(&history);
                    rt.block_on(registry.shutdown());
                    return 0;
                }
                Err(e) => {
                    eprintln!("cellhost: {e}");
                    rt.block_on(registry.shutdown());
                    return 1;
                }
            }
        }
        if code.trim().is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(code.trim_end());
        // Each entry is on disk before its cell runs: closing the terminal
        // (SIGHUP) or a killed process loses none.
        if std::fs::create_dir_all(common::state_dir()).is_ok()
            && let Err(e) = editor.append_history(&history)
        {
            eprintln!("cellhost: cannot save the history to {}: {e}", history.display());
        }
        let result = rt.block_on(run_cell(&registry, &spec, &key, &code, grace));
        match result {
            Ok(r) => {
                render::print_result(&r, true);
                count = r.execution_count + 1;
            }
            Err(e) => eprintln!("cellhost: {e}"),
        }
    }
}

async fn run_cell(
    registry: &Arc<Registry>,
    spec: &SessionSpec,
    key: &Key,
    code: &str,
    grace: Duration,
) -> Result<cellhost_kernel::CellResult, RequestError> {
    // Listen before the cell is submitted: a Ctrl-C pressed as soon as the
    // cell starts must reach it (a listener created later would miss it).
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut req = ExecuteRequest::new(spec.clone(), code, Origin::new("cli:repl"));
    req.deadline = Deadline::None;
    req.live = Some(tx);
    let printer = tokio::spawn(render::print_live(rx));
    let watcher = {
        let (registry, key) = (registry.clone(), key.clone());
        tokio::spawn(async move {
            let mut first: Option<Instant> = None;
            let Some(sigint) = sigint.as_mut() else {
                return;
            };
            while sigint.recv().await.is_some() {
                let Some(k) = registry.kernel(&key) else { continue };
                match first {
                    Some(t) if t.elapsed() <= grace => {
                        eprintln!("\ncellhost: second Ctrl-C: killing the kernel");
                        k.kill().await;
                    }
                    _ => {
                        first = Some(Instant::now());
                        let out = k.interrupt().await;
                        if !out.delivered {
                            eprintln!(
                                "\ncellhost: interrupt not delivered: {}",
                                out.reason.unwrap_or_default()
                            );
                        }
                    }
                }
            }
        })
    };
    let r = req.execute(registry).await.map(|done| done.result);
    watcher.abort();
    let printed = printer.await.unwrap_or_default();
    if let Ok(r) = &r {
        render::print_rest(&printed, r);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::needs_more;

    #[test]
    fn continuation_rules() {
        assert!(!needs_more("x = 1\n"));
        assert!(needs_more("f(1,\n"));
        assert!(needs_more("for i in range(3):\n"));
        assert!(needs_more("for i in range(3):\n    print(i)\n"));
        assert!(!needs_more("for i in range(3):\n    print(i)\n\n"));
        assert!(!needs_more("s = '('\n"));
        assert!(needs_more("x = 1 + \\\n"));
        assert!(!needs_more("print(\"one\")  # see note (a\n"));
        assert!(needs_more("s = \"\"\"first\n"));
        assert!(!needs_more("s = \"\"\"first\nsecond\"\"\"\n"));
        assert!(!needs_more("d = {'(': 1}\n"));
        assert!(needs_more("if x:  # comment (\n"));
        // A dedented line after a block's body ends it (a pasted block).
        assert!(!needs_more("def f():\n    return 1\nf()\n"));
        assert!(needs_more("if x:\n    a = 1\nelse:\n"));
        assert!(needs_more("try:\n    a = 1\nexcept ValueError:\n"));
        assert!(needs_more("if x:\n    a = 1\nelif y:\n"));
        assert!(needs_more("class A:\n    x = 1\n@dec\n"));
        assert!(needs_more("def f():\n    return 1\n"));
    }
}
