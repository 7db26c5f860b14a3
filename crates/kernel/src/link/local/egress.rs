//! The host's side of a kernel's egress by allowlist: the listener the
//! kernel init bound inside the kernel's network namespace arrives on the
//! control socket ([`cellhost_sandbox::egress`]), and the proxy of
//! `cellhost-egress` serves it for as long as the link lives.

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use cellhost_sandbox::egress::{BIND_FAILED, LISTENER, NO_NETNS};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
use tokio::io::Interest;

use crate::error::KernelError;

/// The proxy task of one kernel; aborted (its listener and every
/// connection closed, so the namespace can go) when dropped.
pub(crate) struct ProxyTask(tokio::task::JoinHandle<()>);

impl Drop for ProxyTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn unavailable(label: &str, reason: impl Into<String>) -> KernelError {
    KernelError::SandboxUnavailable {
        kernel: label.to_string(),
        layer: "egress".into(),
        reason: reason.into(),
    }
}

/// Reads the init's one byte and the listener sent with it from `ctl`
/// (the host's end of the control socket, before anything else reads it),
/// and starts the proxy on it.
///
/// # Errors
/// [`KernelError::SandboxUnavailable`] (layer `egress`): no private
/// network namespace, no listener, the init gone, or nothing within
/// `wait`; [`KernelError::Io`] for the socket calls.
pub(crate) async fn start(
    ctl: &UnixStream,
    egress: Arc<cellhost_egress::Egress>,
    label: &str,
    wait: Duration,
) -> Result<ProxyTask, KernelError> {
    let io_err = |e: std::io::Error| KernelError::io(label, "egress listener", e);
    let dup = ctl.try_clone().map_err(io_err)?;
    dup.set_nonblocking(true).map_err(io_err)?;
    let sock = tokio::net::UnixStream::from_std(dup).map_err(io_err)?;
    let receive = sock.async_io(Interest::READABLE, || {
        let mut byte = [0u8; 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let got = recvmsg(
            &sock,
            &mut [IoSliceMut::new(&mut byte)],
            &mut anc,
            RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
        )
        .map_err(std::io::Error::from)?;
        let mut fds = Vec::new();
        for m in anc.drain() {
            if let RecvAncillaryMessage::ScmRights(it) = m {
                fds.extend(it);
            }
        }
        Ok((got.bytes, byte[0], fds))
    });
    let (n, byte, mut fds) = match tokio::time::timeout(wait, receive).await {
        Ok(r) => r.map_err(io_err)?,
        Err(_) => {
            return Err(unavailable(
                label,
                "the kernel init sent no proxy listener in time",
            ));
        }
    };
    if n == 0 {
        return Err(unavailable(
            label,
            "the kernel init ended before it sent the proxy listener",
        ));
    }
    match byte {
        LISTENER if fds.len() == 1 => {}
        NO_NETNS => {
            return Err(unavailable(
                label,
                "no network namespace of its own: an allowlist cannot be enforced here",
            ));
        }
        BIND_FAILED => {
            return Err(unavailable(
                label,
                "cannot bind the proxy listener in the kernel's namespace",
            ));
        }
        _ => return Err(unavailable(label, "unexpected answer of the kernel init")),
    }
    let Some(fd) = fds.pop() else {
        return Err(unavailable(label, "no listener received"));
    };
    let std_listener = std::net::TcpListener::from(fd);
    std_listener.set_nonblocking(true).map_err(io_err)?;
    let listener = tokio::net::TcpListener::from_std(std_listener).map_err(io_err)?;
    Ok(ProxyTask(tokio::spawn(cellhost_egress::proxy::serve(
        listener, egress,
    ))))
}
