//! Names to addresses, answered by the proxy (the kernel has no DNS).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::address::{is_host_address, is_public};
use crate::denial::DenyReason;

/// How a name is resolved: the policy's pinned names first (`hosts`: name
/// → addresses, any address, the operator's word), else the host's system
/// resolver, whose answers must be public addresses
/// ([`crate::address::is_public`]) and none of the host's own
/// ([`crate::address::is_host_address`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolver {
    /// Pinned names (lower case, no trailing dot) and their addresses.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Longest wait for the system resolver.
    pub timeout: Duration,
}

impl Resolver {
    /// The addresses to connect to for `name` on `port`.
    ///
    /// # Errors
    /// [`DenyReason::ResolveFailed`] (no answer, or none in time),
    /// [`DenyReason::PrivateAddress`] (only non-public answers, or the
    /// host's own addresses, from the system resolver).
    pub async fn resolve(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, DenyReason> {
        if let Some(pinned) = self.hosts.get(name) {
            return Ok(pinned.iter().map(|a| SocketAddr::new(*a, port)).collect());
        }
        let wait = if self.timeout.is_zero() {
            Duration::from_secs(5)
        } else {
            self.timeout
        };
        let found = match tokio::time::timeout(wait, tokio::net::lookup_host((name, port))).await {
            Ok(Ok(it)) => it.collect::<Vec<SocketAddr>>(),
            _ => return Err(DenyReason::ResolveFailed),
        };
        if found.is_empty() {
            return Err(DenyReason::ResolveFailed);
        }
        let public = reachable(found);
        if public.is_empty() {
            return Err(DenyReason::PrivateAddress);
        }
        Ok(public)
    }
}

/// The answers of the system resolver a kernel may be sent to: public
/// addresses that are not this host's own (a name planted to reach the
/// host's listeners on a public address of its own is refused like one
/// pointing at loopback).
pub fn reachable(found: Vec<SocketAddr>) -> Vec<SocketAddr> {
    found
        .into_iter()
        .filter(|a| is_public(a.ip()) && !is_host_address(a.ip()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pinned_names_win_and_system_answers_must_be_public() {
        let mut r = Resolver::default();
        r.hosts
            .insert("allowed.test".into(), vec!["127.0.0.1".parse().expect("ip")]);
        let a = r.resolve("allowed.test", 8080).await.expect("pinned");
        assert_eq!(a, vec!["127.0.0.1:8080".parse::<SocketAddr>().expect("addr")]);
        // `localhost` resolves through the system resolver to loopback only.
        assert_eq!(r.resolve("localhost", 80).await, Err(DenyReason::PrivateAddress));
    }

    #[test]
    fn the_hosts_own_addresses_are_never_reachable_by_a_resolved_name() {
        // The address this host sends from on its default route is its own.
        let own = std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| s.connect("192.0.2.1:9").map(|()| s))
            .and_then(|s| s.local_addr())
            .map(|a| a.ip());
        let public: SocketAddr = "1.1.1.1:443".parse().expect("addr");
        let mut found = vec![public, "127.0.0.1:443".parse().expect("addr")];
        if let Ok(ip) = own {
            found.push(SocketAddr::new(ip, 443));
        }
        assert_eq!(reachable(found), vec![public]);
    }
}
