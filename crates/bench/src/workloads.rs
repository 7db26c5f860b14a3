//! The workloads of `cellhost-bench`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cellhost_kernel::{CellStatus, ExecOptions, Kernel, KernelConfig, LiveEvent};
use tokio::sync::mpsc;

use super::BenchArgs;
use super::stats::{Row, row};

const PEERS_PY: &str = include_str!("../../../bench/peers.py");

/// The penguins notebook W7 runs unless `--notebook` names another.
const PENGUINS: &str = include_str!("../../../examples/penguins.ipynb");

/// What the workloads share.
pub struct Ctx<'a> {
    /// Command-line arguments.
    pub args: &'a BenchArgs,
    /// Kernel configuration (interpreter, session dir).
    pub cfg: KernelConfig,
    /// Scratch directory (removed when the bench ends).
    pub dir: PathBuf,
    /// The `cellhost` binary the surface workloads run.
    pub cellhost: PathBuf,
    /// Report rows.
    pub rows: Vec<Row>,
    /// Notes under the table.
    pub notes: Vec<String>,
}

type R = Result<(), String>;

impl Ctx<'_> {
    /// A command of the `cellhost` binary, with `--config` when the bench
    /// was given one.
    pub fn cellhost(&self) -> Command {
        let mut c = Command::new(&self.cellhost);
        if let Some(config) = &self.args.config {
            c.arg("--config").arg(config);
        }
        c
    }
}

/// The notebook W7 runs: `given`, else the embedded penguins notebook,
/// written to `dir` (so W7 runs from any directory).
///
/// # Errors
/// The embedded notebook cannot be written (the message names the path).
pub fn notebook(given: Option<&Path>, dir: &Path) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let path = dir.join("penguins.ipynb");
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, PENGUINS))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Runs one workload by name.
pub async fn run_one(ctx: &mut Ctx<'_>, w: &str) -> R {
    match w {
        "W1" => w1(ctx).await,
        "W2" => w2(ctx).await,
        "W2S" => w2s(ctx).await,
        "W2T" => super::template::w2t(ctx).await,
        "R2T" => super::rtemplate::r2t(ctx).await,
        "R2TS" => super::rtemplate::r2ts(ctx).await,
        "W3" => w3(ctx).await,
        "W4" => w4(ctx).await,
        "KILL" => kill_tree(ctx).await,
        "HOSTKILL" => host_kill(ctx),
        "W7" => w7(ctx),
        "POOL" => super::sessions::pool(ctx).await,
        "FORK" => super::fork::fork(ctx).await,
        "JOURNAL" => super::sessions::journal(ctx).await,
        "CKPT" => super::checkpoint::ckpt(ctx).await,
        "W5" => super::sessions::w5(ctx).await,
        "IDLE200" => super::sessions::idle200(ctx).await,
        "DAEMON" => super::surfaces::daemon(ctx).await,
        "HTTP" => super::surfaces::http(ctx).await,
        "HTTP50" => super::surfaces::http50(ctx).await,
        "MCP" => super::surfaces::mcp(ctx).await,
        "MCP50" => super::surfaces::mcp50(ctx).await,
        "PYSDK" => super::pysdk::pysdk(ctx),
        _ => Err(format!("unknown workload {w}")),
    }
}

pub(super) fn run_peer(ctx: &Ctx<'_>, args: &[String]) -> Result<serde_json::Value, String> {
    let script = ctx.dir.join("peers.py");
    std::fs::create_dir_all(&ctx.dir).map_err(s)?;
    std::fs::write(&script, PEERS_PY).map_err(s)?;
    let out = Command::new(&ctx.cfg.python)
        .arg(&script)
        .args(args)
        .output()
        .map_err(s)?;
    if !out.status.success() {
        return Err(format!(
            "peer {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("peer output: {e}"))
}

pub(super) fn floats(v: &serde_json::Value, key: &str) -> Vec<f64> {
    v.get(key)
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default()
}

pub(super) fn compare(ctx: &mut Ctx<'_>, mine: &Row, mut peer: Row) {
    peer.ratio = Some(peer.p50 / mine.p50);
    ctx.rows.push(peer);
}

async fn w1(ctx: &mut Ctx<'_>) -> R {
    let n = ctx.args.cells;
    let k = Kernel::spawn(ctx.cfg.clone()).await.map_err(s)?;
    k.execute("x = 0", ExecOptions::default()).await.map_err(s)?;
    for _ in 0..20 {
        k.execute("x += 1", ExecOptions::default()).await.map_err(s)?;
    }
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = k.execute("x += 1", ExecOptions::default()).await.map_err(s)?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        if r.status != CellStatus::Ok {
            return Err(format!("W1 cell failed: {r:?}"));
        }
    }
    // The same cell behind a magic (IPython's own %time when the
    // interpreter has IPython, else the built-in one).
    for _ in 0..20 {
        k.execute("%time x += 1", ExecOptions::default())
            .await
            .map_err(s)?;
    }
    let mut magic = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = k
            .execute("%time x += 1", ExecOptions::default())
            .await
            .map_err(s)?;
        magic.push(t.elapsed().as_secs_f64() * 1000.0);
        if r.status != CellStatus::Ok {
            return Err(format!("W1 magic cell failed: {r:?}"));
        }
    }
    k.kill().await;
    let mine = row("W1 round trip `x += 1`", "cellhost", &lat);
    ctx.rows.push(mine.clone());
    let mine_magic = row("W1 round trip `%time x += 1`", "cellhost", &magic);
    ctx.rows.push(mine_magic.clone());
    if ctx.args.peers {
        let v = run_peer(ctx, &["w1".into(), n.to_string()])?;
        compare(
            ctx,
            &mine,
            row(
                "W1 round trip `x += 1`",
                "ipykernel + jupyter_client",
                &floats(&v, "ipykernel_ms"),
            ),
        );
        compare(
            ctx,
            &mine,
            row(
                "W1 round trip `x += 1`",
                "python -c per cell",
                &floats(&v, "python_c_ms"),
            ),
        );
        compare(
            ctx,
            &mine_magic,
            row(
                "W1 round trip `%time x += 1`",
                "ipykernel + jupyter_client",
                &floats(&v, "ipykernel_magic_ms"),
            ),
        );
    }
    Ok(())
}

async fn w2(ctx: &mut Ctx<'_>) -> R {
    let mut lat = Vec::new();
    for i in 0..ctx.args.kernels {
        let mut c = ctx.cfg.clone();
        c.generation = i as u64 + 1;
        let t = Instant::now();
        let k = Kernel::spawn(c).await.map_err(s)?;
        k.execute("1", ExecOptions::default()).await.map_err(s)?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        k.kill().await;
    }
    let mine = row("W2 spawn to first result (cold)", "cellhost", &lat);
    ctx.rows.push(mine.clone());
    if ctx.args.peers {
        let v = run_peer(ctx, &["w2".into(), ctx.args.kernels.to_string()])?;
        compare(
            ctx,
            &mine,
            row(
                "W2 spawn to first result (cold)",
                "ipykernel + jupyter_client",
                &floats(&v, "ipykernel_ms"),
            ),
        );
    }
    Ok(())
}

/// W2S: spawn to first result with the sandbox `off` and `auto`,
/// alternating kernel by kernel so machine noise hits both alike.
async fn w2s(ctx: &mut Ctx<'_>) -> R {
    use cellhost_sandbox::profile::SandboxMode;
    let mut lat = [Vec::new(), Vec::new()];
    let modes = [SandboxMode::Off, SandboxMode::Auto];
    for i in 0..ctx.args.kernels {
        for (m, mode) in modes.iter().enumerate() {
            let mut c = ctx.cfg.clone();
            c.generation = i as u64 + 1;
            c.sandbox.mode = *mode;
            let t = Instant::now();
            let k = Kernel::spawn(c).await.map_err(s)?;
            k.execute("1", ExecOptions::default()).await.map_err(s)?;
            lat[m].push(t.elapsed().as_secs_f64() * 1000.0);
            k.kill().await;
        }
    }
    let off = row("W2S spawn to first result, sandbox off", "cellhost", &lat[0]);
    let auto = row("W2S spawn to first result, sandbox auto", "cellhost", &lat[1]);
    ctx.notes.push(format!(
        "W2S: the default sandbox (namespaces, Landlock, seccomp, cgroup) adds {:.1} ms at p50 to a kernel's start ({:.1} → {:.1} ms).",
        auto.p50 - off.p50,
        off.p50,
        auto.p50
    ));
    ctx.rows.push(off);
    ctx.rows.push(auto);
    Ok(())
}

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// W3 runs of each system (1 GB each).
const W3_RUNS: usize = 3;

async fn w3(ctx: &mut Ctx<'_>) -> R {
    const CHUNKS: u64 = 1024;
    const LINES: u64 = 10_486;
    let bytes = CHUNKS * LINES * 100;
    let code = format!(
        "import sys\nchunk = ('x' * 99 + '\\n') * {LINES}\nfor _ in range({CHUNKS}):\n    sys.stdout.write(chunk)"
    );
    let k = Kernel::spawn(ctx.cfg.clone()).await.map_err(s)?;
    k.execute("1", ExecOptions::default()).await.map_err(s)?;
    // Reset the peak-RSS mark (clear_refs 5), so VmHWM is this workload's.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before = status_kb("VmRSS:");
    let mut mbps = Vec::new();
    for _ in 0..W3_RUNS {
        let t = Instant::now();
        let r = k
            .execute(code.as_str(), ExecOptions::default())
            .await
            .map_err(s)?;
        let secs = t.elapsed().as_secs_f64();
        let total = r.truncated.get("stdout").map(|t| t.total_bytes).unwrap_or(0);
        if total != bytes {
            k.kill().await;
            return Err(format!("W3 saw {total} bytes, expected {bytes}"));
        }
        mbps.push(bytes as f64 / 1e6 / secs);
    }
    let peak = status_kb("VmHWM:");
    k.kill().await;
    let mut mine = row("W3 1 GB of stdout", "cellhost", &mbps);
    mine.unit = "MB/s";
    mine.note = format!(
        "host RSS {:.1} MB before, peak {:.1} MB over the runs (+{:.1} MB)",
        rss_before as f64 / 1024.0,
        peak as f64 / 1024.0,
        peak.saturating_sub(rss_before) as f64 / 1024.0,
    );
    ctx.rows.push(mine.clone());
    if ctx.args.peers {
        let mb = 1000;
        let v = run_peer(ctx, &["w3".into(), mb.to_string(), W3_RUNS.to_string()])?;
        let mut peer = row(
            "W3 1 GB of stdout",
            "ipykernel + jupyter_client",
            &floats(&v, "mbps"),
        );
        peer.unit = "MB/s";
        peer.ratio = Some(mine.p50 / peer.p50);
        peer.note = format!("{mb} MB through iopub; ratio = cellhost MB/s ÷ ipykernel MB/s");
        ctx.rows.push(peer);
    }
    Ok(())
}

/// Keeps one core busy while it lives.
struct Spinner(std::process::Child);

impl Spinner {
    fn start(python: &Path) -> Result<Self, String> {
        Command::new(python)
            .args(["-c", "while True: pass"])
            .spawn()
            .map(Spinner)
            .map_err(s)
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn w4(ctx: &mut Ctx<'_>) -> R {
    let _busy = Spinner::start(&ctx.cfg.python)?;
    let has_numpy = Command::new(&ctx.cfg.python)
        .args(["-c", "import numpy"])
        .status()
        .map(|st| st.success())
        .unwrap_or(false);
    let mut kinds = vec![
        (
            "time.sleep",
            "import time\nprint('go', flush=True)\ntime.sleep(60)",
        ),
        (
            "pure-Python loop",
            "print('go', flush=True)\nn = 0\nwhile True:\n    n += 1",
        ),
    ];
    if has_numpy {
        kinds.push((
            "numpy matmul loop (BLAS threads)",
            "import numpy as np\na = np.random.rand(400, 400)\nprint('go', flush=True)\nwhile True:\n    a = (a @ a) / 400.0",
        ));
    }
    let k = Kernel::spawn(ctx.cfg.clone()).await.map_err(s)?;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for (name, code) in kinds {
        let mut lat = Vec::new();
        let mut kept = 0usize;
        for _ in 0..ctx.args.interrupts {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let h = k
                .submit(
                    code,
                    ExecOptions {
                        live: Some(tx),
                        ..Default::default()
                    },
                )
                .map_err(s)?;
            loop {
                match rx.recv().await {
                    Some(LiveEvent::Stdout(t)) if t.contains("go") => break,
                    Some(_) => continue,
                    None => return Err("W4 cell ended before it printed".into()),
                }
            }
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            tokio::time::sleep(Duration::from_millis(10 + seed % 40)).await;
            let t = Instant::now();
            k.interrupt().await;
            let r = h.wait().await.map_err(s)?;
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
            if r.interrupt.as_ref().is_some_and(|i| i.state_kept) {
                kept += 1;
            }
            if !k.is_alive() {
                return Err(format!("W4 {name}: the kernel was killed: {r:?}"));
            }
        }
        let mut r = row(&format!("W4 interrupt to settled: {name}"), "cellhost", &lat);
        r.note = format!("state kept {kept}/{}; other core busy", lat.len());
        ctx.rows.push(r);
    }
    k.kill().await;
    Ok(())
}

async fn kill_tree(ctx: &mut Ctx<'_>) -> R {
    let code = "import subprocess\nps = [subprocess.Popen(['sleep', '600']) for _ in range(40)]\nps += [subprocess.Popen(['setsid', 'sleep', '600']) for _ in range(10)]\nprint('ok')";
    let mut lat = Vec::new();
    let mut survivors = 0usize;
    for _ in 0..10 {
        let k = Kernel::spawn(ctx.cfg.clone()).await.map_err(s)?;
        k.execute(code, ExecOptions::default()).await.map_err(s)?;
        let init = k.info().init_pid as i32;
        let tree: Vec<i32> = cellhost_sandbox::procfs::descendants(init)
            .iter()
            .map(|p| p.pid)
            .collect();
        if tree.len() < 51 {
            return Err(format!(
                "KILL: expected 51 processes under the init, saw {}",
                tree.len()
            ));
        }
        let t = Instant::now();
        k.kill().await;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        survivors += tree.iter().chain([&init]).filter(|p| alive(**p)).count();
    }
    let mut r = row("kill to reaped, 50 descendants (10 setsid)", "cellhost", &lat);
    r.note = format!("processes alive afterwards: {survivors}");
    ctx.rows.push(r);
    Ok(())
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(t) => cellhost_sandbox::procfs::parse_stat(pid, &t).is_some_and(|p| p.state != 'Z'),
        Err(_) => false,
    }
}

fn host_kill(ctx: &mut Ctx<'_>) -> R {
    let exe = std::env::current_exe().map_err(s)?;
    let mut child = Command::new(exe)
        .args(["__bench-host", "--python"])
        .arg(&ctx.cfg.python)
        .arg("--dir")
        .arg(ctx.dir.join("hostkill"))
        .arg("20")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(s)?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut pids = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.map_err(s)?;
        if line == "READY" {
            break;
        }
        if let Some(p) = line.strip_prefix("PID ").and_then(|p| p.parse::<i32>().ok()) {
            pids.push(p);
        }
    }
    let t = Instant::now();
    let _ = child.kill();
    let _ = child.wait();
    // The figure is the count 2 s after the host died; check earlier too.
    let mut gone_at = None;
    while t.elapsed() < Duration::from_secs(2) {
        if gone_at.is_none() && !pids.iter().any(|p| alive(*p)) {
            gone_at = Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let left = pids.iter().filter(|p| alive(**p)).count();
    let mut r = row(
        "host SIGKILL, 20 busy kernels",
        "cellhost",
        &[gone_at.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)],
    );
    r.note = format!(
        "{} processes in the kernels' trees; alive 2 s later: {left}",
        pids.len()
    );
    ctx.rows.push(r);
    Ok(())
}

/// W7 runs of each system; they alternate run by run, so machine noise
/// falls on both alike.
const W7_RUNS: usize = 5;

fn w7(ctx: &mut Ctx<'_>) -> R {
    let nb = notebook(ctx.args.notebook.as_deref(), &ctx.dir.join("w7"))?;
    let out = ctx.dir.join("w7.ipynb");
    let mut lat = Vec::new();
    let mut peer = Vec::new();
    // nbclient's own command line, timed as a whole process like `cellhost run`.
    let jupyter_execute = ctx
        .cfg
        .python
        .parent()
        .map(|d| d.join("jupyter-execute"))
        .filter(|p| p.is_file() && ctx.args.peers);
    let mut peer_cli = Vec::new();
    for _ in 0..W7_RUNS {
        let t = Instant::now();
        let st = ctx
            .cellhost()
            .arg("run")
            .arg(&nb)
            .arg("--output")
            .arg(&out)
            .arg("--python")
            .arg(&ctx.cfg.python)
            .stderr(Stdio::null())
            .status()
            .map_err(s)?;
        if !st.success() {
            return Err(format!("cellhost run failed: {st}"));
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        if ctx.args.peers {
            let v = run_peer(ctx, &["w7".into(), nb.display().to_string(), "1".into()])?;
            peer.extend(floats(&v, "nbclient_ms"));
        }
        if let Some(cli) = &jupyter_execute {
            let t = Instant::now();
            let st = Command::new(cli)
                .arg(&nb)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map_err(s)?;
            if !st.success() {
                return Err(format!("jupyter execute failed: {st}"));
            }
            peer_cli.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let mine = row("W7 penguins notebook end to end", "cellhost run", &lat);
    ctx.rows.push(mine.clone());
    if ctx.args.peers {
        compare(
            ctx,
            &mine,
            row("W7 penguins notebook end to end", "nbclient + ipykernel", &peer),
        );
        if !peer_cli.is_empty() {
            compare(
                ctx,
                &mine,
                row(
                    "W7 penguins notebook end to end",
                    "jupyter execute (nbclient's command line)",
                    &peer_cli,
                ),
            );
        }
        ctx.notes.push(
            "W7 times `cellhost run` as a whole process (start-up included), and `jupyter execute` (nbclient's command line) the same way; the `nbclient + ipykernel` row times only `NotebookClient.execute()` inside an already started Python (nbclient's import excluded), in its favour. The runs alternate between the systems.".into(),
        );
    }
    Ok(())
}

/// Hidden `__bench-host`: starts `n` kernels, each busy in a cell with a
/// child process, prints `PID <pid>` for every process of their trees and
/// `READY`, then waits to be killed.
pub fn host_for_bench(python: &Path, dir: &Path, n: usize) -> u8 {
    let Ok(rt) = crate::runtime() else {
        return 1;
    };
    rt.block_on(async {
        let mut kernels = Vec::new();
        for i in 0..n {
            let mut cfg = KernelConfig::new(python, dir.join(format!("k{i}")));
            cfg.session = format!("bench-host-{i}");
            let Ok(k) = Kernel::spawn(cfg).await else { return 1 };
            let (tx, mut rx) = mpsc::unbounded_channel();
            let code = "import subprocess, time\np = subprocess.Popen(['sleep', '600'])\nprint('go', flush=True)\nwhile True:\n    time.sleep(0.05)";
            let Ok(h) = k.submit(code, ExecOptions { live: Some(tx), ..Default::default() }) else { return 1 };
            while let Some(ev) = rx.recv().await {
                if matches!(ev, LiveEvent::Stdout(ref t) if t.contains("go")) {
                    break;
                }
            }
            kernels.push((k, h));
        }
        for (k, _) in &kernels {
            let init = k.info().init_pid as i32;
            println!("PID {init}");
            for p in cellhost_sandbox::procfs::descendants(init) {
                println!("PID {}", p.pid);
            }
        }
        println!("READY");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::future::pending::<()>().await;
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w7_writes_the_embedded_penguins_notebook_unless_one_is_given() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = notebook(None, &dir.path().join("w7")).expect("embedded notebook");
        assert_eq!(p, dir.path().join("w7/penguins.ipynb"));
        let text = std::fs::read_to_string(&p).expect("written");
        assert_eq!(text, PENGUINS);
        let v: serde_json::Value = serde_json::from_str(&text).expect("the embedded notebook is JSON");
        assert_eq!(v["nbformat"], 4);
        assert!(text.contains("load_penguins"), "not the penguins notebook");
        let given = Path::new("/somewhere/else.ipynb");
        assert_eq!(notebook(Some(given), dir.path()).expect("given"), given);
    }
}
