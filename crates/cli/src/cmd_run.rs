//! `cellhost run INPUT [--output PATH] [--python PATH] [--timeout SECONDS] [--allow-errors]`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use cellhost_kernel::{CellResult, CellStatus, ExecOptions};
use cellhost_notebook::{Notebook, Output, default_output_path, merge_streams};
use cellhost_sessions::Origin;
use serde_json::{Map, Value};

use crate::KernelArgs;
use crate::common::{self, EXIT_USAGE};

/// Arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A Jupyter notebook (.ipynb, nbformat 4) or a percent-format script (.py).
    #[arg(value_name = "INPUT")]
    input: PathBuf,
    /// Where to write the executed notebook (always .ipynb); default
    /// `<stem>.executed.ipynb` beside the input.
    #[arg(long, value_name = "PATH")]
    output: Option<PathBuf>,
    #[command(flatten)]
    kernel: KernelArgs,
    /// Deadline per cell in seconds (default 300; 0 = none).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Keep going after a cell fails.
    #[arg(long)]
    allow_errors: bool,
    /// Session name in the journal (default: the input file's stem).
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
}

/// Runs `run`; returns the exit code (0, or the status code of the cell it stopped at).
pub fn run(args: RunArgs) -> u8 {
    let (mut nb, _kind) = match Notebook::load(&args.input) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    let timeout = match common::parse_timeout(args.timeout) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| default_output_path(&args.input));
    let stem = output
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "notebook".into());
    if let (Ok(a), Ok(b)) = (std::fs::canonicalize(&args.input), std::path::absolute(&output))
        && (a == b || std::fs::canonicalize(&output).is_ok_and(|o| o == a))
    {
        eprintln!(
            "cellhost: --output {} is the input itself; choose another path",
            output.display()
        );
        return EXIT_USAGE;
    }
    let out_dir = output.parent().map(Path::to_path_buf).unwrap_or_default();
    let files_dir = out_dir.join(format!("{stem}_files"));
    // Create the output's directory before running anything, so a run never
    // ends with every cell executed and nowhere to write the notebook.
    if !out_dir.as_os_str().is_empty()
        && let Err(e) = std::fs::create_dir_all(&out_dir)
    {
        eprintln!("cellhost: cannot create {}: {e}", out_dir.display());
        return 1;
    }
    common::block_on(async move {
        let session_name = args.session.clone().unwrap_or_else(|| {
            args.input
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        let dir = common::new_session_dir("run");
        let cfg = match common::kernel_config(&args.kernel, &session_name, &dir) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        };
        let python = cfg.python.clone();
        let mut cfg = cfg;
        // A notebook runs in its own directory, as under Jupyter.
        if let Some(dir) = std::fs::canonicalize(&args.input)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .filter(|d| common::workdir_allowed(d))
        {
            cfg.cwd = Some(dir);
        }
        cfg.cell_timeout = timeout;
        // One kernel is needed: no warm pool.
        let registry = match common::start_registry(cfg, Some(0), true, None).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        };
        let key = registry.key(common::CLI_OWNER, &session_name);
        let origin = Origin {
            origin: "cli:run".into(),
            context: Some(serde_json::json!({"input": args.input.display().to_string()})),
        };
        nb.clear_outputs();
        let cells = nb.code_cells();
        let total = cells.len();
        let started = Instant::now();
        let progress = Progress::new();
        let mut exit = 0u8;
        let mut figures = 0usize;
        let mut kernel_info_set = false;
        // Ctrl-C interrupts the running cell; the run then stops, writes what
        // it has and exits 130.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let (stop, registry, key) = (stop.clone(), registry.clone(), key.clone());
            tokio::spawn(async move {
                while tokio::signal::ctrl_c().await.is_ok() {
                    stop.store(true, std::sync::atomic::Ordering::SeqCst);
                    if let Some(k) = registry.kernel(&key) {
                        k.interrupt().await;
                    }
                }
            })
        };
        for (i, cell) in cells.iter().enumerate() {
            if cell.source.trim().is_empty() {
                continue;
            }
            // A Ctrl-C between two cells stops the run before the next one.
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                eprintln!(
                    "cellhost: interrupted before cell {}/{total}; writing what ran",
                    i + 1
                );
                exit = 130;
                break;
            }
            let t0 = Instant::now();
            let fut = registry.execute(&key, &cell.source, ExecOptions::default(), &origin);
            let result = progress.track(i + 1, total, started, fut).await;
            let r = match result {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cellhost: cell {}/{total}: {e}", i + 1);
                    exit = 1;
                    break;
                }
            };
            if !kernel_info_set && let Some(k) = registry.kernel(&key) {
                nb.set_kernel_info(&k.info().python_version, &python.display().to_string());
                nb.set_sandbox(serde_json::to_value(&r.kernel.sandbox).unwrap_or_default());
                kernel_info_set = true;
            }
            let outputs = to_outputs(&r, &files_dir, i + 1, &mut figures, timeout);
            let count = (r.execution_count > 0).then_some(r.execution_count);
            if let Err(e) = nb.set_outputs(cell.index, count, merge_streams(outputs)) {
                eprintln!("cellhost: {e}");
                exit = 1;
                break;
            }
            progress.done(i + 1, total, &r, t0.elapsed());
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                eprintln!(
                    "cellhost: interrupted at cell {}/{total}; writing what ran",
                    i + 1
                );
                exit = 130;
                break;
            }
            if r.status != CellStatus::Ok && !args.allow_errors {
                eprintln!(
                    "cellhost: stopped at cell {}/{total} ({}); use --allow-errors to go on",
                    i + 1,
                    r.status.as_str()
                );
                if let Some(e) = &r.error {
                    for line in &e.traceback {
                        eprintln!("{line}");
                    }
                }
                exit = r.status.exit_code() as u8;
                break;
            }
        }
        watcher.abort();
        registry.shutdown().await;
        if let Err(e) = nb.write(&output) {
            eprintln!("cellhost: {e}");
            return 1;
        }
        eprintln!(
            "cellhost: wrote {} ({} cells, {:.1} s){}",
            output.display(),
            total,
            started.elapsed().as_secs_f64(),
            if figures > 0 {
                format!("; {figures} figure(s) in {}", files_dir.display())
            } else {
                String::new()
            }
        );
        exit
    })
}

/// Jupyter outputs for one result; images are read back from the session
/// directory, embedded as base64, and copied to `files_dir`.
fn to_outputs(
    r: &CellResult,
    files_dir: &Path,
    cell_no: usize,
    figures: &mut usize,
    timeout: Option<Duration>,
) -> Vec<Output> {
    let mut out = Vec::new();
    if r.kernel.state_reset {
        // The notebook must say that the namespace is new (an earlier cell
        // crashed or was killed), not just restart the execution counts.
        out.push(Output::Stream {
            name: "stderr".into(),
            text: format!(
                "cellhost: state reset: {} (a fresh kernel, generation {}); earlier cells' variables are gone\n",
                r.kernel.reset_reason.as_deref().unwrap_or("new kernel"),
                r.kernel.generation
            ),
        });
    }
    // Output of earlier cells' threads or children stays apart from this
    // cell's streams: a display marked as background, never a stream that
    // Jupyter would merge into the cell's own text.
    if let Some(bg) = &r.background_output {
        for (name, text) in [("stdout", &bg.stdout), ("stderr", &bg.stderr)] {
            if text.is_empty() {
                continue;
            }
            let mut data = Map::new();
            data.insert(
                "text/plain".into(),
                Value::String(format!(
                    "[background {name} from earlier cells' threads or children]\n{text}"
                )),
            );
            let mut metadata = Map::new();
            metadata.insert("cellhost".into(), serde_json::json!({ "background": name }));
            out.push(Output::DisplayData { data, metadata });
        }
    }
    if !r.stdout.is_empty() {
        out.push(Output::Stream {
            name: "stdout".into(),
            text: r.stdout.clone(),
        });
    }
    if !r.stderr.is_empty() {
        out.push(Output::Stream {
            name: "stderr".into(),
            text: r.stderr.clone(),
        });
    }
    for (n, d) in r.displays.iter().enumerate() {
        let data = embed(&d.data, files_dir, &format!("cell{cell_no}-{}", n + 1), figures);
        out.push(Output::DisplayData {
            data,
            metadata: d.metadata.clone(),
        });
    }
    if let Some(res) = &r.result {
        let data = embed(res, files_dir, &format!("cell{cell_no}-result"), figures);
        out.push(Output::ExecuteResult {
            execution_count: r.execution_count,
            data,
            metadata: Map::new(),
        });
    }
    if matches!(r.status, CellStatus::Timeout | CellStatus::Interrupted) {
        // Say why the cell stopped (not just the KeyboardInterrupt the
        // interrupt raised), and keep the Python traceback: it shows where.
        out.push(Output::Error {
            ename: if r.status == CellStatus::Timeout {
                "CellTimeout"
            } else {
                "CellInterrupted"
            }
            .to_string(),
            evalue: stop_message(r, timeout),
            traceback: r
                .error
                .as_ref()
                .map(|e| e.traceback.clone())
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| vec![stop_message(r, timeout)]),
        });
    } else if let Some(e) = &r.error {
        out.push(Output::Error {
            ename: e.ename.clone(),
            evalue: e.evalue.clone(),
            traceback: e.traceback.clone(),
        });
    } else if r.status != CellStatus::Ok {
        let (ename, evalue) = match &r.crash {
            Some(c) => ("KernelCrashed".to_string(), c.message.clone()),
            None => ("CellFailed".to_string(), r.status.as_str().to_string()),
        };
        // Viewers show the traceback, not ename/evalue: never leave it empty.
        let traceback = vec![format!("{ename}: {evalue}")];
        out.push(Output::Error {
            ename,
            evalue,
            traceback,
        });
    }
    out
}

/// Why a timed-out or interrupted cell stopped, and what became of the
/// kernel's state.
fn stop_message(r: &CellResult, timeout: Option<Duration>) -> String {
    let what = match (r.status, timeout) {
        (CellStatus::Timeout, Some(t)) => {
            format!("the cell exceeded its {} s timeout", t.as_secs_f64())
        }
        (CellStatus::Timeout, None) => "the cell timed out".to_string(),
        _ => "the cell was interrupted".to_string(),
    };
    match &r.interrupt {
        Some(i) if i.escalated => match &i.reason {
            Some(reason) => format!("{what}: {reason}; the session's state is gone"),
            None => format!("{what}; the kernel was killed and the session's state is gone"),
        },
        Some(i) if i.state_kept => format!("{what}; the code stopped and the session's state is kept"),
        Some(i) => format!(
            "{what}; {}",
            i.reason.as_deref().unwrap_or("the interrupt was not delivered")
        ),
        None => what,
    }
}

fn embed(
    bundle: &Map<String, Value>,
    files_dir: &Path,
    stem: &str,
    figures: &mut usize,
) -> Map<String, Value> {
    let mut data = Map::new();
    for (mime, v) in bundle {
        if let Some(path) = v
            .get("path")
            .and_then(Value::as_str)
            .filter(|_| cellhost_kernel::is_saved_file_mime(mime))
        {
            // The figure is in the session directory and its copy goes
            // beside the notebook, maybe the kernel's workdir: links the
            // kernel planted in either are never followed.
            let read = cellhost_kernel::hostfs::open_verified(Path::new(path)).and_then(|mut f| {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut b).map(|_| b)
            });
            match read {
                Ok(bytes) => {
                    let ext = Path::new(path)
                        .extension()
                        .and_then(|e| e.to_str())
                        .unwrap_or("bin");
                    if let (Some(parent), Some(dir_name)) = (files_dir.parent(), files_dir.file_name()) {
                        let rel = Path::new(dir_name).join(format!("{stem}.{ext}"));
                        let parent = if parent.as_os_str().is_empty() {
                            Path::new(".")
                        } else {
                            parent
                        };
                        match cellhost_kernel::hostfs::create_beneath(parent, &rel)
                            .and_then(|(mut f, _)| std::io::Write::write_all(&mut f, &bytes))
                        {
                            Ok(()) => *figures += 1,
                            Err(e) => {
                                eprintln!("cellhost: cannot write {}: {e}", parent.join(&rel).display())
                            }
                        }
                    }
                    data.insert(
                        mime.clone(),
                        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
                    );
                }
                Err(e) => eprintln!("cellhost: cannot read {path}: {e}"),
            }
        } else if !v.is_object() || mime == "application/json" {
            data.insert(mime.clone(), v.clone());
        }
    }
    data
}

/// Progress on stderr: a spinner with the elapsed time on a terminal, one
/// line per cell otherwise.
struct Progress {
    tty: bool,
}

impl Progress {
    fn new() -> Self {
        Progress {
            tty: std::io::stderr().is_terminal(),
        }
    }

    async fn track<F: std::future::Future>(&self, i: usize, n: usize, started: Instant, fut: F) -> F::Output {
        if !self.tty {
            return fut.await;
        }
        tokio::pin!(fut);
        let frames = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
        let t0 = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut k = 0;
        loop {
            tokio::select! {
                out = &mut fut => {
                    eprint!("\r\x1b[2K");
                    return out;
                }
                _ = tick.tick() => {
                    if t0.elapsed() > Duration::from_millis(300) {
                        eprint!("\r\x1b[2K{} cell {i}/{n}  {:.1} s (total {:.1} s)", frames[k % frames.len()], t0.elapsed().as_secs_f64(), started.elapsed().as_secs_f64());
                        let _ = std::io::stderr().flush();
                        k += 1;
                    }
                }
            }
        }
    }

    fn done(&self, i: usize, n: usize, r: &CellResult, took: Duration) {
        eprintln!(
            "cell {i}/{n} {} in {:.2} s",
            r.status.as_str(),
            took.as_secs_f64()
        );
    }
}
