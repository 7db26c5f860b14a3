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
//! by the proxy (and listed in the install's error); a name resolving to a
//! non-public address is refused unless it is the index's IP literal or
//! pinned in `[egress] hosts` (the proxy's rules, see
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
        let resolver = Resolver {
            hosts: settings.egress_hosts.clone(),
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
    }
}
