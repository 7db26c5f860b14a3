//! Which addresses a name may resolve to.
//!
//! A name found by the system resolver may lead only to a public unicast
//! address: a DNS answer pointing at loopback, a private or link-local
//! network, the host itself or a multicast group (DNS rebinding, or a
//! name planted to reach the host's own services) is refused. Such an
//! address is reachable only when the operator names it: as an IP rule
//! (`10.0.0.5:443`), or as the address a name is pinned to in the
//! policy's `hosts` table.
//!
//! "The host itself" is not a range: a host may hold a public address on
//! one of its interfaces (a cloud VM's global IPv6 address, say), where
//! its own listeners answer. [`is_host_address`] asks the kernel's routing
//! table whether an address is local to this host, so an answer naming
//! one of the host's addresses is refused like loopback, whatever range
//! it is in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use crate::policy::canonical;

/// `a` is a public unicast address (see the module docs for the ranges
/// refused: RFC 6890's special-purpose blocks that are not globally
/// reachable).
pub fn is_public(a: IpAddr) -> bool {
    match canonical(a) {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => public_v6(v6),
    }
}

/// `a` is one of this host's own addresses (it routes to the host
/// itself): a connected UDP socket's source address is the destination
/// exactly when the route to it is a local one. Nothing is sent (a UDP
/// `connect` only looks the route up). An address the host cannot route
/// to at all counts as not local (a connection to it fails anyway).
pub fn is_host_address(a: IpAddr) -> bool {
    let a = canonical(a);
    if a.is_loopback() || a.is_unspecified() {
        return true;
    }
    let bind: SocketAddr = match a {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let Ok(s) = UdpSocket::bind(bind) else {
        return false;
    };
    if s.connect(SocketAddr::new(a, 9)).is_err() {
        return false;
    }
    s.local_addr().is_ok_and(|l| canonical(l.ip()) == a)
}

fn public_v4(a: Ipv4Addr) -> bool {
    let o = a.octets();
    !(a.is_unspecified()
        || a.is_loopback()
        || a.is_private()
        || a.is_link_local()
        || a.is_broadcast()
        || a.is_multicast()
        || a.is_documentation()
        || o[0] == 0
        // Shared address space (carrier-grade NAT), 100.64.0.0/10.
        || (o[0] == 100 && (o[1] & 0xc0) == 64)
        // IETF protocol assignments, 192.0.0.0/24.
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)
        // Benchmarking, 198.18.0.0/15.
        || (o[0] == 198 && (o[1] & 0xfe) == 18)
        // Reserved, 240.0.0.0/4.
        || o[0] >= 240)
}

fn public_v6(a: Ipv6Addr) -> bool {
    let s = a.segments();
    !(a.is_unspecified()
        || a.is_loopback()
        || a.is_multicast()
        // Unique local, fc00::/7.
        || (s[0] & 0xfe00) == 0xfc00
        // Link-local, fe80::/10; deprecated site-local, fec0::/10.
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        // Documentation, 2001:db8::/32.
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        // IPv4-compatible (deprecated) and NAT64 well-known prefix 64:ff9b::/96
        // (it embeds an IPv4 address that may be private).
        || (s[0..6] == [0, 0, 0, 0, 0, 0])
        || (s[0] == 0x64 && s[1] == 0xff9b)
        // Teredo and 6to4 embed IPv4 addresses too.
        || (s[0] == 0x2001 && s[1] == 0)
        || s[0] == 0x2002)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This host's address on its default route (for IPv4 and IPv6), if
    /// it has one.
    fn own_addresses() -> Vec<IpAddr> {
        let mut out = Vec::new();
        for (bind, probe) in [("0.0.0.0:0", "192.0.2.1:9"), ("[::]:0", "[2001:db8::1]:9")] {
            if let Ok(s) = UdpSocket::bind(bind)
                && s.connect(probe).is_ok()
                && let Ok(l) = s.local_addr()
                && !l.ip().is_unspecified()
            {
                out.push(l.ip());
            }
        }
        out
    }

    #[test]
    fn the_hosts_own_addresses_are_recognised() {
        assert!(is_host_address("127.0.0.1".parse().expect("ip")));
        assert!(is_host_address("::1".parse().expect("ip")));
        assert!(is_host_address("::ffff:127.0.0.1".parse().expect("ip")));
        for a in own_addresses() {
            assert!(is_host_address(a), "{a} (this host's) not recognised");
        }
        // Documentation addresses are no host's; a public resolver's
        // address is not this one's.
        assert!(!is_host_address("198.51.100.7".parse().expect("ip")));
        assert!(!is_host_address("2001:db8::7".parse().expect("ip")));
    }

    fn p(s: &str) -> bool {
        is_public(s.parse().expect("ip"))
    }

    #[test]
    fn private_and_special_ranges_are_not_public() {
        for a in [
            "127.0.0.1",
            "127.9.9.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "2001:db8::1",
            "::127.0.0.1",
        ] {
            assert!(!p(a), "{a} counted as public");
        }
        for a in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(p(a), "{a} counted as not public");
        }
    }
}
