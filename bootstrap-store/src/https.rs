//! The served-once HTTPS store: an HTTPS server in the controller's process that serves
//! each machine's document once, at an unguessable URL, to that machine only.
//!
//! See [`HttpsStore`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use machine_core::bootstrap_data::{BootstrapDataStore, HttpsLocation, Location, StoredDocument};
use machine_core::{Error, MachineName, Result};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::network::Network;

/// How an [`HttpsStore`] serves. `#[non_exhaustive]`: start from
/// [`HttpsStoreConfig::new`] and adjust with the `with_*` methods.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpsStoreConfig {
    /// The address to listen on (port 0: a free port). Bind it to the address the
    /// machines reach, not to every address of the host.
    pub listen: SocketAddr,
    /// The host (and port) in URLs, when it is not the listen address: a name or an
    /// address the machines reach the server by (behind NAT, say). The certificate
    /// names it.
    pub advertise: Option<String>,
    /// The networks clients may connect from; every other client is disconnected before
    /// TLS. Must not be empty.
    pub allowed: Vec<Network>,
    /// Whether a document is served only to the addresses its machine was seen with
    /// (default true). Turn it off only where the store cannot see the machine's own
    /// address (a proxy or NAT in between).
    pub bind_to_machines: bool,
    /// The owner whose documents these are (for the record; the store is per owner).
    pub owner: String,
    /// How long a document waits to be fetched before it is withdrawn by itself, and
    /// how long a served or withdrawn one still answers 410 (default 1 hour).
    pub ttl: Duration,
    /// The largest document (default 1 MiB).
    pub max_document_bytes: usize,
    /// The most documents held at once (default 100,000).
    pub max_documents: usize,
    /// The most connections at once (default 512), and from one client (default 8).
    pub max_connections: usize,
    /// The most connections at once from one client address (default 8).
    pub max_connections_per_client: usize,
    /// Requests a second from one client address (default 5, in bursts of 20).
    pub requests_per_second: u32,
    /// Misses (a wrong token) a minute from one client address before it is throttled
    /// (default 6, in bursts of 10).
    pub misses_per_minute: u32,
    /// How long a client has to finish the TLS handshake (default 10 s).
    pub handshake_timeout: Duration,
    /// How long a client has to send its request headers (default 10 s).
    pub header_timeout: Duration,
    /// How long a connection may last in all (default 60 s).
    pub connection_timeout: Duration,
    /// How long the server's certificate is valid (default 30 days).
    pub certificate_validity: Duration,
}

impl HttpsStoreConfig {
    /// A store listening on `listen`, with the defaults and no allowed network yet
    /// (add them with [`HttpsStoreConfig::allow`]).
    pub fn new(listen: SocketAddr) -> Self {
        HttpsStoreConfig {
            listen,
            advertise: None,
            allowed: Vec::new(),
            bind_to_machines: true,
            owner: machine_core::DEFAULT_OWNER.to_owned(),
            ttl: Duration::from_secs(3600),
            max_document_bytes: 1024 * 1024,
            max_documents: 100_000,
            max_connections: 512,
            max_connections_per_client: 8,
            requests_per_second: 5,
            misses_per_minute: 6,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            connection_timeout: Duration::from_secs(60),
            certificate_validity: Duration::from_secs(30 * 24 * 3600),
        }
    }

    /// Lets clients in `network` connect.
    pub fn allow(mut self, network: Network) -> Self {
        self.allowed.push(network);
        self
    }

    /// Sets the host (and port) URLs name.
    pub fn with_advertise(mut self, host: impl Into<String>) -> Self {
        self.advertise = Some(host.into());
        self
    }

    /// Sets whether documents are served only to their machine's addresses.
    pub fn with_bind_to_machines(mut self, yes: bool) -> Self {
        self.bind_to_machines = yes;
        self
    }

    /// Sets the owner.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Sets how long documents wait to be fetched.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the largest document.
    pub fn with_max_document_bytes(mut self, max: usize) -> Self {
        self.max_document_bytes = max;
        self
    }

    /// Sets the connection limits, overall and per client address.
    pub fn with_connections(mut self, max: usize, per_client: usize) -> Self {
        self.max_connections = max;
        self.max_connections_per_client = per_client;
        self
    }

    /// Sets the request rate and the miss rate per client address.
    pub fn with_rates(mut self, requests_per_second: u32, misses_per_minute: u32) -> Self {
        self.requests_per_second = requests_per_second;
        self.misses_per_minute = misses_per_minute;
        self
    }

    /// Sets the handshake, header and connection deadlines.
    pub fn with_timeouts(
        mut self,
        handshake: Duration,
        header: Duration,
        connection: Duration,
    ) -> Self {
        self.handshake_timeout = handshake;
        self.header_timeout = header;
        self.connection_timeout = connection;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.allowed.is_empty() {
            return Err(Error::invalid_spec(
                "allowed",
                "name the networks machines fetch from (HttpsStoreConfig::allow): an empty list would refuse every client",
            ));
        }
        for (field, zero) in [
            ("ttl", self.ttl.is_zero()),
            ("maxDocumentBytes", self.max_document_bytes == 0),
            ("maxDocuments", self.max_documents == 0),
            ("maxConnections", self.max_connections == 0),
            (
                "maxConnectionsPerClient",
                self.max_connections_per_client == 0,
            ),
            ("requestsPerSecond", self.requests_per_second == 0),
            ("missesPerMinute", self.misses_per_minute == 0),
            ("handshakeTimeout", self.handshake_timeout.is_zero()),
            ("headerTimeout", self.header_timeout.is_zero()),
            ("connectionTimeout", self.connection_timeout.is_zero()),
            ("certificateValidity", self.certificate_validity.is_zero()),
        ] {
            if zero {
                return Err(Error::invalid_spec(field, "must be greater than zero"));
            }
        }
        Ok(())
    }
}

/// Where a document is in its life, as the store holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DocumentState {
    /// Waiting for its machine.
    Waiting,
    /// Fetched once; gone from memory.
    Served,
    /// Withdrawn (bootstrap finished, machine deleted, or replaced by a new put).
    Withdrawn,
    /// Not fetched within the TTL; gone from memory.
    Expired,
}

/// What the server did, counted since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Documents served (200).
    pub served: u64,
    /// Connections from a client outside the allowed networks, cut before TLS.
    pub refused_clients: u64,
    /// Connections cut because the server or the client had too many open.
    pub refused_connections: u64,
    /// Handshakes that failed or did not finish in time.
    pub failed_handshakes: u64,
    /// Requests for a token the store never had (404).
    pub unknown_tokens: u64,
    /// Requests for a served, withdrawn or expired document (410).
    pub gone: u64,
    /// Requests with a valid token from an address that is not the machine's (403).
    pub wrong_clients: u64,
    /// Requests throttled (429).
    pub throttled: u64,
    /// Requests refused for their method or body (405, 413).
    pub bad_requests: u64,
    /// Requests that came before the composer told the store the machine's addresses
    /// (503 with `Retry-After`; the stub tries again).
    pub not_yet_bound: u64,
}

#[derive(Default)]
struct Counters {
    served: AtomicU64,
    refused_clients: AtomicU64,
    refused_connections: AtomicU64,
    failed_handshakes: AtomicU64,
    unknown_tokens: AtomicU64,
    gone: AtomicU64,
    wrong_clients: AtomicU64,
    throttled: AtomicU64,
    bad_requests: AtomicU64,
    not_yet_bound: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One document and its token.
struct Entry {
    name: MachineName,
    /// Kept to give the same URL back for a put of the same bytes.
    token: SecretString,
    digest: [u8; 32],
    document: Option<Bytes>,
    state: DocumentState,
    stored_at: SystemTime,
    /// When a waiting document expires, or a finished one is forgotten.
    until: Instant,
}

#[derive(Default)]
struct State {
    /// By the SHA-256 of the token.
    by_token: HashMap<[u8; 32], Entry>,
    /// The current token's hash of each machine.
    by_name: HashMap<MachineName, [u8; 32]>,
    /// The addresses each machine was seen with.
    clients: HashMap<MachineName, Vec<IpAddr>>,
}

struct Shared {
    config: HttpsStoreConfig,
    state: Mutex<State>,
    counters: Counters,
    requests: DefaultKeyedRateLimiter<IpAddr>,
    misses: DefaultKeyedRateLimiter<IpAddr>,
    open: Mutex<HashMap<IpAddr, usize>>,
    /// Clients out of misses, until when.
    blocked: Mutex<HashMap<IpAddr, Instant>>,
}

/// How long a client that ran out of misses is refused.
const BLOCKED_FOR: Duration = Duration::from_secs(60);

impl Shared {
    fn blocked(&self, ip: IpAddr) -> bool {
        let blocked = self.blocked.lock().unwrap_or_else(|p| p.into_inner());
        blocked
            .get(&ip)
            .is_some_and(|until| *until > Instant::now())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change under the lock is a single insert or field update.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn allowed(&self, ip: IpAddr) -> bool {
        self.config.allowed.iter().any(|n| n.contains(ip))
    }
}

/// The served-once HTTPS store: an HTTPS server in the controller's process that serves
/// each machine's document once, at an unguessable URL, to that machine only. Stops
/// serving when dropped.
///
/// What it promises, each checked by its tests:
/// - **One URL per machine**, `https://<advertised>/v1/<token>`, the token 256 random
///   bits; documents are looked up by the token's SHA-256, and nothing is served to a
///   wrong token (404).
/// - **Served at most once**: the first fetch takes the document out of memory; a second
///   one (a replayed token) gets 410, as does a withdrawn or expired document.
/// - **A pinned certificate**: each server start makes a fresh self-signed ECDSA P-256
///   certificate (valid from an hour ago for [`HttpsStoreConfig::certificate_validity`],
///   naming the advertised host); the stub trusts it alone.
/// - **Bound to its addresses**: it listens on the address given, answers only clients in
///   [`HttpsStoreConfig::allow`]ed networks (others are disconnected before TLS), and by
///   default serves a document only to the addresses the composer saw its machine with
///   ([`machine_core::bootstrap_data::BootstrapDataStore::expect_clients`]): a token
///   for another machine gets 403 and is not used up; a fetch before the machine's
///   addresses are known gets 503 with `Retry-After`, which the stub retries.
/// - **Short-lived**: a document not fetched within [`HttpsStoreConfig::ttl`] is
///   withdrawn by itself.
/// - **Hardened**: only `GET` without a body (anything else is refused before a byte of
///   body is read), bounded connections overall and per client, TLS handshake, header
///   and connection deadlines (a slow client is cut off), a request rate per client and a
///   stricter rate of misses (wrong tokens) per client, after which that client gets 429.
///
/// Documents live in memory only: a controller that restarts starts a new server with a
/// new certificate, and machines still booting from the old one cannot fetch (their
/// stubs fail the boot, naming the reason). Secrets (tokens, URLs, documents) are never
/// logged nor shown by Debug.
pub struct HttpsStore {
    shared: Arc<Shared>,
    addr: SocketAddr,
    base_url: String,
    certificate_der: Vec<u8>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl fmt::Debug for HttpsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpsStore")
            .field("addr", &self.addr)
            .field("owner", &self.shared.config.owner)
            .field("documents", &self.shared.lock().by_token.len())
            .finish()
    }
}

impl fmt::Display for HttpsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the HTTPS bootstrap data store at {}", self.addr)
    }
}

impl HttpsStore {
    /// Validates `config`, makes a new certificate, listens and starts serving. Needs a
    /// tokio runtime. Errors: invalid-spec naming the field (an empty allowed list, an
    /// address it cannot listen on).
    pub async fn start(config: HttpsStoreConfig) -> Result<Self> {
        config.validate()?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| {
                Error::invalid_spec("listen", format!("cannot listen on {}: {e}", config.listen))
            })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::transient(format!("the store's address: {e}")))?;
        let host = match &config.advertise {
            Some(h) => h.clone(),
            None => match addr.ip() {
                IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
                IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
            },
        };
        let (certificate_der, tls) = certificate(&config, &host)?;
        let per_second = NonZeroU32::new(config.requests_per_second).unwrap_or(NonZeroU32::MIN);
        let per_minute = NonZeroU32::new(config.misses_per_minute).unwrap_or(NonZeroU32::MIN);
        let shared = Arc::new(Shared {
            requests: RateLimiter::keyed(Quota::per_second(per_second).allow_burst(
                per_second.saturating_mul(NonZeroU32::new(4).unwrap_or(NonZeroU32::MIN)),
            )),
            misses: RateLimiter::keyed(Quota::per_minute(per_minute).allow_burst(
                NonZeroU32::new(per_minute.get().saturating_add(4)).unwrap_or(per_minute),
            )),
            config,
            state: Mutex::default(),
            counters: Counters::default(),
            open: Mutex::default(),
            blocked: Mutex::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), tls));
        let prune = tokio::spawn(prune_loop(Arc::downgrade(&shared)));
        Ok(HttpsStore {
            shared,
            addr,
            base_url: format!("https://{host}"),
            certificate_der,
            tasks: vec![accept, prune],
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's certificate (DER), which stubs pin.
    pub fn certificate_der(&self) -> &[u8] {
        &self.certificate_der
    }

    /// What the server did so far.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            served: n(&c.served),
            refused_clients: n(&c.refused_clients),
            refused_connections: n(&c.refused_connections),
            failed_handshakes: n(&c.failed_handshakes),
            unknown_tokens: n(&c.unknown_tokens),
            gone: n(&c.gone),
            wrong_clients: n(&c.wrong_clients),
            throttled: n(&c.throttled),
            bad_requests: n(&c.bad_requests),
            not_yet_bound: n(&c.not_yet_bound),
        }
    }

    /// The state of `name`'s current document, if the store has one: its raw state, for
    /// tests and diagnostics.
    pub fn state_of(&self, name: &MachineName) -> Option<DocumentState> {
        let state = self.shared.lock();
        let key = state.by_name.get(name)?;
        state.by_token.get(key).map(|e| e.state)
    }

    /// How many documents are held in memory (waiting to be fetched).
    pub fn documents_in_memory(&self) -> usize {
        self.shared
            .lock()
            .by_token
            .values()
            .filter(|e| e.document.is_some())
            .count()
    }
}

impl Drop for HttpsStore {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[async_trait]
impl BootstrapDataStore for HttpsStore {
    fn max_bytes(&self) -> usize {
        self.shared.config.max_document_bytes
    }

    async fn put(&self, name: &MachineName, document: &[u8]) -> Result<Location> {
        let config = &self.shared.config;
        if document.len() > config.max_document_bytes {
            return Err(Error::invalid_spec(
                "userData",
                format!(
                    "{} bytes exceed {self}'s limit of {} bytes",
                    document.len(),
                    config.max_document_bytes
                ),
            ));
        }
        let digest: [u8; 32] = Sha256::digest(document).into();
        let now = Instant::now();
        let mut state = self.shared.lock();
        if let Some(key) = state.by_name.get(name).copied()
            && let Some(old) = state.by_token.get_mut(&key)
        {
            if old.digest == digest && old.state == DocumentState::Waiting && old.until > now {
                // The same bytes again (a create retried after its put): the same URL, so
                // a stub already handed to a provider stays valid.
                return Ok(self.location(&old.token));
            }
            withdraw_entry(old, now, config.ttl);
        }
        if state
            .by_token
            .values()
            .filter(|e| e.document.is_some())
            .count()
            >= config.max_documents
        {
            return Err(Error::new(
                machine_core::ErrorKind::QuotaExceeded,
                format!("{self} holds {} documents, its limit", config.max_documents),
            ));
        }
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw)
            .map_err(|e| Error::transient(format!("no randomness for a token: {e}")))?;
        let token = hex::encode(raw);
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let token = SecretString::from(token);
        let location = self.location(&token);
        state.by_token.insert(
            key,
            Entry {
                name: name.clone(),
                token,
                digest,
                document: Some(Bytes::copy_from_slice(document)),
                state: DocumentState::Waiting,
                stored_at: SystemTime::now(),
                until: now + config.ttl,
            },
        );
        state.by_name.insert(name.clone(), key);
        // A new document is for a new machine: the addresses seen for an earlier one of
        // this name are not its.
        state.clients.remove(name);
        Ok(location)
    }

    async fn withdraw(&self, name: &MachineName) -> Result<()> {
        let now = Instant::now();
        let mut state = self.shared.lock();
        state.clients.remove(name);
        if let Some(key) = state.by_name.get(name).copied()
            && let Some(entry) = state.by_token.get_mut(&key)
        {
            withdraw_entry(entry, now, self.shared.config.ttl);
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<StoredDocument>> {
        let state = self.shared.lock();
        let mut out: Vec<StoredDocument> = state
            .by_token
            .values()
            .filter(|e| e.document.is_some())
            .map(|e| StoredDocument::new(e.name.clone(), e.stored_at))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn expect_clients(&self, name: &MachineName, addresses: &[IpAddr]) -> Result<()> {
        let mut state = self.shared.lock();
        let known = state.clients.entry(name.clone()).or_default();
        for ip in addresses {
            let ip = ip.to_canonical();
            if !known.contains(&ip) {
                known.push(ip);
            }
        }
        Ok(())
    }
}

impl HttpsStore {
    fn location(&self, token: &SecretString) -> Location {
        Location::Https(HttpsLocation::new(
            SecretString::from(format!("{}/v1/{}", self.base_url, token.expose_secret())),
            self.certificate_der.clone(),
        ))
    }
}

fn withdraw_entry(entry: &mut Entry, now: Instant, ttl: Duration) {
    if entry.document.take().is_some() || entry.state == DocumentState::Waiting {
        entry.state = DocumentState::Withdrawn;
        entry.until = now + ttl;
    }
}

/// A self-signed certificate naming `host` (and the listen address) and the TLS
/// settings serving it.
fn certificate(
    config: &HttpsStoreConfig,
    host: &str,
) -> Result<(Vec<u8>, tokio_rustls::TlsAcceptor)> {
    let bad = |e: &dyn fmt::Display| {
        Error::permanent(format!("cannot make the store's certificate: {e}"))
    };
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.split_once(']').map(|(h, _)| h))
        .unwrap_or_else(|| host.rsplit_once(':').map_or(host, |(h, _)| h));
    let mut names = vec![bare.to_owned()];
    let listen = config.listen.ip();
    if !listen.is_unspecified() && listen.to_string() != bare {
        names.push(listen.to_string());
    }
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| bad(&e))?;
    let mut params = rcgen::CertificateParams::new(names).map_err(|e| {
        Error::invalid_spec(
            "advertise",
            format!("{host} cannot be named in a certificate: {e}"),
        )
    })?;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now
        + time::Duration::try_from(config.certificate_validity).unwrap_or(time::Duration::days(30));
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "machine-core bootstrap data store",
    );
    let cert = params.self_signed(&key).map_err(|e| bad(&e))?;
    let der = cert.der().to_vec();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_no_client_auth()
        .with_single_cert(
            vec![rustls::pki_types::CertificateDer::from(der.clone())],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .map_err(|e| bad(&e))?;
    Ok((der, tokio_rustls::TlsAcceptor::from(Arc::new(tls))))
}

/// One open connection of a client, counted while it lives.
struct Open {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut open = self.shared.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

fn enter(shared: &Arc<Shared>, ip: IpAddr) -> Option<Open> {
    let mut open = shared.open.lock().unwrap_or_else(|p| p.into_inner());
    let n = open.entry(ip).or_default();
    if *n >= shared.config.max_connections_per_client {
        return None;
    }
    *n += 1;
    Some(Open {
        shared: shared.clone(),
        ip,
    })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    tls: tokio_rustls::TlsAcceptor,
) {
    let slots = Arc::new(Semaphore::new(shared.config.max_connections));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors, say: let connections close, then go on.
                tracing::warn!(error = %e, "bootstrap data store: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ip = peer.ip().to_canonical();
        if !shared.allowed(ip) {
            bump(&shared.counters.refused_clients);
            tracing::debug!(client = %ip, "bootstrap data store: client not in an allowed network");
            continue;
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            bump(&shared.counters.refused_connections);
            continue;
        };
        let Some(open) = enter(&shared, ip) else {
            bump(&shared.counters.refused_connections);
            continue;
        };
        let shared = shared.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _open = open;
            let config = &shared.config;
            let stream =
                match tokio::time::timeout(config.handshake_timeout, tls.accept(stream)).await {
                    Ok(Ok(s)) => s,
                    _ => {
                        bump(&shared.counters.failed_handshakes);
                        return;
                    }
                };
            let served = shared.clone();
            let service = hyper::service::service_fn(move |req| {
                let reply = serve(&served, ip, &req);
                async move { Ok::<_, Infallible>(reply) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(config.header_timeout)
                .keep_alive(false)
                .max_buf_size(8192);
            let conn = http.serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(config.connection_timeout, conn).await;
        });
    }
}

/// Expires waiting documents past their TTL and forgets finished ones, until the store
/// is gone.
async fn prune_loop(shared: std::sync::Weak<Shared>) {
    loop {
        let every = match shared.upgrade() {
            Some(s) => {
                (s.config.ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(30))
            }
            None => return,
        };
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let ttl = shared.config.ttl;
        let mut state = shared.lock();
        let State {
            by_token, by_name, ..
        } = &mut *state;
        by_token.retain(|_, e| {
            if e.until > now {
                return true;
            }
            if e.state == DocumentState::Waiting {
                e.document = None;
                e.state = DocumentState::Expired;
                e.until = now + ttl;
                return true;
            }
            false
        });
        by_name.retain(|_, key| by_token.contains_key(key));
        drop(state);
        shared.requests.retain_recent();
        shared.misses.retain_recent();
        shared
            .blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, until| *until > now);
    }
}

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Answers one request from `ip`; never reads a request body.
fn serve(shared: &Shared, ip: IpAddr, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let c = &shared.counters;
    if shared.blocked(ip) || shared.requests.check_key(&ip).is_err() {
        bump(&c.throttled);
        return reply(StatusCode::TOO_MANY_REQUESTS, Bytes::new());
    }
    if req.method() != Method::GET {
        bump(&c.bad_requests);
        return reply(StatusCode::METHOD_NOT_ALLOWED, Bytes::new());
    }
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if has_body {
        bump(&c.bad_requests);
        return reply(StatusCode::PAYLOAD_TOO_LARGE, Bytes::new());
    }
    let token = req
        .uri()
        .path()
        .strip_prefix("/v1/")
        .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()));
    let key: Option<[u8; 32]> = token.map(|t| Sha256::digest(t.as_bytes()).into());
    let now = Instant::now();
    let mut state = shared.lock();
    let State {
        by_token, clients, ..
    } = &mut *state;
    let Some(entry) = key.and_then(|k| by_token.get_mut(&k)) else {
        drop(state);
        bump(&c.unknown_tokens);
        // Misses spend a stricter budget: a client guessing tokens is soon throttled.
        if shared.misses.check_key(&ip).is_err() {
            // Out of misses: every request of this client is refused for a minute.
            shared
                .blocked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(ip, now + BLOCKED_FOR);
            bump(&c.throttled);
            return reply(StatusCode::TOO_MANY_REQUESTS, Bytes::new());
        }
        return reply(StatusCode::NOT_FOUND, Bytes::new());
    };
    if entry.state == DocumentState::Waiting && entry.until <= now {
        entry.document = None;
        entry.state = DocumentState::Expired;
        entry.until = now + shared.config.ttl;
    }
    if entry.document.is_none() {
        bump(&c.gone);
        return reply(StatusCode::GONE, Bytes::new());
    }
    if shared.config.bind_to_machines {
        match clients.get(&entry.name) {
            None => {
                // The composer has not yet seen the machine's addresses: the stub tries
                // again shortly.
                bump(&c.not_yet_bound);
                let mut r = reply(StatusCode::SERVICE_UNAVAILABLE, Bytes::new());
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
                return r;
            }
            Some(known) if !known.contains(&ip) => {
                bump(&c.wrong_clients);
                tracing::warn!(client = %ip, machine = %entry.name, "bootstrap data store: a client that is not the machine presented its token");
                return reply(StatusCode::FORBIDDEN, Bytes::new());
            }
            Some(_) => {}
        }
    }
    let Some(document) = entry.document.take() else {
        bump(&c.gone);
        return reply(StatusCode::GONE, Bytes::new());
    };
    entry.state = DocumentState::Served;
    entry.until = now + shared.config.ttl;
    tracing::info!(machine = %entry.name, client = %ip, "bootstrap data store: served a document");
    drop(state);
    bump(&c.served);
    let mut r = reply(StatusCode::OK, document);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r
}
