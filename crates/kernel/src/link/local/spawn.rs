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

/// Builds the command that starts the init: `cellhost
/// __cellhost-kernel-init --launch-fd 0`, an empty environment, `control`
/// as fd 0. Everything else (host pid, cgroups, sandbox, the worker's argv
/// and environment) goes through [`write_launch`] on the control socket,
/// never on the command line (pid 1 of a sandboxed kernel shows it in
/// `/proc/1/cmdline`).
pub(crate) fn init_command(launcher: &std::path::Path, control: OwnedFd) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(launcher);
    cmd.arg0("cellhost")
        .arg(cellhost_sandbox::launcher::INIT_ARG)
        .arg(cellhost_sandbox::launcher::LAUNCH_FD_ARG)
        .arg("0")
        .env_clear()
        .stdin(Stdio::from(control))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Writes the init's launch message, then (for a kernel) the worker's
/// configuration message, into the host's end of the control socket.
///
/// # Errors
/// The socket refused the bytes (the init died).
pub(crate) fn write_launch(
    sock: &std::os::unix::net::UnixStream,
    launch: &cellhost_sandbox::profile::LaunchSpec,
    worker_config: Option<&serde_json::Value>,
) -> io::Result<()> {
    use cellhost_sandbox::launcher::encode_message;
    use std::io::Write;
    let mut w = sock;
    let json = serde_json::to_vec(launch).map_err(io::Error::other)?;
    w.write_all(&encode_message(&json))?;
    if let Some(c) = worker_config {
        w.write_all(&encode_message(c.to_string().as_bytes()))?;
    }
    Ok(())
}

/// Writes the worker's configuration message alone (a forked kernel: the
/// template's processes read no launch message).
///
/// # Errors
/// The socket refused the bytes.
pub(crate) fn write_launch_config(
    sock: &std::os::unix::net::UnixStream,
    worker_config: &serde_json::Value,
) -> io::Result<()> {
    use std::io::Write;
    let mut w = sock;
    w.write_all(&cellhost_sandbox::launcher::encode_message(
        worker_config.to_string().as_bytes(),
    ))
}

/// The environment as strings for a launch message (a name or value that
/// is not UTF-8 is passed lossily).
pub(crate) fn env_strings(env: &[(std::ffi::OsString, std::ffi::OsString)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .collect()
}
