//! Every supported CPython (3.8 through 3.13) passes the kernel's core:
//! exceptions (with the cell's source lines and no worker frames),
//! displays, interrupts and timeouts, under the default sandbox. Older
//! interpreters get [`KernelError::UnsupportedInterpreter`] before any of
//! the worker's code runs.
//!
//! The interpreters are pyenv's (`$PYENV_ROOT/versions/3.X.Y/bin/python`,
//! `PYENV_ROOT` defaulting to `~/.pyenv`); a minor version that is not
//! installed is skipped with a printed reason.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cellhost_kernel::{CellResult, CellStatus, ExecOptions, Kernel, KernelConfig, KernelError};
use tempfile::TempDir;

fn pyenv_versions() -> Option<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")))?;
    Some(root.join("versions"))
}

/// The newest installed pyenv interpreter of `major.minor`, if any.
fn pyenv_python(minor: u32) -> Option<PathBuf> {
    let dir = pyenv_versions()?;
    let prefix = format!("3.{minor}.");
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let patch: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            let python = e.path().join("bin/python");
            python.is_file().then_some((patch, python))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

fn config(python: &Path, dir: &TempDir) -> KernelConfig {
    let mut cfg = KernelConfig::new(python, dir.path().join("session"));
    cfg.session = "interp".into();
    cfg.cwd = Some(dir.path().to_path_buf());
    cfg
}

async fn run(k: &Kernel, code: &str) -> CellResult {
    k.execute(code, ExecOptions::default()).await.expect("execute")
}

/// Interrupts the running cell of `k` until the signal is delivered.
async fn interrupt_until_delivered(k: &Kernel) {
    for _ in 0..1000 {
        if k.interrupt().await.delivered {
            return;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the interrupt was never delivered");
}

async fn core_suite(python: &Path) {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = Kernel::spawn(config(python, &dir)).await.expect("kernel");
    let who = python.display().to_string();

    // Exceptions: the cell's line, no worker frame, chained causes.
    let r = run(&k, "def boom():\n    return 1 / 0\nboom()").await;
    assert_eq!(r.status, CellStatus::Error, "{who}: {r:#?}");
    let e = r.error.expect("error");
    assert_eq!(e.ename, "ZeroDivisionError", "{who}");
    let tb = e.traceback.join("\n");
    assert!(tb.contains("return 1 / 0"), "{who}: {tb}");
    assert!(!tb.contains("cellhost_worker"), "{who}: {tb}");
    let r = run(
        &k,
        "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('v') from e",
    )
    .await;
    let tb = r.error.expect("chained").traceback.join("\n");
    assert!(
        tb.contains("direct cause") && tb.contains("KeyError"),
        "{who}: {tb}"
    );
    let r = run(&k, "def a(n): return a(n)\na(1)").await;
    let e = r.error.expect("recursion");
    assert_eq!(e.ename, "RecursionError", "{who}");
    assert!(e.traceback.iter().any(|l| l.contains("repeated")), "{who}");
    let r = run(&k, "def (:").await;
    assert_eq!(r.error.expect("syntax").ename, "SyntaxError", "{who}");

    // The kernel survived all of it, with its namespace.
    let r = run(&k, "x = 41\nx + 1").await;
    assert_eq!(r.status, CellStatus::Ok, "{who}: {r:#?}");
    assert_eq!(r.result.expect("value")["text/plain"], "42", "{who}");

    // Displays and rich reprs.
    let r = run(
        &k,
        "class R:\n    def _repr_html_(self): return '<b>hi</b>'\n    def __repr__(self): return 'R()'\ndisplay(R()); display('two')\nR()",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{who}: {r:#?}");
    assert_eq!(r.displays.len(), 2, "{who}");
    assert_eq!(r.displays[0].data["text/html"], "<b>hi</b>", "{who}");
    assert_eq!(r.result.expect("value")["text/plain"], "R()", "{who}");

    // Interrupts keep the state; the next cell runs.
    assert_eq!(run(&k, "import time\nx = 'kept'").await.status, CellStatus::Ok);
    let h = k
        .submit("time.sleep(60)\nx = 'late'", ExecOptions::default())
        .expect("submit");
    interrupt_until_delivered(&k).await;
    let r = h.wait().await.expect("interrupted");
    assert_eq!(r.status, CellStatus::Interrupted, "{who}: {r:#?}");
    let i = r.interrupt.expect("report");
    assert!(!i.escalated && i.state_kept, "{who}: {i:#?}");
    assert_eq!(r.error.expect("error").ename, "KeyboardInterrupt", "{who}");
    let r = run(&k, "x").await;
    assert_eq!(r.result.expect("value")["text/plain"], "'kept'", "{who}");

    // Timeouts interrupt the cell and keep the state.
    let opts = ExecOptions {
        timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let r = k.execute("time.sleep(60)", opts).await.expect("timeout");
    assert_eq!(r.status, CellStatus::Timeout, "{who}: {r:#?}");
    assert!(r.interrupt.expect("report").state_kept, "{who}");
    let r = run(&k, "print(x)").await;
    assert_eq!(r.stdout, "kept\n", "{who}");
    k.kill().await;
}

#[tokio::test]
async fn python_3_8_through_3_13_pass_the_core() {
    let mut ran = 0;
    for minor in 8..=13 {
        let Some(python) = pyenv_python(minor) else {
            eprintln!(
                "skipped: no pyenv Python 3.{minor} under {}",
                pyenv_versions().map_or_else(|| "(no HOME)".into(), |p| p.display().to_string())
            );
            continue;
        };
        eprintln!("core suite on {}", python.display());
        core_suite(&python).await;
        ran += 1;
    }
    eprintln!("{ran} interpreters passed");
}

fn assert_unsupported(err: KernelError, python: &Path, found: &str) {
    let msg = err.to_string();
    match &err {
        KernelError::UnsupportedInterpreter {
            python: p,
            found: f,
            needs,
        } => {
            assert_eq!(p, &python.display().to_string());
            assert!(f.starts_with(found), "{f}");
            assert_eq!(needs, "3.8");
        }
        other => panic!("not UnsupportedInterpreter: {other:?}"),
    }
    assert!(
        msg.contains(&format!("needs Python 3.8 or newer (found {found}")),
        "{msg}"
    );
    assert!(msg.contains(&python.display().to_string()), "{msg}");
    assert!(!msg.contains("Traceback"), "no raw traceback: {msg}");
}

/// An interpreter that reports itself as 3.7.16 to the boot line: a real
/// Python 3 whose `sys.version_info` is replaced before the boot line runs
/// (the check itself is the real one).
fn fake_old_python(dir: &TempDir) -> PathBuf {
    let real = pyenv_python(12)
        .or_else(|| std::env::var_os("CELLHOST_TEST_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/usr/bin/python3"));
    let p = dir.path().join("python3.7");
    // Called as `python -c BOOT BOOT_DIR`: run BOOT with the version faked.
    let script = format!(
        "#!/bin/sh\nexec '{}' -c \"import sys; sys.version_info = (3, 7, 16, 'final', 0); exec(sys.argv.pop(1))\" \"$2\" \"$3\"\n",
        real.display()
    );
    std::fs::write(&p, script).expect("write fake");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

#[tokio::test]
async fn python_older_than_3_8_gets_a_version_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = fake_old_python(&dir);
    // Unsandboxed: the fake's interpreter lives outside the fake's own
    // directories, which are all a sandboxed kernel may read.
    let mut cfg = config(&fake, &dir);
    cfg.sandbox = cellhost_sandbox::profile::SandboxProfile::off();
    let err = Kernel::spawn(cfg).await.expect_err("3.7 refused unsandboxed");
    assert_unsupported(err, &fake, "3.7.16");
    // Real old interpreters, when pyenv has them (2.7 too: the check is
    // valid Python 2).
    for old in ["3.7", "3.6", "2.7"] {
        let Some(python) = pyenv_versions().and_then(|d| {
            std::fs::read_dir(d).ok()?.flatten().find_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.starts_with(&format!("{old}."))
                    .then(|| e.path().join("bin/python"))
            })
        }) else {
            eprintln!("skipped: no pyenv Python {old}");
            continue;
        };
        let err = Kernel::spawn(config(&python, &dir)).await.expect_err("refused");
        assert_unsupported(err, &python, old);
    }
}
