//! `cellhost doctor [--json]`: which sandbox layers this machine enforces,
//! proven by a real self-test.
//!
//! A kernel is started with the default profile (mode `auto`, small limits
//! so the resource probes finish fast) and asked to break each promise:
//! write outside its workdir, read a secret file planted in `$HOME`, read
//! the host's `/proc/<pid>/environ`, connect to a loopback listener the
//! host opened, ptrace the host, fork beyond the process limit, allocate
//! beyond the memory limit. Exit 0 when every layer that mode `enforce`
//! needs is in force and every promise held, 1 otherwise.

use std::path::PathBuf;
use std::time::Duration;

use cellhost_kernel::{CellStatus, ExecOptions, Kernel, KernelConfig};
use cellhost_sandbox::profile::{LayerStatus, SandboxProfile};
use serde::Serialize;

use crate::common;

/// Arguments of `doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Interpreter for the self-test kernel (default: python3 on PATH).
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// One promise and whether the self-test could break it.
#[derive(Debug, Serialize)]
struct Check {
    promise: &'static str,
    kept: bool,
    detail: String,
}

#[derive(Debug, Serialize)]
struct Report {
    /// Every layer `enforce` needs is in force and every promise held.
    enforce_ready: bool,
    layers: Vec<LayerStatus>,
    checks: Vec<Check>,
}

const MEMORY_LIMIT: u64 = 256 << 20;
const PIDS_LIMIT: u64 = 48;

/// Runs `doctor`; returns the exit code.
pub fn run(args: DoctorArgs) -> u8 {
    let rt = match common::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost: cannot start the runtime: {e}");
            return 1;
        }
    };
    let report = match rt.block_on(self_test(&args)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cellhost doctor: {e}");
            return 1;
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("cellhost: cannot encode the report: {e}"),
        }
    } else {
        print_report(&report);
    }
    if report.enforce_ready { 0 } else { 1 }
}

fn print_report(r: &Report) {
    println!("{:<13} {:<9} detail", "layer", "status");
    for l in &r.layers {
        let status = if l.enforced {
            "enforced"
        } else if l.optional {
            "n/a"
        } else {
            "MISSING"
        };
        println!("{:<13} {:<9} {}", l.name, status, l.detail);
    }
    println!(
        "(the cgroup limits above are the self-test's; the default profile has memory 4 GiB, 512 processes)"
    );
    println!();
    println!("{:<46} {:<6} detail", "promise (self-test)", "result");
    for c in &r.checks {
        println!(
            "{:<46} {:<6} {}",
            c.promise,
            if c.kept { "kept" } else { "BROKEN" },
            c.detail
        );
    }
    println!();
    println!(
        "{}",
        if r.enforce_ready {
            "sandbox mode `enforce` is available on this machine"
        } else {
            "sandbox mode `enforce` would refuse to start kernels here (see MISSING / BROKEN)"
        }
    );
}

async fn cell(k: &Kernel, code: &str) -> (CellStatus, String, String) {
    let opts = ExecOptions {
        timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    match k.execute(code, opts).await {
        Ok(r) => {
            let why = r
                .error
                .map(|e| format!("{}: {}", e.ename, e.evalue))
                .or_else(|| r.crash.map(|c| c.message))
                .unwrap_or_default();
            (r.status, r.stdout.trim().to_string(), why)
        }
        Err(e) => (CellStatus::Crashed, String::new(), e.to_string()),
    }
}

/// A probe cell prints `blocked: <why>` or `ESCAPED: <what>`.
async fn probe(k: &Kernel, promise: &'static str, code: &str) -> Check {
    probe_with_limit(k, promise, code, None).await
}

/// As [`probe`]; with `limit` (e.g. `pids.max`) the promise is also kept
/// when the host ends the kernel for reaching that limit (`crashed`,
/// naming it) instead of the cell seeing a refusal.
async fn probe_with_limit(k: &Kernel, promise: &'static str, code: &str, limit: Option<&str>) -> Check {
    let (status, out, why) = cell(k, code).await;
    let ended_at_limit = limit.is_some_and(|l| status == CellStatus::Crashed && why.contains(l));
    let kept = ended_at_limit || (status == CellStatus::Ok && out.starts_with("blocked"));
    let detail = if ended_at_limit {
        format!("blocked: the kernel was ended at its limit ({why})")
    } else if out.is_empty() {
        format!("{status:?} {why}")
    } else {
        out
    };
    Check {
        promise,
        kept,
        detail,
    }
}

async fn self_test(args: &DoctorArgs) -> Result<Report, String> {
    let base = common::new_session_dir("doctor");
    std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    let result = self_test_in(args, &base).await;
    let _ = std::fs::remove_dir_all(&base);
    result
}

async fn self_test_in(args: &DoctorArgs, base: &std::path::Path) -> Result<Report, String> {
    let kargs = crate::KernelArgs {
        placement: None,
        python: args.python.clone(),
        language: None,
        r: None,
        sandbox: None,
        env: Vec::new(),
        secret_env: Vec::new(),
        network: None,
        checkpoint: None,
        restore: None,
    };
    let mut cfg: KernelConfig =
        common::kernel_config(&kargs, "doctor", &base.join("session")).map_err(|e| e.to_string())?;
    cfg.cwd = Some(base.to_path_buf());
    cfg.sandbox = SandboxProfile::default();
    // The self-test runs only its own probes: it starts even where mode
    // `auto` refuses user kernels (no namespaces), to show what breaks.
    cfg.sandbox.allow_weak = true;
    cfg.sandbox.limits.memory_bytes = Some(MEMORY_LIMIT);
    cfg.sandbox.limits.pids_max = Some(PIDS_LIMIT);
    cfg.limits = Default::default();

    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()));
    let secret = home.join(format!(".cellhost-doctor-secret-{}", std::process::id()));
    std::fs::write(&secret, "cellhost-doctor-planted-secret")
        .map_err(|e| format!("planting {}: {e}", secret.display()))?;
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("loopback listener: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let host = std::process::id();

    let kernel = Kernel::spawn(cfg.clone()).await;
    let k = match kernel {
        Ok(k) => k,
        Err(e) => {
            let _ = std::fs::remove_file(&secret);
            return Err(format!("cannot start the self-test kernel: {e}"));
        }
    };
    let outside = home.join(format!(".cellhost-doctor-write-{}", std::process::id()));
    // The kernel may write its own /tmp (private with a mount namespace):
    // the promise is that the host's /tmp never sees the file.
    let host_tmp = std::path::PathBuf::from(format!("/tmp/cellhost-doctor-write-{}", std::process::id()));
    let _ = std::fs::remove_file(&host_tmp);
    let mut checks = Vec::new();
    let mut write_check = probe(
        &k,
        "writing outside the workdir fails (the host's $HOME, /var/tmp, /usr and /tmp)",
        &format!(
            "bad = []\nfor p in [{:?}, '/var/tmp/cellhost-doctor', '/usr/cellhost-doctor']:\n    try:\n        open(p, 'w').write('x')\n        bad.append(p)\n    except OSError as e:\n        pass\ntry:\n    open({:?}, 'w').write('x')\nexcept OSError:\n    pass\nprint('ESCAPED: wrote ' + ', '.join(bad) if bad else 'blocked: $HOME, /var/tmp, /usr not writable')",
            outside.display(),
            host_tmp.display()
        ),
    )
    .await;
    if host_tmp.exists() {
        let _ = std::fs::remove_file(&host_tmp);
        write_check.kept = false;
        write_check.detail = format!(
            "ESCAPED: wrote the host's {} (no private /tmp: mount namespace missing); {}",
            host_tmp.display(),
            write_check.detail
        );
    } else if write_check.kept {
        write_check.detail.push_str("; the host's /tmp is untouched");
    }
    checks.push(write_check);
    if outside.exists() {
        let _ = std::fs::remove_file(&outside);
    }
    checks.push(
        probe(
            &k,
            "reading a secret planted in $HOME fails",
            &format!(
                "try:\n    open({:?}).read()\n    print('ESCAPED: read the planted secret')\nexcept OSError as e:\n    print('blocked:', type(e).__name__)",
                secret.display()
            ),
        )
        .await,
    );
    let _ = std::fs::remove_file(&secret);
    checks.push(
        probe(
            &k,
            "/proc/<host pid>/environ is unreadable",
            &format!(
                "try:\n    open('/proc/{host}/environ', 'rb').read()\n    print('ESCAPED: read the host environment')\nexcept OSError as e:\n    print('blocked:', type(e).__name__)"
            ),
        )
        .await,
    );
    checks.push(
        probe(
            &k,
            "TCP connect to a host loopback listener fails",
            &format!(
                "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n    print('ESCAPED: connected to the host')\nexcept OSError as e:\n    print('blocked:', type(e).__name__, e.strerror or '')"
            ),
        )
        .await,
    );
    checks.push(
        probe(
            &k,
            "ptrace of the host fails",
            &format!(
                "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.ptrace(16, {host}, 0, 0)\nprint('ESCAPED: attached to the host' if rc == 0 else 'blocked: ' + os.strerror(ctypes.get_errno()))"
            ),
        )
        .await,
    );
    let layers = k.info().sandbox.layers.clone();
    k.kill().await;
    // The resource probes get a fresh kernel each: hitting a limit may
    // cost the kernel its life.
    let k = Kernel::spawn(cfg.clone()).await.map_err(|e| e.to_string())?;
    checks.push(
        probe_with_limit(
            &k,
            "fork beyond the pids limit fails",
            &format!(
                "import subprocess\nps = []\ntry:\n    for _ in range({}):\n        ps.append(subprocess.Popen(['sleep', '30']))\n    print('ESCAPED: started', len(ps), 'processes')\nexcept OSError as e:\n    print('blocked: refused after', len(ps), 'children:', e.strerror)\nfor p in ps:\n    p.kill(); p.wait()",
                PIDS_LIMIT * 2
            ),
            Some("pids.max"),
        )
        .await,
    );
    k.kill().await;
    let k = Kernel::spawn(cfg).await.map_err(|e| e.to_string())?;
    let (status, out, why) = cell(
        &k,
        "hold = []\nwhile True:\n    hold.append(b'\\x01' * (32 << 20))\n    if len(hold) > 64:\n        print('ESCAPED: 2 GiB allocated'); break",
    )
    .await;
    checks.push(Check {
        promise: "allocation beyond the memory limit is stopped",
        kept: match status {
            CellStatus::Error => why.starts_with("MemoryError"),
            CellStatus::Crashed => why.contains("out of memory"),
            _ => false,
        },
        detail: if out.is_empty() {
            format!("{status:?}: {why}")
        } else {
            out
        },
    });
    k.kill().await;
    drop(listener);
    let enforce_ready = layers.iter().all(|l| l.enforced || l.optional) && checks.iter().all(|c| c.kept);
    Ok(Report {
        enforce_ready,
        layers,
        checks,
    })
}
