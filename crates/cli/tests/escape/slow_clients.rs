//! Item 7: hostile clients of `cellhost serve` that hold connections open
//! without finishing a request (slowloris: partial heads, a head trickled
//! a byte at a time, a body that never completes, silent keep-alive
//! connections) or open more connections than the server serves. Each must
//! be closed or refused while a normal client is still served, and a
//! request in flight (a streaming cell longer than every timeout) must not
//! be cut.
//!
//! The server runs with 1 s timeouts (`CELLHOST_SERVE_*`) so the tests are
//! quick; the tests wait for the server's own close (a read returning 0 or
//! a reset), never for a time.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use crate::http_tenants::{ALICE, Answer, Serve, raw_request, read_answer};

/// Partial heads held open by an attacker.
const PARTIAL: usize = 200;

fn quick_timeouts(max_connections: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CELLHOST_SERVE_HEADER_TIMEOUT_S", "1".into()),
        ("CELLHOST_SERVE_IDLE_TIMEOUT_S", "1".into()),
        ("CELLHOST_SERVE_BODY_TIMEOUT_S", "1".into()),
        ("CELLHOST_SERVE_MAX_CONNECTIONS", max_connections.into()),
    ]
}

fn start(vars: &[(&'static str, String)]) -> Serve {
    let v: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Serve::start(&v)
}

/// Blocks until the server closes `s`: true for EOF or a reset, false if
/// the server answered something instead (or the guard timeout passed).
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// A normal request: the OpenAPI document.
fn healthy(serve: &Serve) -> Answer {
    serve.request("GET", "/openapi.json", &[], "")
}

/// 200 connections that sent half a head, one that trickles its head a
/// byte at a time, one that never finishes its body, and an idle
/// keep-alive one: the server closes each of them, serves a normal client
/// meanwhile, and does not cut a streaming cell that outlives every
/// timeout.
#[test]
fn escape_7_slow_clients_closed_by_the_server_timeouts() {
    let serve = start(&quick_timeouts("1024"));
    let mut partial: Vec<TcpStream> = (0..PARTIAL)
        .map(|_| {
            let mut s = serve.connect();
            s.write_all(b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .expect("half a head");
            s
        })
        .collect();
    // A normal client is served while the partial heads are held.
    let a = healthy(&serve);
    assert_eq!(a.status, 200, "{a:?}");
    for (i, s) in partial.iter_mut().enumerate() {
        assert!(
            closed_by_server(s),
            "partial head {i} was not closed by the server"
        );
    }

    // A head trickled a byte at a time: activity does not extend the
    // header deadline. The attacker paces itself; it stops when the
    // server has closed the connection.
    let mut trickle = serve.connect();
    let head = b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    let mut sent = 0usize;
    let mut closed = false;
    for i in 0..600 {
        let byte = if i < head.len() { head[i] } else { b'a' };
        if trickle.write_all(&[byte]).is_err() {
            closed = true;
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(100));
        trickle.set_nonblocking(true).expect("nonblocking");
        let mut b = [0u8; 64];
        let r = trickle.read(&mut b);
        trickle.set_nonblocking(false).expect("blocking");
        match r {
            Ok(0) => {
                closed = true;
                break;
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                closed = true;
                break;
            }
            Ok(n) => panic!("the server answered a head it never got: {:?}", &b[..n]),
            Err(_) => {}
        }
    }
    assert!(closed, "a trickled head was held open ({sent} bytes sent)");

    // A body that never completes: answered 400 (or closed), not held.
    let mut body = serve.connect();
    let auth = format!("Bearer {ALICE}");
    let req = format!(
        "POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"name\": "
    );
    body.write_all(req.as_bytes()).expect("head and part of a body");
    // An answer must be a refusal; no answer (closed) is refused as well.
    if let Some(a) = read_answer(&mut body) {
        assert!(a.status == 400 || a.status == 408, "{a:?}");
    }
    assert!(
        closed_by_server(&mut body),
        "an incomplete body held its connection"
    );

    // An idle keep-alive connection is closed after its request.
    let mut idle = serve.connect();
    idle.write_all(raw_request("GET", "/openapi.json", &[], "", false).as_bytes())
        .expect("request");
    let a = read_answer(&mut idle).expect("answer");
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        closed_by_server(&mut idle),
        "an idle keep-alive connection was held"
    );

    // A request in flight is not idle: a streaming cell that outlives the
    // header, idle and body timeouts delivers all of its output.
    let created = serve.request(
        "POST",
        "/v1/sessions",
        &[("Authorization", &auth), ("Content-Type", "application/json")],
        &json!({"name": "s"}).to_string(),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let code = "import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')";
    let run = serve.request(
        "POST",
        "/v1/sessions/s/execute?stream=true",
        &[("Authorization", &auth), ("Content-Type", "application/json")],
        &json!({"code": code}).to_string(),
    );
    assert_eq!(run.status, 200, "{run:?}");
    let result = run
        .body
        .split("event: result")
        .nth(1)
        .unwrap_or_else(|| panic!("no result event: {run:?}"));
    assert!(
        result.contains("first\\nsecond\\n") && result.contains("\"status\":\"ok\""),
        "{result}"
    );
    let a = healthy(&serve);
    assert_eq!(a.status, 200, "{a:?}");
}

/// More connections than `serve_max_connections`: the excess is answered
/// 503 (or closed) at once, a connection already served keeps being
/// served, and a normal client is served again once slots free.
#[test]
fn escape_7_connections_over_the_cap_refused() {
    const CAP: usize = 20;
    let mut vars = quick_timeouts(&CAP.to_string());
    // Connections must outlive the test's steps here.
    vars[0].1 = "120".into();
    vars[1].1 = "120".into();
    let serve = start(&vars);
    // One keep-alive client that has been served, then the rest of the
    // slots taken by connections that send nothing.
    let mut served = serve.connect();
    served
        .write_all(raw_request("GET", "/openapi.json", &[], "", false).as_bytes())
        .expect("request");
    assert_eq!(read_answer(&mut served).expect("answer").status, 200);
    let mut holders: Vec<TcpStream> = (1..CAP).map(|_| serve.connect()).collect();

    // Connections are accepted in the order they were made, so every one
    // after the holders finds the server full.
    for i in 0..CAP {
        let mut extra = serve.connect();
        let _ = extra.write_all(raw_request("GET", "/openapi.json", &[], "", true).as_bytes());
        // A 503, or closed (reset) at accept: refused either way.
        if let Some(a) = read_answer(&mut extra) {
            assert_eq!(a.status, 503, "extra connection {i}: {a:?}");
        }
    }
    // The connection that holds a slot is still served while full.
    served
        .write_all(raw_request("GET", "/openapi.json", &[], "", false).as_bytes())
        .expect("request while full");
    assert_eq!(read_answer(&mut served).expect("answer while full").status, 200);

    // Holders leave; the server sees them go (its close is the event) and
    // a normal client is served again. The retry loop only bridges the
    // instant between a closed socket and its freed slot.
    for h in holders.iter_mut().take(5) {
        h.shutdown(std::net::Shutdown::Write).expect("shutdown");
        assert!(closed_by_server(h));
    }
    let mut answer = None;
    for _ in 0..200 {
        let mut s = serve.connect();
        let _ = s.write_all(raw_request("GET", "/openapi.json", &[], "", true).as_bytes());
        match read_answer(&mut s) {
            Some(a) if a.status == 200 => {
                answer = Some(a);
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    assert!(answer.is_some(), "no slot freed after holders left");
    drop(holders);
}
