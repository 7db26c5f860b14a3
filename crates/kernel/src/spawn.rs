//! Starting the kernel init and the worker under it.
//!
//! Every kernel is forked from one dedicated host thread that lives as long
//! as the process: `PR_SET_PDEATHSIG` (set by the init) fires when the
//! *thread* that forked it exits, so forking from a pool thread that retires
//! after a while would kill healthy kernels.

use std::io;
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;

use tokio::sync::oneshot;

type Request = (Command, oneshot::Sender<io::Result<Child>>);

fn spawner() -> io::Result<&'static mpsc::Sender<Request>> {
    static TX: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    if let Some(tx) = TX.get() {
        return Ok(tx);
    }
    let (tx, rx) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("cellhost-spawner".into())
        .spawn(move || {
            while let Ok((mut cmd, reply)) = rx.recv() {
                let result = cmd.spawn();
                // Dropping the Command here closes the host's copies of the
                // child's stdio ends (the control socket's worker end).
                drop(cmd);
                let _ = reply.send(result);
            }
        })?;
    Ok(TX.get_or_init(|| tx))
}

/// Spawns `cmd` from the dedicated spawner thread.
pub(crate) async fn spawn(cmd: Command) -> io::Result<Child> {
    let (tx, rx) = oneshot::channel();
    spawner()?
        .send((cmd, tx))
        .map_err(|_| io::Error::other("the cellhost spawner thread is gone"))?;
    rx.await
        .map_err(|_| io::Error::other("the cellhost spawner thread dropped a request"))?
}

/// Builds the command that starts the init, which starts Python.
pub(crate) fn init_command(
    launcher: &std::path::Path,
    python: &std::path::Path,
    python_args: &[String],
    init_args: &[std::ffi::OsString],
    control: OwnedFd,
) -> Command {
    let mut cmd = Command::new(launcher);
    cmd.arg(cellhost_sandbox::launcher::INIT_ARG)
        .arg("--host-pid")
        .arg(std::process::id().to_string())
        .args(init_args)
        .arg("--")
        .arg(python)
        .args(python_args)
        .stdin(Stdio::from(control))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}
