//! `cellhost bench remote-scale`: remote kernels at scale on loopback.
//!
//! A thousand remote kernels whose workers are `cellhost-stub-worker` (a
//! process that speaks protocol v1 without an interpreter, so they fit in
//! memory) plus a hundred with real Python workers, every one through the
//! real path: the `loopback` placement starts a `cellhost agent` process,
//! which dials the host's listener over TLS, is admitted with its
//! single-use credential and starts its worker under the kernel init and
//! the sandbox. Measured in one run:
//!
//! * TLS handshakes + admissions per second (64 at once, the listener's
//!   bound on pending handshakes), and kernel starts per second with more
//!   agents dialling at once than that bound (the agents turned away dial
//!   again; none may fail);
//! * the host's RSS, threads and descriptors (the host process alone), and
//!   the total RSS and PSS of the host and every process under it;
//! * a trivial cell on every kernel, and the trivial-cell round trip local
//!   vs remote (p50/p99), idle and with all the kernels live;
//! * after killing every kernel: the processes left under the host (0).
//!
//! The descriptor limit's soft value is raised to the hard one first (a
//! host with a thousand connections needs more than the usual 1024).
//! With `--output PATH`, the section [`HEADING`] of PATH is replaced (or
//! added); the rest of the file is kept.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_kernel::{CellStatus, ExecOptions, Kernel, KernelConfig};
use cellhost_remote::{
    AnyPlacement, HostIdentity, HostOptions, LoopbackPlacement, MemoryNonces, RemoteHost, RemoteStarter,
};

use crate::remote::{handshake, round_trips, rss_kb, spec};
use crate::stats::percentile;

/// The section of BENCHMARKS.md this workload writes.
pub const HEADING: &str = "## Remote kernels at scale (loopback)";

/// How long the agents may take to be reaped once every kernel was
/// killed.
const REAP_WAIT: Duration = Duration::from_secs(60);

/// Cells run at once in the every-kernel pass, and kernels killed at once.
const WAVE: usize = 64;

/// What to run.
#[derive(Debug, Clone)]
pub struct ScaleArgs {
    /// Remote kernels with the stub worker.
    pub stub_kernels: usize,
    /// Remote kernels with real Python workers.
    pub python_kernels: usize,
    /// Kernels starting at once (agents dialling together).
    pub starting: usize,
    /// Cells per round-trip sample set.
    pub cells: usize,
    /// TLS handshakes + admissions for the rate.
    pub handshakes: usize,
    /// The `cellhost` binary run as the agent.
    pub cellhost: PathBuf,
    /// The stub worker.
    pub stub: PathBuf,
    /// The command line, for the report.
    pub command: String,
    /// Where to write the section, if anywhere.
    pub output: Option<PathBuf>,
}

/// Pids of every process under `root` (children, their children, …), from
/// `/proc/*/stat`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            if let Some(ppid) = parse_ppid(&stat) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        if let Some(c) = children.get(&p) {
            out.extend(c.iter().copied());
            todo.extend(c.iter().copied());
        }
    }
    out
}

/// The parent pid in a `/proc/PID/stat` line (the field after the state,
/// which follows the command's closing parenthesis).
fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// (RSS, PSS) of `pid` in KiB, from `/proc/PID/smaps_rollup`.
fn mem_kb(pid: u32) -> (u64, u64) {
    let Ok(t) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
        return (0, 0);
    };
    let field = |name: &str| {
        t.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Rss:"), field("Pss:"))
}

/// The host and every process under it: (processes, RSS sum, PSS sum), KiB.
fn tree_mem() -> (usize, u64, u64) {
    let me = std::process::id();
    let mut pids = descendants(me);
    pids.push(me);
    let (rss, pss) = pids
        .iter()
        .map(|&p| mem_kb(p))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    (pids.len(), rss, pss)
}

/// A `/proc/self/status` field as a number (`Threads`).
fn status_field(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// `text` with the section starting at the line `heading` replaced by
/// `section` (which starts with that heading); the section runs to the next
/// heading of the same or a higher level. Appended when absent.
pub fn replace_section(text: &str, heading: &str, section: &str) -> String {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let ends = |line: &str| {
        let l = line.chars().take_while(|&c| c == '#').count();
        l > 0 && l <= level && line[l..].starts_with(' ')
    };
    let mut out = String::new();
    let mut lines = text.split_inclusive('\n').peekable();
    let mut found = false;
    while let Some(line) = lines.next() {
        if !found && line.trim_end() == heading {
            found = true;
            out.push_str(section.trim_end());
            out.push_str("\n\n");
            while let Some(next) = lines.peek() {
                if ends(next) {
                    break;
                }
                lines.next();
            }
            continue;
        }
        out.push_str(line);
    }
    if !found {
        if !out.is_empty() && !out.ends_with("\n\n") {
            out.push_str(if out.ends_with('\n') { "\n" } else { "\n\n" });
        }
        out.push_str(section.trim_end());
        out.push('\n');
    }
    out
}

/// Starts `n` kernels of `base` (sessions `{prefix}-{i}`), `at_once` at a
/// time, into `live`; (seconds, failures with the first error).
async fn start_many(
    base: &KernelConfig,
    dir: &Path,
    prefix: &str,
    n: usize,
    at_once: usize,
    live: &mut Vec<Kernel>,
) -> (f64, usize, Option<String>) {
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let (mut failed, mut first) = (0usize, None);
    let mut take = |r: Result<Result<Kernel, cellhost_kernel::KernelError>, tokio::task::JoinError>,
                    live: &mut Vec<Kernel>| match r {
        Ok(Ok(k)) => live.push(k),
        Ok(Err(e)) => {
            failed += 1;
            first.get_or_insert_with(|| e.to_string());
        }
        Err(e) => {
            failed += 1;
            first.get_or_insert_with(|| e.to_string());
        }
    };
    for i in 0..n {
        let mut cfg = base.clone();
        cfg.session = format!("{prefix}-{i}");
        cfg.session_dir = dir.join(format!("{prefix}-{i}"));
        set.spawn(async move { Kernel::spawn(cfg).await });
        if set.len() >= at_once.max(1)
            && let Some(r) = set.join_next().await
        {
            take(r, live);
        }
    }
    while let Some(r) = set.join_next().await {
        take(r, live);
    }
    (t.elapsed().as_secs_f64(), failed, first)
}

/// A trivial cell on every kernel, [`WAVE`] at once: (ok, seconds, first
/// failure).
async fn cell_on_each(kernels: &[Kernel]) -> (usize, f64, Option<String>) {
    let t = Instant::now();
    let mut ok = 0;
    let mut first = None;
    for wave in kernels.chunks(WAVE) {
        let mut set = tokio::task::JoinSet::new();
        for k in wave {
            let k = k.clone();
            set.spawn(async move { k.execute("1", ExecOptions::default()).await });
        }
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(res)) if res.status == CellStatus::Ok => ok += 1,
                Ok(Ok(res)) => {
                    first.get_or_insert_with(|| format!("status {}", res.status.as_str()));
                }
                Ok(Err(e)) => {
                    first.get_or_insert_with(|| e.to_string());
                }
                Err(e) => {
                    first.get_or_insert_with(|| e.to_string());
                }
            }
        }
    }
    (ok, t.elapsed().as_secs_f64(), first)
}

/// Kills every kernel, [`WAVE`] at once.
async fn kill_all(kernels: &mut Vec<Kernel>) {
    while !kernels.is_empty() {
        let wave: Vec<Kernel> = kernels.drain(..kernels.len().min(WAVE)).collect();
        let mut set = tokio::task::JoinSet::new();
        for k in wave {
            set.spawn(async move { k.kill().await });
        }
        while set.join_next().await.is_some() {}
    }
}

fn p50_p99(v: &[f64]) -> String {
    format!("{:.2} / {:.2} ms", percentile(v, 50.0), percentile(v, 99.0))
}

fn mib(kb: u64) -> String {
    format!("{:.0} MiB", kb as f64 / 1024.0)
}

/// Runs the workload; returns the exit code (1 when a kernel failed to
/// start or run its cell, or a process was left behind).
pub fn run(config: KernelConfig, args: ScaleArgs) -> u8 {
    let rt = match crate::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost-bench: {e}");
            return 1;
        }
    };
    let (section, ok) = rt.block_on(measure(config, &args));
    drop(rt);
    println!("{section}");
    if let Some(path) = &args.output {
        let old = std::fs::read_to_string(path).unwrap_or_default();
        if let Err(e) = std::fs::write(path, replace_section(&old, HEADING, &section)) {
            eprintln!("cellhost-bench: cannot write {}: {e}", path.display());
            return 1;
        }
        eprintln!(
            "cellhost-bench: wrote the section {HEADING:?} of {}",
            path.display()
        );
    }
    if ok { 0 } else { 1 }
}

/// Lines of the report so far, and whether everything worked.
struct Report {
    rows: String,
    problems: Vec<String>,
}

impl Report {
    fn row(&mut self, what: impl AsRef<str>, value: impl AsRef<str>) {
        let _ = writeln!(self.rows, "| {} | {} |", what.as_ref(), value.as_ref());
        eprintln!(
            "cellhost-bench remote-scale: {} | {}",
            what.as_ref(),
            value.as_ref()
        );
    }
}

async fn measure(config: KernelConfig, args: &ScaleArgs) -> (String, bool) {
    let mut report = Report {
        rows: String::new(),
        problems: Vec::new(),
    };
    let mut live: Vec<Kernel> = Vec::new();
    let dir = match tempfile::Builder::new().prefix("cellhost-bench-scale-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            return (
                format!("{HEADING}\n\ncannot make a scratch directory: {e}\n"),
                false,
            );
        }
    };
    if let Err(e) = scale(config, args, dir.path(), &mut report, &mut live).await {
        report.problems.push(e);
    }
    // Everything is killed and reaped, also after a failure.
    let t = Instant::now();
    kill_all(&mut live).await;
    let killed = t.elapsed().as_secs_f64();
    cellhost_kernel::worker_files::wait_for_asset_builds(Duration::from_secs(30));
    // The placements reap their agents in tasks of their own once the
    // kernels are gone: give them until REAP_WAIT.
    let reaping = Instant::now();
    let mut left = descendants(std::process::id());
    while !left.is_empty() && reaping.elapsed() < REAP_WAIT {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = descendants(std::process::id());
    }
    report.row(
        "killing every kernel; processes left under the host after",
        format!(
            "killed in {killed:.1} s, the agents reaped {:.1} s later; {} left",
            reaping.elapsed().as_secs_f64(),
            left.len()
        ),
    );
    if !left.is_empty() {
        report.problems.push(format!("processes left behind: {left:?}"));
    }
    let mut doc = format!(
        "{HEADING}\n\nMade by `{}` (same shared 2-core machine). Every kernel is remote through the real path: the `loopback` placement starts a `cellhost agent` process, which dials the host over TLS, is admitted with its single-use credential and starts its worker under the kernel init and the sandbox. The stub kernels' worker is `cellhost-stub-worker`, a bench-only binary that speaks protocol v1 (`ready`; `started`, both end markers, `response`) without an interpreter, so a thousand fit in memory; the Python kernels run the real worker. *host* is the host process alone (the agents are processes of their own); *total* sums every process under the host (agents, kernel inits, workers). Round trips are p50 / p99 of one trivial cell (`1`).\n\n| figure | value |\n| --- | --- |\n",
        args.command
    );
    doc.push_str(&report.rows);
    if !report.problems.is_empty() {
        doc.push('\n');
        for p in &report.problems {
            let _ = writeln!(doc, "- did not hold: {p}");
        }
    }
    (doc, report.problems.is_empty())
}

async fn scale(
    config: KernelConfig,
    args: &ScaleArgs,
    dir: &Path,
    report: &mut Report,
    live: &mut Vec<Kernel>,
) -> Result<(), String> {
    let (before, after) = cellhost_remote::host::raise_nofile_limit()?;
    report.row(
        "RLIMIT_NOFILE (soft, raised to the hard limit)",
        format!("{before} → {after}"),
    );
    let host = RemoteHost::start(
        HostOptions::default(),
        HostIdentity::generate()?,
        Arc::new(MemoryNonces::default()),
    )
    .await?;
    let max_pending = host.options().max_pending;
    // Raw TLS handshakes + admissions, as many at once as the bound allows.
    let t = Instant::now();
    let mut left = args.handshakes;
    while left > 0 {
        let n = left.min(max_pending);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (h, s) = (host.clone(), spec(&config));
            set.spawn(async move { handshake(&h, s).await });
        }
        while let Some(r) = set.join_next().await {
            r.map_err(|e| e.to_string())??;
        }
        left -= n;
    }
    report.row(
        format!(
            "TLS handshake + admission (hello → welcome), {}, {max_pending} at once",
            args.handshakes
        ),
        format!("{:.0}/s", args.handshakes as f64 / t.elapsed().as_secs_f64()),
    );
    let admitted0 = host.admitted();

    let starter = Arc::new(RemoteStarter::new(
        "scale",
        host.clone(),
        AnyPlacement::Loopback(LoopbackPlacement::with_program(&args.cellhost, Vec::new())),
        None,
    ));
    let mut py_local = config.clone();
    py_local.starter = None;
    py_local.session_dir = dir.join("local-python");
    let mut py_remote = config.clone();
    py_remote.starter = Some(starter.clone());
    let mut stub_local = py_local.clone();
    stub_local.python = args.stub.clone();
    stub_local.session_dir = dir.join("local-stub");
    let mut stub_remote = py_remote.clone();
    stub_remote.python = args.stub.clone();

    // Round trips with nothing else running.
    let mut rt_rows: Vec<(String, Vec<f64>)> = Vec::new();
    for (name, cfg) in [
        ("local Python", &py_local),
        ("remote Python, idle host", &py_remote),
        ("local stub", &stub_local),
        ("remote stub, idle host", &stub_remote),
    ] {
        let mut cfg = cfg.clone();
        cfg.session = "rt".into();
        cfg.session_dir = dir.join(format!("rt-{}", rt_rows.len()));
        let k = Kernel::spawn(cfg).await.map_err(|e| format!("{name}: {e}"))?;
        live.push(k.clone());
        let v = round_trips(&k, args.cells).await;
        k.kill().await;
        live.retain(|x| x.label() != k.label());
        rt_rows.push((name.to_string(), v?));
    }

    // The stub fleet.
    let rss0 = rss_kb();
    let (secs, failed, first) =
        start_many(&stub_remote, dir, "stub", args.stub_kernels, args.starting, live).await;
    let turned_away = host.refusal_count("too_many_handshakes");
    report.row(
        format!(
            "{} stub kernels started, {} at once (listener bound {max_pending})",
            args.stub_kernels, args.starting
        ),
        format!(
            "{secs:.1} s ({:.1} kernels/s); admitted {}; failed {failed}; connections turned away at the bound and dialled again {turned_away}",
            live.len() as f64 / secs,
            host.admitted() - admitted0,
        ),
    );
    if let Some(e) = first {
        report
            .problems
            .push(format!("{failed} stub kernels did not start, first: {e}"));
    }
    let rss1 = rss_kb();
    let (procs, trss, tpss) = tree_mem();
    let stubs = live.len().max(1) as u64;
    report.row(
        format!("host with {} live stub kernels", live.len()),
        format!(
            "RSS {} → {} ({:.0} KiB per kernel); {} threads; {} descriptors",
            mib(rss0),
            mib(rss1),
            rss1.saturating_sub(rss0) as f64 / stubs as f64,
            status_field("Threads:"),
            open_fds()
        ),
    );
    report.row(
        format!("total with {} live stub kernels ({procs} processes)", live.len()),
        format!(
            "RSS sum {}, PSS sum {} ({:.1} MiB PSS per kernel)",
            mib(trss),
            mib(tpss),
            tpss as f64 / 1024.0 / stubs as f64
        ),
    );
    let (ok, secs, first) = cell_on_each(live).await;
    report.row(
        format!("a trivial cell on every stub kernel, {WAVE} at once"),
        format!("{ok}/{} ok in {secs:.1} s", live.len()),
    );
    if let Some(e) = first {
        report
            .problems
            .push(format!("a cell on a stub kernel failed: {e}"));
    }
    if let Some(k) = live.first() {
        rt_rows.push((
            format!("remote stub, {} live kernels", live.len()),
            round_trips(k, args.cells).await?,
        ));
    }

    // The Python fleet on top.
    let n_stub = live.len();
    let (secs, failed, first) = start_many(
        &py_remote,
        dir,
        "py",
        args.python_kernels,
        args.starting.min(16),
        live,
    )
    .await;
    let n_py = live.len() - n_stub;
    report.row(
        format!(
            "{} Python kernels started on top, {} at once",
            args.python_kernels,
            args.starting.min(16)
        ),
        format!(
            "{secs:.1} s ({:.1} kernels/s); failed {failed}",
            n_py as f64 / secs
        ),
    );
    if let Some(e) = first {
        report
            .problems
            .push(format!("{failed} Python kernels did not start, first: {e}"));
    }
    let rss2 = rss_kb();
    let (procs, trss, tpss) = tree_mem();
    report.row(
        format!("host with {n_stub} stub + {n_py} Python kernels"),
        format!(
            "RSS {} ({:.0} KiB per kernel over the start); {} threads; {} descriptors",
            mib(rss2),
            rss2.saturating_sub(rss0) as f64 / live.len().max(1) as f64,
            status_field("Threads:"),
            open_fds()
        ),
    );
    report.row(
        format!("total with {n_stub} stub + {n_py} Python kernels ({procs} processes)"),
        format!("RSS sum {}, PSS sum {}", mib(trss), mib(tpss)),
    );
    let (ok, secs, first) = cell_on_each(&live[n_stub..]).await;
    report.row(
        format!("a trivial cell on every Python kernel, {WAVE} at once"),
        format!("{ok}/{n_py} ok in {secs:.1} s"),
    );
    if let Some(e) = first {
        report
            .problems
            .push(format!("a cell on a Python kernel failed: {e}"));
    }
    let total = live.len();
    if let Some(k) = live.get(n_stub) {
        rt_rows.push((
            format!("remote Python, {total} live kernels"),
            round_trips(k, args.cells).await?,
        ));
    }
    let mut cfg = py_local.clone();
    cfg.session = "rt-loaded".into();
    cfg.session_dir = dir.join("rt-loaded");
    let k = Kernel::spawn(cfg)
        .await
        .map_err(|e| format!("local Python: {e}"))?;
    live.push(k.clone());
    rt_rows.push((
        format!("local Python, {total} live remote kernels"),
        round_trips(&k, args.cells).await?,
    ));
    for (name, v) in &rt_rows {
        report.row(
            format!("trivial cell round trip, {name}, {} cells", v.len()),
            p50_p99(v),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_replaced_and_the_rest_kept() {
        let doc = "# B\n\nintro\n\n## A\n\nold a\n\n## Remote kernels at scale (loopback)\n\nold\n| x |\n\n### sub\n\nold sub\n\n## C\n\nc\n";
        let new = replace_section(doc, HEADING, &format!("{HEADING}\n\nnew\n"));
        assert_eq!(
            new,
            "# B\n\nintro\n\n## A\n\nold a\n\n## Remote kernels at scale (loopback)\n\nnew\n\n## C\n\nc\n"
        );
        // Again: the same result.
        assert_eq!(
            replace_section(&new, HEADING, &format!("{HEADING}\n\nnew\n")),
            new
        );
    }

    #[test]
    fn a_missing_section_is_appended() {
        let s = format!("{HEADING}\n\nnew\n");
        assert_eq!(replace_section("", HEADING, &s), s);
        assert_eq!(replace_section("# B\nx\n", HEADING, &s), format!("# B\nx\n\n{s}"));
        assert_eq!(replace_section("# B\nx", HEADING, &s), format!("# B\nx\n\n{s}"));
    }

    #[test]
    fn the_parent_pid_is_read_past_a_command_with_parentheses() {
        assert_eq!(parse_ppid("42 (a) b (c)) S 7 42 42 0"), Some(7));
        assert_eq!(parse_ppid("garbage"), None);
    }

    #[test]
    fn descendants_include_grandchildren() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let me = std::process::id();
        // The grandchild exists once `sh` forked it: wait for it.
        let mut found = Vec::new();
        for _ in 0..500 {
            found = descendants(me);
            if found.len() >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::process::Command::new("pkill")
            .args(["-KILL", "-P", &sh.id().to_string()])
            .status();
        let _ = sh.kill();
        let _ = sh.wait();
        assert!(found.contains(&sh.id()), "{found:?}");
        assert!(found.len() >= 2, "no grandchild among {found:?}");
    }
}
