//! The host side: the TLS listener remote agents dial, and admission.
//!
//! [`RemoteHost::expect`] registers one allocation (a kernel generation
//! about to be placed) and issues its credential; the agent the placement
//! starts dials [`RemoteHost::addr`], and its handshake is admitted once:
//!
//! 1. at most [`HostOptions::max_pending`] handshakes at once (64): a
//!    connection past that is closed at once, without TLS;
//! 2. the whole handshake (TLS, `hello`, the verdict) within
//!    [`HostOptions::handshake_timeout`] (30 s), `hello` at most
//!    [`HANDSHAKE_CAP`] (64 KiB);
//! 3. the credential's MAC, then its expiry, then its nonce, burned in the
//!    [`NonceStore`] (durably: the session journal) before anything else:
//!    a second use is `credential_replayed`, whoever presents it;
//! 4. its allocation must still wait for an agent, with the same epoch
//!    (generation): a late agent (the host gave up, or started another
//!    generation) is `unknown_allocation` / `stale_generation`.
//!
//! Every refusal is sent to the agent as a [`Refusal`] with the
//! [`AdmissionError::code`] and counted ([`RemoteHost::refusals`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::credential::Credential;
use crate::tls::HostIdentity;
use crate::wire::{AgentSpec, HANDSHAKE_CAP, Msg, Refusal, read_msg, write_msg};

/// A boxed future of [`NonceStore::burn`].
pub type BurnFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<bool, String>> + Send + 'a>>;

/// Burns credential nonces; the host's record of which were used.
pub trait NonceStore: Send + Sync {
    /// Records `nonce` as used. `Ok(true)`: it was fresh (and is now
    /// burned, durably for a durable store, before the future resolves);
    /// `Ok(false)`: it was used before.
    ///
    /// # Errors
    /// The store failed (the credential is refused then).
    fn burn<'a>(&'a self, nonce: &'a str) -> BurnFuture<'a>;
}

/// A [`NonceStore`] in memory (tests and the bench; the host uses the
/// session journal).
#[derive(Debug, Default)]
pub struct MemoryNonces(Mutex<std::collections::HashSet<String>>);

impl NonceStore for MemoryNonces {
    fn burn<'a>(&'a self, nonce: &'a str) -> BurnFuture<'a> {
        let r = self
            .0
            .lock()
            .map(|mut set| set.insert(nonce.to_string()))
            .map_err(|_| "nonce set poisoned".to_string());
        Box::pin(std::future::ready(r))
    }
}

/// Why an agent was refused at the handshake.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AdmissionError {
    /// `hello` was not a credential.
    #[error("malformed handshake: {0}")]
    Malformed(String),
    /// The MAC does not verify with this host's secret.
    #[error("the credential's MAC does not verify")]
    BadMac,
    /// Past its expiry.
    #[error("the credential expired at {expiry} (now {now})")]
    Expired {
        /// Its expiry (Unix seconds).
        expiry: u64,
        /// The host's clock.
        now: u64,
    },
    /// The nonce was burned before.
    #[error("the credential was used before (nonce {nonce})")]
    Replayed {
        /// The nonce.
        nonce: String,
    },
    /// The nonce could not be burned.
    #[error("cannot record the credential's use: {0}")]
    Store(String),
    /// No kernel waits for this allocation (any more).
    #[error("no kernel waits for allocation {allocation} (the host gave up on it or it was admitted)")]
    UnknownAllocation {
        /// The allocation.
        allocation: String,
    },
    /// The allocation waits for another generation.
    #[error("allocation {allocation} waits for generation {expected}, the credential is for {got}")]
    StaleGeneration {
        /// The allocation.
        allocation: String,
        /// What the host waits for.
        expected: u64,
        /// What the credential names.
        got: u64,
    },
}

impl AdmissionError {
    /// Stable code: `handshake_malformed`, `credential_invalid`,
    /// `credential_expired`, `credential_replayed`, `journal_failed`,
    /// `unknown_allocation`, `stale_generation`.
    pub fn code(&self) -> &'static str {
        match self {
            AdmissionError::Malformed(_) => "handshake_malformed",
            AdmissionError::BadMac => "credential_invalid",
            AdmissionError::Expired { .. } => "credential_expired",
            AdmissionError::Replayed { .. } => "credential_replayed",
            AdmissionError::Store(_) => "journal_failed",
            AdmissionError::UnknownAllocation { .. } => "unknown_allocation",
            AdmissionError::StaleGeneration { .. } => "stale_generation",
        }
    }
}

/// Limits and timings of the listener.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// Address to listen on (default `127.0.0.1:0`).
    pub listen: SocketAddr,
    /// `host:port` written into credentials (default: the bound address).
    pub advertise: Option<String>,
    /// The whole handshake's deadline (30 s).
    pub handshake_timeout: Duration,
    /// Handshakes in progress at once (64).
    pub max_pending: usize,
    /// How long a credential is valid after it is issued, on top of the
    /// placement's queue timeout (10 min).
    pub credential_ttl: Duration,
    /// Heartbeat interval on admitted connections (5 s).
    pub heartbeat: Duration,
    /// An admitted connection silent this long is lost (30 s).
    pub silence: Duration,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise: None,
            handshake_timeout: Duration::from_secs(30),
            max_pending: 64,
            credential_ttl: Duration::from_secs(600),
            heartbeat: Duration::from_secs(5),
            silence: Duration::from_secs(30),
        }
    }
}

/// Refusals [`RemoteHost::refusals`] lists: the latest this many. A
/// listener turning away thousands of connections (agents dialling again,
/// or an attacker) keeps its memory bounded; the counts are kept in full.
pub const REFUSALS_KEPT: usize = 1024;

/// The refusals: the latest codes and a count per code.
#[derive(Debug, Default)]
struct Refusals {
    recent: std::collections::VecDeque<&'static str>,
    counts: HashMap<&'static str, u64>,
}

impl Refusals {
    fn record(&mut self, code: &'static str) {
        if self.recent.len() == REFUSALS_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(code);
        *self.counts.entry(code).or_insert(0) += 1;
    }
}

/// An admitted agent's connection (after the host's `welcome`).
pub type AgentConn = TlsStream<TcpStream>;

struct Waiting {
    epoch: u64,
    spec: AgentSpec,
    tx: oneshot::Sender<AgentConn>,
}

struct Inner {
    addr: SocketAddr,
    advertise: String,
    identity: HostIdentity,
    secret: [u8; 32],
    nonces: Arc<dyn NonceStore>,
    waiting: Mutex<HashMap<String, Waiting>>,
    opts: HostOptions,
    refusals: Mutex<Refusals>,
    admitted: AtomicU64,
    slots: Arc<Semaphore>,
}

/// The listener for remote agents. Cloning gives another handle; the
/// listener stops when the runtime does.
#[derive(Clone)]
pub struct RemoteHost {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RemoteHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteHost")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Raises this process's `RLIMIT_NOFILE` soft limit to its hard limit;
/// returns (soft before, soft after). A listener holds one connection per
/// remote kernel besides its pending handshakes, so a thousand kernels
/// pass the usual soft limit of 1024 (the accept loop would then fail with
/// `EMFILE` and agents would time out). Sandboxed workers get their own
/// limit from the profile (`rlimits.nofile`, 8192).
///
/// # Errors
/// The kernel refused the new limit.
pub fn raise_nofile_limit() -> Result<(u64, u64), String> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    // `None` is unlimited.
    let before = lim.current.unwrap_or(u64::MAX);
    let hard = lim.maximum.unwrap_or(u64::MAX);
    if before >= hard {
        return Ok((before, before));
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        },
    )
    .map_err(|e| format!("cannot raise RLIMIT_NOFILE from {before} to {hard}: {e}"))?;
    Ok((before, hard))
}

impl RemoteHost {
    /// Binds the listener and starts accepting (a task of the current
    /// runtime), first raising the process's descriptor limit
    /// ([`raise_nofile_limit`]). `identity`: the host certificate (see
    /// [`HostIdentity::load_or_create`]); `nonces`: where nonces burn.
    ///
    /// # Errors
    /// The bind's or TLS configuration's error.
    pub async fn start(
        opts: HostOptions,
        identity: HostIdentity,
        nonces: Arc<dyn NonceStore>,
    ) -> Result<RemoteHost, String> {
        match raise_nofile_limit() {
            Ok((before, after)) if after > before => {
                tracing::debug!("RLIMIT_NOFILE raised from {before} to {after} for remote kernels");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("{e}"),
        }
        let listener = TcpListener::bind(opts.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", opts.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let acceptor = TlsAcceptor::from(identity.server_config()?);
        let opts_max_pending = opts.max_pending;
        let inner = Arc::new(Inner {
            addr,
            advertise: opts.advertise.clone().unwrap_or_else(|| addr.to_string()),
            identity,
            secret: crate::random_bytes::<32>(),
            nonces,
            waiting: Mutex::new(HashMap::new()),
            opts,
            refusals: Mutex::new(Refusals::default()),
            admitted: AtomicU64::new(0),
            slots: Arc::new(Semaphore::new(opts_max_pending)),
        });
        let host = RemoteHost { inner };
        tokio::spawn(accept_loop(listener, acceptor, Arc::downgrade(&host.inner)));
        Ok(host)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// The listener's options.
    pub fn options(&self) -> &HostOptions {
        &self.inner.opts
    }

    /// Codes of the latest refusals (at most [`REFUSALS_KEPT`]), oldest
    /// first (the escape suite and tests check them).
    pub fn refusals(&self) -> Vec<&'static str> {
        self.inner
            .refusals
            .lock()
            .map(|r| r.recent.iter().copied().collect())
            .unwrap_or_default()
    }

    /// How many refusals with `code` there were since the start (every
    /// one, also those [`refusals`](RemoteHost::refusals) no longer lists).
    pub fn refusal_count(&self, code: &str) -> u64 {
        self.inner
            .refusals
            .lock()
            .map(|r| r.counts.get(code).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Handshakes in progress now (at most [`HostOptions::max_pending`]).
    pub fn pending(&self) -> usize {
        self.inner.opts.max_pending - self.inner.slots.available_permits()
    }

    /// Agents admitted so far.
    pub fn admitted(&self) -> u64 {
        self.inner.admitted.load(Ordering::Relaxed)
    }

    /// Registers an allocation for `spec` (its generation is the epoch) and
    /// issues its credential, valid for `valid_for` plus the credential TTL.
    pub fn expect(&self, spec: AgentSpec, valid_for: Duration) -> Expected {
        let allocation = hex::encode(crate::random_bytes::<12>());
        let expiry = now_unix() + valid_for.as_secs() + self.inner.opts.credential_ttl.as_secs();
        let credential = Credential::issue(
            &self.inner.secret,
            self.inner.advertise.clone(),
            self.inner.identity.cert_sha256(),
            allocation.clone(),
            spec.generation,
            expiry,
        );
        self.expect_with(spec, credential)
    }

    /// [`expect`](RemoteHost::expect) with a credential signed by this host
    /// but with a chosen expiry (Unix seconds), for tests of expiry.
    pub fn expect_expiring_at(&self, spec: AgentSpec, expiry: u64) -> Expected {
        let allocation = hex::encode(crate::random_bytes::<12>());
        let credential = Credential::issue(
            &self.inner.secret,
            self.inner.advertise.clone(),
            self.inner.identity.cert_sha256(),
            allocation,
            spec.generation,
            expiry,
        );
        self.expect_with(spec, credential)
    }

    fn expect_with(&self, spec: AgentSpec, credential: Credential) -> Expected {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = self.inner.waiting.lock() {
            w.insert(
                credential.allocation.clone(),
                Waiting {
                    epoch: credential.epoch,
                    spec,
                    tx,
                },
            );
        }
        Expected {
            host: self.clone(),
            credential,
            rx: Some(rx),
        }
    }

    fn refused(&self, code: &'static str) {
        if let Ok(mut r) = self.inner.refusals.lock() {
            r.record(code);
        }
    }
}

/// An allocation waiting for its agent. Dropping it withdraws the
/// allocation: its agent, if it dials later, is refused.
pub struct Expected {
    host: RemoteHost,
    credential: Credential,
    rx: Option<oneshot::Receiver<AgentConn>>,
}

impl Expected {
    /// The credential (its file's bytes: [`Credential::to_bytes`]).
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// Waits for the admitted agent at most `timeout`; `None` on timeout.
    pub async fn wait(&mut self, timeout: Duration) -> Option<AgentConn> {
        let rx = self.rx.as_mut()?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(conn)) => {
                self.rx = None;
                Some(conn)
            }
            _ => None,
        }
    }
}

impl Drop for Expected {
    fn drop(&mut self) {
        if let Ok(mut w) = self.host.inner.waiting.lock() {
            w.remove(&self.credential.allocation);
        }
    }
}

async fn accept_loop(listener: TcpListener, acceptor: TlsAcceptor, host: std::sync::Weak<Inner>) {
    let slots = match host.upgrade() {
        Some(h) => h.slots.clone(),
        None => return,
    };
    let mut last_warned: Option<std::time::Instant> = None;
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors or similar: said at most every
                // 10 s (agents keep dialling), tried again shortly.
                if last_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    last_warned = Some(std::time::Instant::now());
                    tracing::warn!(
                        "remote listener cannot accept connections: {e} (RLIMIT_NOFILE too low for this many kernels?)"
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(inner) = host.upgrade() else { return };
        let host = RemoteHost { inner };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Past the bound: closed before any TLS work.
            host.refused("too_many_handshakes");
            tracing::warn!(%peer, "remote agent connection refused: too many pending handshakes");
            drop(tcp);
            continue;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let deadline = host.inner.opts.handshake_timeout;
            // Pinned here so that on a timeout the connection (owned by the
            // handshake) is closed only after the refusal is recorded.
            {
                let hs = handshake(&host, &acceptor, tcp);
                tokio::pin!(hs);
                let outcome = tokio::time::timeout(deadline, &mut hs).await;
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(code)) => {
                        tracing::warn!(%peer, code, "remote agent refused");
                    }
                    Err(_) => {
                        host.refused("handshake_timeout");
                        tracing::warn!(%peer, "remote agent handshake timed out");
                    }
                }
            }
            drop(permit);
        });
    }
}

/// The handshake of one connection; every refusal is recorded (before the
/// agent hears of it) and its code returned.
async fn handshake(host: &RemoteHost, acceptor: &TlsAcceptor, tcp: TcpStream) -> Result<(), &'static str> {
    let _ = tcp.set_nodelay(true);
    let fail = |code: &'static str| {
        host.refused(code);
        code
    };
    // Fallible: a failed handshake hands the socket back, so it is closed
    // only after the refusal is recorded.
    let mut tls = match acceptor.accept(tcp).into_fallible().await {
        Ok(tls) => tls,
        Err((_, tcp)) => {
            let code = fail("tls_failed");
            drop(tcp);
            return Err(code);
        }
    };
    let hello = match read_msg(&mut tls, HANDSHAKE_CAP).await {
        Ok(Some(Msg::Hello(b))) => b,
        Ok(Some(_)) => {
            return Err(refuse(host, &mut tls, AdmissionError::Malformed("expected hello".into())).await);
        }
        Ok(None) => return Err(fail("handshake_malformed")),
        Err(crate::wire::WireError::Oversized { .. }) => {
            return Err(refuse(
                host,
                &mut tls,
                AdmissionError::Malformed("hello exceeds 64 KiB".into()),
            )
            .await);
        }
        Err(e) => return Err(refuse(host, &mut tls, AdmissionError::Malformed(e.to_string())).await),
    };
    match admit(host, &hello).await {
        Ok((spec, tx)) => {
            write_msg(&mut tls, &Msg::Welcome(Box::new(spec)))
                .await
                .map_err(|_| fail("handshake_io"))?;
            host.inner.admitted.fetch_add(1, Ordering::Relaxed);
            // The kernel's start gave up meanwhile: the agent sees EOF.
            let _ = tx.send(tls);
            Ok(())
        }
        Err(e) => Err(refuse(host, &mut tls, e).await),
    }
}

async fn refuse(host: &RemoteHost, tls: &mut AgentConn, e: AdmissionError) -> &'static str {
    let code = e.code();
    host.refused(code);
    let _ = write_msg(
        tls,
        &Msg::Refused(Refusal {
            code: code.into(),
            message: e.to_string(),
        }),
    )
    .await;
    let _ = tokio::io::AsyncWriteExt::shutdown(tls).await;
    code
}

async fn admit(
    host: &RemoteHost,
    hello: &[u8],
) -> Result<(AgentSpec, oneshot::Sender<AgentConn>), AdmissionError> {
    let cred = Credential::from_bytes(hello).map_err(AdmissionError::Malformed)?;
    if !cred.verify(&host.inner.secret) {
        return Err(AdmissionError::BadMac);
    }
    let now = now_unix();
    if cred.expiry <= now {
        return Err(AdmissionError::Expired {
            expiry: cred.expiry,
            now,
        });
    }
    if !host
        .inner
        .nonces
        .burn(&cred.nonce)
        .await
        .map_err(AdmissionError::Store)?
    {
        return Err(AdmissionError::Replayed { nonce: cred.nonce });
    }
    let mut waiting = host
        .inner
        .waiting
        .lock()
        .map_err(|_| AdmissionError::Store("allocation table poisoned".into()))?;
    match waiting.get(&cred.allocation) {
        None => Err(AdmissionError::UnknownAllocation {
            allocation: cred.allocation,
        }),
        Some(w) if w.epoch != cred.epoch => Err(AdmissionError::StaleGeneration {
            allocation: cred.allocation.clone(),
            expected: w.epoch,
            got: cred.epoch,
        }),
        Some(_) => {
            let w = waiting
                .remove(&cred.allocation)
                .ok_or_else(|| AdmissionError::UnknownAllocation {
                    allocation: cred.allocation.clone(),
                })?;
            // The host assigns the generation here: the spec's.
            let mut spec = w.spec;
            spec.generation = w.epoch;
            Ok((spec, w.tx))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_limit_is_raised_to_the_hard_limit() {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let lim = getrlimit(Resource::Nofile);
        let hard = lim.maximum.unwrap_or(u64::MAX);
        // A lower soft limit (still plenty for the other tests meanwhile).
        let low = (lim.current.unwrap_or(u64::MAX).min(hard) / 2).max(256);
        if low < hard {
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(low),
                    maximum: lim.maximum,
                },
            )
            .expect("lower the soft limit");
        }
        let (before, after) = raise_nofile_limit().expect("raise");
        assert_eq!(after, hard);
        assert!(before <= after);
        assert_eq!(getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX), hard);
    }

    #[test]
    fn refusals_keep_the_latest_and_count_every_one() {
        let mut r = Refusals::default();
        for _ in 0..5000 {
            r.record("too_many_handshakes");
        }
        r.record("credential_invalid");
        assert_eq!(r.recent.len(), REFUSALS_KEPT);
        assert_eq!(r.recent.back(), Some(&"credential_invalid"));
        assert_eq!(r.counts.get("too_many_handshakes"), Some(&5000));
        assert_eq!(r.counts.get("credential_invalid"), Some(&1));
    }
}
