//! `cellhost bench remote`: remote kernels on loopback, in one run —
//! TLS handshakes and admissions per second (sequential and 64 at once),
//! host RSS with N live remote kernels whose agents are `cellhost agent`
//! processes (so the host's RSS is the host's alone), and the round trip
//! of a trivial cell, local vs remote over TLS.
//! Prints a Markdown section for BENCHMARKS.md.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_kernel::{ExecOptions, Kernel, KernelConfig};
use cellhost_remote::wire::{AgentSpec, HANDSHAKE_CAP, Msg, read_msg, write_msg};
use cellhost_remote::{
    AnyPlacement, HostIdentity, HostOptions, LoopbackPlacement, MemoryNonces, RemoteHost, RemoteStarter,
};

use crate::stats::percentile;

pub(crate) fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

pub(crate) fn spec(config: &KernelConfig) -> AgentSpec {
    AgentSpec {
        session: "bench".into(),
        generation: 1,
        language: "python".into(),
        python: config.python.clone(),
        sandbox: config.sandbox.clone(),
        limits: Default::default(),
        tools: Vec::new(),
        startup_timeout_ms: 60_000,
        heartbeat_ms: 5_000,
    }
}

/// One TLS connection, `hello` with a fresh credential, `welcome`.
pub(crate) async fn handshake(host: &RemoteHost, spec: AgentSpec) -> Result<(), String> {
    let mut expected = host.expect(spec, Duration::from_secs(60));
    let cred = expected.credential().clone();
    let connector = tokio_rustls::TlsConnector::from(cellhost_remote::tls::client_config(&cred.cert_sha256)?);
    let tcp = tokio::net::TcpStream::connect(host.addr())
        .await
        .map_err(|e| e.to_string())?;
    let mut tls = connector
        .connect(cellhost_remote::tls::server_name(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    write_msg(&mut tls, &Msg::Hello(cred.to_bytes()))
        .await
        .map_err(|e| e.to_string())?;
    match read_msg(&mut tls, HANDSHAKE_CAP).await {
        Ok(Some(Msg::Welcome(_))) => {}
        other => return Err(format!("not admitted: {other:?}")),
    }
    expected
        .wait(Duration::from_secs(10))
        .await
        .ok_or("no connection")?;
    Ok(())
}

pub(crate) async fn round_trips(k: &Kernel, cells: usize) -> Result<Vec<f64>, String> {
    let mut v = Vec::with_capacity(cells);
    k.execute("1", ExecOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    for _ in 0..cells {
        let t = Instant::now();
        k.execute("1", ExecOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(v)
}

fn fmt(v: &[f64]) -> String {
    format!(
        "p50 {:.2} ms, p99 {:.2} ms",
        percentile(v, 50.0),
        percentile(v, 99.0)
    )
}

/// Runs the remote bench; returns the exit code.
pub fn run(config: KernelConfig, cellhost: &Path, kernels: usize, handshakes: usize, cells: usize) -> u8 {
    let rt = match crate::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost-bench: {e}");
            return 1;
        }
    };
    match rt.block_on(measure(config, cellhost, kernels, handshakes, cells)) {
        Ok(report) => {
            println!("{report}");
            0
        }
        Err(e) => {
            eprintln!("cellhost-bench remote: {e}");
            1
        }
    }
}

async fn measure(
    config: KernelConfig,
    cellhost: &Path,
    kernels: usize,
    handshakes: usize,
    cells: usize,
) -> Result<String, String> {
    let host = RemoteHost::start(
        HostOptions::default(),
        HostIdentity::generate()?,
        Arc::new(MemoryNonces::default()),
    )
    .await?;
    let mut out = String::new();
    // Handshakes: sequential, then 64 at a time.
    let t = Instant::now();
    for _ in 0..handshakes {
        handshake(&host, spec(&config)).await?;
    }
    let seq = handshakes as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut left = handshakes;
    while left > 0 {
        let n = left.min(64);
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
    let par = handshakes as f64 / t.elapsed().as_secs_f64();
    out.push_str(&format!(
        "| TLS handshake + admission (hello → welcome), {handshakes} | {seq:.0}/s sequential, {par:.0}/s 64 concurrent |\n"
    ));
    // Round trip, local vs remote, same run.
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut local_cfg = config.clone();
    local_cfg.session_dir = dir.path().join("local");
    local_cfg.starter = None;
    let local = Kernel::spawn(local_cfg).await.map_err(|e| e.to_string())?;
    let lv = round_trips(&local, cells).await?;
    local.kill().await;
    let placement = LoopbackPlacement::with_program(cellhost, Vec::new());
    let starter = Arc::new(RemoteStarter::new(
        "bench",
        host.clone(),
        AnyPlacement::Loopback(placement),
        None,
    ));
    let mut remote_cfg = config.clone();
    remote_cfg.session_dir = dir.path().join("remote");
    remote_cfg.starter = Some(starter.clone());
    let remote = Kernel::spawn(remote_cfg.clone())
        .await
        .map_err(|e| e.to_string())?;
    let rv = round_trips(&remote, cells).await?;
    remote.kill().await;
    out.push_str(&format!(
        "| trivial cell round trip, local, {cells} cells | {} |\n",
        fmt(&lv)
    ));
    out.push_str(&format!(
        "| trivial cell round trip, remote over TLS (loopback agent), {cells} cells | {} |\n",
        fmt(&rv)
    ));
    // N live remote kernels with real Python workers.
    let rss0 = rss_kb();
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let mut live = Vec::new();
    for i in 0..kernels {
        let mut cfg = remote_cfg.clone();
        cfg.session = format!("bench-{i}");
        cfg.session_dir = dir.path().join(format!("k{i}"));
        set.spawn(async move { Kernel::spawn(cfg).await });
        if set.len() >= 8
            && let Some(r) = set.join_next().await
        {
            live.push(r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?);
        }
    }
    while let Some(r) = set.join_next().await {
        live.push(r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?);
    }
    let started = t.elapsed().as_secs_f64();
    let rss1 = rss_kb();
    out.push_str(&format!(
        "| {kernels} remote Python kernels (agents as processes, 8 starting at a time) | started in {started:.1} s ({:.1}/s); host RSS {} MiB → {} MiB ({:.0} KiB per kernel) |\n",
        kernels as f64 / started,
        rss0 / 1024,
        rss1 / 1024,
        (rss1.saturating_sub(rss0)) as f64 / kernels.max(1) as f64
    ));
    for k in live {
        k.kill().await;
    }
    Ok(out)
}
