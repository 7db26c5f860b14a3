//! Sessions' network policies: the registry's settings (the default, the
//! policy per session-name pattern, the proxy's pinned names and bounds)
//! and how a policy becomes a kernel's configuration.
//!
//! A session's policy is the one it was created with (HTTP
//! `POST /v1/sessions {"network": …}`, the daemon's `exec --session
//! --network …`), else the config's for the first pattern that matches
//! its name most specifically, else the config's default. It applies to
//! the kernels the session starts from then on (a live kernel keeps its
//! own until it restarts), like the session's environment.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cellhost_kernel::KernelConfig;
use cellhost_kernel::egress::{Egress, Limits, NetworkPolicy, Resolver};
use cellhost_sandbox::profile::SandboxMode;

use crate::requests::RequestError;

/// The registry's network settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkSettings {
    /// The policy of a session nothing else names (config `[egress]
    /// default`); `None`: the template's network (config `network`:
    /// `false` is `off`, `true` is `on`).
    pub default: Option<NetworkPolicy>,
    /// Policies by session-name pattern (`*` matches any run of
    /// characters): an exact name wins, then the pattern with the most
    /// characters other than `*`.
    pub sessions: Vec<(String, NetworkPolicy)>,
    /// Names the proxy resolves to these addresses, whatever DNS says;
    /// the only way besides an IP rule to reach a non-public address.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// The proxy's bounds per kernel.
    pub limits: Limits,
}

/// `name` matches `pattern`, where `*` stands for any run of characters.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

impl NetworkSettings {
    /// The configured policy of a session named `session` (no request
    /// named one); `None`: the template's network.
    pub fn for_session(&self, session: &str) -> Option<NetworkPolicy> {
        let best = self
            .sessions
            .iter()
            .filter(|(p, _)| glob_match(p, session))
            .max_by_key(|(p, _)| (p == session, p.chars().filter(|c| *c != '*').count()));
        best.map(|(_, pol)| pol.clone()).or_else(|| self.default.clone())
    }

    /// Applies `policy` to a kernel's configuration: `on` keeps the host's
    /// network, `off` a private loopback only, a list the proxy with these
    /// settings' resolver and bounds.
    pub fn apply(&self, policy: &NetworkPolicy, cfg: &mut KernelConfig) {
        cfg.sandbox.network = matches!(policy, NetworkPolicy::On);
        cfg.egress = Egress::for_policy(
            policy,
            Resolver {
                hosts: self.hosts.clone(),
                timeout: std::time::Duration::from_secs(5),
            },
            self.limits.clone(),
        );
    }
}

/// Parses a policy a request names (`off`, `on`, rules separated by
/// commas).
///
/// # Errors
/// [`RequestError::BadRequest`] naming the bad rule.
pub fn parse_request(text: &str) -> Result<NetworkPolicy, RequestError> {
    NetworkPolicy::parse(text).map_err(|e| RequestError::bad_request(format!("network: {e}")))
}

/// Checks that `policy` can be had in sandbox mode `mode`.
///
/// # Errors
/// [`RequestError::BadRequest`]: a list needs a sandbox (its network
/// namespace is the boundary), and mode `off` has none.
pub fn check(policy: &NetworkPolicy, mode: SandboxMode) -> Result<(), RequestError> {
    if matches!(policy, NetworkPolicy::Allow(_)) && mode == SandboxMode::Off {
        return Err(RequestError::bad_request(
            "a network allowlist needs a sandbox (mode auto or enforce): with --sandbox off the kernel has the host's network",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_pick_the_most_specific_policy() {
        let list = NetworkPolicy::parse("api.example.com:443").expect("policy");
        let s = NetworkSettings {
            default: Some(NetworkPolicy::Off),
            sessions: vec![
                ("*".into(), NetworkPolicy::On),
                ("agent-*".into(), list.clone()),
                ("agent-x".into(), NetworkPolicy::Off),
            ],
            ..Default::default()
        };
        assert_eq!(s.for_session("agent-1"), Some(list));
        assert_eq!(s.for_session("agent-x"), Some(NetworkPolicy::Off));
        assert_eq!(s.for_session("other"), Some(NetworkPolicy::On));
        assert!(glob_match("a*b*c", "aXbYc") && !glob_match("a*b*c", "aXc") && !glob_match("ab", "abc"));
        assert!(glob_match("*-dev", "x-dev") && !glob_match("x*x", "x"));
    }
}
