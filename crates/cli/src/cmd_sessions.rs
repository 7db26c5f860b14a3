//! The shell workflow over the daemon: `cellhost exec --session NAME`,
//! `cellhost sessions [--json]`, `cellhost kill NAME`,
//! `cellhost interrupt NAME`.

use std::time::Duration;

use cellhost_kernel::LiveEvent;
use cellhost_server::daemon::{Client, EnvVar, Reply, Request};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::KernelArgs;
use crate::cmd_daemon;
use crate::common::{self, EXIT_USAGE};
use crate::render;

/// Arguments of `sessions`.
#[derive(Debug, clap::Args)]
pub struct SessionsArgs {
    /// Print the sessions as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `kill` and `interrupt`.
#[derive(Debug, clap::Args)]
pub struct NameArgs {
    /// Session name (as given to `exec --session`).
    #[arg(value_name = "NAME")]
    name: String,
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match common::runtime() {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("cellhost: cannot start the runtime: {e}");
            None
        }
    }
}

fn error_code(message: &str, usage: bool) -> u8 {
    if !message.is_empty() {
        eprintln!("cellhost: {message}");
    }
    if usage { EXIT_USAGE } else { 1 }
}

/// Runs `exec --session NAME`: the cell runs in the daemon's session
/// (started on first use), so state persists across invocations. Exit code
/// by status, as `exec`.
// The options of `exec --session`, one argument each as clap gives them.
#[allow(clippy::too_many_arguments)]
pub fn exec(
    kernel: &KernelArgs,
    session: String,
    code: String,
    timeout_s: Option<f64>,
    queue: bool,
    json: bool,
    limits: cellhost_sessions::SessionLimits,
    arg: Option<&str>,
) -> u8 {
    // An explicit interpreter is resolved here (the daemon may run in
    // another directory and with another PATH).
    let language = kernel.language.clone();
    let worker_runtime = match &language {
        None => None,
        Some(name) => match cellhost_kernel::for_language(name) {
            Some(r) => Some(r),
            None => {
                let known = cellhost_kernel::runtime::LANGUAGES.join(", ");
                return error_code(
                    &format!("--language {name}: unknown language (known: {known})"),
                    true,
                );
            }
        },
    };
    let explicit = match worker_runtime.as_ref().map(|r| r.name()) {
        Some(lang) if lang != "python" => kernel.r.clone().filter(|_| lang == "r"),
        _ => kernel.python.clone(),
    };
    let python = match (&explicit, &worker_runtime) {
        (None, _) => None,
        (Some(p), Some(rt)) if rt.name() != "python" => match rt.resolve_interpreter(Some(p)) {
            Ok(p) => Some(p),
            Err(e) => return error_code(&e.to_string(), true),
        },
        (Some(p), _) => match crate::common::daemon_python(Some(p)) {
            Ok(p) => p,
            Err(e) => return error_code(&e.to_string(), true),
        },
    };
    let env = match session_env(kernel) {
        Ok(e) => e,
        Err(e) => return error_code(&e, true),
    };
    let cwd = caller_cwd();
    let watch_cwd = cwd.clone();
    let Some(rt) = runtime() else { return 1 };
    rt.block_on(async move {
        let sigint = signal(SignalKind::interrupt()).ok();
        let mut c = match cmd_daemon::connect(kernel).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cellhost: cannot reach the daemon: {e}");
                return 1;
            }
        };
        let req = Request::Exec {
            session: session.clone(),
            code,
            timeout_s,
            live: !json,
            queue,
            python,
            language,
            placement: kernel.placement.clone(),
            sandbox: kernel.sandbox.map(|m| m.to_string()),
            cwd,
            env,
            network: kernel.network.as_ref().map(|p| p.to_text()),
            limits: (!limits.is_empty()).then_some(limits),
            checkpoint: kernel.checkpoint,
            restore: kernel.restore,
        };
        if let Err(e) = c.send(&req).await {
            eprintln!("cellhost: {e}");
            return 1;
        }
        // Ctrl-C interrupts the session's cell (through a second connection).
        let watcher = tokio::spawn(async move {
            let Some(mut sigint) = sigint else { return };
            while sigint.recv().await.is_some() {
                if let Ok(mut c2) = Client::connect(&cmd_daemon::dir()).await {
                    let _ = c2
                        .call(&Request::Interrupt {
                            session: session.clone(),
                            cwd: watch_cwd.clone(),
                        })
                        .await;
                }
            }
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let printer = tokio::spawn(render::print_live(rx));
        let outcome = loop {
            match c.next().await {
                Ok(Some(Reply::Stream { name, text })) => {
                    let ev = if name == "stderr" {
                        LiveEvent::Stderr(text)
                    } else {
                        LiveEvent::Stdout(text)
                    };
                    let _ = tx.send(ev);
                }
                Ok(Some(Reply::Display { .. })) => {}
                Ok(Some(Reply::Note { message })) => eprintln!("cellhost: {message}"),
                Ok(Some(Reply::Result { result })) => break Ok(result),
                Ok(Some(Reply::Error { message, usage, code })) => {
                    // With --json, the error envelope goes to stderr (stdout
                    // holds results only).
                    if json {
                        eprintln!(
                            "{}",
                            serde_json::json!({"error": {"code": code, "message": message}})
                        );
                        break Err((String::new(), usage));
                    }
                    break Err((message, usage));
                }
                Ok(Some(other)) => break Err((format!("unexpected reply {other:?}"), false)),
                Ok(None) => break Err(("the daemon closed the connection".into(), false)),
                Err(e) => break Err((e.to_string(), false)),
            }
        };
        drop(tx);
        watcher.abort();
        let printed = printer.await.unwrap_or_default();
        match outcome {
            Ok(mut r) => {
                if let Some(a) = arg {
                    crate::common::hint_file_as_code(a, &mut r);
                }
                render::finish_streamed(&printed, &r, json)
            }
            Err((m, usage)) => error_code(&m, usage),
        }
    })
}

/// The caller's directory as the session's workdir (absolute, links
/// resolved), under the rule of one-shot commands
/// ([`common::workdir_allowed`]): never home or one of its ancestors, for
/// which the session works in its session directory (`None`).
pub fn caller_cwd() -> Option<std::path::PathBuf> {
    std::env::current_dir()
        .and_then(std::fs::canonicalize)
        .ok()
        .filter(|d| common::workdir_allowed(d))
}

/// `--env` and `--secret-env` as the daemon's per-session variables, the
/// values read here (the daemon runs with another environment).
///
/// # Errors
/// A name not set in this environment (the message names it, never a
/// value).
pub(crate) fn session_env(kernel: &KernelArgs) -> Result<Vec<EnvVar>, String> {
    let mut out = Vec::new();
    for spec in &kernel.env {
        let (name, value) = match spec.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => {
                let v =
                    std::env::var(spec).map_err(|_| format!("--env {spec}: not set in this environment"))?;
                (spec.clone(), v)
            }
        };
        out.push(EnvVar {
            name,
            value,
            secret: false,
        });
    }
    for name in &kernel.secret_env {
        let value =
            std::env::var(name).map_err(|_| format!("--secret-env {name}: not set in this environment"))?;
        out.push(EnvVar {
            name: name.clone(),
            value,
            secret: true,
        });
    }
    Ok(out)
}

/// The daemon's sessions the journal records as paused (read while no
/// daemon runs; the next `exec --session` starts one and resumes them).
fn paused_in_journal() -> Vec<cellhost_server::daemon::SessionInfo> {
    let path = common::journal_path();
    if !path.exists() {
        return Vec::new();
    }
    let rows = cellhost_sessions::JournalReader::open(&path)
        .and_then(|j| j.paused_sessions(&cellhost_server::daemon::daemon_owner()));
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return Vec::new();
        }
    };
    rows.into_iter()
        .filter(|(_, c, _)| c.path.is_file())
        .map(|(name, c, at)| cellhost_server::daemon::SessionInfo {
            name,
            state: "paused".into(),
            generation: c.generation,
            pid: 0,
            busy: false,
            python: std::path::PathBuf::new(),
            cwd: None,
            placement: None,
            limits: Default::default(),
            paused_ms: Some(at),
            checkpoint: Some(cellhost_sessions::CheckpointSummary::from(&c)),
        })
        .collect()
}

/// Runs `sessions`: the daemon's sessions with a live kernel, and its
/// paused ones (also those paused before the daemon restarted).
pub fn sessions(args: SessionsArgs) -> u8 {
    let Some(rt) = runtime() else { return 1 };
    rt.block_on(async move {
        let list = match Client::connect(&cmd_daemon::dir()).await {
            // No daemon: no live kernel, but the sessions it paused.
            Err(_) => paused_in_journal(),
            Ok(mut c) => match c.call(&Request::Sessions).await {
                Ok(Reply::Sessions { sessions }) => sessions,
                Ok(Reply::Error { message, usage, .. }) => return error_code(&message, usage),
                Ok(other) => return error_code(&format!("unexpected reply {other:?}"), false),
                Err(e) => return error_code(&e.to_string(), false),
            },
        };
        if args.json {
            println!("{}", serde_json::to_string_pretty(&list).unwrap_or_default());
        } else if list.is_empty() {
            println!("no sessions");
        } else {
            println!("{:<24} {:>4} {:>8} {:<5} python", "session", "gen", "pid", "busy");
            for s in &list {
                if let (Some(at), Some(c)) = (s.paused_ms, s.checkpoint.as_ref()) {
                    println!(
                        "{:<24} {:>4} {:>8} {:<5} {}  paused {} s ago (checkpoint after cell {}, {}; the next exec --session {} resumes it)",
                        s.name,
                        s.generation,
                        "-",
                        "no",
                        s.python.display(),
                        (cellhost_sessions::journal::now_ms() - at).max(0) / 1000,
                        c.execution_count,
                        checkpoint_holds(c),
                        s.name
                    );
                    continue;
                }
                let place = s
                    .placement
                    .as_ref()
                    .map(|p| format!("  on {} ({} {} job {})", p.node, p.name, p.kind, p.job))
                    .unwrap_or_default();
                println!(
                    "{:<24} {:>4} {:>8} {:<5} {}{place}",
                    s.name,
                    s.generation,
                    s.pid,
                    if s.busy { "yes" } else { "no" },
                    s.python.display()
                );
            }
        }
        0
    })
}

fn named(req: Request) -> u8 {
    let Some(rt) = runtime() else { return 1 };
    rt.block_on(async move {
        let mut c = match Client::connect(&cmd_daemon::dir()).await {
            Ok(c) => c,
            Err(_) => return error_code("no daemon is running, so no such session", true),
        };
        match tokio::time::timeout(Duration::from_secs(30), c.call(&req)).await {
            Ok(Ok(Reply::Ok { message })) => {
                println!("{message}");
                0
            }
            Ok(Ok(Reply::Interrupt { outcome, dropped })) => {
                if !dropped.is_empty() {
                    println!("dropped queued cells: {}", dropped.join(" "));
                }
                if outcome.delivered {
                    // Where SIGINT went: `pid/tid`, `node:pid/tid` for a
                    // remote kernel (delivered by its node agent).
                    let target = outcome
                        .target
                        .as_deref()
                        .map(|t| format!(" (SIGINT to {t})"))
                        .unwrap_or_default();
                    println!(
                        "interrupted {}{target}",
                        outcome.cell.as_deref().unwrap_or("the running cell")
                    );
                    0
                } else {
                    println!(
                        "not delivered: {}",
                        outcome.reason.as_deref().unwrap_or("no cell is running")
                    );
                    1
                }
            }
            Ok(Ok(Reply::Error { message, usage, .. })) => error_code(&message, usage),
            Ok(Ok(other)) => error_code(&format!("unexpected reply {other:?}"), false),
            Ok(Err(e)) => error_code(&e.to_string(), false),
            Err(_) => error_code("the daemon did not answer within 30 s", false),
        }
    })
}

/// Runs `kill NAME`.
pub fn kill(args: NameArgs) -> u8 {
    named(Request::Kill {
        session: args.name,
        cwd: caller_cwd(),
    })
}

/// Runs `pause NAME`: the session's kernel checkpointed and stopped; the
/// next `exec --session NAME` resumes it.
pub fn pause(args: NameArgs) -> u8 {
    let Some(rt) = runtime() else { return 1 };
    rt.block_on(async move {
        let mut c = match Client::connect(&cmd_daemon::dir()).await {
            Ok(c) => c,
            Err(_) => return error_code("no daemon is running, so no such session", true),
        };
        let req = Request::Pause {
            session: args.name.clone(),
            cwd: caller_cwd(),
        };
        match c.call(&req).await {
            Ok(Reply::Paused { report }) => {
                let c = &report.checkpoint;
                println!(
                    "paused session {} (generation {}, pid {} stopped, {} MiB freed): checkpoint after cell {} ({} bytes, {}); the next exec --session {} resumes it",
                    report.session,
                    report.generation,
                    report.pid,
                    report.memory_freed_bytes >> 20,
                    c.execution_count,
                    c.bytes,
                    checkpoint_holds(c),
                    report.session
                );
                for l in &c.lost {
                    println!("  not saved: {} ({}): {}", l.name, l.type_name, l.reason);
                }
                0
            }
            Ok(Reply::Error { message, usage, .. }) => error_code(&message, usage),
            Ok(other) => error_code(&format!("unexpected reply {other:?}"), false),
            Err(e) => error_code(&e.to_string(), false),
        }
    })
}

/// Runs `interrupt NAME`.
pub fn interrupt(args: NameArgs) -> u8 {
    named(Request::Interrupt {
        session: args.name,
        cwd: caller_cwd(),
    })
}

/// What a checkpoint holds, for a reader: the whole process, or how many
/// names were saved and left out.
fn checkpoint_holds(c: &cellhost_sessions::CheckpointSummary) -> String {
    match c.mode {
        cellhost_sessions::checkpoint::CheckpointMode::Process => "the whole kernel process".to_string(),
        _ => format!("{} names saved, {} lost", c.saved.len(), c.lost.len()),
    }
}
