//! The installer's network: an egress proxy instance of its own, for the
//! duration of one install, whose allowlist is the package index's host
//! (plus `files.pythonhosted.org`, where PyPI serves its files) and the
//! hosts of `name @ URL` specs when the configuration allows those.
//!
//! The installer runs on the host, outside the kernel's sandbox, so it is
//! the proxy that keeps it to the index: its `HTTP_PROXY`/`HTTPS_PROXY`/
//! `ALL_PROXY` (upper and lower case) name the proxy's loopback listener,
//! `NO_PROXY` is empty (nothing bypasses it), and pip is also given
//! `--proxy`. A redirect or a dependency URL to any other host is refused
//! by the proxy (and listed in the install's error). The index's host
//! (and PyPI's file host) are the operator's own choice, so they are
//! pinned to what the system resolver answers when the install starts,
//! whatever address that is (a mirror on the local network); any other
//! name — a `name @ URL` spec's host — resolving to a non-public address
//! is refused unless pinned in `[egress] hosts` (the proxy's rules, see
//! [`cellhost_kernel::egress::address`]).
//!
//! The host's own proxy variables are not passed on: the installer's
//! traffic leaves through this proxy only, which connects directly.

use std::sync::Arc;

use cellhost_kernel::egress::{Egress, Limits, NetworkPolicy, Resolver};
use tokio::net::TcpListener;

use crate::packages::{PackageError, PackageSettings};

/// Where PyPI serves the files its simple index links to.
pub const PYPI_FILES: &str = "files.pythonhosted.org";

/// The `HOST[:PORT]` of an `http(s)://` URL: its authority without user
/// information, with the scheme's port when none is given. `None` for
/// another scheme or an empty host.
pub fn url_host_rule(url: &str) -> Option<String> {
    let (rest, default_port) = if let Some(r) = url.strip_prefix("https://") {
        (r, 443)
    } else if let Some(r) = url.strip_prefix("http://") {
        (r, 80)
    } else {
        return None;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let hostport = authority.rsplit('@').next().unwrap_or_default();
    if hostport.is_empty() {
        return None;
    }
    let has_port = match hostport.rfind(']') {
        Some(end) => hostport[end..].contains(':'),
        None => hostport.contains(':'),
    };
    Some(if has_port {
        hostport.to_string()
    } else {
        format!("{hostport}:{default_port}")
    })
}

/// The names of `policy`'s first rules that the operator chose (the
/// index, PyPI's file host): `operator` of them, each with its port.
fn operator_names(policy: &NetworkPolicy, operator: usize) -> Vec<(String, u16)> {
    policy
        .to_text()
        .split(',')
        .take(operator)
        .filter_map(|r| {
            let (host, port) = r.rsplit_once(':')?;
            let port: u16 = port.parse().ok()?;
            // IP literals need no pinning (an IP rule admits its address).
            (!host.starts_with('[') && host.parse::<std::net::IpAddr>().is_err())
                .then(|| (host.to_ascii_lowercase(), port))
        })
        .collect()
}

/// How many of [`allowlist`]'s rules are the operator's (the index, and
/// PyPI's file host for PyPI) rather than a spec's.
pub fn operator_rules(settings: &PackageSettings) -> usize {
    let pypi = url_host_rule(&settings.index_url)
        .and_then(|r| {
            r.rsplit_once(':')
                .map(|(h, _)| h.eq_ignore_ascii_case("pypi.org"))
        })
        .unwrap_or(false);
    if pypi { 2 } else { 1 }
}

/// The allowlist of an install: the index's host, PyPI's file host when the
/// index is PyPI's, and the hosts of `name @ URL` specs (only validated
/// specs reach here, and URL specs only when `packages.allow_urls` is set).
///
/// # Errors
/// [`PackageError::InstallerUnavailable`] when the index URL has no host
/// the proxy can admit.
pub fn allowlist(settings: &PackageSettings, specs: &[String]) -> Result<NetworkPolicy, PackageError> {
    let index = url_host_rule(&settings.index_url).ok_or_else(|| PackageError::InstallerUnavailable {
        message: format!("package_index {:?} names no host", settings.index_url),
    })?;
    let mut rules = vec![index.clone()];
    let host = index.rsplit_once(':').map_or(index.as_str(), |(h, _)| h);
    if host.eq_ignore_ascii_case("pypi.org") {
        rules.push(format!("{PYPI_FILES}:443"));
    }
    for spec in specs {
        if let Some((_, url)) = spec.split_once('@')
            && let Some(r) = url_host_rule(url.trim())
            && !rules.contains(&r)
        {
            rules.push(r);
        }
    }
    NetworkPolicy::from_rules(rules).map_err(|e| PackageError::InstallerUnavailable {
        message: format!("package_index {:?}: {e}", settings.index_url),
    })
}

/// A running proxy for one install; dropping it ends the proxy and every
/// connection it serves.
pub struct InstallProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    egress: Arc<Egress>,
    task: tokio::task::JoinHandle<()>,
}

impl InstallProxy {
    /// Starts a proxy admitting `policy`'s rules on a loopback port.
    ///
    /// # Errors
    /// [`PackageError::InstallerUnavailable`]: no loopback port.
    pub async fn start(
        policy: &NetworkPolicy,
        settings: &PackageSettings,
    ) -> Result<InstallProxy, PackageError> {
        let listener =
            TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| PackageError::InstallerUnavailable {
                    message: format!("cannot start the installer's egress proxy: {e}"),
                })?;
        let port = listener
            .local_addr()
            .map_err(|e| PackageError::InstallerUnavailable {
                message: format!("cannot start the installer's egress proxy: {e}"),
            })?
            .port();
        let mut hosts = settings.egress_hosts.clone();
        for (name, port) in operator_names(policy, operator_rules(settings)) {
            if hosts.contains_key(&name) {
                continue;
            }
            // Unresolvable now: left to the proxy, which reports it.
            let found = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                tokio::net::lookup_host((name.clone(), port)),
            )
            .await;
            if let Ok(Ok(addrs)) = found {
                let mut ips: Vec<std::net::IpAddr> = addrs.map(|a| a.ip()).collect();
                ips.dedup();
                if !ips.is_empty() {
                    hosts.insert(name, ips);
                }
            }
        }
        let resolver = Resolver {
            hosts,
            timeout: std::time::Duration::from_secs(10),
        };
        let egress = Egress::for_policy(policy, resolver, Limits::default()).ok_or_else(|| {
            PackageError::InstallerUnavailable {
                message: "the installer's allowlist is empty".into(),
            }
        })?;
        let task = tokio::spawn(cellhost_kernel::egress::proxy::serve(listener, egress.clone()));
        Ok(InstallProxy {
            url: format!("http://127.0.0.1:{port}"),
            egress,
            task,
        })
    }

    /// The installer's proxy variables (upper and lower case; `NO_PROXY`
    /// empty).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        for (k, val) in [
            ("HTTP_PROXY", self.url.as_str()),
            ("HTTPS_PROXY", self.url.as_str()),
            ("ALL_PROXY", self.url.as_str()),
            ("NO_PROXY", ""),
        ] {
            v.push((k.to_string(), val.to_string()));
            v.push((k.to_ascii_lowercase(), val.to_string()));
        }
        v
    }

    /// The connections the proxy refused so far, one line each
    /// (`HOST:PORT (reason)`), oldest first.
    pub fn denied(&self) -> Vec<String> {
        self.egress
            .log
            .take()
            .map(|r| {
                r.denied
                    .iter()
                    .map(|d| format!("{}:{} ({})", d.host, d.port, d.reason.code()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for InstallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_urls() {
        for (url, want) in [
            ("https://pypi.org/simple", Some("pypi.org:443")),
            ("http://127.0.0.1:8080/simple/", Some("127.0.0.1:8080")),
            (
                "https://user:pw@mirror.example:8443/s",
                Some("mirror.example:8443"),
            ),
            ("http://[::1]/simple", Some("[::1]:80")),
            ("http://[::1]:81", Some("[::1]:81")),
            ("file:///etc", None),
            ("https:///x", None),
        ] {
            assert_eq!(url_host_rule(url).as_deref(), want, "{url}");
        }
    }

    #[test]
    fn pypi_gets_its_file_host_and_nothing_else() {
        let s = PackageSettings::default();
        let p = allowlist(&s, &["tomli".into()]).expect("policy");
        let rules: Vec<String> = p.to_text().split(',').map(str::to_string).collect();
        assert_eq!(rules, vec!["pypi.org:443", "files.pythonhosted.org:443"], "{p:?}");
        let local = PackageSettings {
            index_url: "http://127.0.0.1:9000/simple".into(),
            ..Default::default()
        };
        let p = allowlist(&local, &["six @ https://example.org/six.whl".into()]).expect("policy");
        assert_eq!(p.to_text(), "127.0.0.1:9000,example.org:443");
        // The spec's host is not the operator's: never pinned.
        assert_eq!(operator_rules(&local), 1);
        assert!(operator_names(&p, operator_rules(&local)).is_empty());
        let p = allowlist(&s, &[]).expect("policy");
        assert_eq!(
            operator_names(&p, operator_rules(&s)),
            vec![
                ("pypi.org".to_string(), 443),
                ("files.pythonhosted.org".to_string(), 443)
            ]
        );
    }
}
