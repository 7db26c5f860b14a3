//! The kernel's end of egress by allowlist: a TCP listener bound on the
//! loopback of the kernel's own network namespace and handed to the host.
//!
//! When the [`InitSpec`](crate::profile::InitSpec) names an
//! `egress_port`, the kernel init — after it unshared the network
//! namespace and brought its loopback up, before it forks anything — binds
//! `127.0.0.1:<port>` there and sends the listener to the host over the
//! control socket (fd 0) as `SCM_RIGHTS` with one byte, [`LISTENER`],
//! then closes its own copy. The host accepts on it and proxies (crate
//! `cellhost-egress`); no process of the kernel holds the listener, so
//! nothing in the kernel can accept in the proxy's place, and the port is
//! taken before any code of the kernel could bind it. Without a private
//! network namespace (mode `auto` on a host without one) the byte is
//! [`NO_NETNS`] and no listener is bound: a listener in the host's
//! namespace would be no boundary at all, so the host refuses the kernel.
//! [`BIND_FAILED`] when the socket calls fail.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};

/// The byte sent with the listener.
pub const LISTENER: u8 = b'E';
/// The byte sent when the kernel has no network namespace of its own.
pub const NO_NETNS: u8 = b'N';
/// The byte sent when the listener could not be made.
pub const BIND_FAILED: u8 = b'F';

fn bind_loopback(port: u16) -> rustix::io::Result<std::os::fd::OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrV4, SocketFlags, SocketType, bind, listen, socket_with};
    let s = socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    bind(&s, &SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port))?;
    listen(&s, 128)?;
    Ok(s)
}

/// Binds the listener (when `private_netns`) and sends it, or the byte
/// saying why not, over `control`. Returns whether a listener was sent.
pub fn hand_over_listener(control: BorrowedFd<'_>, port: u16, private_netns: bool) -> bool {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let listener = if private_netns {
        bind_loopback(port).ok()
    } else {
        None
    };
    let byte = match (&listener, private_netns) {
        (Some(_), _) => [LISTENER],
        (None, true) => [BIND_FAILED],
        (None, false) => [NO_NETNS],
    };
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(l) = &listener {
        fds = [l.as_fd()];
        anc.push(SendAncillaryMessage::ScmRights(&fds));
    }
    loop {
        match sendmsg(control, &[IoSlice::new(&byte)], &mut anc, SendFlags::NOSIGNAL) {
            Err(rustix::io::Errno::INTR) => continue,
            Ok(1) => return listener.is_some(),
            _ => return false,
        }
    }
}
