//! Request heads a kernel sends the proxy: read within bounds, parsed
//! with `httparse`, and turned into what the proxy acts on.

use crate::body::Framing;
use crate::denial::DenyReason;
use crate::policy::{parse_port, split_host_port};

/// Most headers a request may carry.
pub const MAX_HEADERS: usize = 100;

/// A request the proxy understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyRequest {
    /// `CONNECT host:port`.
    Connect {
        /// The host as sent.
        host: String,
        /// The port.
        port: u16,
    },
    /// A plain HTTP request in absolute form (`GET http://host[:port]/path`).
    Forward {
        /// The host as sent.
        host: String,
        /// The port (80 when the URL names none).
        port: u16,
        /// The head to send upstream: origin-form request line, the
        /// client's headers less the hop-by-hop and proxy ones, and
        /// `Connection: close`.
        upstream_head: Vec<u8>,
        /// Where the request's body ends (nothing after it goes upstream).
        body: Framing,
    },
}

/// A refused head: why, and what target it named, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Why.
    pub reason: DenyReason,
    /// The host named (empty if none).
    pub host: String,
    /// The port named (0 if none).
    pub port: u16,
}

fn refused(reason: DenyReason, host: &str, port: u16) -> Refused {
    Refused {
        reason,
        host: host.to_string(),
        port,
    }
}

/// The end of the head in `buf` (the index just past `\r\n\r\n`), if
/// it has arrived.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    memchr_crlf2(buf).map(|i| i + 4)
}

fn memchr_crlf2(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Headers that describe one hop (RFC 9110 §7.6.1) or the proxy itself,
/// never passed upstream.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// Parses a complete head (`head`: up to and including the blank line).
///
/// # Errors
/// [`Refused`]: `bad_request` for anything but a `CONNECT` or an
/// absolute-form `http://` request and for a body whose end is ambiguous
/// ([`body_framing`]), `host_mismatch` for a `Host` header that is not the
/// target's, `head_too_large` for too many headers.
pub fn parse(head: &[u8]) -> Result<ProxyRequest, Refused> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Err(httparse::Error::TooManyHeaders) => return Err(refused(DenyReason::HeadTooLarge, "", 0)),
        _ => return Err(refused(DenyReason::BadRequest, "", 0)),
    }
    let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
        return Err(refused(DenyReason::BadRequest, "", 0));
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, Some(port))) = split_host_port(path) else {
            return Err(refused(DenyReason::BadRequest, path, 0));
        };
        let Some(port) = parse_port(port) else {
            return Err(refused(DenyReason::BadRequest, host, 0));
        };
        return Ok(ProxyRequest::Connect {
            host: host.to_string(),
            port,
        });
    }
    let Some(rest) = strip_prefix_ignore_case(path, "http://") else {
        return Err(refused(DenyReason::BadRequest, "", 0));
    };
    let (authority, origin) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') || authority.is_empty() {
        return Err(refused(DenyReason::BadRequest, "", 0));
    }
    let origin = if origin.starts_with('/') {
        origin.to_string()
    } else {
        format!("/{origin}")
    };
    let origin = origin.split('#').next().unwrap_or("/").to_string();
    let (host, port) =
        host_and_port(authority).ok_or_else(|| refused(DenyReason::BadRequest, authority, 0))?;
    // The Host header must be there exactly once and name the same host and
    // port (RFC 9112 §3.2.2 lets a proxy ignore it; this one refuses a
    // request whose two names differ, which a virtual host could be fooled by).
    let hosts: Vec<&httparse::Header> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .collect();
    let same = match hosts.as_slice() {
        [h] => std::str::from_utf8(h.value)
            .ok()
            .and_then(|v| host_and_port(v.trim()))
            .is_some_and(|(h2, p2)| h2.eq_ignore_ascii_case(&host) && p2 == port),
        _ => false,
    };
    if !same {
        return Err(refused(DenyReason::HostMismatch, &host, port));
    }
    let body = body_framing(req.headers).ok_or_else(|| refused(DenyReason::BadRequest, &host, port))?;
    let mut up = format!("{method} {origin} HTTP/1.{version}\r\n").into_bytes();
    for h in req.headers.iter() {
        if HOP_BY_HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
            continue;
        }
        up.extend_from_slice(h.name.as_bytes());
        up.extend_from_slice(b": ");
        up.extend_from_slice(h.value);
        up.extend_from_slice(b"\r\n");
    }
    up.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(ProxyRequest::Forward {
        host,
        port,
        upstream_head: up,
        body,
    })
}

/// How the body of a request with `headers` is delimited (RFC 9112
/// §6.3): `Transfer-Encoding` whose last coding is `chunked`, else
/// `Content-Length` (every value the same), else none. `None` — refused —
/// where a server and the proxy could disagree on where the body ends: both
/// headers at once, a transfer coding that is not `chunked` last, or
/// `Content-Length` values that differ or are not plain decimal (the
/// request smuggling forms).
pub fn body_framing(headers: &[httparse::Header<'_>]) -> Option<Framing> {
    let values = |name: &str| -> Option<Vec<String>> {
        let mut out = Vec::new();
        for h in headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)) {
            let v = std::str::from_utf8(h.value).ok()?;
            out.extend(v.split(',').map(|p| p.trim().to_ascii_lowercase()));
        }
        Some(out)
    };
    let te = values("transfer-encoding")?;
    let cl = values("content-length")?;
    if !te.is_empty() {
        return (cl.is_empty() && te.last().is_some_and(|c| c == "chunked")).then_some(Framing::Chunked);
    }
    let mut length = None;
    for v in &cl {
        if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u64 = v.parse().ok()?;
        if length.is_some_and(|l| l != n) {
            return None;
        }
        length = Some(n);
    }
    Some(Framing::Length(length.unwrap_or(0)))
}

fn strip_prefix_ignore_case<'a>(s: &'a str, p: &str) -> Option<&'a str> {
    (s.len() >= p.len() && s.is_char_boundary(p.len()) && s[..p.len()].eq_ignore_ascii_case(p))
        .then(|| &s[p.len()..])
}

/// `host[:port]` of an `http` authority (port 80 when none is given).
fn host_and_port(a: &str) -> Option<(String, u16)> {
    let (h, p) = split_host_port(a)?;
    let port = match p {
        None => 80,
        Some(p) => parse_port(p)?,
    };
    (!h.is_empty()).then(|| (h.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_and_absolute_form_are_understood() {
        assert_eq!(
            parse(b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n"),
            Ok(ProxyRequest::Connect {
                host: "allowed.test".into(),
                port: 443
            })
        );
        let r = parse(b"GET http://Allowed.test:8080/a?b=1 HTTP/1.1\r\nHost: allowed.test:8080\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: x\r\nAccept: */*\r\n\r\n")
            .expect("forward");
        let ProxyRequest::Forward {
            host,
            port,
            upstream_head,
            body,
        } = r
        else {
            panic!("not forward")
        };
        assert_eq!((host.as_str(), port), ("Allowed.test", 8080));
        assert_eq!(body, Framing::Length(0));
        let text = String::from_utf8(upstream_head).expect("utf8");
        assert!(text.starts_with("GET /a?b=1 HTTP/1.1\r\n"), "{text}");
        assert!(!text.to_ascii_lowercase().contains("proxy-"), "{text}");
        assert!(
            text.ends_with("Accept: */*\r\nConnection: close\r\n\r\n"),
            "{text}"
        );
    }

    #[test]
    fn host_header_must_name_the_target() {
        for head in [
            &b"GET http://allowed.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"[..],
            b"GET http://allowed.test/ HTTP/1.1\r\n\r\n",
            b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n",
            b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test:81\r\n\r\n",
        ] {
            assert_eq!(
                parse(head).map_err(|e| e.reason),
                Err(DenyReason::HostMismatch),
                "{head:?}"
            );
        }
        assert!(parse(b"GET http://allowed.test:80/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n").is_ok());
    }

    #[test]
    fn bodies_are_framed_by_chunked_or_one_length() {
        let framing = |extra: &str| match parse(
            format!("POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n{extra}\r\n").as_bytes(),
        ) {
            Ok(ProxyRequest::Forward { body, .. }) => Some(body),
            _ => None,
        };
        assert_eq!(framing(""), Some(Framing::Length(0)));
        assert_eq!(framing("Content-Length: 12\r\n"), Some(Framing::Length(12)));
        assert_eq!(
            framing("Content-Length: 12\r\ncontent-length: 12, 12\r\n"),
            Some(Framing::Length(12))
        );
        assert_eq!(
            framing("Transfer-Encoding: gzip, Chunked\r\n"),
            Some(Framing::Chunked)
        );
    }

    #[test]
    fn other_requests_are_bad() {
        for head in [
            &b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"[..],
            b"GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
            b"GET http://user@allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
            b"CONNECT allowed.test HTTP/1.1\r\n\r\n",
            b"CONNECT allowed.test:0 HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01\x00\x05hello\r\n\r\n",
            // Bodies whose end a server could see elsewhere than the proxy.
            b"POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            b"POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: +5\r\n\r\n",
        ] {
            assert_eq!(
                parse(head).map_err(|e| e.reason),
                Err(DenyReason::BadRequest),
                "{head:?}"
            );
        }
    }
}
