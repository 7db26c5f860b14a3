//! A session's network policy and the grammar of its host patterns.
//!
//! ```text
//! policy = "off" | "on" | rule ("," rule)*     (CLI, config: a string; JSON: "off", "on" or an array of rules)
//! rule   = host [":" port]
//! host   = name | "*." name | ipv4 | "[" ipv6 "]"
//! port   = 1..65535 | "*"                      (omitted: 443 and 80)
//! ```
//!
//! * `name` is an ASCII DNS name (IDNs in their `xn--` form): labels of
//!   letters, digits, `-` and `_`, 1 to 63 characters each, at most 253 in
//!   all, compared without case; a trailing `.` is dropped. Its last label
//!   is not all digits (`127.1`, `0x7f.1` are numeric hosts, refused).
//! * `*.name` matches every name *below* `name` (`a.name`, `a.b.name`), never
//!   `name` itself; `name` has at least two labels (`*.com` is refused).
//! * `ipv4` is a dotted quad, `ipv6` in brackets; an IP literal target is
//!   admitted only by a rule naming that address (never by a name rule).
//! * At most [`MAX_RULES`] rules.
//!
//! `off` (the default): the kernel's network namespace holds only a private
//! loopback. `on`: the host's network, unfiltered (no network namespace).
//! A list: the namespace reaches only the host-side proxy, which admits
//! the listed hosts and ports.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// Most rules a list may hold.
pub const MAX_RULES: usize = 256;

/// Longest rule accepted, in bytes.
pub const MAX_RULE_LEN: usize = 300;

/// A session's network policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum NetworkPolicy {
    /// Only a private loopback (the default).
    #[default]
    Off,
    /// The host's network, unfiltered.
    On,
    /// Only the listed hosts and ports, through the host-side proxy.
    Allow(Vec<Rule>),
}

/// Why a policy was refused: the offending text and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad network policy entry {entry:?}: {reason}")]
pub struct PolicyError {
    /// The rule (or policy string) refused, cut to [`MAX_RULE_LEN`].
    pub entry: String,
    /// What is wrong with it.
    pub reason: String,
}

fn bad(entry: &str, reason: impl Into<String>) -> PolicyError {
    PolicyError {
        entry: entry.chars().take(MAX_RULE_LEN).collect(),
        reason: reason.into(),
    }
}

/// The host part of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this name (lower case, no trailing dot).
    Name(String),
    /// Every name below this one (`*.` + it).
    Below(String),
    /// Exactly this address.
    Ip(IpAddr),
}

/// The port part of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortPattern {
    /// None given: 443 and 80.
    Web,
    /// Exactly this port.
    One(u16),
    /// `*`: every port.
    Any,
}

impl PortPattern {
    /// `port` is admitted.
    pub fn admits(self, port: u16) -> bool {
        match self {
            PortPattern::Web => port == 443 || port == 80,
            PortPattern::One(p) => p == port,
            PortPattern::Any => true,
        }
    }
}

/// One rule: a host pattern and its ports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Which hosts.
    pub host: HostPattern,
    /// Which ports.
    pub port: PortPattern,
}

/// The host of a request, as the proxy classifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A DNS name (lower case, no trailing dot).
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl Target {
    /// The host as text (`[…]` around IPv6).
    pub fn display(&self) -> String {
        match self {
            Target::Name(n) => n.clone(),
            Target::Ip(IpAddr::V6(a)) => format!("[{a}]"),
            Target::Ip(a) => a.to_string(),
        }
    }
}

/// Why a target host is not a host at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostError {
    /// Not a DNS name nor an IP literal.
    Malformed,
    /// A numeric host that is not a dotted quad (`127.1`, `0x7f.0.0.1`,
    /// `2130706433`): resolvers read it as an address.
    NumericForm,
}

/// Checks a DNS name of a rule or a request: lower-cased, trailing dot
/// dropped.
fn dns_name(s: &str) -> Result<String, HostError> {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() || s.len() > 253 {
        return Err(HostError::Malformed);
    }
    let lower = s.to_ascii_lowercase();
    for label in lower.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(HostError::Malformed);
        }
    }
    let last = lower.rsplit('.').next().unwrap_or("");
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || (last.starts_with("0x") && last[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err(HostError::NumericForm);
    }
    Ok(lower)
}

/// Classifies the host of a request (`CONNECT` authority, absolute URL or
/// `Host` header; IPv6 in brackets).
///
/// # Errors
/// [`HostError`] for anything but a DNS name or a canonical IP literal.
pub fn parse_target(host: &str) -> Result<Target, HostError> {
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(HostError::Malformed)?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|a| Target::Ip(IpAddr::V6(a)))
            .map_err(|_| HostError::Malformed);
    }
    if let Ok(a) = host.parse::<Ipv4Addr>() {
        return Ok(Target::Ip(IpAddr::V4(a)));
    }
    dns_name(host).map(Target::Name)
}

/// Splits `host[:port]` (IPv6 in brackets); `None` for the port when none
/// is given.
///
/// `None` for a bracket that is not closed, or text after it that is not
/// `:` and a port.
pub fn split_host_port(s: &str) -> Option<(&str, Option<&str>)> {
    if s.starts_with('[') {
        let end = s.find(']')?;
        let (host, rest) = s.split_at(end + 1);
        return match rest {
            "" => Some((host, None)),
            r => r.strip_prefix(':').map(|p| (host, Some(p))),
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Some((h, Some(p))),
        None => Some((s, None)),
    }
}

/// A port number 1..=65535 in plain decimal.
pub fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse::<u16>().ok().filter(|n| *n != 0)
}

impl Rule {
    /// Parses one rule (see the module docs).
    ///
    /// # Errors
    /// [`PolicyError`] naming the rule and what is wrong.
    pub fn parse(text: &str) -> Result<Rule, PolicyError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(bad(text, "empty rule"));
        }
        if t.len() > MAX_RULE_LEN {
            return Err(bad(text, format!("longer than {MAX_RULE_LEN} bytes")));
        }
        let (host, port) =
            split_host_port(t).ok_or_else(|| bad(text, "an IPv6 address goes in brackets: [::1]:443"))?;
        let port = match port {
            None => PortPattern::Web,
            Some("*") => PortPattern::Any,
            Some(p) => {
                PortPattern::One(parse_port(p).ok_or_else(|| bad(text, "the port is 1 to 65535 or *"))?)
            }
        };
        let host = if let Some(below) = host.strip_prefix("*.") {
            let name = dns_name(below).map_err(|_| bad(text, "a wildcard is `*.` followed by a DNS name"))?;
            if !name.contains('.') {
                return Err(bad(
                    text,
                    "a wildcard needs at least two labels after `*.` (`*.example.com`)",
                ));
            }
            HostPattern::Below(name)
        } else if host.contains('*') {
            return Err(bad(text, "`*` only as the whole first label (`*.example.com`)"));
        } else {
            match parse_target(host) {
                Ok(Target::Name(n)) => HostPattern::Name(n),
                Ok(Target::Ip(a)) => HostPattern::Ip(a),
                Err(HostError::NumericForm) => {
                    return Err(bad(text, "a numeric host: give an IPv4 address as a dotted quad"));
                }
                Err(HostError::Malformed) => {
                    return Err(bad(text, "not a DNS name, IPv4 address or [IPv6] address"));
                }
            }
        };
        Ok(Rule { host, port })
    }

    /// The rule admits `target` on `port`.
    pub fn admits(&self, target: &Target, port: u16) -> bool {
        if !self.port.admits(port) {
            return false;
        }
        match (&self.host, target) {
            (HostPattern::Name(n), Target::Name(t)) => n == t,
            (HostPattern::Below(s), Target::Name(t)) => {
                t.len() > s.len() + 1
                    && t.ends_with(s.as_str())
                    && t.as_bytes()[t.len() - s.len() - 1] == b'.'
            }
            (HostPattern::Ip(a), Target::Ip(b)) => canonical(*a) == canonical(*b),
            _ => false,
        }
    }
}

/// An IPv4-mapped IPv6 address as its IPv4 address; others as they are.
pub fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            HostPattern::Name(n) => write!(f, "{n}")?,
            HostPattern::Below(n) => write!(f, "*.{n}")?,
            HostPattern::Ip(IpAddr::V6(a)) => write!(f, "[{a}]")?,
            HostPattern::Ip(a) => write!(f, "{a}")?,
        }
        match self.port {
            PortPattern::Web => Ok(()),
            PortPattern::One(p) => write!(f, ":{p}"),
            PortPattern::Any => write!(f, ":*"),
        }
    }
}

impl NetworkPolicy {
    /// Parses the CLI and config form: `off`, `on`, or rules separated by
    /// commas (`api.openai.com:443,*.githubusercontent.com`).
    ///
    /// # Errors
    /// [`PolicyError`] for an empty list, a bad rule, or more than
    /// [`MAX_RULES`].
    pub fn parse(text: &str) -> Result<NetworkPolicy, PolicyError> {
        match text.trim() {
            "off" => Ok(NetworkPolicy::Off),
            "on" => Ok(NetworkPolicy::On),
            t => Self::from_rules(t.split(',').collect::<Vec<_>>()),
        }
    }

    /// A list policy from its rules.
    ///
    /// # Errors
    /// As [`NetworkPolicy::parse`].
    pub fn from_rules<S: AsRef<str>>(rules: Vec<S>) -> Result<NetworkPolicy, PolicyError> {
        if rules.is_empty() {
            return Err(bad("", "an empty list: use \"off\" for no network"));
        }
        if rules.len() > MAX_RULES {
            return Err(bad("", format!("more than {MAX_RULES} rules")));
        }
        let mut out: Vec<Rule> = Vec::new();
        for r in &rules {
            let rule = Rule::parse(r.as_ref())?;
            if !out.contains(&rule) {
                out.push(rule);
            }
        }
        Ok(NetworkPolicy::Allow(out))
    }

    /// `on`, `off`, or the rules joined by commas (what [`NetworkPolicy::parse`] reads).
    pub fn to_text(&self) -> String {
        match self {
            NetworkPolicy::Off => "off".into(),
            NetworkPolicy::On => "on".into(),
            NetworkPolicy::Allow(r) => r.iter().map(Rule::to_string).collect::<Vec<_>>().join(","),
        }
    }

    /// The rules of a list policy (none for `on` and `off`).
    pub fn rules(&self) -> &[Rule] {
        match self {
            NetworkPolicy::Allow(r) => r,
            _ => &[],
        }
    }
}

impl Serialize for NetworkPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NetworkPolicy::Off => s.serialize_str("off"),
            NetworkPolicy::On => s.serialize_str("on"),
            NetworkPolicy::Allow(r) => s.collect_seq(r.iter().map(Rule::to_string)),
        }
    }
}

impl<'de> Deserialize<'de> for NetworkPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            List(Vec<String>),
        }
        let raw = Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("network is \"off\", \"on\" or a list of \"HOST[:PORT]\" rules")
        })?;
        match raw {
            Raw::Word(w) => NetworkPolicy::parse(&w),
            Raw::List(l) => NetworkPolicy::from_rules(l),
        }
        .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        parse_target(s).expect("target")
    }

    #[test]
    fn grammar_accepts_names_wildcards_ips_and_ports() {
        let p = NetworkPolicy::parse("api.openai.com:443, *.githubusercontent.com,10.0.0.5:*,[::1]:8080")
            .expect("parse");
        assert_eq!(
            p.to_text(),
            "api.openai.com:443,*.githubusercontent.com,10.0.0.5:*,[::1]:8080"
        );
        let r = p.rules();
        assert!(r[0].admits(&t("API.OpenAI.com."), 443));
        assert!(!r[0].admits(&t("api.openai.com"), 80));
        assert!(r[1].admits(&t("raw.githubusercontent.com"), 443));
        assert!(r[1].admits(&t("a.b.githubusercontent.com"), 80));
        assert!(!r[1].admits(&t("githubusercontent.com"), 443));
        assert!(!r[1].admits(&t("evilgithubusercontent.com"), 443));
        assert!(!r[1].admits(&t("raw.githubusercontent.com"), 8443));
        assert!(r[2].admits(&t("10.0.0.5"), 22));
        assert!(!r[2].admits(&t("10.0.0.6"), 22));
        assert!(r[3].admits(&t("[::1]"), 8080));
        assert!(
            !r[3].admits(&t("localhost"), 8080),
            "a name never matches an IP rule"
        );
    }

    #[test]
    fn grammar_refuses_bad_rules() {
        for bad in [
            "",
            "*",
            "*.com",
            "a*.example.com",
            "exa mple.com",
            "example.com:0",
            "example.com:70000",
            "example.com:+1",
            "127.1",
            "0x7f.0.0.1",
            "2130706433",
            "::1",
            "[::1",
            "-a.example.com",
            "ex\u{e4}mple.com",
        ] {
            assert!(Rule::parse(bad).is_err() || bad.is_empty(), "{bad:?} accepted");
        }
        assert!(NetworkPolicy::parse("").is_err());
        assert!(NetworkPolicy::from_rules(Vec::<String>::new()).is_err());
        let many: Vec<String> = (0..=MAX_RULES).map(|i| format!("h{i}.example.com")).collect();
        assert!(NetworkPolicy::from_rules(many).is_err());
    }

    #[test]
    fn numeric_targets_are_not_names() {
        assert_eq!(parse_target("127.1"), Err(HostError::NumericForm));
        assert_eq!(parse_target("0x7f000001"), Err(HostError::NumericForm));
        assert_eq!(parse_target("017700000001"), Err(HostError::NumericForm));
        assert_eq!(
            parse_target("127.0.0.1"),
            Ok(Target::Ip("127.0.0.1".parse().expect("ip")))
        );
        assert_eq!(parse_target("a b"), Err(HostError::Malformed));
    }

    #[test]
    fn mapped_ipv6_is_its_ipv4() {
        let r = Rule::parse("127.0.0.1:80").expect("rule");
        assert!(r.admits(&t("[::ffff:127.0.0.1]"), 80));
    }

    #[test]
    fn json_forms() {
        let p: NetworkPolicy = serde_json::from_str(r#"["example.com:443"]"#).expect("list");
        assert_eq!(serde_json::to_string(&p).expect("ser"), r#"["example.com:443"]"#);
        let p: NetworkPolicy = serde_json::from_str(r#""on""#).expect("on");
        assert_eq!(p, NetworkPolicy::On);
        assert!(serde_json::from_str::<NetworkPolicy>(r#"["*"]"#).is_err());
        assert!(serde_json::from_str::<NetworkPolicy>("3").is_err());
    }
}
