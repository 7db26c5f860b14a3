//! The host-side proxy of one kernel: accepts on the listener inside the
//! kernel's network namespace, admits what the rules admit, refuses and
//! records the rest.
//!
//! Per connection: the request head arrives within
//! [`Limits::head_timeout`] and [`Limits::max_head_bytes`]; its target is
//! classified ([`crate::policy::parse_target`]) and checked against the
//! rules; the proxy resolves the name itself ([`crate::Resolver`]) and
//! connects to the addresses it found (never resolving twice). A `CONNECT`
//! is answered `200` and its ClientHello read before anything goes
//! upstream: its server name must be the `CONNECT` host (an IP-literal
//! `CONNECT` must carry none). A plain request goes
//! upstream in origin form with `Connection: close`, and only it: its body
//! is passed to its end ([`crate::body`]) and nothing after it (a second
//! request on the connection, whose `Host` the proxy never checked, is
//! dropped). Then bytes flow both ways until either side closes or
//! [`Limits::idle_timeout`] passes without a byte.
//! Refusals are answered `403` (`431` for a head too large, `503` over the
//! connection cap) with the reason in `X-Cellhost-Denied`, and recorded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::Egress;
use crate::body::{BodyEnd, Framing};
use crate::denial::{Denial, DenyReason, shown_host};
use crate::head::{ProxyRequest, head_end};
use crate::policy::{HostError, Target, parse_target};
use crate::sni::{self, Hello};

/// Serves `listener` until the future is dropped (which ends every
/// connection it serves: they live in its task set).
pub async fn serve(listener: TcpListener, egress: Arc<Egress>) {
    let slots = Arc::new(Semaphore::new(egress.limits.max_connections.max(1)));
    let mut conns: JoinSet<()> = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((sock, _)) => {
                    let egress = egress.clone();
                    match slots.clone().try_acquire_owned() {
                        Ok(permit) => {
                            conns.spawn(async move {
                                handle(sock, &egress).await;
                                drop(permit);
                            });
                        }
                        Err(_) => {
                            egress.log.push(Denial {
                                host: String::new(),
                                port: 0,
                                reason: DenyReason::ConnectionCap,
                                sni: None,
                            });
                            conns.spawn(async move {
                                let mut sock = sock;
                                let _ = tokio::time::timeout(
                                    Duration::from_secs(1),
                                    answer(&mut sock, 503, "Service Unavailable", DenyReason::ConnectionCap),
                                )
                                .await;
                            });
                        }
                    }
                }
                // Out of descriptors, or the peer reset before accept:
                // give the host a moment rather than spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Writes a short response naming the reason, and shuts the socket down.
async fn answer(sock: &mut TcpStream, status: u16, text: &str, reason: DenyReason) {
    let body = format!("cellhost egress: {}\n", reason.code());
    let msg = format!(
        "HTTP/1.1 {status} {text}\r\nX-Cellhost-Denied: {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        reason.code(),
        body.len()
    );
    let _ = sock.write_all(msg.as_bytes()).await;
    let _ = sock.shutdown().await;
}

async fn deny(
    sock: &mut TcpStream,
    egress: &Egress,
    host: &str,
    port: u16,
    reason: DenyReason,
    sni: Option<String>,
) {
    egress.log.push(Denial {
        host: shown_host(host),
        port,
        reason,
        sni,
    });
    let (status, text) = match reason {
        DenyReason::HeadTooLarge => (431, "Request Header Fields Too Large"),
        DenyReason::BadRequest => (400, "Bad Request"),
        _ => (403, "Forbidden"),
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer(sock, status, text, reason)).await;
}

/// Reads until `buf` holds a complete head; `Err` with the reason when it
/// does not come in time or in size. Returns the head's length.
async fn read_head(
    sock: &mut TcpStream,
    buf: &mut Vec<u8>,
    egress: &Egress,
) -> Result<usize, Option<DenyReason>> {
    let max = egress.limits.max_head_bytes;
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = head_end(buf) {
                return Ok(end);
            }
            if buf.len() > max {
                return Err(Some(DenyReason::HeadTooLarge));
            }
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return Err(None),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    match tokio::time::timeout(egress.limits.head_timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(None),
    }
}

async fn handle(mut sock: TcpStream, egress: &Egress) {
    let mut buf = Vec::new();
    let end = match read_head(&mut sock, &mut buf, egress).await {
        Ok(end) if end <= egress.limits.max_head_bytes => end,
        Ok(_) | Err(Some(_)) => {
            return deny(&mut sock, egress, "", 0, DenyReason::HeadTooLarge, None).await;
        }
        Err(None) => return,
    };
    let request = match crate::head::parse(&buf[..end]) {
        Ok(r) => r,
        Err(r) => return deny(&mut sock, egress, &r.host, r.port, r.reason, None).await,
    };
    let rest = buf.split_off(end);
    match request {
        ProxyRequest::Connect { host, port } => connect(sock, egress, &host, port, rest).await,
        ProxyRequest::Forward {
            host,
            port,
            upstream_head,
            body,
        } => forward(sock, egress, &host, port, upstream_head, body, rest).await,
    }
}

/// The addresses `host:port` may be reached at, or why not.
pub async fn admit(egress: &Egress, host: &str, port: u16) -> Result<(Target, Vec<SocketAddr>), DenyReason> {
    let target = parse_target(host).map_err(|e| match e {
        HostError::NumericForm | HostError::Malformed => DenyReason::BadHost,
    })?;
    if !egress.rules.iter().any(|r| r.admits(&target, port)) {
        return Err(match target {
            Target::Ip(_) => DenyReason::IpLiteral,
            Target::Name(_) => DenyReason::NotAllowed,
        });
    }
    let addrs = match &target {
        // Named by an IP rule: the operator's word, any address.
        Target::Ip(a) => vec![SocketAddr::new(*a, port)],
        Target::Name(n) => egress.resolver.resolve(n, port).await?,
    };
    Ok((target, addrs))
}

async fn dial(addrs: &[SocketAddr], egress: &Egress) -> Option<TcpStream> {
    for a in addrs {
        if let Ok(Ok(s)) = tokio::time::timeout(egress.limits.connect_timeout, TcpStream::connect(a)).await {
            let _ = s.set_nodelay(true);
            return Some(s);
        }
    }
    None
}

async fn bad_gateway(sock: &mut TcpStream) {
    let msg = "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: 37\r\nConnection: close\r\n\r\ncellhost egress: cannot reach target\n";
    let _ = tokio::time::timeout(Duration::from_secs(1), sock.write_all(msg.as_bytes())).await;
    let _ = sock.shutdown().await;
}

async fn connect(mut sock: TcpStream, egress: &Egress, host: &str, port: u16, mut hello: Vec<u8>) {
    let (target, addrs) = match admit(egress, host, port).await {
        Ok(t) => t,
        Err(reason) => return deny(&mut sock, egress, host, port, reason, None).await,
    };
    if sock
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    // The ClientHello, before anything goes upstream.
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            match sni::parse(&hello) {
                Hello::Incomplete => {}
                done => return Some(done),
            }
            if hello.len() > sni::MAX_HELLO + 1024 {
                return Some(Hello::NotTls);
            }
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => hello.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let Ok(Some(parsed)) = tokio::time::timeout(egress.limits.head_timeout, read).await else {
        return;
    };
    let refusal = match (&parsed, &target) {
        (Hello::NotTls | Hello::Incomplete, _) => Some((DenyReason::NotTls, None)),
        (Hello::ServerName(None), Target::Name(_)) => Some((DenyReason::NoSni, None)),
        (Hello::ServerName(Some(s)), Target::Name(n)) if s.strip_suffix('.').unwrap_or(s) != n => {
            Some((DenyReason::SniMismatch, Some(shown_host(s))))
        }
        (Hello::ServerName(Some(s)), Target::Ip(_)) => Some((DenyReason::SniMismatch, Some(shown_host(s)))),
        _ => None,
    };
    if let Some((reason, sni)) = refusal {
        egress.log.push(Denial {
            host: shown_host(host),
            port,
            reason,
            sni,
        });
        // The tunnel is open: the client learns of the refusal as a
        // closed connection (its TLS library's error).
        let _ = sock.shutdown().await;
        return;
    }
    let Some(mut up) = dial(&addrs, egress).await else {
        let _ = sock.shutdown().await;
        return;
    };
    if up.write_all(&hello).await.is_err() {
        return;
    }
    splice(sock, up, None, egress.limits.idle_timeout).await;
}

async fn forward(
    mut sock: TcpStream,
    egress: &Egress,
    host: &str,
    port: u16,
    head: Vec<u8>,
    body: Framing,
    mut rest: Vec<u8>,
) {
    let addrs = match admit(egress, host, port).await {
        Ok((_, a)) => a,
        Err(reason) => return deny(&mut sock, egress, host, port, reason, None).await,
    };
    // Only this request's body goes upstream, never what follows it.
    let mut end = BodyEnd::new(body);
    match end.feed(&rest) {
        Ok(n) => rest.truncate(n),
        Err(_) => return deny(&mut sock, egress, host, port, DenyReason::BadRequest, None).await,
    }
    let Some(mut up) = dial(&addrs, egress).await else {
        return bad_gateway(&mut sock).await;
    };
    if up.write_all(&head).await.is_err() || up.write_all(&rest).await.is_err() {
        return bad_gateway(&mut sock).await;
    }
    splice(sock, up, Some(end), egress.limits.idle_timeout).await;
}

/// Copies both ways until both sides have closed, or `idle` passes with
/// no byte in either direction. With `body`, only the bytes of that body
/// go from `a` to `b` (the rest is read and dropped); a malformed body
/// ends both.
async fn splice(mut a: TcpStream, mut b: TcpStream, mut body: Option<BodyEnd>, idle: Duration) {
    let (mut ar, mut aw) = a.split();
    let (mut br, mut bw) = b.split();
    let mut abuf = vec![0u8; 16 * 1024];
    let mut bbuf = vec![0u8; 16 * 1024];
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        tokio::select! {
            r = ar.read(&mut abuf), if a_open => match r {
                Ok(0) | Err(_) => {
                    a_open = false;
                    let _ = bw.shutdown().await;
                }
                Ok(n) => {
                    let pass = match body.as_mut().map(|end| end.feed(&abuf[..n])) {
                        None => n,
                        Some(Ok(k)) => k,
                        Some(Err(_)) => return,
                    };
                    if pass > 0
                        && !matches!(tokio::time::timeout(idle, bw.write_all(&abuf[..pass])).await, Ok(Ok(())))
                    {
                        return;
                    }
                }
            },
            r = br.read(&mut bbuf), if b_open => match r {
                Ok(0) | Err(_) => {
                    b_open = false;
                    let _ = aw.shutdown().await;
                }
                Ok(n) => {
                    if !matches!(tokio::time::timeout(idle, aw.write_all(&bbuf[..n])).await, Ok(Ok(()))) {
                        return;
                    }
                }
            },
            _ = tokio::time::sleep(idle) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, NetworkPolicy, Resolver};

    async fn proxy(rules: &str) -> (SocketAddr, Arc<Egress>, tokio::task::JoinHandle<()>) {
        let mut resolver = Resolver::default();
        resolver
            .hosts
            .insert("allowed.test".into(), vec!["127.0.0.1".parse().expect("ip")]);
        let policy = NetworkPolicy::parse(rules).expect("policy");
        let limits = Limits {
            max_connections: 2,
            ..Limits::default()
        };
        let egress = Egress::for_policy(&policy, resolver, limits).expect("egress");
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let task = tokio::spawn(serve(l, egress.clone()));
        (addr, egress, task)
    }

    async fn upstream() -> (u16, tokio::task::JoinHandle<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = l.local_addr().expect("addr").port();
        let t = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.expect("accept");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while head_end(&got).is_none() {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
            let _ = s.shutdown().await;
            got
        });
        (port, t)
    }

    /// An upstream that reads everything the proxy sends until the proxy
    /// closes its side, then answers once.
    async fn upstream_to_eof() -> (u16, tokio::task::JoinHandle<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = l.local_addr().expect("addr").port();
        let t = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.expect("accept");
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
            let _ = s.shutdown().await;
            got
        });
        (port, t)
    }

    #[tokio::test]
    async fn only_the_first_request_and_its_body_go_upstream() {
        for (body_head, body) in [
            ("Content-Length: 5\r\n", "hello"),
            (
                "Transfer-Encoding: chunked\r\n",
                "5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
            ),
            ("", ""),
        ] {
            let (up, seen) = upstream_to_eof().await;
            let (addr, _egress, task) = proxy(&format!("allowed.test:{up}")).await;
            let first = format!(
                "POST http://allowed.test:{up}/a HTTP/1.1\r\nHost: allowed.test:{up}\r\n{body_head}\r\n{body}"
            );
            // A second request on the same connection, for another host.
            let second = "GET /secret HTTP/1.1\r\nHost: evil.test\r\n\r\n";
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(first.as_bytes()).await.expect("first");
            s.write_all(second.as_bytes()).await.expect("second");
            s.shutdown().await.expect("half-close");
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            assert!(out.ends_with(b"ok"), "{}", String::from_utf8_lossy(&out));
            let seen = String::from_utf8(seen.await.expect("upstream")).expect("utf8");
            assert!(seen.ends_with(&format!("\r\n\r\n{body}")), "{seen}");
            assert!(!seen.contains("evil.test") && !seen.contains("/secret"), "{seen}");
            task.abort();
        }
    }

    async fn exchange(proxy: SocketAddr, bytes: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(proxy).await.expect("connect");
        s.write_all(bytes).await.expect("write");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        out
    }

    #[tokio::test]
    async fn plain_http_to_an_allowed_pinned_host_is_forwarded_in_origin_form() {
        let (up, seen) = upstream().await;
        let (addr, egress, task) = proxy(&format!("allowed.test:{up}")).await;
        let req = format!(
            "GET http://allowed.test:{up}/x HTTP/1.1\r\nHost: allowed.test:{up}\r\nProxy-Connection: keep-alive\r\n\r\n"
        );
        let out = exchange(addr, req.as_bytes()).await;
        assert!(out.ends_with(b"ok"), "{}", String::from_utf8_lossy(&out));
        let seen = String::from_utf8(seen.await.expect("upstream")).expect("utf8");
        assert!(seen.starts_with("GET /x HTTP/1.1\r\n"), "{seen}");
        assert!(seen.contains("Connection: close"), "{seen}");
        assert!(egress.log.take().is_none());
        task.abort();
    }

    #[tokio::test]
    async fn refusals_are_answered_and_recorded() {
        let (addr, egress, task) = proxy("allowed.test:443,localhost:80").await;
        let cases: Vec<(String, DenyReason)> = vec![
            (
                "CONNECT evil.test:443 HTTP/1.1\r\n\r\n".into(),
                DenyReason::NotAllowed,
            ),
            (
                "CONNECT allowed.test:444 HTTP/1.1\r\n\r\n".into(),
                DenyReason::NotAllowed,
            ),
            (
                "CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n".into(),
                DenyReason::IpLiteral,
            ),
            ("CONNECT 127.1:443 HTTP/1.1\r\n\r\n".into(), DenyReason::BadHost),
            (
                "GET http://localhost/ HTTP/1.1\r\nHost: localhost\r\n\r\n".into(),
                DenyReason::PrivateAddress,
            ),
            (
                "GET http://allowed.test:443/ HTTP/1.1\r\nHost: evil.test\r\n\r\n".into(),
                DenyReason::HostMismatch,
            ),
            (
                "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n".into(),
                DenyReason::BadRequest,
            ),
            (
                format!(
                    "GET http://allowed.test/ HTTP/1.1\r\nX: {}\r\n\r\n",
                    "a".repeat(20_000)
                ),
                DenyReason::HeadTooLarge,
            ),
        ];
        for (req, reason) in &cases {
            let out = exchange(addr, req.as_bytes()).await;
            let text = String::from_utf8_lossy(&out);
            assert!(
                text.contains(&format!("X-Cellhost-Denied: {}", reason.code())),
                "{req:.80}: {text}"
            );
        }
        let got: Vec<DenyReason> = egress
            .log
            .take()
            .expect("denials")
            .denied
            .iter()
            .map(|d| d.reason)
            .collect();
        assert_eq!(got, cases.iter().map(|c| c.1).collect::<Vec<_>>());
        task.abort();
    }

    #[tokio::test]
    async fn connect_checks_the_client_hello_before_going_upstream() {
        let (addr, egress, task) = proxy("allowed.test:443").await;
        for (hello, reason) in [
            (
                crate::sni::tests_hello(Some("evil.test")),
                DenyReason::SniMismatch,
            ),
            (crate::sni::tests_hello(None), DenyReason::NoSni),
            (b"SSH-2.0-x\r\n".to_vec(), DenyReason::NotTls),
        ] {
            let mut req = b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n".to_vec();
            req.extend(hello);
            let out = exchange(addr, &req).await;
            assert_eq!(out, b"HTTP/1.1 200 Connection established\r\n\r\n");
            let d = egress.log.take().expect("denial");
            assert_eq!(d.denied[0].reason, reason);
        }
        task.abort();
    }
}
