//! The HTTP server's connections: HTTP/1.1 served with hyper directly, so
//! that a slow or silent client cannot hold a connection or a request open.
//!
//! Per connection, one task serves the requests and watches the clock
//! ([`ServeLimits`]):
//!
//! - the *head* of a request (request line and headers) must arrive within
//!   [`ServeLimits::header_timeout`]: from accept for the first request,
//!   from the first byte of the head for later ones (slowloris);
//! - a keep-alive connection with no request in flight is closed after
//!   [`ServeLimits::idle_timeout`] without a new request, and so is one
//!   whose client has not read any of its response for that long (its
//!   writes blocked: a slow reader);
//! - a request's body must be complete [`ServeLimits::body_timeout`] after
//!   its head (the handler reading it then sees an error and answers 400);
//! - at most [`ServeLimits::max_connections`] connections are served at
//!   once; one more is answered `503` and closed at accept, so it costs
//!   neither a task nor a slot, and served connections are not starved.
//!
//! A request in flight is never cut by these timers: a long cell, a
//! server-sent event stream or an MCP stream lives as long as its
//! response does.

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

/// Limits on the HTTP server's connections (`cellhost serve`; config keys
/// `serve_header_timeout_s`, `serve_idle_timeout_s`, `serve_body_timeout_s`,
/// `serve_max_connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Longest time a request's head may take to arrive: from accept for a
    /// connection's first request, from the head's first byte for later
    /// ones. The connection is closed when it is exceeded.
    pub header_timeout: Duration,
    /// Longest time a keep-alive connection may wait, with no request in
    /// flight, for the first byte of its next request; also the longest
    /// time a response may stay unread (the socket refusing every write)
    /// before the connection is closed.
    pub idle_timeout: Duration,
    /// Longest time a request's body may take to arrive after its head.
    pub body_timeout: Duration,
    /// Connections served at once (at least 1); beyond, a new connection is
    /// answered `503 Service Unavailable` and closed.
    pub max_connections: usize,
}

impl ServeLimits {
    /// Largest accepted [`ServeLimits::max_connections`].
    pub const MAX_CONNECTIONS: usize = 1 << 20;
}

impl Default for ServeLimits {
    /// 10 s for a head, 60 s idle, 30 s for a body, 1024 connections.
    fn default() -> Self {
        ServeLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
        }
    }
}

/// What a connection is doing, for its deadline.
struct Phase {
    /// Requests whose response has not been sent (or dropped) yet.
    in_flight: usize,
    /// When the connection last became idle (accept, or a response ended).
    idle_since: Instant,
    /// When the head now being read began (accept for the first request).
    head_since: Option<Instant>,
    /// Since when the socket has refused bytes of a response (the client
    /// does not read); `None` while writes progress.
    write_blocked_since: Option<Instant>,
}

struct ConnState {
    phase: Mutex<Phase>,
    changed: Notify,
}

impl ConnState {
    fn new() -> Arc<ConnState> {
        let now = Instant::now();
        Arc::new(ConnState {
            phase: Mutex::new(Phase {
                in_flight: 0,
                idle_since: now,
                head_since: Some(now),
                write_blocked_since: None,
            }),
            changed: Notify::new(),
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut Phase) -> R) -> R {
        let mut p = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut p)
    }

    /// When the connection must be closed (`None`: a request is in flight).
    fn deadline(&self, limits: &ServeLimits) -> Option<Instant> {
        self.with(|p| {
            // A client that stops reading a response is as idle as one
            // that sends nothing, even with the request in flight.
            let stalled = p.write_blocked_since.map(|t| t + limits.idle_timeout);
            if p.in_flight > 0 {
                return stalled;
            }
            let waiting = match p.head_since {
                Some(t) => t + limits.header_timeout,
                None => p.idle_since + limits.idle_timeout,
            };
            Some(stalled.map_or(waiting, |s| s.min(waiting)))
        })
    }

    /// Bytes arrived: with no request in flight they start a head.
    fn on_read(&self) {
        let started = self.with(|p| {
            if p.in_flight == 0 && p.head_since.is_none() {
                p.head_since = Some(Instant::now());
                true
            } else {
                false
            }
        });
        if started {
            self.changed.notify_one();
        }
    }

    /// A write was refused (`blocked`) or went through.
    fn on_write(&self, blocked: bool) {
        let started = self.with(|p| match (blocked, p.write_blocked_since) {
            (true, None) => {
                p.write_blocked_since = Some(Instant::now());
                true
            }
            (false, Some(_)) => {
                p.write_blocked_since = None;
                false
            }
            _ => false,
        });
        if started {
            self.changed.notify_one();
        }
    }

    fn request_started(self: &Arc<Self>) -> InFlight {
        self.with(|p| {
            p.in_flight += 1;
            p.head_since = None;
        });
        self.changed.notify_one();
        InFlight(self.clone())
    }
}

/// One request in flight; dropped when its response is done.
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.with(|p| {
            p.in_flight = p.in_flight.saturating_sub(1);
            if p.in_flight == 0 {
                p.idle_since = Instant::now();
            }
        });
        self.0.changed.notify_one();
    }
}

/// The socket, telling the connection's state when bytes arrive.
struct Watched {
    stream: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.on_read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.state.on_write(r.is_pending());
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.state.on_write(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    /// The connection failed while the body was read.
    #[error("reading the request body: {0}")]
    Read(#[from] hyper::Error),
    /// The body was not complete in time.
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
}

/// A request body that fails once its deadline has passed.
struct TimedBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(f) => Poll::Ready(f.map(|r| r.map_err(BodyError::from))),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyError::TimedOut(this.limit)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that ends its request's [`InFlight`] when dropped (hyper
/// drops it once the last byte is written, or when the connection ends).
struct Tracked {
    inner: axum::body::Body,
    _in_flight: InFlight,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The body of the answer to a connection over
/// [`ServeLimits::max_connections`].
const BUSY: &str = "too many connections; try again later\n";

/// Serves `app` on `listener` within `limits` until `shutdown` resolves;
/// then stops accepting, lets in-flight requests finish and returns once
/// every connection has closed.
///
/// # Errors
/// None today (accept errors such as `EMFILE` are logged and retried); the
/// `Result` leaves room for listener errors.
pub async fn serve_with_limits(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let max = limits.max_connections.clamp(1, ServeLimits::MAX_CONNECTIONS);
    let slots = Arc::new(Semaphore::new(max));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of descriptors or a connection reset before accept:
                // keep serving the connections there are.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse_busy(stream);
            continue;
        };
        let app = app.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            serve_connection(stream, app, limits, stop).await;
            drop(slot);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every slot back = every connection closed.
    let _ = slots.acquire_many(max as u32).await;
    Ok(())
}

/// Answers 503 without waiting and closes (the socket's send buffer is
/// empty, so the short write does not block).
fn refuse_busy(stream: TcpStream) {
    match stream.into_std() {
        Ok(mut s) => {
            let answer = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\nretry-after: 1\r\ncontent-length: {}\r\n\r\n{BUSY}",
                BUSY.len()
            );
            let _ = s.write(answer.as_bytes());
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        Err(e) => tracing::debug!("refusing a connection: {e}"),
    }
}

async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: ServeLimits,
    mut stop: watch::Receiver<bool>,
) {
    let state = ConnState::new();
    let io = TokioIo::new(Watched {
        stream,
        state: state.clone(),
    });
    let svc_state = state.clone();
    let tower = TowerToHyperService::new(app);
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let in_flight = svc_state.request_started();
        let req = req.map(|inner| {
            axum::body::Body::new(TimedBody {
                inner,
                deadline: Box::pin(tokio::time::sleep(limits.body_timeout)),
                limit: limits.body_timeout,
            })
        });
        let fut = hyper::service::Service::call(&tower, req);
        async move {
            let resp = fut.await?;
            Ok::<_, std::convert::Infallible>(resp.map(|inner| Tracked {
                inner,
                _in_flight: in_flight,
            }))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, svc);
    tokio::pin!(conn);
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        let deadline = state.deadline(&limits);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("HTTP connection ended: {e}");
                }
                return;
            }
            () = sleep_until(deadline) => {
                if state.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    // Dropping the connection closes the socket.
                    return;
                }
            }
            () = state.changed.notified() => {}
            r = stop.changed(), if !stopping => {
                let _ = r;
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ServeLimits {
        ServeLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            max_connections: 4,
        }
    }

    #[test]
    fn deadlines_follow_the_connection_phase() {
        let l = limits();
        let s = ConnState::new();
        let (accepted, idle_since) = s.with(|p| (p.head_since, p.idle_since));
        let accepted = accepted.expect("a new connection waits for its first head");
        // The first head is due a header timeout after accept.
        assert_eq!(s.deadline(&l), Some(accepted + l.header_timeout));
        // A request in flight has no deadline...
        let req = s.request_started();
        assert_eq!(s.deadline(&l), None);
        // ...unless the client stops reading its response.
        s.on_write(true);
        let blocked = s.with(|p| p.write_blocked_since).expect("blocked");
        assert_eq!(s.deadline(&l), Some(blocked + l.idle_timeout));
        s.on_write(false);
        assert_eq!(s.deadline(&l), None);
        // Done: idle, due an idle timeout after the response.
        drop(req);
        let idle = s.with(|p| p.idle_since);
        assert!(idle >= idle_since);
        assert_eq!(s.deadline(&l), Some(idle + l.idle_timeout));
        // The next head's first byte starts a header timeout.
        s.on_read();
        let head = s.with(|p| p.head_since).expect("a head began");
        assert_eq!(s.deadline(&l), Some(head + l.header_timeout));
        // Bytes of a body (request in flight) start no head.
        let _req = s.request_started();
        s.on_read();
        assert_eq!(s.with(|p| p.head_since), None);
    }
}
