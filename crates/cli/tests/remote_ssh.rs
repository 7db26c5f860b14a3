//! Remote kernels placed over SSH with the real node agent: a loopback
//! `sshd` started by each test (`tests/sshd`), a `[placement.NAME]` table
//! of kind `ssh` whose agent is this build's `cellhost agent`, started over
//! `ssh` and dialling back over TLS. State across cells, an interrupt
//! delivered by the agent keeps state, the whole tree (a setsid grandchild
//! included) is killed with the kernel, and a host killed with SIGKILL
//! leaves no process behind.
//!
//! Each test prints why it is skipped when openssh-server is missing. The
//! interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cellhost_kernel::{CellStatus, ExecOptions, KernelConfig, LiveEvent, Session};
use cellhost_remote::{AnyPlacement, HostIdentity, HostOptions, MemoryNonces, RemoteHost, RemoteStarter};
use cellhost_sandbox::profile::SandboxMode;
use serde_json::Value;

use cellhost_testkit::procs::{pid_gone, wait_gone};
use cellhost_testkit::sshd::Sshd;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cellhost")
}

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn text(r: &cellhost_kernel::CellResult) -> Option<String> {
    r.result
        .as_ref()
        .and_then(|m| m.get("text/plain"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

async fn ssh_session(sshd: &Sshd, dir: &Path, name: &str) -> Session {
    let host = RemoteHost::start(
        HostOptions::default(),
        HostIdentity::generate().expect("certificate"),
        Arc::new(MemoryNonces::default()),
    )
    .await
    .expect("listener");
    let table: toml::Table = sshd.table(bin(), "").parse().expect("placement table");
    let placement = AnyPlacement::from_config("box", &table).expect("ssh placement");
    let mut cfg = KernelConfig::new(python(), dir.join(name));
    cfg.session = name.into();
    cfg.sandbox.mode = SandboxMode::Off;
    cfg.starter = Some(Arc::new(
        RemoteStarter::new("box", host, placement, Some(bin().to_string()))
            .with_agent_args(["--connect-grace".to_string(), "2s".to_string()]),
    ));
    Session::new(cfg)
}

/// The agent's pid: the ssh placement's job is `<token>/<pgid>`, the agent
/// leading its own group.
fn agent_pid(job: &str) -> i32 {
    job.rsplit('/')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("job {job:?} is not <token>/<pgid>"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_kernel_keeps_state_and_an_interrupt_the_agent_delivers_keeps_it() {
    let Some(sshd) = Sshd::start() else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let mut session = ssh_session(&sshd, dir.path(), "ssh-state").await;
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
    assert_eq!(
        (place.name.as_str(), place.kind.as_str()),
        ("box", "ssh"),
        "{place:?}"
    );
    let agent = agent_pid(&place.job);
    assert!(!pid_gone(agent), "the agent {agent} runs");
    let start = place.start.expect("the start is split");
    assert_eq!(
        start.queue_wait_ms + start.agent_start_ms + start.handshake_ms,
        start.total_ms,
        "{start:?}"
    );
    let r = session
        .execute("x + 1", ExecOptions::default())
        .await
        .expect("state");
    assert_eq!(text(&r).as_deref(), Some("42"), "{r:?}");

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
    let target = outcome.target.clone().unwrap_or_default();
    assert!(
        target.starts_with(&format!("{}:", place.node)),
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
    assert!(wait_gone(agent), "the agent {agent} outlived its kernel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_kernel_kill_ends_the_whole_tree_with_a_setsid_grandchild() {
    let Some(sshd) = Sshd::start() else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let mut session = ssh_session(&sshd, dir.path(), "ssh-kill").await;
    // A grandchild in a session of its own (out of the worker's process
    // group); it writes its pid once it runs.
    let code = "import os, subprocess, sys, time\n\
                subprocess.Popen([sys.executable, '-c', \"import os, time\\nopen('gc.pid', 'w').write(str(os.getpid()))\\ntime.sleep(300)\"], start_new_session=True)\n\
                for _ in range(600):\n    \
                    if os.path.exists('gc.pid') and open('gc.pid').read(): break\n    \
                    time.sleep(0.05)\n\
                (os.getpid(), int(open('gc.pid').read()))";
    let r = session
        .execute(code, ExecOptions::default())
        .await
        .expect("grandchild");
    assert_eq!(r.status, CellStatus::Ok, "{r:?}");
    let pair = text(&r).unwrap_or_default();
    let pids: Vec<i32> = pair
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect();
    assert_eq!(pids.len(), 2, "(worker, grandchild): {pair}");
    let agent = agent_pid(&r.kernel.placement.clone().expect("placement").job);
    for pid in pids.iter().chain([&agent]) {
        assert!(!pid_gone(*pid), "{pid} runs before the kill");
    }
    session.shutdown().await;
    for pid in pids.iter().chain([&agent]) {
        assert!(wait_gone(*pid), "{pid} outlived the kernel's kill");
    }
}

#[test]
fn ssh_host_sigkill_leaves_no_process() {
    let Some(sshd) = Sshd::start() else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = format!("[placement.box]\n{}", sshd.table(bin(), "agent_grace_s = 1\n"));
    std::fs::write(dir.path().join("config.toml"), cfg).expect("config");
    let pids = dir.path().join("pids");
    let code = format!(
        "import os, time\nopen({:?}, 'w').write(f'{{os.getpid()}}\\n')\ntime.sleep(300)",
        pids.display()
    );
    let mut host = Command::new(bin())
        .args([
            "exec",
            "--python",
            &python(),
            "--sandbox",
            "off",
            "--placement",
            "box",
            &code,
        ])
        .current_dir(dir.path())
        .env("CELLHOST_STATE_DIR", dir.path().join("state"))
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .env("CELLHOST_CONFIG", dir.path().join("config.toml"))
        .env_remove("CELLHOST_PLACEMENT")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("host");
    let mut line = String::new();
    for _ in 0..1200 {
        if let Ok(s) = std::fs::read_to_string(&pids)
            && s.ends_with('\n')
        {
            line = s;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let worker: i32 = match line.trim().parse() {
        Ok(p) => p,
        Err(_) => {
            let _ = host.kill();
            let _ = host.wait();
            panic!("the cell never wrote its pid");
        }
    };
    // The agent: the worker's ancestor that leads its own process group
    // under the remote directory's token (its command line is the agent's).
    let agent = ancestor_agent(worker).expect("the worker runs under a cellhost agent");
    host.kill().expect("SIGKILL the host");
    let _ = host.wait();
    assert!(wait_gone(worker), "worker {worker} outlived the host");
    assert!(wait_gone(agent), "agent {agent} outlived the host");
}

/// The nearest ancestor of `pid` whose command line is `… agent --credential …`.
fn ancestor_agent(mut pid: i32) -> Option<i32> {
    for _ in 0..16 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        pid = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args
            .windows(2)
            .any(|w| w[0] == b"agent" && w[1] == b"--credential")
        {
            return Some(pid);
        }
    }
    None
}
