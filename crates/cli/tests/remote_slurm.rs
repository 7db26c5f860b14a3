//! Remote kernels placed by a real Slurm: the one-node test cluster of
//! `scripts/slurm-cluster.sh up` (root; `scripts/test.sh` brings it up),
//! a `[placement.NAME]` table of kind `slurm` whose agent is this build's
//! `cellhost agent`, started by `sbatch` and dialling back over TLS.
//!
//! Each test prints why it is skipped when the cluster is not up.
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use cellhost_kernel::{CellStatus, ExecOptions, KernelConfig, LiveEvent, Session};
use cellhost_remote::{AnyPlacement, HostIdentity, HostOptions, MemoryNonces, RemoteHost, RemoteStarter};
use serde_json::Value;

use cellhost_testkit::procs::{ppid, wait_gone, wait_line};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cellhost")
}

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn slurm_conf() -> PathBuf {
    std::env::var_os("CELLHOST_TEST_SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/cellhost-slurm/slurm.conf"))
}

/// The cluster answers `scontrol ping`, else a printed reason.
fn cluster_up() -> bool {
    let conf = slurm_conf();
    if !conf.is_file() {
        eprintln!(
            "skipped: no Slurm test cluster ({} missing; run scripts/slurm-cluster.sh up as root)",
            conf.display()
        );
        return false;
    }
    match Command::new("scontrol")
        .arg("ping")
        .env("SLURM_CONF", &conf)
        .output()
    {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            eprintln!(
                "skipped: the Slurm test cluster does not answer: {}",
                String::from_utf8_lossy(&o.stdout).trim()
            );
            false
        }
        Err(e) => {
            eprintln!("skipped: scontrol cannot run: {e}");
            false
        }
    }
}

/// A scratch directory the Slurm job can reach (the spool must be the
/// user's own, 0700, which a fresh temp dir is).
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cellhost-remote-slurm-")
        .tempdir_in("/var/tmp")
        .expect("scratch dir")
}

fn table(dir: &Path) -> toml::Table {
    let text = format!(
        "kind = \"slurm\"\nspool_dir = {:?}\nslurm_conf = {:?}\n",
        dir.join("spool").display().to_string(),
        slurm_conf().display().to_string()
    );
    text.parse().expect("placement table")
}

async fn slurm_session(dir: &Path, name: &str) -> Session {
    let host = RemoteHost::start(
        HostOptions::default(),
        HostIdentity::generate().expect("certificate"),
        Arc::new(MemoryNonces::default()),
    )
    .await
    .expect("listener");
    let placement = AnyPlacement::from_config("slurm", &table(dir)).expect("slurm placement");
    let mut cfg = KernelConfig::new(python(), dir.join(name));
    cfg.session = name.into();
    cfg.starter = Some(Arc::new(RemoteStarter::new(
        "slurm",
        host,
        placement,
        Some(bin().to_string()),
    )));
    Session::new(cfg)
}

/// The job's state as `squeue` sees it (`None`: the controller no longer
/// lists it).
fn squeue_state(job: &str) -> Option<String> {
    let o = Command::new("squeue")
        .args(["-h", "-j", job, "-o", "%T"])
        .env("SLURM_CONF", slurm_conf())
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (o.status.success() && !s.is_empty()).then_some(s)
}

/// Polls `squeue` until the job is gone (at most 60 s).
fn wait_job_gone(job: &str) -> bool {
    for _ in 0..600 {
        if squeue_state(job).is_none() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn text(r: &cellhost_kernel::CellResult) -> Option<String> {
    r.result
        .as_ref()
        .and_then(|m| m.get("text/plain"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_kernel_keeps_state_sees_its_job_splits_its_start_and_an_interrupt_keeps_state() {
    if !cluster_up() {
        return;
    }
    let dir = scratch();
    let mut session = slurm_session(dir.path(), "slurm-state").await;
    let r = session
        .execute("x = 41", ExecOptions::default())
        .await
        .expect("x");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    let place = r
        .kernel
        .placement
        .clone()
        .expect("a placed kernel names its placement");
    assert_eq!(place.kind, "slurm", "{place:?}");
    assert!(
        place.job.parse::<u64>().is_ok(),
        "the job is Slurm's job id: {place:?}"
    );
    assert!(
        matches!(squeue_state(&place.job).as_deref(), Some("RUNNING")),
        "job {} runs while the session does",
        place.job
    );
    // The start is split into the scheduler's part, the agent's and the
    // handshake (the figures come from `scripts/remote-figures.sh slurm`).
    let start = place.start.expect("a Slurm kernel's start is split");
    assert_eq!(
        start.queue_wait_ms + start.agent_start_ms + start.handshake_ms,
        start.total_ms,
        "{start:?}"
    );
    let r = session
        .execute(
            "import os\n(x + 1, os.environ.get('SLURM_JOB_ID'))",
            ExecOptions::default(),
        )
        .await
        .expect("state");
    assert_eq!(text(&r), Some(format!("(42, '{}')", place.job)), "{r:?}");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = ExecOptions {
        live: Some(tx),
        ..ExecOptions::default()
    };
    let cell = session
        .submit("import time\nprint('go', flush=True)\ntime.sleep(300)", opts)
        .await
        .expect("submit");
    while let Some(ev) = rx.recv().await {
        if matches!(&ev, LiveEvent::Stdout(s) if s.contains("go")) {
            break;
        }
    }
    let outcome = session.interrupt(None).await.expect("interrupt");
    assert!(outcome.delivered, "the agent's tgkill is reported: {outcome:?}");
    assert!(
        outcome
            .target
            .as_deref()
            .is_some_and(|t| t.starts_with(&format!("{}:", place.node))),
        "the target names the node: {outcome:?}"
    );
    let r = session.finish(cell).await.expect("the cell settles");
    assert_eq!(r.status, CellStatus::Interrupted, "{r:?}");
    let r = session.execute("x", ExecOptions::default()).await.expect("after");
    assert_eq!(
        text(&r).as_deref(),
        Some("41"),
        "state survives the interrupt: {r:?}"
    );
    assert!(!r.kernel.state_reset, "{r:?}");
    session.shutdown().await;
    assert!(wait_job_gone(&place.job), "job {} outlived its kernel", place.job);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_kernel_timeout_then_tree_kill_leaves_no_process_and_ends_the_job() {
    if !cluster_up() {
        return;
    }
    let dir = scratch();
    let mut session = slurm_session(dir.path(), "slurm-kill").await;
    let r = session
        .execute(
            "import time\ntime.sleep(60)",
            ExecOptions {
                timeout: Some(Duration::from_millis(1500)),
                ..ExecOptions::default()
            },
        )
        .await
        .expect("timeout cell");
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    let place = r.kernel.placement.clone().expect("placement");
    // A grandchild in a session of its own (out of the worker's process
    // group), marked by a sleep no other test runs; it says it is up by a
    // file in the kernel's working directory.
    let code = "import os, subprocess, sys, time\n\
                subprocess.Popen([sys.executable, '-c', \"open('gc-up', 'w').close()\\nimport time\\ntime.sleep(307)\"], start_new_session=True)\n\
                for _ in range(600):\n    \
                    if os.path.exists('gc-up'): break\n    \
                    time.sleep(0.05)\n\
                os.path.exists('gc-up')";
    let r = session
        .execute(code, ExecOptions::default())
        .await
        .expect("grandchild");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    assert_eq!(text(&r).as_deref(), Some("True"), "{r:?}");
    let host_pids: Vec<i32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid: &i32| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("time.sleep(307)"))
                .unwrap_or(false)
        })
        .collect();
    assert!(!host_pids.is_empty(), "the setsid grandchild runs on the node");
    session.shutdown().await;
    for pid in &host_pids {
        assert!(wait_gone(*pid), "setsid grandchild {pid} outlived the kernel");
    }
    assert!(wait_job_gone(&place.job), "job {} outlived its kernel", place.job);
}

#[test]
fn exec_with_a_slurm_placement_through_the_cli() {
    if !cluster_up() {
        return;
    }
    let dir = scratch();
    let t = table(dir.path());
    let mut cfg = toml::Table::new();
    let mut tables = toml::Table::new();
    let mut slurm = t.clone();
    slurm.insert("agent".into(), toml::Value::String(bin().into()));
    tables.insert("slurm".into(), toml::Value::Table(slurm));
    cfg.insert("placement".into(), toml::Value::Table(tables));
    std::fs::write(
        dir.path().join("config.toml"),
        toml::to_string(&cfg).expect("toml"),
    )
    .expect("config");
    let o = Command::new(bin())
        .args([
            "exec",
            "--python",
            &python(),
            "--json",
            "--placement",
            "slurm",
            "import os\nprint(os.environ.get('SLURM_JOB_ID'))\n6 * 7",
        ])
        .current_dir(dir.path())
        .env("CELLHOST_STATE_DIR", dir.path().join("state"))
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .env("CELLHOST_CONFIG", dir.path().join("config.toml"))
        .env_remove("CELLHOST_PLACEMENT")
        .output()
        .expect("exec");
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(o.status.code(), Some(0), "{v}");
    assert_eq!(v["result"]["text/plain"], "42", "{v}");
    assert_eq!(v["kernel"]["placement"]["kind"], "slurm", "{v}");
    let job = v["kernel"]["placement"]["job"].as_str().expect("job").to_string();
    assert_eq!(
        v["stdout"],
        format!("{job}\n"),
        "the kernel sees its own job: {v}"
    );
    assert!(wait_job_gone(&job), "job {job} outlived the command");
}

/// The `cellhost agent` process above `pid` (walking up its parents).
fn agent_of(pid: i32) -> Option<i32> {
    let mut p = ppid(pid)?;
    for _ in 0..8 {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.iter().any(|a| *a == b"agent") && args.iter().any(|a| *a == b"--credential") {
            return Some(p);
        }
        p = ppid(p)?;
    }
    None
}

/// The config file of a `slurm` placement whose agent is this build, with
/// the agent's grace `grace_s`.
fn slurm_config(dir: &Path, grace_s: u32) -> PathBuf {
    let mut slurm = table(dir);
    slurm.insert("agent".into(), toml::Value::String(bin().into()));
    slurm.insert("agent_grace_s".into(), toml::Value::Integer(grace_s.into()));
    let mut tables = toml::Table::new();
    tables.insert("slurm".into(), toml::Value::Table(slurm));
    let mut cfg = toml::Table::new();
    cfg.insert("placement".into(), toml::Value::Table(tables));
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(&cfg).expect("toml")).expect("config");
    path
}

#[test]
fn slurm_host_sigkill_ends_the_job_and_leaves_no_process() {
    if !cluster_up() {
        return;
    }
    let dir = scratch();
    let config = slurm_config(dir.path(), 2);
    let mark = dir.path().join("worker");
    // The worker says who it is and which job runs it, then waits.
    let code = format!(
        "import os, time\nopen({:?}, 'w').write(f\"{{os.getpid()}} {{os.environ['SLURM_JOB_ID']}}\\n\")\ntime.sleep(300)",
        mark.display()
    );
    let mut host = Command::new(bin())
        .args([
            "exec",
            "--python",
            &python(),
            "--sandbox",
            "off",
            "--placement",
            "slurm",
            &code,
        ])
        .current_dir(dir.path())
        .env("CELLHOST_STATE_DIR", dir.path().join("state"))
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .env("CELLHOST_CONFIG", &config)
        .env_remove("CELLHOST_PLACEMENT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("host");
    let line = wait_line(&mark);
    let mut it = line.split_whitespace();
    let worker: i32 = it.next().and_then(|p| p.parse().ok()).expect("worker pid");
    let job = it.next().expect("job id").to_string();
    let agent = agent_of(worker).expect("the worker's agent");
    assert!(squeue_state(&job).is_some(), "job {job} runs");
    host.kill().expect("SIGKILL the host");
    let _ = host.wait();
    // The agent finds the host gone past its grace: it kills the worker's
    // tree and exits, which ends the job.
    assert!(wait_gone(worker), "worker {worker} outlived the host");
    assert!(wait_gone(agent), "agent {agent} outlived the host");
    assert!(wait_job_gone(&job), "job {job} outlived the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_agent_killed_is_a_lost_connection_and_the_next_kernel_says_state_reset() {
    if !cluster_up() {
        return;
    }
    let dir = scratch();
    let mut session = slurm_session(dir.path(), "slurm-agent").await;
    let r = session.execute("x = 1", ExecOptions::default()).await.expect("x");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    let first_job = r.kernel.placement.clone().expect("placement").job;
    // The worker's host pid: the kernel's info (in its own pid namespace it is 2).
    let worker = session.kernel().map(|k| k.info().pid as i32).expect("worker");
    let agent = agent_of(worker).expect("the worker's agent");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = ExecOptions {
        live: Some(tx),
        ..ExecOptions::default()
    };
    let cell = session
        .submit("import time\nprint('go', flush=True)\ntime.sleep(300)", opts)
        .await
        .expect("submit");
    while let Some(ev) = rx.recv().await {
        if matches!(&ev, LiveEvent::Stdout(s) if s.contains("go")) {
            break;
        }
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(agent).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill the agent");
    let r = session.finish(cell).await.expect("the cell settles");
    assert_eq!(r.status, CellStatus::Crashed, "{r:?}");
    let crash = r.crash.clone().expect("crash report");
    assert_eq!(crash.reason.as_deref(), Some("connection lost"), "{crash:?}");
    // The next cell runs in a new kernel, placed by a new job.
    let r = session
        .execute("'x' in dir()", ExecOptions::default())
        .await
        .expect("next");
    assert!(r.kernel.state_reset, "{r:?}");
    assert_eq!(r.kernel.generation, 2, "{r:?}");
    assert_eq!(text(&r).as_deref(), Some("False"), "{r:?}");
    let second_job = r.kernel.placement.clone().expect("placement").job;
    assert_ne!(first_job, second_job, "a new generation is a new job");
    session.shutdown().await;
    assert!(wait_gone(worker), "the first worker {worker} outlived its agent");
    assert!(wait_job_gone(&first_job), "job {first_job} outlived its agent");
    assert!(wait_job_gone(&second_job), "job {second_job} outlived its kernel");
}
