//! `cellhost run INPUT [--output PATH] [--python PATH] [--timeout SECONDS] [--allow-errors]
//! [-p NAME VALUE]... [--parameters-file FILE]`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cellhost_kernel::CellResult;
use cellhost_notebook::{Notebook, Observer, ParamValue, Parameters, RunOptions, Stop, default_output_path};
use cellhost_sessions::requests::RunNotebookRequest;
use cellhost_sessions::{Origin, SessionSpec};

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
    /// Deadline per cell in seconds (default: `cell_timeout_s` of the
    /// configuration, 300 unless set; 0 = none).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Keep going after a cell fails.
    #[arg(long)]
    allow_errors: bool,
    /// Session name in the journal (default: the input file's stem).
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    /// A parameter, as papermill's `-p`: injected in a cell tagged
    /// `injected-parameters` after the cell tagged `parameters` (or
    /// first). VALUE is typed as papermill types it: True, False, None,
    /// an int, a float, else a string. Repeatable; wins over the file.
    #[arg(short = 'p', long = "parameters", num_args = 2, value_names = ["NAME", "VALUE"], action = clap::ArgAction::Append)]
    parameter: Vec<String>,
    /// Parameters from a YAML or JSON file (a mapping of names to values),
    /// applied before any `-p`.
    #[arg(long, value_name = "FILE")]
    parameters_file: Option<PathBuf>,
}

/// The parameters of `args`: the file's, then each `-p` in order.
fn parameters(args: &RunArgs) -> Result<Parameters, String> {
    let mut params = Parameters::new();
    if let Some(file) = &args.parameters_file {
        let text =
            std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        params = Parameters::from_yaml_str(&text, &file.display().to_string()).map_err(|e| e.to_string())?;
    }
    for pair in args.parameter.chunks(2) {
        if let [name, value] = pair {
            params
                .set(name, ParamValue::from_cli(value))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(params)
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
    let parameters = match parameters(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return EXIT_USAGE;
        }
    };
    let mut args = args;
    // The language: --language, else R for a `.R` script, else the
    // notebook's (kernelspec `ir`, language_info.name `R`).
    if args.kernel.language.is_none() {
        let is_r_script = args
            .input
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("r"));
        args.kernel.language = if is_r_script {
            Some("r".to_string())
        } else {
            nb.language()
                .filter(|l| cellhost_kernel::for_language(l).is_some())
        };
    }
    let deadline = match common::parse_timeout(args.timeout) {
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
        let mut cfg = cfg;
        // A notebook runs in its own directory, as under Jupyter.
        if let Some(dir) = std::fs::canonicalize(&args.input)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .filter(|d| common::workdir_allowed(d))
        {
            cfg.cwd = Some(dir);
        }
        // One kernel is needed: no warm pool; every cell journaled.
        let registry = match common::start_one_shot(cfg, true).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 1;
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let req = RunNotebookRequest {
            session: SessionSpec::new(common::cli_owner(), &session_name),
            deadline,
            options: RunOptions {
                files_dir: Some(files_dir.clone()),
                allow_errors: args.allow_errors,
                timeout: None,
                stop: Some(stop.clone()),
            },
            origin: Origin {
                origin: "cli:run".into(),
                context: Some(serde_json::json!({"input": args.input.display().to_string()})),
            },
            parameters,
        };
        let key = match req.session.key(&registry) {
            Ok(k) => k,
            Err(e) => {
                registry.shutdown().await;
                return common::request_failed(&e);
            }
        };
        let started = Instant::now();
        // Ctrl-C interrupts the running cell; the run then stops, writes what
        // it has and exits 130.
        let watcher = {
            let (stop, registry, key) = (stop.clone(), registry.clone(), key.clone());
            tokio::spawn(async move {
                while tokio::signal::ctrl_c().await.is_ok() {
                    stop.store(true, Ordering::SeqCst);
                    if let Some(k) = registry.kernel(&key) {
                        k.interrupt().await;
                    }
                }
            })
        };
        let mut progress = Progress::start(started);
        let summary = req.execute(&registry, &mut nb, &mut progress).await;
        progress.finish();
        watcher.abort();
        registry.shutdown().await;
        let summary = match summary {
            Ok(s) => s,
            Err(e) => return common::request_failed(&e),
        };
        let total = summary.total;
        match &summary.stop {
            None => {}
            Some(Stop::Interrupted { cell, before: true }) => {
                eprintln!("cellhost: interrupted before cell {cell}/{total}; writing what ran");
            }
            Some(Stop::Interrupted { cell, before: false }) => {
                eprintln!("cellhost: interrupted at cell {cell}/{total}; writing what ran");
            }
            Some(Stop::CellFailed {
                cell,
                status,
                traceback,
            }) => {
                eprintln!(
                    "cellhost: stopped at cell {cell}/{total} ({}); use --allow-errors to go on",
                    status.as_str()
                );
                for line in traceback {
                    eprintln!("{line}");
                }
            }
            Some(Stop::RunnerFailed { cell, message } | Stop::NotebookFailed { cell, message }) => {
                eprintln!("cellhost: cell {cell}/{total}: {message}");
            }
            Some(Stop::JournalFailed { cell, message }) => {
                eprintln!(
                    "cellhost: cell {cell}/{total} ran but the journal failed ({message}); stopping, since the journal would not show this run"
                );
            }
        }
        if let Err(e) = nb.write(&output) {
            eprintln!("cellhost: {e}");
            return 1;
        }
        eprintln!(
            "cellhost: wrote {} ({} cells, {:.1} s){}",
            output.display(),
            total,
            started.elapsed().as_secs_f64(),
            if summary.figures > 0 {
                format!("; {} figure(s) in {}", summary.figures, files_dir.display())
            } else {
                String::new()
            }
        );
        summary.exit_code()
    })
}

/// Progress on stderr: a spinner with the elapsed time on a terminal, one
/// line per cell otherwise. The spinner is its own task, fed by the
/// executor's [`Observer`] calls.
struct Progress {
    current: Arc<Mutex<Option<(usize, usize, Instant)>>>,
    spinner: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(started: Instant) -> Self {
        let current: Arc<Mutex<Option<(usize, usize, Instant)>>> = Arc::new(Mutex::new(None));
        let spinner = std::io::stderr().is_terminal().then(|| {
            let current = current.clone();
            tokio::spawn(async move {
                let frames = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                let mut k = 0;
                loop {
                    tick.tick().await;
                    let now = current.lock().ok().and_then(|c| *c);
                    if let Some((i, n, t0)) = now
                        && t0.elapsed() > Duration::from_millis(300)
                    {
                        eprint!(
                            "\r\x1b[2K{} cell {i}/{n}  {:.1} s (total {:.1} s)",
                            frames[k % frames.len()],
                            t0.elapsed().as_secs_f64(),
                            started.elapsed().as_secs_f64()
                        );
                        let _ = std::io::stderr().flush();
                        k += 1;
                    }
                }
            })
        });
        Progress { current, spinner }
    }

    fn finish(&mut self) {
        if let Some(h) = self.spinner.take() {
            h.abort();
        }
    }
}

impl Observer for Progress {
    fn cell_started(&mut self, n: usize, total: usize) {
        if let Ok(mut c) = self.current.lock() {
            *c = Some((n, total, Instant::now()));
        }
    }

    fn cell_done(&mut self, n: usize, total: usize, r: &CellResult, took: Duration) {
        if let Ok(mut c) = self.current.lock() {
            *c = None;
        }
        if self.spinner.is_some() {
            eprint!("\r\x1b[2K");
        }
        eprintln!(
            "cell {n}/{total} {} in {:.2} s",
            r.status.as_str(),
            took.as_secs_f64()
        );
    }

    fn note(&mut self, message: &str) {
        eprintln!("cellhost: {message}");
    }
}
