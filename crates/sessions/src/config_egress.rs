//! The config file's `[egress]` table: the network policy per session
//! pattern and the egress proxy's settings.
//!
//! ```toml
//! [egress]
//! default = "off"                              # "off", "on" or ["HOST[:PORT]", ...]
//! hosts = { "api.internal" = "10.0.0.5" }      # pinned names (an address or a list)
//! max_connections = 64                         # per kernel
//! idle_timeout_s = 120
//!
//! [egress.sessions]
//! "agent-*" = ["api.openai.com:443", "*.githubusercontent.com"]
//! ```

use std::net::IpAddr;
use std::time::Duration;

use cellhost_kernel::egress::NetworkPolicy;

use crate::config::ConfigError;
use crate::network::NetworkSettings;

fn invalid(origin: &str, msg: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid(format!("{origin}: [egress]: {msg}"))
}

fn policy(v: toml::Value, origin: &str, what: &str) -> Result<NetworkPolicy, ConfigError> {
    let parsed = match v {
        toml::Value::String(s) => NetworkPolicy::parse(&s),
        toml::Value::Array(a) => {
            let mut rules = Vec::new();
            for r in a {
                match r {
                    toml::Value::String(s) => rules.push(s),
                    other => {
                        return Err(invalid(
                            origin,
                            format!("{what}: a rule is a string, not {}", other.type_str()),
                        ));
                    }
                }
            }
            NetworkPolicy::from_rules(rules)
        }
        other => {
            return Err(invalid(
                origin,
                format!(
                    "{what}: \"off\", \"on\" or a list of rules, not {}",
                    other.type_str()
                ),
            ));
        }
    };
    parsed.map_err(|e| invalid(origin, format!("{what}: {e}")))
}

fn address(v: &toml::Value, origin: &str, name: &str) -> Result<IpAddr, ConfigError> {
    v.as_str()
        .and_then(|s| {
            s.trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse()
                .ok()
        })
        .ok_or_else(|| invalid(origin, format!("hosts.{name}: not an IP address")))
}

/// Parses the `[egress]` table (`origin` names the file in errors).
///
/// # Errors
/// [`ConfigError::Invalid`] naming the key.
pub fn parse(table: toml::Table, origin: &str) -> Result<NetworkSettings, ConfigError> {
    let mut s = NetworkSettings::default();
    for (key, v) in table {
        match key.as_str() {
            "default" => s.default = Some(policy(v, origin, "default")?),
            "sessions" => {
                let toml::Value::Table(t) = v else {
                    return Err(invalid(origin, "`sessions` is a table of PATTERN = policy"));
                };
                for (pattern, p) in t {
                    let pol = policy(p, origin, &format!("sessions.{pattern:?}"))?;
                    s.sessions.push((pattern, pol));
                }
            }
            "hosts" => {
                let toml::Value::Table(t) = v else {
                    return Err(invalid(origin, "`hosts` is a table of NAME = address"));
                };
                for (name, a) in t {
                    let addrs = match &a {
                        toml::Value::Array(list) => list
                            .iter()
                            .map(|x| address(x, origin, &name))
                            .collect::<Result<Vec<_>, _>>()?,
                        one => vec![address(one, origin, &name)?],
                    };
                    let Ok(cellhost_kernel::egress::policy::Target::Name(n)) =
                        cellhost_kernel::egress::policy::parse_target(&name)
                    else {
                        return Err(invalid(origin, format!("hosts: {name:?} is not a DNS name")));
                    };
                    if addrs.is_empty() {
                        return Err(invalid(origin, format!("hosts.{name}: no address")));
                    }
                    s.hosts.insert(n, addrs);
                }
            }
            "max_connections" => {
                let n = v.as_integer().filter(|n| (1..=100_000).contains(n));
                s.limits.max_connections =
                    n.ok_or_else(|| invalid(origin, "max_connections: an integer 1..=100000"))? as usize;
            }
            "idle_timeout_s" => {
                let t = v
                    .as_float()
                    .or_else(|| v.as_integer().map(|i| i as f64))
                    .filter(|t| *t > 0.0 && t.is_finite());
                s.limits.idle_timeout = Duration::from_secs_f64(
                    t.ok_or_else(|| invalid(origin, "idle_timeout_s: a number > 0"))?
                        .min(86400.0),
                );
            }
            other => {
                return Err(invalid(
                    origin,
                    format!(
                        "unknown key `{other}` (known: default, sessions, hosts, max_connections, idle_timeout_s)"
                    ),
                ));
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_parses_and_refuses_bad_entries() {
        let t: toml::Table = r#"
default = "off"
hosts = { "allowed.test" = "127.0.0.1", "two.test" = ["10.0.0.1", "[::1]"] }
max_connections = 8
[sessions]
"agent-*" = ["api.example.com:443"]
"open" = "on"
"#
        .parse()
        .expect("toml");
        let s = parse(t, "f").expect("parse");
        assert_eq!(s.default, Some(NetworkPolicy::Off));
        assert_eq!(s.hosts["two.test"].len(), 2);
        assert_eq!(s.limits.max_connections, 8);
        assert_eq!(s.for_session("open"), Some(NetworkPolicy::On));
        for bad in [
            "default = 3",
            "default = [\"*\"]",
            "hosts = { \"a.test\" = \"nope\" }",
            "hosts = { \"1.2.3.4\" = \"1.2.3.4\" }",
            "max_connections = 0",
            "other = 1",
        ] {
            let t: toml::Table = bad.parse().expect("toml");
            assert!(parse(t, "f").is_err(), "{bad}");
        }
    }
}
